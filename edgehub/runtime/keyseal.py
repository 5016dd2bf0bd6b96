"""Identity keys sealed at rest (``edgehub.core.sealing.HmacSealer``) under a key kept in
``DATA/identity-seal.key`` (beside ``admin.token``), made once with mode 0600.

The store (``DATA/store``) then holds every symmetric key only sealed (``edgehub.hub.identities``), so a copy of
the store, or a backup of it, leaks no device's key. The seal key file is to the identity keys
what ``admin.token`` is to the admin API: whoever reads it can open them, so it is never readable by others, and
a backup that must not leak keys leaves it out.

Invariants: the seal key file is created with ``O_CREAT | O_EXCL`` and mode 0600 (never readable by others, not
even for a moment), tightened to 0600 at start when found wider (logged); it is never replaced once made, since
every sealed key would be lost with it: one that is not a key (damaged) stops the start with what to do.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import secrets
import stat
from pathlib import Path

from edgehub.core import ConfigurationError
from edgehub.core.sealing import HmacSealer

__all__ = ["SEAL_KEY_FILE", "ensure_sealer"]

log = logging.getLogger(__name__)

SEAL_KEY_FILE = "identity-seal.key"


def ensure_sealer(data_dir: Path) -> HmacSealer:
    """The sealer of ``data_dir``, its key file made (mode 0600) when there is none."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / SEAL_KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, 0o600)
            log.warning("identity.seal_key_mode_tightened path=%s was=%o now=600", path, mode)
        return HmacSealer(_read_key(path))
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "w") as f:
        f.write(base64.urlsafe_b64encode(key).decode("ascii") + "\n")
        f.flush()
        os.fsync(f.fileno())
    log.info("identity.seal_key_created path=%s", path)
    return HmacSealer(key)


def _read_key(path: Path) -> bytes:
    try:
        key = base64.urlsafe_b64decode(path.read_bytes()[:200].strip())
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise ConfigurationError(
            f"{path} is not this hub's seal key (32 bytes as base64): the identity keys in the store were sealed "
            "with it. Put the original file back; without it, the symmetric keys must be given anew "
            "(edgehub identity add ID gives one)"
        )
    return key
