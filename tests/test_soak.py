"""The short soak: benchmarks/soak.py for 60 steps on a 3-node ``ray.cluster_utils`` cluster, a seeded fault every
10 steps, each of the six kinds once (unnoticed death, node removal, notice for a device, notice for a node, node
join, slowdown). It runs in ``make test`` (about 1 minute alone, 2-3 beside other work); marked ``soak``, so
``pytest -m 'not soak'`` leaves it out.
The ``--trace`` schedule (benchmarks/soak_trace.py) is pure and checked here without Ray, in every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.soak_trace import trace_schedule, transitions

ROOT = Path(__file__).resolve().parents[1]


def loop_recovers_in_place() -> bool:
    """Whether the job loop calls the runtime's recovery in place: without it a node removal cannot be survived
    (a full restart needs a worker on every slot, the removed node's too), so the soak cannot pass yet."""
    return any("recover_in_place" in p.read_text() for p in (ROOT / "orchestrator" / "elastic").glob("*.py"))


@pytest.mark.soak
@pytest.mark.ray
@pytest.mark.skipif(not loop_recovers_in_place(), reason="the job loop does not call PipelineTrainer.recover_in_place yet")
@pytest.mark.timeout(600)
def test_a_short_soak_survives_every_kind_of_fault_exactly_and_leaks_nothing() -> None:
    pytest.importorskip("ray.cluster_utils")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    six = "death,node_removal,notice_device,notice_node,join,slowdown"  # not hang: its deadline's floor alone is 30 s
    run = subprocess.run([sys.executable, "benchmarks/soak.py", "--steps", "70", "--seed", "7", "--kinds", six], capture_output=True,
                         text=True, timeout=560, cwd=ROOT, env=env)
    lines = run.stdout.strip().splitlines()
    assert lines, run.stderr[-4000:]
    found = json.loads(lines[-1])
    assert found["error"] is None, found["error"]
    assert found["max_abs_diff"] is not None and found["max_abs_diff"] <= 1e-5, found
    assert found["leaked"] == [], found["leaked"]
    assert all(found["faults"][k] >= 1 for k in six.split(",")), found["faults"]  # every kind asked for drawn once early
    assert all(h.get("completed") for h in found["handled"]), found["handled"]  # training went on after every fault
    deaths = [h for h in found["handled"] if h["fault"].startswith(("death", "node_removal"))]
    # survivors kept their processes (a node removal that took only idle devices needs no recovery: capacity_lost)
    assert all("in_place" in h["modes"] or "worker_failed" not in h["events"] for h in deaths), deaths
    assert run.returncode == 0, found


def availability(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    """Events as cloud.availability.load_availability returns them: (time, offer's zone, kind), one GPU type."""
    return pd.DataFrame({"at": pd.to_datetime([t for t, _, _ in rows], utc=True), "cloud": "gcp", "zone": [z for _, z, _ in rows],
                         "gpu_type": "K80", "gpu_count": 1, "kind": [k for _, _, k in rows], "where": "log:1"})


def test_a_trace_follows_the_two_most_preempted_offers_one_node_each_compressed_onto_chunk_boundaries() -> None:
    events = availability([
        ("2020-03-01T10:00", "a", "up"), ("2020-03-01T10:00", "b", "up"), ("2020-03-01T10:00", "c", "up"),
        ("2020-03-01T10:10", "a", "preempted"), ("2020-03-01T10:20", "a", "preempted"),  # lost again while gone: no change
        ("2020-03-01T10:30", "a", "failed"), ("2020-03-01T11:00", "a", "up"), ("2020-03-01T11:00", "a", "up"),
        ("2020-03-01T12:00", "b", "preempted"), ("2020-03-01T13:00", "a", "preempted"), ("2020-03-01T13:10", "c", "preempted"),
        ("2020-03-01T14:10", "b", "up"),
    ])
    # a (2 losses) and b (1 loss, earlier than c's) are followed: node 0 and node 1; c is not
    assert [(k, s) for _, k, s in transitions(events, [("gcp", "a", "K80", 1), ("gcp", "b", "K80", 1)])] == [
        ("loss", 0), ("join", 0), ("loss", 1), ("loss", 0), ("join", 1)]
    got = trace_schedule(events, steps=60, every=10)  # boundaries 10..50: five, the window is the first five changes
    assert [(e.step, e.kind, e.slot) for e in got] == [(10, "loss", 0), (20, "join", 0), (30, "loss", 1), (40, "loss", 0), (50, "join", 1)]
    assert {e.offer for e in got} == {"gcp/a/K80x1", "gcp/b/K80x1"}
    bursty = availability([("2020-03-01T10:00", "a", "preempted"), ("2020-03-01T10:01", "a", "up"), ("2020-03-01T10:02", "a", "preempted"),
                           ("2020-03-01T11:40", "b", "preempted")])
    # four boundaries: node 0 lost, back and lost again within the first chunk: lost; then node 1 lost
    assert [(e.step, e.kind, e.slot) for e in trace_schedule(bursty, steps=50, every=10)] == [(10, "loss", 0), (40, "loss", 1)]
    back = availability([("2020-03-01T10:00", "a", "preempted"), ("2020-03-01T10:01", "a", "up"), ("2020-03-01T11:40", "b", "preempted")])
    assert [(e.step, e.kind, e.slot) for e in trace_schedule(back, steps=40, every=10)] == [(10, "loss", 0), (10, "join", 0), (30, "loss", 1)]


def test_a_trace_that_is_not_there_is_one_line_and_exit_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "benchmarks/soak.py", "--steps", "60", "--trace", str(ROOT / "no-such-logs")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "no-such-logs" in run.stderr and "Traceback" not in run.stderr
