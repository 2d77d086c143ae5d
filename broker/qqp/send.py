"""A small blocking QQP sender, for operators and tests.

``python -m broker.qqp.send --topic /orders/new [--sign KEY.asc] FILE...`` sends each file as
one item (its bytes the ``Payload`` element; ResourceID the file's SHA-256 unless
``--resource-id`` is given, so sending a file again is detected as a duplicate) and prints each
status string. The port is ``--port``, else ``SMQP_QQP_PORT``, else 2626. ``--sign`` signs each
item (QQP section 5: a type 0x00 OpenPGP signature over the canonical ``Data`` element) with an
armored secret key; a protected key's passphrase comes from ``SMQP_QQP_KEY_PASSPHRASE``.
Exit status: 0 when every item was stored or was a duplicate (1, 2, or a 3 for the last),
else 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import ssl
import sys
import warnings
from pathlib import Path

from . import protocol, sxdf
from .errors import QQPError
from .netstring import NetstringReader


class QQPSender:
    """One QQP connection: the Greeting on connect, then a status per item sent."""

    def __init__(self, host: str, port: int, *, tls: bool = False, verify: bool = True,
                 timeout: float = 30.0) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        if tls:
            context = ssl.create_default_context()
            if not verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            sock = context.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.reader = NetstringReader()
        self.pending: list[bytes] = []
        self.greeting = protocol.Greeting.parse(self._next())

    def _next(self) -> bytes:
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the receiver closed the connection")
            self.pending += self.reader.feed(data)
        return self.pending.pop(0)

    def send_raw(self, data: bytes) -> tuple[int, str]:
        """Send bytes as they are; the status they get: (first digit, the string)."""
        self.sock.sendall(data)
        return protocol.parse_status(self._next())

    def send(self, data: dict[str, sxdf.Value], signature: bytes | None = None) -> tuple[int, str]:
        """Send one item whose ``Data`` element is ``data``."""
        return self.send_raw(protocol.encode_item(data, signature))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> QQPSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SigningKey:
    """An armored OpenPGP secret key that signs items (PGPy: the broker verifies with it too)."""

    def __init__(self, armored: str, passphrase: str | None = None) -> None:
        with warnings.catch_warnings():  # PGPy warns of deprecated modules and ciphers
            warnings.simplefilter("ignore")
            import pgpy

            try:
                key, _ = pgpy.PGPKey.from_blob(armored)
            except Exception as exc:  # PGPy raises many kinds for bad input
                raise QQPError(f"not an OpenPGP key: {exc}") from None
        if key.is_public:
            raise QQPError("a public key cannot sign: give the secret key")
        if key.is_protected and not passphrase:
            raise QQPError("the key is protected: set SMQP_QQP_KEY_PASSPHRASE")
        self.key, self.passphrase = key, passphrase

    def sign(self, data: dict[str, sxdf.Value]) -> bytes:
        """The Signature element of an item whose ``Data`` element is ``data``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not self.key.is_protected:
                return str(self.key.sign(sxdf.canonical(data))).encode()
            try:
                with self.key.unlock(self.passphrase):
                    return str(self.key.sign(sxdf.canonical(data))).encode()
            except Exception as exc:
                raise QQPError(f"cannot unlock the key: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.qqp.send", description=__doc__)
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("SMQP_QQP_PORT") or 2626),
                        help="default: SMQP_QQP_PORT, else 2626")
    parser.add_argument("--tls", action="store_true", help="QQP over TLS (port 2727)")
    parser.add_argument("--insecure", action="store_true", help="do not verify the certificate")
    parser.add_argument("--topic", required=True, help="the topic path, e.g. /orders/new")
    parser.add_argument("--resource-id", help="the ResourceID (one file only)")
    parser.add_argument("--sign", metavar="KEY.asc",
                        help="sign each item with this armored OpenPGP secret key (its "
                             "passphrase in SMQP_QQP_KEY_PASSPHRASE)")
    args = parser.parse_args(argv)
    if args.resource_id and len(args.files) > 1:
        parser.error("--resource-id names one item: give one FILE")
    failed = False
    try:
        key = (SigningKey(Path(args.sign).read_text(),
                          os.environ.get("SMQP_QQP_KEY_PASSPHRASE"))
               if args.sign else None)
        with QQPSender(args.host, args.port, tls=args.tls, verify=not args.insecure) as sender:
            for number, name in enumerate(args.files, 1):
                payload = Path(name).read_bytes()
                resource_id = args.resource_id or hashlib.sha256(payload).hexdigest()
                data: dict[str, sxdf.Value] = {"Action": f"smqp:{args.topic}".encode(),
                                               "ResourceID": resource_id.encode(),
                                               "Payload": payload}
                code, text = sender.send(data, key.sign(data) if key else None)
                print(f"{name}: {text}")
                if code >= protocol.STORED_CLOSING:
                    # Closed: a 3 stored this item, but the files after it were not sent.
                    failed = code != protocol.STORED_CLOSING or number < len(args.files)
                    break
                if code not in (protocol.REDUNDANT, protocol.STORED):
                    failed = True
    except (OSError, QQPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
