"""``edgehub run --upstream-upload s3://bucket/landing`` as a user runs it against an S3-compatible store: moto's S3
server on a loopback port, the hub pointed at it by the standard AWS variables alone (``AWS_ENDPOINT_URL_S3``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``), a paho device's telemetry read back from
the bucket and decoded, every message once: gzip, and zstd with the dictionary landed under ``dictionaries/``; over
HTTPS with a private CA once ``AWS_CA_BUNDLE`` names it. A bucket that is not there yet keeps every message in the
store, says why in one line, and delivers all of it once the bucket is made; a wrong secret does the same, and a
restart with the right one delivers all of it. No log line carries a traceback or a secret."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgehub.core.sas import ConnectionString
from edgehub.upstream.segment import (
    DICTIONARY_FOLDER,
    SEGMENT_SUFFIX,
    ZSTD_SEGMENT_SUFFIX,
    SegmentRecord,
    decode_segment,
    dictionary_id,
    dictionary_path,
    segment_dictionary_id,
)
from tests.e2e.hub_process import EDGEHUB, identity_add, start
from tests.e2e.test_upload_run_e2e import MANIFEST, connect_device
from tests.protocol_heads.mqtt.conftest import Paho
from tests.upstream.s3_server import S3Server, s3_server

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    with s3_server(tmp_path / "aws") as server:
        yield server


def bucket_of(tmp_path: Path) -> str:
    """A bucket name for this test alone (moto's buckets are the process's, and tests share it)."""
    return f"edgehub-{abs(hash(str(tmp_path))) % 10**12:012d}"


def read_bucket(s3: S3Server, root: str) -> tuple[dict[str, list[SegmentRecord]], dict[int, bytes]]:
    """The segment objects under ``root`` (``bucket/prefix``), each decoded with the dictionary its zstd frame names
    from ``root/dictionaries/`` (a segment whose dictionary is not there fails the test), and those dictionaries.
    Objects appear whole (written under a temp name, then moved), so an object listed is an object complete."""
    fs = s3.fs()
    if not fs.exists(root):
        return {}, {}
    # a name starting with "." is a write in progress (Spark's file sources skip them too)
    found = sorted(str(p) for p in fs.find(root) if not str(p).rsplit("/", 1)[-1].startswith("."))
    dictionaries = {}
    for path in found:
        if path.startswith(f"{root}/{DICTIONARY_FOLDER}/"):
            data = fs.cat_file(path)
            dict_id = dictionary_id(data)
            assert dict_id is not None
            assert path == f"{root}/{dictionary_path(dict_id)}"
            dictionaries[dict_id] = data
    segments = {
        path[len(root) + 1 :]: decode_segment(fs.cat_file(path), dictionaries)
        for path in found
        if path.endswith((SEGMENT_SUFFIX, ZSTD_SEGMENT_SUFFIX))
    }
    return segments, dictionaries


async def landed(s3: S3Server, root: str, message_ids: set[str]) -> dict[str, list[SegmentRecord]]:
    """``read_bucket`` once every one of ``message_ids`` is in it."""
    async with asyncio.timeout(60):
        while True:
            segments, _ = await asyncio.to_thread(read_bucket, s3, root)
            if message_ids <= {r.message_id for rs in segments.values() for r in rs}:
                return segments
            await asyncio.sleep(0.2)  # polling a bucket: there is no event to wait on


async def publish(dev: Paho, first: int, count: int, sent: dict[str, bytes]) -> None:
    """``count`` telemetry messages ``m{first}``..., each acknowledged (stored by the hub) before the next."""
    for n in range(first, first + count):
        body = json.dumps({"pump": f"p{n % 5}", "n": n, "bar": 1 + n % 9 / 10, "status": "ok"}).encode()
        kind = "alert" if n % 7 == 0 else "telemetry"
        mid = dev.publish(f"devices/dev1/messages/events/$.mid=m{n}&kind={kind}", body)
        sent[f"m{n}"] = body
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (mid, 0)


def once_each(segments: dict[str, list[SegmentRecord]], sent: dict[str, bytes]) -> None:
    """Every message sent is in ``segments`` under one edge message id, with its body, and nothing else is. A batch
    written just before a failure may be written again cut differently; the cloud drops that copy by edge id."""
    edge_ids: dict[str, set[str]] = {}
    for path, records in segments.items():
        for r in records:
            assert r.message_id in sent, r.message_id
            assert r.body == sent[r.message_id]
            assert path.startswith(f"gw/upstream/p{r.priority:02d}/")
            edge_ids.setdefault(r.message_id, set()).add(r.edge_message_id)
    assert set(edge_ids) == set(sent)
    assert all(len(ids) == 1 for ids in edge_ids.values())


@dataclass
class Hub:
    """A running ``edgehub run``: a device connected to it, the lines it printed as it started, and the log lines
    (JSON, one object each) it has written to stderr so far, read as they come so that the pipe never fills."""

    device: Paho
    started: list[str]
    logs: list[dict[str, Any]]
    device_string: ConnectionString  # the device's, to connect again after a restart


@asynccontextmanager
async def hub(
    tmp_path: Path,
    s3: S3Server,
    url: str,
    *extra: str,
    device: ConnectionString | None = None,
    manifest_doc: dict[str, Any] = MANIFEST,
    **env: str,
) -> AsyncIterator[Hub]:
    """``edgehub run --upstream-upload URL --upstream-client-id gw EXTRA`` in the environment of ``s3`` (``env``
    over it), logging JSON, a device connected to it (made first unless ``device`` is its connection string, from
    an earlier start on the same data); stopped when the block ends (SIGTERM, a clean exit)."""
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    manifest.write_text(json.dumps(manifest_doc))
    cs = device if device is not None else await identity_add(data, "dev1")
    args = ("--upstream-upload", url, "--upstream-client-id", "gw", "--log-format", "json", *extra)
    proc, port, lines = await start(data, manifest, *args, env=s3.environment(**env))
    logs: list[dict[str, Any]] = []

    async def read_logs() -> None:
        assert proc.stderr is not None
        async for line in proc.stderr:
            logs.append(json.loads(line))

    async with asyncio.TaskGroup() as tg:
        reader = tg.create_task(read_logs(), name="hub-stderr")
        dev = await connect_device(port, data, cs)
        try:
            yield Hub(dev, lines, logs, cs)
        finally:
            await dev.close()
            proc.send_signal(signal.SIGTERM)
            assert proc.stdout is not None
            async with asyncio.timeout(30):
                out = await proc.stdout.read()
                await proc.wait()
                await reader
    assert proc.returncode == 0
    assert out.decode().rstrip().endswith("stopped")


async def test_edgehub_run_lands_gzip_segments_in_an_s3_bucket_named_by_the_standard_aws_variables(
    tmp_path: Path, s3: S3Server
) -> None:
    bucket = bucket_of(tmp_path)
    s3.make_bucket(bucket)
    sent: dict[str, bytes] = {}
    async with hub(tmp_path, s3, f"s3://{bucket}/landing") as h:
        assert f"upstream transport: upload to s3://{bucket}/landing hub=gw (one gzip segment file" in "\n".join(
            h.started
        )
        region = "region eu-west-1 (AWS_DEFAULT_REGION)"
        assert f"upstream s3: endpoint {s3.endpoint_url} (AWS_ENDPOINT_URL_S3) {region}" in h.started
        await publish(h.device, 0, 30, sent)
        segments = await landed(s3, f"{bucket}/landing", set(sent))
    once_each(segments, sent)
    assert all(path.endswith(SEGMENT_SUFFIX) for path in segments)
    assert {path.split("/")[2] for path in segments} == {"p00", "p05"}
    assert not [p for p in s3.fs().find(bucket) if "/." in p]  # no temp object left behind


async def test_edgehub_run_with_zstd_lands_its_dictionary_under_dictionaries_and_segments_that_use_it(
    tmp_path: Path, s3: S3Server
) -> None:
    bucket = bucket_of(tmp_path)
    s3.make_bucket(bucket)
    root = f"{bucket}/landing"
    sent: dict[str, bytes] = {}
    async with hub(tmp_path, s3, f"s3://{root}", "--upstream-compression", "zstd") as h:
        assert "(one zstd segment file per batch" in "\n".join(h.started)
        # A lane trains once its sample holds 100 lines; each batch gives it a few.
        await publish(h.device, 0, 150, sent)
        await landed(s3, root, set(sent))
        more = 150
        async with asyncio.timeout(60):
            while not (await asyncio.to_thread(read_bucket, s3, root))[1]:  # lands before the next segment
                await publish(h.device, more, 1, sent)
                more += 1
        await publish(h.device, 1000, 20, sent)
        segments = await landed(s3, root, set(sent))
    segments, dictionaries = read_bucket(s3, root)
    once_each(segments, sent)
    (dict_id,) = dictionaries
    assert all(path.endswith(ZSTD_SEGMENT_SUFFIX) for path in segments)  # nothing went as gzip
    fs = s3.fs()
    users = [p for p in segments if segment_dictionary_id(fs.cat_file(f"{root}/{p}")) == dict_id]
    assert users  # the segments after the dictionary landed use it


async def test_a_missing_bucket_keeps_every_message_says_why_once_and_delivers_all_once_the_bucket_is_made(
    tmp_path: Path, s3: S3Server
) -> None:
    bucket = bucket_of(tmp_path)
    root = f"{bucket}/landing"
    sent: dict[str, bytes] = {}
    async with hub(tmp_path, s3, f"s3://{root}") as h:
        await publish(h.device, 0, 10, sent)  # acknowledged: in the store
        # The executor probes the zone about once a second: wait for four writes the server refused.
        async with asyncio.timeout(30):
            while s3.requests_matching("PUT", f"/{root}/") < 4:  # noqa: ASYNC110 (a server's log: no event)
                await asyncio.sleep(0.1)
        s3.make_bucket(bucket)
        await publish(h.device, 10, 10, sent)
        segments = await landed(s3, root, set(sent))
        async with asyncio.timeout(30):
            while not [d for d in h.logs if d["event"] == "upload.recovered"]:  # noqa: ASYNC110 (a pipe's lines)
                await asyncio.sleep(0.1)
    once_each(segments, sent)
    [failing] = [d for d in h.logs if d["event"] == "upload.failing"]  # one line for the whole outage
    assert (failing["level"], failing["reason"], failing["kind"]) == ("WARNING", "no_such_bucket", "transient")
    assert f"s3://{root}" in failing["message"]
    assert "make the bucket" in failing["message"]
    [recovered] = [d for d in h.logs if d["event"] == "upload.recovered"]
    assert int(recovered["failed_writes"]) >= 4
    assert not [d for d in h.logs if "exc" in d or "Traceback" in d["message"]]
    assert not [d for d in h.logs if s3.secret in json.dumps(d)]


async def test_a_wrong_secret_keeps_every_message_says_why_once_and_a_restart_with_the_right_one_delivers_all(
    tmp_path: Path, s3: S3Server
) -> None:
    bucket = bucket_of(tmp_path)
    root = f"{bucket}/landing"
    sent: dict[str, bytes] = {}
    with s3.checking_credentials() as user:
        user.make_bucket(bucket)
        wrong = "a-wrong-secret-never-logged"
        async with hub(tmp_path, user, f"s3://{root}", AWS_SECRET_ACCESS_KEY=wrong) as h:
            await publish(h.device, 0, 10, sent)  # acknowledged: in the store
            async with asyncio.timeout(30):
                while not [d for d in h.logs if d["event"] == "upload.failing"]:  # noqa: ASYNC110 (a pipe's lines)
                    await asyncio.sleep(0.1)
        [failing] = [d for d in h.logs if d["event"] == "upload.failing"]
        assert (failing["level"], failing["reason"], failing["kind"]) == ("WARNING", "access_denied", "permanent")
        assert "a wrong key or secret" in failing["message"]
        assert await asyncio.to_thread(read_bucket, user, root) == ({}, {})  # nothing landed

        # The right secret, and a restart: what waited in the store lands, and what comes after.
        async with hub(tmp_path, user, f"s3://{root}", device=h.device_string) as again:
            await publish(again.device, 10, 5, sent)
            segments = await landed(user, root, set(sent))
    once_each(segments, sent)
    for logs in (h.logs, again.logs):
        assert not [d for d in logs if "exc" in d or "Traceback" in d["message"]]
        assert not [d for d in logs if wrong in json.dumps(d) or user.secret in json.dumps(d)]
    assert not [d for d in again.logs if d["event"] == "upload.failing"]


async def test_an_https_store_with_a_private_ca_is_untrusted_until_aws_ca_bundle_names_it(tmp_path: Path) -> None:
    with s3_server(tmp_path / "aws", tls=True) as s3:
        assert s3.ca_file is not None
        bucket = bucket_of(tmp_path)
        s3.make_bucket(bucket)
        root = f"{bucket}/landing"
        sent: dict[str, bytes] = {}
        async with hub(tmp_path, s3, f"s3://{root}") as h:  # the system's CAs: not this store's
            await publish(h.device, 0, 5, sent)
            async with asyncio.timeout(30):
                while not [d for d in h.logs if d["event"] == "upload.failing"]:  # noqa: ASYNC110 (a pipe's lines)
                    await asyncio.sleep(0.1)
        [failing] = [d for d in h.logs if d["event"] == "upload.failing"]
        assert (failing["reason"], failing["kind"]) == ("untrusted_certificate", "permanent")
        assert "AWS_CA_BUNDLE" in failing["message"]

        async with hub(tmp_path, s3, f"s3://{root}", device=h.device_string, AWS_CA_BUNDLE=str(s3.ca_file)) as again:
            await publish(again.device, 5, 5, sent)
            segments = await landed(s3, root, set(sent))
    once_each(segments, sent)
    assert not [d for d in again.logs if d["event"] == "upload.failing"]


async def test_an_upload_link_of_the_manifest_lands_in_s3_through_the_same_environment(
    tmp_path: Path, s3: S3Server
) -> None:
    bucket = bucket_of(tmp_path)
    s3.make_bucket(bucket)
    root = f"{bucket}/lake"
    links = [{"name": "lake", "transport": "upload", "url": f"s3://{root}", "costPerMiB": 0.5}]
    manifest = {**MANIFEST, "upstream": {"links": links}}
    sent: dict[str, bytes] = {}
    # --upstream-upload points elsewhere: the manifest's links replace the command line's transport
    async with hub(tmp_path, s3, f"s3://{bucket}/unused", manifest_doc=manifest) as h:
        assert f"upstream link lake: upload s3://{root} cost/MiB=0.5 priorities=0-10 budget=none" in h.started
        await publish(h.device, 0, 20, sent)
        segments = await landed(s3, root, set(sent))
    once_each(segments, sent)
    assert not s3.fs().exists(f"{bucket}/unused")


async def test_an_s3_endpoint_that_is_no_url_stops_the_start_of_a_hub_whose_link_uploads_there(
    tmp_path: Path, s3: S3Server
) -> None:
    links = [{"name": "lake", "transport": "upload", "url": "s3://lake/landing"}]
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({**MANIFEST, "upstream": {"links": links}}))
    args = ("run", "--manifest", str(manifest), "--data-dir", str(tmp_path / "data"), "--mqtts-port", "0")
    proc = await asyncio.create_subprocess_exec(
        EDGEHUB,
        *args,
        "--amqps-port",
        "0",
        "--wss-port",
        "0",
        "--admin-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **s3.environment(AWS_ENDPOINT_URL_S3="minio.example:9000")},  # no scheme
    )
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode == 1
    said = err.decode()
    assert "edgehub: upstream upload s3://lake/landing: the S3 endpoint 'minio.example:9000' is not a URL" in said
    assert "Traceback" not in said
