"""``/metrics`` in the Prometheus text format, built by prometheus-client from
:mod:`broker.services.stats` at each scrape (a custom collector: the figures live in Redis and
the database, shared by every process, not in this one's memory).

Who may read it is ``SMQP_METRICS``: ``off`` (404), ``open`` (anyone), or ``staff`` (the
default): a logged-in staff user, a request with ``Authorization: Bearer
<SMQP_METRICS_TOKEN>``, or a client address in ``SMQP_METRICS_ALLOW``.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator

import redis
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from broker.services import stats
from broker.store import opsmetrics


class BrokerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        # Redis away: the store's figures are still served; the listeners' counters are not
        # (left out rather than shown as 0, which a rate() would take for a reset).
        try:
            totals = opsmetrics.totals()
            listeners = opsmetrics.listeners()
            up = 1
        except redis.RedisError:
            totals, listeners, up = {}, [], 0
        yield GaugeMetricFamily("smqp_counters_up", "1 when the listeners' counters (Redis) "
                                "could be read for this scrape.", value=up)
        yield from self._store_figures()
        if up:
            yield from self._counted(totals, listeners)

    def _counted(self, totals: dict[str, float], listeners: list[dict]) -> Iterator[Metric]:
        messages = CounterMetricFamily(
            "smqp_messages", "Messages published (committed), delivered (NOTIFY MESSAGE "
            "sent) and acknowledged (ACK committed), counted by the listeners.",
            labels=["kind"])
        for kind, n in stats.message_totals(totals).items():
            messages.add_metric([kind], n)
        yield messages

        commits = stats.group_commits(totals)
        sizes = HistogramMetricFamily(
            "smqp_group_commit_size", "Requests per group commit.", labels=["lane"])
        latency = HistogramMetricFamily(
            "smqp_group_commit_seconds", "Seconds from sending a group commit to the storage "
            "process to its answer.", labels=["lane"])
        failures = CounterMetricFamily(
            "smqp_group_commit_failures", "Group commits that failed.", labels=["lane"])
        for lane, c in commits.items():
            sizes.add_metric([lane], list(c["size_buckets"].items()), c["size_sum"])
            latency.add_metric([lane], list(c["seconds_buckets"].items()), c["seconds_sum"])
            failures.add_metric([lane], c["failures"])
        yield sizes
        yield latency
        yield failures

        yield GaugeMetricFamily("smqp_listeners", "Listener processes reporting.",
                                value=len(listeners))
        up = GaugeMetricFamily("smqp_storage_process_up",
                               "1 while a listener's storage process runs.",
                               labels=["host", "pid", "lane"])
        starts = GaugeMetricFamily("smqp_storage_process_starts",
                                   "Times a listener started this storage process.",
                                   labels=["host", "pid", "lane"])
        waiting = GaugeMetricFamily("smqp_storage_process_waiting",
                                    "Calls waiting for this storage process's answer.",
                                    labels=["host", "pid", "lane"])
        for listener in listeners:
            for lane in listener.get("storage_processes", []):
                labels = [listener["host"], str(listener["pid"]), lane["name"]]
                up.add_metric(labels, 1 if lane["alive"] else 0)
                starts.add_metric(labels, lane["starts"])
                waiting.add_metric(labels, lane["waiting"])
        yield up
        yield starts
        yield waiting

    def _store_figures(self) -> Iterator[Metric]:
        stored = GaugeMetricFamily("smqp_queue_messages",
                                   "Messages stored on a topic, not yet expired.",
                                   labels=["topic"])
        deliveries = GaugeMetricFamily(
            "smqp_queue_deliveries", "Deliveries of a topic's messages by state: pending "
            "(waiting), locked (queue mode, with a session), dead (retries spent).",
            labels=["topic", "state"])
        for row in stats.depths(limit=None):
            stored.add_metric([row["path"]], row["messages"])
            for state in ("pending", "locked", "dead"):
                deliveries.add_metric([row["path"], state], row[state])
        yield stored
        yield deliveries

        sessions = GaugeMetricFamily("smqp_sessions", "Live sessions by door.", labels=["door"])
        for door, n in sorted(stats.sessions_by_door().items()):
            sessions.add_metric([door], n)
        yield sessions

        yield from self._links()

    def _links(self) -> Iterator[Metric]:
        """Per federation link (profile §9.5): up or not, and what this server holds for
        the peer (its backlog); the counters the supervisor keeps in the link's row."""
        up = GaugeMetricFamily("smqp_link_up", "1 while the federation link's session to "
                               "its peer is up (logged in), else 0.", labels=["link"])
        enabled = GaugeMetricFamily("smqp_link_enabled", "1 when the link is enabled.",
                                    labels=["link"])
        backlog = GaugeMetricFamily(
            "smqp_link_backlog", "Messages this server holds for the link's peer (pending "
            "deliveries to its account here); absent without a peer account.",
            labels=["link"])
        stored = CounterMetricFamily("smqp_link_stored", "Messages received over the link "
                                     "and stored here.", labels=["link"])
        dropped = CounterMetricFamily("smqp_link_dropped", "Messages received over the link "
                                      "and dropped (loop, duplicate, Depth, imports).",
                                      labels=["link"])
        for link in stats.links():
            name = [link["name"]]
            up.add_metric(name, 1 if link["up"] else 0)
            enabled.add_metric(name, 1 if link["enabled"] else 0)
            if link["backlog"] is not None:
                backlog.add_metric(name, link["backlog"])
            stored.add_metric(name, link["stored"])
            dropped.add_metric(name, link["dropped"])
        yield from (up, enabled, backlog, stored, dropped)


def _allowed(request: HttpRequest) -> bool:
    mode = settings.SMQP_METRICS
    if mode == "open":
        return True
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    token = settings.SMQP_METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token and given.startswith("Bearer ") and hmac.compare_digest(
            given[7:].strip().encode(), token.encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in net for net in _networks(settings.SMQP_METRICS_ALLOW))


def _networks(spec: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for part in spec.split(","):
        part = part.strip()
        if part == "loopback":
            nets += [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]
        elif part:
            nets.append(ipaddress.ip_network(part, strict=False))
    return nets


def metrics_view(request: HttpRequest) -> HttpResponse:
    if settings.SMQP_METRICS == "off":
        raise Http404("metrics are off")
    if not _allowed(request):
        return HttpResponse("metrics: staff login, a bearer token or an allowed address "
                            "needed\n", status=403, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
