"""A benchmark run as a user runs it, for the smoke tests: ``python -m bench.NAME ARGS`` in a subprocess of its own
process group, under a timeout, from the repository's root; its exit code must be 0 and the last line of its
output one JSON object, which the run returns.

On a timeout the whole group is killed (the benchmark and the brokers, clients and JVMs it started) and the test
fails with what the benchmark printed so far. A peer from Debian that is missing fails the test with the package
to install (``make apt`` installs them all), rather than skipping it: a benchmark whose peer is never there would
rot as surely as one never run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ROOT", "need_program", "run_bench"]

ROOT = Path(__file__).resolve().parents[2]


def need_program(name: str, package: str) -> None:
    """Fail, saying which Debian package to install, unless ``name`` is on the PATH or in /usr/sbin."""
    if shutil.which(name) is None and not (Path("/usr/sbin") / name).exists():
        pytest.fail(f"{name} is missing: apt-get install {package} (or make apt)")


def run_bench(name: str, *args: str, timeout_s: float) -> dict[str, Any]:
    """``python -m bench.NAME ARGS``: its last line of output, parsed as one JSON object."""
    cmd = [sys.executable, "-m", f"bench.{name}", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"bench.{name} did not finish in {timeout_s:g} s:\n{out}\n{err[-4000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it started and left behind
    print(out)  # the benchmark's figures, shown with -s or -rP
    assert proc.returncode == 0, f"bench.{name} exited with {proc.returncode}:\n{out}\n{err[-4000:]}"
    lines = out.strip().splitlines()
    assert lines, f"bench.{name} printed nothing:\n{err[-4000:]}"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict), f"bench.{name}'s last line is not a JSON object: {lines[-1]}"
    return figures
