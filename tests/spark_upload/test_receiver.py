from __future__ import annotations

import gzip
import hashlib
import queue
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from edgehub.upstream.segment import (
    Codec,
    SegmentName,
    SegmentRecord,
    decode_segment,
    dictionary_id,
    encode_segment,
    segment_codec,
)
from spark_upload.receiver import (
    Received,
    Receiver,
    ReceiverSettings,
    as_landing_bytes,
    dictionary_path,
    gzip_problem,
    landing_path_for,
    quarantine_folder,
)

pytestmark = pytest.mark.interop

TOPIC = "edgehub/segments/hub1/upstream/p00"  # what the hub's MQTT upstream publishes on


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    """Debian's mosquitto on 127.0.0.1 and a free port; yields its URL once it logs that it runs."""
    port = _free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\nlog_type all\n"
    )
    proc = subprocess.Popen(
        [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if " running" in line:
                break
        else:
            raise AssertionError(f"mosquitto exited with {proc.wait()}")
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def _segment(first: int, last: int) -> tuple[SegmentName, bytes]:
    records = [
        SegmentRecord(
            edge_message_id=f"e-{i}",
            hub_id="hub1",
            enqueued_at="2026-11-22T21:33:06.123Z",
            priority=0,
            ttl_s=60,
            source="/messages/events",
            body=b'{"t": 1}',
        )
        for i in range(first, last + 1)
    ]
    return SegmentName("hub1", "upstream", 0, first, last), encode_segment(records)


def _publish(broker: str, payload: bytes, tmp_path: Path, *, segment: str | None = None) -> None:
    """Publish with mosquitto_pub (a foreign client), QoS 1, MQTT 5."""
    port = broker.rsplit(":", 1)[1]
    src = tmp_path / f"payload-{hashlib.sha256(payload).hexdigest()}"
    src.write_bytes(payload)
    cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-V", "mqttv5", "-q", "1", "-t", TOPIC, "-f", str(src)]
    if segment is not None:
        cmd += ["-D", "publish", "user-property", "segment", segment]
    subprocess.run(cmd, check=True, timeout=10)


def _receiver(
    broker: str, landing: Path, reports: queue.Queue[Received], *, client_id: str = "edgehub-landing-receiver"
) -> Receiver:
    settings = ReceiverSettings(broker=broker, landing=str(landing), client_id=client_id)  # the default topic
    receiver = Receiver(settings, on_landed=reports.put)
    receiver.start()
    assert receiver.subscribed.wait(timeout=10)
    return receiver


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_received_segments_land_with_the_same_bytes_under_their_segment_name(broker: str, tmp_path: Path) -> None:
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, tmp_path / "landing", reports)
    try:
        name, data = _segment(0, 9)
        _publish(broker, data, tmp_path, segment=name.path)
        got = reports.get(timeout=10)
        assert (got.path, got.outcome, got.acked) == (name.path, "written", True)
        assert (tmp_path / "landing" / name.path).read_bytes() == data

        _, unnamed = _segment(10, 19)  # a sender that gives no name: content-addressed
        _publish(broker, unnamed, tmp_path)
        got = reports.get(timeout=10)
        assert got.path == f"received/{hashlib.sha256(unnamed).hexdigest()}.jsonl.gz"
        assert decode_segment((tmp_path / "landing" / got.path).read_bytes())[0].edge_message_id == "e-10"
    finally:
        receiver.stop()


def test_a_segment_received_twice_lands_once(broker: str, tmp_path: Path) -> None:
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, tmp_path / "landing", reports)
    try:
        name, data = _segment(0, 4)
        _publish(broker, data, tmp_path, segment=name.path)
        _publish(broker, data, tmp_path, segment=name.path)
        outcomes = [reports.get(timeout=10).outcome for _ in range(2)]
        assert outcomes == ["written", "already_present"]
        assert _files(tmp_path / "landing") == [name.path]
    finally:
        receiver.stop()


def test_a_payload_that_is_not_a_segment_is_set_aside_outside_the_jobs_filter(broker: str, tmp_path: Path) -> None:
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, tmp_path / "landing", reports)
    try:
        _publish(broker, b"plain text, not gzip", tmp_path, segment="../../etc/evil.jsonl.gz")
        got = reports.get(timeout=10)
        assert got.outcome == "rejected"
        assert got.acked
        assert _files(tmp_path / "landing") == [f"rejected/{hashlib.sha256(b'plain text, not gzip').hexdigest()}.bin"]
        assert receiver.rejected_count == 1
    finally:
        receiver.stop()


def test_a_gzip_payload_cut_short_or_with_a_bad_crc_is_set_aside_and_acked(broker: str, tmp_path: Path) -> None:
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, tmp_path / "landing", reports)
    name, data = _segment(0, 99)
    cut = data[: len(data) // 2]
    bad_crc = data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]
    try:
        for payload in (cut, bad_crc):
            _publish(broker, payload, tmp_path, segment=name.path)
            got = reports.get(timeout=10)
            assert (got.path, got.outcome, got.acked) == (
                f"rejected/{hashlib.sha256(payload).hexdigest()}.bin",
                "rejected",
                True,
            )
        assert receiver.rejected_count == 2
        assert receiver.landed_count == 0
        assert not (tmp_path / "landing" / name.path).exists()
        assert (tmp_path / "landing" / got.path).read_bytes() == bad_crc
    finally:
        receiver.stop()


def test_a_message_that_could_not_land_is_not_acked_and_is_redelivered_to_the_next_receiver(
    broker: str, tmp_path: Path
) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_bytes(b"a file where the landing folder should be")
    reports: queue.Queue[Received] = queue.Queue()
    failing = _receiver(broker, blocked, reports, client_id="ingest-1")
    name, data = _segment(0, 2)
    try:
        _publish(broker, data, tmp_path, segment=name.path)
        got = reports.get(timeout=10)
        assert (got.outcome, got.acked) == ("failed", False)
    finally:
        failing.stop()

    healthy_reports: queue.Queue[Received] = queue.Queue()
    healthy = _receiver(broker, tmp_path / "landing", healthy_reports, client_id="ingest-1")
    try:
        got = healthy_reports.get(timeout=20)
        assert (got.path, got.outcome, got.acked) == (name.path, "written", True)
        assert (tmp_path / "landing" / name.path).read_bytes() == data
    finally:
        healthy.stop()


def test_receivers_of_one_shared_group_split_the_batches_and_each_lands_once(broker: str, tmp_path: Path) -> None:
    reports: queue.Queue[Received] = queue.Queue()
    receivers = [_receiver(broker, tmp_path / "landing", reports, client_id=f"ingest-{i}") for i in range(2)]
    try:
        names = []
        for k in range(6):
            name, data = _segment(k * 10, k * 10 + 9)
            names.append(name.path)
            _publish(broker, data, tmp_path, segment=name.path)
        got = [reports.get(timeout=10) for _ in range(6)]
        assert sorted(r.path for r in got) == sorted(names)
        assert _files(tmp_path / "landing") == sorted(names)
        assert all(r.landed_count > 0 for r in receivers)
        assert reports.empty()
    finally:
        for r in receivers:
            r.stop()


def test_a_segment_property_that_is_not_a_segment_name_falls_back_to_the_content_hash() -> None:
    payload = gzip.compress(b"{}\n", mtime=0)
    assert landing_path_for(payload, None) == (f"received/{hashlib.sha256(payload).hexdigest()}.jsonl.gz", True)
    assert landing_path_for(payload, "hub1/upstream/p00/x.jsonl.gz")[0].startswith("received/")


# --- a scripted MQTT 5 broker that has no shared subscriptions ---------------------------------------------------
#
# Mosquitto supports shared subscriptions and cannot be told not to, so the fallback is checked against a peer on a
# real socket that answers the receiver packet by packet, built byte for byte.


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + _varint(len(body)) + body


def _connack(properties: bytes = b"") -> bytes:
    return _packet(0x20, bytes([0, 0]) + _varint(len(properties)) + properties)


def _suback(packet_id: int, reason: int) -> bytes:
    return _packet(0x90, packet_id.to_bytes(2, "big") + b"\x00" + bytes([reason]))


def _publish_qos1(topic: str, packet_id: int, payload: bytes) -> bytes:
    name = topic.encode()
    return _packet(0x32, len(name).to_bytes(2, "big") + name + packet_id.to_bytes(2, "big") + b"\x00" + payload)


class _ScriptedBroker:
    """Accepts one client on 127.0.0.1 and lets the test read and write whole MQTT packets, each under a timeout."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(10)
        self.url = f"mqtt://127.0.0.1:{self.server.getsockname()[1]}"
        self.conn: socket.socket | None = None

    def accept(self) -> None:
        self.conn, _ = self.server.accept()
        self.conn.settimeout(10)

    def _exactly(self, n: int) -> bytes:
        assert self.conn is not None
        data = b""
        while len(data) < n:
            chunk = self.conn.recv(n - len(data))
            assert chunk, "the receiver closed the connection"
            data += chunk
        return data

    def read(self) -> tuple[int, bytes]:
        """The next packet's type nibble and its body."""
        first = self._exactly(1)[0]
        length, shift = 0, 0
        while True:
            byte = self._exactly(1)[0]
            length += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        return first >> 4, self._exactly(length)

    def read_subscribe(self) -> tuple[int, str]:
        kind, body = self.read()
        assert kind == 8  # SUBSCRIBE
        packet_id = int.from_bytes(body[:2], "big")
        props_len = body[2]  # the receiver sends no SUBSCRIBE properties: one length byte
        rest = body[3 + props_len :]
        size = int.from_bytes(rest[:2], "big")
        return packet_id, rest[2 : 2 + size].decode()

    def send(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


@pytest.fixture
def scripted_broker() -> Iterator[_ScriptedBroker]:
    peer = _ScriptedBroker()
    try:
        yield peer
    finally:
        peer.close()


def _connected_receiver(peer: _ScriptedBroker, tmp_path: Path) -> tuple[Receiver, queue.Queue[Received]]:
    """A started receiver whose CONNECT the scripted broker has read (the CONNACK is the test's to send)."""
    reports: queue.Queue[Received] = queue.Queue()
    receiver = Receiver(ReceiverSettings(broker=peer.url, landing=str(tmp_path / "landing")), on_landed=reports.put)
    receiver.start()
    try:
        peer.accept()
        assert peer.read()[0] == 1  # CONNECT
    except BaseException:
        receiver.stop()
        raise
    return receiver, reports


def _land_one_segment_through(peer: _ScriptedBroker, receiver: Receiver, reports: queue.Queue[Received]) -> None:
    assert receiver.subscribed.wait(timeout=10)
    _, data = _segment(0, 4)
    peer.send(_publish_qos1(TOPIC, 7, data))
    got = reports.get(timeout=10)
    assert (got.outcome, got.acked) == ("written", True)
    kind, body = peer.read()
    assert (kind, body[:2]) == (4, (7).to_bytes(2, "big"))  # PUBACK for packet 7, after the landing write


def test_a_broker_without_shared_subscriptions_in_its_connack_gets_the_plain_topic(
    scripted_broker: _ScriptedBroker, tmp_path: Path
) -> None:
    receiver, reports = _connected_receiver(scripted_broker, tmp_path)
    try:
        scripted_broker.send(_connack(properties=bytes([0x2A, 0])))  # SharedSubscriptionAvailable = 0
        packet_id, topic = scripted_broker.read_subscribe()
        assert topic == "edgehub/segments/#"
        scripted_broker.send(_suback(packet_id, 0x01))
        _land_one_segment_through(scripted_broker, receiver, reports)
        assert receiver.subscription == "edgehub/segments/#"
    finally:
        receiver.stop()


def test_a_shared_subscription_refused_with_0x9e_is_retried_as_the_plain_topic(
    scripted_broker: _ScriptedBroker, tmp_path: Path
) -> None:
    receiver, reports = _connected_receiver(scripted_broker, tmp_path)
    try:
        scripted_broker.send(_connack())  # says nothing about shared subscriptions: available, by the spec
        packet_id, topic = scripted_broker.read_subscribe()
        assert topic == "$share/edgehub-ingest/edgehub/segments/#"
        scripted_broker.send(_suback(packet_id, 0x9E))
        packet_id, topic = scripted_broker.read_subscribe()
        assert topic == "edgehub/segments/#"
        assert not receiver.subscribed.is_set()
        scripted_broker.send(_suback(packet_id, 0x01))
        _land_one_segment_through(scripted_broker, receiver, reports)
    finally:
        receiver.stop()


def test_a_zstd_segment_lands_as_gzip_with_the_same_records(broker: str, tmp_path: Path) -> None:
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, tmp_path / "landing", reports)
    try:
        name, gz = _segment(0, 9)
        zst = encode_segment(decode_segment(gz), codec=Codec.ZSTD)
        assert segment_codec(zst) is Codec.ZSTD
        _publish(broker, zst, tmp_path, segment=name.path)
        got = reports.get(timeout=10)
        assert (got.path, got.outcome, got.acked) == (name.path, "written", True)
        landed = (tmp_path / "landing" / name.path).read_bytes()
        assert gzip_problem(landed) is None  # what the job's gzip text source reads
        assert decode_segment(landed) == decode_segment(gz)
        # The same zstd bytes again (a resend) land on the same bytes: once.
        _publish(broker, zst, tmp_path)
        again = reports.get(timeout=10)
        assert again.path == f"received/{hashlib.sha256(landed).hexdigest()}.jsonl.gz"
    finally:
        receiver.stop()


def test_a_zstd_frame_that_does_not_decompress_is_set_aside() -> None:
    broken = b"\x28\xb5\x2f\xfd" + b"not a zstd frame"
    assert as_landing_bytes(broken) == broken
    path, is_segment = landing_path_for(broken, "hub1/upstream/p0/x.jsonl.gz")
    assert (path.startswith("rejected/"), is_segment) == (True, False)


def _dictionary_and_segment(first: int, last: int) -> tuple[int, bytes, bytes, list[SegmentRecord]]:
    """A trained dictionary (its id and bytes) and a segment of records first..last compressed with it."""
    _, gz = _segment(0, 400)
    sample = [line for line in gzip.decompress(gz).split(b"\n") if line]
    dictionary: bytes = zstandard.train_dictionary(1024, list[bytes | bytearray | memoryview](sample)).as_bytes()
    dict_id = dictionary_id(dictionary)
    assert dict_id is not None
    records = decode_segment(_segment(first, last)[1])
    return dict_id, dictionary, encode_segment(records, codec=Codec.ZSTD, dictionary=dictionary), records


def test_a_dictionary_is_kept_and_segments_compressed_with_it_land_as_gzip(broker: str, tmp_path: Path) -> None:
    dict_id, dictionary, zst, records = _dictionary_and_segment(0, 9)
    landing = tmp_path / "landing"
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, landing, reports)
    try:
        _publish(broker, dictionary, tmp_path)
        kept = reports.get(timeout=10)
        assert (kept.path, kept.outcome, kept.acked) == (dictionary_path(dict_id), "written", True)
        _publish(broker, zst, tmp_path)
        got = reports.get(timeout=10)
        assert got.outcome == "written"
        assert decode_segment((landing / got.path).read_bytes()) == records
    finally:
        receiver.stop()
    # The receiver again, restarted: it finds the dictionary in the landing zone.
    later_records = decode_segment(_segment(10, 19)[1])
    later = encode_segment(later_records, codec=Codec.ZSTD, dictionary=dictionary)
    receiver = _receiver(broker, landing, reports)
    try:
        _publish(broker, later, tmp_path)
        got = reports.get(timeout=10)
        assert got.outcome == "written"
        assert decode_segment((landing / got.path).read_bytes()) == later_records
    finally:
        receiver.stop()


def test_a_segment_whose_dictionary_is_unknown_is_quarantined_then_lands_when_the_dictionary_comes(
    broker: str, tmp_path: Path
) -> None:
    dict_id, dictionary, zst, records = _dictionary_and_segment(0, 9)
    landing = tmp_path / "landing"
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, landing, reports)
    try:
        _publish(broker, zst, tmp_path)
        held = reports.get(timeout=10)
        assert (held.outcome, held.acked) == ("quarantined", True)
        assert held.path.startswith(f"{quarantine_folder(dict_id)}/")
        assert (landing / held.path).read_bytes() == zst  # kept as it came: nothing lost
        assert not list(landing.rglob("*.jsonl.gz"))  # and nothing the job would read
        assert receiver.quarantined_count == 1
        _publish(broker, dictionary, tmp_path)
        assert reports.get(timeout=10).path == dictionary_path(dict_id)
        (segment,) = landing.rglob("*.jsonl.gz")
        assert decode_segment(segment.read_bytes()) == records
        assert not (landing / held.path).exists()
        assert receiver.quarantined_count == 0
    finally:
        receiver.stop()


def test_a_dictionary_clashing_with_a_kept_one_is_set_aside(broker: str, tmp_path: Path) -> None:
    dict_id, dictionary, _, _ = _dictionary_and_segment(0, 9)
    landing = tmp_path / "landing"
    (landing / "dictionaries").mkdir(parents=True)
    other = dictionary[:-1] + bytes([dictionary[-1] ^ 1])  # same id, other bytes
    (landing / dictionary_path(dict_id)).write_bytes(other)
    reports: queue.Queue[Received] = queue.Queue()
    receiver = _receiver(broker, landing, reports)
    try:
        _publish(broker, dictionary, tmp_path)
        got = reports.get(timeout=10)
        assert (got.outcome, got.path.startswith("rejected/")) == ("rejected", True)
        assert (landing / dictionary_path(dict_id)).read_bytes() == other
    finally:
        receiver.stop()
