"""The fixtures the WebSocket listener's tests share with the MQTT head's (an in-memory hub, a test CA)."""

from tests.protocol_heads.mqtt.conftest import ca, hub

__all__ = ["ca", "hub"]  # fixtures, used by name
