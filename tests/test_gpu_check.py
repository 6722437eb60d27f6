"""``GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh`` (issue #29's contract): exit 0 and one
verdict line per check that applies on CPU/gloo, each ``ok``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.ray
def test_gpu_check_on_cpu_passes_every_applicable_check() -> None:
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    names = [line.split(" [", 1)[0] for line in lines]
    assert names == ["fp16-loss-scale-clip", "bf16-clip", "side-stream-snapshot", "live-move-group-reformations",
                     "api-one-stage", "api-data-parallel-of-one"], lines
    assert all(line.endswith("-- ok") for line in lines), lines


def test_gpu_check_refuses_an_unknown_device_in_one_line() -> None:
    env = {**os.environ, "GPU_CHECK_DEVICE": "tpu", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip() == "GPU_CHECK_DEVICE must be cpu or cuda, not 'tpu'"
