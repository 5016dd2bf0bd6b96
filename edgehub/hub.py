"""The hub facade: the one interface the protocol heads call (ingest, connect for delivery, disconnect).

Built by the MQTT-head issue; until then it holds nothing but its place in the layers.
"""

__all__: list[str] = []
