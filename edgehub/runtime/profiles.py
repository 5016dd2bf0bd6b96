"""Hardware profiles: the settings that fit one kind of gateway, read from a TOML file (``hardware/profiles/``).

``edgehub run --profile pi-zero2w`` loads ``hardware/profiles/pi-zero2w.toml`` (a name), or a file given by its
path (it ends in ``.toml``). A name is looked up in the checkout's ``hardware/profiles``, or, in an installed
edgehub, where pip put them (``{sys.prefix}/share/edgehub/profiles``, pyproject.toml's data-files). A profile
sets, for its board:

* ``[rocksdb]``: RocksDB's memory budget (``edgehub.store.tuning.RocksTuning``: memtables, block cache, open
  files, background jobs);
* ``[store]``: the fsync policy (``always``, ``interval``, ``none``) and its interval, the most producers'
  writes one group commit takes (``max_group``), and the bytes of just-written messages kept in memory for the
  executors (``held_max_bytes``: while the link is down they stay until the bound, ~10 MB at the default);
* ``[upstream]``: the most messages in one upstream batch (``max_batch_messages``; the MQTT transport's batch
  bytes stay with the link hints of the manifest, the upload transport's files hold at most this many);
* ``[runtime]``: the event loop (``event_loop``: ``uvloop``, less CPU per message, or the standard library's
  ``asyncio``, ~2 MB less memory: docs/install.md has the figures).

Precedence: an explicit flag of ``edgehub run`` (``--fsync``, ``--fsync-interval-ms``, ``--event-loop``,
``--upstream-*``) over the
manifest's ``upstream`` section over the profile over the built-in default (the profile is where a board's
defaults live; the manifest and the command line are a deployment's own choices).

Invariants: every key is known and every value bounded (an unknown key, a wrong type or a value out of bounds is
refused with the file and the key, as ``ConfigurationError``, before the hub starts); sizes are bytes, as an
integer or a string with a unit (``"4MiB"``); a profile file is at most 64 KiB.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgehub.core import ConfigurationError
from edgehub.store import FsyncPolicy
from edgehub.store.held import MAX_BYTES as HELD_MAX_BYTES
from edgehub.store.tuning import RocksTuning

__all__ = ["EVENT_LOOPS", "PROFILES_DIR", "Profile", "available_profiles", "load_profile", "parse_profile"]


def _profiles_dir() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "hardware" / "profiles"
    return checkout if checkout.is_dir() else Path(sys.prefix) / "share" / "edgehub" / "profiles"


PROFILES_DIR = _profiles_dir()
_MAX_FILE_BYTES = 64 << 10
EVENT_LOOPS = ("uvloop", "asyncio")  # the loops ``edgehub run`` serves on; the first is the default
_SIZE_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One board's settings; see the module docstring. ``Profile()`` is the built-in default (no profile)."""

    name: str = "default"
    description: str = ""
    rocks: RocksTuning = field(default_factory=RocksTuning)
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 10
    max_group: int = 1024
    held_max_bytes: int = HELD_MAX_BYTES
    max_batch_messages: int | None = None  # None: each transport's own default
    event_loop: str = EVENT_LOOPS[0]
    # The fields the profile's file set (``fsync``, ``rocks.block_cache_bytes``, ...): the others are the built-in
    # defaults, and ``edgehub config show`` says so. Not compared: two profiles with equal values are equal.
    given: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.fsync_interval_ms <= 10_000:
            raise ValueError(f"fsync_interval_ms must be within 0 and 10000, not {self.fsync_interval_ms}")
        if not 1 <= self.max_group <= 65_536:
            raise ValueError(f"max_group must be within 1 and 65536, not {self.max_group}")
        if not 0 <= self.held_max_bytes <= 1 << 30:
            raise ValueError(f"held_max_bytes must be within 0 and 1 GiB, not {self.held_max_bytes}")
        if self.max_batch_messages is not None and not 1 <= self.max_batch_messages <= 100_000:
            raise ValueError(f"max_batch_messages must be within 1 and 100000, not {self.max_batch_messages}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, not {self.event_loop!r}")


def available_profiles() -> list[str]:
    """The names ``--profile`` takes without a path."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml")) if PROFILES_DIR.is_dir() else []


def load_profile(name_or_path: str) -> Profile:
    """The profile called ``name_or_path`` in ``hardware/profiles``, or the file at that path (``*.toml``)."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
    else:
        path = PROFILES_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            known = ", ".join(available_profiles()) or "none installed"
            raise ConfigurationError(f"profile {name_or_path!r}: no such profile (known: {known}; or a .toml path)")
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"profile {path}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > _MAX_FILE_BYTES:
        raise ConfigurationError(f"profile {path}: larger than {_MAX_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"profile {path}: not TOML: {exc}") from None
    return parse_profile(data, name=path.stem, source=str(path))


def parse_profile(data: Mapping[str, Any], *, name: str, source: str) -> Profile:
    """A profile from its TOML table; ``ConfigurationError`` naming ``source`` and the key for anything wrong."""
    where = f"profile {source}"
    _known(data, {"description", "rocksdb", "store", "upstream", "runtime"}, where)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigurationError(f"{where}: description must be a string")
    rocks_table = _table(data, "rocksdb", where)
    store = _table(data, "store", where)
    upstream = _table(data, "upstream", where)
    runtime = _table(data, "runtime", where)
    _known(rocks_table, set(RocksTuning.field_names()), f"{where} [rocksdb]")
    _known(store, {"fsync", "fsync_interval_ms", "max_group", "held_max_bytes"}, f"{where} [store]")
    _known(upstream, {"max_batch_messages"}, f"{where} [upstream]")
    _known(runtime, {"event_loop"}, f"{where} [runtime]")
    try:
        rocks = RocksTuning(**{key: _int(value, f"{where} [rocksdb] {key}") for key, value in rocks_table.items()})
        settings: dict[str, Any] = {}
        if "fsync" in store:
            try:
                settings["fsync"] = FsyncPolicy(store["fsync"])
            except ValueError:
                choices = ", ".join(p.value for p in FsyncPolicy)
                raise ConfigurationError(f"{where} [store] fsync: {store['fsync']!r} is not one of {choices}") from None
        for key in ("fsync_interval_ms", "max_group", "held_max_bytes"):
            if key in store:
                settings[key] = _int(store[key], f"{where} [store] {key}")
        if "max_batch_messages" in upstream:
            settings["max_batch_messages"] = _int(
                upstream["max_batch_messages"], f"{where} [upstream] max_batch_messages"
            )
        if "event_loop" in runtime:
            settings["event_loop"] = runtime["event_loop"]
        given = frozenset({*settings, *(f"rocks.{key}" for key in rocks_table)})
        return Profile(name=name, description=description, rocks=rocks, given=given, **settings)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def _known(table: Mapping[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ConfigurationError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(keys))})")


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{where}: [{key}] must be a table")
    return value


def _int(value: object, where: str) -> int:
    """An integer, or a size with a unit (``"4MiB"``, ``"512KiB"``) as bytes."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{where}: expected a number, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits) :] or "b"
        if digits.isdigit() and unit in _SIZE_UNITS:
            return int(digits) * _SIZE_UNITS[unit]
    raise ConfigurationError(f'{where}: expected an integer or a size such as "4MiB", not {value!r}')
