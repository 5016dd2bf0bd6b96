"""The landing zone on object storage: the upload transport lands gzip and zstd+dictionary segments through s3fs
on a real S3-compatible server (moto in server mode, started here on 127.0.0.1 on a free port), and a reader finds
every record there again, each zstd segment decoded with the dictionary it names, from the same bucket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import s3fs

from edgehub.core import FailureKind
from edgehub.upstream.dictionary import LaneDictionary
from edgehub.upstream.landing import LandingError, LandingZone, WriteOutcome
from edgehub.upstream.segment import (
    SEGMENT_SUFFIX,
    ZSTD_SEGMENT_SUFFIX,
    Codec,
    SegmentName,
    decode_segment,
    dictionary_path,
    segment_dictionary_id,
)
from edgehub.upstream.upload_transport import UploadTransport
from tests.upstream.s3_server import s3_server
from tests.upstream.test_dictionary import telemetry_batch

pytestmark = pytest.mark.interop

BUCKET = "edgehub-landing"


@pytest.fixture(scope="module")
def s3_options(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The storage options of a fresh moto S3 server on a free loopback port, with one bucket."""
    with s3_server(tmp_path_factory.mktemp("aws")) as server:
        server.make_bucket(BUCKET)
        yield server.options()


def _s3(options: dict[str, Any]) -> s3fs.S3FileSystem:
    """The bucket seen directly through s3fs (for what a test looks at beside the landing zone's own view)."""
    return s3fs.S3FileSystem(**options)


def _zone(options: dict[str, Any], prefix: str) -> LandingZone:
    return LandingZone(f"s3://{BUCKET}/{prefix}", storage_options=options)


async def test_the_upload_transport_lands_gzip_and_zstd_dictionary_segments_on_s3_and_every_record_reads_back(
    s3_options: dict[str, Any],
) -> None:
    zone = _zone(s3_options, "both")
    gz = UploadTransport(zone, hub_id="hub1", lane="upstream")
    zst = UploadTransport(
        zone,
        hub_id="hub1",
        lane="upstream-p1",
        codec=Codec.ZSTD,
        dictionary=LaneDictionary(lane="upload-upstream-p1", min_lines=100),
    )
    sent: set[str] = set()
    for b in range(3):
        batch = telemetry_batch(b * 40, 40)
        assert len((await gz.send(batch)).succeeded) == 40
        sent |= {qm.message.edge_message_id or "" for qm in batch}
    for b in range(3, 10):  # trains after four batches, lands the dictionary, then uses it
        batch = telemetry_batch(b * 40, 40)
        assert len((await zst.send(batch)).succeeded) == 40
        sent |= {qm.message.edge_message_id or "" for qm in batch}
        if b == 6:
            await zst.training_done()
    assert zst.dictionaries_landed == 1

    # The reader: every file under the hub's folder, a zstd one decoded with the dictionary its frame names.
    paths = zone.list_paths("hub1")
    assert sum(p.endswith(SEGMENT_SUFFIX) for p in paths) == 3
    assert sum(p.endswith(ZSTD_SEGMENT_SUFFIX) for p in paths) == 7
    (dict_file,) = zone.list_paths("dictionaries")
    read: list[str] = []
    with_dictionary = 0
    for path in paths:
        data = zone.read_path(path)
        assert data is not None
        dict_id = segment_dictionary_id(data)
        dictionaries = {}
        if dict_id:
            with_dictionary += 1
            assert dict_file == dictionary_path(dict_id)
            landed = zone.read_path(dict_file)
            assert landed is not None
            dictionaries[dict_id] = landed
        read += [r.edge_message_id for r in decode_segment(data, dictionaries)]
    assert with_dictionary >= 2
    assert sorted(read) == sorted(sent)  # nothing lost, nothing twice
    # No temp object is left behind (the atomic publish is a copy and a delete on S3).
    assert not [p for p in _s3(s3_options).find(f"{BUCKET}/both") if "/." in p]
    await zst.close()
    await gz.close()


async def test_a_retried_upload_on_s3_finds_its_segment_and_leaves_one_object(s3_options: dict[str, Any]) -> None:
    zone = _zone(s3_options, "retry")
    up = UploadTransport(zone, hub_id="hub1", codec=Codec.ZSTD)
    batch = telemetry_batch(0, 10)
    first = await up.send(batch)
    name = SegmentName("hub1", "upstream", 5, 0, 9, codec=Codec.ZSTD)
    assert first.details["segment"] == name.path
    assert zone.write(name, b"other bytes") is WriteOutcome.ALREADY_PRESENT
    again = await up.send(batch)
    assert len(again.succeeded) == 10
    assert zone.list_paths("hub1") == [name.path]
    data = zone.read_path(name.path)
    assert data is not None
    assert len(decode_segment(data)) == 10


async def test_a_missing_bucket_fails_the_batch_and_is_never_created(s3_options: dict[str, Any]) -> None:
    zone = LandingZone("s3://no-such-bucket/zone", storage_options=s3_options)
    up = UploadTransport(zone, hub_id="hub1", write_timeout_s=30)
    result = await up.send(telemetry_batch(0, 3))
    assert len(result.failed) == 3
    assert result.failure_kind is FailureKind.TRANSIENT  # someone may yet make it: the executor retries
    assert "no-such-bucket" in (result.error or "")
    assert not _s3(s3_options).exists("no-such-bucket")
    with pytest.raises(LandingError) as refused:
        zone.write(SegmentName("hub1", "upstream", 5, 0, 0), b"bytes")
    assert (refused.value.reason, refused.value.kind) == ("no_such_bucket", FailureKind.TRANSIENT)
    assert "make the bucket" in str(refused.value)


def test_a_wrong_secret_or_an_unknown_key_is_refused_access_for_good_and_the_secret_is_never_said(
    tmp_path: Path,
) -> None:
    with s3_server(tmp_path / "aws") as server, server.checking_credentials() as user:
        zone = LandingZone(f"s3://{BUCKET}-auth/zone", storage_options=user.options())
        user.make_bucket(f"{BUCKET}-auth")
        assert zone.write(SegmentName("hub1", "upstream", 5, 0, 0), b"right") is WriteOutcome.WRITTEN
        for key, secret in ((user.key, "a-wrong-secret"), ("AKIAUNKNOWNKEY000000", user.secret)):
            wrong = LandingZone(
                f"s3://{BUCKET}-auth/zone", storage_options={**user.options(), "key": key, "secret": secret}
            )
            with pytest.raises(LandingError) as refused:
                wrong.write(SegmentName("hub1", "upstream", 5, 1, 1), b"wrong")
            # S3 answers the existence check (a HEAD) with a bare 403, which cannot tell a wrong secret from a
            # forbidden bucket: access_denied either way, with a hint naming both
            assert (refused.value.reason, refused.value.kind) == ("access_denied", FailureKind.PERMANENT)
            assert "a wrong key or secret" in str(refused.value)
            assert secret not in str(refused.value)
            assert user.secret not in str(refused.value)


def test_no_credentials_anywhere_and_an_endpoint_that_does_not_answer_are_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with s3_server(tmp_path / "aws") as server:
        env = server.environment()
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.pop(name, None)
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():  # botocore's own environment: the files empty, no metadata lookup
            monkeypatch.setenv(name, value)
        nobody = LandingZone(f"s3://{BUCKET}/zone", storage_options={"skip_instance_cache": True})
        with pytest.raises(LandingError) as refused:
            nobody.write(SegmentName("hub1", "upstream", 5, 0, 0), b"x")
        assert (refused.value.reason, refused.value.kind) == ("no_credentials", FailureKind.PERMANENT)
        gone = server.options()
    # The server is stopped: nothing listens on its port any more.
    gone["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 2}
    with pytest.raises(LandingError) as unanswered:
        LandingZone(f"s3://{BUCKET}/zone", storage_options=gone).write(SegmentName("hub1", "upstream", 5, 0, 0), b"x")
    assert (unanswered.value.reason, unanswered.value.kind) == ("unreachable", FailureKind.TRANSIENT)
