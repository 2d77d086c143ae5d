"""``manage.py token create ACCOUNT NAME [--days N]`` | ``list [ACCOUNT]`` | ``revoke ID``"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Account
from api.models import ApiToken
from api.tokens import create_token, revoke


class Command(BaseCommand):
    help = "Make, list or revoke REST API bearer tokens."
    # A one-shot operator command: `manage.py check` and runbroker run the checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="A new token (printed once).")
        create.add_argument("account")
        create.add_argument("name")
        create.add_argument("--days", type=int, default=None, help="Valid this many days.")
        listing = sub.add_parser("list", help="Tokens (not their secrets).")
        listing.add_argument("account", nargs="?")
        gone = sub.add_parser("revoke", help="Revoke a token by its id.")
        gone.add_argument("id", type=int)

    def handle(self, *args, action: str, **options) -> None:
        if action == "create":
            account = Account.objects.filter(username_key=options["account"].casefold()).first()
            if account is None:
                raise CommandError(f"no account {options['account']!r}")
            if options["days"] is not None and options["days"] < 1:
                raise CommandError("--days must be at least 1")
            _, text = create_token(account, options["name"], options["days"])
            self.stdout.write(text)
        elif action == "list":
            rows = ApiToken.objects.select_related("account").order_by("pk")
            if options.get("account"):
                rows = rows.filter(account__username_key=options["account"].casefold())
            for t in rows:
                state = "revoked" if t.revoked else ("active" if t.active else "expired")
                self.stdout.write(f"{t.pk}\t{t.account.username}\t{t.name}\t{state}\t"
                                  f"expires {t.expires:%Y-%m-%d %H:%M}")
        else:
            token = ApiToken.objects.filter(pk=options["id"]).first()
            if token is None:
                raise CommandError(f"no token {options['id']}")
            revoke(token)
            self.stdout.write(f"token {token.pk} revoked")
