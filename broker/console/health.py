"""``/healthz`` (the process answers: liveness) and ``/readyz`` (it can serve: database and
Redis reachable, the database writable) for load balancers and orchestrators. Both are open
(no login, no data but the reason a check failed) and never cached."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from broker.store import health


@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok\n", content_type="text/plain")


@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    checks = {"database": health.database_problem(), "redis": health.redis_problem()}
    ready = not any(checks.values())
    return JsonResponse({"ready": ready,
                         "checks": {name: problem or "ok" for name, problem in checks.items()}},
                        status=200 if ready else 503)
