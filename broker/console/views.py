"""The console's pages. Staff only (``admin.site.admin_view``); what changes something also
needs a model permission, and then runs the same service as over SMQP."""

from __future__ import annotations

import uuid

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_POST

from broker.domain import message as codec
from broker.models import Message
from broker.services import ServiceError, operations, stats
from broker.services import publish as publish_service
from broker.store import opsmetrics
from topics.admin import console_snapshot, refusal

#: The test message's body is limited: the form is for checking a topic, not for loads.
MAX_TEST_BODY = 64 * 1024


def _context(request: HttpRequest, title: str) -> dict:
    return {**admin.site.each_context(request), "title": title}


def _require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied


def overview_json(request: HttpRequest) -> JsonResponse:
    """:func:`broker.services.stats.snapshot`, for the overview's live refresh."""
    return JsonResponse(stats.snapshot())


def topic_page(request: HttpRequest) -> HttpResponse:
    path = request.GET.get("path") or request.POST.get("path") or ""
    detail = stats.topic_detail(path) if path else None
    if detail is None:
        raise Http404("no such topic")
    if request.method == "POST":
        return _publish_test(request, detail["asked"])
    context = _context(request, f"Topic {detail['path']}")
    context.update(detail=detail, path=detail["asked"],
                   consumers=operations.consumers(detail["asked"])["consumers"],
                   json_url=reverse("ops-topic-json") + "?" + urlencode({"path": path}),
                   can_publish=request.user.has_perm("broker.add_message"))
    return TemplateResponse(request, "admin/ops/topic.html", context)


def topic_json(request: HttpRequest) -> JsonResponse:
    detail = stats.topic_detail(request.GET.get("path", ""))
    if detail is None:
        raise Http404("no such topic")
    return JsonResponse(detail)


def _publish_test(request: HttpRequest, path: str) -> HttpResponse:
    """Publish one text/plain message as the logged-in account, with its own rights (the
    publish service decides, as for PUB MESSAGE)."""
    _require(request, "broker.add_message")
    body = request.POST.get("body", "").encode()
    back = reverse("ops-topic") + "?" + urlencode({"path": path})
    if len(body) > MAX_TEST_BODY:
        messages.error(request, f"A test message holds at most {MAX_TEST_BODY} bytes.")
        return HttpResponseRedirect(back)
    headers = [("Name", request.POST.get("name", "")[:128])] if request.POST.get("name") else []
    msg = codec.Message(headers, [codec.DataSection([("Content-Type", "text/plain")], body)])
    cmuid = f"console-{uuid.uuid4().hex[:12]}"
    try:
        published = publish_service.publish(publish_service.PublishRequest(
            account_id=request.user.pk, guid="console", kind="MESSAGE", topic=path,
            cmuid=cmuid, message=msg, peer=request.META.get("REMOTE_ADDR", ""),
            door="console"))
    except ServiceError as exc:
        messages.error(request, refusal(exc))
        return HttpResponseRedirect(back)
    opsmetrics.count_now("publish")
    messages.success(request, f"Published {cmuid} as message {published.smuid} on "
                              f"{published.topic_path}.")
    return HttpResponseRedirect(back)


def sessions_page(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        _require(request, "accounts.change_loginsession")
        guid = request.POST.get("guid", "")
        if stats.close_session(guid):
            messages.success(request, f"Session {guid} is being closed.")
        else:
            messages.warning(request, f"No live session {guid}.")
        return HttpResponseRedirect(reverse("ops-sessions"))
    context = _context(request, "Sessions")
    rows, _ = operations.sessions()
    context.update(sessions=rows, by_door=stats.sessions_by_door(),
                   can_close=request.user.has_perm("accounts.change_loginsession"))
    return TemplateResponse(request, "admin/ops/sessions.html", context)


def sessions_json(request: HttpRequest) -> JsonResponse:
    rows, _ = operations.sessions()
    return JsonResponse({"sessions": rows, "by_door": stats.sessions_by_door()})


@require_POST
def republish(request: HttpRequest) -> HttpResponse:
    """REPUBLISH a dead letter from Trash to its topic's current subscribers, as a superuser's
    REPUBLISH MESSAGE would (the console's rule: model permissions let one in, the service
    decides)."""
    _require(request, "broker.change_message")
    back = request.POST.get("next", "")
    if not back.startswith("/") or not url_has_allowed_host_and_scheme(
            back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("admin:index")  # never off the site
    try:
        smuid = int(request.POST.get("smuid", ""))
    except ValueError:
        messages.error(request, "No message number.")
        return HttpResponseRedirect(back)
    message = Message.objects.select_related("topic").filter(pk=smuid).first()
    if message is None:
        messages.error(request, f"No message {smuid}.")
        return HttpResponseRedirect(back)
    try:
        published = publish_service.republish(console_snapshot(request.user),
                                              message.topic.path, smuid)
    except ServiceError as exc:
        messages.error(request, refusal(exc))
        return HttpResponseRedirect(back)
    messages.success(request, f"Message {smuid} republished on {published.topic_path} to "
                              f"{len(published.accounts)} subscriber(s).")
    return HttpResponseRedirect(back)
