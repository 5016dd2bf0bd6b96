"""The hub's store and identities as the composition root opens them: the data directory made private first, every
record read with its checksum verified before the hub writes (a damaged store is refused with what to do about it),
the store's quota for this run (from the free disk unless given), and the identity registry sealing its keys.

Invariants: a store that fails its verification is never opened read-write (its MANIFEST is not rewritten); the
data directory is private before anything is created in it; every key the registry writes is sealed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from edgehub.core import StoreCorruptionError, SystemClock
from edgehub.hub.identities import IdentityRegistry
from edgehub.runtime.compose.config import HubLimits
from edgehub.runtime.data_dir import tighten_data_dir
from edgehub.runtime.keyseal import ensure_sealer
from edgehub.runtime.profiles import Profile
from edgehub.store import Store, StoreQuota
from edgehub.store.policy import disk_store_quota
from edgehub.store.records import META
from edgehub.store.rocks import RocksBackend, open_rocks_store
from edgehub.store.salvage import check_store

__all__ = [
    "damaged_store_advice",
    "open_identities",
    "open_store",
    "read_metadata",
    "seal_clear_identity_keys",
    "store_path",
    "store_quota",
]

log = logging.getLogger(__name__)


def store_path(data_dir: Path) -> Path:
    return data_dir / "store"


def read_metadata(data_dir: Path, key: str) -> bytes | None:
    """One metadata value of the store in ``data_dir``, read without writing anything (RocksDB read-only: a hub
    may hold the store meanwhile); None when there is no store or no such key. ``StoreError`` when the store
    cannot be read."""
    path = store_path(data_dir)
    if not (path / "CURRENT").exists():
        return None
    backend = RocksBackend(path, read_only=True)
    try:
        return backend.get(META, key.encode())
    finally:
        backend.close()


def open_store(
    data_dir: Path,
    *,
    default_ttl_s: float = 7200.0,
    profile: Profile | None = None,
    verify: bool = False,
) -> Store:
    """The hub's store in ``data_dir``, with the RocksDB budget, fsync policy and group size of ``profile`` (None:
    the built-in defaults). ``verify`` reads every record first (the hub does at start: a flipped byte is found
    only by reading it). A damaged store raises ``StoreCorruptionError`` saying what to do. The data directory is
    made private first (``tighten_data_dir``)."""
    p = profile or Profile()
    tighten_data_dir(data_dir)
    path = store_path(data_dir)
    try:
        if verify and path.is_dir() and any(path.iterdir()):
            # read-only first: a damaged store is refused before the read-write open rewrites its MANIFEST
            started = time.monotonic()
            records = sum(check_store(path).values())
            log.info("store.verified path=%s records=%d seconds=%.3f", path, records, time.monotonic() - started)
        return open_rocks_store(
            path,
            tuning=p.rocks,
            default_ttl_s=default_ttl_s,
            fsync=p.fsync,
            fsync_interval_ms=p.fsync_interval_ms,
            max_group=p.max_group,
            held_max_bytes=p.held_max_bytes,
        )
    except StoreCorruptionError as exc:
        raise StoreCorruptionError(damaged_store_advice(exc, data_dir), path=exc.path) from exc


def damaged_store_advice(exc: StoreCorruptionError, data_dir: Path) -> str:
    """``exc`` with what an operator can do about it (docs/operating.md, "A damaged store")."""
    return (
        f"{exc}\n"
        "The hub did not start and changed nothing in the store. To recover:\n"
        f"  edgehub store check --data-dir {data_dir}    reads every record and reports the damage\n"
        f"  edgehub store repair --data-dir {data_dir}   keeps a copy aside, then recovers what can be read\n"
        f"  or move {exc.path} aside and start with an empty store (what it holds is then not delivered)"
    )


def store_quota(store: Store, path: Path, limits: HubLimits) -> StoreQuota:
    """The store's quota for this run: ``limits.store_max_bytes``, or (``"auto"``) one from the free space of the
    filesystem at ``path`` and what ``store`` holds now; with each identity's share."""
    max_bytes = limits.store_max_bytes
    if max_bytes == "auto":
        max_bytes = disk_store_quota(path, store.usage(None)[1])
    quota = StoreQuota(max_bytes=max_bytes, identity_share=limits.identity_share)
    log.info(
        "runtime.store_quota max_bytes=%s identity_max_bytes=%s source=%s",
        quota.max_bytes,
        quota.identity_max_bytes,
        "disk" if limits.store_max_bytes == "auto" else "setting",
    )
    return quota


def open_identities(store: Store, host_name: str, *, data_dir: Path) -> IdentityRegistry:
    """The identity registry over ``store`` (``data_dir``'s), sealing the keys it writes with ``data_dir``'s seal
    key (``edgehub.runtime.keyseal``; made when there is none)."""
    return IdentityRegistry(store, host_name=host_name, clock=SystemClock(), sealer=ensure_sealer(data_dir))


async def seal_clear_identity_keys(registry: IdentityRegistry) -> None:
    """Seal the symmetric keys an older hub kept in clear (on every open of a data directory's identities:
    nothing to do costs one scan of the identity records), and say what was found."""
    sealed, unopenable = await registry.seal_clear_keys()
    if sealed:
        log.info("identity.keys_sealed count=%d why=kept_in_clear_by_an_older_hub", sealed)
    if unopenable:
        log.warning(
            "identity.keys_unopenable count=%d why=sealed_with_another_seal_key advice=%s",
            unopenable,
            "restore the original identity-seal.key, or give these identities new keys (edgehub identity add)",
        )
