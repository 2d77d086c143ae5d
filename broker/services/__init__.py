"""The business rules of the broker, written once. Every door (SMQP, WebSocket, REST, admin,
management commands) calls these functions; none re-implements a rule.

Service functions are synchronous (they use the ORM); async doors call them on a database
thread (the SMQP listener through :mod:`broker.store.dbthread`). They refuse by raising
:class:`ServiceError`, which carries a :class:`~broker.domain.errors.Refusal`: every door maps
the refusal to its own wire form in one place.
"""

from __future__ import annotations

from broker.domain.errors import Refusal

__all__ = ["Refusal", "ServiceError", "bad_request", "conflict", "max_quantity", "not_acceptable",
           "not_allowed", "not_found", "refuse", "server_error", "too_large", "unauthorized"]


class ServiceError(Exception):
    """A refusal by the rules: ``refusal`` says which (and so each door's wire form), ``text``
    is the SMQP reply text (``"Not found (topic)"``); ``code`` is the SMQP reply code.

    ``ServiceError(Refusal.NOT_FOUND, "Not found (topic)")``; :func:`refuse` and the helpers
    below add the reason to the phrase. An SMQP code in place of the refusal is looked up
    (:meth:`Refusal.of`), for callers written before the enum; the text defaults to the
    refusal's phrase.
    """

    def __init__(self, refusal: Refusal | int, text: str | None = None) -> None:
        if not isinstance(refusal, Refusal):
            refusal = Refusal.of(refusal)
        self.refusal = refusal
        self.text = refusal.phrase if text is None else text
        super().__init__(f"{refusal.smqp} {self.text}")

    @property
    def code(self) -> int:
        return self.refusal.smqp

    def __reduce__(self) -> tuple:
        # Pickled by its own arguments (a storage process sends refusals back).
        return (type(self), (self.refusal, self.text))


def refuse(refusal: Refusal, reason: str = "") -> ServiceError:
    """``ServiceError(refusal, "<phrase> (<reason>)")``, the phrase alone without a reason."""
    return ServiceError(refusal, refusal.text(reason))


def bad_request(reason: str) -> ServiceError:
    return refuse(Refusal.BAD_REQUEST, reason)


def unauthorized(reason: str = "") -> ServiceError:
    return refuse(Refusal.UNAUTHORIZED, reason)


def not_found(what: str = "") -> ServiceError:
    return refuse(Refusal.NOT_FOUND, what)


def not_allowed(reason: str = "") -> ServiceError:
    return refuse(Refusal.NOT_ALLOWED, reason)


def not_acceptable(reason: str = "") -> ServiceError:
    return refuse(Refusal.NOT_ACCEPTABLE, reason)


def conflict(reason: str = "") -> ServiceError:
    return refuse(Refusal.CONFLICT, reason)


def too_large(reason: str = "") -> ServiceError:
    return refuse(Refusal.TOO_LARGE, reason)


def max_quantity(reason: str = "") -> ServiceError:
    return refuse(Refusal.MAX_QUANTITY, reason)


def server_error(reason: str = "") -> ServiceError:
    """Nothing was committed (the store failed, or a storage process was lost)."""
    return refuse(Refusal.SERVER_ERROR, reason)
