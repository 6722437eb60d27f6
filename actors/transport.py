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

import math
import os
import socket
import threading
from datetime import timedelta
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from actors.gpu import NcclFacts, in_place_hazard
from actors.grad_sync import bucket_order
from orchestrator.core.plan import Plan
from orchestrator.schedule.ir import Action, Kind, Range, intersect, replica_range, split_range, unit_range

__all__ = [
    "Range", "intersect", "replica_range", "split_range", "unit_range", "stage_rows", "tag", "select_device",
    "local_cuda_index", "link_groups", "replica_groups", "link_messages", "largest_buckets", "warm_up", "destroy_groups", "shorten_timeouts",
    "abort_communicators",
]

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


def select_device() -> torch.device:
    """The device Ray assigned to this actor, made current (CPU when there is no GPU).

    Ray Train's rule: Ray's GPU id is a *physical* index; under Ray's ``CUDA_VISIBLE_DEVICES``
    masking (the default) the local CUDA index is its position in that list (usually 0), and with
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`` the physical index itself. ``set_device``
    makes every later allocation, kernel and NCCL communicator use it, so nothing silently lands on
    ``cuda:0``. The index arithmetic is :func:`local_cuda_index`.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        import ray

        gpu_ids = [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - outside a Ray actor: the current device
        gpu_ids = []
    index = local_cuda_index(gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def local_cuda_index(gpu_ids: list[str], visible: str | None, count: int) -> int:
    """This process's CUDA index of the first GPU Ray assigned (``gpu_ids``), given
    ``CUDA_VISIBLE_DEVICES`` (``visible``) and how many devices CUDA shows (``count``).

    Ray's ids and the visible list may be indices or GPU UUIDs (``GPU-8f2c...``, or ``MIG-...``,
    as Ray reports them when the node's ``CUDA_VISIBLE_DEVICES`` names GPUs by UUID): an id is
    looked up in the list; only a numeric id absent from it is an index itself. Anything else is
    one clear error naming both, never a bare ``ValueError``.
    """
    if not gpu_ids:
        return 0
    listed = [v.strip() for v in (visible or "").split(",") if v.strip()]
    want = gpu_ids[0]
    if want in listed:
        index = listed.index(want)
    elif want.isdigit():
        index = int(want)
    else:
        raise RuntimeError(f"Ray assigned GPU {want!r} but CUDA_VISIBLE_DEVICES={visible or ''!r} does not list it")
    if index >= count:
        raise RuntimeError(f"Ray assigned GPU {want!r} but this process sees {count} CUDA device(s)")
    return index


def nccl_environment(facts: NcclFacts) -> None:
    """NCCL's failure policy, set before the first communicator exists; users may override any setting.

    Where recovery in place is safe on this install (:func:`actors.gpu.in_place_hazard`: NCCL >= 2.25 and torch's
    non-blocking, abortable communicators), torchft's recipe: non-blocking communicators
    (``TORCH_NCCL_USE_COMM_NONBLOCKING=1``, so creating, aborting and destroying one never blocks the host) and no
    watchdog kill (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``, as ``_abort_process_group`` asks): a failed or hung
    operation is ended by the job's own deadline (:meth:`orchestrator.train.runtime.PipelineRuntime.deadline_s`),
    which ends the hung worker and aborts the survivors' communicators (:func:`abort_communicators`). Otherwise the
    watchdog tears the process down after aborting its communicators (``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``): Ray
    reports the actor dead and the failure policy, which chose a full restart up front for this install, restarts
    the pipeline from the newest checkpoint. Both await a run on GPUs (README, GPU section).
    """
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":  # orchestrator/schedule/nccl.py: 41 of 78 plan shapes hang
        from orchestrator.core.errors import UserError

        raise UserError("CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the per-link NCCL communicators and can hang the pipeline; unset it")
    if in_place_hazard("nccl", facts) is None:
        os.environ.setdefault("TORCH_NCCL_USE_COMM_NONBLOCKING", "1")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    else:
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")


def init_group(host: str, port: int, rank: int, world: int, backend: str, timeout_s: float,
               device: torch.device | None = None, member_died: bool = False) -> None:
    """(Re)join the job's process group; a stale group from a previous plan is torn down first: destroyed, or
    aborted when ``member_died`` (NCCL's destroy is a collective of the old members, which a dead one never joins).

    Each formation has a store of its own (``host:port`` is a fresh endpoint every time, :func:`free_endpoint`), so
    no key of an earlier formation is ever read (torchft uses a new store prefix per re-formation for the same).
    The timeout bounds every blocking receive and collective, so a peer that dies mid-iteration
    turns into an exception here instead of a hang. On CUDA the group is bound to ``device``
    (``device_id``), which also creates its NCCL communicator eagerly instead of at the first
    collective.
    """
    if dist.is_initialized():
        if member_died:
            abort_communicators()
        else:
            dist.destroy_process_group()
    if backend == "nccl":
        nccl_environment(NcclFacts.installed())
    # The rendezvous gets its own, longer bound: on a loaded machine the ranks may start seconds
    # apart, and that must not fail a job whose per-operation timeout is short for fast death detection.
    store = dist.TCPStore(host, port, world_size=world, is_master=rank == 0,
                          timeout=timedelta(seconds=max(timeout_s, RENDEZVOUS_TIMEOUT_S)))
    bound = device if device is not None and device.type == "cuda" else None
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                            device_id=bound)


def new_group(ranks: list[int], timeout_s: float | None) -> Any:
    """A subgroup with the job's per-operation timeout: ``new_group`` does not inherit the default
    group's timeout (it would wait 30 minutes for a dead peer)."""
    return dist.new_group(ranks, timeout=None if timeout_s is None else timedelta(seconds=timeout_s))


def replica_groups(plan: Plan, rank_of: dict[int, int], existing: Mapping[tuple[int, ...], Any] | None = None,
                   timeout_s: float | None = None) -> dict[tuple[int, ...], Any]:
    """One subgroup per replicated device group, created in the same order on every rank.

    ``existing`` groups whose device set the plan still replicates are kept (no new communicator).
    """
    groups: dict[tuple[int, ...], Any] = {}
    for devices in plan.device_groups:
        if len(devices) > 1:
            kept = (existing or {}).get(devices)
            groups[devices] = kept if kept is not None else new_group(sorted(rank_of[d] for d in devices), timeout_s)
    return groups


def link_groups(links: Iterable[tuple[int, int]], rank_of: Mapping[int, int],
                existing: Mapping[tuple[int, int], Any] | None = None, timeout_s: float | None = None) -> dict[tuple[int, int], Any]:
    """One two-rank process group per *directed* link ``(sender device, receiver device)``.

    Why: NCCL runs all point-to-point traffic of one communicator between two ranks on one
    stream, in order, ignoring tags; with both directions on one stream a pipeline's forward
    sends and backward sends meet head to head and hang (see :mod:`orchestrator.schedule.nccl`,
    which proves the directed layout hang-free for every schedule). A communicator per direction
    leaves each stream with one sender's messages in the order both sides agree on. ``new_group``
    is collective over the whole job, so every rank creates the same groups in the same
    (sorted) order, including ranks that are not members. Links in ``existing`` are reused.
    """
    groups: dict[tuple[int, int], Any] = {}
    for src, dst in sorted(set(links)):
        kept = (existing or {}).get((src, dst))
        groups[(src, dst)] = kept if kept is not None else new_group(sorted((rank_of[src], rank_of[dst])), timeout_s)
    return groups


Message = tuple[int, torch.dtype]  # (elements, dtype) of the largest tensor a communicator carries


def link_messages(plan: Plan, programs: Mapping[int, Sequence[Action]], boundary: Sequence[tuple[tuple[int, ...], torch.dtype]],
                  batch_rows: int) -> dict[tuple[int, int], Message]:
    """The largest boundary message (by bytes) each directed link ``(sender, receiver)`` carries in an iteration:
    the rows a send shares with its peer's (the row rules above) times the boundary's trailing shape, in its dtype.
    Pure in the plan, so both ends of a link compute the same size; what :func:`warm_up` sends."""
    out: dict[tuple[int, int], Message] = {}
    for src, program in programs.items():
        for a in program:
            if a.kind not in (Kind.SEND_F, Kind.SEND_B):
                continue
            forward = a.kind is Kind.SEND_F
            other = a.stage + 1 if forward else a.stage - 1
            lo, hi = intersect(stage_rows(plan, batch_rows, a.stage, src, a.unit), stage_rows(plan, batch_rows, other, a.peer, a.unit))
            stage = plan.stages[a.stage]
            shape, dtype = boundary[stage.last if forward else stage.first]
            numel = max(0, hi - lo) * math.prod(shape)
            known = out.get((src, a.peer))
            if known is None or numel * dtype.itemsize > known[0] * known[1].itemsize:
                out[(src, a.peer)] = (numel, dtype)
    return out


def largest_buckets(plan: Plan, device: int, modules: Mapping[int, nn.Module]) -> dict[tuple[int, ...], Message]:
    """The largest gradient bucket (:func:`actors.grad_sync.bucket_order` of one stage's parameters, by bytes) that each
    replica group of ``device`` all-reduces in an iteration; every member holds the same blocks, so all agree."""
    out: dict[tuple[int, ...], Message] = {}
    for j in plan.stages_of_device(device):
        stage = plan.stages[j]
        if len(stage.devices) < 2:
            continue
        params = [p for b in range(stage.first, stage.last) for p in modules[b].parameters()]
        for bucket in bucket_order(params):
            numel, dtype = sum(p.numel() for p in bucket), bucket[0].dtype
            known = out.get(stage.devices)
            if known is None or numel * dtype.itemsize > known[0] * known[1].itemsize:
                out[stage.devices] = (numel, dtype)
    return out


def warm_up(device: int, rank_of: Mapping[int, int], links: Mapping[tuple[int, int], Any],
            replicas: Mapping[tuple[int, ...], Any], torch_device: torch.device,
            messages: Mapping[tuple[int, int], Message], buckets: Mapping[tuple[int, ...], Message]) -> None:
    """Create every communicator and set up its connections before the first iteration, in one global order.

    NCCL creates a communicator at its first operation, and creation blocks the host until the
    peer creates it too; done lazily inside the schedule, two ranks could each block creating a
    different communicator. Here every rank walks the same sorted list with blocking operations,
    so the earliest unfinished one always has both ends ready. Each link carries its largest boundary
    message (:func:`link_messages`) and each replica group all-reduces its largest bucket (:func:`largest_buckets`),
    so NCCL's buffers and connections for full-size messages are set up here, not inside iteration 1.
    """
    for (src, dst), group in sorted(links.items()):
        if device in (src, dst):
            numel, dtype = messages.get((src, dst), (1, torch.float32))
            probe = torch.zeros(max(1, numel), dtype=dtype, device=torch_device)
            if device == src:
                dist.send(probe, rank_of[dst], group=group)
            else:
                dist.recv(probe, rank_of[src], group=group)
    for devices, group in sorted(replicas.items()):
        if device in devices:
            numel, dtype = buckets.get(devices, (1, torch.float32))
            dist.all_reduce(torch.zeros(max(1, numel), dtype=dtype, device=torch_device), group=group)


def destroy_groups(groups: Iterable[Any]) -> None:
    """Free dropped subgroups (NCCL communicators hold GPU memory and a stream each)."""
    for group in groups:
        try:
            dist.destroy_process_group(group)
        except Exception:  # noqa: BLE001 - already gone with its parent group
            pass


class CommunicatorsAborted(RuntimeError):
    """A call refused at once by a worker whose communicators were aborted after a failed iteration: it ran nothing.

    Why a type of its own: a run submitted ahead of a failed one is not cancelled (Ray's in-order actor queue then
    waits 30 s for the cancelled call's sequence number and cancels the calls after it: ray-project/ray#65785); it runs
    and ends with this error, which tells the driver that the worker's state is untouched."""


def abort_communicators() -> None:
    """Close every communicator of this process at once, without waiting for their operations.

    Why: after a peer died, a rank blocked in a receive from a *surviving* peer (one that failed
    the iteration first) would wait for the whole per-operation timeout. A rank that gives up on
    an iteration aborts its communicators, which closes its sockets (gloo) or aborts its NCCL
    communicators (not waited for, as NCCL asks after a fault); the ranks blocked on it then fail
    at once too, so the failure spreads along the waits in milliseconds and every survivor is
    free for the recovery that re-forms a group among them (:meth:`actors.group.WorkerGroup.reform`).
    """
    with _ABORTING:  # the iteration's thread and the probe thread (StageWorker.release) may both get here
        if not dist.is_initialized():
            return
        try:
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()  # every group, the default one included, in one NCCL group call
        except Exception:  # noqa: BLE001 - a backend without abort: destroying closes its sockets
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - already gone
                pass


_ABORTING = threading.Lock()


def shorten_timeouts(seconds: float, groups: Iterable[Any]) -> None:
    """After the first iteration (communicators built, kernels compiled) a hang is a dead peer:
    bound every group's operations by ``seconds`` so it surfaces quickly."""
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout
    except ImportError:  # pragma: no cover - older torch: keep the setup timeout
        return
    for group in [None, *groups]:
        try:
            _set_pg_timeout(timedelta(seconds=seconds), group)
        except Exception:  # noqa: BLE001 - a backend without per-group timeouts keeps its own
            pass


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
