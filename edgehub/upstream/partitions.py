"""Partitioned upstreams and duplicate detection (after Service Bus partitioned queues and its dedup window).

Partitions
----------
``partitions: N`` on the upstream endpoint (default 1) makes N lanes, each with its own connection, per-priority
queues and checkpointers; lane ``i`` is the endpoint ``$upstream/{i}`` (``edgehub.store.upstream_lane_id``;
``$upstream`` when N is 1) and is named ``upstream-p{i}`` (``upstream`` when N is 1) in segment names and
topics. The hub wires this into ingest (``edgehub.hub.lanes``). Which lane a message takes:

* its **partition key** is its ``sessionId``, else its ``partitionKey``, else its ``messageId`` when duplicate
  detection is on, else none (``partition_key``). A message whose ``sessionId`` and ``partitionKey`` are both
  set and differ is refused at ingest with ``InvalidMessageError`` (``check_partition_properties``), as Service
  Bus refuses it: a session must live in one partition.
* **with a key** it is pinned: ``stable_partition(key, N)`` (BLAKE2b of the UTF-8 key, so the same key maps to
  the same lane across restarts and machines; Python's ``hash`` is salted per process). Per-key order holds
  because one lane keeps queue order. A pinned message waits for its lane; it never moves.
* **without a key** it goes round-robin over the lanes that are up; when its lane is down it moves to the next
  lane that is up and the turn goes on after that one (``PartitionSelector.choose``), so the lanes that are up
  share evenly; when none is up it still gets a lane (round-robin over all) so it is stored and waits.

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

Duplicate detection
-------------------
Off by default. ``DuplicateDetector`` remembers ``(identity, messageId)`` for ``window_s`` seconds (default 600)
from the first acceptance; a message seen again inside the window is acknowledged to its sender and dropped
(counted in ``duplicates``), never stored twice. A message without a ``messageId`` is never a duplicate. The
window is measured on the hub's ``Clock``; memory is bounded by ``max_entries`` (the oldest are forgotten
first, which can only let a duplicate through, never drop a new message). It is bookkeeping only: looking
(``is_duplicate``) and recording (``remember``, once the message is durable) are separate steps, and the hub
keeps the window durable in the store's metadata (``edgehub.hub.dedup``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence

from edgehub.core import Clock, InvalidMessageError, Message, SystemProperty
from edgehub.upstream.mqtt_transport import UpstreamStatus

__all__ = [
    "DuplicateDetector",
    "PartitionSelector",
    "aggregate_status",
    "check_partition_properties",
    "lane_name",
    "lane_name_of",
    "partition_key",
    "stable_partition",
]


def check_partition_properties(message: Message) -> None:
    """Refuse a message whose session id and partition key disagree (``InvalidMessageError``)."""
    sp = message.system_properties
    session, pkey = sp.get(SystemProperty.SESSION_ID), sp.get(SystemProperty.PARTITION_KEY)
    if session and pkey and session != pkey:
        raise InvalidMessageError(
            f"sessionId {session!r} and partitionKey {pkey!r} differ: a session lives in one partition, "
            "so the partition key must equal the session id or be left out",
            reason="partition_key_mismatch",
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


def lane_name(partition: int, partitions: int) -> str:
    """``upstream`` for a single lane, ``upstream-p{i}`` otherwise (the lane part of segment names)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} out of range 0..{partitions - 1}")
    return lane_name_of(None if partitions == 1 else partition)


def lane_name_of(partition: int | None) -> str:
    """The lane name of a lane endpoint whose partition is known (None: the single lane, ``$upstream``)."""
    if partition is not None and partition < 0:
        raise ValueError(f"partition {partition} is negative")
    return "upstream" if partition is None else f"upstream-p{partition}"


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


class DuplicateDetector:
    """The duplicate window's bookkeeping: which ``(identity, messageId)`` pairs were accepted, and when.

    Two steps, so that a message is never marked seen before it is stored: ``is_duplicate`` only looks (and
    counts a duplicate); ``remember`` records an acceptance, and the caller calls it only once the message is
    durable. ``expire`` forgets what left the window (or was pushed out by ``max_entries``) and returns those
    pairs, so a caller that keeps the window durably can delete them too. The hub keeps it durably in the
    store's metadata (``edgehub.hub.dedup``)."""

    def __init__(self, *, clock: Clock, window_s: float = 600.0, max_entries: int = 1_000_000) -> None:
        if window_s <= 0 or max_entries <= 0:
            raise ValueError("window_s and max_entries must be positive")
        self._clock = clock
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()  # insertion order = acceptance order
        self._evicted: list[tuple[str, str]] = []
        self.duplicates = 0

    def is_duplicate(self, identity: str, message_id: str | None) -> bool:
        """True (and counted) when this identity's ``message_id`` was accepted inside the window. Records nothing.
        A message without a message id is never a duplicate."""
        if not message_id:
            return False
        at = self._seen.get((identity, message_id))
        if at is None or at <= self._clock.time() - self.window_s:
            return False
        self.duplicates += 1
        return True

    def remember(self, identity: str, message_id: str, at_s: float | None = None) -> None:
        """Record that the message was accepted (durably) at ``at_s`` (default: now)."""
        key = (identity, message_id)
        self._seen.pop(key, None)
        self._seen[key] = self._clock.time() if at_s is None else at_s
        while len(self._seen) > self.max_entries:
            self._evicted.append(self._seen.popitem(last=False)[0])

    def expire(self) -> list[tuple[str, str]]:
        """Forget the pairs accepted ``window_s`` or more ago, and those pushed out by ``max_entries`` (the
        oldest first: forgetting can only let a duplicate through, never drop a new message); return them."""
        gone, self._evicted = self._evicted, []
        horizon = self._clock.time() - self.window_s
        while self._seen:
            key, at = next(iter(self._seen.items()))
            if at > horizon:
                break
            self._seen.popitem(last=False)
            gone.append(key)
        return gone

    def __len__(self) -> int:
        return len(self._seen)


def aggregate_status(statuses: Sequence[UpstreamStatus]) -> UpstreamStatus:
    """One status for all lanes: counts and rates summed, connected when any lane is."""
    if not statuses:
        raise ValueError("no lanes")
    acked = sum(s.messages_acked for s in statuses)
    wire = sum(s.wire_bytes_acked for s in statuses)
    return UpstreamStatus(
        connected=any(s.connected for s in statuses),
        connects=sum(s.connects for s in statuses),
        inflight_bytes=sum(s.inflight_bytes for s in statuses),
        peak_inflight_bytes=max(s.peak_inflight_bytes for s in statuses),
        window_bytes=sum(s.window_bytes for s in statuses),
        achieved_bps=sum(s.achieved_bps for s in statuses),
        messages_acked=acked,
        publishes_acked=sum(s.publishes_acked for s in statuses),
        wire_bytes_acked=wire,
        wire_bytes_per_message=wire / acked if acked else 0.0,
        rtt_min_s=min((s.rtt_min_s for s in statuses if s.rtt_min_s is not None), default=None),
    )
