"""OpenPGP signatures of QQP items (spec section 5): a Signature of type 0x00 over the
canonical ``Data`` element, made by a key kept on an account (:class:`broker.models.QQPKey`),
publishes the item as that account."""

from __future__ import annotations

import functools
import warnings

from django.db import transaction

from accounts.models import Account
from broker.models import QQPKey

from . import Refusal, ServiceError, bad_request

with warnings.catch_warnings():  # PGPy's imports warn of deprecated modules and ciphers
    warnings.simplefilter("ignore")
    import pgpy
    from pgpy.constants import SignatureType


class BadSignature(ServiceError):
    """The Signature does not parse, is of the wrong type, names no known key, or fails."""

    def __init__(self, reason: str) -> None:
        super().__init__(Refusal.UNAUTHORIZED, Refusal.UNAUTHORIZED.text(f"signature: {reason}"))


@functools.lru_cache(maxsize=256)
def _public_key(armored: str) -> pgpy.PGPKey:
    key, _ = pgpy.PGPKey.from_blob(armored)
    return key


def add_key(account: Account, armored: str) -> list[str]:
    """Keep a public key on ``account``; the key IDs that may now sign for it. A private key
    is refused (only its public part would be kept, and it should not travel)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            key, _ = pgpy.PGPKey.from_blob(armored)
        except Exception as exc:  # PGPy raises many kinds for bad input
            raise bad_request(f"not an OpenPGP key: {exc}") from None
    if not key.is_public:
        raise bad_request("a private key: give the public key")
    armored = str(key)
    ids = [key.fingerprint.keyid, *(sub.fingerprint.keyid for sub in key.subkeys.values())]
    with transaction.atomic():
        for key_id in ids:
            QQPKey.objects.update_or_create(
                key_id=key_id, defaults={"account": account, "armored": armored,
                                         "fingerprint": str(key.fingerprint).replace(" ", "")})
    return ids


def signer(canonical_data: bytes, signature: bytes) -> int:
    """The id of the account whose key made ``signature`` over ``canonical_data``; raises
    :class:`BadSignature`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sig = pgpy.PGPSignature.from_blob(signature)
        except Exception:
            raise BadSignature("not an OpenPGP signature") from None
        if sig.type != SignatureType.BinaryDocument:
            raise BadSignature("not of type 0x00")
        row = QQPKey.objects.filter(key_id=sig.signer).values_list(
            "account_id", "armored", "account__is_active").first()
        if row is None:
            raise BadSignature(f"no account keeps the key {sig.signer}")
        account_id, armored, active = row
        if not active:
            raise BadSignature("the key's account is disabled")
        try:
            valid = bool(_public_key(armored).verify(canonical_data, sig))
        except Exception:
            valid = False
        if not valid:
            raise BadSignature("it does not verify")
    return account_id
