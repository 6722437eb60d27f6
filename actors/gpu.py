"""What the executor needs on CUDA/NCCL and nowhere else: event timing, dtype rules, posting.

Why apart from :mod:`actors.execution`: these are the rules of the GPU path (no host syncs, what
NCCL can carry), each small and each testable without the executor.
"""

from __future__ import annotations

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
