"""Prometheus metrics on the admin port (``GET /metrics``, bearer token), under Azure IoT Edge's hub metric
names where one means the same, and ``edgehub_``-prefixed names of our own for the rest (docs/operating.md, "Metrics").

Why prometheus-client: it is the reference implementation of the exposition format (escaping, ``# TYPE`` lines,
counters' ``_total`` and summaries' ``_count``/``_sum``), pure Python, with no dependencies; writing the text
format by hand would be a second, untested copy of it.

Nothing is counted per message for metrics: ``HubCollector`` is a custom collector that reads, at scrape time,
the counters the hub keeps anyway (the store's durable ingest and removal counters, the queues' offsets and
checkpoints, the transports' status, every protocol head's connection table, the duplicate window's count). So a
scrape costs a walk over the queues and identities, and the per-message path costs nothing more. The
collector's registry is the hub's own (not prometheus-client's global one), so two hubs in one process (tests)
never mix.

Where a count did not exist, it is kept where the work already happens, once per operation, group or batch,
as a plain int or an ``edgehub.core.opstats.OpStats``, never a prometheus-client call: twin GETs and reported
patches, logins, connects and disconnects, groups the store failed to write, and the router's unrouted count
taken over per group (``EdgeHub``); method calls (``MethodDispatcher.calls``); each executor's batches settled
(``EndpointExecutor.sends``); each MQTT upstream's lost connections and outage times (``UpstreamStatus``).

Semantics worth knowing: ``edgehub_messages_received_total`` counts messages stored (durable) per sending
identity; a message no route takes is acknowledged but not stored, and counted in
``edgehub_messages_dropped_total{reason="no_route"}``. Counters kept in the store (received, removed) survive
restarts, as the data they count does; the others start at 0 with the process, as Azure's do. Durations are
summaries of ``_count`` and ``_sum`` only (no quantiles: nothing is sampled); ``message_send_duration`` times a
batch, not a message (docs/operating.md, "Metrics", says where each name differs from Azure's).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from edgehub.core.endpoints import parse_device_endpoint, parse_module_endpoint
from edgehub.core.opstats import OpStats
from edgehub.core.refusals import RefusalReason
from edgehub.hub.facade import EdgeHub
from edgehub.runtime.admin.api import RouteHandler
from edgehub.runtime.admin.heads import LiveConnections, connected_count
from edgehub.runtime.admin.http import Request, Response
from edgehub.runtime.admin.links import link_metrics
from edgehub.store import RemovalReason

__all__ = ["AZURE_NAMES", "HubCollector", "metrics_routes"]

# Our store's removal reasons under the reasons of Azure's edgehub_messages_dropped_total (ours where it has none).
_DROP_REASONS = {RemovalReason.TTL: "ttl_expiry", RemovalReason.OVERFLOW: "overflow"}

# The names we share with Azure IoT Edge's hub (its doc/BuiltInMetrics.md), and what we put under each.
AZURE_NAMES = {
    "edgehub_messages_received_total": "messages stored from a client, per identity (id)",
    "edgehub_messages_sent_total": "messages the endpoint acknowledged, per endpoint (to, to_route_input)",
    "edgehub_message_send_duration_seconds": "time from handing a batch to its endpoint to its result, per batch",
    "edgehub_queue_length": "undelivered messages per endpoint and priority",
    "edgehub_messages_dropped_total": "messages acknowledged but not delivered, per reason (ttl_expiry, overflow, "
    "duplicate, no_route)",
    "edgehub_messages_unack_total": "messages not acknowledged because the store failed to write them",
    "edgehub_message_size_bytes": "size of messages from clients, per identity (summary: _count and _sum)",
    "edgehub_gettwin_total": "twin GETs the hub answered, per identity (source=edge, id)",
    "edgehub_gettwin_duration_seconds": "time to answer a twin GET",
    "edgehub_reported_properties_total": "reported-properties patches, refused ones too (target=edge, id)",
    "edgehub_reported_properties_update_duration_seconds": "time to check and durably write a patch",
    "edgehub_direct_methods_total": "direct method calls relayed, refused ones too (from, to)",
    "edgehub_direct_method_duration_seconds": "time from a call to its answer (or its error)",
    "edgehub_client_connect_failed_total": "logins refused, per reason (bad_credentials, login_throttled)",
    "edgehub_client_connect_success_total": "logins accepted, per identity (id)",
    "edgehub_client_disconnect_total": "connections ended after login, per identity (id)",
    "edgehub_connected_clients": "clients logged in now",
    "edgehub_offline_count_total": "upstream connections lost, per lane",
    "edgehub_offline_duration_seconds": "time from a lost upstream connection to the next, per lane",
}


class HubCollector(Collector):
    """Reads the hub's counters at scrape time (module docstring)."""

    def __init__(self, hub: EdgeHub, heads: Sequence[LiveConnections] = ()) -> None:
        self._hub = hub
        self._heads = heads

    def collect(self) -> Iterator[Metric]:
        hub, store = self._hub, self._hub.store
        received = CounterMetricFamily(
            "edgehub_messages_received", "Messages stored from clients (durable)", labels=["id"]
        )
        sizes = SummaryMetricFamily("edgehub_message_size_bytes", "Size of messages from clients", labels=["id"])
        for identity, _ in hub.identities.identities():
            count, size = store.ingested(identity_id=identity.id)
            if count:
                received.add_metric([identity.id], count)
                sizes.add_metric([identity.id], count_value=count, sum_value=size)
        yield received
        yield sizes

        queue_length = GaugeMetricFamily(
            "edgehub_queue_length", "Undelivered messages per endpoint and priority", labels=["endpoint", "priority"]
        )
        for q in store.queues():
            pending = max(0, store.end_offset(q) - store.checkpoint(q).committed - 1)
            queue_length.add_metric([q.endpoint, str(q.priority)], pending)
        yield queue_length

        dropped = CounterMetricFamily(
            "edgehub_messages_dropped", "Messages removed before delivery, by reason", labels=["reason"]
        )
        for reason, name in _DROP_REASONS.items():
            dropped.add_metric([name], store.removed.get(reason, 0))
        dropped.add_metric(["duplicate"], hub.duplicates_dropped)
        dropped.add_metric(["no_route"], hub.no_route)
        yield dropped

        unack = CounterMetricFamily(
            "edgehub_messages_unack", "Messages not acknowledged: the store failed to write them", labels=["reason"]
        )
        unack.add_metric(["storage_failure"], hub.unacked_store_failure)
        yield unack

        refused = CounterMetricFamily(
            "edgehub_messages_refused", "Messages ingest refused to their sender, by reason", labels=["reason"]
        )
        for refusal, count in sorted(hub.ingest_refused.items()):
            refused.add_metric([str(refusal)], count)
        yield refused

        removed = CounterMetricFamily(
            "edgehub_store_removed", "References removed from the store's queues, by reason", labels=["reason"]
        )
        for reason in RemovalReason:
            removed.add_metric([reason.value], store.removed.get(reason, 0))
        yield removed

        held, held_bytes = store.usage(None)
        yield GaugeMetricFamily("edgehub_store_messages", "Messages held in the store", value=held)
        yield GaugeMetricFamily("edgehub_store_bytes", "Bytes held in the store (charged sizes)", value=held_bytes)
        quota = store.store_quota.max_bytes
        if quota is not None:
            yield GaugeMetricFamily("edgehub_store_quota_bytes", "The store's byte quota", value=quota)
        yield CounterMetricFamily(
            "edgehub_store_ingested_bytes", "Bytes ever stored (charged sizes)", value=store.ingested()[1]
        )

        if self._heads:
            yield GaugeMetricFamily(
                "edgehub_connected_clients", "Clients logged in now", value=connected_count(self._heads)
            )
            yield from self._clients(self._heads)
            yield CounterMetricFamily(
                "edgehub_refusals",
                "Refusals of the protocol heads (logins, limits, packets)",
                value=sum(head.refusals.total for head in self._heads),
            )
        yield from self._sends()
        yield from self._uplink()
        yield from link_metrics(hub)
        yield from self._operations()

    def _clients(self, heads: Sequence[LiveConnections]) -> Iterator[Metric]:
        """Logins: those the hub refused (credentials), those the heads' login throttles refused, connects and
        disconnects (counted by the hub once per login and per connection end, for every head)."""
        hub = self._hub
        failed = CounterMetricFamily("edgehub_client_connect_failed", "Logins refused, by reason", labels=["reason"])
        for (reason,), count, _ in hub.connect_failures.items():
            failed.add_metric([reason], count)
        # The heads of one hub share one throttle: each counted once.
        throttled = sum({id(head.logins): head.logins.refused for head in heads}.values())
        failed.add_metric([RefusalReason.LOGIN_THROTTLED.value], throttled)
        yield failed
        yield from _counted("edgehub_client_connect_success", "Successful logins", hub.client_connects)
        yield from _counted("edgehub_client_disconnect", "Connections ended after login", hub.client_disconnects)

    def _operations(self) -> Iterator[Metric]:
        """The counts and times kept per operation (``edgehub.core.opstats``)."""
        hub = self._hub
        yield from _counted("edgehub_gettwin", "GetTwin calls", hub.twin_gets)
        yield _timed("edgehub_gettwin_duration_seconds", "Time taken to get twin", hub.twin_gets)
        yield from _counted("edgehub_reported_properties", "Reported properties update calls", hub.reported_updates)
        yield _timed(
            "edgehub_reported_properties_update_duration_seconds",
            "Time taken to update reported properties",
            hub.reported_updates,
        )
        yield from _counted("edgehub_direct_methods", "Direct method calls", hub.methods.calls)
        yield _timed("edgehub_direct_method_duration_seconds", "Time taken to call direct method", hub.methods.calls)

    def _sends(self) -> Iterator[Metric]:
        """What each endpoint's executor sent, counted per batch settled (``SendStats``)."""
        labels = ["to", "to_route_input"]
        sent = CounterMetricFamily("edgehub_messages_sent", "Messages sent and acknowledged", labels=labels)
        took = SummaryMetricFamily("edgehub_message_send_duration_seconds", "Time taken to send batches", labels=labels)
        for endpoint_id, executor in sorted(self._hub.executors.items()):
            module = parse_module_endpoint(endpoint_id)
            device = parse_device_endpoint(endpoint_id)
            # Azure's labels: a module and its input; a device (cloud-to-device); the upstream (lane) with no input.
            to = list(module) if module is not None else [device if device is not None else endpoint_id, ""]
            stats = executor.sends
            sent.add_metric(to, stats.messages)
            took.add_metric(to, count_value=stats.batches, sum_value=stats.seconds)
        yield sent
        yield took

    def _uplink(self) -> Iterator[Metric]:
        connected = GaugeMetricFamily("edgehub_upstream_connected", "1 while the lane's link is up", labels=["lane"])
        rate = GaugeMetricFamily("edgehub_upstream_rate_bps", "Achieved upstream rate, bits/s", labels=["lane"])
        rtt = GaugeMetricFamily("edgehub_upstream_rtt_seconds", "Least PUBLISH-to-PUBACK time lately", labels=["lane"])
        inflight = GaugeMetricFamily("edgehub_upstream_inflight_bytes", "Unacknowledged bytes", labels=["lane"])
        wire = CounterMetricFamily("edgehub_upstream_wire_bytes", "PUBLISH bytes acknowledged", labels=["lane"])
        connects = CounterMetricFamily("edgehub_upstream_connects", "Successful connects", labels=["lane"])
        offline = CounterMetricFamily("edgehub_offline_count", "Upstream connections lost", labels=["lane"])
        offline_s = SummaryMetricFamily(
            "edgehub_offline_duration_seconds", "Time from a lost upstream connection to the next", labels=["lane"]
        )
        for lane in self._hub.upstream_status().lanes:
            t = lane.transport
            if t is None:
                continue
            name = [lane.endpoint_id]
            connected.add_metric(name, 1 if t.connected else 0)
            rate.add_metric(name, t.achieved_bps)
            if t.rtt_min_s is not None:
                rtt.add_metric(name, t.rtt_min_s)
            inflight.add_metric(name, t.inflight_bytes)
            wire.add_metric(name, t.wire_bytes_acked)
            connects.add_metric(name, t.connects)
            offline.add_metric(name, t.offline_count)
            offline_s.add_metric(name, count_value=t.offline_ended, sum_value=t.offline_s)  # outages that ended
        yield from (connected, rate, rtt, inflight, wire, connects, offline, offline_s)


def _counted(name: str, documentation: str, stats: OpStats) -> Iterator[Metric]:
    family = CounterMetricFamily(name, documentation, labels=list(stats.labels))
    for values, count, _ in stats.items():
        family.add_metric(list(values), count)
    yield family


def _timed(name: str, documentation: str, stats: OpStats) -> Metric:
    """A summary of ``_count`` and ``_sum`` only: times are summed per operation, not sampled for quantiles."""
    family = SummaryMetricFamily(name, documentation, labels=list(stats.labels))
    for values, count, seconds in stats.items():
        family.add_metric(list(values), count_value=count, sum_value=seconds)
    return family


def metrics_routes(hub: EdgeHub, heads: Sequence[LiveConnections] = ()) -> list[tuple[str, str, RouteHandler, bool]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(hub, heads))

    async def metrics(request: Request, params: tuple[str, ...]) -> Response:
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    return [("GET", "/metrics", metrics, False)]
