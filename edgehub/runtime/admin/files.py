"""Where a running hub's admin API is found: ``DATA/admin.token`` and ``DATA/admin.port``.

* ``admin.token``: the bearer token, 32 random bytes as URL-safe base64. Made once (``O_CREAT | O_EXCL`` with mode
  0600, so it is never readable by others, not even for a moment) and kept across restarts, so scripts and
  Prometheus' ``credentials_file`` keep working. A token file that others may read is tightened to 0600 at start
  (logged), since whoever reads it controls the hub.
* ``admin.port``: the bound port, written (atomically: a temporary file renamed over it) once the API listens,
  and removed when the hub stops. A port file left by a hub that was killed names a port nobody answers on: the
  CLI then works on the data directory (and the store's lock says whether a hub really holds it).

Invariant: the token is compared in constant time (``token_matches``).
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

__all__ = [
    "PORT_FILE",
    "TOKEN_FILE",
    "ensure_token",
    "read_port",
    "read_token",
    "remove_port_file",
    "token_matches",
    "write_port_file",
]

log = logging.getLogger(__name__)

TOKEN_FILE = "admin.token"
PORT_FILE = "admin.port"
_MAX_FILE_BYTES = 256  # both files are a line; anything longer is not ours


def ensure_token(data_dir: Path) -> str:
    """The admin token of ``data_dir``, made (mode 0600) when there is none."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / TOKEN_FILE
    token = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, 0o600)
            log.warning("admin.token_mode_tightened path=%s was=%o now=600", path, mode)
        existing = read_token(data_dir)
        if existing:
            return existing
        path.write_text(token + "\n")  # empty or unreadable: made anew (mode already 0600)
        return token
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    log.info("admin.token_created path=%s", path)
    return token


def read_token(data_dir: Path) -> str | None:
    text = _read_line(data_dir / TOKEN_FILE)
    return text or None


def token_matches(expected: str, presented: str) -> bool:
    return hmac.compare_digest(expected.encode(), presented.encode("utf-8", "surrogatepass"))


def write_port_file(data_dir: Path, port: int) -> None:
    path = data_dir / PORT_FILE
    tmp = path.with_suffix(".port.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def remove_port_file(data_dir: Path, port: int) -> None:
    """Remove the port file if it still names ``port`` (a newer hub's is left alone)."""
    if read_port(data_dir) == port:
        with contextlib.suppress(FileNotFoundError):
            (data_dir / PORT_FILE).unlink()


def read_port(data_dir: Path) -> int | None:
    text = _read_line(data_dir / PORT_FILE)
    if text is None or not text.isdigit() or not 0 < int(text) < 65536:
        return None
    return int(text)


def _read_line(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_FILE_BYTES:
        return None
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
