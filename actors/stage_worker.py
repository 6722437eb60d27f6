"""The stage actor: a dispatch table from IR :class:`Kind` to handler, walked in program order.

One worker per plan device. It never re-derives the schedule: it calls
:func:`orchestrator.schedule.lowering.lower` on the plan it was given and executes
``programs[device]`` action by action, exactly as the simulator times the same list. Everything
the handlers need (row ranges, peers, tags, buffer shapes) is recomputed from the plan, so a
sender and its receiver agree without exchanging metadata per micro-batch.

Shapes: each worker builds the full model from the factory once at setup (same seed everywhere,
which is also how all workers get identical initial weights), pushes ONE row of ``data_fn(0)``
through every block under ``no_grad`` and records each block boundary's trailing shape and dtype.
Row counts come from the row rules in :mod:`actors.transport`, so receive buffers are allocated
exactly and no header is sent. Boundary tensors must therefore be batch-first, floating point,
with trailing dimensions that do not change from step to step.

Data: stage-0 and last-stage workers call the picklable ``data_fn(step)`` themselves and slice
their rows; the driver is never on the data path.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from actors import checkpoint as ckpt
from actors.execution import Executor
from actors.transport import MAX_MICROBATCHES, backend_for, free_endpoint, init_group, replica_groups
from orchestrator.errors import UserError
from orchestrator.plan import Plan
from orchestrator.schedule.lowering import lower

DataFn = Callable[[int], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class JobSpec:
    """Everything a worker needs to build its part of the job (cloudpickled by Ray once)."""

    model_factory: Callable[[], list[nn.Module]]
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    optimizer_factory: Callable[[Any], torch.optim.Optimizer]
    data_fn: DataFn
    seed: int = 0
    pg_timeout_s: float = 120.0
    threads: int = 0  # torch intra-op threads; 0: this node's cores / workers on it
    recv_lookahead: int = 8  # how many program actions ahead receives are pre-posted
    kill_at: frozenset[tuple[int, int]] = field(default_factory=frozenset)  # fault injection: (step, device)


class StageWorker:
    """Wrapped with ``ray.remote`` by :mod:`actors.group`; plain class so it is testable in-process."""

    def __init__(self) -> None:
        self.device_id = -1
        self.executor: Executor | None = None

    # ----- setup -----
    def endpoint(self) -> tuple[str, int]:
        """Rank 0 picks the rendezvous address; the driver hands it to everyone once."""
        return free_endpoint()

    def pid(self) -> int:
        return os.getpid()

    def configure(
        self, spec: JobSpec, plan_dict: dict[str, Any], device: int, rank_of: dict[int, int], host: str, port: int
    ) -> dict[str, Any]:
        """Build this device's blocks and optimizers, join the process group, prepare the program."""
        plan = Plan.from_dict(plan_dict)
        if plan.num_microbatches > MAX_MICROBATCHES:
            raise UserError(f"at most {MAX_MICROBATCHES} micro-batches per iteration are supported")
        self.device_id = device
        torch_device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if torch_device.type == "cpu":
            local = max(1, int(os.environ.get("RAYPIPE_WORKERS_PER_NODE", len(rank_of))))
            torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // local))
        torch.manual_seed(spec.seed)
        blocks = list(spec.model_factory())
        if len(blocks) != plan.num_blocks:
            raise UserError(f"the model factory built {len(blocks)} blocks but the plan covers {plan.num_blocks}")
        inputs, _ = spec.data_fn(0)
        boundary = probe_boundaries(blocks, inputs)
        mine = sorted(b for j in plan.stages_of_device(device) for b in range(plan.stages[j].first, plan.stages[j].last))
        modules = {b: blocks[b].to(torch_device) for b in mine}
        del blocks  # the other devices' blocks: only needed for the identical RNG stream and the probe
        optimizers = {b: spec.optimizer_factory(m.parameters()) for b, m in modules.items() if any(True for _ in m.parameters())}
        init_group(host, port, rank_of[device], len(rank_of), backend_for(torch_device), spec.pg_timeout_s)
        groups = replica_groups(plan, rank_of)
        program = lower(plan).programs[device]
        self.executor = Executor(
            spec, plan, device, rank_of, program, modules, optimizers, groups, boundary, int(inputs.shape[0]), torch_device
        )
        return {"device": device, "rank": rank_of[device], "blocks": mine, "pid": os.getpid(), "backend": dist.get_backend()}

    # ----- training -----
    def run_iteration(self, step: int) -> dict[str, Any]:
        if self.executor is None:
            raise RuntimeError("worker not configured")
        return self.executor.run(step)

    # ----- checkpoints -----
    def save_blocks(self, directory: str) -> list[dict[str, Any]]:
        """Write the blocks this worker owns (replica 0 of each stage only)."""
        ex = self._ready()
        out = []
        for j in ex.plan.stages_of_device(self.device_id):
            stage = ex.plan.stages[j]
            if stage.devices[0] != self.device_id:
                continue
            for b in range(stage.first, stage.last):
                out.append(ckpt.write_block(Path(directory), b, ex.modules[b], ex.optimizers.get(b)))
        return out

    def load_blocks(self, directory: str, manifest: dict[str, Any]) -> int:
        """Restore every block this worker holds (all replicas load the same files)."""
        ex = self._ready()
        entries = {int(e["block"]): e for e in manifest["files"]}
        for b, module in ex.modules.items():
            payload = ckpt.read_block(directory, entries[b])
            ckpt.restore_block(payload, module, ex.optimizers.get(b), str(Path(directory) / entries[b]["file"]))
        return len(ex.modules)

    def state_dicts(self) -> dict[int, dict[str, Tensor]]:
        """Weights of the blocks held here (tests compare them with the reference)."""
        ex = self._ready()
        return {b: {k: v.detach().cpu().clone() for k, v in m.state_dict().items()} for b, m in ex.modules.items()}

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self.executor = None

    def _ready(self) -> Executor:
        if self.executor is None:
            raise RuntimeError("worker not configured")
        return self.executor


def probe_boundaries(blocks: list[nn.Module], inputs: Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Trailing shape and dtype of the tensor entering each block (index L: the model output)."""
    modes = [b.training for b in blocks]
    x = inputs[:1]
    specs = [(tuple(x.shape[1:]), x.dtype)]
    with torch.no_grad():
        for b in blocks:
            b.eval()
            x = b(x)
            if not isinstance(x, Tensor):
                raise UserError(f"block {type(b).__name__} returned {type(x).__name__}; every block must return one tensor")
            specs.append((tuple(x.shape[1:]), x.dtype))
    for b, mode in zip(blocks, modes):
        b.train(mode)
    return specs
