"""What the executor needs on CUDA/NCCL and nowhere else: event timing, dtype rules, posting.

Why apart from :mod:`actors.execution`: these are the rules of the GPU path (no host syncs, what
NCCL can carry), each small and each testable without the executor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from orchestrator.core.errors import UserError
from orchestrator.schedule.ir import Action, Kind

# What ProcessGroupNCCL carries (bool travels as uint8; complex as a real view of twice the length).
NCCL_DTYPES = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
    torch.complex64, torch.complex128,
    *(getattr(torch, n) for n in ("float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n)),
})


NCCL_SAFE_ABORT = (2, 25)
"""The oldest NCCL whose communicators can be aborted and re-created in a live process (torchft's floor)."""


@dataclass(frozen=True)
class NcclFacts:
    """What the installed torch and NCCL offer a recovery in place, read in a worker (the driver may have no GPU).

    ``version``: NCCL's, ``None`` when this torch has none; ``nonblocking_abort``: torch can build non-blocking
    communicators (``ProcessGroupNCCL.Options().config.blocking``) and abort them (``_abort_process_group``)."""

    version: tuple[int, ...] | None
    nonblocking_abort: bool

    @staticmethod
    def installed() -> "NcclFacts":
        try:
            version: tuple[int, ...] | None = tuple(int(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a torch built without NCCL
            version = None
        try:
            from torch.distributed import ProcessGroupNCCL  # type: ignore[attr-defined]
            from torch.distributed.distributed_c10d import _abort_process_group  # noqa: F401

            api = hasattr(ProcessGroupNCCL.Options().config, "blocking")
        except Exception:  # noqa: BLE001 - no NCCL in this torch, or an older API
            api = False
        return NcclFacts(version, api)


def in_place_hazard(backend: str, facts: NcclFacts | None) -> str | None:
    """Why recovery in place cannot be made safe on this install (one line for the event), or ``None``.

    Gloo: nothing (a failed rank's abort closes its sockets and its peers fail at once). NCCL: a survivor blocked on a
    dead peer's kernel is freed only by aborting its communicators, which needs non-blocking communicators and
    NCCL >= 2.25 (ncclCommAbort of a blocking communicator may itself wait; torchft's floor); without them the job
    restarts up front instead of waiting for a recovery that would fail."""
    if backend != "nccl":
        return None
    if facts is None or facts.version is None:
        return "NCCL's version is unknown"
    if facts.version[:2] < NCCL_SAFE_ABORT:
        have = ".".join(map(str, facts.version))
        return f"NCCL {have} < {NCCL_SAFE_ABORT[0]}.{NCCL_SAFE_ABORT[1]} cannot abort a communicator blocked on a dead peer"
    if not facts.nonblocking_abort:
        return "this torch cannot build non-blocking NCCL communicators or abort them"
    return None


def check_nccl_dtypes(device: int, program: Sequence[Action], info: Sequence[Any],
                      replicated: Mapping[int, Sequence[nn.Parameter]]) -> None:
    """Refuse at setup what NCCL cannot carry, naming stage and device: a received boundary's dtype
    (``info[i][2]`` of a receive), or the gradients of a replicated stage (all-reduced)."""
    for a, entry in zip(program, info):
        if a.kind in (Kind.RECV_F, Kind.RECV_B) and entry is not None and entry[2] not in NCCL_DTYPES:
            raise UserError(f"stage {a.stage} on device {device}: NCCL cannot carry {entry[2]} "
                            "activations or gradients between stages; cast the block boundary")
    for stage, params in replicated.items():
        for p in params:
            if p.dtype not in NCCL_DTYPES:
                raise UserError(f"stage {stage} on device {device}: NCCL cannot all-reduce {p.dtype} gradients")


class EventClock:
    """Spans timed by CUDA events recorded on the compute stream, resolved once per iteration.

    ``mark()`` returns an event *index* (a float, so span tuples keep one type); after the
    iteration's one synchronisation ``resolve`` turns indices into seconds since event 0.
    """

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.mark()  # event 0: the origin

    def mark(self) -> float:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)
        return float(len(self.events) - 1)

    def resolve(self, spans: list[Any], sends: list[Any], recvs: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        origin = self.events[0]
        seconds = [origin.elapsed_time(e) / 1e3 for e in self.events]

        def at(index: float) -> float:
            return seconds[int(index)]

        return ([(label, kind, at(s), at(e)) for label, kind, s, e in spans],
                [(label, peer, size, at(post)) for label, peer, size, post in sends],
                [(label, peer, size, at(p), at(w), at(d)) for label, peer, size, p, w, d in recvs])


def recv_lookahead(requested: int, cuda: bool) -> int:
    """On CUDA receives are posted at their own action: the host runs ahead of the GPU anyway (no
    syncs), and fewer NCCL kernels in flight on different communicators leaves less to chance."""
    return 1 if cuda else requested
