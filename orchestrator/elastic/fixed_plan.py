"""``PipelineTrainer``: pipeline-parallel training of one fixed plan — the one loop with the policies off.

Shaped like Ray Train's ``TorchTrainer`` (construct with factories, call ``fit``, get a result and checkpoints
back), but the workers are pipeline stages, not data-parallel copies::

    trainer = PipelineTrainer(model_factory, loss_fn, lambda p: torch.optim.AdamW(p, 1e-3),
                              data_fn, num_microbatches=8, checkpoint_dir="ckpt", checkpoint_every=100)
    result = trainer.fit(1000)

The trainer is the runtime (:class:`~orchestrator.train.runtime.PipelineRuntime`: the workers, the plan, the
step, the checkpoints) driven by the one training loop (:class:`~orchestrator.elastic.loop.TrainingLoop`) with
:class:`FixedPlan` as its policies: a checkpoint every ``checkpoint_every`` steps, a restart from the newest one
after a worker's death until ``max_failures``, a progress bar. Nothing re-plans, moves or evacuates: that is
:class:`~orchestrator.elastic.job_loop.ElasticJob`, the same loop with every policy on.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Sequence

from tqdm import tqdm

from actors.group import PipelineActorError
from actors.metrics import MeasuredIteration
from orchestrator.core.errors import UserError
from orchestrator.elastic.loop import TrainingLoop, every
from orchestrator.train.fit_result import FitResult
from orchestrator.train.runtime import PipelineRuntime


class PipelineTrainer(PipelineRuntime):
    """A fixed plan trained by the one loop (see the module docstring). Takes every argument of
    :class:`PipelineRuntime` and the fixed-plan policies' knobs:

    ``checkpoint_every`` (0: only the final one), ``async_checkpoints`` (periodic checkpoints snapshot and upload
    while the next steps train; each commits when the next starts or when ``fit`` returns), ``max_failures``
    (worker deaths survived by a restart), ``progress`` (a bar; default: for 50 steps or more),
    ``pipelined_dispatch`` (submit the next run before gathering this one) and ``iterations_per_call``
    (consecutive steps per remote call)."""

    def __init__(self, *args: Any, checkpoint_every: int = 0, max_failures: int = 0, progress: bool | None = None,
                 pipelined_dispatch: bool = True, iterations_per_call: int = 8, async_checkpoints: bool = False,
                 **kwargs: Any) -> None:
        given = inspect.signature(PipelineRuntime.__init__).bind(self, *args, **kwargs).arguments
        if checkpoint_every and given.get("checkpoint_dir") is None:
            raise UserError("checkpoint_every needs a checkpoint_dir")
        super().__init__(*args, **kwargs)
        self.checkpoint_every, self.max_failures, self.progress = checkpoint_every, max_failures, progress
        self.pipelined_dispatch, self.iterations_per_call = pipelined_dispatch, iterations_per_call
        self.async_checkpoints = async_checkpoints
        self.policies = FixedPlan(self)
        self.loop = TrainingLoop(self, self.policies, pipelined_dispatch)  # one per trainer: the failure budget spans fits

    @property
    def failures(self) -> int:
        """Worker deaths so far, over every ``fit`` (counted by the loop, once each)."""
        return self.loop.failures

    def fit(self, steps: int) -> FitResult:
        """Train up to step ``steps`` (not ``steps`` more: a resumed trainer continues to the same target; at or
        past it, return at once), restarting from the last checkpoint on a worker's death. With a
        ``checkpoint_dir`` the last step is always committed before ``fit`` returns. See
        :mod:`orchestrator.elastic.loop` for dispatch and how each step is timed."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise UserError(f"fit(steps) needs a whole number of steps >= 0, not {steps!r}")
        self._ensure_started()
        first, target = self.step, max(self.step, steps)
        start = time.perf_counter()
        policies = self.policies
        policies.begin(first, target)
        try:
            self.loop.run(target)
        finally:
            policies.bar.close()
        policies.finish(target)
        steps_done = list(range(first, target))
        return FitResult(steps_done, [self.history[s] for s in steps_done],
                         [policies.metrics[s] for s in steps_done if s in policies.metrics], self.plan, policies.restarts,
                         policies.written, time.perf_counter() - start,
                         {d["device"]: d["node_id"] for d in self.devices()})


class FixedPlan:
    """The fixed-plan policies (:class:`~orchestrator.elastic.loop.Policies`): checkpoints on schedule, a restart
    after a death within the budget, runs of ``iterations_per_call`` steps that never cross a checkpoint."""

    def __init__(self, trainer: PipelineTrainer) -> None:
        self.trainer = trainer
        self.begin(trainer.step, trainer.step)

    def begin(self, first: int, target: int) -> None:
        """A ``fit`` from step ``first`` to ``target``: what it reports starts empty."""
        self.first = first
        self.metrics: dict[int, MeasuredIteration] = {}
        self.written: list[str] = []
        self.restarts = 0
        show = self.trainer.progress if self.trainer.progress is not None else target - first >= 50
        self.bar = tqdm(total=target - first, disable=not show, desc="pipeline", unit="it")

    def before(self, step: int) -> None:
        pass

    def run_length(self, step: int, target: int) -> int:
        end = min(target, step + max(1, self.trainer.iterations_per_call))
        if self.trainer.checkpoint_every:
            end = min(end, (step // self.trainer.checkpoint_every + 1) * self.trainer.checkpoint_every)
        return end - step

    def hold(self, done: int, target: int) -> bool:
        return every(self.trainer.checkpoint_every, done)

    def completed(self, run: Sequence[MeasuredIteration]) -> None:
        first = self.trainer.step - len(run)
        for k, m in enumerate(run):
            self.metrics[first + k] = m
        self.bar.update(len(run))
        self.bar.set_postfix(loss=f"{run[-1].loss:.4f}")

    def between(self, run: Sequence[MeasuredIteration], target: int) -> None:
        trainer = self.trainer
        if every(trainer.checkpoint_every, trainer.step):
            self.written.append(str(trainer.save_checkpoint(background=trainer.async_checkpoints)))

    def failed(self, exc: PipelineActorError, failures: int) -> None:
        if failures > self.trainer.max_failures:
            raise exc
        self.restarts += 1
        self.trainer.recover(exc)
        self.bar.n = max(0, self.trainer.step - self.first)
        self.bar.refresh()

    def finish(self, target: int) -> None:
        """The last background upload commits, and the run ends on a committed checkpoint of its last step."""
        trainer = self.trainer
        trainer.finish_checkpoint()
        if trainer.checkpoint_dir is not None and target > self.first and not every(trainer.checkpoint_every, trainer.step):
            self.written.append(str(trainer.save_checkpoint()))


__all__ = ["FixedPlan", "PipelineTrainer"]
