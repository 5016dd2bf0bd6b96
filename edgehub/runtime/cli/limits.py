"""``edgehub run``'s limit flags, kept here so that ``run`` takes them with one decorator and one argument:
``--max-token-lifetime``, ``--store-quota``, ``--identity-share`` become ``limits: HubLimits``."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Literal

import click

from edgehub.runtime.compose.config import HubLimits

__all__ = ["limit_option_list", "limit_options", "limits_from", "parse_lifetime_s", "parse_share", "parse_store_quota"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$", re.IGNORECASE)
_DURATION_SCALE = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)?\s*$", re.IGNORECASE)
_SIZE_SCALE = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_OFF = {"0", "none", "off"}


def parse_lifetime_s(text: str) -> float | None:
    """``365d``, ``12h``, ``90m``, ``3600`` (seconds) as seconds; ``none`` (or 0) for no limit."""
    if text.strip().lower() in _OFF:
        return None
    m = _DURATION.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (try 365d, or none)")
    return float(m.group(1)) * _DURATION_SCALE[(m.group(2) or "s").lower()]


def parse_store_quota(text: str) -> int | Literal["auto"] | None:
    """``auto`` (from the free disk), a size (``2GiB``, ``500MB``, bytes) or ``none`` (or 0) for no quota."""
    lowered = text.strip().lower()
    if lowered == "auto":
        return "auto"
    if lowered in _OFF:
        return None
    m = _SIZE.match(text)
    if not m or float(m.group(1)) < 1:
        raise ValueError(f"not a size: {text!r} (try 2GiB, auto or none)")
    return int(float(m.group(1)) * _SIZE_SCALE[(m.group(2) or "b").lower()])


def parse_share(text: str) -> float | None:
    """``25%`` or ``0.25`` as a fraction within (0, 1]; ``none`` for no per-identity share."""
    lowered = text.strip().lower()
    if lowered in _OFF:
        return None
    try:
        share = float(lowered[:-1]) / 100 if lowered.endswith("%") else float(lowered)
    except ValueError:
        raise ValueError(f"not a share: {text!r} (try 25%)") from None
    if not 0 < share <= 1:
        raise ValueError(f"a share is within 0% and 100%: {text!r}")
    return share


def _converted(parse: Callable[[str], Any], text: str, flag: str) -> Any:
    try:
        return parse(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


# The flags, as data: ``limit_options`` puts them on a command, ``limit_option_list`` into an option group.
_OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "--max-token-lifetime",
        dict(
            default="365d",
            show_default=True,
            metavar="DURATION",
            help="How far ahead a device's SAS token may expire (e.g. 365d, 12h); further is refused. none: no limit.",
        ),
    ),
    (
        "--store-quota",
        dict(
            default="auto",
            show_default=True,
            metavar="SIZE",
            help="Bytes the store may hold (e.g. 2GiB). auto: what it holds at start plus half the free disk, at most "
            "32 GiB. none: no quota.",
        ),
    ),
    (
        "--identity-share",
        dict(
            default="25%",
            show_default=True,
            metavar="PERCENT",
            help="Of the store quota, what one device or module may hold; over it its messages are refused (MQTT 5: "
            "0x97). none: no per-identity share.",
        ),
    ),
)


def limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the limit flags to a click command whose function takes ``limits: HubLimits``."""

    @functools.wraps(command)
    def with_limits(*args: Any, max_token_lifetime: str, store_quota: str, identity_share: str, **kwargs: Any) -> None:
        command(*args, limits=limits_from(max_token_lifetime, store_quota, identity_share), **kwargs)

    decorated: Callable[..., None] = with_limits
    for decl, attrs in reversed(_OPTIONS):
        decorated = click.option(decl, **attrs)(decorated)
    return decorated


def limit_option_list() -> tuple[click.Option, ...]:
    """The limit flags as options of a group (``edgehub.runtime.cli.options``); their values go to ``limits_from``."""
    return tuple(click.Option([decl], **attrs) for decl, attrs in _OPTIONS)


def limits_from(max_token_lifetime: str, store_quota: str, identity_share: str) -> HubLimits:
    """The limits the flags say; a flag that does not parse is a usage error naming it."""
    return HubLimits(
        max_token_lifetime_s=_converted(parse_lifetime_s, max_token_lifetime, "--max-token-lifetime"),
        store_max_bytes=_converted(parse_store_quota, store_quota, "--store-quota"),
        identity_share=_converted(parse_share, identity_share, "--identity-share"),
    )
