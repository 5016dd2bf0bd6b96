"""Identities: a device, or a module on a device. Ids are NewTypes; the identity string is ``d`` or ``d/m``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

__all__ = ["DeviceId", "Identity", "ModuleId"]

DeviceId = NewType("DeviceId", str)
ModuleId = NewType("ModuleId", str)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is connected: a device (``module_id is None``) or a module of a device."""

    device_id: DeviceId
    module_id: ModuleId | None = None

    def __post_init__(self) -> None:
        if not self.device_id or "/" in self.device_id:
            raise ValueError(f"invalid device id {self.device_id!r}")
        if self.module_id is not None and (not self.module_id or "/" in self.module_id):
            raise ValueError(f"invalid module id {self.module_id!r}")

    @property
    def id(self) -> str:
        """``deviceId`` or ``deviceId/moduleId``, as IoT Hub client ids are written."""
        return self.device_id if self.module_id is None else f"{self.device_id}/{self.module_id}"

    @classmethod
    def parse(cls, text: str) -> Identity:
        """Parse ``deviceId`` or ``deviceId/moduleId``."""
        device, sep, module = text.partition("/")
        return cls(DeviceId(device), ModuleId(module) if sep else None)

    def __str__(self) -> str:
        return self.id
