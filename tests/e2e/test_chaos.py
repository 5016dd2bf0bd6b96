"""``python -m bench.chaos --minutes 2`` as a user runs it: two minutes of hub kills, link outages and rate
changes under MQTT and AMQP publishers, a module, and a cloud sending cloud-to-device messages and calling
methods, then the Spark job over what landed; nothing acknowledged is lost, nothing lands twice, no priority lane
of a device is out of order, every cloud-to-device message reaches its device, every method call is answered
with a status it can have had (or lost with a kill or an outage), the hub's memory stays under its bound, and
the hub was killed at least twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.chaos.rig import PIDS_FILE, kill_groups

pytestmark = [pytest.mark.slow, pytest.mark.interop, pytest.mark.spark, pytest.mark.timeout(480)]

ROOT = Path(__file__).resolve().parents[2]


def test_two_minutes_of_chaos_lose_nothing_duplicate_nothing_and_keep_each_lane_in_order(tmp_path: Path) -> None:
    work = tmp_path / "chaos"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.chaos", "--minutes", "2", "--seed", "1", "--keep", str(work)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the run's own clean-up kills what it started
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"bench.chaos did not finish in 7 minutes:\n{out}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_groups(work / "logs" / PIDS_FILE)  # none should be left; a run killed outright could leave some
    print(out)  # the run's report, shown with -s or -rP
    assert proc.returncode == 0, out
    verdict = json.loads(out.strip().splitlines()[-1])
    assert {"acknowledged", "delivered", "expired", "lost", "duplicates", "order_violations", "kills"} <= set(verdict)
    assert verdict["lost"] == 0, out
    assert verdict["duplicates"] == 0, out
    assert verdict["order_violations"] == 0, out
    assert verdict["module_order_violations"] == 0, out
    assert verdict["kills"] >= 2, out
    assert verdict["acknowledged"] > 500, out
    assert verdict["delivered"] + verdict["expired"] == verdict["acknowledged"], out
    assert verdict["amqp_acknowledged"] > 250, out  # 2 of the 6 devices publish over AMQP
    assert verdict["c2d_acknowledged"] > 20, out
    assert verdict["c2d_lost"] == 0, out
    assert verdict["methods_called"] > 40, out
    assert verdict["methods_wrong"] == 0, out
    assert verdict["methods_answered"] > 0, out
    assert verdict["methods_timed_out"] > 0, out  # the "ignore" calls, answered 504 by the hub
    assert verdict["hub_rss_peak_mib"] <= verdict["hub_rss_limit_mib"], out
    assert verdict["hub_rss_processes"] >= verdict["kills"], out  # every hub process's memory was watched
