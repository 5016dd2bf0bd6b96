"""``edgehub run``'s hardware profile flags, kept here so that ``run`` takes them with one decorator and one
argument: ``--profile``, ``--fsync``, ``--fsync-interval-ms``, ``--event-loop`` become ``profile: Profile``, the
flags given on the command line applied over the profile's values (``edgehub.runtime.profiles``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from edgehub.core import ConfigurationError
from edgehub.runtime.profiles import EVENT_LOOPS, Profile, available_profiles, load_profile
from edgehub.store import FsyncPolicy

__all__ = ["describe_profile", "profile_from", "profile_option_list", "profile_options"]

# The flags, as data: ``profile_options`` puts them on a command, ``profile_option_list`` into an option group.
_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (
        ("--profile", "profile_name"),
        dict(
            default=None,
            metavar="NAME|FILE",
            help="Hardware profile: RocksDB memory budget, fsync policy, batch sizes for a board "
            f"({', '.join(available_profiles()) or 'see hardware/profiles'}; or a .toml file). "
            "Flags given override it.",
        ),
    ),
    (
        ("--fsync",),
        dict(
            type=click.Choice([p.value for p in FsyncPolicy]),
            default=None,
            help="always: one sync per group commit before its acks; interval: at most one sync per "
            "--fsync-interval-ms, acks still wait for it (fewer writes to an SD card); none: no sync (a power cut "
            "can lose acknowledged messages). Default: the profile's, else always.",
        ),
    ),
    (
        ("--fsync-interval-ms",),
        dict(
            type=click.IntRange(0, 10_000),
            default=None,
            help="The least time between two syncs under --fsync interval (default: the profile's, else 10).",
        ),
    ),
    (
        ("--event-loop",),
        dict(
            type=click.Choice(EVENT_LOOPS),
            default=None,
            help="uvloop (libuv; less CPU per message) or the standard library's asyncio loop (~2 MB less memory). "
            f"Default: the profile's, else {EVENT_LOOPS[0]}.",
        ),
    ),
)


def describe_profile(profile: Profile) -> str:
    """One line saying what the hub runs with."""
    r = profile.rocks

    def mib(n: int | None) -> str:
        return "default" if n is None else f"{n / (1 << 20):g} MiB"

    fsync = f"{profile.fsync}" + (f" {profile.fsync_interval_ms} ms" if profile.fsync is FsyncPolicy.INTERVAL else "")
    return (
        f"profile: {profile.name} fsync={fsync} group<={profile.max_group} memtables<={mib(r.db_write_buffer_bytes)} "
        f"block cache={mib(r.block_cache_bytes)} open files={r.max_open_files or 'default'} "
        f"batch messages={profile.max_batch_messages or 'default'}"
    )


def profile_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the profile flags to a click command whose function takes ``profile: Profile``."""

    @functools.wraps(command)
    def with_profile(
        *args: Any,
        profile_name: str | None,
        fsync: str | None,
        fsync_interval_ms: int | None,
        event_loop: str | None,
        **kwargs: Any,
    ) -> None:
        command(*args, profile=profile_from(profile_name, fsync, fsync_interval_ms, event_loop), **kwargs)

    decorated: Callable[..., None] = with_profile
    for decls, attrs in reversed(_OPTIONS):
        decorated = click.option(*decls, **attrs)(decorated)
    return decorated


def profile_option_list() -> tuple[click.Option, ...]:
    """The profile flags as options of a group (``edgehub.runtime.cli.options``); their values go to
    ``profile_from``."""
    return tuple(click.Option(list(decls), **attrs) for decls, attrs in _OPTIONS)


def profile_from(
    profile_name: str | None, fsync: str | None, fsync_interval_ms: int | None, event_loop: str | None
) -> Profile:
    """The profile ``--profile`` names (or the built-in one), the other flags given applied over it."""
    try:
        profile = load_profile(profile_name) if profile_name is not None else Profile()
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--profile") from None
    if fsync is not None:
        profile = replace(profile, fsync=FsyncPolicy(fsync))
    if fsync_interval_ms is not None:
        profile = replace(profile, fsync_interval_ms=fsync_interval_ms)
    if event_loop is not None:
        profile = replace(profile, event_loop=event_loop)
    return profile
