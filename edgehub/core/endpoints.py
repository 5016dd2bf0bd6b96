"""Endpoint ids and upstream lane names: built and parsed here and nowhere else.

Routes name endpoints, queues and executors are keyed by them, the hub wires them to deliverers, and the upstream
transports name their segments and topics after their lane: routing, store, delivery, upstream and hub all need
these spellings, and core is the one layer every one of them may import.

* ``$upstream`` (``UPSTREAM_ENDPOINT``): the upstream, as a route's ``INTO $upstream`` names it.
* A module input: ``/modules/{module}/inputs/{input}`` (``module_endpoint``, ``parse_module_endpoint``), as a
  route's ``INTO BrokeredEndpoint("...")`` names it. Module and input are non-empty and hold no ``/``.
* A device's cloud-to-device queue: ``/devices/{device}/messages/devicebound`` (``device_endpoint``,
  ``parse_device_endpoint``), as IoT Hub's topic for it reads; a route's ``INTO BrokeredEndpoint("...")`` may name
  it, and messages for the device from the upstream go there. The device id is non-empty and holds no ``/``.
* Upstream lanes: with ``partitions`` N > 1 the upstream is N lanes, each its own endpoint (so its own
  queues, checkpoints and executor): ``$upstream/0`` … ``$upstream/{N-1}`` (``upstream_lane_id``,
  ``parse_upstream_lane_id``). With one partition the lane is ``$upstream`` itself, so a hub that never turned
  partitions on keeps its queues.
* Lane names, the lane's part of segment names and topics: ``upstream`` for the single lane (``UPSTREAM_LANE``),
  ``upstream-p{i}`` for lane ``i`` of several (``lane_name``, ``lane_name_of``).

Invariants: what a builder makes, its parser gives back; a parser answers None for an id that is not of its
kind and never raises; a builder raises ``ValueError`` rather than make an id that would not parse back.
"""

from __future__ import annotations

__all__ = [
    "UPSTREAM_ENDPOINT",
    "UPSTREAM_LANE",
    "device_endpoint",
    "is_upstream_endpoint",
    "lane_name",
    "lane_name_of",
    "module_endpoint",
    "parse_device_endpoint",
    "parse_module_endpoint",
    "parse_upstream_lane_id",
    "upstream_lane_id",
]

UPSTREAM_ENDPOINT = "$upstream"
UPSTREAM_LANE = "upstream"

_MODULES = "modules"
_INPUTS = "inputs"
_DEVICES = "devices"
_DEVICEBOUND = ("messages", "devicebound")


def module_endpoint(module_id: str, input_name: str) -> str:
    """``/modules/{module_id}/inputs/{input_name}``; ``ValueError`` for an empty part or one with a ``/``."""
    for what, part in (("module id", module_id), ("input name", input_name)):
        if not part or "/" in part:
            raise ValueError(f"{what} {part!r} cannot be part of a module endpoint id (empty, or holds '/')")
    return f"/{_MODULES}/{module_id}/{_INPUTS}/{input_name}"


def parse_module_endpoint(endpoint_id: str) -> tuple[str, str] | None:
    """``/modules/{m}/inputs/{i}`` → ``(m, i)``; anything else → None."""
    parts = endpoint_id.split("/")
    if len(parts) == 5 and parts[0] == "" and parts[1] == _MODULES and parts[3] == _INPUTS and parts[2] and parts[4]:
        return parts[2], parts[4]
    return None


def device_endpoint(device_id: str) -> str:
    """``/devices/{device_id}/messages/devicebound``; ``ValueError`` for an empty id or one with a ``/``."""
    if not device_id or "/" in device_id:
        raise ValueError(f"device id {device_id!r} cannot be part of a device endpoint id (empty, or holds '/')")
    return f"/{_DEVICES}/{device_id}/{_DEVICEBOUND[0]}/{_DEVICEBOUND[1]}"


def parse_device_endpoint(endpoint_id: str) -> str | None:
    """``/devices/{d}/messages/devicebound`` → ``d``; anything else → None."""
    parts = endpoint_id.split("/")
    if len(parts) == 5 and parts[0] == "" and parts[1] == _DEVICES and parts[2] and tuple(parts[3:]) == _DEVICEBOUND:
        return parts[2]
    return None


def upstream_lane_id(partition: int, partitions: int) -> str:
    """The endpoint id of lane ``partition`` of ``partitions``: ``$upstream`` for one lane, else ``$upstream/{i}``."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} out of range 0..{partitions - 1}")
    return UPSTREAM_ENDPOINT if partitions == 1 else f"{UPSTREAM_ENDPOINT}/{partition}"


def parse_upstream_lane_id(endpoint: str) -> int | None:
    """The partition of a lane endpoint id (``$upstream/3`` → 3); None for ``$upstream`` and for any other id."""
    prefix = UPSTREAM_ENDPOINT + "/"
    if not endpoint.startswith(prefix):
        return None
    digits = endpoint[len(prefix) :]
    # Only the form upstream_lane_id makes: "$upstream/03" would be a second id for lane 3 (a second queue).
    if not digits.isascii() or not digits.isdigit() or (digits != "0" and digits.startswith("0")):
        return None
    return int(digits)


def is_upstream_endpoint(endpoint: str) -> bool:
    """``$upstream`` or one of its lanes."""
    return endpoint == UPSTREAM_ENDPOINT or parse_upstream_lane_id(endpoint) is not None


def lane_name(partition: int, partitions: int) -> str:
    """``upstream`` for a single lane, ``upstream-p{i}`` otherwise (the lane part of segment names)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} out of range 0..{partitions - 1}")
    return lane_name_of(None if partitions == 1 else partition)


def lane_name_of(partition: int | None) -> str:
    """The lane name of a lane endpoint whose partition is known (None: the single lane, ``$upstream``)."""
    if partition is not None and partition < 0:
        raise ValueError(f"partition {partition} is negative")
    return UPSTREAM_LANE if partition is None else f"{UPSTREAM_LANE}-p{partition}"
