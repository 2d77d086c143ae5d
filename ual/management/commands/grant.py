"""``manage.py grant ACCOUNT[,ACCOUNT...]|@FILE TOPIC RIGHT[,RIGHT...]``

Many accounts at once (a list, or ``@FILE`` with one name a line) are a bulk grant: all of
it or nothing (one transaction), with its progress on stderr.

Entries change through :mod:`ual.grants`, one row at a time, so every change is audited
(actor ``"manage.py grant"``) and invalidates the cached access snapshots of every process.
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.models import Account
from broker.management.progress import Progress
from broker.services import topics as topic_service
from ual import grants
from ual.audit import GRANT_COMMAND, acting_as
from ual.models import Effect, Right

#: Accounts granted per step of the progress (all in the one transaction).
CHUNK = 100


def _account_names(spec: str) -> list[str]:
    if spec.startswith("@"):
        try:
            with open(spec[1:], encoding="utf-8") as fh:
                names = [line.strip() for line in fh]
        except OSError as exc:
            raise CommandError(f"cannot read {spec[1:]}: {exc.strerror or exc}") from None
    else:
        names = spec.split(",")
    names = [n.strip() for n in names if n.strip() and not n.strip().startswith("#")]
    if not names:
        raise CommandError("no account named")
    return names


class Command(BaseCommand):
    help = (
        "Grant (or with --deny, deny; with --revoke, remove) rights on a topic to an account. "
        f"Rights: {', '.join(Right.values)}."
    )
    # A one-shot operator command: `manage.py check` and runbroker run the checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "account", help="An account name, several separated by commas, or @FILE with one "
                            "name a line (a bulk grant, with progress on stderr).")
        parser.add_argument("topic")
        parser.add_argument("rights", help="Comma-separated, e.g. publish,subscribe")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--deny", action="store_true", help="Record denials instead.")
        mode.add_argument("--revoke", action="store_true", help="Remove the entries instead.")

    def handle(self, *args, account: str, topic: str, rights: str, deny: bool, revoke: bool,
               **options) -> None:
        self.verbosity = options.get("verbosity", 1)
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
        names = _account_names(account)
        found = {a.username_key: a for a in Account.objects.filter(
            username_key__in=[n.casefold() for n in names])}
        missing = [n for n in names if n.casefold() not in found]
        if missing:
            shown = ", ".join(repr(n) for n in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise CommandError(f"no account named {shown}{more}")
        accounts = list({n.casefold(): found[n.casefold()] for n in names}.values())
        target = topic_service.find(topic)
        if target is None:
            raise CommandError(f"no topic {topic!r}")
        # A virtual topic behaves as the real one everywhere, its access list included.
        target = target.resolved()
        effect = Effect.DENY if deny else Effect.ALLOW
        verb = "revoked" if revoke else ("denied" if deny else "granted")
        doing = {"granted": "granting", "denied": "denying", "revoked": "revoking"}[verb]
        # The raw stream: OutputWrapper.write would end each redraw with a newline.
        progress = Progress(len(accounts) * len(wanted), f"{doing} on {target.path}",
                            getattr(self.stderr, "_out", sys.stderr),
                            enabled=len(accounts) > 1 and self.verbosity > 0)
        for right in wanted:
            for start in range(0, len(accounts), CHUNK):
                chunk = accounts[start:start + CHUNK]
                if revoke:
                    for who in chunk:
                        grants.revoke(target, right, who)
                else:
                    grants.grant_to_many(target, right, effect, chunk)
                progress.advance(len(chunk))
        progress.finish()
        whom = accounts[0].username if len(accounts) == 1 else f"{len(accounts)} accounts"
        self.stdout.write(f"{verb} {', '.join(wanted)} on {target.path} to {whom}")
