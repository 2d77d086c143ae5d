"""``manage.py grant ACCOUNT TOPIC RIGHT[,RIGHT...]``

Entries change through :mod:`ual.grants`, one row at a time, so every change is audited
(actor ``"manage.py grant"``) and invalidates the cached access snapshots of every process.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.models import Account
from broker.services import topics as topic_service
from ual import grants
from ual.audit import GRANT_COMMAND, acting_as
from ual.models import Effect, Right


class Command(BaseCommand):
    help = (
        "Grant (or with --deny, deny; with --revoke, remove) rights on a topic to an account. "
        f"Rights: {', '.join(Right.values)}."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("account")
        parser.add_argument("topic")
        parser.add_argument("rights", help="Comma-separated, e.g. publish,subscribe")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--deny", action="store_true", help="Record denials instead.")
        mode.add_argument("--revoke", action="store_true", help="Remove the entries instead.")

    def handle(self, *args, account: str, topic: str, rights: str, deny: bool, revoke: bool,
               **options) -> None:
        with acting_as(GRANT_COMMAND), transaction.atomic():
            self._handle(account, topic, rights, deny, revoke)

    def _handle(self, account: str, topic: str, rights: str, deny: bool, revoke: bool) -> None:
        wanted = [r.strip().lower() for r in rights.split(",") if r.strip()]
        unknown = [r for r in wanted if r not in Right.values]
        if not wanted or unknown:
            raise CommandError(
                f"unknown right(s) {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(Right.values)}"
            )
        who = Account.objects.filter(username_key=account.casefold()).first()
        if who is None:
            raise CommandError(f"no account named {account!r}")
        target = topic_service.find(topic)
        if target is None:
            raise CommandError(f"no topic {topic!r}")
        # A virtual topic behaves as the real one everywhere, its access list included.
        target = target.resolved()
        effect = Effect.DENY if deny else Effect.ALLOW
        for right in wanted:
            if revoke:
                grants.revoke(target, right, who)
            else:
                grants.grant_to_many(target, right, effect, [who])
        verb = "revoked" if revoke else ("denied" if deny else "granted")
        self.stdout.write(f"{verb} {', '.join(wanted)} on {target.path} to {who.username}")
