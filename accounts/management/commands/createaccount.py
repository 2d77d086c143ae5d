"""``manage.py createaccount NAME --password PW [--superuser]``"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.models import Account


class Command(BaseCommand):
    help = "Create an SMQP account (and its account topic /accounts/NAME)."
    # A one-shot operator command: `manage.py check` and runbroker run the checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--password", required=True)
        parser.add_argument("--superuser", action="store_true", help="May do everything.")
        parser.add_argument("--email", default="")
        parser.add_argument("--proper-name", default="")
        parser.add_argument("--remote-server", action="store_true",
                            help="The account is another SMQP server.")
        parser.add_argument("--update", action="store_true",
                            help="Set the password (and flags) if the account exists.")

    @transaction.atomic
    def handle(self, *args, name: str, password: str, superuser: bool, email: str,
               proper_name: str, remote_server: bool, update: bool, **options) -> None:
        account = Account.objects.filter(username_key=name.casefold()).first()
        if account is not None and not update:
            raise CommandError(f"account {account.username!r} already exists (use --update)")
        if account is None:
            account = Account(username=name)
        account.email = email or account.email
        account.proper_name = proper_name or account.proper_name
        account.is_remote_server = remote_server or account.is_remote_server
        account.is_superuser = account.is_staff = superuser or account.is_superuser
        account.set_password(password)
        try:
            account.full_clean(exclude=["password", "username_key"])
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        account.save()
        kind = "superuser account" if account.is_superuser else "account"
        self.stdout.write(f"{kind} {account.username} ready; topic {account.account_topic_path}")
