"""The landing receiver: MQTT batch payloads from the cloud broker to landing-zone segments.

Usage:
    python -m spark_upload.receiver --broker mqtt://HOST:1883 --landing URL \\
        [--topic 'edgehub/segments/#'] [--group ingest] [--client-id ID] [--mqtt-version 5|3.1.1]

The hub's MQTT upstream in batch mode (``edgehub.upstream.mqtt.transport``) publishes each segment on
``edgehub/segments/{hub_id}/{lane}/p{priority:02d}`` (its ``batch_topic``), so the default filter
``edgehub/segments/#`` takes every hub, lane and priority; change both together. Each PUBLISH payload is one
segment (``edgehub.upstream.segment``), stored with the same bytes through ``edgehub.upstream.landing``.

Under MQTT 5 it subscribes with a shared subscription (``$share/{group}/{topic}``), so several receivers split
the load, when the broker supports it: a CONNACK with ``SharedSubscriptionAvailable = 0``, or a SUBACK refusing
the shared filter with 0x9E (shared subscriptions not supported), makes it subscribe to the plain filter instead
and log ``receiver.shared_subscription_unavailable``; each receiver then gets every message (still landed once:
names are idempotent). MQTT 3.1.1 has no shared subscriptions: the plain filter.

Invariants:

* **Ack means landed.** QoS 1 messages are acknowledged (paho ``manual_ack``) only after the landing write
  returned, that is after the segment is durable and visible. A write that fails is not acknowledged: the
  receiver drops its connection so that the broker redelivers the message on the persistent session
  (``clean_start=False``, a session expiry interval), to this receiver or another one of the group.
* **Idempotent names.** A payload's name is the ``segment`` MQTT 5 user property when the sender gives one (it is
  the ``SegmentName`` path); otherwise ``received/{sha256 of the payload}.jsonl.gz``, which is what the hub's
  MQTT upstream gets (it sends no such property; its segments are byte-for-byte the same when a batch is sent
  again). A redelivered message so lands on the file it already wrote, and the landing zone keeps one copy.
* **Nothing dropped silently, nothing poisons the job.** A payload that is not a whole gzip stream (not gzip, cut
  short, a CRC that does not match: it is decompressed once to check) cannot be a segment, so it lands under
  ``rejected/{sha256}.bin`` (outside the job's ``*.jsonl.gz`` filter), is counted and logged, and is
  acknowledged: a redelivery would bring the same bytes.
* **zstd segments land as gzip.** The hub's MQTT transport may compress with zstd (``compression: zstd``); the
  landing zone and the Spark job know gzip only, so such a segment is decompressed and compressed again as gzip
  before it lands (with the ``zstandard`` package installed; without it, it is set aside as above). So the Spark
  job never needs a dictionary: what it reads was decoded here.
* **Dictionaries are kept, and a segment never waits silently for one.** A payload in the zstd dictionary format
  (the hub sends each trained dictionary once, before the first segment that uses it) lands at
  ``dictionaries/{id:010d}.zdict`` and is kept there for every receiver of the group. A segment compressed with
  a dictionary is decoded with it (from memory, else from the landing zone). One whose dictionary this landing
  zone does not hold (not arrived yet on another receiver, or lost) is **quarantined**: its bytes land under
  ``quarantine/missing-dictionary/{id:010d}/{sha256}.zst`` (outside the job's filter), it is counted, logged as
  ``receiver.quarantined reason=unknown_dictionary dict_id=...`` and acknowledged; when that dictionary arrives,
  every segment quarantined for it is decoded and landed, and its quarantined copy removed. A second dictionary
  with an id already kept but other bytes is set aside under ``rejected/`` and logged (ids are 32-bit hashes of
  the content: a clash is possible, not expected).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib
import io
import logging
import re
import socket
import sys
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edgehub.core import TransportError
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import (
    SEGMENT_SUFFIX,
    Codec,
    SegmentFormatError,
    UnknownDictionaryError,
    dictionary_id,
    dictionary_path,
    segment_codec,
    zstd_plain_bytes,
)

__all__ = [
    "DEFAULT_TOPIC",
    "LandedDictionaries",
    "Received",
    "Receiver",
    "ReceiverSettings",
    "as_landing_bytes",
    "dictionary_path",
    "gzip_problem",
    "landing_path_for",
    "main",
    "quarantine_folder",
]

_log = logging.getLogger(__name__)
_GZIP_MAGIC = b"\x1f\x8b"
_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E  # MQTT 5 SUBACK reason code
# A SegmentName path: hub/lane/pNN/first-last.jsonl.gz
_SEGMENT_PATH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*/[A-Za-z0-9][A-Za-z0-9_\-]*/p\d{2}/\d{20}-\d{20}\.jsonl\.gz$")


DEFAULT_TOPIC = "edgehub/segments/#"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiverSettings:
    """Where to subscribe and where to land. ``broker`` is ``mqtt://host:port``; ``topic`` a filter matching the
    hub's ``batch_topic``."""

    broker: str
    landing: str
    topic: str = DEFAULT_TOPIC
    group: str = "edgehub-ingest"
    client_id: str = "edgehub-landing-receiver"
    mqtt_version: str = "5"
    session_expiry_s: int = 3600
    keepalive_s: int = 30

    def __post_init__(self) -> None:
        if self.mqtt_version not in ("5", "3.1.1"):
            raise ValueError(f"mqtt_version must be 5 or 3.1.1, not {self.mqtt_version!r}")
        url = urlsplit(self.broker)
        if url.scheme not in ("mqtt", "tcp") or not url.hostname:
            raise ValueError(f"broker must look like mqtt://host:port, not {self.broker!r}")


@dataclass(frozen=True, slots=True)
class Received:
    """What happened to one delivered message (handed to the ``on_landed`` hook after the ack, or failure)."""

    topic: str
    path: str
    outcome: str  # "written", "already_present", "rejected", or "failed"
    acked: bool


def gzip_problem(payload: bytes) -> str | None:
    """None when ``payload`` is a whole gzip stream (every member's deflate data, CRC-32 and length check out),
    else what is wrong. Read in chunks, so a large payload is never held decompressed."""
    if not payload.startswith(_GZIP_MAGIC):
        return "not gzip"
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(payload)) as stream:
            while stream.read(1 << 16):
                pass
    except (OSError, EOFError, zlib.error) as exc:
        return f"broken gzip stream: {exc}"
    return None


def as_landing_bytes(payload: bytes, dictionaries: Mapping[int, bytes] | None = None) -> bytes:
    """The bytes to land for ``payload``: a zstd segment (the MQTT transport's optional codec, with or without a
    dictionary from ``dictionaries``) decompressed and compressed again as gzip, the landing zone's one codec
    (``mtime=0``, so the same segment always gives the same bytes and a resend lands once); anything else
    unchanged. Without the ``zstandard`` package, or when the frame does not decompress, the payload is returned
    as it came and is set aside as not gzip. ``UnknownDictionaryError`` when its dictionary is not in
    ``dictionaries``."""
    if segment_codec(payload) is not Codec.ZSTD:
        return payload
    try:
        raw = zstd_plain_bytes(payload, dictionaries)  # UnknownDictionaryError goes to the caller
    except UnknownDictionaryError:
        raise
    except SegmentFormatError as exc:
        _log.warning("receiver.zstd_undecodable bytes=%d error=%s; set aside", len(payload), exc)
        return payload
    return gzip.compress(raw, mtime=0)


def quarantine_folder(dict_id: int) -> str:
    """Where segments wait for dictionary ``dict_id``."""
    return f"quarantine/missing-dictionary/{dict_id:010d}"


class LandedDictionaries(Mapping[int, bytes]):
    """The dictionaries of a landing zone by id: those seen here, and any other receiver landed (read on a miss).
    Not thread-safe on its own: the receiver uses it from paho's thread only."""

    def __init__(self, zone: LandingZone) -> None:
        self._zone = zone
        self._known: dict[int, bytes] = {}

    def __getitem__(self, dict_id: int) -> bytes:
        data = self._known.get(dict_id)
        if data is None:
            data = self._zone.read_path(dictionary_path(dict_id))
            if data is None:
                raise KeyError(dict_id)
            self._known[dict_id] = data
        return data

    def __iter__(self) -> Iterator[int]:
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)

    def remember(self, dict_id: int, data: bytes) -> None:
        self._known[dict_id] = data


def _valid_dictionary(data: bytes) -> bool:
    try:
        zstandard: Any = importlib.import_module("zstandard")
        zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_FULLDICT).precompute_compress(level=1)
    except Exception:  # no zstandard, or not a dictionary it can load
        return False
    return True


def landing_path_for(payload: bytes, segment_property: str | None) -> tuple[str, bool]:
    """The landing path of a payload and whether it is a segment at all (a whole gzip stream)."""
    digest = hashlib.sha256(payload).hexdigest()
    if gzip_problem(payload) is not None:
        return f"rejected/{digest}.bin", False
    if segment_property is not None and _SEGMENT_PATH.match(segment_property):
        return segment_property, True
    return f"received/{digest}{SEGMENT_SUFFIX}", True


class Receiver:
    """One paho client that lands what it receives; ``start``/``stop`` run its network loop in a thread."""

    def __init__(self, settings: ReceiverSettings, *, on_landed: Callable[[Received], None] | None = None) -> None:
        self.settings = settings
        self._zone = LandingZone(settings.landing)
        self._dictionaries = LandedDictionaries(self._zone)
        self._on_landed = on_landed
        self._v5 = settings.mqtt_version == "5"
        self._shared = self._v5  # until the broker says it has no shared subscriptions
        self.subscribed = threading.Event()
        self.landed_count = 0
        self.rejected_count = 0
        self.failed_count = 0
        self.quarantined_count = 0
        self.dictionaries_count = 0
        client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=settings.client_id,
            protocol=mqtt.MQTTv5 if self._v5 else mqtt.MQTTv311,
            clean_session=None if self._v5 else False,
            manual_ack=True,
        )
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        self._client = client

    @property
    def subscription(self) -> str:
        """The filter this receiver subscribes with: shared under MQTT 5 unless the broker said it cannot."""
        return f"$share/{self.settings.group}/{self.settings.topic}" if self._shared else self.settings.topic

    def _fall_back_to_plain_topic(self, why: str) -> None:
        self._shared = False
        _log.warning(
            "receiver.shared_subscription_unavailable broker=%s why=%s topic=%s; every receiver gets every message",
            self.settings.broker,
            why,
            self.settings.topic,
        )

    def start(self) -> None:
        url = urlsplit(self.settings.broker)
        if self._v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = self.settings.session_expiry_s
            self._client.connect(
                url.hostname or "127.0.0.1",
                url.port or 1883,
                keepalive=self.settings.keepalive_s,
                clean_start=False,
                properties=props,
            )
        else:
            self._client.connect(url.hostname or "127.0.0.1", url.port or 1883, keepalive=self.settings.keepalive_s)
        self._client.loop_start()

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            _log.warning("receiver.connect_refused broker=%s reason=%s", self.settings.broker, reason_code)
            return
        _log.info("receiver.connected broker=%s session_present=%s", self.settings.broker, flags.session_present)
        # MQTT 5 CONNACK property 42: absent means available, 0 means the broker has none.
        if self._shared and getattr(properties, "SharedSubscriptionAvailable", 1) == 0:
            self._fall_back_to_plain_topic("connack")
        client.subscribe(self.subscription, qos=1)

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: object,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        if self._shared and any(rc.value == _SHARED_SUBSCRIPTIONS_NOT_SUPPORTED for rc in reason_codes):
            self._fall_back_to_plain_topic("suback 0x9E")
            client.subscribe(self.subscription, qos=1)
            return
        if any(rc.is_failure for rc in reason_codes):
            _log.warning("receiver.subscribe_refused topic=%s reasons=%s", self.subscription, reason_codes)
            return
        _log.info("receiver.subscribed topic=%s", self.subscription)
        self.subscribed.set()

    def _segment_property(self, message: mqtt.MQTTMessage) -> str | None:
        props = getattr(message, "properties", None)
        for key, value in getattr(props, "UserProperty", None) or []:
            if key == "segment":
                return str(value)
        return None

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        raw = bytes(message.payload)
        path = ""
        try:
            dict_id = dictionary_id(raw)
            if dict_id is not None:
                path, outcome = self._land_dictionary(raw, dict_id)
                self._ack(client, message, path, outcome)
                return
            try:
                payload = as_landing_bytes(raw, self._dictionaries)
            except UnknownDictionaryError as exc:
                path = f"{quarantine_folder(exc.dict_id)}/{hashlib.sha256(raw).hexdigest()}.zst"
                self._zone.write_path(path, raw)
                self.quarantined_count += 1
                _log.warning(
                    "receiver.quarantined reason=unknown_dictionary dict_id=%d topic=%s path=%s bytes=%d",
                    exc.dict_id,
                    message.topic,
                    path,
                    len(raw),
                )
                # Another receiver may have kept the dictionary (and released its quarantine) in between.
                outcome = "quarantined"
                if self._zone.read_path(dictionary_path(exc.dict_id)) is not None:
                    path, outcome = self._release(path) or path, "written"
                self._ack(client, message, path, outcome)
                return
            path, is_segment = landing_path_for(payload, self._segment_property(message))
            outcome = str(self._zone.write_path(path, payload))
        except TransportError as exc:
            self.failed_count += 1
            _log.warning(
                "receiver.land_failed topic=%s path=%s kind=%s error=%s; not acked, reconnecting for redelivery",
                message.topic,
                path,
                exc.kind,
                exc,
            )
            self._report(Received(topic=message.topic, path=path, outcome="failed", acked=False))
            # Without an ack the broker resends only on a new connection. Cutting the socket (not disconnect(),
            # which would end paho's loop) makes paho reconnect, paced by reconnect_delay_set.
            sock = client.socket()
            if isinstance(sock, socket.socket):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            return
        if not is_segment:
            self.rejected_count += 1
            outcome = "rejected"
            _log.warning(
                "receiver.not_a_segment topic=%s path=%s bytes=%d problem=%s",
                message.topic,
                path,
                len(payload),
                gzip_problem(payload),
            )
        else:
            self.landed_count += 1
        self._ack(client, message, path, outcome)

    def _ack(self, client: mqtt.Client, message: mqtt.MQTTMessage, path: str, outcome: str) -> None:
        if message.qos > 0:
            client.ack(message.mid, message.qos)
        self._report(Received(topic=message.topic, path=path, outcome=outcome, acked=message.qos > 0))

    def _land_dictionary(self, data: bytes, dict_id: int) -> tuple[str, str]:
        """Keep dictionary ``dict_id``, then land what was quarantined waiting for it. Returns (path, outcome)."""
        digest = hashlib.sha256(data).hexdigest()
        if not _valid_dictionary(data):
            self.rejected_count += 1
            path = f"rejected/{digest}.bin"
            self._zone.write_path(path, data)
            _log.warning("receiver.not_a_dictionary dict_id=%d path=%s bytes=%d", dict_id, path, len(data))
            return path, "rejected"
        path = dictionary_path(dict_id)
        kept = self._zone.read_path(path)
        if kept is not None and kept != data:
            self.rejected_count += 1
            other = f"rejected/{digest}.zdict"
            self._zone.write_path(other, data)
            _log.warning("receiver.dictionary_clash dict_id=%d kept=%s set_aside=%s", dict_id, path, other)
            return other, "rejected"
        outcome = str(self._zone.write_path(path, data)) if kept is None else "already_present"
        self._dictionaries.remember(dict_id, data)
        self.dictionaries_count += 1
        _log.info("receiver.dictionary_kept dict_id=%d path=%s bytes=%d", dict_id, path, len(data))
        for waiting in self._zone.list_paths(quarantine_folder(dict_id)):
            self._release(waiting)
        return path, outcome

    def _release(self, quarantined: str) -> str | None:
        """Land a segment that waited in quarantine for its dictionary, then remove its quarantined copy; returns
        where it landed (None: someone else released it first)."""
        raw = self._zone.read_path(quarantined)
        if raw is None:
            return None
        payload = as_landing_bytes(raw, self._dictionaries)
        path, _ = landing_path_for(payload, None)
        self._zone.write_path(path, payload)
        self._zone.remove_path(quarantined)
        self.quarantined_count -= 1
        self.landed_count += 1
        _log.info("receiver.released path=%s from=%s", path, quarantined)
        return path

    def _report(self, received: Received) -> None:
        if self._on_landed is not None:
            self._on_landed(received)


def _parse(argv: Sequence[str]) -> ReceiverSettings:
    p = argparse.ArgumentParser(prog="python -m spark_upload.receiver", description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True, help="mqtt://host:port")
    p.add_argument(
        "--topic", default=DEFAULT_TOPIC, help=f"filter matching the hubs' batch topic (default {DEFAULT_TOPIC})"
    )
    p.add_argument("--landing", required=True, help="landing zone folder or fsspec URL")
    p.add_argument("--group", default="edgehub-ingest", help="shared subscription group (MQTT 5)")
    p.add_argument("--client-id", default="edgehub-landing-receiver")
    p.add_argument("--mqtt-version", choices=("5", "3.1.1"), default="5")
    ns = p.parse_args(list(argv))
    return ReceiverSettings(
        broker=ns.broker,
        topic=ns.topic,
        landing=ns.landing,
        group=ns.group,
        client_id=ns.client_id,
        mqtt_version=ns.mqtt_version,
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    receiver = Receiver(settings)
    receiver.start()
    stop = threading.Event()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
