"""``broker.qqp.send``'s ``--sign`` key: what it signs verifies with the public key over the
canonical ``Data`` element (what the broker checks); protected keys want their passphrase."""

from __future__ import annotations

import warnings

import pytest

from broker.qqp import sxdf
from broker.qqp.errors import QQPError
from broker.qqp.send import SigningKey

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import pgpy
    from pgpy.constants import (
        EllipticCurveOID,
        HashAlgorithm,
        KeyFlags,
        PubKeyAlgorithm,
        SignatureType,
        SymmetricKeyAlgorithm,
    )

DATA: dict[str, sxdf.Value] = {"Action": b"smqp:/orders", "ResourceID": b"r-1",
                               "Payload": b'{"order": 1}'}


def new_key(passphrase: str | None = None) -> pgpy.PGPKey:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        key = pgpy.PGPKey.new(PubKeyAlgorithm.EdDSA, EllipticCurveOID.Ed25519)
        key.add_uid(pgpy.PGPUID.new("Feed"), usage={KeyFlags.Sign},
                    hashes=[HashAlgorithm.SHA256])
        if passphrase:
            key.protect(passphrase, SymmetricKeyAlgorithm.AES256, HashAlgorithm.SHA256)
    return key


def verifies(key: pgpy.PGPKey, signature: bytes, data: dict[str, sxdf.Value]) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sig = pgpy.PGPSignature.from_blob(signature)
        assert sig.type == SignatureType.BinaryDocument  # type 0x00, as QQP section 5 asks
        return bool(key.pubkey.verify(sxdf.canonical(data), sig))


def test_signs_the_canonical_data_element():
    key = new_key()
    signature = SigningKey(str(key)).sign(DATA)
    assert verifies(key, signature, DATA)
    assert not verifies(key, signature, {**DATA, "Payload": b'{"order": 2}'})


def test_protected_key_takes_its_passphrase():
    key = new_key("s3cret")
    with pytest.raises(QQPError, match="SMQP_QQP_KEY_PASSPHRASE"):
        SigningKey(str(key))
    assert verifies(key, SigningKey(str(key), "s3cret").sign(DATA), DATA)
    with pytest.raises(QQPError, match="cannot unlock"):
        SigningKey(str(key), "wrong").sign(DATA)


@pytest.mark.parametrize("armored", ["", "not a key", "public"])
def test_refuses_what_cannot_sign(armored):
    if armored == "public":
        armored = str(new_key().pubkey)
    with pytest.raises(QQPError):
        SigningKey(armored)
