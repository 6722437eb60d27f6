"""Several Ray nodes on one machine (ray.cluster_utils.Cluster): the plan's devices are real.

The scenario runs in a subprocess (tests/multinode.py; one process joins one Ray cluster) on a
head with 1 CPU and two workers with 2 CPUs each, and checks what a user would: the cluster CLI
lists 5 devices on 3 nodes; each stage actor runs on the node its device names, as Ray's own
actor table reports; removing a node mid-training reaches the job as the loss of exactly that
node's devices and the failure policy continues on the survivors, exactly; a node added shows up
as capacity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The scenarios start several raylets (and, for Ray Jobs, a dashboard with its job agent) inside
# a module fixture, whose set-up counts toward the first test's limit.
pytestmark = pytest.mark.timeout(600)


def run_scenario(name: str) -> dict[str, Any]:
    """tests/multinode.py ``name`` in its own process (one process joins one Ray cluster)."""
    pytest.importorskip("ray.cluster_utils")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "-m", "tests.multinode", name], capture_output=True, text=True,
                         timeout=500, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def scenario() -> dict[str, Any]:
    return run_scenario("placement")


@pytest.mark.ray
def test_cluster_cli_lists_five_devices_on_three_nodes(scenario: dict[str, Any]) -> None:
    assert scenario["cli_rc"] == 0, scenario["cli_stderr"]
    devices = scenario["cli"]["devices"]
    assert len(devices) == 5 and len({d["node_id"] for d in devices}) == 3
    assert {d["node_id"] for d in devices} == set(scenario["nodes"])
    accelerators = {d["node_id"]: d["accelerator"] for d in devices}
    assert [accelerators[n] for n in scenario["nodes"]] == ["cpu", "A100", "V100"]  # read from Ray's resources
    assert all(d["speed"] > 0 and d["speed_source"] == "probe" and d["memory_bytes"] > 0 for d in devices)
    bw = scenario["cli"]["bandwidth_gbps"]
    assert len(bw) == 5 and all(bw[i][j] > 0 for i in range(5) for j in range(5) if i != j)


@pytest.mark.ray
def test_stage_actors_run_on_the_nodes_their_devices_name(scenario: dict[str, Any]) -> None:
    slots = scenario["slot_nodes"]  # device i's slot: the head's CPU, then two per worker node
    assert slots[0] == scenario["nodes"][0] and slots[1] == slots[2] != slots[3] == slots[4] != slots[0]
    expected = {str(d): node for d, node in enumerate(slots)}
    reported = scenario["state_api"]  # pid -> node, from Ray's actor table
    assert {d: reported[str(pid)] for d, pid in scenario["worker_pids"].items()} == expected
    assert all(d["node_id"] == expected[str(d["device"])] for d in scenario["devices"])


@pytest.mark.ray
def test_a_removed_node_is_device_loss_and_training_continues_exactly(scenario: dict[str, Any]) -> None:
    assert scenario["lost_slots"] == [scenario["doomed"]] * 2  # both devices of that node, nothing else
    dead = {d for d, node in enumerate(scenario["slot_nodes"]) if node == scenario["doomed"]}
    assert len(dead) == 2  # devices 1-2 or 3-4: which worker node got which slots is Ray's choice
    assert not dead & set(scenario["final_plan_devices"])
    events = scenario["events"]
    assert [e for e in events if e["event"] == "worker_failed"] and [e for e in events if e["event"] in ("recovered", "resumed")]
    assert scenario["iteration"] == 6  # fit(6): to step 6
    assert scenario["max_abs_diff"] <= 1e-6  # recovered from the survivors' snapshots and the checkpoint
    assert scenario["neighbour_copy_exact"]  # a snapshot kept on another node outlives its owner's node


@pytest.mark.ray
def test_a_node_added_is_capacity(scenario: dict[str, Any]) -> None:
    assert scenario["gained_slots"] == 2


@pytest.mark.ray
def test_elastic_example_runs_on_the_cluster_at_ray_address(scenario: dict[str, Any]) -> None:
    """examples/elastic_gpt.py with RAY_ADDRESS set: job_started names the nodes Ray ran the actors on."""
    assert scenario["example_rc"] == 0, scenario["example_stderr"]
    started = [e for e in scenario["example_events"] if e["event"] == "job_started"]
    assert started and started[0]["devices"]
    reported = scenario["example_actor_nodes"]
    for d in started[0]["devices"]:
        assert reported[str(d["pid"])] == d["node_id"]
        assert d["node_id"] in scenario["nodes"]


@pytest.fixture(scope="module")
def submitted() -> dict[str, Any]:
    return run_scenario("jobs")


@pytest.mark.ray
def test_ray_job_submit_runs_the_example_to_the_end(submitted: dict[str, Any]) -> None:
    assert submitted["rc"] == 0, submitted["stdout"][-3000:] + submitted["stderr"][-2000:]
    assert submitted["status"] == "SUCCEEDED", f"job {submitted['status']}: {submitted['logs']}"
    started = [e for e in submitted["events"] if e["event"] == "job_started"]
    assert started and started[0]["devices"] and all(submitted["actor_nodes"][str(d["pid"])] == d["node_id"] for d in started[0]["devices"])


@pytest.fixture(scope="module")
def grown() -> dict[str, Any]:
    return run_scenario("growth")


@pytest.mark.ray
def test_a_node_added_under_a_running_job_gets_blocks_live_and_training_stays_exact(grown: dict[str, Any]) -> None:
    events = grown["events"]
    started = [e for e in events if e["event"] == "job_started"][0]
    added = [e for e in events if e["event"] == "capacity_added"]
    assert len(added) == 1 and added[0]["source"].startswith("ray: node"), added
    new_node = grown["nodes"][2]
    assert added[0]["devices"] == [{"device": 2, "node_id": new_node}]
    assert added[0]["decision"] == "move" and any(dst == 2 for _, dst in added[0]["moves"]), added
    where = {d["device"]: d for d in grown["devices"]}
    if 2 in where:  # device 2's actor runs on the new node, as Ray's own actor table says
        assert where[2]["node_id"] == new_node == grown["actor_nodes"][str(where[2]["pid"])]
    survivors = {d["device"]: d["pid"] for d in started["devices"]}
    assert all(where[d]["pid"] == pid for d, pid in survivors.items() if d in where)  # kept their processes
    assert grown["restarts"] == 0 and not [e for e in events if e["event"] == "resumed"]
    assert grown["step"] == 30 and grown["max_abs_diff"] <= 1e-5
