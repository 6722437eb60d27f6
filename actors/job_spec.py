"""What every stage worker is told about the job: the user's callables and the runtime's settings.

Its own module because both the worker (:mod:`actors.stage_worker`) and its executor (:mod:`actors.execution`) read
it, and the executor must not import the worker. Cloudpickled by Ray once per worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn

from actors.training import TrainingOptions

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
    steady_timeout_s: float = 60.0  # NCCL: per-operation bound once the first iteration ran (a hang = a dead peer)
    injected: Any = None  # a crash rehearsal (actors.injection.Kills), opt-in for tests and rehearsals; None in a job
    training: TrainingOptions = field(default_factory=TrainingOptions)  # clipping, LR schedules (actors/training.py)
    run_id: str = ""  # the run this job belongs to (set by the run/supervisor layer; "" = unknown, still recorded in every block)
    storage_retry_s: float = 180.0  # a checkpoint write is done again through a storage outage for this long
    eval_data_fn: DataFn | None = None  # evaluation batches eval_data_fn(0 .. K-1), forward only (StageWorker.evaluate)


def cpu_threads(threads: int, workers_here: int) -> int:
    """Torch intra-op threads of a CPU worker: ``threads`` (the job's setting) or this node's cores shared by the
    ``workers_here`` workers on it. One rule for the workers and for whoever times what they will run
    (:func:`orchestrator.adapt.live.measured_profile`): on a shared machine a block timed with two threads took 25x
    what a one-thread worker takes (each parallel region waits for the thread another process preempted)."""
    local = max(1, int(os.environ.get("RAYPIPE_WORKERS_PER_NODE", workers_here)))
    return threads or max(1, (os.cpu_count() or 1) // local)
