"""What the job reads of Spark that Spark does not promise: the py4j view of the driver's JVM, and the files of a
streaming query's checkpoint. Everything of that kind is read here and nowhere else.

The job needs three things the public API does not give it: Hadoop FileSystem calls on the lake and the checkpoint
(so a lake in object storage works like a local one; ``SparkContext._jvm`` and ``_jsc``), which landing files a
micro-batch read and when it ran (the checkpoint's offsets log and the file source's log), and the id of the query
a checkpoint belongs to (its ``metadata`` file). The layout read, as Spark 4.x writes it:

* ``metadata``: ``{"id": "<query id>", ...}``;
* ``offsets/{batch}``: the line ``v1``, the batch's metadata (JSON, with ``batchTimestampMs``), then one line per
  source, the file source's ``{"logOffset": N}`` or ``-`` while it has none (the job has one source);
* ``sources/0/{log_id}`` and ``sources/0/{log_id}.compact``: the line ``v1``, then one JSON entry per file
  (``path``, ``timestamp``, ``batchId``, which is the log id); a ``.compact`` file holds every entry up to its id.

Invariants:

* Every read checks the layout it expects (the Spark major version, the ``v1`` headers, each JSON key and its type,
  one source) and raises ``SparkInternalsError`` naming the file, what it expected and what it found. Nothing
  guesses, warns and carries on: a batch whose files cannot be told would let a broken segment pass unseen.
* ``check_spark`` and ``CheckpointLog.check`` run before the query starts, so a Spark or a checkpoint of another
  layout is refused before any batch; the reads during a batch check again (a new checkpoint has nothing to check
  until its first batch).
* py4j's ``Py4JJavaError`` is translated here, once: a file system call that fails raises ``HadoopIOError``.
* Paths leave this module as strings (relative to a ``HadoopDir``'s root, or URLs); no JVM object does.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from edgehub.core import ConfigurationError, EdgeHubError

__all__ = [
    "SUPPORTED_SPARK_MAJOR",
    "CheckpointLog",
    "HadoopDir",
    "HadoopIOError",
    "SparkInternalsError",
    "check_spark",
    "driver_jvm_pid",
    "gzip_error",
]

# The layout above is Spark 4's (checked on the pyspark 4.3.0 installed here). Another major version is refused,
# not tried.
SUPPORTED_SPARK_MAJOR = 4
LOG_VERSION = "v1"  # the first line of offsets/* and sources/0/*
SOURCE = "0"  # the job's one source, the landing zone's text files


class SparkInternalsError(ConfigurationError):
    """The installed Spark, or a checkpoint it wrote, is not laid out as this job reads it; the job refuses to run.

    ``path`` names the checkpoint file that differs (None when it is the Spark installation itself).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class HadoopIOError(EdgeHubError):
    """A Hadoop FileSystem call on the lake, the checkpoint or a landing file failed. ``path`` says where;
    ``java_error`` is the JVM's exception as text (what py4j raised is the cause)."""

    def __init__(self, message: str, *, path: str, java_error: str) -> None:
        super().__init__(message)
        self.path = path
        self.java_error = java_error


@contextmanager
def _java_errors(op: str, path: str) -> Iterator[None]:
    try:
        yield
    except Py4JJavaError as exc:
        java_error = str(exc.java_exception.toString())
        raise HadoopIOError(f"{op} {path} failed: {java_error}", path=path, java_error=java_error) from exc


def _gateway(spark: SparkSession) -> tuple[Any, Any]:
    """The driver JVM's py4j view and its JavaSparkContext: private attributes of ``SparkContext``."""
    try:
        sc = spark.sparkContext
    except AttributeError as exc:  # a Spark Connect session: pyspark raises its JVM_ATTRIBUTE_NOT_SUPPORTED
        raise SparkInternalsError(f"this session has no SparkContext ({exc}): the job needs a classic session") from exc
    jvm, jsc = getattr(sc, "_jvm", None), getattr(sc, "_jsc", None)
    if jvm is None or jsc is None:
        raise SparkInternalsError(
            f"SparkContext of Spark {spark.version} has no py4j gateway (_jvm, _jsc): the job reads the lake and the "
            "checkpoint through the driver's JVM"
        )
    return jvm, jsc


def check_spark(spark: SparkSession) -> None:
    """Refuse a Spark whose checkpoint layout or driver internals this job was not written against."""
    major = spark.version.split(".", 1)[0]
    if major != str(SUPPORTED_SPARK_MAJOR):
        raise SparkInternalsError(
            f"Spark {spark.version}: this job reads streaming checkpoints as Spark {SUPPORTED_SPARK_MAJOR}.x lays them "
            f"out; run it on Spark {SUPPORTED_SPARK_MAJOR}.x, or check spark_upload/spark_internals.py against this "
            "version first"
        )
    _gateway(spark)


def driver_jvm_pid(spark: SparkSession) -> int:
    """The process id of the driver's JVM (in local mode it holds the executors too)."""
    jvm, _ = _gateway(spark)
    return int(jvm.java.lang.ProcessHandle.current().pid())


def _file_system(spark: SparkSession, url: str) -> tuple[Any, Any]:
    """(the Hadoop Path of ``url``, the FileSystem that serves it), with the session's Hadoop configuration."""
    jvm, jsc = _gateway(spark)
    with _java_errors("open file system of", url):
        path = jvm.org.apache.hadoop.fs.Path(url)
        return path, path.getFileSystem(jsc.hadoopConfiguration())


def gzip_error(spark: SparkSession, url: str) -> str | None:
    """None when the file at ``url`` is a whole gzip stream; else what is wrong with it. Runs in the driver's JVM:
    ``GZIPInputStream`` checks each member's CRC-32 and length, and raises on a stream that ends early."""
    jvm, _ = _gateway(spark)
    try:
        path, fs = _file_system(spark, url)
        with _java_errors("read gzip", url):
            stream = fs.open(path)
            try:
                jvm.java.util.zip.GZIPInputStream(stream, 1 << 16).transferTo(
                    jvm.java.io.OutputStream.nullOutputStream()
                )
            finally:
                stream.close()
    except HadoopIOError as exc:
        return exc.java_error
    return None


class HadoopDir:
    """Hadoop FileSystem operations under one folder: the lake or the checkpoint (local, HDFS, s3a, abfs: whatever
    the session can reach). Python never opens these paths itself, so a remote lake works like a local one. Paths
    are given as parts relative to the root, and ``glob`` answers with such relative paths."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm, _ = _gateway(spark)
        self._jvm = jvm
        # Looked up once: each step of ``jvm.org.apache...`` is a py4j round trip, and a path is made per call.
        self._path_class = jvm.org.apache.hadoop.fs.Path
        root_path, self._fs = _file_system(spark, root)
        self.root = str(root_path.toString())
        with _java_errors("qualify", root):
            self._qualified = str(self._fs.makeQualified(root_path).toString()).rstrip("/") + "/"

    def uri(self, *parts: str) -> str:
        """The URL of ``parts`` under the root, for Spark's readers and writers."""
        return self.root + "/" + "/".join(parts)

    def _path(self, *parts: str) -> Any:
        return self._path_class(self.uri(*parts))

    def exists(self, *parts: str) -> bool:
        with _java_errors("stat", self.uri(*parts)):
            return bool(self._fs.exists(self._path(*parts)))

    def delete(self, *parts: str) -> None:
        """Delete a file or a whole folder; nothing when it is not there."""
        with _java_errors("delete", self.uri(*parts)):
            self._fs.delete(self._path(*parts), True)

    def touch(self, *parts: str, text: str = "") -> None:
        """Create (or replace) a file holding ``text``."""
        with _java_errors("write", self.uri(*parts)):
            out = self._fs.create(self._path(*parts), True)
            try:
                out.write(bytearray(text.encode("utf-8")))
            finally:
                out.close()

    def read_text(self, *parts: str) -> str | None:
        """The whole file as UTF-8, or None when it does not exist."""
        data = self.read_bytes(*parts)
        return None if data is None else data.decode("utf-8")

    def read_bytes(self, *parts: str) -> bytes | None:
        """The whole file, or None when it does not exist."""
        with _java_errors("read", self.uri(*parts)):
            p = self._path(*parts)
            if not self._fs.exists(p):
                return None
            stream = self._fs.open(p)
            try:
                return bytes(stream.readAllBytes())
            finally:
                stream.close()

    def publish(self, data: bytes, *parts: str) -> bool:
        """Write ``data`` as a new file, visible whole or not at all: first under a name starting with ``.`` in the
        same folder (Spark's file sources skip those), then renamed; Hadoop's ``create`` makes missing folders.
        False, and nothing written, when the file is there already."""
        if self.exists(*parts):
            return False
        *folder, name = parts
        tmp = (*folder, f".{name}.tmp")
        with _java_errors("write", self.uri(*tmp)):
            out = self._fs.create(self._path(*tmp), True)
            try:
                out.write(bytearray(data))
            finally:
                out.close()
        if self.exists(*parts):  # a second writer got there first: same name, same bytes
            self.delete(*tmp)
            return False
        self.rename("/".join(tmp), "/".join(parts))
        return True

    def glob(self, pattern: str) -> list[str]:
        """The paths under the root matching ``pattern`` (Hadoop glob), relative to the root, sorted."""
        with _java_errors("list", self.uri(pattern)):
            found = self._fs.globStatus(self._path(pattern))
            names = [] if found is None else [str(s.getPath().toString()) for s in found]
        for name in names:
            if not name.startswith(self._qualified):
                raise SparkInternalsError(f"Hadoop listed {name} for {self.uri(pattern)}, outside {self._qualified}")
        return sorted(name[len(self._qualified) :] for name in names)

    def mkdirs(self, *parts: str) -> None:
        with _java_errors("mkdirs", self.uri(*parts)):
            self._fs.mkdirs(self._path(*parts))

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (both relative to the root); the destination's folder must exist."""
        with _java_errors("rename", self.uri(src)):
            moved = self._fs.rename(self._path(src), self._path(dst))
        if not moved:
            raise HadoopIOError(
                f"rename {self.uri(src)} -> {self.uri(dst)} failed", path=self.uri(src), java_error="returned false"
            )


# --- the checkpoint -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Offsets:
    batch_at: datetime  # the batch's time: current_timestamp() inside it, fixed here so a replay gets the same
    log_offset: int | None  # the file source's log offset at the end of the batch; None while it has read nothing


def _json_object(text: str, *, path: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise SparkInternalsError(f"{path}: expected {what} as a JSON object, found {text[:200]!r}", path=path)
    return value


def _field(obj: dict[str, Any], key: str, kind: type, *, path: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise SparkInternalsError(
            f"{path}: expected {key!r} of type {kind.__name__}, found {value!r} (keys: {sorted(obj)})", path=path
        )
    return value


def _body(text: str, *, path: str) -> list[str]:
    """The lines after the version header, which must be ``v1``."""
    lines = text.splitlines()
    header = lines[0].strip() if lines else ""
    if header != LOG_VERSION:
        raise SparkInternalsError(
            f"{path}: expected log format {LOG_VERSION}, found {header[:40]!r}: this Spark writes its checkpoint in "
            "another layout than the job reads",
            path=path,
        )
    return lines[1:]


class CheckpointLog:
    """The files of a streaming query's checkpoint the job reads (the layout in the module docstring)."""

    def __init__(self, folder: HadoopDir) -> None:
        self.folder = folder
        self.root = folder.root

    def is_new(self) -> bool:
        """True when no batch was planned yet (no offsets file)."""
        return not self._offset_ids()

    def query_id(self) -> str | None:
        """The id of the query the checkpoint belongs to, written when the query first starts; None before."""
        text = self.folder.read_text("metadata")
        if text is None:
            return None
        path = self.folder.uri("metadata")
        return str(_field(_json_object(text, path=path, what="the query metadata"), "id", str, path=path))

    def batch_at(self, batch_id: int) -> datetime:
        """The batch's time (``current_timestamp()`` in the batch), from its offsets file."""
        return self._required_offsets(batch_id).batch_at

    def batch_files(self, batch_id: int) -> list[str]:
        """The landing files query batch ``batch_id`` read: the file source's log entries after the previous
        batch's log offset up to its own. Spark keeps the previous batch's offsets to recover; should they be gone
        (older than ``minBatchesToRetain``), the batch's own entry is read."""
        end = self._required_offsets(batch_id).log_offset
        if end is None:
            return []
        before = self._offsets(batch_id - 1) if batch_id > 0 else None
        if batch_id == 0:
            first = 0
        elif before is None:
            first = end
        else:
            first = 0 if before.log_offset is None else before.log_offset + 1
        return [file for log_id in range(first, end + 1) for file in self._source_log(log_id)]

    def check(self) -> None:
        """Read what the job will read of this checkpoint (its metadata, its newest offsets and the source log
        entry they point at); raises ``SparkInternalsError`` when any of it is laid out otherwise. A new
        checkpoint passes: it has nothing yet."""
        ids = self._offset_ids()
        if not ids:
            return
        sources = [posixpath.basename(p) for p in self.folder.glob("sources/*")]
        if sources and sources != [SOURCE]:
            raise SparkInternalsError(
                f"{self.folder.uri('sources')}: expected the one source {SOURCE}, found {sources}",
                path=self.folder.uri("sources"),
            )
        if self.query_id() is None:
            raise SparkInternalsError(
                f"{self.folder.uri('metadata')} is missing, though the checkpoint has batches",
                path=self.folder.uri("metadata"),
            )
        newest = self._required_offsets(ids[-1])
        if newest.log_offset is not None:
            self._source_log(newest.log_offset)

    def _offset_ids(self) -> list[int]:
        names = (posixpath.basename(p) for p in self.folder.glob("offsets/[0-9]*"))
        return sorted(int(name) for name in names if name.isdigit())

    def _offsets(self, batch_id: int) -> _Offsets | None:
        """``offsets/{batch}`` read and checked; None when it is not there."""
        text = self.folder.read_text("offsets", str(batch_id))
        if text is None:
            return None
        path = self.folder.uri("offsets", str(batch_id))
        lines = _body(text, path=path)
        if len(lines) != 2:
            raise SparkInternalsError(
                f"{path}: expected the batch metadata and one source's offset, found {len(lines)} lines", path=path
            )
        meta = _json_object(lines[0], path=path, what="the batch metadata")
        batch_ms = _field(meta, "batchTimestampMs", int, path=path)
        source = lines[1].strip()
        log_offset = None
        if source != "-":
            log_offset = _field(
                _json_object(source, path=path, what="the file source offset"), "logOffset", int, path=path
            )
        return _Offsets(batch_at=datetime.fromtimestamp(batch_ms / 1000, UTC), log_offset=log_offset)

    def _required_offsets(self, batch_id: int) -> _Offsets:
        found = self._offsets(batch_id)
        if found is None:
            path = self.folder.uri("offsets", str(batch_id))
            raise SparkInternalsError(
                f"{path} is missing: Spark writes a batch's offsets before it runs the batch", path=path
            )
        return found

    def _source_log(self, log_id: int) -> list[str]:
        """The files of the file source's log entry ``log_id``, from its own file or the ``.compact`` that covers
        it (the first at or after it)."""
        name = str(log_id)
        text = self.folder.read_text("sources", SOURCE, name)
        if text is None:
            compacted = [
                posixpath.basename(p).removesuffix(".compact") for p in self.folder.glob(f"sources/{SOURCE}/*.compact")
            ]
            covering = sorted(int(k) for k in compacted if k.isdigit() and int(k) >= log_id)
            if covering:
                name = f"{covering[0]}.compact"
                text = self.folder.read_text("sources", SOURCE, name)
        path = self.folder.uri("sources", SOURCE, name)
        if text is None:
            raise SparkInternalsError(
                f"{path} is missing, and no .compact file covers log entry {log_id}: the file source's log is not "
                "laid out as the job reads it",
                path=path,
            )
        files = []
        for line in _body(text, path=path):
            if line.strip():
                entry = _json_object(line, path=path, what="a file source log entry")
                if _field(entry, "batchId", int, path=path) == log_id:
                    files.append(str(_field(entry, "path", str, path=path)))
        return files
