"""``/api/v1/`` (the resources), ``/api/schema/`` (OpenAPI 3) and ``/api/docs/`` (Swagger
UI, served from the broker's own static files: drf-spectacular-sidecar)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.urls import include, path, re_path, register_converter
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import views
from .pullwait import PullWakeups


class IdConverter:
    """A row id: at most 18 digits (a larger number would overflow the database's bigint,
    and is no row anyway)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(IdConverter, "id")

#: Worker threads of the REST views, and apart from them those of pulls, which may wait
#: (long polling) without taking a thread from other requests. Each thread keeps its own
#: database connection (CONN_MAX_AGE).
VIEW_THREADS = ThreadPoolExecutor(max_workers=settings.SMQP_API_THREADS,
                                  thread_name_prefix="api")
PULL_THREADS = ThreadPoolExecutor(max_workers=settings.SMQP_API_PULL_THREADS,
                                  thread_name_prefix="api-pull")


def offthread(view_class: type, executor: ThreadPoolExecutor = VIEW_THREADS) -> object:
    """The DRF view in a worker thread of ``executor``, not on the one thread Django runs
    every synchronous view on in turn: REST requests then wait on the database side by
    side, not one after another. The services are thread-safe (the topic tree and access
    snapshot caches are shared under locks)."""
    view = view_class.as_view()

    @csrf_exempt
    async def entry(request, *args, **kwargs):
        def run():
            try:
                return view(request, *args, **kwargs)
            finally:
                close_old_connections()  # as request_finished does on Django's own thread

        return await sync_to_async(run, thread_sensitive=False, executor=executor)()

    # drf-spectacular finds the DRF view behind the wrapper by these.
    entry.cls = view.cls  # type: ignore[attr-defined]
    entry.initkwargs = view.initkwargs  # type: ignore[attr-defined]
    return entry


def pull_entry(view_class: type, executor: ThreadPoolExecutor = PULL_THREADS) -> object:
    """:func:`offthread` (on the pull threads by default), with the event loop's dispatcher
    for the view to wait on and count with (:mod:`api.pullwait`)."""
    entry = offthread(view_class, executor)

    @csrf_exempt
    async def pull(request, *args, **kwargs):
        request.pull_wakeups = PullWakeups.here()
        return await entry(request, *args, **kwargs)

    pull.cls = entry.cls  # type: ignore[attr-defined]
    pull.initkwargs = entry.initkwargs  # type: ignore[attr-defined]
    return pull


TOPIC = r"(?P<path>[\s\S]+?)"

v1 = [
    path("", offthread(views.IndexView)),
    path("auth/tokens", offthread(views.TokensView)),
    path("auth/tokens/<id:pk>", offthread(views.TokenView)),
    path("topics/", offthread(views.TopicsView)),
    re_path(rf"^topics/{TOPIC}/messages/(?P<smuid>[0-9]{{1,18}})$",
            offthread(views.TopicMessageView)),
    re_path(rf"^topics/{TOPIC}/messages$", offthread(views.TopicMessagesView)),
    re_path(rf"^topics/{TOPIC}$", offthread(views.TopicView)),
    path("messages/<id:smuid>/republish", offthread(views.RepublishView)),
    path("subscriptions/", offthread(views.SubscriptionsView)),
    path("subscriptions/<id:pk>", offthread(views.SubscriptionView)),
    path("subscriptions/<id:pk>/pull", pull_entry(views.PullView)),
    path("receipts/ack", pull_entry(views.AcksView, VIEW_THREADS)),
    path("receipts/nack", pull_entry(views.NacksView, VIEW_THREADS)),
    path("receipts/<str:receipt>/ack", pull_entry(views.AckView, VIEW_THREADS)),
    path("receipts/<str:receipt>/nack", pull_entry(views.NackView, VIEW_THREADS)),
    path("ual/entries/", offthread(views.EntriesView)),
    path("ual/entries/<id:pk>", offthread(views.EntryView)),
    path("ual/explain", offthread(views.ExplainView)),
    path("accounts/", offthread(views.AccountsView)),
    path("accounts/<str:name>", offthread(views.AccountView)),
    path("accounts/<str:name>/password", offthread(views.AccountPasswordView)),
    path("sessions/", offthread(views.SessionsView)),
    path("sessions/<str:guid>", offthread(views.SessionView)),
    # A topic's queue: under queues/, where no route names a bare topic (a topic may
    # well be called .../purge).
    re_path(rf"^queues/{TOPIC}/consumers$", offthread(views.ConsumersView)),
    re_path(rf"^queues/{TOPIC}/purge$", offthread(views.PurgeView)),
    re_path(rf"^queues/{TOPIC}/peek$", offthread(views.PeekView)),
    path("definitions", offthread(views.DefinitionsView)),
    path("stats/", offthread(views.StatsView)),
    path("reports/", offthread(views.ReportsView)),
    path("reports/<str:day>", offthread(views.ReportView)),
    path("links/", offthread(views.LinksView)),
    path("links/<str:name>", offthread(views.LinkView)),
    # Anything else under /api/v1/ is a problem document too, not Django's HTML page.
    re_path(r"^[\s\S]*$", offthread(views.NoSuchResource)),
]

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("v1/", include(v1)),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
