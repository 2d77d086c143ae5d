"""``manage.py link add|list|remove``: the federation links (profile §9.5).

    manage.py link add east --host east.example.net --port 720 --account west \\
        --password secret --import '/news/*' [--tls --ca peer-ca.pem] [--peer-account east]
    manage.py link list
    manage.py link remove east

The running supervisor (``runlinks``, or ``runbroker``) picks a change up within
``SMQP_LINK_RELOAD_SECONDS``.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker.services import Refusal, ServiceError, federation


class Command(BaseCommand):
    help = "Add, list or remove federation links to peer SMQP servers."
    # A one-shot operator command: `manage.py check` and runbroker run the checks.
    requires_system_checks: list[str] = []

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

    def _add(self, name: str, host: str, port: int, account: str, password: str,
             imports: list[str], tls: bool, ca: str, server_name: str, peer_account: str,
             disabled: bool, update: bool, **_) -> None:
        # The rules (a new name, valid imports, a known peer account) are the service's,
        # which the REST API calls too.
        try:
            link = federation.save_link(
                name, create=not update, host=host, port=port, account=account,
                password=password, imports=imports or ["/*"], tls=tls, tls_ca=ca,
                tls_server_name=server_name, peer_account=peer_account,
                enabled=not disabled)
        except ServiceError as exc:
            if exc.refusal is Refusal.CONFLICT:
                raise CommandError(f"link {name!r} exists (use --update)") from None
            raise CommandError(exc.text) from None
        self.stdout.write(f"link {link.name} -> {account}@{host}:{port} "
                          f"({'SMQPS' if tls else 'SMQP'}), imports {link.imports}")

    def _list(self, **_) -> None:
        for link in federation.links():
            d = federation.link_data(link)
            backlog = d["backlog"]
            self.stdout.write(
                f"{link.name}\t{link.account}@{link.host}:{link.port}"
                f"{' SMQPS' if link.tls else ''}\t{link.state}"
                f"{'' if link.enabled else ' (disabled)'}\tstored {link.stored}"
                f"\tdropped {link.dropped}\tbacklog {'-' if backlog is None else backlog}"
                f"\timports {link.imports}"
                + (f"\terror: {link.last_error}" if link.last_error else ""))

    def _remove(self, name: str, **_) -> None:
        try:
            federation.remove_link(name)
        except ServiceError:
            raise CommandError(f"no link {name!r}") from None
        self.stdout.write(f"link {name} removed")
