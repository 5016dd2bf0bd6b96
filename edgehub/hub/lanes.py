"""Lane choice, an ingest stage of the hub: the partitioned upstream's N lanes, the lane of each message, whether
a lane is up, and their status (after Service Bus partitioned queues).

Lanes
-----
``partitions: N`` on the upstream endpoint (``UpstreamOptions.partitions``, default 1) makes N lanes
``$upstream/0`` … ``$upstream/{N-1}`` (``edgehub.core.endpoints.upstream_lane_id``), each its own endpoint with
its own per-priority queues, checkpointers, executor and transport connection, and named ``upstream-p{i}`` in
segment names and topics (``edgehub.core.endpoints.lane_name``). The hub rewrites a route result for
``$upstream`` to the message's lane before the store sees it (``UpstreamLanes.assign``); with one partition
nothing changes (the lane is ``$upstream`` itself, named ``upstream``).

Which lane a message takes
--------------------------
* its **partition key** is its ``sessionId``, else its ``partitionKey``, else its ``messageId`` when duplicate
  detection is on, else none (``partition_key``). A message whose ``sessionId`` and ``partitionKey`` are both
  set and differ is refused at ingest with ``InvalidMessageError`` (``check_partition_properties``), as Service
  Bus refuses it: a session must live in one partition.
* **with a key** it is pinned: ``stable_partition(key, N)`` (BLAKE2b of the UTF-8 key, so the same key maps to
  the same lane across restarts and machines; Python's ``hash`` is salted per process), up or not. Per-key order
  holds because one lane keeps queue order. A pinned message waits for its lane; it never moves.
* **without a key** it goes round-robin over the lanes that are up; when its lane is down it moves to the next
  lane that is up and the turn goes on after that one (``PartitionSelector.choose``), so the lanes that are up
  share evenly; when none is up it still gets a lane (round-robin over all) so it is stored and waits.

A lane is **up** when it has an endpoint and an executor, the endpoint does not say it is disconnected (an
endpoint with a ``connected`` property, such as ``MqttUpstream``), and none of its priority queues is in
``FAILING`` or ``DEAD`` (``EndpointExecutor.state``: the lane's last send failed and the executor waits to retry;
its endpoint's ``on_reachable`` report takes it out of that state). Until the executor has an "unreachable"
report from endpoints, a lane without a ``connected`` property is learnt to be down only by a failed send: the
keyless messages routed to it before that wait for it (they are never moved once stored).

How session id and partition key travel
---------------------------------------
* **Into the hub**: IoT Hub has no session id or partition key on device telemetry, so they are carried as
  system properties ``sessionId`` / ``partitionKey``: on MQTT 3.1.1 in the topic's property bag as ``$.sid`` and
  ``$.pk``; on MQTT 5 as user properties of those names; on AMQP as the standard ``properties.group-id``
  (Service Bus's SessionId) and the message annotation ``x-opt-partition-key`` (Service Bus / Event Hubs'
  PartitionKey).
* **Upstream**: in ``batch`` mode both stay in each record's ``system_properties`` (``sessionId``,
  ``partitionKey``) and the partition is the lane in the topic and segment name; in ``message`` mode they go
  out as ``$.sid`` / ``$.pk`` in the property bag (MQTT 5: user properties); an AMQP upstream would set
  ``group-id`` and ``x-opt-partition-key`` as above.

Duplicate detection, the other ingest stage keyed on the message id, is ``edgehub.hub.dedup``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from edgehub.core import DEFAULT_PRIORITY, InvalidMessageError, Message, RouteResult, SystemProperty
from edgehub.core.endpoints import UPSTREAM_ENDPOINT, upstream_lane_id
from edgehub.core.refusals import RefusalReason
from edgehub.delivery import Endpoint, EndpointExecutor, State
from edgehub.store import QueueId, Store
from edgehub.upstream.mqtt.settings import UpstreamStatus

__all__ = [
    "LaneStatus",
    "PartitionSelector",
    "UpstreamLanes",
    "UpstreamLanesStatus",
    "UpstreamOptions",
    "aggregate_status",
    "check_partition_properties",
    "partition_key",
    "stable_partition",
]

_DOWN_STATES = frozenset({State.FAILING, State.DEAD})


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamOptions:
    """The ``upstream`` settings of the manifest, as the hub takes them (units in the names)."""

    partitions: int = 1
    duplicate_detection: bool = False
    duplicate_window_s: float = 600.0
    max_duplicate_ids: int = 1_000_000  # the window's memory bound (oldest forgotten first)

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError("partitions must be at least 1")
        if self.duplicate_window_s <= 0 or self.max_duplicate_ids <= 0:
            raise ValueError("duplicate_window_s and max_duplicate_ids must be positive")


def check_partition_properties(message: Message) -> None:
    """Refuse a message whose session id and partition key disagree (``InvalidMessageError``)."""
    sp = message.system_properties
    session, pkey = sp.get(SystemProperty.SESSION_ID), sp.get(SystemProperty.PARTITION_KEY)
    if session and pkey and session != pkey:
        raise InvalidMessageError(
            f"sessionId {session!r} and partitionKey {pkey!r} differ: a session lives in one partition, "
            "so the partition key must equal the session id or be left out",
            reason=RefusalReason.PARTITION_KEY_MISMATCH,
        )


def partition_key(message: Message, *, duplicate_detection: bool = False) -> str | None:
    """Session id, else partition key, else message id when duplicate detection is on, else None."""
    sp = message.system_properties
    for name in (SystemProperty.SESSION_ID, SystemProperty.PARTITION_KEY):
        value = sp.get(name)
        if value:
            return value
    if duplicate_detection:
        return sp.get(SystemProperty.MESSAGE_ID) or None
    return None


def stable_partition(key: str, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``: the same on every run and machine."""
    if partitions <= 0:
        raise ValueError("partitions must be positive")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


class PartitionSelector:
    """Chooses the lane of each message. ``is_up(i)`` says whether lane i's link is up right now."""

    def __init__(self, partitions: int, *, is_up: Callable[[int], bool], duplicate_detection: bool = False) -> None:
        if partitions <= 0:
            raise ValueError("partitions must be positive")
        self.partitions = partitions
        self._is_up = is_up
        self.duplicate_detection = duplicate_detection
        self._next = 0

    def choose(self, message: Message) -> int:
        key = partition_key(message, duplicate_detection=self.duplicate_detection)
        if key is not None:
            return stable_partition(key, self.partitions)  # pinned, up or not: per-key order beats latency
        first = self._next % self.partitions
        for step in range(self.partitions):  # its round-robin lane, else (failover) the next lane that is up
            candidate = (first + step) % self.partitions
            if self._is_up(candidate):
                # Go on after the lane taken, not after the one skipped: the lanes that are up share evenly.
                self._next = candidate + 1
                return candidate
        self._next = first + 1
        return first  # nothing is up: store it on its round-robin lane; it goes when that lane returns


@dataclass(frozen=True, slots=True)
class LaneStatus:
    endpoint_id: str
    up: bool
    held_messages: int  # references the store holds for the lane (delivered ones not yet cleaned up included)
    held_bytes: int
    undelivered_messages: int  # offsets past the lane's checkpoints (expired ones not yet skipped included)
    batches_sent: int
    transport: UpstreamStatus | None  # when the lane's endpoint reports one (MqttUpstream.status())


@dataclass(frozen=True, slots=True)
class UpstreamLanesStatus:
    """All lanes summed (``transport``: ``aggregate_status`` of the lanes that report one), and each lane."""

    partitions: int
    lanes_up: int
    held_messages: int
    held_bytes: int
    undelivered_messages: int
    batches_sent: int
    duplicates_dropped: int
    duplicate_ids_held: int
    transport: UpstreamStatus | None
    lanes: tuple[LaneStatus, ...]


def aggregate_status(statuses: Sequence[UpstreamStatus]) -> UpstreamStatus:
    """One status for all lanes: counts and rates summed, connected when any lane is."""
    if not statuses:
        raise ValueError("no lanes")
    return UpstreamStatus.summed(statuses, connected=any(s.connected for s in statuses))


@runtime_checkable
class _ReportsConnected(Protocol):
    @property
    def connected(self) -> bool: ...


@runtime_checkable
class _ReportsStatus(Protocol):
    def status(self) -> UpstreamStatus: ...


class UpstreamLanes:
    """Lane ids, the lane of each message, and which lanes are up. See the module docstring."""

    def __init__(
        self,
        options: UpstreamOptions,
        *,
        store: Store,
        endpoint_of: Callable[[str], Endpoint | None],
        executor_of: Callable[[str], EndpointExecutor | None],
    ) -> None:
        self.options = options
        self.partitions = options.partitions
        self.lane_ids = tuple(upstream_lane_id(i, self.partitions) for i in range(self.partitions))
        self._store = store
        self._endpoint_of = endpoint_of
        self._executor_of = executor_of
        self._selector = PartitionSelector(
            self.partitions, is_up=self.is_up, duplicate_detection=options.duplicate_detection
        )

    def is_up(self, partition: int) -> bool:
        lane = self.lane_ids[partition]
        endpoint = self._endpoint_of(lane)
        executor = self._executor_of(lane)
        if endpoint is None or executor is None:
            return False  # nothing delivers this lane now: its messages could only wait
        if isinstance(endpoint, _ReportsConnected) and not endpoint.connected:
            return False
        return all(executor.state(p) not in _DOWN_STATES for p in range(DEFAULT_PRIORITY + 1))

    def assigner(self) -> Callable[[Message, Sequence[RouteResult]], Sequence[RouteResult]] | None:
        """``assign``, or None when it would hand every message's results back unchanged (one partition, whose
        lane is ``$upstream`` itself): asked once per group, so a hub with one lane makes no call per message."""
        return self.assign if self.partitions > 1 else None

    def assign(self, message: Message, results: Sequence[RouteResult]) -> Sequence[RouteResult]:
        """``results`` with ``$upstream`` replaced by the message's lane."""
        if not any(r.endpoint == UPSTREAM_ENDPOINT for r in results):
            return results
        lane = self.lane_ids[self._selector.choose(message)]
        return [dataclasses.replace(r, endpoint=lane) if r.endpoint == UPSTREAM_ENDPOINT else r for r in results]

    def status(self, *, duplicates_dropped: int = 0, duplicate_ids_held: int = 0) -> UpstreamLanesStatus:
        lanes = tuple(self._lane_status(i) for i in range(self.partitions))
        reported = [lane.transport for lane in lanes if lane.transport is not None]
        return UpstreamLanesStatus(
            partitions=self.partitions,
            lanes_up=sum(lane.up for lane in lanes),
            held_messages=sum(lane.held_messages for lane in lanes),
            held_bytes=sum(lane.held_bytes for lane in lanes),
            undelivered_messages=sum(lane.undelivered_messages for lane in lanes),
            batches_sent=sum(lane.batches_sent for lane in lanes),
            duplicates_dropped=duplicates_dropped,
            duplicate_ids_held=duplicate_ids_held,
            transport=aggregate_status(reported) if reported else None,
            lanes=lanes,
        )

    def _lane_status(self, partition: int) -> LaneStatus:
        lane = self.lane_ids[partition]
        held, held_bytes = self._store.usage(lane)
        undelivered = sum(
            max(0, self._store.end_offset(q) - self._store.checkpoint(q).committed - 1) for q in self._queues(lane)
        )
        endpoint = self._endpoint_of(lane)
        executor = self._executor_of(lane)
        return LaneStatus(
            endpoint_id=lane,
            up=self.is_up(partition),
            held_messages=held,
            held_bytes=held_bytes,
            undelivered_messages=undelivered,
            batches_sent=executor.sends.batches if executor is not None else 0,
            transport=endpoint.status() if isinstance(endpoint, _ReportsStatus) else None,
        )

    def _queues(self, lane: str) -> list[QueueId]:
        return self._store.queues(lane)
