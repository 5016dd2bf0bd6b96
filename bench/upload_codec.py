"""Bytes landed per message by the upload transport: gzip vs zstd vs zstd with a trained dictionary, same traffic.

    python -m bench.upload_codec [--messages 20000] [--batch 100] [--spark]

The traffic is ``bench.uplink``'s: 200-byte JSON telemetry from 17 pumps, each message with the hub's edge id.
Each codec gets a fresh landing zone (a temp folder, through ``LandingZone``) and its own ``UploadTransport``, and
is sent the same messages in the same batches of ``--batch`` (a batch is one segment file). The zstd-with-dictionary
run trains its dictionary from the first batches, as a hub does (``LaneDictionary`` defaults), lands it once and
uses it from then on; its bytes count everything landed, the dictionary and the segments sent before it included.

Peer: gzip, the default codec, in the same run. ``zstd_dict_over_gzip`` = zstd+dictionary bytes / gzip bytes (below
1: fewer bytes on the link); ``zstd_over_gzip`` the same without a dictionary. ``*_send_s`` is the wall time to
send every batch (compression included: zstd at level 19 costs CPU that gzip at level 6 does not).

Checks (the run fails on any): every segment of each landing zone decodes, a zstd one with the dictionary its
frame names from the landing zone's ``dictionaries/``, to exactly the messages sent, each once, bodies equal.

``--spark`` also runs the ingestion job (``python -m spark_upload.job``, local[1], available-now) on the gzip and on
the zstd+dictionary landing zone, checks that bronze has every message once, and reports each run's time
(``ingest.run_done``): the zstd run includes the driver decoding every segment (``spark_upload.decoding``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.uplink import telemetry
from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.upstream.dictionary import LaneDictionary
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import Codec, decode_segment, dictionary_path, segment_dictionary_id
from edgehub.upstream.upload_transport import UploadTransport

RUNS = ("gzip", "zstd", "zstd_dict")


@dataclass(frozen=True, slots=True)
class Landed:
    segment_bytes: int
    dictionary_bytes: int
    segments: int
    segments_with_dictionary: int
    send_s: float


def traffic(messages: int, batch: int) -> list[list[QueuedMessage]]:
    rnd = random.Random(7)
    queued = [
        QueuedMessage(
            message=Message(body=telemetry(i, rnd), system_properties={"edgeMessageId": f"{i:032x}"}),
            offset=i,
            priority=5,
            enqueued_at_s=1_790_000_000 + i / 10,
            ttl_s=3600,
        )
        for i in range(messages)
    ]
    return [queued[i : i + batch] for i in range(0, messages, batch)]


async def land(run: str, batches: list[list[QueuedMessage]], root: Path) -> Landed:
    zone = LandingZone(str(root))
    if run == "gzip":
        up = UploadTransport(zone, hub_id="hub1")
    else:
        dictionary = LaneDictionary(lane="upload-upstream") if run == "zstd_dict" else None
        up = UploadTransport(zone, hub_id="hub1", codec=Codec.ZSTD, dictionary=dictionary)
    started = time.perf_counter()
    for batch in batches:
        result = await up.send(batch)
        if len(result.succeeded) != len(batch):
            raise SystemExit(f"{run}: a batch failed: {result.error}")
        if run == "zstd_dict" and up.dictionary is not None and up.dictionary.current is None:
            await up.training_done()  # a hub trains in the background; here the next batch may use it at once
    send_s = time.perf_counter() - started
    await up.close()
    check(run, zone, batches)
    return _measured(root, send_s)


def _measured(root: Path, send_s: float) -> Landed:
    """What a landing zone holds: its segments' bytes and its dictionaries'."""
    segments = list(root.rglob("*.jsonl.*"))
    return Landed(
        segment_bytes=sum(p.stat().st_size for p in segments),
        dictionary_bytes=sum(p.stat().st_size for p in (root / "dictionaries").glob("*")),
        segments=len(segments),
        segments_with_dictionary=sum(1 for p in segments if segment_dictionary_id(p.read_bytes())),
        send_s=send_s,
    )


def check(run: str, zone: LandingZone, batches: list[list[QueuedMessage]]) -> None:
    """Every message landed decodes back, once, with its body."""
    sent = {qm.message.edge_message_id: qm.message.body for batch in batches for qm in batch}
    got: dict[str | None, bytes] = {}
    for path in zone.list_paths("hub1"):
        data = zone.read_path(path) or b""
        dict_id = segment_dictionary_id(data)
        dictionaries = {}
        if dict_id:
            dictionaries[dict_id] = zone.read_path(dictionary_path(dict_id)) or b""
        for r in decode_segment(data, dictionaries):
            if r.edge_message_id in got:
                raise SystemExit(f"{run}: {r.edge_message_id} landed twice")
            got[r.edge_message_id] = r.body
    if got != sent:
        raise SystemExit(f"{run}: landed {len(got)} messages, {len(set(sent) - set(got))} missing or changed")


def run_job(landing: Path, work: Path, *, messages: int) -> float:
    """The ingestion job on ``landing`` (local[1]); its run time, after checking bronze got every message once."""
    cmd = [sys.executable, "-m", "spark_upload.job", "--landing", str(landing), "--lake", str(work / "lake")]
    cmd += ["--checkpoint", str(work / "checkpoint"), "--master", "local[1]", "--shuffle-partitions", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout
    bronze = sum(json.loads(m)["bronze_rows"] for m in re.findall(r"^ingest\.batch (\{.*\})$", out, re.M))
    if bronze != messages:
        raise SystemExit(f"the job put {bronze} rows in bronze, not {messages}:\n{out[-2000:]}")
    done = re.search(r"ingest\.run_done elapsed_s=([0-9.]+)", out)
    if done is None:
        raise SystemExit(f"no ingest.run_done line:\n{out[-2000:]}")
    return float(done[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.upload_codec", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=100, help="messages per batch, so per segment file")
    p.add_argument("--spark", action="store_true", help="also run the ingestion job on two of the landing zones")
    ns = p.parse_args(argv)
    if ns.messages < 1 or ns.batch < 1:
        p.error("--messages and --batch must be positive")
    batches = traffic(ns.messages, ns.batch)
    figures: dict[str, object] = {"messages": ns.messages, "batch": ns.batch}
    with tempfile.TemporaryDirectory(prefix="edgehub-bench-upload-codec-") as tmp:
        landed = {run: asyncio.run(land(run, batches, Path(tmp) / run)) for run in RUNS}
        for run, got in landed.items():
            total = got.segment_bytes + got.dictionary_bytes
            print(
                f"{run:10s} segments={got.segments} with_dictionary={got.segments_with_dictionary} "
                f"bytes={total} per_msg={total / ns.messages:.1f} send_s={got.send_s:.2f}",
                flush=True,
            )
            figures[f"{run}_bytes_per_msg"] = round(total / ns.messages, 2)
            figures[f"{run}_send_s"] = round(got.send_s, 3)
        figures["dictionary_bytes"] = landed["zstd_dict"].dictionary_bytes
        figures["segments_with_dictionary"] = landed["zstd_dict"].segments_with_dictionary
        gzip_total = landed["gzip"].segment_bytes
        for run in ("zstd", "zstd_dict"):
            got = landed[run]
            figures[f"{run}_over_gzip"] = round((got.segment_bytes + got.dictionary_bytes) / gzip_total, 3)
        if ns.spark:
            for run in ("gzip", "zstd_dict"):
                work = Path(tmp) / f"job-{run}"
                figures[f"job_{run}_s"] = round(run_job(Path(tmp) / run, work, messages=ns.messages), 3)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
