"""``manage.py link add|list|remove``: the federation links (profile §9.5).

    manage.py link add east --host east.example.net --port 720 --account west \\
        --password secret --import '/news/*' [--tls --ca peer-ca.pem] [--peer-account east]
    manage.py link list
    manage.py link remove east

The running supervisor (``runlinks``, or ``runbroker``) picks a change up within
``SMQP_LINK_RELOAD_SECONDS``.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.models import Account
from broker.models import Link
from broker.services import federation


class Command(BaseCommand):
    help = "Add, list or remove federation links to peer SMQP servers."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="Add a link (or change one, with --update).")
        add.add_argument("name", help="One topic segment: the peer's messages go below /NAME.")
        add.add_argument("--host", required=True)
        add.add_argument("--port", type=int, default=720)
        add.add_argument("--account", required=True, help="The account the peer gave us.")
        add.add_argument("--password", default="")
        add.add_argument("--import", dest="imports", action="append", default=[],
                         help="A topic pattern of the peer to import (repeatable).")
        add.add_argument("--tls", action="store_true", help="Connect over SMQPS.")
        add.add_argument("--ca", default="", help="PEM CA file for the peer's certificate.")
        add.add_argument("--server-name", default="", help="Name on the peer's certificate.")
        add.add_argument("--peer-account", default="",
                         help="The account the peer logs in with here (shows its backlog).")
        add.add_argument("--disabled", action="store_true")
        add.add_argument("--update", action="store_true", help="Change an existing link.")
        sub.add_parser("list", help="List the links with their state.")
        rem = sub.add_parser("remove", help="Remove a link.")
        rem.add_argument("name")

    def handle(self, *args, action: str, **opts) -> None:
        getattr(self, f"_{action}")(**opts)

    @transaction.atomic
    def _add(self, name: str, host: str, port: int, account: str, password: str,
             imports: list[str], tls: bool, ca: str, server_name: str, peer_account: str,
             disabled: bool, update: bool, **_) -> None:
        link = Link.objects.filter(name__iexact=name).first()
        if link is not None and not update:
            raise CommandError(f"link {link.name!r} exists (use --update)")
        link = link or Link(name=name)
        peer = None
        if peer_account:
            peer = Account.objects.filter(username_key=peer_account.casefold()).first()
            if peer is None:
                raise CommandError(f"no account {peer_account!r} here")
        try:
            parsed = federation.parse_imports(",".join(imports) or "/*")
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        link.host, link.port, link.account, link.password = host, port, account, password
        link.imports = ", ".join(str(p) for p in parsed)
        link.tls, link.tls_ca, link.tls_server_name = tls, ca, server_name
        link.peer_account = peer
        link.enabled = not disabled
        try:
            link.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        link.save()
        self.stdout.write(f"link {link.name} -> {account}@{host}:{port} "
                          f"({'SMQPS' if tls else 'SMQP'}), imports {link.imports}")

    def _list(self, **_) -> None:
        for link in Link.objects.select_related("peer_account"):
            backlog = federation.backlog(link)
            self.stdout.write(
                f"{link.name}\t{link.account}@{link.host}:{link.port}"
                f"{' SMQPS' if link.tls else ''}\t{link.state}"
                f"{'' if link.enabled else ' (disabled)'}\tstored {link.stored}"
                f"\tdropped {link.dropped}\tbacklog {'-' if backlog is None else backlog}"
                f"\timports {link.imports}"
                + (f"\terror: {link.last_error}" if link.last_error else ""))

    def _remove(self, name: str, **_) -> None:
        deleted, _ = Link.objects.filter(name__iexact=name).delete()
        if not deleted:
            raise CommandError(f"no link {name!r}")
        self.stdout.write(f"link {name} removed")
