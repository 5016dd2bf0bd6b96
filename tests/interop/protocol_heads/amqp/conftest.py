"""The AMQP head's fixtures (a real head on 127.0.0.1 port 0 over the in-memory hub), shared with its own tests."""

from tests.protocol_heads.amqp.conftest import ca, head, hub

__all__ = ["ca", "head", "hub"]  # fixtures, used by name
