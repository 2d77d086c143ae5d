"""``/api/v1/`` (the resources), ``/api/schema/`` (OpenAPI 3) and ``/api/docs/`` (Swagger
UI, served from the broker's own static files: drf-spectacular-sidecar)."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.urls import include, path, re_path, register_converter
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import views


class IdConverter:
    """A row id: at most 18 digits (a larger number would overflow the database's bigint,
    and is no row anyway)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(IdConverter, "id")

_pull = views.PullView.as_view()


@csrf_exempt
async def pull_entry(request, *args, **kwargs):
    """The pull view in a thread of its own (not the one Django runs every synchronous
    view on, one at a time): a long poll waits there without holding other requests up."""

    def run():
        try:
            return _pull(request, *args, **kwargs)
        finally:
            close_old_connections()

    return await sync_to_async(run, thread_sensitive=False)()


# drf-spectacular finds the DRF view behind the wrapper by these.
pull_entry.cls = _pull.cls  # type: ignore[attr-defined]
pull_entry.initkwargs = _pull.initkwargs  # type: ignore[attr-defined]

TOPIC = r"(?P<path>[\s\S]+?)"

v1 = [
    path("auth/tokens", views.TokensView.as_view()),
    path("auth/tokens/<id:pk>", views.TokenView.as_view()),
    path("topics/", views.TopicsView.as_view()),
    re_path(rf"^topics/{TOPIC}/messages/(?P<smuid>[0-9]{{1,18}})$",
            views.TopicMessageView.as_view()),
    re_path(rf"^topics/{TOPIC}/messages$", views.TopicMessagesView.as_view()),
    re_path(rf"^topics/{TOPIC}$", views.TopicView.as_view()),
    path("messages/<id:smuid>/republish", views.RepublishView.as_view()),
    path("subscriptions/", views.SubscriptionsView.as_view()),
    path("subscriptions/<id:pk>", views.SubscriptionView.as_view()),
    path("subscriptions/<id:pk>/pull", pull_entry),
    path("receipts/<str:receipt>/ack", views.AckView.as_view()),
    path("receipts/<str:receipt>/nack", views.NackView.as_view()),
    path("ual/entries/", views.EntriesView.as_view()),
    path("ual/entries/<id:pk>", views.EntryView.as_view()),
    path("ual/explain", views.ExplainView.as_view()),
    path("accounts/", views.AccountsView.as_view()),
    path("accounts/<str:name>", views.AccountView.as_view()),
    # Anything else under /api/v1/ is a problem document too, not Django's HTML page.
    re_path(r"^[\s\S]*$", views.NoSuchResource.as_view()),
]

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("v1/", include(v1)),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
