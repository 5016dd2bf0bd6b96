"""A Spark standalone cluster on 127.0.0.1 from the pyspark installation: one master, N workers, spark-submit.

For the cluster test and the benchmark, and for users who want to try the job on a real cluster on one box:

    with StandaloneCluster(workers=2, work_dir=Path("/tmp/spark-cluster")) as cluster:
        cluster.submit(["--landing", ..., "--lake", ..., "--checkpoint", ...])

``submit`` ships the job as docs/spark.md says: ``spark_upload/job.py`` with ``--py-files`` a zip of the
``spark_upload`` and ``edgehub`` packages (``job_zip``), and without the caller's ``PYTHONPATH``, so the driver
imports the job's modules from the zip as it would on a cluster's host.

Invariants: every process listens on 127.0.0.1 only (ports picked free); ``__enter__`` returns once the master has
elected itself leader and every worker has registered with it (read from their logs, never by sleeping);
``__exit__`` terminates exactly the processes it started.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import pyspark

__all__ = ["JOB_FILE", "StandaloneCluster", "job_zip", "spark_home"]

JOB_FILE = Path(__file__).with_name("job.py")
JOB_PACKAGES = ("spark_upload", "edgehub")  # what job.py imports: its siblings and the segment format


def spark_home() -> Path:
    """The Spark installation inside the pyspark package."""
    return Path(pyspark.__file__).parent


def job_zip(dest: Path) -> Path:
    """Write ``dest``: the packages the job imports (``JOB_PACKAGES``, from where this Python finds them), for
    ``spark-submit --py-files``. Same as ``python -m zipfile -c dest spark_upload edgehub`` in a checkout."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
        for package in JOB_PACKAGES:
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise RuntimeError(f"package {package} not found: the job cannot be shipped without it")
            root = Path(next(iter(spec.submodule_search_locations)))
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    out.write(path, Path(package) / path.relative_to(root))
    return dest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores_per_worker`` cores each, as child processes."""

    def __init__(
        self,
        *,
        work_dir: Path,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        start_timeout_s: float = 90.0,
    ) -> None:
        self.work_dir = work_dir
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.start_timeout_s = start_timeout_s
        self.port = _free_port()
        self._procs: list[subprocess.Popen[str]] = []
        self._logs: list[IO[str]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.work_dir / "local"),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        return env

    def _start(self, name: str, args: Sequence[str], ready: str) -> None:
        log_path = self.work_dir / f"{name}.log"
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
        )
        self._procs.append(proc)
        assert proc.stderr is not None
        log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
        self._logs.append(log)
        seen = threading.Event()
        stream = proc.stderr

        def pump() -> None:
            # Keeps draining the pipe after readiness so the child never blocks on a full pipe.
            for line in stream:
                log.write(line)
                if ready in line:
                    log.flush()
                    seen.set()
            log.flush()

        threading.Thread(target=pump, name=f"spark-{name}-log", daemon=True).start()
        if not seen.wait(self.start_timeout_s):
            raise RuntimeError(f"spark {name} did not log {ready!r} within {self.start_timeout_s}s; see {log_path}")

    def __enter__(self) -> Self:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(_free_port()),
                ],
                "I have been elected leader",
            )
            for i in range(self.workers):
                self._start(
                    f"worker-{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(self.cores_per_worker),
                        "--memory",
                        self.memory_per_worker,
                        "--webui-port",
                        str(_free_port()),
                        "--work-dir",
                        str(self.work_dir / f"worker-{i}"),
                        self.master_url,
                    ],
                    "Successfully registered with master",
                )
        except BaseException:
            self._stop()
            raise
        return self

    def submit(
        self, job_args: Sequence[str], *, conf: dict[str, str] | None = None, timeout_s: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """``spark-submit --master spark://... --py-files JOB_ZIP spark_upload/job.py ARGS``; raises when the job
        fails."""
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url]
        settings = {
            "spark.executor.memory": "512m",
            "spark.executor.cores": str(self.cores_per_worker),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            **(conf or {}),
        }
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += ["--py-files", str(job_zip(self.work_dir / "edgehub-job.zip")), str(JOB_FILE), *job_args]
        env = self.env()
        env.pop("PYTHONPATH", None)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=True)

    def _stop(self) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()
