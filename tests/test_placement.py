"""Slots, identity checks, node watching, link matrices and bad cluster input — without a cluster.

Ray's node table is plain data here (the shape ``ray.nodes()`` returns), so every rule is
checked on GPU and mixed clusters this CPU machine cannot start; tests/test_multinode.py runs
the same code on real raylets.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.placement import NodeTable, Slot, check_identity, discover, node_accelerator, probe_pairs
from actors.probe import prior_speed
from orchestrator.core.cluster import GBPS
from orchestrator.train.discovery import link_matrix
from orchestrator.core.errors import UserError


def node(node_id: str, cpus: float = 0, gpus: int = 0, head: bool = False, accel: str = "", alive: bool = True,
         memory: float = 64e9) -> dict[str, Any]:
    res: dict[str, float] = {"CPU": cpus, "memory": memory}
    if gpus:
        res["GPU"] = gpus
    if accel:
        res[f"accelerator_type:{accel}"] = 1.0
    if head:
        res["node:__internal_head__"] = 1.0
    return {"NodeID": node_id, "Alive": alive, "Resources": res, "NodeManagerAddress": "10.0.0.1", "Labels": {}}


MIXED = [node("b-a100", 16, 2, accel="A100"), node("a-head", 4, head=True), node("c-v100", 8, 4, accel="V100"),
         node("d-dead", 8, 8, accel="H100", alive=False)]


def test_gpu_slots_one_per_gpu_with_ray_accelerator_type_head_first() -> None:
    slots = discover(nodes=MIXED)
    assert [(s.node_id, s.accelerator, s.index) for s in slots] == (
        [("b-a100", "A100", 0), ("b-a100", "A100", 1)] + [("c-v100", "V100", i) for i in range(4)])
    assert all(s.kind == "gpu" for s in slots)  # the dead H100 node offers nothing


def test_cpu_slots_one_per_cpu_on_a_cluster_and_what_the_job_asks_on_one_node() -> None:
    cluster = [node("w1", 2), node("h", 1, head=True), node("w2", 2)]
    slots = discover("cpu", local_slots=8, nodes=cluster)  # several nodes: local_slots does not apply
    assert [s.node_id for s in slots] == ["h", "w1", "w1", "w2", "w2"]
    single = discover("cpu", local_slots=4, nodes=[node("h", 2, head=True)])
    assert len(single) == 4 and all(s.share == 0.5 for s in single)  # 4 slots share 2 cores
    assert discover("cpu", nodes=[node("h", 2, head=True)])[1].memory_bytes == pytest.approx(32e9)


def test_no_usable_node_is_one_line() -> None:
    with pytest.raises(UserError, match="no alive node with GPUs"):
        discover("gpu", nodes=[node("h", 4)])


def test_accelerator_from_resource_or_label() -> None:
    assert node_accelerator({"accelerator_type:L4": 1.0}) == "L4"
    assert node_accelerator({}, {"ray.io/accelerator-type": "H100"}) == "H100"
    assert node_accelerator({}) == ""


def test_identity_must_match_the_slot() -> None:
    slot = Slot("node-a", "gpu", "A100", 0)
    check_identity(0, slot, {"node_id": "node-a", "accelerator": "A100", "gpu_ids": ["3"]})  # index may differ
    with pytest.raises(UserError, match="device 0 was planned on node node-a but its actor runs on node-b"):
        check_identity(0, slot, {"node_id": "node-b", "accelerator": "A100", "gpu_ids": ["0"]})
    with pytest.raises(UserError, match="planned on a A100 but its actor got a V100"):
        check_identity(0, slot, {"node_id": "node-a", "accelerator": "V100", "gpu_ids": ["0"]})
    with pytest.raises(UserError, match="its actor's GPU is a NVIDIA V100"):  # the label lies about the hardware
        check_identity(0, slot, {"node_id": "node-a", "accelerator": "A100", "gpu_ids": ["0"], "device_name": "NVIDIA V100-SXM2-16GB"})
    check_identity(0, Slot("node-a", "gpu", "A100-80G", 0),
                   {"node_id": "node-a", "accelerator": "A100-80G", "gpu_ids": ["1"], "device_name": "NVIDIA A100-SXM4-80GB"})
    with pytest.raises(UserError, match="got none"):
        check_identity(0, slot, {"node_id": "node-a", "accelerator": "A100", "gpu_ids": []})


def test_the_node_table_reports_lost_and_gained_slots_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    table = [node("h", 1, head=True), node("w1", 2), node("w2", 2)]
    monkeypatch.setattr(ray, "nodes", lambda: table)
    watcher = NodeTable("cpu")
    assert watcher.poll(table) == ([], [])
    after = [table[0], table[1], node("w3", 4)]
    lost, gained = watcher.poll(after)
    assert [s.node_id for s in lost] == ["w2", "w2"] and [s.node_id for s in gained] == ["w3"] * 4
    assert watcher.poll(after) == ([], [])  # reported once


def test_probe_pairs_all_for_small_jobs_one_per_node_pair_for_large() -> None:
    small = [Slot("a", "gpu", "A100", i) for i in range(4)]
    assert probe_pairs(small) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    big = [Slot(n, "gpu", "A100", i) for n in "abc" for i in range(4)]
    assert probe_pairs(big) == [(0, 1), (0, 4), (0, 8), (4, 5), (4, 8), (8, 9)]


def test_link_matrix_fills_unprobed_pairs_from_their_node_pair() -> None:
    nodes = ["a", "a", "b", "b"]
    measured = {(0, 1): (1e-5, 50 * GBPS), (0, 2): (1e-4, 5 * GBPS)}
    bw, latency = link_matrix(nodes, measured, (100.0, 10.0))
    assert bw[0, 1] == bw[1, 0] == 50 * GBPS
    assert bw[1, 3] == bw[3, 0] == 5 * GBPS  # a-b pairs take the a-b measurement
    assert bw[2, 3] == 100 * GBPS  # inside b nothing was measured: the nominal intra figure
    assert latency == pytest.approx(5.5e-5)


def test_prior_speed_table_matches_vendor_names() -> None:
    assert prior_speed("NVIDIA-A100-SXM4-80GB") == 2.5 and prior_speed("Tesla V100-SXM2-16GB") == 1.0
    assert prior_speed("H100") == 6.0 and prior_speed("cpu") is None


@pytest.mark.ray
def test_a_plan_larger_than_the_cluster_is_one_line(ray_session: Any) -> None:
    from actors.group import WorkerGroup

    with pytest.raises(UserError, match="needs 3 GPUs .* has 0"):
        WorkerGroup(3, use_gpu=True)
    with pytest.raises(UserError, match="offers 2 cpu slot"):
        WorkerGroup(3, use_gpu=False, slots=discover("cpu", local_slots=2))


def test_an_address_with_no_cluster_is_one_line_in_seconds() -> None:
    from orchestrator.train.discovery import _reachable

    with pytest.raises(UserError, match="no Ray cluster at 127.0.0.1:1"):
        _reachable("127.0.0.1:1")
    with pytest.raises(UserError, match="not a Ray address"):
        _reachable("nonsense")
