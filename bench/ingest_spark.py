"""Spark ingestion throughput: records/s from a landing zone to the lake tables, local[1] vs local[2] vs cluster.

    python -m bench.ingest_spark [--records 1000000] [--segment-records 10000] [--no-cluster]

Builds a landing zone of ``--records`` records (segments written through ``LandingZone``, 5% of the records sent
twice in overlapping segments, so the dedup step has work), then runs the whole job (classification, dedup
state, bronze, silver with VARIANT, device_minute partials, metrics) with ``trigger=available-now`` once per
mode, each time from an empty lake and checkpoint, each in its own ``spark-submit``/Python process so a mode
does not inherit the previous one's warm JVM. The figure is input records over the job's own run time (the
``ingest.run_done`` line), so JVM and cluster start-up are not counted.

Peer: local[1] is the baseline; ``scaling_ratio`` = local[2] / local[1]. The standalone cluster is a master and
two one-core workers on this same box. On a shared 2-core machine all three figures are noisy; the report
prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import SegmentName, SegmentRecord, encode_segment
from spark_upload.standalone import StandaloneCluster

_DONE = re.compile(r"ingest\.run_done elapsed_s=([0-9.]+)")


def build_landing(root: Path, *, records: int, segment_records: int) -> int:
    """Write the landing zone; returns the number of input lines (records plus duplicates)."""
    zone = LandingZone(str(root))
    lines = 0
    for first in range(0, records, segment_records):
        last = min(records, first + segment_records) - 1
        # Overlap the previous segment by 5%: a batch cut differently after a restart.
        start = max(0, first - segment_records // 20)
        batch = [
            SegmentRecord(
                edge_message_id=f"hub1-{i:09d}",
                hub_id="hub1",
                enqueued_at=f"2026-11-22T21:{(i // 1000) % 60:02d}:{(i // 10) % 60:02d}.{i % 1000:03d}Z",
                priority=i % 3,
                ttl_s=3600,
                source="/messages/modules/sensor/outputs/out1",
                body=json.dumps({"temp": 20 + (i % 100) / 10, "hum": (i % 50) / 100, "seq": i}).encode(),
                message_id=f"m-{i}",
                device_id=f"dev{i % 50}",
                module_id="sensor",
                properties={"unit": "C"},
                system_properties={"connectionDeviceId": f"dev{i % 50}", "connectionModuleId": "sensor"},
            )
            for i in range(start, last + 1)
        ]
        zone.write(SegmentName("hub1", "upstream", 0, start, last), encode_segment(batch))
        lines += len(batch)
    return lines


def _elapsed(output: str) -> float:
    match = _DONE.search(output)
    if match is None:
        raise RuntimeError(f"the job printed no ingest.run_done line:\n{output[-2000:]}")
    return float(match.group(1))


def run_local(master: str, landing: Path, work: Path) -> float:
    cmd = [
        sys.executable,
        "-m",
        "spark_upload.job",
        "--master",
        master,
        "--landing",
        str(landing),
        "--lake",
        str(work / "lake"),
        "--checkpoint",
        str(work / "checkpoint"),
        "--shuffle-partitions",
        "4",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
    return _elapsed(done.stdout)


def run_cluster(landing: Path, work: Path) -> float:
    with StandaloneCluster(work_dir=work / "cluster", workers=2) as cluster:
        done = cluster.submit(
            [
                "--landing",
                str(landing),
                "--lake",
                str(work / "lake"),
                "--checkpoint",
                str(work / "checkpoint"),
                "--shuffle-partitions",
                "4",
            ],
            timeout_s=1800,
        )
    return _elapsed(done.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ingest_spark")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--segment-records", type=int, default=10_000)
    p.add_argument("--no-cluster", action="store_true")
    ns = p.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        lines = build_landing(root / "landing", records=ns.records, segment_records=ns.segment_records)
        print(f"landing zone: {lines} lines ({ns.records} records) in {time.perf_counter() - t0:.1f}s", flush=True)
        results: dict[str, float] = {}
        for mode in ("local[1]", "local[2]"):
            elapsed = run_local(mode, root / "landing", root / mode.replace("[", "").replace("]", ""))
            results[mode] = lines / elapsed
            print(f"{mode}: {elapsed:.1f}s, {results[mode]:,.0f} records/s", flush=True)
        standalone = None
        if not ns.no_cluster:
            elapsed = run_cluster(root / "landing", root / "standalone")
            standalone = lines / elapsed
            print(f"standalone (2 workers x 1 core): {elapsed:.1f}s, {standalone:,.0f} records/s", flush=True)
    load_after = os.getloadavg()
    print(f"load average (1 min) before {load_before[0]:.1f}, after {load_after[0]:.1f} on {os.cpu_count()} cores")
    local1, local2 = results["local[1]"], results["local[2]"]
    summary = {
        "records": ns.records,
        "input_lines": lines,
        "records_per_s_local1": round(local1),
        "records_per_s_local2": round(local2),
        "scaling_ratio": round(local2 / local1, 3),
        "standalone_records_per_s": None if standalone is None else round(standalone),
        "loadavg_before": round(load_before[0], 2),
        "loadavg_after": round(load_after[0], 2),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
