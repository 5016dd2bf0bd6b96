"""The job's metrics: one JSON line per micro-batch, and the driver's CPU time for the end-of-run line.

A batch's line holds ``batch_id``, ``at``, ``input_rows``, ``bronze_rows``, ``duplicates``, ``quarantined``,
``unreadable_files`` and ``replay_skipped``. It goes to ``{lake}/_metrics/{tag}-{time}.jsonl`` through the lake's
Hadoop FS (so to object storage too: one small file per emission, since object stores cannot append), to stdout
(``ingest.batch {json}``) unless ``print_metrics`` is off, and to the local ``metrics_path`` file when one is set.

Invariants:

* A batch's line is emitted once per run, after the sink handled the batch and Spark reported its progress (so
  once it is in the checkpoint's commit log); a replayed batch reports again in the run that replays it.
* Every input row ends in bronze or quarantine unless the dedup step removed it, so ``duplicates`` is what the
  other counts do not account for; an unreadable file is one quarantine row that is no input row.
* A metrics file the lake refuses is logged (``ingest.metrics_write_failed``) and does not fail the batch, which
  is already committed.
"""

from __future__ import annotations

import json
import logging
import os
import resource
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from spark_upload.settings import JobSettings
from spark_upload.sink import RunState, batch_tag
from spark_upload.spark_internals import HadoopIOError, driver_jvm_pid

__all__ = ["MetricsListener", "driver_cpu_s", "emit_metrics", "local_metrics_file"]

_log = logging.getLogger(__name__)


def emit_metrics(run: RunState, progress: dict[str, Any]) -> None:
    """Emit the line of the batch ``progress`` (a ``StreamingQueryProgress`` as JSON) reports, once."""
    batch_id = int(progress["batchId"])
    with run.lock:
        if batch_id in run.emitted or batch_id not in run.counts:
            return
        run.emitted.add(batch_id)
        run.lock.notify_all()
        counts = run.counts[batch_id]
    input_rows = int(progress.get("numInputRows", 0))
    lines_quarantined = counts.quarantined - counts.unreadable_files
    dropped = 0 if counts.skipped_replay else input_rows - counts.bronze - lines_quarantined
    line = {
        "batch_id": batch_id,
        "at": progress.get("timestamp"),
        "input_rows": input_rows,
        "bronze_rows": counts.bronze,
        "duplicates": dropped,
        "quarantined": counts.quarantined,
        "unreadable_files": counts.unreadable_files,
        "replay_skipped": counts.skipped_replay,
    }
    text = json.dumps(line, separators=(",", ":"))
    # Batch tag first, so the names sort by batch, then time; a replayed batch reports under a name of its own.
    stamp = "".join(ch for ch in str(progress.get("timestamp") or datetime.now(UTC).isoformat()) if ch.isalnum())
    try:
        run.lake.touch("_metrics", f"{batch_tag(batch_id)}-{stamp}.jsonl", text=text + "\n")
    except HadoopIOError as exc:
        _log.warning("ingest.metrics_write_failed batch=%d error=%s", batch_id, exc.java_error)
    if run.metrics_file is not None:
        with open(run.metrics_file, "a", encoding="utf-8") as out:
            out.write(text + "\n")
    if run.settings.print_metrics:
        print(f"ingest.batch {text}", flush=True)


class MetricsListener(StreamingQueryListener):
    """Emits each batch's line when Spark reports the query's progress. ``query_id`` is filled in once the query
    has started (the listener must be added before, or the first batches could report unheard)."""

    def __init__(self, run: RunState, query_id: list[str]) -> None:
        self._run = run
        self._query_id = query_id

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        if self._query_id and progress.get("id") == self._query_id[0]:
            emit_metrics(self._run, progress)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def local_metrics_file(settings: JobSettings) -> str | None:
    """The local file to append the lines to (its folder made), or None."""
    if settings.metrics_path is None:
        return None
    os.makedirs(os.path.dirname(settings.metrics_path) or ".", exist_ok=True)
    return settings.metrics_path


def driver_cpu_s(spark: SparkSession) -> float:
    """User plus system CPU seconds so far of this Python process and of the driver's JVM (from /proc on Linux;
    the Python part only elsewhere)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    try:
        with open(f"/proc/{driver_jvm_pid(spark)}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
    except OSError:
        return total
    return total + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
