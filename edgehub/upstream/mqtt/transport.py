"""``MqttUpstream``: ``$upstream`` as a ``PipelinedEndpoint`` over MQTT 3.1.1 or 5, to a broker or a parent hub.
It turns the executor's batches into PUBLISHes (``wire``), keeps a window of them in flight on one ``Connection``
at a time, turns their PUBACKs into ``SendResult``s, spends the uplink budget, and reconnects (tenacity, on
``edgehub.upstream.reconnect``'s schedule). What it offers the world, the format on the wire included, is
docs/upstream.md ("Over MQTT").

Invariants:
* The PUBACK is the checkpoint: ``send`` reports a message succeeded only once the PUBACK of the PUBLISH that
  carried it came back on the connection that sent it; a lost connection or a silent link (keepalive,
  ``ack_timeout_s``) fails every unacknowledged message of the batch. Nothing is reported delivered without its ack.
* A PUBLISH is handed to the socket only while the unacknowledged wire bytes plus its own stay within
  ``window_bytes`` (one larger than the window goes alone), and while the broker's Receive Maximum has a slot.
* No PUBLISH is over the broker's Maximum Packet Size (or ``broker_max_packet_bytes``): a message that alone is
  over it is ``invalid``, never written.
* Every connection starts afresh: no PUBLISH of a previous connection is sent again behind the executor's back, so
  what is in flight is exactly what this module counts.
* Each CONNACK calls the executor's ``on_reachable`` and the loss of that connection its ``on_unreachable``;
  ``reconnect_now()`` never cuts short the backoff after a CONNACK refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from edgehub.core import Clock, FailureKind, SystemClock, TransportError
from edgehub.core.methods import CloudCommands
from edgehub.core.refusals import RateLimitedLog, RefusalLog
from edgehub.delivery.endpoint import QueuedMessage, SendResult
from edgehub.upstream.bandwidth import RateEstimator, TokenBucket
from edgehub.upstream.dictionary import DictionaryKeeper, LaneDictionary
from edgehub.upstream.mqtt.cloud import CloudMessage
from edgehub.upstream.mqtt.connection import Connection, open_connection
from edgehub.upstream.mqtt.inbound import Inbound
from edgehub.upstream.mqtt.settings import (
    MqttUpstreamSettings,
    UpstreamStatus,
    WireMode,
)
from edgehub.upstream.mqtt.wire import Unit, dictionary_unit, publish_units
from edgehub.upstream.reconnect import ConnectFailure, ReconnectSchedule, connect_failure_of
from edgehub.upstream.segment import Codec
from edgehub.upstream.twin_channel import TwinChannel

__all__ = ["MqttUpstream"]

log = logging.getLogger(__name__)


class MqttUpstream:
    """``$upstream`` over MQTT. ``await start()`` (or ``async with``) before the executor's first send."""

    def __init__(
        self,
        settings: MqttUpstreamSettings,
        *,
        clock: Clock | None = None,
        keeper: DictionaryKeeper | None = None,
        dictionary: LaneDictionary | None = None,
        side: str | None = None,
    ) -> None:
        """``keeper`` (the hub's store) keeps the lane's zstd dictionary across restarts; None: kept in memory.
        ``dictionary``: the lane's, shared with its other links (each its own ``side``, the far side it sends the
        dictionary to: ``edgehub.upstream.dictionary``); None: this transport trains its own, if its settings ask
        for one."""
        self.settings = settings
        self._clock = clock or SystemClock()
        # A broker (or a link) that drops the connection again and again, or refuses every batch, decides how
        # often these come: at most RateLimitedLog's burst a minute each, then one with how many were held back.
        self._lines = RateLimitedLog(log, clock=self._clock)
        self.dictionary: LaneDictionary | None = None
        self._side = side
        if settings.compression is Codec.ZSTD and settings.zstd_dictionary and settings.wire_mode is WireMode.BATCH:
            self.dictionary = dictionary or LaneDictionary(lane=settings.lane, keeper=keeper, clock=self._clock)
        self._dictionary_tasks: set[asyncio.Task[None]] = set()
        self._announcing: int | None = None  # the id of a dictionary on its way to the far side
        self._on_reachable: Callable[[], None] = lambda: None
        self._on_unreachable: Callable[[], None] = lambda: None
        self._conn: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._wake = asyncio.Event()  # cuts a reconnect wait short
        self._schedule = ReconnectSchedule(
            interval_s=settings.reconnect_min_s,
            refused_min_s=min(settings.reconnect_refused_min_s, settings.reconnect_max_s),
            refused_max_s=settings.reconnect_max_s,
        )
        self._refusals = 0  # CONNACK refusals in a row
        self._refused_wait = False  # the wait under way follows a refusal: reconnect_now leaves it alone
        self.connect_attempts = 0
        self._progress = asyncio.Event()  # a connect attempt began, a connection came up or was lost
        self._window_event = asyncio.Event()
        self._connected_event = asyncio.Event()
        self._bucket = TokenBucket(
            rate_bps=settings.max_uplink_bps, burst_bytes=max(settings.segment_bytes, 1500), clock=self._clock
        )
        self._rate = RateEstimator(clock=self._clock)
        self._connects = 0
        # Outages: connections lost, and the time from each loss to the next CONNACK (those that ended), for
        # /metrics; counted once per loss and per connect.
        self._offline_count = 0
        self._offline_s = 0.0
        self._offline_ended = 0
        self._lost_at_mono_s: float | None = None
        self._peak_inflight = 0
        self._oversized_dictionary: int | None = None  # the dictionary last found over the broker's packet limit
        self._messages_acked = 0
        self._publishes_acked = 0
        self._wire_acked = 0
        self.wire_bytes_sent = 0  # PUBLISH bytes handed to connections, acknowledged or not (link budgets)
        self._bytes_per_message: float | None = None
        self._rtt_samples: deque[float] = deque(maxlen=64)
        self._inbound = Inbound(settings, clock=self._clock, current=lambda: self._conn)
        self._broker_refusals = RefusalLog(log, clock=self._clock)  # the broker's bytes that are no MQTT

    def attach_twin(self, channel: TwinChannel) -> None:
        """Speak IoT Hub's twin topics on this transport's connections (``edgehub.upstream.twin_channel``)."""
        self._inbound.twin = channel

    # -- Endpoint ---------------------------------------------------------------------------------------------

    @property
    def endpoint_id(self) -> str:
        return self.settings.endpoint_id

    @property
    def max_batch_messages(self) -> int:
        """About ``max_batch_bytes`` worth of messages, learnt from the wire bytes per message of the batches
        sent so far (one message until the first batch tells), at most ``settings.max_batch_messages``."""
        if self._bytes_per_message is None:
            return 1
        fit = int(self.settings.segment_bytes / self._bytes_per_message)
        return max(1, min(self.settings.max_batch_messages, fit))

    def _learn_size(self, messages: int, wire_bytes: int) -> None:
        """Keep a moving average of wire bytes per message (weighted by the batch's size)."""
        sample = wire_bytes / messages
        if self._bytes_per_message is None:
            self._bytes_per_message = sample
        else:
            weight = min(0.5, messages / max(1, self.max_batch_messages) / 2)
            self._bytes_per_message += weight * (sample - self._bytes_per_message)

    @property
    def linger_s(self) -> float:
        return self.settings.linger_s

    @property
    def max_batch_bytes(self) -> int:
        return self.settings.segment_bytes

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._on_reachable = on_reachable

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        self._on_unreachable = on_unreachable

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._connection_loop(), name=f"upstream.mqtt.{self.settings.lane}")

    async def __aenter__(self) -> MqttUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def serve_cloud(self, commands: CloudCommands, *, refusals: RefusalLog | None = None) -> None:
        """Hand the broker's device-bound messages and method calls to ``commands`` (``cloud``), from the
        current connection (if any) on."""
        self._inbound.serve_cloud(commands, refusals)

    async def wait_cloud_ready(self) -> None:
        """Return once the current connection's subscriptions for the cloud's side are acknowledged (the broker
        delivers from then on). Bound it with ``asyncio.timeout``."""
        await self._inbound.ready.wait()

    async def close(self) -> None:
        self._closed = True
        await self._inbound.close()
        self._refused_wait = False
        self._wake.set()
        for task in list(self._dictionary_tasks):
            task.cancel()
        if self._dictionary_tasks:
            await asyncio.gather(*self._dictionary_tasks, return_exceptions=True)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.drop("closed")
            await conn.stop()

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.alive

    async def wait_connected(self) -> None:
        """Return once a connection is up. Bound it with ``asyncio.timeout``."""
        while not self.connected:
            self._connected_event.clear()
            await self._connected_event.wait()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked at each connect attempt, connect and loss. Bound it with
        ``asyncio.timeout``: meant for tests and tools that watch the connection."""
        while not condition():
            self._progress.clear()
            await self._progress.wait()

    def reconnect_now(self) -> None:
        """Cut a reconnect wait short (the executor wants to send), unless it follows a CONNACK refusal."""
        if not self._refused_wait:
            self._wake.set()

    def set_max_uplink_bps(self, rate_bps: float | None) -> None:
        self._bucket.set_rate(rate_bps)

    def status(self) -> UpstreamStatus:
        conn = self._conn
        return UpstreamStatus(
            connected=self.connected,
            connects=self._connects,
            inflight_bytes=conn.inflight_bytes if conn is not None else 0,
            peak_inflight_bytes=self._peak_inflight,
            window_bytes=self.settings.window_bytes,
            achieved_bps=self._rate.rate_bps(),
            messages_acked=self._messages_acked,
            publishes_acked=self._publishes_acked,
            wire_bytes_acked=self._wire_acked,
            wire_bytes_per_message=self._wire_acked / self._messages_acked if self._messages_acked else 0.0,
            rtt_min_s=min(self._rtt_samples, default=None),
            offline_count=self._offline_count,
            offline_s=self._offline_s,
            offline_ended=self._offline_ended,
        )

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        """Deliver ``batch`` and wait for every PUBACK (``submit``, then its result)."""
        return await (await self.submit(batch))

    @property
    def has_room(self) -> bool:
        """One more batch of ``max_batch_bytes`` fits the window (or nothing is in flight, or no connection), and the
        broker's Receive Maximum leaves room for a PUBLISH."""
        conn = self._conn
        if conn is None or not conn.alive:
            return True
        if not conn.batch_slot_free:
            return False
        inflight = conn.inflight_bytes
        return inflight == 0 or inflight + self.settings.segment_bytes <= self.settings.window_bytes

    async def submit(self, batch: Sequence[QueuedMessage]) -> asyncio.Future[SendResult]:
        """Publish ``batch`` (waiting for window room and the uplink budget as needed) and return once every
        PUBLISH of it is handed to the client; the future resolves once their PUBACKs are in (or failed)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[SendResult] = loop.create_future()
        if not batch:
            done.set_result(SendResult())
            return done
        conn = self._conn
        if conn is None or not conn.alive:
            self.reconnect_now()  # the executor wants to send: a reconnect backoff need not run its course
            done.set_result(SendResult.all_failed(batch, FailureKind.TRANSIENT, "upstream not connected"))
            return done
        ld = self.dictionary
        usable = ld.usable_at(self._side) if ld is not None else None
        texts: list[bytes] = []
        try:
            units = await self._encode(batch, (usable.dict_id, usable.data) if usable else None, texts, conn)
        except Exception as exc:  # an encoding failure is this batch's, not the link's
            log.exception("upstream.encode_failed lane=%s", self.settings.lane)
            done.set_result(SendResult(invalid=tuple(batch), failure_kind=FailureKind.INVALID_INPUT, error=repr(exc)))
            return done
        self._learn_size(len(batch), sum(u.wire_bytes for u in units))
        if ld is not None:
            for text in texts:  # the lane's sample is touched on the loop only
                ld.observe(text)
            if usable is not None:
                for u in units:
                    ld.record(u.raw_bytes, len(u.payload))
        sent: list[tuple[Unit, asyncio.Future[None]]] = []
        for unit in units:
            if not await self._wait_window(conn, unit.wire_bytes):
                break
            await self._bucket.take(unit.wire_bytes)
            if not conn.alive:
                break
            sent.append((unit, conn.publish_unit(unit)))
            self.wire_bytes_sent += unit.wire_bytes
            self._peak_inflight = max(self._peak_inflight, conn.inflight_bytes)
        if ld is not None:  # behind the batch, not ahead: the batch went plain, and a thin link sends it first
            await self._dictionary_work(ld, conn)
        return asyncio.ensure_future(self._collect(conn, units, sent))

    # -- internals --------------------------------------------------------------------------------------------

    async def _encode(
        self,
        batch: Sequence[QueuedMessage],
        dictionary: tuple[int, bytes] | None,
        texts: list[bytes],
        conn: Connection,
    ) -> list[Unit]:
        """``batch`` as PUBLISHes within ``conn``'s Maximum Packet Size; zstd (level 19 by default: tens of
        milliseconds a segment) in a worker thread, so the event loop and the heads on it never wait for it."""
        observe = texts.append if self.dictionary is not None else None
        limit = conn.max_packet_out
        encode = functools.partial(
            publish_units, self.settings, batch, dictionary=dictionary, observe=observe, max_wire_bytes=limit
        )
        if self.settings.compression is Codec.ZSTD and self.settings.wire_mode is WireMode.BATCH:
            return await asyncio.to_thread(encode)
        return encode()

    async def _dictionary_work(self, ld: LaneDictionary, conn: Connection) -> None:
        """Start training when the sample calls for it; send a dictionary this side has not acknowledged behind
        the batch (once: it becomes usable when its PUBACK is in, see ``edgehub.upstream.dictionary``)."""
        if ld.wants_training() and not self._dictionary_tasks:
            self._spawn_dictionary_task(self._train(ld), "train")
        pending = ld.pending_at(self._side)
        if pending is None or self._announcing == pending.dict_id:
            return
        unit = dictionary_unit(self.settings, pending.data, pending.dict_id)
        if not conn.fits(unit.wire_bytes):
            if self._oversized_dictionary != pending.dict_id:  # said once per dictionary
                self._oversized_dictionary = pending.dict_id
                log.warning(
                    "upstream.dictionary_too_large lane=%s dict_id=%d bytes=%d max_packet=%s: segments stay plain zstd",
                    self.settings.lane,
                    pending.dict_id,
                    unit.wire_bytes,
                    conn.max_packet_out,
                )
            return
        if not await self._wait_window(conn, unit.wire_bytes):
            return
        await self._bucket.take(unit.wire_bytes)
        if not conn.alive:
            return
        self._announcing = pending.dict_id
        acked = conn.publish_unit(unit)
        self.wire_bytes_sent += unit.wire_bytes
        log.info(
            "upstream.dictionary_sent lane=%s dict_id=%d bytes=%d",
            self.settings.lane,
            pending.dict_id,
            len(unit.payload),
        )
        self._spawn_dictionary_task(self._announced(ld, pending.dict_id, acked), "announce")

    def _spawn_dictionary_task(self, coro: Coroutine[None, None, None], what: str) -> None:
        task = asyncio.create_task(coro, name=f"upstream.dictionary.{what}.{self.settings.lane}")
        self._dictionary_tasks.add(task)
        task.add_done_callback(self._dictionary_tasks.discard)

    async def _train(self, ld: LaneDictionary) -> None:
        await ld.train()

    async def _announced(self, ld: LaneDictionary, dict_id: int, acked: asyncio.Future[None]) -> None:
        try:
            async with asyncio.timeout(self.settings.ack_timeout_s):
                await acked
        except (TimeoutError, TransportError) as exc:
            log.info("upstream.dictionary_unacked lane=%s dict_id=%d error=%r", self.settings.lane, dict_id, exc)
            return  # sent again before the next batch
        finally:
            if self._announcing == dict_id:
                self._announcing = None
        await ld.announced(dict_id, self._side)

    # -- what its connections may call (connection.Owner) ---------------------------------------------------

    def window_changed(self) -> None:
        """A PUBACK came or the connection was lost: ``submit`` stops waiting for room and looks again."""
        self._window_event.set()

    def round_trip(self, rtt_s: float) -> None:
        """A PUBLISH was acknowledged ``rtt_s`` after it was written (``status().rtt_min_s``)."""
        self._rtt_samples.append(rtt_s)

    def cloud_message(self, conn: Connection, message: CloudMessage) -> None:
        """The broker published ``message`` on ``conn``: to the twin or the cloud's side, acknowledged once handled."""
        self._inbound.received(conn, message)

    def subscribed(self, conn: Connection) -> None:
        """Every SUBACK of ``conn``'s subscriptions is in."""
        self._inbound.subscribed(conn)

    async def _wait_window(self, conn: Connection, size: int) -> bool:
        window = self.settings.window_bytes
        while conn.alive and (
            not conn.batch_slot_free or (conn.inflight_bytes > 0 and conn.inflight_bytes + size > window)
        ):
            self._window_event.clear()
            await self._window_event.wait()
        return conn.alive

    async def _collect(
        self, conn: Connection, units: list[Unit], sent: list[tuple[Unit, asyncio.Future[None]]]
    ) -> SendResult:
        succeeded: list[QueuedMessage] = []
        failed: list[QueuedMessage] = []
        invalid: list[QueuedMessage] = []
        kind: FailureKind | None = None
        error: str | None = None
        deadline = asyncio.get_running_loop().time() + self.settings.ack_timeout_s
        wire = 0
        for unit, fut in sent:
            try:
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(fut)
            except TimeoutError:
                conn.drop(f"no PUBACK within {self.settings.ack_timeout_s}s")
                kind, error = FailureKind.TIMEOUT, f"no PUBACK within {self.settings.ack_timeout_s}s"
                failed.extend(unit.messages)
                continue
            except TransportError as exc:
                if exc.kind is FailureKind.PERMANENT:
                    invalid.extend(unit.messages)
                else:
                    failed.extend(unit.messages)
                kind, error = kind or exc.kind, error or str(exc)
                continue
            succeeded.extend(unit.messages)
            wire += unit.wire_bytes
            self._rate.record(unit.wire_bytes)
            self._publishes_acked += 1
        unsent = units[len(sent) :]
        for unit in unsent:
            failed.extend(unit.messages)
        if unsent and kind is None:
            kind, error = FailureKind.TRANSIENT, f"connection lost: {conn.lost_reason}"
        self._messages_acked += len(succeeded)
        self._wire_acked += wire
        details = {"publishes": str(len(units)), "wire_bytes": str(wire)}
        if succeeded:
            details["wire_bytes_per_msg"] = f"{wire / len(succeeded):.1f}"
        if failed or invalid:
            self._lines.line(
                "send_failed",
                "upstream.send_failed",
                lane=self.settings.lane,
                acked=len(succeeded),
                failed=len(failed),
                invalid=len(invalid),
                kind=kind,
                error=error,
            )
        return SendResult(
            succeeded=tuple(succeeded),
            failed=tuple(failed),
            invalid=tuple(invalid),
            failure_kind=kind,
            error=error,
            details=details,
        )

    # -- connection -------------------------------------------------------------------------------------------

    async def _connect_once(self) -> Connection:
        return await open_connection(self, self.settings, self._broker_refusals)

    async def _backoff_sleep(self, delay_s: float) -> None:
        self._wake.clear()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await self._wake.wait()
        finally:
            self._refused_wait = False

    def _log_connect_failed(self, rs: RetryCallState) -> None:
        error = rs.outcome.exception() if rs.outcome is not None else None
        wait_s = rs.upcoming_sleep
        if self._refused_wait:
            log.warning(
                "upstream.connect_refused lane=%s attempt=%d refusals=%d retry_in_s=%.1f error=%s",
                self.settings.lane,
                rs.attempt_number,
                self._refusals,
                wait_s,
                error,
            )
            return
        # Through a hard cut an attempt fails every half second: the first and every 100th at INFO, not each.
        level = logging.INFO if rs.attempt_number % 100 == 1 else logging.DEBUG
        log.log(
            level,
            "upstream.connect_failed lane=%s attempt=%d retry_in_s=%.2f error=%s",
            self.settings.lane,
            rs.attempt_number,
            wait_s,
            error,
        )

    def _reconnect_wait(self, rs: RetryCallState) -> float:
        """The wait after a failed attempt, by how it failed (``edgehub.upstream.reconnect``)."""
        error = rs.outcome.exception() if rs.outcome is not None else None
        kind = error.kind if isinstance(error, TransportError) else FailureKind.TRANSIENT
        failure = connect_failure_of(kind)
        if failure is ConnectFailure.REFUSED:
            self._refusals += 1
            self._refused_wait = True
        return self._schedule.delay_s(failure, self._refusals)

    async def _connection_loop(self) -> None:
        s = self.settings
        while not self._closed:
            retrying = AsyncRetrying(
                wait=self._reconnect_wait,
                retry=retry_if_exception_type(TransportError),
                sleep=self._backoff_sleep,
                before_sleep=self._log_connect_failed,
                reraise=True,
            )
            conn: Connection | None = None
            async for attempt in retrying:
                with attempt:
                    self.connect_attempts += 1
                    self._progress.set()
                    conn = await self._connect_once()
            assert conn is not None
            self._refusals = 0
            self._conn = conn
            self._connects += 1
            if self._lost_at_mono_s is not None:
                self._offline_s += self._clock.monotonic() - self._lost_at_mono_s
                self._offline_ended += 1
                self._lost_at_mono_s = None
            self._inbound.subscribe(conn)
            self._connected_event.set()
            self._progress.set()
            self._lines.line(
                "connected", "upstream.connected", lane=s.lane, host=s.host, port=s.port, connects=self._connects
            )
            self._on_reachable()
            self._inbound.connected(conn)
            await conn.lost.wait()
            self._offline_count += 1
            self._lost_at_mono_s = self._clock.monotonic()
            self._inbound.lost()
            self._lines.line("lost", "upstream.lost", lane=s.lane, reason=conn.lost_reason)
            self._progress.set()
            self._on_unreachable()
            await conn.stop()
