"""``edgehub run --upstream-upload`` as users run it: a paho device's telemetry routed to ``$upstream`` lands as
segment files in a folder, every message once with its priority, body and properties; with partitions, each
lane writes its own files."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from edgehub.core.sas import ConnectionString
from edgehub.hub.lanes import stable_partition
from edgehub.upstream.segment import (
    DICTIONARY_FOLDER,
    ZSTD_SEGMENT_SUFFIX,
    SegmentRecord,
    decode_segment,
    dictionary_id,
    dictionary_path,
    segment_dictionary_id,
)
from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

MANIFEST = {
    "schemaVersion": "1.1",
    "routes": {
        "alerts": {"route": "FROM /messages/* WHERE kind = 'alert' INTO $upstream", "priority": 0},
        "telemetry": {"route": "FROM /messages/* WHERE kind = 'telemetry' INTO $upstream", "priority": 5},
    },
}


def read_landing(root: Path) -> dict[str, list[SegmentRecord]]:
    """The segment files under ``root``: path relative to it -> records. Files appear whole (written under a
    temp name, then linked), so a file seen is a file complete."""
    files = sorted(root.rglob("*.jsonl.gz")) if root.exists() else []
    return {str(p.relative_to(root)): decode_segment(p.read_bytes()) for p in files}


async def landed(root: Path, count: int) -> dict[str, list[SegmentRecord]]:
    """``read_landing(root)`` once the files hold ``count`` records."""
    async with asyncio.timeout(30):
        while True:
            segments = read_landing(root)
            if sum(len(rs) for rs in segments.values()) >= count:
                return segments
            await asyncio.sleep(0.05)  # polling a folder: there is no event to wait on


async def connect_device(port: int, data: Path, cs: ConnectionString) -> Paho:
    dev = Paho.make("dev1")
    user = f"{cs.host_name}/dev1/?api-version=2021-04-12"
    rc = await dev.connect(
        port, tls_ca=data / "certs" / "ca.pem", user=user, password=cs.sas_token(int(time.time()) + 86_400)
    )
    assert rc == 0
    return dev


async def test_edgehub_run_lands_upstream_messages_as_segment_files_each_once_with_its_priority(
    tmp_path: Path,
) -> None:
    data, landing, manifest = tmp_path / "data", tmp_path / "landing", tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))
    cs = await identity_add(data, "dev1")
    url = landing.as_uri()  # file:///...
    proc, port, lines = await start(data, manifest, "--upstream-upload", url, "--upstream-client-id", "gw")
    assert f"upstream transport: upload to {url} hub=gw" in "\n".join(lines)
    dev = await connect_device(port, data, cs)
    sent = {}
    for n in range(30):
        kind = "alert" if n % 7 == 0 else "telemetry"
        body = json.dumps({"n": n, "t": 20.5 + n}).encode() if n % 2 else f"reading {n}".encode()
        mid = dev.publish(f"devices/dev1/messages/events/$.mid=m{n}&kind={kind}&n={n}", body)
        sent[f"m{n}"] = (kind, body)
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (mid, 0)  # acked: stored
    segments = await landed(landing, len(sent))
    await dev.close()
    assert (await stop(proc)).rstrip().endswith("stopped")

    records = [(path, r) for path, rs in segments.items() for r in rs]
    assert sorted(r.message_id or "" for _, r in records) == sorted(sent)  # every message, once
    for path, r in records:
        assert r.message_id is not None
        kind, body = sent[r.message_id]
        assert r.priority == (0 if kind == "alert" else 5)
        assert path.startswith(f"gw/upstream/p{r.priority:02d}/")
        assert r.body == body
        assert r.properties == {"kind": kind, "n": r.message_id[1:]}
        assert r.device_id == "dev1"
        assert r.hub_id == "gw"
    assert not [p for p in landing.rglob("*") if p.name.startswith(".")]  # no temp file left behind


async def test_edgehub_run_with_partitions_lands_each_session_in_its_own_lane(tmp_path: Path) -> None:
    data, landing, manifest = tmp_path / "data", tmp_path / "landing", tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))
    cs = await identity_add(data, "dev1")
    sessions = ["ship-1", "ship-2", "ship-5", "ship-8"]
    assert {stable_partition(s, 2) for s in sessions} == {0, 1}
    proc, port, lines = await start(
        data, manifest, "--upstream-upload", str(landing), "--upstream-partitions", "2", "--upstream-client-id", "gw"
    )
    assert "upstream: partitions=2 duplicate detection off" in lines
    dev = await connect_device(port, data, cs)
    for n in range(3):
        for s in sessions:
            mid = dev.publish(f"devices/dev1/messages/events/$.sid={s}&kind=telemetry", f"{s}:{n}".encode())
            async with asyncio.timeout(10):
                assert await dev.publishes.get() == (mid, 0)
    segments = await landed(landing, 12)
    await dev.close()
    await stop(proc)

    for s in sessions:
        lane = f"upstream-p{stable_partition(s, 2)}"
        mine = [(path, r) for path, rs in sorted(segments.items()) for r in rs if r.system_properties["sessionId"] == s]
        assert {path.split("/")[1] for path, _ in mine} == {lane}
        assert [r.body for _, r in mine] == [f"{s}:{n}".encode() for n in range(3)]  # in order, each once


def read_zstd_landing(root: Path) -> tuple[dict[str, list[SegmentRecord]], dict[int, bytes]]:
    """The zstd segment files under ``root``, each decoded with the dictionary its frame names from
    ``root/dictionaries/`` (a segment whose dictionary is not there fails the test), and those dictionaries."""
    dictionaries = {}
    for p in sorted((root / DICTIONARY_FOLDER).glob("*.zdict")) if root.exists() else []:
        dict_id = dictionary_id(p.read_bytes())
        assert dict_id is not None
        assert p.relative_to(root).as_posix() == dictionary_path(dict_id)
        dictionaries[dict_id] = p.read_bytes()
    files = sorted(root.rglob(f"*{ZSTD_SEGMENT_SUFFIX}")) if root.exists() else []
    return {str(p.relative_to(root)): decode_segment(p.read_bytes(), dictionaries) for p in files}, dictionaries


async def landed_zstd(root: Path, count: int) -> dict[str, list[SegmentRecord]]:
    async with asyncio.timeout(30):
        while True:
            segments, _ = read_zstd_landing(root)
            if len({r.message_id for rs in segments.values() for r in rs}) >= count:  # a resent batch counts once
                return segments
            await asyncio.sleep(0.05)  # polling a folder: there is no event to wait on


async def test_edgehub_run_with_zstd_trains_a_dictionary_lands_it_once_and_keeps_it_across_a_restart(
    tmp_path: Path,
) -> None:
    data, landing, manifest = tmp_path / "data", tmp_path / "landing", tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))
    cs = await identity_add(data, "dev1")
    args = ("--upstream-upload", str(landing), "--upstream-client-id", "gw", "--upstream-compression", "zstd")
    proc, port, lines = await start(data, manifest, *args)
    assert "(one zstd segment file per batch" in "\n".join(lines)
    dev = await connect_device(port, data, cs)

    sent: set[str] = set()

    async def send(first: int, count: int) -> None:
        for n in range(first, first + count):
            sent.add(f"m{n}")
            body = json.dumps({"pump": f"p{n % 5}", "n": n, "bar": 1 + n % 9 / 10, "status": "ok"}).encode()
            mid = dev.publish(f"devices/dev1/messages/events/$.mid=m{n}&kind=telemetry", body)
            async with asyncio.timeout(10):
                assert await dev.publishes.get() == (mid, 0)

    # A lane trains once its sample holds 100 lines; each batch gives it a few.
    await send(0, 150)
    await landed_zstd(landing, 150)
    more = 150
    async with asyncio.timeout(30):
        while not list((landing / DICTIONARY_FOLDER).glob("*.zdict")):  # lands before the next segment after training
            await send(more, 1)
            more += 1
    await send(1000, 20)
    await dev.close()
    assert (await stop(proc)).rstrip().endswith("stopped")
    segments, dictionaries = read_zstd_landing(landing)
    (dict_id,) = dictionaries
    users = [p for p in segments if segment_dictionary_id((landing / p).read_bytes()) == dict_id]
    assert users  # the segments after the dictionary landed use it

    # Restarted, the hub uses the dictionary its store kept: no new one, no second copy.
    proc, port, _ = await start(data, manifest, *args)
    dev = await connect_device(port, data, cs)
    await send(2000, 5)
    total = len(sent)
    after = await landed_zstd(landing, total)
    await dev.close()
    await stop(proc)
    new = [p for p in after if p not in segments]
    assert new
    assert {segment_dictionary_id((landing / p).read_bytes()) for p in new} == {dict_id}
    assert [p.name for p in (landing / DICTIONARY_FOLDER).iterdir()] == [dictionary_path(dict_id).split("/")[1]]
    # Every message, each under one edge id: a batch written just before the stop may be sent again after the
    # restart, cut differently (docs/segment-format.md, Names), and the cloud drops the copy by that id.
    edge_ids: dict[str, set[str]] = {}
    for rs in after.values():
        for r in rs:
            edge_ids.setdefault(r.message_id or "", set()).add(r.edge_message_id)
    assert set(edge_ids) == sent
    assert all(len(ids) == 1 for ids in edge_ids.values())
    assert not list(landing.rglob("*.jsonl.gz"))  # nothing went as gzip
