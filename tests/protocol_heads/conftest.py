"""The fixtures the WebSocket listener's tests share with the MQTT head's (an in-memory hub, a test CA, the
cycle collector off)."""

from tests.protocol_heads.mqtt.conftest import ca, hub
from tests.protocol_heads.mqtt.test_hostile import no_cycle_collector

__all__ = ["ca", "hub", "no_cycle_collector"]  # fixtures, used by name
