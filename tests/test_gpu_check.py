"""``GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh`` (issues #29 and #39's contract): exit 0 and one verdict
line per check, ``NAME ok [...]`` for each that applies on CPU/gloo and ``NAME skipped (needs CUDA)`` for the others."""

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
    verdicts = {line.split(" ", 1)[0]: line.split(" ", 2)[1] for line in lines}
    assert list(verdicts) == ["fp16-loss-scale-clip", "bf16-clip", "side-stream-snapshot", "cuda-event-timing",
                              "live-move-group-reformations", "stage-worker-interleaved", "sync-audit", "abort-reform",
                              "snapshot-overlap", "api-one-stage", "api-data-parallel-of-one", "live-moves-20"], lines
    needs_cuda = {"cuda-event-timing", "sync-audit"}
    assert all(line == f"{name} skipped (needs CUDA)" for name, line in zip(verdicts, lines) if name in needs_cuda), lines
    assert all(v == "ok" for name, v in verdicts.items() if name not in needs_cuda), lines


def test_gpu_check_refuses_an_unknown_device_in_one_line() -> None:
    env = {**os.environ, "GPU_CHECK_DEVICE": "tpu", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip() == "GPU_CHECK_DEVICE must be cpu or cuda, not 'tpu'"
