"""SET LOGIN: the account's own password and owner details; every account's account topic."""

from __future__ import annotations

import base64
import binascii
import re

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from accounts import scram
from accounts.models import Account
from topics import paths
from topics.models import Topic

from . import bad_request, conflict, unauthorized

FIELDS = {"NAME": ("proper_name", 200), "EMAIL": ("email", 254),
          "ADDRESS": ("postal_address", 1000), "PHONE": ("phone", 64)}


@transaction.atomic
def set_detail(account: Account, field: str, value: str) -> None:
    """SET LOGIN NAME|EMAIL|ADDRESS|PHONE <value>."""
    attr, limit = FIELDS[field]
    value = value.strip()
    if len(value) > limit:
        raise bad_request(f"{field.lower()} longer than {limit} characters")
    if field == "EMAIL" and value:
        try:
            validate_email(value)
        except ValidationError as exc:
            raise bad_request("invalid e-mail address") from exc
    Account.objects.filter(pk=account.pk).update(**{attr: value})
    setattr(account, attr, value)


def set_checked_password(account: Account, password: str, *, what: str = "password") -> None:
    """Django's password validators on ``password`` for ``account``, then set it (not saved):
    400 naming the rule that refused it."""
    if not password:
        raise bad_request(f"empty {what}")
    try:
        validate_password(password, account)
    except ValidationError as exc:
        raise bad_request("; ".join(exc.messages)) from exc
    account.set_password(password)


@transaction.atomic
def change_password(account: Account, old: str, new: str) -> None:
    """SET LOGIN PASSWORD, then ``PASS <old> <new>``: 401 when the old password is wrong."""
    fresh = Account.objects.select_for_update().get(pk=account.pk)
    if not fresh.check_password(old):
        raise unauthorized("old password is not correct")
    set_checked_password(fresh, new, what="new password")
    fresh.save(update_fields=["password"])
    account.password = fresh.password


_VERIFIER_SALT = re.compile(r"[A-Za-z0-9]{12,128}")  # shaped like Django's own salts
_MAX_ITERATIONS = 10_000_000  # scramp's ceiling


def parse_password_verifier(text: str) -> tuple[str, int, bytes]:
    """``s=<salt>,i=<iterations>,p=<base64 SaltedPassword>``: the new password of a
    SCRAM password change, as PBKDF2-HMAC-SHA256 material (400 if malformed)."""
    try:
        fields = dict(part.split("=", 1) for part in text.split(","))
        salt, iterations_text, salted_b64 = fields["s"], fields["i"], fields["p"]
        salted = base64.b64decode(salted_b64, validate=True)
    except (ValueError, KeyError, binascii.Error):
        raise bad_request("new password: expected s=<salt>,i=<iterations>,p=<key>") from None
    if len(fields) != 3 or not _VERIFIER_SALT.fullmatch(salt):
        raise bad_request("new password: salt must be 12 to 128 letters and digits")
    if not iterations_text.isdigit() or not (
            scram.django_default_iterations() <= int(iterations_text) <= _MAX_ITERATIONS):
        raise bad_request("new password: iteration count below the server's or too high")
    if len(salted) != 32:
        raise bad_request("new password: the key must be 32 bytes (SHA-256)")
    return salt, int(iterations_text), salted


@transaction.atomic
def set_password_verifier(account: Account, text: str) -> None:
    """SET LOGIN PASSWORD SCRAM-SHA-256/1.0: after the session proved the old password with a
    SCRAM exchange, store the new one from its salted form. The plaintext never reaches the
    server, so password validators cannot run here (the draft leaves password rules to the
    client); the stored hash is the Django one CLEAR logins check too."""
    salt, iterations, salted = parse_password_verifier(text)
    encoded = f"pbkdf2_sha256${iterations}${salt}${base64.b64encode(salted).decode('ascii')}"
    Account.objects.filter(pk=account.pk).update(password=encoded)
    account.password = encoded


# --------------------------------------------------------------------------- account topics


def _ensure_path(path: str, **defaults) -> Topic:
    """Get or create the topic at ``path`` and any missing ancestors."""
    parent: Topic | None = None
    parent_path = paths.parent_path(path)
    if parent_path is not None:
        parent = _ensure_path(parent_path)
    try:
        with transaction.atomic():
            topic, _ = Topic.objects.get_or_create(
                key=paths.path_key(path), defaults={"path": path, "parent": parent, **defaults}
            )
    except IntegrityError:  # created concurrently by another process
        topic = Topic.objects.get(key=paths.path_key(path))
    return topic


@transaction.atomic
def ensure_account_topic(account: Account) -> Topic:
    """``/accounts/<name>`` for ``account``, created (with ``/accounts``) if missing and
    renamed if the account was renamed."""
    path = account.account_topic_path
    paths.check_creatable(path)
    existing = Topic.objects.filter(account=account).first()
    if existing is not None:
        if existing.path != path:
            existing.path = path
            existing.save(update_fields=["path", "key", "updated"])
        return existing
    parent = _ensure_path(paths.ACCOUNTS_ROOT)
    topic = Topic.objects.filter(key=paths.path_key(path)).first()
    if topic is None:
        return Topic.objects.create(path=path, parent=parent, account=account)
    topic.account = account
    topic.save(update_fields=["account", "updated"])
    return topic


# ------------------------------------------------------------------------------ new accounts


@transaction.atomic
def create_account(username: str, password: str, *, email: str = "", proper_name: str = "",
                   superuser: bool = False, remote_server: bool = False) -> Account:
    """A new account (its account topic follows, :mod:`accounts.signals`): the name's rules,
    one account per case-folded name (409), the password validators, a valid e-mail."""
    if Account.objects.filter(username_key=username.casefold()).exists():
        raise conflict("account exists")
    account = Account(username=username, email=email, proper_name=proper_name,
                      is_superuser=superuser, is_staff=superuser,
                      is_remote_server=remote_server)
    set_checked_password(account, password)
    try:
        account.full_clean(exclude=["password", "username_key"])
    except ValidationError as exc:
        raise bad_request("; ".join(exc.messages)) from exc
    try:
        with transaction.atomic():
            account.save()
    except IntegrityError as exc:  # created concurrently
        raise conflict("account exists") from exc
    return account
