"""Row arithmetic, message tags and process-group plumbing shared by the stage actors.

Everything here is a pure function of the plan and the batch size, so a sender and its receiver
compute the same row ranges, tags and buffer shapes independently and no shape header ever has
to travel with a micro-batch.

Row rules (every interpreter of a plan must use the same ones; the single-process reference in
:mod:`actors.reference` does):

* micro-batches are ``torch.tensor_split(batch, M)`` (``numpy.array_split`` semantics);
* a sliced unit ``(mb, 1|2)`` is ``torch.tensor_split(microbatch, 2)[part - 1]``;
* replica ``i`` of ``k`` holds rows ``[ceil(i·n/k), ceil((i+1)·n/k))`` of its unit's ``n`` rows.

The replica rule is the integer image of :func:`orchestrator.schedule.ir.row_share`'s fractional
range ``[i/k, (i+1)/k)``. ``array_split`` is *not* monotone in ``i/k`` (6 rows: 2 replicas cut at
3 but 4 replicas cut at 4), so its integer ranges can overlap a neighbour replica that the
lowering, which compares fractional ranges, never listed as a peer. With ``ceil`` boundaries two
fractional ranges that do not overlap give integer ranges that do not overlap either, so the
peers emitted by :func:`orchestrator.schedule.lowering.lower` always suffice; a listed peer whose
integer overlap is empty is skipped identically on both sides.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.plan import Plan
from orchestrator.schedule.ir import Range, intersect, replica_range, split_range, unit_range

__all__ = ["Range", "intersect", "replica_range", "split_range", "unit_range", "stage_rows", "tag"]

RENDEZVOUS_TIMEOUT_S = 120.0
MAX_MICROBATCHES = 4096  # tag space per stage; a plan with more micro-batches is rejected at setup
_DIRS = {"F": 0, "B": 1}


def stage_rows(plan: Plan, batch_rows: int, stage: int, device: int, unit: tuple[int, int]) -> Range:
    """Rows of ``unit`` that ``device`` computes for ``stage``."""
    group = plan.stages[stage].devices
    whole = unit_range(batch_rows, plan.num_microbatches, unit[0], unit[1])
    return replica_range(whole, len(group), group.index(device))


# ----- tags -----
def tag(direction: str, stage: int, microbatch: int, part: int) -> int:
    """Gloo matches point-to-point messages by (peer, tag): one tag per (direction, stage, unit).

    ``stage`` is the *sending* stage, so a forward message and the backward message of the same
    unit on the same link never collide.
    """
    return ((stage * MAX_MICROBATCHES + microbatch) * 3 + part) * 2 + _DIRS[direction]


# ----- process group -----
def backend_for(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU: the only two backends that support isend/irecv."""
    return "nccl" if device.type == "cuda" else "gloo"


def free_endpoint() -> tuple[str, int]:
    """An address other actors can reach and a port nothing listens on yet (rank 0 calls this)."""
    try:
        import ray

        host = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray (unit tests): loopback is right
        host = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    return host, port


def init_group(host: str, port: int, rank: int, world: int, backend: str, timeout_s: float) -> None:
    """(Re)join the job's process group; a stale group from a previous plan is torn down first.

    The timeout bounds every blocking receive and collective, so a peer that dies mid-iteration
    turns into an exception here instead of a hang.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    # The rendezvous gets its own, longer bound: on a loaded machine the ranks may start seconds
    # apart, and that must not fail a job whose per-operation timeout is short for fast death detection.
    store = dist.TCPStore(host, port, world_size=world, is_master=rank == 0,
                          timeout=timedelta(seconds=max(timeout_s, RENDEZVOUS_TIMEOUT_S)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def replica_groups(plan: Plan, rank_of: dict[int, int]) -> dict[tuple[int, ...], Any]:
    """One subgroup per replicated device group, created in the same order on every rank."""
    groups: dict[tuple[int, ...], Any] = {}
    for devices in plan.device_groups:
        if len(devices) > 1:
            groups[devices] = dist.new_group(sorted(rank_of[d] for d in devices))
    return groups


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
