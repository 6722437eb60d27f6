"""``PipelineTrainer``: pipeline-parallel training of one fixed plan — the one loop with the policies off.

Shaped like Ray Train's ``TorchTrainer`` (construct with factories, call ``fit``, get a result and checkpoints
back), but the workers are pipeline stages, not data-parallel copies::

    trainer = PipelineTrainer(model_factory, loss_fn, lambda p: torch.optim.AdamW(p, 1e-3),
                              data_fn, num_microbatches=8, checkpoint_dir="ckpt", checkpoint_every=100)
    result = trainer.fit(1000)

The trainer holds a runtime (:class:`~orchestrator.train.runtime.PipelineRuntime`: the workers, the plan, the
step, the checkpoints; :attr:`PipelineTrainer.runtime`) driven by the one training loop (:class:`~orchestrator.train.loop.TrainingLoop`) with
:class:`FixedPlan` as its policies: a checkpoint every ``checkpoint_every`` steps, a restart from the newest one
after a worker's death until ``max_failures``, a progress bar. Nothing re-plans, moves or evacuates: that is
:class:`~orchestrator.elastic.job_loop.ElasticJob`, the same loop with every policy on.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn
from tqdm import tqdm

from actors.group import PipelineActorError, WorkerGroup
from actors.metrics import MeasuredIteration
from actors.training import TrainingOptions
from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.train.callbacks import Callback, Callbacks, Checkpoint, StartInfo, StepInfo
from orchestrator.train.loop import TrainingLoop, every
from orchestrator.train.fit_result import KEPT_METRICS, JobResult
from orchestrator.train.runtime import PipelineRuntime


class PipelineTrainer:
    """A fixed plan trained by the one loop (see the module docstring): the runtime's arguments (the user's
    factories, the plan or a planner, where checkpoints go) and the fixed-plan policies' knobs:

    ``checkpoint_every`` (0: only the final one), ``async_checkpoints`` (periodic checkpoints snapshot and upload
    while the next steps train; each commits when the next starts or when ``fit`` returns), ``max_failures``
    (worker deaths survived by a restart), ``progress`` (a bar; default: for 50 steps or more),
    ``pipelined_dispatch`` (submit the next run before gathering this one), ``iterations_per_call``
    (consecutive steps per remote call) and ``callbacks`` (the user's, as for
    :class:`~orchestrator.elastic.job_loop.ElasticJob`). The runtime's primitives are :attr:`runtime`'s."""

    def __init__(
        self,
        model_factory: Callable[[], list[nn.Module]],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        data_fn: Callable[[int], tuple[Tensor, Tensor]],
        num_microbatches: int,
        plan: Plan | None = None,
        planner: str = "pipedream",
        cluster: Cluster | None = None,
        checkpoint_dir: str | Path | None = None,
        seed: int = 0,
        resume: str | Path | None = None,
        iteration_timeout_s: float = 600.0,
        pg_timeout_s: float = 120.0,
        workers: WorkerGroup | None = None,
        use_gpu: bool | None = None,
        validate: bool = True,
        training: TrainingOptions | None = None,
        *,
        checkpoint_every: int = 0,
        max_failures: int = 0,
        progress: bool | None = None,
        pipelined_dispatch: bool = True,
        iterations_per_call: int = 8,
        async_checkpoints: bool = False,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        if checkpoint_every and checkpoint_dir is None:
            raise UserError("checkpoint_every needs a checkpoint_dir")
        self.callbacks = Callbacks(callbacks)
        self.runtime = PipelineRuntime(model_factory, loss_fn, optimizer_factory, data_fn, num_microbatches, plan, planner,
                                       cluster, checkpoint_dir, seed, resume, iteration_timeout_s, pg_timeout_s, workers,
                                       use_gpu, validate, training)
        self.checkpoint_every, self.max_failures, self.progress = checkpoint_every, max_failures, progress
        self.pipelined_dispatch, self.iterations_per_call = pipelined_dispatch, iterations_per_call
        self.async_checkpoints = async_checkpoints
        self.policies = FixedPlan(self)
        self.loop = TrainingLoop(self.runtime, self.policies, pipelined_dispatch)  # one per trainer: the failure budget spans fits

    # ----- what a user reads -----
    @property
    def step(self) -> int:
        """Steps trained (a resumed trainer starts at the restored step)."""
        return self.runtime.step

    @property
    def plan(self) -> Plan:
        return self.runtime.plan

    @property
    def failures(self) -> int:
        """Worker deaths so far, over every ``fit`` (counted by the loop, once each)."""
        return self.loop.failures

    def state_dicts(self) -> dict[int, dict[str, Tensor]]:
        """Current weights keyed by block."""
        return self.runtime.state_dicts()

    def save_checkpoint(self, path: str | Path | None = None) -> Path | str:
        """A committed checkpoint of the step reached (``path``: this one instead of the next ``step_N``)."""
        return self.runtime.save_checkpoint(path)

    def restore(self, source: str | Path) -> int:
        """Load a checkpoint of any plan of the same model (see :meth:`PipelineRuntime.restore`); the step it resumes at."""
        return self.runtime.restore(source)

    def shutdown(self) -> None:
        self.runtime.shutdown()

    def __enter__(self) -> "PipelineTrainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def fit(self, steps: int) -> JobResult:
        """Train up to step ``steps`` (not ``steps`` more: a resumed trainer continues to the same target; at or
        past it, return at once), restarting from the last checkpoint on a worker's death. With a
        ``checkpoint_dir`` the last step is always committed before ``fit`` returns. See
        :mod:`orchestrator.train.loop` for dispatch and how each step is timed."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise UserError(f"fit(steps) needs a whole number of steps >= 0, not {steps!r}")
        runtime = self.runtime
        runtime._ensure_started()
        first, target = runtime.step, max(runtime.step, steps)
        start = time.perf_counter()
        policies = self.policies
        policies.begin(first, target)
        self.callbacks.start(StartInfo(first, target, runtime.spec.run_id, str(runtime.checkpoint_dir or ""), runtime.plan.describe(),
                                       None))
        try:
            self.loop.run(target)
        finally:
            policies.bar.close()
        policies.finish(target)
        done = range(first, runtime.step)
        result = JobResult(runtime.step, {s: runtime.history[s] for s in done}, runtime.plan, [], time.perf_counter() - start,
                           0, policies.restarts, list(policies.metrics), policies.written,
                           {d.device: d.node_id for d in runtime.devices()})
        self.callbacks.end(result)
        if self.callbacks.failure is not None:
            raise self.callbacks.failure
        return result


class FixedPlan:
    """The fixed-plan policies (:class:`~orchestrator.train.loop.Policies`): checkpoints on schedule, a restart
    after a death within the budget, runs of ``iterations_per_call`` steps that never cross a checkpoint, and
    the user's callbacks (a checkpoint on demand, a stop)."""

    def __init__(self, trainer: PipelineTrainer) -> None:
        self.trainer, self.runtime = trainer, trainer.runtime
        self.begin(self.runtime.step, self.runtime.step)

    def begin(self, first: int, target: int) -> None:
        """A ``fit`` from step ``first`` to ``target``: what it reports starts empty."""
        self.first, self.target = first, target
        self.metrics: deque[MeasuredIteration] = deque(maxlen=KEPT_METRICS)
        self.written: list[str] = []
        self.restarts = 0
        show = self.trainer.progress if self.trainer.progress is not None else target - first >= 50
        self.bar = tqdm(total=target - first, disable=not show, desc="pipeline", unit="it")

    def before(self, step: int) -> None:
        if self.trainer.callbacks.failure is not None:
            raise self.trainer.callbacks.failure

    def run_length(self, step: int, target: int) -> int:
        end = min(target, step + max(1, self.trainer.iterations_per_call))
        if self.trainer.checkpoint_every:
            end = min(end, (step // self.trainer.checkpoint_every + 1) * self.trainer.checkpoint_every)
        return end - step

    def hold(self, done: int, target: int) -> bool:
        return every(self.trainer.checkpoint_every, done)

    def completed(self, run: Sequence[MeasuredIteration]) -> None:
        self.metrics.extend(run)
        self.bar.update(len(run))
        self.bar.set_postfix(loss=f"{run[-1].loss:.4f}")
        trainer = self.trainer
        for m in run:
            trainer.callbacks.step_end(StepInfo(m.step + 1, self.target, m.loss, m.iteration_s,
                                                m.rows / m.iteration_s if m.rows and m.iteration_s > 0 else 0.0, m.lr,
                                                0, self.restarts, trainer.loop.failures))

    def between(self, run: Sequence[MeasuredIteration], target: int) -> None:
        trainer, runtime = self.trainer, self.runtime
        actions = trainer.callbacks.take()
        if actions or trainer.callbacks.failure is not None:
            trainer.loop.finish_in_flight()
        if trainer.callbacks.failure is not None:
            raise trainer.callbacks.failure
        for action in actions:
            if isinstance(action, Checkpoint):
                if runtime.checkpoint_dir is None:
                    raise UserError("a callback asked for a checkpoint, but the trainer has no checkpoint_dir")
                self.written.append(str(runtime.save_checkpoint()))
            else:
                trainer.loop.stop()
                return
        if every(trainer.checkpoint_every, runtime.step):
            self.written.append(str(runtime.save_checkpoint(background=trainer.async_checkpoints)))

    def failed(self, exc: PipelineActorError, failures: int) -> None:
        if failures > self.trainer.max_failures:
            raise exc
        self.restarts += 1
        self.runtime.recover(exc)
        self.bar.update(max(0, self.runtime.step - self.first) - self.bar.n)  # back to the step restored

    def finish(self, target: int) -> None:
        """The last background upload commits, and the run ends on a committed checkpoint of its last step."""
        runtime = self.runtime
        runtime.finish_checkpoint()
        if runtime.checkpoint_dir is not None and runtime.step > self.first and not every(self.trainer.checkpoint_every, runtime.step):
            self.written.append(str(runtime.save_checkpoint()))


__all__ = ["FixedPlan", "PipelineTrainer"]
