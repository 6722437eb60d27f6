"""LR schedules are state: checkpointed with each block's optimizer and restored, so a resumed run continues with
the very LR (and scheduler counters) the uninterrupted run has. ``ReduceLROnPlateau`` steps on the evaluation loss
at each evaluation. Checked against single-process training that steps its own scheduler on its own evaluations."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from actors.reference import ReferenceTrainer
from actors.training import TrainingOptions
from orchestrator import ElasticJob, RunConfig, ScalingConfig, SpotConfig
from orchestrator.core.errors import UserError
from orchestrator.core.plan import straight_plan
from orchestrator.elastic.job_config import AdaptConfig, TrainConfig
from tests.test_evaluation import EVAL
from tests.test_run_lifecycle import train_config

# an evaluation that does not halve the best loss so far is a plateau: the LR halves at once (patience 0)
PLATEAU = partial(torch.optim.lr_scheduler.ReduceLROnPlateau, factor=0.5, patience=0, threshold=0.5)
COSINE = partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=8)  # each LR computed from the one before


def plateau_config(eval_every: int = 2, scheduler: Any = PLATEAU) -> TrainConfig:
    base = train_config()
    return TrainConfig(model_factory=base.model_factory, loss_fn=base.loss_fn, optimizer_factory=base.optimizer_factory,
                       data_fn=base.data_fn, num_microbatches=4, eval_data_fn=EVAL if eval_every else None,
                       eval_every=eval_every, training=TrainingOptions(lr_scheduler=scheduler))


def fit(pool: Any, root: Path, plan_devices: list[list[int]], cuts: list[int], steps: int, train: TrainConfig,
        move_at: int | None = None) -> Any:
    """Train to ``steps`` (moving every block to another device live after step ``move_at``): the result, and the
    weights' distance to uninterrupted single-process training with the same evaluations."""
    job = ElasticJob(train, ScalingConfig(devices=4, plan=straight_plan(cuts, 4, devices=plan_devices)),
                     RunConfig(storage=str(root / "ckpt"), events=root / "e.jsonl", checkpoint_every=0, progress=False),
                     AdaptConfig(enabled=False), SpotConfig(enabled=False), workers=pool)
    try:
        if move_at is None:
            return job.fit(steps), job.max_abs_diff()
        before = job.fit(move_at)
        job.switch_live(straight_plan(cuts, 4, devices=[[3 - d for d in ds] for ds in plan_devices]))
        after = job.fit(steps)
        return replace(after, metrics=before.metrics + after.metrics, losses={**before.losses, **after.losses}), job.max_abs_diff()
    finally:
        job.close()


@pytest.mark.ray
@pytest.mark.parametrize("scheduler", [PLATEAU, COSINE], ids=["plateau", "cosine"])
def test_a_resumed_and_moved_run_keeps_the_lr_of_the_uninterrupted_one(worker_group: Any, tmp_path: Path, scheduler: Any) -> None:
    """ReduceLROnPlateau steps on the evaluations; a schedule of the step, once per step. Either way the LR in force
    and the scheduler's counters survive a resume (on another plan) and a live move, exactly."""
    train = plateau_config(scheduler=scheduler)
    first, _ = fit(worker_group, tmp_path, [[0], [1, 2], [3]], [0, 3, 6, 8], 4, train)  # evaluations at 2, 4
    # resumed at 4 on another plan, every block handed to another worker after step 6 (their schedules with them)
    second, diff = fit(worker_group, tmp_path, [[0], [1], [2], [3]], [0, 2, 4, 6, 8], 8, train, move_at=6)
    assert next(e for e in second.events if e["event"] == "job_started")["resumed_from"] == 4
    reference = ReferenceTrainer(train.model_factory, train.loss_fn, train.optimizer_factory, train.data_fn, 4,
                                 training=train.training)
    lrs, losses = [], []
    for step in range(1, 9):
        lrs.append(reference.optimizers[0].param_groups[0]["lr"])
        losses += reference.train(1)
        if step % 2 == 0:
            reference.step_on_metric(reference.evaluate(EVAL, 1))
    got = {m.step: m.lr for m in first.metrics + second.metrics}
    assert [got[s] for s in range(8)] == lrs  # exactly the LR the uninterrupted run uses at every step
    assert lrs[-1] < lrs[0] and lrs[4] < lrs[0]  # reduced, and the reduction before the resume survived it
    assert [first.losses.get(s, second.losses.get(s)) for s in range(8)] == pytest.approx(losses, rel=1e-5)
    assert diff <= 1e-5  # the weights equal the single-process run's


@pytest.mark.ray
def test_reduce_lr_on_plateau_without_evaluations_is_refused(worker_group: Any, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="ReduceLROnPlateau steps on the evaluation loss"):
        fit(worker_group, tmp_path, [[0], [1], [2], [3]], [0, 2, 4, 6, 8], 2, plateau_config(eval_every=0))
