"""The composition root: the store, the router, the hub facade and the MQTT and AMQP heads, wired and run until
stopped.

``serve(config, stop=event)`` runs until ``stop`` is set (the CLI sets it on SIGTERM/SIGINT), then stops in
order: the listeners and their clients first (so no ack is promised after the store closes), then the
executors, then the store (closed, so every acknowledged message is on disk).

Before it opens the store, ``serve`` reads every record of it with checksums verified (``open_store(verify=True)``):
a damaged store raises ``StoreCorruptionError`` before anything is written to it, its message saying the damage,
the path and the way out (``edgehub store check`` / ``repair``, ``damaged_store_advice``), and the hub does not
start (the CLI exits 1 with that message, no traceback).

``$upstream``: when ``HubConfig.upstream`` names an MQTT broker or parent hub (``MqttUpstreamSettings``,
``edgehub run --upstream-mqtt``), an ``MqttUpstream`` transport delivers it; when it names a landing zone
(``UploadUpstreamSettings``, ``edgehub run --upstream-upload``), an ``UploadTransport`` writes one segment file per
batch there through a ``LandingZone`` (fsspec: a folder, or s3/abfs/... with the plugin installed); otherwise
messages routed there stay queued in the store (they survive restarts and go out once an upstream is configured;
``edgehub run`` uploads to ``DATA_DIR/landing`` unless told otherwise, ``edgehub.runtime.cli.firstrun``).
Over MQTT, the first lane's connection also serves the cloud's side: it subscribes for the devices the hub knows,
and the messages for them and the direct method calls it receives go to the hub (``edgehub.upstream.mqtt.cloud``).

How the transport uses its link (``wireMode``, ``maxUplinkBps``, ``maxBatchBytes``, ``lingerMs``,
``maxInflightBytes``, ``linkRateBps``, ``linkRttMs``, ``compression``, ``maxPacketBytes``, ``brokerMaxPacketBytes``)
comes from the manifest's ``upstream`` section applied over ``HubConfig.upstream``, and
``HubConfig.upstream_overrides`` (the CLI's ``--upstream-*`` flags) over both (``transport_settings``). Every
setting the hub runs with is settled once, by ``effective_settings`` (``edgehub.runtime.compose.settings``), which
also says where each came from (``edgehub config show``). Credentials
and TLS come from ``HubConfig.upstream`` only (the CLI), never the manifest. The link settings are the MQTT
transport's; the upload transport takes none of them (its batches are the executor's, up to
``UploadTransport.max_batch_messages``, and each is one file), except ``maxUplinkBps``, which caps the bytes it
writes too.

Partitions and duplicate detection come from the manifest's ``upstream`` section, each overridable in
``HubConfig`` (the CLI's ``--upstream-partitions``, ``--duplicate-detection``, ``--duplicate-window-secs``).
With ``partitions`` N > 1 there is one transport per lane ``$upstream/{i}``: an ``MqttUpstream``
(``lane_settings``) with its own connection, client id ``{client_id}-p{i}`` and segment lane ``upstream-p{i}``, or
an ``UploadTransport`` (``upload_lane``) whose segment files carry the lane ``upstream-p{i}`` in their names. A
lane the store still holds undelivered messages for but that the partition count no longer names (after N
changed) gets a transport too, so what it held still goes out; new messages never go to it, and once drained it
is left out at the next start.

The admin API (``HubConfig.admin_port``, ``edgehub run --admin-port``; ``edgehub.runtime.admin.server``) listens
on 127.0.0.1 beside the MQTT head, from when the head listens until it stops.

The deployment: the manifest is checked whole before anything starts (in a child process,
``check_deployment``: the serving hub never loads pydantic, the manifest's models or lark), then a
``DeploymentController`` (``edgehub.runtime.deployment.controller``) applies it to the running hub, watches the file and
applies it again when it changes, applies desired patches from the cloud over the first upstream lane's MQTT
connection (``TwinChannel``) and reports back over it; the MQTT head's ACL asks the controller's grants.

Limits (``HubConfig.limits``, ``HubLimits``; the CLI's ``--max-token-lifetime``, ``--store-quota``,
``--identity-share``): how far ahead a SAS token may expire (a year), the twins' sizes (``TwinLimits``), and the
store's byte quota, by default derived at start from the free space of the store's filesystem
(``disk_store_quota``: what it holds plus half the free space, at most 32 GiB), with each identity's share of it
(a quarter). No store quota at all only when asked for (``store_max_bytes=None``, ``--store-quota none``).

The hardware profile (``HubConfig.profile``, ``edgehub run --profile``; ``edgehub.runtime.profiles``) gives the
store its RocksDB memory budget, fsync policy and group size, and the upstream transports their batch size in
messages (under the manifest's and the command line's settings, ``transport_settings``).

``serve`` reads as its steps, each a small function: check the manifest while the host is prepared (descriptor
limit, data directory, seal key, certificates) and the store opened; settle the settings; start the upstream
transports; open the hub facade; start the deployment controller; open the heads and the admin API; wait. Every
step that holds something registers its release on one ``AsyncExitStack``, so the hub stops in the reverse order
of its start whatever step failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgehub.core.sealing import SecretSealer
from edgehub.delivery import Endpoint
from edgehub.hub import ConnectionLimiter, LoginThrottle
from edgehub.hub.facade import EdgeHub
from edgehub.hub.modules import MAX_WINDOW
from edgehub.manifest.documents import ManifestError, read_manifest_file
from edgehub.runtime.admin.api import DesiredStateService
from edgehub.runtime.admin.server import LiveConnections, serve_admin
from edgehub.runtime.certs import HubCerts, ensure_certs, server_ssl_context
from edgehub.runtime.compose.config import HubConfig, UploadUpstreamSettings
from edgehub.runtime.compose.links import linked_lanes
from edgehub.runtime.compose.settings import EffectiveSettings, effective_settings
from edgehub.runtime.compose.store import open_store, seal_clear_identity_keys, store_path, store_quota
from edgehub.runtime.compose.upstream import lane_ids, lane_settings, upload_lane
from edgehub.runtime.data_dir import tighten_data_dir
from edgehub.runtime.deployment.controller import DeploymentController, start_point
from edgehub.runtime.deployment.plan import DeploymentPlan, PendingCheck, runnable
from edgehub.runtime.deployment.settings import StartSettings
from edgehub.runtime.keyseal import ensure_sealer
from edgehub.runtime.memory import ChurnCollector
from edgehub.store import Store
from edgehub.upstream.links import LinkedUpstream
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.twin_channel import TwinChannel
from protocol_heads.listeners import HeadServer, login_throttle
from protocol_heads.mqtt.carriage import MqttCarriage
from protocol_heads.mqtt.iothub import Acl
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from protocol_heads.websocket import SUBPROTOCOL_AMQP, SUBPROTOCOL_MQTT, WebSocketServer, WebSocketSettings

__all__ = ["raise_descriptor_limit", "serve"]

log = logging.getLogger(__name__)


def raise_descriptor_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one (often 1,024 against 524,288): the MQTT head sizes its
    connection cap from it. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("runtime.nofile_not_raised soft=%d hard=%d detail=%s", soft, hard, exc)
    return soft


@contextlib.asynccontextmanager
async def _admin(
    config: HubConfig,
    hub: EdgeHub,
    server: MqttServer,
    *,
    other_heads: Sequence[LiveConnections] = (),
    desired: DesiredStateService | None = None,
) -> AsyncIterator[int | None]:
    """The admin API while the hub serves (its port), unless ``config.admin_port`` is None; ``desired`` serves
    its deployment routes (the ``DeploymentController``; without one they answer 503); identities it removes or
    rotates lose their connections on ``server`` and ``other_heads``."""
    if config.admin_port is None:
        yield None
        return
    async with serve_admin(
        config.data_dir, port=config.admin_port, hub=hub, server=server, other_heads=other_heads, desired=desired
    ) as http:
        yield http.port


@dataclass(frozen=True, slots=True)
class _Host:
    """What the machine gives the hub before its store opens: the identity seal key and the TLS certificates."""

    sealer: SecretSealer
    certs: HubCerts
    ssl_context: ssl.SSLContext | None  # None: no TLS listener asked for


def _prepare_host(config: HubConfig) -> _Host:
    raise_descriptor_limit()
    tighten_data_dir(config.data_dir)  # before anything is made in it (data_dir.py)
    sealer = ensure_sealer(config.data_dir)
    certs = ensure_certs(config.data_dir / "certs", extra_names=(config.host_name,))
    tls = config.mqtts_port is not None or config.amqps_port is not None or config.wss_port is not None
    return _Host(sealer=sealer, certs=certs, ssl_context=server_ssl_context(certs) if tls else None)


async def _check_and_open(
    stack: AsyncExitStack,
    config: HubConfig,
    document: Any,
    on_checked: Callable[[DeploymentPlan], None] | None,
) -> tuple[_Host, Store, Any, DeploymentPlan]:
    """The manifest checked in a child process while the host is prepared and the store opened (see ``serve``);
    the store's close, and the end of the check, are on ``stack``. Returns the document the start runs and its
    plan: the file's, or the deployment the store kept (``start_point``, the rule of precedence)."""
    pending = await PendingCheck.start(document)
    stack.push_async_callback(pending.close)  # idempotent: ends a check the start no longer waits for
    plan: DeploymentPlan | None = None
    if not config.data_dir.exists():
        plan = await pending.answer()
        if on_checked is not None:
            on_checked(plan)
    host = _prepare_host(config)
    store = open_store(config.data_dir, profile=config.profile, verify=True)  # the TTL is the deployment's
    stack.callback(log.info, "runtime.stopped")  # said once the store is closed (the next line, run first)
    stack.push_async_callback(store.close)  # closed last, so every acknowledged message is on disk
    if plan is None:
        # A restart whose file is unchanged runs the deployment that last applied (its kept plan, or checked now),
        # and the file's check is ended; one whose file changed runs the file.
        point = start_point(store, config.manifest, document)
        if point.plan is None and point.document is not document:
            try:
                plan = await (await PendingCheck.start(point.document)).answer()
            except ManifestError as exc:  # a newer edgehub may refuse what an older one kept: the file runs
                log.warning("deployment.kept_refused source=%s errors=%s", point.source, "; ".join(exc.errors[:5]))
                point = replace(point, document=document, source="file", reason="kept one refused: the file runs")
        plan = plan or point.plan or await pending.answer()
        await pending.close()
        log.info("deployment.start_from source=%s reason=%s", point.source, point.reason)
        document = point.document
        if on_checked is not None:
            on_checked(plan)
    else:
        log.info("deployment.start_from source=file reason=first start (no data directory yet)")
    return host, store, document, plan


async def _upstream_endpoints(
    stack: AsyncExitStack,
    store: Store,
    effective: EffectiveSettings,
    links: list[dict[str, Any]] | None = None,
    data_dir: Path | None = None,
) -> tuple[list[Endpoint], TwinChannel | None]:
    """One transport per upstream lane, started (with ``links``, the manifest's ``upstream.links``: one
    ``LinkedUpstream`` per lane, ``edgehub.runtime.compose.links``); their close is on ``stack`` (the executors
    close them when the hub stops; this covers a start that fails before an executor took them)."""
    endpoints: list[Endpoint] = []
    twins: list[TwinChannel] = []

    async def close() -> None:
        for twin in twins:
            await twin.close()
        for endpoint in endpoints:
            await endpoint.close()  # idempotent

    stack.push_async_callback(close)
    transport = effective.transport
    if links:
        endpoints.extend(
            await linked_lanes(links, transport, lane_ids(store, effective.upstream), store=store, data_dir=data_dir)
        )
        first = _first_mqtt(endpoints)
        if first is not None:  # the preferred lane's first MQTT link carries the hub's own twin
            twins.append(TwinChannel())
            first.attach_twin(twins[0])
    elif isinstance(transport, UploadUpstreamSettings):
        # each lane keeps its zstd dictionary in the store, as an MQTT lane does
        endpoints.extend(
            upload_lane(transport, lane_id, keeper=store) for lane_id in lane_ids(store, effective.upstream)
        )
    elif transport is not None:
        for lane_id in lane_ids(store, effective.upstream):
            upstream = MqttUpstream(lane_settings(transport, lane_id), keeper=store)  # keeps its dictionary
            if not twins:  # the first lane's connection carries the hub's own twin
                twins.append(TwinChannel())
                upstream.attach_twin(twins[0])
            await upstream.start()
            endpoints.append(upstream)
    return endpoints, (twins[0] if twins else None)


def _first_mqtt(endpoints: list[Endpoint]) -> MqttUpstream | None:
    """The first MQTT transport among ``endpoints`` (a ``LinkedUpstream``'s links included)."""
    for endpoint in endpoints:
        inner = endpoint.transports if isinstance(endpoint, LinkedUpstream) else (endpoint,)
        for transport in inner:
            if isinstance(transport, MqttUpstream):
                return transport
    return None


async def _deployment(
    hub: EdgeHub,
    store: Store,
    config: HubConfig,
    effective: EffectiveSettings,
    checked: tuple[Any, DeploymentPlan],
    twin: TwinChannel | None,
) -> DeploymentController:
    """The controller applying the checked deployment whole to ``hub``, reporting over ``twin`` and taking the
    cloud's desired patches from it."""
    plan = checked[1]
    controller = DeploymentController(
        hub,
        StartSettings(
            executor=effective.executor,
            store_quota=store.store_quota,
            fsync=config.fsync,
            module_window=config.module_window,
            upstream=plan.settings.upstream,
        ),
    )
    await controller.start(config.manifest, checked=checked)  # or the store's if unchanged
    if twin is not None:
        controller.on_reported(twin.report)
        twin.report(controller.reported())
        twin.bind(
            functools.partial(controller.patch_desired, source="cloud"),
            put=functools.partial(controller.put_desired, source="cloud"),
            running_version=lambda: controller.running_version,
        )
    return controller


@dataclass(frozen=True, slots=True)
class _Heads:
    mqtt: MqttServer
    others: list[LiveConnections]  # the AMQP head when it serves
    ports: dict[str, int]
    limiters: list[ConnectionLimiter]  # every serving head's: the memory collector counts closes on all of them


def _carriage(config: HubConfig) -> MqttCarriage | None:
    """What ingest may refuse as undeliverable: with MQTT the only protocol modules and devices can connect
    with, a message whose MQTT topic cannot be sent; with AMQP served too, nothing (an AMQP client carries
    properties outside the topic, so no message routed to a module or a device is beyond every client)."""
    if config.amqp_port is not None or config.amqps_port is not None:
        return None
    return MqttCarriage()


async def _heads(
    stack: AsyncExitStack,
    config: HubConfig,
    hub: EdgeHub,
    host: _Host,
    controller: DeploymentController,
    effective: EffectiveSettings,
) -> _Heads:
    """The MQTT head, and the AMQP head when a port asks for it, listening; they stop first when ``stack`` closes,
    so no ack is promised after the store closes."""
    settings = MqttSettings(
        host=config.host,
        tcp_port=config.mqtt_port,
        tls_port=config.mqtts_port,
        ssl_context=host.ssl_context,
        outbound_window=MAX_WINDOW,  # the hub's mailboxes hold each link to the deployment's window, live
        acl=Acl(publish_grants=controller.publish_grants, subscribe_grants=controller.subscribe_grants),
        # Each connection reads what the deployment's largest maxMessageSizeBytes allows as it is then (read_bound).
        largest_message_size=hub.store.largest_message_size_bytes,
        **effective.head_limits,
    )
    # One login throttle for both heads: an address that failed on one protocol has no fresh budget on the other.
    logins = login_throttle(settings)
    server = await stack.enter_async_context(MqttServer(hub, settings=settings, logins=logins))
    ws_heads: dict[str, HeadServer[Any, Any]] = {SUBPROTOCOL_MQTT: server}
    heads = _Heads(mqtt=server, others=[], ports=dict(server.ports), limiters=[server.limiter])
    if config.amqp_port is not None or config.amqps_port is not None:
        # Imported only when AMQP is served: python-qpid-proton is built from source where PyPI has no wheel
        # (aarch64), and a hub started with --no-amqp runs without it.
        from protocol_heads.amqp import AmqpServer, AmqpSettings

        amqp = AmqpSettings(
            host=config.host,
            tcp_port=config.amqp_port,
            tls_port=config.amqps_port,
            ssl_context=host.ssl_context,
            outbound_window=MAX_WINDOW,
            largest_message_size=hub.store.largest_message_size_bytes,  # asked at each link's attach
            **effective.head_limits,
        )
        amqp_server = await stack.enter_async_context(AmqpServer(hub, settings=amqp, logins=logins))
        heads.ports.update(amqp_server.ports)
        heads.others.append(amqp_server)
        heads.limiters.append(amqp_server.limiter)
        ws_heads[SUBPROTOCOL_AMQP] = amqp_server
    ws = await _websockets(stack, config, hub, host, ws_heads, effective, logins)
    if ws is not None:
        heads.ports.update(ws.ports)
        heads.limiters.append(ws.limiter)
    return heads


async def _websockets(
    stack: AsyncExitStack,
    config: HubConfig,
    hub: EdgeHub,
    host: _Host,
    ws_heads: dict[str, HeadServer[Any, Any]],
    effective: EffectiveSettings,
    logins: LoginThrottle,
) -> WebSocketServer | None:
    """The WebSocket listener in front of the heads serving, when a port asks for it. The TLS port by default
    (443, ``wss_port_optional``) is served only where the hub may bind it: else it is off, said in one line."""
    tls_port = config.wss_port
    for attempt in ("as asked", "without the default TLS port"):
        if config.ws_port is None and tls_port is None:
            log.info("ws.off reason=%s", "no port asked for" if attempt == "as asked" else "443 not available")
            return None
        settings = WebSocketSettings(
            host=config.host,
            tcp_port=config.ws_port,
            tls_port=tls_port,
            ssl_context=host.ssl_context if tls_port is not None else None,
            **effective.head_limits,
        )
        try:
            return await stack.enter_async_context(
                WebSocketServer(hub, settings=settings, heads=ws_heads, logins=logins)
            )
        except OSError as exc:
            if not config.wss_port_optional or tls_port is None:
                raise
            # 443 needs root or CAP_NET_BIND_SERVICE (or a lower ip_unprivileged_port_start), and may be taken
            log.warning("ws.wss_off port=%d reason=%s detail=%s", tls_port, type(exc).__name__, exc)
            tls_port = None
    return None


async def serve(
    config: HubConfig,
    *,
    stop: asyncio.Event,
    on_certs: Callable[[HubCerts], None] | None = None,
    on_ready: Callable[[dict[str, int]], None] | None = None,
    on_hub: Callable[[EdgeHub], None] | None = None,
    on_checked: Callable[[DeploymentPlan], None] | None = None,
    document: Any = None,
) -> None:
    """Run the hub until ``stop`` is set (see the module docstring). ``on_certs``, ``on_checked`` (the manifest's
    plan), ``on_ready`` (the ports) and ``on_hub`` (the running facade, for a tool that watches its queues:
    ``bench.demo``) are called on the way up. ``document``: the manifest file's, when the caller read it.

    The manifest is checked in a child process while this one opens its store (a restart's start-up is the longer
    of the two, not their sum; one whose file is unchanged runs the plan the store kept and ends the check, see
    ``kept_plan``); on a first start (no data directory yet) the answer comes first, so a refused
    manifest leaves nothing behind. A refused manifest stops the start (``ManifestError``) with the store closed."""
    if document is None:
        document = read_manifest_file(config.manifest)
    async with AsyncExitStack() as stack:
        host, store, document, plan = await _check_and_open(stack, config, document, on_checked)
        if on_certs is not None:  # told after the plan, so a start's lines come in their order whatever came first
            on_certs(host.certs)

        effective = effective_settings(config, plan.settings)
        store.default_ttl_s = effective.default_ttl_s
        store.store_quota = store_quota(store, store_path(config.data_dir), config.limits)
        endpoints, twin = await _upstream_endpoints(
            stack, store, effective, plan.settings.upstream.get("links"), config.data_dir
        )
        hub = await stack.enter_async_context(
            EdgeHub(
                store=store,
                router=runnable(plan, StartSettings()).router,  # the controller applies the deployment whole
                host_name=config.host_name,
                endpoints=endpoints,
                upstream=effective.upstream,
                executor_settings=effective.executor,
                max_token_lifetime_s=config.limits.max_token_lifetime_s,
                twin_limits=config.limits.twin,
                sealer=host.sealer,
                carriage=_carriage(config),
            )
        )
        await seal_clear_identity_keys(hub.identities)  # before any head serves a login
        if on_hub is not None:
            on_hub(hub)
        # The cloud's device-bound messages and method calls come over the first MQTT lane (upstream.mqtt.cloud).
        cloud = _first_mqtt(endpoints)
        if cloud is not None:
            cloud.serve_cloud(hub, refusals=hub.refusals)
        controller = await _deployment(hub, store, config, effective, (document, plan), twin)

        heads = await _heads(stack, config, hub, host, controller, effective)
        admin_port = await stack.enter_async_context(
            _admin(config, hub, heads.mqtt, other_heads=heads.others, desired=controller)
        )
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        collector = tasks.create_task(ChurnCollector(*heads.limiters).run(), name="runtime.memory")
        watcher = tasks.create_task(controller.watch(config.manifest), name="runtime.deployment_watch")
        log.info("runtime.ready ports=%s admin_port=%s", heads.ports, admin_port)
        if on_ready is not None:
            on_ready(heads.ports | ({"admin": admin_port} if admin_port is not None else {}))
        await stop.wait()
        log.info("runtime.stopping")
        collector.cancel()
        watcher.cancel()
