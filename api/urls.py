"""``/api/v1/`` (the resources), ``/api/schema/`` (OpenAPI 3) and ``/api/docs/`` (Swagger
UI, served from the broker's own static files: drf-spectacular-sidecar)."""

from __future__ import annotations

from collections.abc import Callable

from django.urls import include, path, re_path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

# The schema module registers the bearer scheme with drf-spectacular: imported with the
# routes that serve the schema, not at django.setup(), where DRF and drf-spectacular would cost
# every process (listener, storage processes, manage.py) ~0.4 s of CPU for nothing.
from . import schema, views  # noqa: F401


class IdConverter:
    """A row id: at most 18 digits (a larger number would overflow the database's bigint,
    and is no row anyway)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(IdConverter, "id")


def long_poll(view: Callable) -> Callable:
    """Served on the threads of long polls (:mod:`broker.http`)."""
    view.long_poll = True  # type: ignore[attr-defined]
    return view


TOPIC = r"(?P<path>[\s\S]+?)"

v1 = [
    path("", views.IndexView.as_view()),
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
    path("subscriptions/<id:pk>/pull", long_poll(views.PullView.as_view())),
    path("receipts/ack", views.AcksView.as_view()),
    path("receipts/nack", views.NacksView.as_view()),
    path("receipts/<str:receipt>/ack", views.AckView.as_view()),
    path("receipts/<str:receipt>/nack", views.NackView.as_view()),
    path("ual/entries/", views.EntriesView.as_view()),
    path("ual/entries/<id:pk>", views.EntryView.as_view()),
    path("ual/explain", views.ExplainView.as_view()),
    path("accounts/", views.AccountsView.as_view()),
    path("accounts/<str:name>", views.AccountView.as_view()),
    path("accounts/<str:name>/password", views.AccountPasswordView.as_view()),
    path("sessions/", views.SessionsView.as_view()),
    path("sessions/<str:guid>", views.SessionView.as_view()),
    # A topic's queue: under queues/, where no route names a bare topic (a topic may
    # well be called .../purge).
    re_path(rf"^queues/{TOPIC}/consumers$", views.ConsumersView.as_view()),
    re_path(rf"^queues/{TOPIC}/purge$", views.PurgeView.as_view()),
    re_path(rf"^queues/{TOPIC}/peek$", views.PeekView.as_view()),
    path("definitions", views.DefinitionsView.as_view()),
    path("stats/", views.StatsView.as_view()),
    path("reports/", views.ReportsView.as_view()),
    path("reports/<str:day>", views.ReportView.as_view()),
    path("links/", views.LinksView.as_view()),
    path("links/<str:name>", views.LinkView.as_view()),
    # Anything else under /api/v1/ is a problem document too, not Django's HTML page.
    re_path(r"^[\s\S]*$", views.NoSuchResource.as_view()),
]

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("v1/", include(v1)),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
