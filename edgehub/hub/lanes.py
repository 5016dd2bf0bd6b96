"""The partitioned upstream as the hub runs it: N lanes, the lane of each message, whether a lane is up, status.

With ``UpstreamOptions.partitions`` N > 1, ``$upstream`` is N lanes ``$upstream/0`` … ``$upstream/{N-1}``
(``edgehub.core.endpoints.upstream_lane_id``), each its own endpoint with its own per-priority queues, checkpointers,
executor and transport connection. The hub rewrites a route result for ``$upstream`` to the message's lane
before the store sees it; with one partition nothing changes (the lane is ``$upstream`` itself).

Which lane (``edgehub.upstream.partitions.PartitionSelector``): a message with a key (session id, else
partition key, else message id when duplicate detection is on) is pinned to ``stable_partition(key, N)``, up or
not, so per-key order holds; a keyless one goes round-robin over the lanes that are up and skips a lane that is
down (when none is up it still gets its round-robin lane, is stored, and waits).

A lane is **up** when it has an endpoint and an executor, the endpoint does not say it is disconnected (an
endpoint with a ``connected`` property, such as ``MqttUpstream``), and none of its priority queues is in
``FAILING`` or ``DEAD`` (``EndpointExecutor.state``: the lane's last send failed and the executor waits to retry;
its endpoint's ``on_reachable`` report takes it out of that state). Until the executor has an "unreachable"
report from endpoints, a lane without a ``connected`` property is learnt to be down only by a failed send: the
keyless messages routed to it before that wait for it (they are never moved once stored).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from edgehub.core import DEFAULT_PRIORITY, Message, RouteResult
from edgehub.core.endpoints import UPSTREAM_ENDPOINT, upstream_lane_id
from edgehub.delivery import Endpoint, EndpointExecutor, State
from edgehub.store import QueueId, Store
from edgehub.upstream.mqtt_transport import UpstreamStatus
from edgehub.upstream.partitions import PartitionSelector, aggregate_status

__all__ = ["LaneStatus", "UpstreamLanes", "UpstreamLanesStatus", "UpstreamOptions"]

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

    def assign(self, message: Message, results: Sequence[RouteResult]) -> Sequence[RouteResult]:
        """``results`` with ``$upstream`` replaced by the message's lane (unchanged with one partition)."""
        if self.partitions == 1 or not any(r.endpoint == UPSTREAM_ENDPOINT for r in results):
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
            batches_sent=executor.batches_sent if executor is not None else 0,
            transport=endpoint.status() if isinstance(endpoint, _ReportsStatus) else None,
        )

    def _queues(self, lane: str) -> list[QueueId]:
        return self._store.queues(lane)
