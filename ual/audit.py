"""Who is changing the access lists: the actor recorded in :class:`ual.models.UALAuditLog`.

The actor is kept in a context variable, so it follows the code that makes the change through
threads and asyncio tasks without being passed around:

* the admin screens of the ``ual`` and ``topics`` apps wrap their views in
  :func:`acting_as` with the logged-in user's name (:class:`ual.admin.AuditedAdminMixin`);
* ``manage.py grant`` runs as ``"manage.py grant"``;
* :class:`AuditActorMiddleware`, when listed in ``MIDDLEWARE`` after Django's
  ``AuthenticationMiddleware``, names the logged-in user for every other view as well (for
  instance entries deleted along with an account in the account admin);
* anything else (a shell, a Celery task, a topic removed over SMQP) is ``"system"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

SYSTEM = "system"
GRANT_COMMAND = "manage.py grant"

# A name, or a callable giving one (so a middleware need not resolve the lazy request.user
# for requests that change nothing).
_actor: ContextVar[str | Callable[[], str | None] | None] = ContextVar("ual_actor", default=None)


@contextmanager
def acting_as(actor: str | Callable[[], str | None]) -> Iterator[None]:
    """Record ``actor`` as the author of every UAL change made inside the block."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def current_actor() -> str:
    """The name recorded for a change made now."""
    actor = _actor.get()
    if callable(actor):
        actor = actor()
    return actor or SYSTEM


def user_name(request: HttpRequest) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return user.get_username()


class AuditActorMiddleware:
    """Names the logged-in user as the actor of UAL changes made while serving a request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with acting_as(lambda: user_name(request)):
            return self.get_response(request)
