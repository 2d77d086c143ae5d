"""``manage.py qqpkey ACCOUNT FILE``: keep an OpenPGP public key on an account, so that QQP
items it signs are published as that account."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Keep an OpenPGP public key (armored FILE) on ACCOUNT for signed QQP items."
    # A one-shot operator command: `manage.py check` and runbroker run the checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("account")
        parser.add_argument("file")

    def handle(self, *args, account: str, file: str, **options) -> None:
        from accounts.models import Account
        from broker.services import ServiceError, qqp_signatures

        found = Account.objects.filter(username_key=account.casefold()).first()
        if found is None:
            raise CommandError(f"no account {account!r}")
        try:
            ids = qqp_signatures.add_key(found, Path(file).read_text())
        except (OSError, ServiceError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{found.username}: key IDs {', '.join(ids)} may sign QQP items")
