"""Trained zstd dictionaries for the upstream: one per lane, trained from the messages the lane sends.

Small segments of similar JSON compress far better with a dictionary trained on that traffic (zstd's dictionary
builder, ``zstandard.train_dictionary``): on the 200-byte telemetry of ``bench.uplink`` a 2.4 KB segment drops
by about a third against plain zstd. A ``LaneDictionary`` keeps the lane's sample and its dictionary:

* **Bounded sample.** ``observe`` keeps JSON lines of the lane's records (what the segments compress) in a ring
  of at most ``sample_lines`` lines and ``sample_bytes`` bytes: up to ``lines_per_batch`` lines of each batch
  until the first dictionary is trained, then ``refresh_lines_per_batch``, so the ring follows the traffic.
* **Bounded time.** Training starts once the ring holds ``min_lines`` lines, runs in a worker thread on at most
  that bounded sample (about 0.1 s for 1,000 lines and a 4 KiB dictionary), and a result that comes later than
  ``train_timeout_s`` is dropped; a failed training leaves the lane on plain zstd.
* **Retrained when the ratio drifts.** The compressed/raw ratio of the segments sent with the dictionary is
  followed (a moving average); the first ``baseline_segments`` of them set its baseline, and once the average is
  ``drift`` times worse than that, a new dictionary is trained from the ring (at most once per
  ``min_retrain_interval_s``).
* **Kept in the store.** The dictionary and whether the cloud has it are stored under
  ``upstream/zdict/{lane}`` through a ``DictionaryKeeper`` (the hub's ``Store``: its metadata), so a restart uses
  the same one and does not send it again.
* **Named by id, sent once per far side, used after.** A new dictionary is ``pending`` until the transport has
  delivered it (its own PUBLISH, acknowledged; or landed) and called ``announced``; only then is it ``usable``,
  so no segment that needs it leaves before it. Until then, and whenever there is none, segments go as plain
  zstd. A lane with several links (``edgehub.upstream.links``) has **one** dictionary, trained on the lane's
  traffic whichever link carried it, and each link is a far side of its own (``side``, the link's name): a link
  sends the dictionary once, at its first segment that would use it, and uses it from its acknowledgement on.
  So a metered link whose own traffic is a few alarms (too few to train on) still compresses them with what the
  lane learnt, for the price of one dictionary. The first side (``None``) keeps its state in the dictionary's
  own record, as a lane with one upstream always did; each other side's is the id it acknowledged, under
  ``upstream/zdict/{lane}/sent@{side}``.

Invariants: ``usable_at(side)`` is a dictionary that side was sent (acknowledged); the sample never holds more
than its bounds; one training at a time; nothing here runs per message except the sampling of a few lines per
batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from edgehub.core import Clock, SystemClock
from edgehub.upstream.segment import dictionary_id

__all__ = ["DictionaryKeeper", "LaneDictionary", "TrainedDictionary", "train_dictionary"]

log = logging.getLogger(__name__)

_KEY = "upstream/zdict/{lane}"
_SIDE_KEY = "upstream/zdict/{lane}/sent@{side}"  # a side's acknowledged id, in decimal
_ANNOUNCED, _PENDING = b"A", b"P"  # the stored value's first byte; the dictionary follows


class DictionaryKeeper(Protocol):
    """Where a lane's dictionary is kept across restarts (``edgehub.store.Store`` has these two)."""

    def get_metadata(self, key: str) -> bytes | None: ...

    async def put_metadata(self, key: str, value: bytes | None) -> None: ...


@dataclass(frozen=True, slots=True)
class TrainedDictionary:
    """A zstd dictionary (its bytes, in the zstd dictionary format) and whether the far side has it."""

    data: bytes
    dict_id: int
    announced: bool = False


def train_dictionary(lines: Sequence[bytes], dict_bytes: int) -> TrainedDictionary:
    """A dictionary of about ``dict_bytes`` trained on ``lines`` (``ValueError`` when zstd cannot build one)."""
    zstandard: Any = _zstandard()
    try:
        zdict = zstandard.train_dictionary(dict_bytes, list(lines))
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd could not train a dictionary: {exc}") from exc
    data: bytes = zdict.as_bytes()
    dict_id = dictionary_id(data)
    if not dict_id:
        raise ValueError("zstd trained a dictionary without an id")
    return TrainedDictionary(data=data, dict_id=dict_id)


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError as exc:
        raise ValueError("zstd dictionaries need the zstandard package") from exc
    return zstandard


class LaneDictionary:
    """One lane's sample, training and dictionary (see the module docstring). Used on the asyncio loop only."""

    def __init__(
        self,
        *,
        lane: str,
        keeper: DictionaryKeeper | None = None,
        clock: Clock | None = None,
        dict_bytes: int = 4096,
        sample_lines: int = 1000,
        sample_bytes: int = 1 << 20,
        min_lines: int = 100,
        lines_per_batch: int = 32,
        refresh_lines_per_batch: int = 2,
        train_timeout_s: float = 10.0,
        baseline_segments: int = 20,
        drift: float = 1.25,
        min_retrain_interval_s: float = 600.0,
    ) -> None:
        if not 0 < min_lines <= sample_lines or sample_bytes <= 0 or dict_bytes < 256:
            raise ValueError("need 0 < min_lines <= sample_lines, sample_bytes > 0 and dict_bytes >= 256")
        if drift <= 1.0 or baseline_segments <= 0 or train_timeout_s <= 0:
            raise ValueError("drift must be > 1, baseline_segments and train_timeout_s positive")
        self.lane = lane
        self._keeper = keeper
        self._clock = clock or SystemClock()
        self.dict_bytes = dict_bytes
        self.sample_bytes = sample_bytes
        self.min_lines = min_lines
        self.lines_per_batch = lines_per_batch
        self.refresh_lines_per_batch = refresh_lines_per_batch
        self.train_timeout_s = train_timeout_s
        self.baseline_segments = baseline_segments
        self.drift = drift
        self.min_retrain_interval_s = min_retrain_interval_s
        self._ring: deque[bytes] = deque(maxlen=sample_lines)
        self._ring_bytes = 0
        self._current: TrainedDictionary | None = None
        self._trained_at_mono_s: float | None = None
        self._segments = 0  # sent with the current dictionary
        self._baseline: float | None = None
        self._ratio: float | None = None
        self._drifted = False
        self._training = False
        self._sides: dict[str, int] = {}  # side -> the dictionary id it acknowledged (the first side: in _current)
        self.trainings = 0
        self._load()

    # -- state --------------------------------------------------------------------------------------------------

    @property
    def current(self) -> TrainedDictionary | None:
        return self._current

    @property
    def usable(self) -> TrainedDictionary | None:
        """The dictionary the first side's segments may use: one it has."""
        return self.usable_at(None)

    @property
    def pending(self) -> TrainedDictionary | None:
        """A dictionary trained but not yet delivered to the first side: its transport sends it next."""
        return self.pending_at(None)

    def _has(self, side: str | None, cur: TrainedDictionary) -> bool:
        if side is None:
            return cur.announced
        if side not in self._sides:
            self._sides[side] = self._load_side(side)
        return self._sides[side] == cur.dict_id

    def usable_at(self, side: str | None) -> TrainedDictionary | None:
        """The dictionary ``side``'s segments may use: the current one, once ``side`` acknowledged it."""
        cur = self._current
        return cur if cur is not None and self._has(side, cur) else None

    def pending_at(self, side: str | None) -> TrainedDictionary | None:
        """The current dictionary while ``side`` has not acknowledged it: its transport sends it next."""
        cur = self._current
        return cur if cur is not None and not self._has(side, cur) else None

    @property
    def sample_size(self) -> int:
        """Lines held in the sample."""
        return len(self._ring)

    @property
    def sample_bytes_held(self) -> int:
        return self._ring_bytes

    def _key(self) -> str:
        return _KEY.format(lane=self.lane)

    def _load_side(self, side: str) -> int:
        raw = self._keeper.get_metadata(_SIDE_KEY.format(lane=self.lane, side=side)) if self._keeper else None
        return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 10 else 0

    def _load(self) -> None:
        if self._keeper is None:
            return
        raw = self._keeper.get_metadata(self._key())
        if not raw or raw[:1] not in (_ANNOUNCED, _PENDING):
            return
        data = raw[1:]
        dict_id = dictionary_id(data)
        if not dict_id:
            log.warning("upstream.dictionary_unreadable lane=%s bytes=%d", self.lane, len(raw))
            return
        self._current = TrainedDictionary(data=data, dict_id=dict_id, announced=raw[:1] == _ANNOUNCED)
        log.info(
            "upstream.dictionary_loaded lane=%s dict_id=%d announced=%s", self.lane, dict_id, raw[:1] == _ANNOUNCED
        )

    async def _keep(self) -> None:
        cur = self._current
        if self._keeper is None or cur is None:
            return
        await self._keeper.put_metadata(self._key(), (_ANNOUNCED if cur.announced else _PENDING) + cur.data)

    # -- sampling and drift --------------------------------------------------------------------------------------

    def observe(self, text: bytes) -> None:
        """Sample a few lines of one segment's uncompressed text (``segment_text``)."""
        want = self.lines_per_batch if self._current is None else self.refresh_lines_per_batch
        if want <= 0 or not text:
            return
        lines = text.split(b"\n")
        step = max(1, len(lines) // want)
        for line in lines[::step][:want]:
            if not line:
                continue
            if len(self._ring) == self._ring.maxlen:
                self._ring_bytes -= len(self._ring[0])
            self._ring.append(line)
            self._ring_bytes += len(line)
            while self._ring_bytes > self.sample_bytes and self._ring:
                self._ring_bytes -= len(self._ring.popleft())

    def record(self, raw_bytes: int, compressed_bytes: int) -> None:
        """One segment sent with the usable dictionary: follow its ratio, and notice drift."""
        if raw_bytes <= 0 or self._current is None:
            return
        ratio = compressed_bytes / raw_bytes
        self._segments += 1
        self._ratio = ratio if self._ratio is None else self._ratio + 0.05 * (ratio - self._ratio)
        if self._segments == self.baseline_segments:
            self._baseline = self._ratio
        elif self._baseline is not None and not self._drifted and self._ratio > self._baseline * self.drift:
            self._drifted = True
            log.info(
                "upstream.dictionary_drift lane=%s dict_id=%d ratio=%.3f baseline=%.3f",
                self.lane,
                self._current.dict_id,
                self._ratio,
                self._baseline,
            )

    def wants_training(self) -> bool:
        if self._training or len(self._ring) < self.min_lines:
            return False
        if self._current is None:
            return True
        if not self._drifted or self._trained_at_mono_s is None:
            return False
        return self._clock.monotonic() - self._trained_at_mono_s >= self.min_retrain_interval_s

    # -- training ---------------------------------------------------------------------------------------------

    async def train(self) -> TrainedDictionary | None:
        """Train from the sample now (in a worker thread, within ``train_timeout_s``); the new dictionary becomes
        ``pending`` and is kept. None (and the lane stays as it was) when training failed or took too long."""
        if self._training:  # another link of the lane is training it now
            return None
        lines = list(self._ring)
        self._trained_at_mono_s = self._clock.monotonic()  # a failure also waits its turn before the next try
        self._drifted = False
        self._training = True
        try:
            async with asyncio.timeout(self.train_timeout_s):
                trained = await asyncio.to_thread(train_dictionary, lines, self.dict_bytes)
        except (TimeoutError, ValueError) as exc:
            log.warning("upstream.dictionary_training_failed lane=%s lines=%d error=%s", self.lane, len(lines), exc)
            return None
        finally:
            self._training = False
        self.trainings += 1
        self._current = trained
        self._segments, self._baseline, self._ratio = 0, None, None
        log.info(
            "upstream.dictionary_trained lane=%s dict_id=%d bytes=%d lines=%d",
            self.lane,
            trained.dict_id,
            len(trained.data),
            len(lines),
        )
        await self._keep()
        return trained

    async def announced(self, dict_id: int, side: str | None = None) -> None:
        """``side`` acknowledged dictionary ``dict_id``: its segments may use it from now on."""
        cur = self._current
        if cur is None or cur.dict_id != dict_id or self._has(side, cur):
            return
        log.info("upstream.dictionary_announced lane=%s dict_id=%d side=%s", self.lane, dict_id, side or "-")
        if side is None:
            self._current = replace(cur, announced=True)
            await self._keep()
            return
        self._sides[side] = dict_id
        if self._keeper is not None:
            await self._keeper.put_metadata(_SIDE_KEY.format(lane=self.lane, side=side), str(dict_id).encode())
