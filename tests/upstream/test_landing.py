from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from edgehub.core import FailureKind, TransportError
from edgehub.upstream.landing import REASONS, LandingError, LandingZone, WriteOutcome
from edgehub.upstream.segment import SegmentName, SegmentRecord, decode_segment, encode_segment

NAME = SegmentName(hub_id="hub1", lane="upstream", priority=3, first_offset=10, last_offset=19)


def _segment(tag: str = "a") -> bytes:
    return encode_segment(
        [
            SegmentRecord(
                edge_message_id=f"{tag}-{i}",
                hub_id="hub1",
                enqueued_at="2026-11-22T21:33:06.123Z",
                priority=3,
                ttl_s=60,
                source="/messages/events",
                body=b"{}",
            )
            for i in range(3)
        ]
    )


def _all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_write_to_a_folder_path_lands_the_segment_under_its_name(tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path))
    assert zone.write(NAME, _segment()) == WriteOutcome.WRITTEN
    landed = tmp_path / NAME.path
    assert decode_segment(landed.read_bytes()) == decode_segment(_segment())
    assert _all_files(tmp_path) == [landed]


def test_write_to_a_file_url_is_the_same_as_a_path(tmp_path: Path) -> None:
    zone = LandingZone(f"file://{tmp_path}")
    zone.write(NAME, _segment())
    assert (tmp_path / NAME.path).read_bytes() == _segment()


def test_writing_the_same_name_twice_leaves_one_unchanged_file(tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path))
    zone.write(NAME, _segment("first"))
    before = (tmp_path / NAME.path).stat()
    assert zone.write(NAME, _segment("second")) == WriteOutcome.ALREADY_PRESENT
    after = (tmp_path / NAME.path).stat()
    assert (tmp_path / NAME.path).read_bytes() == _segment("first")
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert _all_files(tmp_path) == [tmp_path / NAME.path]


def test_no_temp_file_is_left_behind_and_temp_names_are_hidden_from_spark(tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path))
    for last in range(5):
        zone.write(SegmentName("hub1", "upstream", 0, 0, last), _segment())
    names = [p.name for p in _all_files(tmp_path)]
    assert len(names) == 5
    assert not any(n.startswith((".", "_")) for n in names)


def test_a_landing_path_under_a_file_is_a_permanent_transport_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"x")
    zone = LandingZone(str(tmp_path / "plain"))
    with pytest.raises(TransportError) as info:
        zone.write(NAME, _segment())
    assert info.value.kind == FailureKind.PERMANENT


def test_an_unknown_protocol_is_a_permanent_transport_error() -> None:
    with pytest.raises(TransportError) as info:
        LandingZone("nosuchproto://bucket/landing")
    assert info.value.kind == FailureKind.PERMANENT


def test_other_fsspec_protocols_write_through_a_move_and_stay_idempotent() -> None:
    url = "memory://landing-test-idempotent"
    zone = LandingZone(url)
    fs = fsspec.filesystem("memory")
    try:
        assert zone.write(NAME, _segment("first")) == WriteOutcome.WRITTEN
        assert zone.write(NAME, _segment("second")) == WriteOutcome.ALREADY_PRESENT
        files = fs.find("/landing-test-idempotent")
        assert files == [f"/landing-test-idempotent/{NAME.path}"]
        assert fs.cat_file(files[0]) == _segment("first")
    finally:
        fs.rm("/landing-test-idempotent", recursive=True)


def test_write_path_refuses_names_that_escape_or_hide(tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path))
    for bad in ("", "../x.jsonl.gz", "a/.hidden.jsonl.gz", "_tmp/x", "a//b"):
        with pytest.raises(ValueError, match="bad landing path"):
            zone.write_path(bad, b"x")
    assert zone.write_path("received/abc.jsonl.gz", b"x") == WriteOutcome.WRITTEN
    assert (tmp_path / "received" / "abc.jsonl.gz").read_bytes() == b"x"


def test_a_failure_names_the_url_without_its_password_and_says_why_in_a_word(tmp_path: Path) -> None:
    with pytest.raises(TransportError) as refused:
        LandingZone("nosuchproto://ops:s3cret@files.example/landing")
    assert "nosuchproto://ops:***@files.example/landing" in str(refused.value)
    assert "s3cret" not in str(refused.value)
    (tmp_path / "plain").write_bytes(b"x")
    with pytest.raises(LandingError) as failed:
        LandingZone(str(tmp_path / "plain")).write(NAME, _segment())
    assert (failed.value.reason, failed.value.kind) == ("error", FailureKind.PERMANENT)  # ENOTDIR: no retry mends it
    assert failed.value.reason in REASONS
