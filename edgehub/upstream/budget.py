"""Byte budgets of metered links: how many bytes each link sent in its current period, what that cost, and whether
it is past its budget; kept across restarts in one small file in the data directory.

Periods are UTC: a ``day`` period starts every day at ``start_hour_utc``, a ``month`` period on the first of each
month at that hour. A link with no budget is still counted, over a day from midnight UTC, so its bytes and cost
show in the status.

What is counted (``wire_bytes``): the bytes the transport hands its socket for the link's messages (for MQTT the
whole PUBLISH, header included), plus an *estimate* of what TCP/IP and TLS add (52 bytes per 1,448-byte TCP
segment, 29 more per TLS record of up to 16 KiB). Not counted: CONNECT, PINGREQ, SUBSCRIBE and what the far side
sends back (PUBACKs); a metered link that bills both directions costs a little more than shown.

Invariants:
* a period's count only grows; at the first use after its end it starts again at 0 (``roll``), and the 80 % and
  100 % marks are logged once per period each (``link.budget_80`` / ``link.budget_100``), the mark reached kept in
  the file so a restart does not log it again;
* the file is written whole or not at all (a temporary file, fsync'ed, renamed over the old one, its folder
  fsync'ed), at most once a second while bytes come (``flush_due``), at once when a mark is crossed, and on close:
  a hub that stops loses nothing, one that crashes forgets at most the last second's bytes;
* a file that cannot be read (torn by hand, another version) is logged and counted from zero, never a failed
  start: a budget is a cost guard, not a store of record.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from edgehub.core import Clock, SystemClock

__all__ = [
    "Budget",
    "BudgetLedger",
    "BudgetMark",
    "LinkUsage",
    "Period",
    "period_start",
    "wire_bytes",
]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
TCP_SEGMENT_BYTES = 1448  # the payload of one TCP segment on a 1,500-byte MTU with timestamps
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps 12
TLS_RECORD_BYTES = 16_384
TLS_RECORD_OVERHEAD_BYTES = 29  # TLS 1.2/1.3 AEAD: header 5, tag 16, explicit nonce or content type 8
FILE_VERSION = 1
FLUSH_INTERVAL_S = 1.0
MAX_LINKS_KEPT = 64  # the manifest allows 8 links; a file of a few KiB
MAX_FILE_BYTES = 64 * 1024


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


def wire_bytes(payload_bytes: int, *, tls: bool) -> int:
    """``payload_bytes`` handed to a TCP socket with the estimated TCP/IP (and TLS) overhead added."""
    if payload_bytes <= 0:
        return 0
    records = math.ceil(payload_bytes / TLS_RECORD_BYTES) if tls else 0
    on_tcp = payload_bytes + records * TLS_RECORD_OVERHEAD_BYTES
    return on_tcp + math.ceil(on_tcp / TCP_SEGMENT_BYTES) * TCP_IP_HEADER_BYTES


@dataclass(slots=True)
class LinkUsage:
    """One link's count in its current period."""

    period_start_s: float
    bytes: int = 0
    mark: BudgetMark = BudgetMark.UNDER


@dataclass(slots=True)
class _Link:
    budget: Budget | None
    cost_per_mib: float
    usage: LinkUsage = field(default_factory=lambda: LinkUsage(0.0))


class BudgetLedger:
    """The byte count of every link, per period, in ``path`` (None: in memory only). ``links``: name → (budget or
    None, cost per MiB). See the module docstring."""

    def __init__(
        self,
        path: Path | None,
        links: Mapping[str, tuple[Budget | None, float]],
        *,
        clock: Clock | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.path = path
        self._clock = clock or SystemClock()
        self._flush_interval_s = flush_interval_s
        self._links = {name: _Link(budget, cost) for name, (budget, cost) in links.items()}
        self._dirty = False
        self._flushed_mono_s = self._clock.monotonic()
        self.writes = 0  # files written: for tests and the status
        now = self._clock.time()
        for link in self._links.values():
            link.usage = LinkUsage(self._start_of(link, now))
        self._load()

    # -- reading ------------------------------------------------------------------------------------------------

    def names(self) -> Iterable[str]:
        return self._links.keys()

    def budget(self, name: str) -> Budget | None:
        return self._links[name].budget

    def usage(self, name: str) -> LinkUsage:
        """The link's count, its period rolled first."""
        link = self._links[name]
        self._roll(name, link)
        return link.usage

    def used_bytes(self, name: str) -> int:
        return self.usage(name).bytes

    def cost(self, name: str) -> float:
        """What this period's bytes cost, in the unit of the link's cost per MiB."""
        return self.usage(name).bytes / MIB * self._links[name].cost_per_mib

    def left_bytes(self, name: str) -> int | None:
        """Bytes left in the period's budget (0 when past it); None without a budget."""
        budget = self._links[name].budget
        if budget is None:
            return None
        return max(0, budget.limit_bytes - self.usage(name).bytes)

    def spent(self, name: str) -> bool:
        """Whether the link has used its whole budget this period (never, without one)."""
        left = self.left_bytes(name)
        return left is not None and left <= 0

    def period_ends_s(self, name: str) -> float | None:
        """Epoch seconds the link's current period ends."""
        link = self._links[name]
        usage = self.usage(name)
        period = link.budget.period if link.budget is not None else Period.DAY
        hour = link.budget.start_hour_utc if link.budget is not None else 0
        # The next start: a moment past the longest period from this one's start, rounded down to its start.
        probe = usage.period_start_s + (32 * 86_400 if period is Period.MONTH else 86_400) + 3_600
        nxt = period_start(probe, period, hour)
        return nxt if nxt > usage.period_start_s else None

    # -- counting -----------------------------------------------------------------------------------------------

    def add(self, name: str, nbytes: int) -> None:
        """Count ``nbytes`` gone on the wire over link ``name``; log (once a period) and write at once when that
        crosses 80 % or 100 % of its budget."""
        if nbytes <= 0:
            return
        link = self._links[name]
        self._roll(name, link)
        link.usage.bytes += nbytes
        self._dirty = True
        budget = link.budget
        if budget is not None:
            mark = _mark(link.usage.bytes, budget.limit_bytes)
            if _rank(mark) > _rank(link.usage.mark):
                link.usage.mark = mark
                event = "link.budget_100" if mark is BudgetMark.SPENT else "link.budget_80"
                log.warning(
                    "%s link=%s used_bytes=%d budget_bytes=%d period=%s period_start=%s",
                    event,
                    name,
                    link.usage.bytes,
                    budget.limit_bytes,
                    budget.period,
                    datetime.fromtimestamp(link.usage.period_start_s, UTC).isoformat(),
                )
                self.flush()
                return
        if self.flush_due():
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
                name: {"periodStart": link.usage.period_start_s, "bytes": link.usage.bytes, "mark": link.usage.mark}
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

    def _start_of(self, link: _Link, now_s: float) -> float:
        if link.budget is None:
            return period_start(now_s, Period.DAY, 0)
        return period_start(now_s, link.budget.period, link.budget.start_hour_utc)

    def _roll(self, name: str, link: _Link) -> None:
        start = self._start_of(link, self._clock.time())
        if start != link.usage.period_start_s:
            if link.usage.bytes:
                log.info(
                    "link.period_reset link=%s last_period_bytes=%d period_start=%s",
                    name,
                    link.usage.bytes,
                    datetime.fromtimestamp(start, UTC).isoformat(),
                )
            link.usage = LinkUsage(start)
            self._dirty = True

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
            if len(raw) > MAX_FILE_BYTES:
                raise ValueError(f"over {MAX_FILE_BYTES} bytes: not a ledger of at most {MAX_LINKS_KEPT} links")
            doc = json.loads(raw)
            if doc.get("version") != FILE_VERSION:
                raise ValueError(f"version {doc.get('version')!r}, not {FILE_VERSION}")
            saved = {
                str(name): LinkUsage(float(v["periodStart"]), int(v["bytes"]), BudgetMark(v["mark"]))
                for name, v in doc["links"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("link.budget_unreadable path=%s error=%s counting_from=0", self.path, exc)
            return
        for name, usage in saved.items():
            link = self._links.get(name)
            # A count of an earlier period (the hub was down across the period's start) is not this period's.
            if link is not None and usage.period_start_s == link.usage.period_start_s and usage.bytes >= 0:
                link.usage = usage


def _mark(used: int, limit: int) -> BudgetMark:
    if used >= limit:
        return BudgetMark.SPENT
    if used * 5 >= limit * 4:
        return BudgetMark.WARN
    return BudgetMark.UNDER


def _rank(mark: BudgetMark) -> int:
    return {BudgetMark.UNDER: 0, BudgetMark.WARN: 1, BudgetMark.SPENT: 2}[mark]
