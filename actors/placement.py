"""Where each device of a plan physically is, and how a stage actor is put exactly there.

A *slot* is one schedulable device of the Ray cluster: a GPU of a node, or (without GPUs) one
CPU worker slot of a node. Device ``i`` of a cluster model is slot ``i`` of :func:`discover`, so
the devices a planner reasons about (which server, which accelerator, which links) are the ones
that run: every stage actor is scheduled with a hard node-affinity to its slot's node (and one
GPU there), and at start it reports the node, accelerator and device it actually got
(:func:`identity`), which :func:`check_identity` compares with the slot.

Slots per node: one per GPU; without GPUs one per CPU on a cluster reached by address, and on
the embedded local instance as many as the job asks for (``local_slots``), since there the
slots are logical workers that share the machine's cores — their ``share`` (cores per slot,
at most 1) is what the cluster model turns into speed.

Node changes: :class:`NodeTable` diffs Ray's node table between polls and turns a node that
went away into the slots lost and a new node into slots gained, for the job's failure and
growth policies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from actors.gpu import NcclFacts
from orchestrator.core.errors import UserError

ACCELERATOR_PREFIX = "accelerator_type:"


@dataclass(frozen=True)
class Slot:
    """One device of the cluster: ``index`` is the GPU (or CPU slot) number on its node."""

    node_id: str
    kind: str  # "gpu" | "cpu"
    accelerator: str  # Ray's accelerator type ("A100", "H100", a custom label) or "cpu"
    index: int
    share: float = 1.0  # cores (CPU) or GPUs per slot, at most 1
    memory_bytes: float = 0.0  # the slot's share of the node's memory (CPU); GPU memory is read on the device

    def label(self) -> str:
        return f"{self.node_id[:8]}/{self.kind}{self.index}"


def node_accelerator(resources: dict[str, float], labels: dict[str, str] | None = None) -> str:
    """Ray's accelerator type of a node: the ``accelerator_type:X`` resource, else its label."""
    found = sorted(k[len(ACCELERATOR_PREFIX):] for k in resources if k.startswith(ACCELERATOR_PREFIX))
    if found:
        return found[0]
    return (labels or {}).get("ray.io/accelerator-type", "")


def discover(kind: str | None = None, local_slots: int | None = None,
             nodes: Sequence[dict[str, Any]] | None = None) -> list[Slot]:
    """The alive nodes' slots of ``kind`` ("gpu", "cpu"; default: GPUs if the cluster has any).

    ``local_slots``: the CPU slot count when the cluster is one node (the embedded instance).
    """
    import ray

    alive = sorted((n for n in (nodes if nodes is not None else ray.nodes()) if n.get("Alive")), key=_node_order)
    if kind is None:
        kind = "gpu" if any(n.get("Resources", {}).get("GPU") for n in alive) else "cpu"
    slots: list[Slot] = []
    for node in alive:
        slots += node_slots(node, kind, local_slots if len(alive) == 1 else None)
    if not slots:
        raise UserError(f"the Ray cluster has no alive node with {'GPUs' if kind == 'gpu' else 'CPUs'}")
    return slots


def _node_order(node: dict[str, Any]) -> tuple[int, str, str]:
    """Head node first (device 0 lives with the driver on a fresh cluster), then a stable order."""
    head = "node:__internal_head__" in node.get("Resources", {})
    return (0 if head else 1, str(node.get("NodeManagerAddress", "")), str(node.get("NodeID", "")))


def node_slots(node: dict[str, Any], kind: str, local_slots: int | None = None) -> list[Slot]:
    """One node's slots of ``kind`` (see :func:`discover`)."""
    res = node.get("Resources", {})
    memory = float(res.get("memory", 0.0))
    if kind == "gpu":
        gpus = int(res.get("GPU", 0))
        accel = node_accelerator(res, node.get("Labels")) or "gpu"
        return [Slot(node["NodeID"], "gpu", accel, i, 1.0, memory / max(gpus, 1)) for i in range(gpus)]
    cpus = float(res.get("CPU", 0))
    if cpus <= 0:
        return []
    count = local_slots or max(1, int(cpus))
    accel = node_accelerator(res, node.get("Labels")) or "cpu"
    return [Slot(node["NodeID"], "cpu", accel, i, min(1.0, cpus / count), memory / count) for i in range(count)]


def actor_options(slot: Slot, cpus_per_worker: float = 0.01) -> dict[str, Any]:
    """Ray options that put an actor on ``slot``'s node (hard affinity) with its resources.

    A GPU slot asks for one GPU on that node (Ray picks which; the worker reads its id). A CPU
    slot asks for a fraction of a CPU so slots sharing cores can all start; the node is pinned,
    which is what makes the plan's topology real.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(slot.node_id, soft=False)
    if slot.kind == "gpu":
        return {"num_gpus": 1, "num_cpus": 0, "scheduling_strategy": strategy}
    return {"num_cpus": cpus_per_worker, "scheduling_strategy": strategy}


@dataclass(frozen=True)
class WorkerPlace:
    """Where a device's stage worker runs, as the worker reported it at start."""

    device: int
    node_id: str
    pid: int
    accelerator: str = "cpu"
    actual_device: str = "cpu"
    """The torch device it computes on (``cuda:0``, ``cpu``)."""

    def event(self) -> dict[str, Any]:
        """What an event records of it (the node and the process: enough to tell a survivor from a new worker)."""
        return {"device": self.device, "node_id": self.node_id, "pid": self.pid}


def identity() -> dict[str, Any]:
    """What this actor process actually runs on (called inside the actor at start)."""
    import ray
    import torch

    ctx = ray.get_runtime_context()
    node = ctx.get_node_id()
    entry: dict[str, Any] = next((n for n in ray.nodes() if n.get("NodeID") == node), {})
    resources: dict[str, float] = entry.get("Resources", {})
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    if gpu_ids and torch.cuda.is_available():
        device = f"cuda:{torch.cuda.current_device()}"
        name = torch.cuda.get_device_name()
        memory = float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    else:
        device, name, memory = "cpu", "cpu", 0.0
    return {
        "node_id": node, "accelerator": node_accelerator(resources, entry.get("Labels")) or ("gpu" if gpu_ids else "cpu"),
        "device": device, "device_name": name, "gpu_ids": gpu_ids, "pid": os.getpid(), "memory_bytes": memory,
        "nccl": NcclFacts.installed() if device != "cpu" else None,
    }


def check_identity(device: int, slot: Slot, seen: dict[str, Any]) -> None:
    """Refuse a worker that is not where the plan put it (a GPU index may differ under masking)."""
    if seen.get("node_id") != slot.node_id:
        raise UserError(f"device {device} was planned on node {slot.node_id[:12]} but its actor runs on "
                        f"{str(seen.get('node_id'))[:12]}")
    if slot.kind == "gpu" and seen.get("accelerator") != slot.accelerator:
        raise UserError(f"device {device} was planned on a {slot.accelerator} but its actor got a {seen.get('accelerator')}")
    name = str(seen.get("device_name") or "")
    if slot.kind == "gpu" and name and model_token(slot.accelerator) and model_token(slot.accelerator) not in name.upper():
        raise UserError(f"device {device} was planned on a {slot.accelerator} but its actor's GPU is a {name} "
                        "(the node's accelerator_type does not match its hardware)")
    if slot.kind == "gpu" and not seen.get("gpu_ids"):
        raise UserError(f"device {device} was planned on a GPU but its actor got none")


def model_token(accelerator: str) -> str:
    """The GPU model in a Ray accelerator type (``A100-80G`` -> ``A100``); empty for a generic label."""
    head = accelerator.upper().split("-")[0].replace("NVIDIA", "").strip()
    return head if any(c.isdigit() for c in head) else ""


class NodeTable:
    """Turns changes in Ray's node table into slots lost and slots gained (polled by the job loop).

    Per node: a node that stays keeps its slots (its count is not re-derived), a node that went
    away loses all of them, and a new node brings one slot per GPU (or per CPU).
    """

    def __init__(self, kind: str | None = None, local_slots: int | None = None) -> None:
        slots = discover(kind, local_slots)
        self.kind = kind or slots[0].kind
        self.known: dict[str, list[Slot]] = {}
        for slot in slots:
            self.known.setdefault(slot.node_id, []).append(slot)

    def poll(self, nodes: Sequence[dict[str, Any]] | None = None) -> tuple[list[Slot], list[Slot]]:
        """``(lost, gained)`` since the last poll."""
        import ray

        alive = {n["NodeID"]: n for n in (nodes if nodes is not None else ray.nodes()) if n.get("Alive")}
        lost = [s for node, slots in self.known.items() if node not in alive for s in slots]
        gained: list[Slot] = []
        for node_id, node in alive.items():
            if node_id not in self.known:
                fresh = node_slots(node, self.kind)
                if fresh:
                    self.known[node_id] = fresh
                    gained += fresh
        for slot in lost:
            self.known.pop(slot.node_id, None)
        return lost, gained


def probe_pairs(slots: Sequence[Slot], all_pairs_up_to: int = 8) -> list[tuple[int, int]]:
    """Device pairs to time: all of them for a small job; for a large one one pair per node pair
    plus one pair inside each node with several slots (links of a node pair are alike)."""
    n = len(slots)
    if n <= all_pairs_up_to:
        return [(a, b) for a in range(n) for b in range(a + 1, n)]
    first: dict[str, list[int]] = {}
    for i, s in enumerate(slots):
        first.setdefault(s.node_id, []).append(i)
    heads = [devices[0] for devices in first.values()]
    pairs = [(a, b) for i, a in enumerate(heads) for b in heads[i + 1:]]
    pairs += [(devices[0], devices[1]) for devices in first.values() if len(devices) > 1]
    return sorted(pairs)


def _order(slot: Slot) -> tuple[str, str, int]:
    return (slot.node_id, slot.kind, slot.index)


def nodes_of(slots: Iterable[Slot]) -> list[str]:
    """Distinct node ids in first-seen order."""
    return list(dict.fromkeys(s.node_id for s in slots))
