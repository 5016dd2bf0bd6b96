"""Byte budgets of metered links: how many bytes each link sent in each of its current periods, what that cost, and
whether it is past any of its budgets; kept across restarts in one small file in the data directory.

A link has at most two budgets, one per period: ``day`` (every day at its ``start_hour_utc``) and ``month`` (the
first of each month at its ``start_hour_utc``), all in UTC: a satellite plan of "X MB a month, never more than Y MB
in a day". The ledger counts each period a budget names, each with its own start (a day count and a month count,
each reset at its own start); a link with no budget is still counted, over a day from midnight UTC, so its bytes
and cost show in the status. A link is **spent** when any of its budgets is.

What is counted (``wire_bytes``): the bytes the transport hands its socket for the link's messages (for MQTT the
whole PUBLISH, header included), plus an *estimate* of what TCP/IP and TLS add (52 bytes per 1,448-byte TCP
segment, 29 more per TLS record of up to 16 KiB). Not counted: CONNECT, PINGREQ, SUBSCRIBE and what the far side
sends back (PUBACKs); a metered link that bills both directions costs a little more than shown.

The file (``FILE_VERSION`` 2) holds, per link, its cost per MiB and one entry per period counted (period, start
hour, period start, bytes, mark reached, budget): enough for a stopped hub's status to show bytes, cost and budget
left with no manifest (``read_ledger_file``). A version 1 file (one count per link, its period not named) is still
read: its count is the count of each current period that began at the same moment, so a hub upgraded in the middle
of a month keeps the month's bytes.

Invariants:
* a period's count only grows; at the first use after its end it starts again at 0 (``roll``), and the 80 % and
  100 % marks of each budget are logged once per period each (``link.budget_80`` / ``link.budget_100``, naming the
  period), the mark reached kept in the file so a restart does not log it again;
* the file is written whole or not at all (a temporary file, fsync'ed, renamed over the old one, its folder
  fsync'ed), at most once a second while bytes come (``flush_due``), at once when a mark is crossed, and on close:
  a hub that stops loses nothing, one that crashes forgets at most the last second's bytes;
* a file that cannot be read (torn by hand, another version, over ``MAX_FILE_BYTES``) is logged and counted from
  zero, never a failed start: a budget is a cost guard, not a store of record.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from edgehub.core import Clock, EdgeHubError, SystemClock

__all__ = [
    "Budget",
    "BudgetLedger",
    "BudgetMark",
    "LedgerFile",
    "LedgerFileError",
    "LinkUsage",
    "Period",
    "PeriodCount",
    "SavedCount",
    "binding",
    "check_budgets",
    "cost_of",
    "describe_budgets",
    "left_of",
    "period_end",
    "period_start",
    "read_ledger_file",
    "wire_bytes",
]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
TCP_SEGMENT_BYTES = 1448  # the payload of one TCP segment on a 1,500-byte MTU with timestamps
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps 12
TLS_RECORD_BYTES = 16_384
TLS_RECORD_OVERHEAD_BYTES = 29  # TLS 1.2/1.3 AEAD: header 5, tag 16, explicit nonce or content type 8
FILE_VERSION = 2  # 1: one count per link, its period not named (still read)
FLUSH_INTERVAL_S = 1.0
MAX_LINKS_KEPT = 64  # the manifest allows 8 links; a file of a few KiB
MAX_FILE_BYTES = 64 * 1024
MAX_NAME_CHARS = 64  # a link's name read from the file (the manifest's are at most 32)
MAX_COUNT_BYTES = 2**62  # a count or budget read from the file: far past any budget (the manifest's is 2^50)
MAX_EPOCH_S = 7_258_118_400  # 2200-01-01: a period start past it is no date the ledger wrote


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


class BudgetMark(StrEnum):
    """How much of its budget a link has used this period."""

    UNDER = "under"
    WARN = "80%"
    SPENT = "100%"


@dataclass(frozen=True, slots=True)
class Budget:
    """``limit_bytes`` per ``period``, the period starting at ``start_hour_utc`` (0-23)."""

    limit_bytes: int
    period: Period
    start_hour_utc: int = 0

    def __post_init__(self) -> None:
        if self.limit_bytes <= 0:
            raise ValueError("a budget's limit_bytes must be positive")
        if not 0 <= self.start_hour_utc <= 23:
            raise ValueError("start_hour_utc must be 0-23")


def check_budgets(budgets: Iterable[Budget]) -> tuple[Budget, ...]:
    """``budgets`` day first, then month; ``ValueError`` for two of one period (a link has a day budget, a month
    budget, both or neither)."""
    out = tuple(sorted(budgets, key=lambda b: list(Period).index(b.period)))
    for a, b in itertools.pairwise(out):
        if a.period is b.period:
            raise ValueError(f"two {a.period} budgets: a link has at most one budget per period")
    return out


def describe_budgets(budgets: Sequence[Budget]) -> str:
    """``20000000 B/day from 06:00 UTC + 300000000 B/month``, or ``none``: for the start's log and lines."""
    if not budgets:
        return "none"
    return " + ".join(
        f"{b.limit_bytes} B/{b.period}" + (f" from {b.start_hour_utc:02d}:00 UTC" if b.start_hour_utc else "")
        for b in budgets
    )


def period_start(now_s: float, period: Period, start_hour_utc: int) -> float:
    """The epoch seconds the period holding ``now_s`` began."""
    now = datetime.fromtimestamp(now_s, UTC)
    if period is Period.DAY:
        start = now.replace(hour=start_hour_utc, minute=0, second=0, microsecond=0)
        if start > now:
            start -= timedelta(days=1)
        return start.timestamp()
    start = now.replace(day=1, hour=start_hour_utc, minute=0, second=0, microsecond=0)
    if start > now:  # the first of this month, before its start hour: the period began a month ago
        previous = start - timedelta(days=1)
        start = previous.replace(day=1)
    return start.timestamp()


def period_end(now_s: float, period: Period, start_hour_utc: int) -> float:
    """The epoch seconds the period holding ``now_s`` ends (the next one begins)."""
    start = datetime.fromtimestamp(period_start(now_s, period, start_hour_utc), UTC)
    if period is Period.DAY:
        return (start + timedelta(days=1)).timestamp()
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start.replace(year=year, month=month).timestamp()


def wire_bytes(payload_bytes: int, *, tls: bool) -> int:
    """``payload_bytes`` handed to a TCP socket with the estimated TCP/IP (and TLS) overhead added."""
    if payload_bytes <= 0:
        return 0
    records = math.ceil(payload_bytes / TLS_RECORD_BYTES) if tls else 0
    on_tcp = payload_bytes + records * TLS_RECORD_OVERHEAD_BYTES
    return on_tcp + math.ceil(on_tcp / TCP_SEGMENT_BYTES) * TCP_IP_HEADER_BYTES


@dataclass(slots=True)
class LinkUsage:
    """One link's count in one of its current periods."""

    period_start_s: float
    bytes: int = 0
    mark: BudgetMark = BudgetMark.UNDER


@dataclass(frozen=True, slots=True)
class PeriodCount:
    """One link's count in one period, as the status shows it. ``budget_bytes`` None: the period is counted for
    the status only (a link without a budget is counted over a day)."""

    period: Period
    start_hour_utc: int
    period_start_s: float
    period_end_s: float
    bytes: int
    cost: float  # in the unit of the link's cost per MiB
    budget_bytes: int | None
    mark: BudgetMark

    @property
    def left_bytes(self) -> int | None:
        """Bytes left in the period's budget (0 when past it); None without a budget."""
        return left_of(self.budget_bytes, self.bytes)


def left_of(budget_bytes: int | None, used_bytes: int) -> int | None:
    """Bytes left of ``budget_bytes`` once ``used_bytes`` went (0 when past it); None without a budget."""
    return None if budget_bytes is None else max(0, budget_bytes - used_bytes)


def cost_of(nbytes: int, cost_per_mib: float) -> float:
    """What ``nbytes`` cost at ``cost_per_mib``, in its unit."""
    return nbytes / MIB * cost_per_mib


@dataclass(slots=True)
class _Counter:
    """One period a link is counted over, with the budget that names it (None: counted for the status only)."""

    period: Period
    start_hour_utc: int
    budget: Budget | None
    usage: LinkUsage = field(default_factory=lambda: LinkUsage(0.0))


@dataclass(slots=True)
class _Link:
    budgets: tuple[Budget, ...]
    cost_per_mib: float
    counters: list[_Counter]


def _counters(budgets: tuple[Budget, ...]) -> list[_Counter]:
    if not budgets:
        return [_Counter(Period.DAY, 0, None)]
    return [_Counter(b.period, b.start_hour_utc, b) for b in budgets]


class BudgetLedger:
    """The byte count of every link, per period, in ``path`` (None: in memory only). ``links``: name → (its
    budgets, at most one per period, or none; cost per MiB). See the module docstring."""

    def __init__(
        self,
        path: Path | None,
        links: Mapping[str, tuple[Sequence[Budget], float]],
        *,
        clock: Clock | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.path = path
        self._clock = clock or SystemClock()
        self._flush_interval_s = flush_interval_s
        self._links: dict[str, _Link] = {}
        for name, (budgets, cost) in links.items():
            checked = check_budgets(budgets)
            self._links[name] = _Link(checked, cost, _counters(checked))
        self._dirty = False
        self._flushed_mono_s = self._clock.monotonic()
        self.writes = 0  # files written: for tests and the status
        now = self._clock.time()
        for link in self._links.values():
            for counter in link.counters:
                counter.usage = LinkUsage(period_start(now, counter.period, counter.start_hour_utc))
        self._load()

    # -- reading ------------------------------------------------------------------------------------------------

    def names(self) -> Iterable[str]:
        return self._links.keys()

    def budgets(self, name: str) -> tuple[Budget, ...]:
        """The link's budgets, day first (none: no budget)."""
        return self._links[name].budgets

    def counts(self, name: str) -> tuple[PeriodCount, ...]:
        """The link's count in each period it is counted over (day first), each rolled first."""
        link = self._links[name]
        now = self._clock.time()
        out = []
        for counter in link.counters:
            self._roll(name, counter)
            usage = counter.usage
            out.append(
                PeriodCount(
                    period=counter.period,
                    start_hour_utc=counter.start_hour_utc,
                    period_start_s=usage.period_start_s,
                    period_end_s=period_end(now, counter.period, counter.start_hour_utc),
                    bytes=usage.bytes,
                    cost=cost_of(usage.bytes, link.cost_per_mib),
                    budget_bytes=counter.budget.limit_bytes if counter.budget is not None else None,
                    mark=usage.mark,
                )
            )
        return tuple(out)

    def count(self, name: str, period: Period | None = None) -> PeriodCount:
        """The link's count in ``period``; None: in the period that binds (``binding``). ``KeyError`` for a period
        the link is not counted over."""
        counts = self.counts(name)
        if period is None:
            return binding(counts)
        for c in counts:
            if c.period is period:
                return c
        raise KeyError(f"link {name!r} is not counted per {period}")

    def used_bytes(self, name: str) -> int:
        """The bytes of the period that binds (``binding``)."""
        return self.count(name).bytes

    def left_bytes(self, name: str) -> int | None:
        """Bytes the link may still send before a budget is spent (0 when one is); None without a budget."""
        return self.count(name).left_bytes

    def spent(self, name: str) -> bool:
        """Whether the link has used the whole of any of its budgets this period (never, without one)."""
        left = self.left_bytes(name)
        return left is not None and left <= 0

    # -- counting -----------------------------------------------------------------------------------------------

    def add(self, name: str, nbytes: int) -> None:
        """Count ``nbytes`` gone on the wire over link ``name`` in each of its periods; log (once a period each)
        and write at once when that crosses 80 % or 100 % of a budget."""
        if nbytes <= 0:
            return
        crossed = False
        for counter in self._links[name].counters:
            self._roll(name, counter)
            counter.usage.bytes += nbytes
            self._dirty = True
            crossed = self._marked(name, counter) or crossed
        if crossed or self.flush_due():
            self.flush()

    def flush_due(self) -> bool:
        return self._dirty and self._clock.monotonic() - self._flushed_mono_s >= self._flush_interval_s

    def flush(self) -> None:
        """Write the counts (see the module docstring); a failed write is logged and tried again at the next."""
        if self.path is None:
            self._dirty = False
            return
        doc = {
            "version": FILE_VERSION,
            "links": {
                name: {
                    "costPerMiB": link.cost_per_mib,
                    "periods": [
                        {
                            "period": c.period.value,
                            "startHourUtc": c.start_hour_utc,
                            "periodStart": c.usage.period_start_s,
                            "bytes": c.usage.bytes,
                            "mark": c.usage.mark.value,
                            "budgetBytes": c.budget.limit_bytes if c.budget is not None else None,
                        }
                        for c in link.counters
                    ],
                }
                for name, link in self._links.items()
            },
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.warning("link.budget_write_failed path=%s error=%s", self.path, exc)
            return
        self._dirty = False
        self._flushed_mono_s = self._clock.monotonic()
        self.writes += 1

    # -- internals ----------------------------------------------------------------------------------------------

    def _marked(self, name: str, counter: _Counter) -> bool:
        """Log the mark the counter's budget just reached, if any (once a period each); whether it did."""
        budget = counter.budget
        if budget is None:
            return False
        usage = counter.usage
        mark = _mark(usage.bytes, budget.limit_bytes)
        if _rank(mark) <= _rank(usage.mark):
            return False
        usage.mark = mark
        log.warning(
            "%s link=%s period=%s used_bytes=%d budget_bytes=%d period_start=%s",
            "link.budget_100" if mark is BudgetMark.SPENT else "link.budget_80",
            name,
            budget.period,
            usage.bytes,
            budget.limit_bytes,
            datetime.fromtimestamp(usage.period_start_s, UTC).isoformat(),
        )
        return True

    def _roll(self, name: str, counter: _Counter) -> None:
        start = period_start(self._clock.time(), counter.period, counter.start_hour_utc)
        if start != counter.usage.period_start_s:
            if counter.usage.bytes:
                log.info(
                    "link.period_reset link=%s period=%s last_period_bytes=%d period_start=%s",
                    name,
                    counter.period,
                    counter.usage.bytes,
                    datetime.fromtimestamp(start, UTC).isoformat(),
                )
            counter.usage = LinkUsage(start)
            self._dirty = True

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            saved = read_ledger_file(self.path)
        except LedgerFileError as exc:
            log.warning("link.budget_unreadable path=%s error=%s counting_from=0", self.path, exc.reason)
            return
        for name, entries in saved.links.items():
            link = self._links.get(name)
            if link is None:
                continue
            for counter in link.counters:
                # A count of an earlier period (the hub was down across the period's start) is not this period's.
                # A version 1 count names no period: it is the count of each period that began when it did.
                for entry in entries:
                    if entry.period not in (None, counter.period):
                        continue
                    if entry.period_start_s == counter.usage.period_start_s:
                        counter.usage = LinkUsage(entry.period_start_s, entry.bytes, entry.mark)
                        break


# -- the file, read on its own (a stopped hub's status) ----------------------------------------------------------


class LedgerFileError(EdgeHubError):
    """The budget file cannot be read; ``reason`` says why in one line."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SavedCount:
    """One period's count as the file holds it. ``period`` None: a version 1 count (its period not named)."""

    period: Period | None
    start_hour_utc: int | None
    period_start_s: float
    bytes: int
    mark: BudgetMark
    budget_bytes: int | None


@dataclass(frozen=True, slots=True)
class LedgerFile:
    """What ``DATA_DIR/links/budget.json`` holds: per link, its counts and cost per MiB (None in version 1)."""

    version: int
    links: Mapping[str, tuple[SavedCount, ...]]
    cost_per_mib: Mapping[str, float | None]


def read_ledger_file(path: Path) -> LedgerFile:
    """The budget file at ``path``, read bounded (``MAX_FILE_BYTES``, ``MAX_LINKS_KEPT``); ``LedgerFileError``
    with a one-line reason when it is missing, too large, torn, or of another version."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise LedgerFileError(path, "no such file") from None
    except OSError as exc:
        raise LedgerFileError(path, exc.strerror or str(exc)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise LedgerFileError(path, f"over {MAX_FILE_BYTES} bytes: not a ledger of at most {MAX_LINKS_KEPT} links")
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        version = doc.get("version")
        if version not in (1, FILE_VERSION):
            raise ValueError(f"version {version!r}, not 1 or {FILE_VERSION}")
        links = doc["links"]
        if not isinstance(links, dict) or len(links) > MAX_LINKS_KEPT:
            raise ValueError(f"links: not an object of at most {MAX_LINKS_KEPT} links")
        counts: dict[str, tuple[SavedCount, ...]] = {}
        costs: dict[str, float | None] = {}
        for name, v in links.items():
            if not (1 <= len(name) <= MAX_NAME_CHARS and name.isprintable()):
                # the ledger writes the manifest's names (32 letters, digits, '-' or '_' at most): one that is not
                # such a name was written by hand, and would go into the status's lines as it is
                raise ValueError(f"link name {_short(repr(name))}: not 1-{MAX_NAME_CHARS} printable characters")
            if version == 1:
                counts[str(name)] = (_saved(v, period=None),)
                costs[str(name)] = None
                continue
            periods = v["periods"]
            if not isinstance(periods, list) or not 1 <= len(periods) <= len(Period):
                raise ValueError(f"link {_short(repr(name))}: periods must be a list of 1 to {len(Period)}")
            counts[str(name)] = tuple(_saved(e, period=Period(e["period"])) for e in periods)
            cost = v["costPerMiB"]
            if isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < math.inf:
                raise ValueError(f"link {_short(repr(name))}: costPerMiB {_short(repr(cost))}")
            costs[str(name)] = float(cost)
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:  # JSONDecodeError: a ValueError
        raise LedgerFileError(path, f"{type(exc).__name__}: {_short(str(exc), 200)}") from None
    return LedgerFile(version=int(version), links=counts, cost_per_mib=costs)


def _saved(v: Any, *, period: Period | None) -> SavedCount:
    if not isinstance(v, dict):
        raise ValueError(f"a count must be an object, not {type(v).__name__}")
    budget = v.get("budgetBytes") if period is not None else None
    return SavedCount(
        period=period,
        start_hour_utc=_whole(v, "startHourUtc", 0, 23) if period is not None else None,
        period_start_s=_epoch_s(v["periodStart"]),
        bytes=_whole(v, "bytes", 0, MAX_COUNT_BYTES),
        mark=BudgetMark(v["mark"]),
        budget_bytes=_whole(v, "budgetBytes", 1, MAX_COUNT_BYTES) if budget is not None else None,
    )


def _whole(v: dict[str, Any], key: str, low: int, high: int) -> int:
    """``v[key]``, a JSON integer within ``low``-``high`` (not a float, not a boolean)."""
    value = v[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} {_short(repr(value))}: not a whole number in {low}-{high}")
    return value


def _short(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters: what a file holds, quoted in a one-line reason, stays short."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _epoch_s(value: Any) -> float:
    """A period's start: epoch seconds a date can be made of (1970 to 2200)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_EPOCH_S:
        raise ValueError(f"periodStart {_short(repr(value))}: not epoch seconds in 0-{MAX_EPOCH_S}")
    return float(value)


def binding(counts: Sequence[PeriodCount]) -> PeriodCount:
    """The count that binds the link: of its budgets, the one with the fewest bytes left (the shorter period on a
    tie); without a budget, its only count. The status's single figures (bytes, cost, budget left) are this one's."""
    budgeted = [c for c in counts if c.left_bytes is not None]
    if not budgeted:
        return counts[0]
    return min(budgeted, key=lambda c: (c.left_bytes, list(Period).index(c.period)))


def _mark(used: int, limit: int) -> BudgetMark:
    if used >= limit:
        return BudgetMark.SPENT
    if used * 5 >= limit * 4:
        return BudgetMark.WARN
    return BudgetMark.UNDER


def _rank(mark: BudgetMark) -> int:
    return {BudgetMark.UNDER: 0, BudgetMark.WARN: 1, BudgetMark.SPENT: 2}[mark]
