"""What an ``AmqpConnection`` tells the session side. Links and deliveries are proton's engine objects, opaque to
the session: it hands them back to the connection to accept, refuse, settle or send on."""

from __future__ import annotations

from dataclasses import dataclass

from proton import Delivery, Link

from protocol_heads.amqp.proton_raw import RawDelivery
from protocol_heads.amqp.sasl import SaslInit

__all__ = [
    "Closed",
    "CreditAdded",
    "DeliveryUpdated",
    "Event",
    "LinkClosed",
    "LinkRequested",
    "MessageReceived",
    "MessageTooLarge",
    "ProtocolFailed",
    "SaslInitReceived",
]


@dataclass(frozen=True, slots=True)
class SaslInitReceived:
    init: SaslInit


@dataclass(frozen=True, slots=True)
class LinkRequested:
    """The client attached ``link``. ``outgoing``: the hub sends on it (the client receives from ``address``, its
    source); else the client sends to ``address`` (its target)."""

    link: Link
    outgoing: bool
    address: str


@dataclass(frozen=True, slots=True)
class LinkClosed:
    link: Link


@dataclass(slots=True)  # one per transfer: a frozen dataclass's __init__ sets each field through object.__setattr__
class MessageReceived:
    """A complete transfer on an incoming link (``link_name`` is its name): ``body`` is the encoded message;
    ``settled``: sent pre-settled (nothing to answer). ``delivery`` goes back to ``AmqpConnection.settle``."""

    link: Link
    link_name: str
    delivery: RawDelivery
    body: bytes
    settled: bool


@dataclass(frozen=True, slots=True)
class MessageTooLarge:
    """A transfer grew past the link's ``max-message-size`` (``limit``; ``size``: what proton held of it then):
    what more comes of it is dropped as it comes, and once it has ended it is rejected and the link closed with
    ``amqp:link:message-size-exceeded``."""

    link: Link
    size: int
    limit: int


@dataclass(frozen=True, slots=True)
class DeliveryUpdated:
    """The client settled (or answered) a delivery the hub sent; ``accepted``: its outcome was ``accepted``;
    ``rejected``: it was ``rejected`` (refused for good; ``released`` and ``modified`` are neither)."""

    link: Link
    delivery: Delivery
    accepted: bool
    rejected: bool = False


@dataclass(frozen=True, slots=True)
class CreditAdded:
    """The client gave an outgoing link more credit."""

    link: Link


@dataclass(frozen=True, slots=True)
class ProtocolFailed:
    """The client broke the protocol, or passed a bound; the connection is closing with ``condition`` (an AMQP
    error symbol). ``before_login``: the bound before login it passed (sessions, links, unfinished_bytes)."""

    condition: str
    description: str
    too_large: bool = False
    before_login: str | None = None


@dataclass(frozen=True, slots=True)
class Closed:
    """The client closed the connection (or the transport ended)."""

    condition: str | None = None


Event = (
    SaslInitReceived
    | LinkRequested
    | LinkClosed
    | MessageReceived
    | MessageTooLarge
    | DeliveryUpdated
    | CreditAdded
    | ProtocolFailed
    | Closed
)
