"""``bench.wear`` at a smoke size on its private ext4 file system on a loop device, as it runs as root: the bytes
that reached the device per message, journal and metadata included, by fsync policy. Without root it falls back to
the page cache's count only, which ``tests/bench/test_smoke.py`` runs everywhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.bench.bench_process import run_bench

pytestmark = [pytest.mark.slow]


def test_wear_counts_the_bytes_each_policy_wrote_to_its_own_loop_device(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        # CI runs the suite as root, so there this test always runs; only a developer's unprivileged run skips.
        pytest.skip("needs root to set up a loop device and mount it (CI runs as root and runs this test)")
    if shutil.which("losetup") is None or shutil.which("mkfs.ext4") is None:
        pytest.fail("losetup and mkfs.ext4 are missing: apt-get install mount e2fsprogs")
    figures = run_bench("wear", "--seconds", "0.5", "--dir", str(tmp_path), timeout_s=100)
    assert len(figures) == 3
    for cases in figures.values():
        for case in cases.values():
            assert case["msgs"] > 0
            # None would mean no loop device could be had: the run measured the page cache only
            assert case["device_bytes"] is not None, figures
            assert case["device_bytes"] > 0
            assert case["flush_device_bytes"] is not None
