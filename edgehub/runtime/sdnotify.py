"""systemd's notify protocol (``sd_notify``): readiness, the watchdog and stopping, in a few lines of our own.

Under ``Type=notify`` systemd sets ``NOTIFY_SOCKET`` (a unix datagram socket: a path, or ``@name`` in the
abstract namespace) and waits for ``READY=1`` before it counts the service started; with ``WatchdogSec=`` it also
sets ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``) and restarts the service when no ``WATCHDOG=1`` comes for that long;
``STOPPING=1`` says a stop has begun. ``edgehub run`` sends ``READY=1`` once it listens, ``WATCHDOG=1`` every half
watchdog period from a task on its event loop (so a stuck loop stops the pings and systemd restarts the hub), and
``STOPPING=1`` when SIGTERM or SIGINT arrives. No dependency: the protocol is one datagram per state.

Invariants: without ``NOTIFY_SOCKET`` every call does nothing; a failed send is logged once at WARNING and never
raises (the hub serves whether or not systemd listens); the watchdog only runs when ``WATCHDOG_PID`` is unset or
names this process (systemd's rule, so that a child never pings for its parent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping

__all__ = ["SystemdNotifier"]

log = logging.getLogger(__name__)

# A watchdog period shorter than this is a misconfiguration; pinging faster than every 50 ms would cost CPU.
_MIN_WATCHDOG_S = 0.1


class SystemdNotifier:
    """Sends notify states to ``address`` (None: not under systemd's notify protocol, every call a no-op)."""

    def __init__(self, address: str | None, *, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s
        self._warned = False

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> SystemdNotifier:
        """The notifier systemd's environment describes (``NOTIFY_SOCKET``, ``WATCHDOG_USEC``, ``WATCHDOG_PID``)."""
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET") or None
        watchdog_s = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and (not pid or pid == str(os.getpid())):
            watchdog_s = max(int(usec) / 1e6, _MIN_WATCHDOG_S)
        return cls(address, watchdog_s=watchdog_s)

    def notify(self, state: str) -> bool:
        """Send ``state`` (``READY=1``, ``STATUS=...``, newline-separated assignments); True when sent."""
        if self.address is None:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(state.encode(), target)
        except OSError as exc:
            if not self._warned:  # once: a watchdog ping every few seconds must not fill the log
                log.warning("sdnotify.send_failed socket=%s error=%s", self.address, exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str | None = None) -> None:
        self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> None:
        self.notify("STOPPING=1")

    async def _watchdog(self, period_s: float) -> None:
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(period_s / 2)

    @contextlib.asynccontextmanager
    async def watchdog(self) -> AsyncIterator[None]:
        """Ping ``WATCHDOG=1`` every half period while the block runs (nothing without a watchdog)."""
        if self.address is None or self.watchdog_s is None:
            yield
            return
        task = asyncio.create_task(self._watchdog(self.watchdog_s), name="runtime.sd_watchdog")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
