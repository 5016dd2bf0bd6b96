"""Spark ingestion throughput: records/s from a landing zone to the lake tables, local[1] vs local[2] vs cluster.

    python -m bench.ingest_spark [--records 1000000] [--segment-records 10000] [--repeat 2] [--no-cluster]
        [--no-pin] [--driver-memory 4g] [--bodies spaced|compact] [--modes local1,local2,unpinned,floor]

Builds a landing zone of ``--records`` records (segments written through ``LandingZone``, 5% of the records sent
twice in overlapping segments, so the dedup step has work; each body a small JSON object, with ``json.dumps``'
default spacing, which the hub writes as ``body_text``, or with ``--bodies compact`` without spaces, which it writes
as ``body_json``, as it does for what most SDKs' serializers send), then runs the whole job (classification, dedup
state, bronze, silver with VARIANT, device_minute partials, metrics) with ``trigger=available-now``, each time
from an empty lake and checkpoint, each in its own ``spark-submit``/Python process so a run does not inherit
the previous one's warm JVM. The figure is input records over the job's own run time (the ``ingest.run_done``
line), so JVM and cluster start-up are not counted.

Floor: ``bench.spark_floor`` at local[1], pinned as the job's local[1] is, on the same landing zone in the same
rounds: Spark reading the same gzip'ed JSON lines with the same schema and writing them to Parquet, nothing else.
``job_over_floor`` = the job's median local[1] records/s over the floor's (1.0: the job costs no more than
parsing and writing its input).

Peer: local[1] is the baseline; ``scaling_ratio`` = median local[2] records/s / median local[1] records/s.
Each local[N] run is given N cores (its process's CPU affinity, which the JVM inherits and sizes its compiler
and GC threads by), as a cluster manager gives an executor of N cores N cores: the ratio is what a second core
buys. Unpinned, the JVM's JIT compiler threads run on the second core beside local[1]'s one task thread (on this
job about 35 CPU seconds of C2 compilation per 300,000 records against 28 s of task time), so an unpinned
local[1] already keeps ~1.5 cores busy and the unpinned ratio on a 2-core machine is capped near 1.3; it is
reported too (``scaling_ratio_unpinned``: local[2] over an unpinned local[1]). ``--no-pin`` runs the local modes
unpinned only. The runs go in rounds (``--repeat``), alternating their order, so a change in the machine's
other load hits all of them; medians are reported. Each local run also reports the CPU seconds its driver
(JVM and Python) used during the run, and cpu/wall, the cores it kept busy: local[2] should be near 2 on a free
machine. The standalone cluster
(a master and two one-core workers on this same box) runs once; its CPU is that of every cluster process from
start to stop (executors included, JVM start-up too). On a shared machine every figure is noisy: the load
average is printed before each run, with a warning when it exceeds the number of cores.

Each run of the job is checked by its own counts (its ``ingest.batch`` lines): every input line read, every record
in bronze once, the repeated ones dropped as duplicates, nothing quarantined; and the floor by the rows it wrote.

``--modes`` runs some of the local modes only (all four by default); a figure that needs a mode left out is null.
The tests run ``--modes local1,floor`` on a small landing zone: the job and the floor, each with its checks, in
two JVMs instead of four.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import SegmentName, SegmentRecord, encode_segment
from spark_upload.standalone import StandaloneCluster

_DONE = re.compile(r"ingest\.run_done elapsed_s=([0-9.]+) cpu_s=([0-9.]+)")
# --modes' names for the local runs' labels
MODES = {"local1": "local[1]", "local2": "local[2]", "unpinned": "local[1] unpinned", "floor": "floor local[1]"}


def build_landing(root: Path, *, records: int, segment_records: int, compact_bodies: bool = False) -> int:
    """Write the landing zone; returns the number of input lines (records plus duplicates). Bodies are JSON with
    ``json.dumps``' default spacing (``body_text`` in the segment), or without spaces (``body_json``)."""
    separators = (",", ":") if compact_bodies else None
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
                body=json.dumps(
                    {"temp": 20 + (i % 100) / 10, "hum": (i % 50) / 100, "seq": i}, separators=separators
                ).encode(),
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


_BATCH = re.compile(r"^ingest\.batch (\{.*\})$", re.M)


def check_counts(output: str, *, lines: int, records: int) -> None:
    """The job's own counts (its ``ingest.batch`` lines, one per micro-batch) add up: every input line read,
    every record in bronze once, the rest dropped as duplicates, nothing quarantined."""
    batches = [json.loads(m.group(1)) for m in _BATCH.finditer(output)]
    keys = ("input_rows", "bronze_rows", "duplicates", "quarantined")
    counted = {key: sum(int(b[key]) for b in batches) for key in keys}
    expected = dict(zip(keys, (lines, records, lines - records, 0), strict=True))
    if counted != expected:
        raise RuntimeError(f"the job counted {counted} over {len(batches)} batches, not {expected}:\n{output[-2000:]}")


def _run_done(output: str) -> tuple[float, float]:
    match = _DONE.search(output)
    if match is None:
        raise RuntimeError(f"the job printed no ingest.run_done line:\n{output[-2000:]}")
    return float(match.group(1)), float(match.group(2))


def _load_check(label: str) -> bool:
    """Print the load average; True (and a warning) when it exceeds the number of cores."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    busy = load > cores
    warning = f"  WARNING: load {load:.1f} > {cores} cores, this run is contended" if busy else ""
    print(f"{label}: load average {load:.1f}{warning}", flush=True)
    return busy


def _cores(n: int | None) -> set[int] | None:
    """The first ``n`` CPUs this process may run on (None: no pinning)."""
    if n is None:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < n:
        raise SystemExit(f"local[{n}] needs {n} cores; this process may use {len(allowed)}")
    return set(allowed[:n])


def run_local(
    master: str,
    landing: Path,
    work: Path,
    *,
    driver_memory: str | None,
    cores: set[int] | None,
    lines: int,
    records: int,
) -> tuple[float, float]:
    """One run of the job in its own process, on ``cores`` when given, its counts checked; (elapsed_s, cpu_s) of
    the run."""
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
    if driver_memory is not None:
        cmd += ["--driver-memory", driver_memory]
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, cores))
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800, preexec_fn=pin)
    check_counts(done.stdout, lines=lines, records=records)
    return _run_done(done.stdout)


_FLOOR_ROWS = re.compile(r"floor\.rows written=([0-9]+)")


def run_floor(landing: Path, work: Path, *, lines: int, cores: set[int] | None) -> tuple[float, float]:
    """One run of the floor job (``bench.spark_floor``) at local[1] in its own process; (elapsed_s, cpu_s)."""
    cmd = [sys.executable, "-m", "bench.spark_floor", "--master", "local[1]", "--landing", str(landing)]
    cmd += ["--out", str(work / "floor")]
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, cores))
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800, preexec_fn=pin)
    rows = _FLOOR_ROWS.search(done.stdout)
    if rows is None or int(rows.group(1)) != lines:
        raise RuntimeError(f"the floor job wrote {rows and rows.group(1)} rows, not {lines}:\n{done.stdout[-2000:]}")
    return _run_done(done.stdout)


def run_cluster(landing: Path, work: Path, *, lines: int, records: int) -> tuple[float, float]:
    """(elapsed_s of the run, CPU seconds of every cluster process from start to stop)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
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
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers waited for their executors
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    check_counts(done.stdout, lines=lines, records=records)
    return _run_done(done.stdout)[0], cpu_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ingest_spark")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--segment-records", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=2, help="rounds of the local runs, alternating; medians reported")
    p.add_argument("--no-cluster", action="store_true")
    p.add_argument("--no-pin", action="store_true", help="run the local modes unpinned only (see the docstring)")
    p.add_argument("--driver-memory", default=None, help="passed to the job's local runs (e.g. 4g)")
    p.add_argument(
        "--bodies",
        choices=("spaced", "compact"),
        default="spaced",
        help="JSON bodies with json.dumps' default spacing (the segment's body_text) or none (body_json)",
    )
    p.add_argument(
        "--modes",
        type=lambda text: set(text.split(",")),
        default=set(MODES),
        help=f"the local modes to run, of {','.join(MODES)} (default: all; unpinned is local1 under --no-pin)",
    )
    ns = p.parse_args(argv)
    if not ns.modes <= set(MODES):
        p.error(f"--modes: {','.join(sorted(ns.modes - set(MODES)))} not among {','.join(MODES)}")
    # (label, master, cores it is pinned to or None)
    modes: list[tuple[str, str, int | None]] = (
        [("local[1]", "local[1]", None), ("local[2]", "local[2]", None)]
        if ns.no_pin
        else [("local[1]", "local[1]", 1), ("local[2]", "local[2]", 2), ("local[1] unpinned", "local[1]", None)]
    )
    # The floor (bench.spark_floor: read, parse with the same schema, write Parquet) at local[1], pinned as the
    # job's local[1] is, in the same rounds.
    modes.append(("floor local[1]", "floor", None if ns.no_pin else 1))
    wanted = {MODES[m] for m in ns.modes}
    if ns.no_pin and "local[1] unpinned" in wanted:
        wanted.add("local[1]")
    modes = [mode for mode in modes if mode[0] in wanted]
    load_before = os.getloadavg()
    contended = 0
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        lines = build_landing(
            root / "landing",
            records=ns.records,
            segment_records=ns.segment_records,
            compact_bodies=ns.bodies == "compact",
        )
        print(f"landing zone: {lines} lines ({ns.records} records) in {time.perf_counter() - t0:.1f}s", flush=True)
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in modes}
        for round_no in range(ns.repeat):
            for n, (label, master, pin) in enumerate(modes if round_no % 2 == 0 else modes[::-1]):
                contended += _load_check(f"round {round_no + 1} {label}")
                work = root / f"run-{round_no}-{n}"
                if master == "floor":
                    took, cpu_s = run_floor(root / "landing", work, lines=lines, cores=_cores(pin))
                else:
                    took, cpu_s = run_local(
                        master,
                        root / "landing",
                        work,
                        driver_memory=ns.driver_memory,
                        cores=_cores(pin),
                        lines=lines,
                        records=ns.records,
                    )
                shutil.rmtree(work, ignore_errors=True)
                runs[label].append((took, cpu_s))
                print(
                    f"  {label}: {took:.1f}s, {lines / took:,.0f} records/s, "
                    f"cpu {cpu_s:.1f}s ({cpu_s / took:.2f} cores)",
                    flush=True,
                )
        standalone: tuple[float, float] | None = None
        if not ns.no_cluster:
            contended += _load_check("standalone")
            standalone = run_cluster(root / "landing", root / "standalone", lines=lines, records=ns.records)
            print(
                f"  standalone (2 workers x 1 core): {standalone[0]:.1f}s, {lines / standalone[0]:,.0f} records/s, "
                f"cluster cpu {standalone[1]:.1f}s",
                flush=True,
            )
    load_after = os.getloadavg()
    print(f"load average (1 min) before {load_before[0]:.1f}, after {load_after[0]:.1f} on {os.cpu_count()} cores")

    # Each figure is null where a mode it needs was left out (--modes).
    def elapsed(label: str) -> float | None:
        return statistics.median(e for e, _ in runs[label]) if runs.get(label) else None

    def cpu(label: str) -> float | None:
        return round(statistics.median(c for _, c in runs[label]), 1) if runs.get(label) else None

    def busy(label: str) -> float | None:
        return round(statistics.median(c / e for e, c in runs[label]), 2) if runs.get(label) else None

    def rate(label: str) -> int | None:
        took = elapsed(label)
        return None if took is None else round(lines / took)

    def ratio(faster: str, slower: str) -> float | None:
        top, bottom = elapsed(slower), elapsed(faster)
        return None if top is None or bottom is None else round(top / bottom, 3)

    unpinned = "local[1]" if ns.no_pin else "local[1] unpinned"
    summary = {
        "records": ns.records,
        "bodies": ns.bodies,
        "input_lines": lines,
        "repeat": ns.repeat,
        "pinned": not ns.no_pin,
        "records_per_s_local1": rate("local[1]"),
        "records_per_s_local2": rate("local[2]"),
        "scaling_ratio": ratio("local[2]", "local[1]"),
        "floor_records_per_s_local1": rate("floor local[1]"),
        "job_over_floor": ratio("local[1]", "floor local[1]"),
        "records_per_s_local1_unpinned": rate(unpinned),
        "scaling_ratio_unpinned": ratio("local[2]", unpinned),
        "cpu_s_local1": cpu("local[1]"),
        "cpu_s_local2": cpu("local[2]"),
        "cpu_s_local1_unpinned": cpu(unpinned),
        "cores_busy_local1": busy("local[1]"),
        "cores_busy_local2": busy("local[2]"),
        "cores_busy_local1_unpinned": busy(unpinned),
        "elapsed_s": {label: [round(e, 1) for e, _ in r] for label, r in runs.items()},
        "standalone_records_per_s": None if standalone is None else round(lines / standalone[0]),
        "standalone_cpu_s": None if standalone is None else round(standalone[1], 1),
        "driver_memory": ns.driver_memory,
        "contended_runs": contended,
        "loadavg_before": round(load_before[0], 2),
        "loadavg_after": round(load_after[0], 2),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
