"""What both protocol heads read of a TLS connection: the client certificate, as the hub's login takes it.

One home for it: the MQTT head (``protocol_heads.mqtt.client_socket``) and the AMQP head
(``protocol_heads.amqp.client_socket``) both ask here.
"""

from __future__ import annotations

import hashlib
import ssl
from typing import Any

__all__ = ["peer_certificate"]


def peer_certificate(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> tuple[str | None, str | None, bool]:
    """The client certificate's SHA-256 thumbprint (hex, of its DER) and common name, and whether the TLS layer
    verified it; ``(None, None, False)`` without TLS or without a client certificate."""
    if ssl_object is None:
        return None, None, False
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None, None, False
    cn = None
    info = ssl_object.getpeercert()
    if info:
        subject: Any = info.get("subject", ())  # ((("commonName", "dev1"),), ...): typeshed's type is looser
        for rdn in subject:
            for key, value in rdn:
                if key == "commonName":
                    cn = value
    return hashlib.sha256(der).hexdigest(), cn, bool(info)
