"""The supervisor with the real job: ``examples/elastic_gpt.py`` (an unmodified driver) under
``orchestrator run --provider local`` with checkpoints on a local S3 server (moto), a replayed
price rise moving it from cluster A to cluster B, and its final weights against uninterrupted
single-process training (the contract of issue 23, at a smaller step count) — right after the same
command with a data function that raises (``tests/bad_shard_driver.py``) failed once, not relaunched
(the contract of issue 41)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.supervise.local import listening
from tests.servers import s3_bucket, s3_endpoint  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[1]


def _job_speaks_the_protocol() -> bool:
    from orchestrator.elastic.job_config import RunConfig

    return "resume" in RunConfig.__dataclass_fields__


pytestmark = [pytest.mark.ray, pytest.mark.timeout(1200), pytest.mark.skipif(not _job_speaks_the_protocol(), reason="the job has no resume/run record yet")]


def test_a_user_crash_fails_once_then_the_fixed_driver_moves_between_local_clusters_exactly(s3_bucket: str, tmp_path: Path) -> None:  # noqa: F811
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)

    def run(driver: str, out: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "orchestrator", "run", "--provider", "local", "--storage", f"{s3_bucket}/run",
               "--out", str(tmp_path / out), "--price-change-at", "4", "--", driver, "--steps", "8",
               "--checkpoint-every", "3", "--verify", "--out", str(tmp_path / "driver")]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)

    # the real driver with a data function that raises at step 3: a user error, reported once, never relaunched
    crash = run("tests/bad_shard_driver.py", "crash")
    errors = [line for line in crash.stderr.splitlines() if line.startswith("error:")]
    assert crash.returncode == 2 and len(errors) == 1 and "bad shard" in errors[0], crash.stderr[-3000:]
    crashed = [json.loads(line) for line in (tmp_path / "crash" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in crashed].count("job_submitted") == 1 and not [e for e in crashed if e["event"] == "cluster_lost"]
    from orchestrator.supervise.state import read_record

    record = read_record(f"{s3_bucket}/run")
    assert record is not None and record.status == "failed"
    # the unmodified example right after, on the same storage: its offers were never blocked; a price rise moves it
    proc = run("examples/elastic_gpt.py", "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    diffs = [float(x) for x in re.findall(r"max_abs_diff=([0-9.e+-]+)", proc.stdout)]
    assert diffs and diffs[-1] <= 1e-5, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    assert events[:len(crashed)] == crashed  # the run's log: the crash first
    events = events[len(crashed):]  # the second command's
    started = [e for e in events if e["event"] == "job_started"]
    assert len({e["cluster"] for e in started}) >= 2
    (move,) = [e for e in events if e["event"] == "migration"]
    assert move["reason"] == "price" and move["from_cluster"] != move["to_cluster"]
    on_b = [e for e in started if e["cluster"] == move["to_cluster"]]
    assert on_b and on_b[0]["resumed_from"] == move["step"]
    down = [e for e in events if e["event"] == "cluster_down" and e["cluster"] == move["from_cluster"]]
    assert len(down) == 1 and re.fullmatch(r"127\.0\.0\.1:\d+", down[0]["address"])
    assert not listening(down[0]["address"])
    # the ledger: each job's last event carries its dollars; the run's total covers both jobs
    spent = [e["usd_job"] for e in events if e["event"] in ("migration_requested", "job_finished")]
    (finished,) = [e for e in events if e["event"] == "run_finished"]
    assert len(spent) == 2 and all(x > 0 for x in spent) and finished["usd_total"] >= sum(spent) - 1e-6
    assert finished["usd_clusters"] >= finished["usd_jobs"] > 0 and finished["samples"] == 8 * 64  # the clusters outlive the jobs
    assert finished["usd_per_million_samples"] == pytest.approx(finished["usd_total"] / finished["samples"] * 1e6, rel=1e-3)
