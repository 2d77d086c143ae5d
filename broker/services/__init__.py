"""The business rules of the broker, written once. Every door (SMQP, WebSocket, REST, admin,
management commands) calls these functions; none re-implements a rule.

Service functions are synchronous (they use the ORM); async doors call them on a database
thread (the SMQP listener through :mod:`broker.store.dbthread`). They raise :class:`ServiceError`
with the SMQP reply code that describes the refusal, so every door can map it to its own wire
form.
"""

from __future__ import annotations


class ServiceError(Exception):
    """A refusal by the rules: ``code`` is the SMQP reply code, ``text`` its reply text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text

    def __reduce__(self) -> tuple:
        # Pickled by its own arguments (a storage process sends refusals back).
        return (type(self), (self.code, self.text))


def bad_request(reason: str) -> ServiceError:
    return ServiceError(400, f"Bad request ({reason})")


def unauthorized(reason: str = "") -> ServiceError:
    return ServiceError(401, f"Unauthorized ({reason})" if reason else "Unauthorized")


def not_found(what: str = "") -> ServiceError:
    return ServiceError(404, f"Not found ({what})" if what else "Not found")


def not_allowed(reason: str = "") -> ServiceError:
    return ServiceError(405, f"Not allowed ({reason})" if reason else "Not allowed")


def conflict(reason: str = "") -> ServiceError:
    return ServiceError(409, f"Conflict ({reason})" if reason else "Conflict")
