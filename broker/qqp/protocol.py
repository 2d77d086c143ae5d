"""The QQP exchange: the Greeting a Receiver sends, the data item's required elements, and the
status strings (netstrings ``NNN text``)."""

from __future__ import annotations

from dataclasses import dataclass

from . import netstring, sxdf
from .errors import QQPError

REDUNDANT, STORED, STORED_CLOSING, TEMPORARY, PERMANENT, UNDEFINED = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Greeting:
    item_limit: int
    session_limit: int
    capabilities: tuple[str, ...] = ("smqp",)
    exceptions_to: str = ""

    def encode(self) -> bytes:
        """The Greeting as a netstring-framed SXDF resource."""
        return netstring.encode(sxdf.encode_resource({
            "ItemLimit": str(self.item_limit).encode(),
            "SessionLimit": str(self.session_limit).encode(),
            "Capabilities": [c.encode() for c in self.capabilities],
            "ExceptionsTo": self.exceptions_to.encode(),
        }))

    @classmethod
    def parse(cls, body: bytes) -> Greeting:
        elements = sxdf.parse_resource(body)
        try:
            caps = elements.get("Capabilities", [])
            if not isinstance(caps, list) or not all(isinstance(c, bytes) for c in caps):
                raise QQPError("Greeting: Capabilities is not an array of strings")
            return cls(item_limit=_integer(elements["ItemLimit"]),
                       session_limit=_integer(elements["SessionLimit"]),
                       capabilities=tuple(c.decode() for c in caps),  # type: ignore[union-attr]
                       exceptions_to=_text(elements.get("ExceptionsTo", b"")))
        except (KeyError, UnicodeDecodeError) as exc:
            raise QQPError(f"Greeting: {exc}") from None


def _integer(value: sxdf.Value) -> int:
    if not isinstance(value, bytes) or not value.isdigit():
        raise QQPError("not a nonnegative integer")
    return int(value)


def _text(value: sxdf.Value) -> str:
    if not isinstance(value, bytes):
        raise QQPError("not a string")
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise QQPError("not UTF-8") from None


@dataclass(frozen=True)
class Item:
    """A data item: its ``Data`` element (canonical bytes too), Action, ResourceID and the
    Signature, if any."""

    data: dict[str, sxdf.Value]
    canonical_data: bytes
    action: str
    resource_id: str
    signature: bytes | None


def parse_item(body: bytes) -> Item:
    """A data item from a netstring body; QQPError when it is not SXDF or lacks the
    ``Data`` element, its ``Action`` or its ``ResourceID``."""
    elements = sxdf.parse_resource(body)
    data = elements.get("Data")
    if not isinstance(data, dict):
        raise QQPError("no Data element (a map)")
    if "Action" not in data or "ResourceID" not in data:
        raise QQPError("the Data element lacks Action or ResourceID")
    action = _text(data["Action"])
    resource_id = _text(data["ResourceID"])
    if not resource_id:
        raise QQPError("an empty ResourceID")
    signature = elements.get("Signature")
    if signature is not None and not isinstance(signature, bytes):
        raise QQPError("the Signature is not a string")
    return Item(data=data, canonical_data=sxdf.canonical(data), action=action,
                resource_id=resource_id, signature=signature)


def encode_item(data: dict[str, sxdf.Value], signature: bytes | None = None) -> bytes:
    elements: dict[str, sxdf.Value] = {"Data": data}
    if signature is not None:
        elements["Signature"] = signature
    return netstring.encode(sxdf.encode_resource(elements))


def status(code: int, text: str, detail: int = 0) -> bytes:
    """A status string: three digits (the first standard), a space, the text."""
    return netstring.encode(f"{code}{detail:02d} {text}".encode())


def parse_status(body: bytes) -> tuple[int, str]:
    """(the first digit, the whole string) of a status netstring body."""
    text = body.decode(errors="replace")
    if len(text) < 4 or not text[:3].isdigit() or text[3] != " ":
        raise QQPError("not a status string")
    return int(text[0]), text
