"""Evaluation: a forward-only pass over the current plan, every N steps, equal to the single-process model's on the
same batches, and changing nothing (training after it stays exact). A replicated stage's replicas each add their
rows' share of the loss, as in training."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from actors.execution import evaluation
from actors.reference import ReferenceTrainer
from orchestrator import ElasticJob, RunConfig, ScalingConfig, SpotConfig
from orchestrator.core.errors import UserError
from orchestrator.core.plan import straight_plan
from orchestrator.elastic.job_config import AdaptConfig, TrainConfig
from orchestrator.profiling.models import example_batch
from orchestrator.schedule.ir import Kind
from orchestrator.schedule.lowering import forward_only
from tests.test_run_lifecycle import WIDTHS, train_config

EVAL = partial(example_batch, "mlp", 7, widths=WIDTHS)  # 7 rows: unequal micro-batches and replica shares


@pytest.mark.ray
def test_evaluations_equal_the_single_process_models_and_change_nothing(worker_group: Any, tmp_path: Path) -> None:
    base = train_config()
    train = TrainConfig(model_factory=base.model_factory, loss_fn=base.loss_fn, optimizer_factory=base.optimizer_factory,
                        data_fn=base.data_fn, num_microbatches=4, eval_data_fn=EVAL, eval_every=3, eval_steps=2)
    plan = straight_plan([0, 3, 6, 8], 4, devices=[[0], [1, 2], [3]])
    from orchestrator.sinks import TensorBoard

    job = ElasticJob(train, ScalingConfig(devices=4, plan=plan), RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "e.jsonl",
                     checkpoint_every=0, callbacks=(TensorBoard(str(tmp_path / "tb")),)), AdaptConfig(enabled=False),
                     SpotConfig(enabled=False), workers=worker_group)
    try:
        result = job.fit(7)
        evals = [e for e in result.events if e["event"] == "eval"]
        assert [(e["step"], e["batches"]) for e in evals] == [(3, 2), (6, 2)]
        reference = ReferenceTrainer(train.model_factory, train.loss_fn, train.optimizer_factory, train.data_fn, 4)
        for e in evals:
            reference.train(e["step"] - reference.step)
            assert e["loss"] == pytest.approx(reference.evaluate(EVAL, 2), rel=1e-5, abs=1e-6)
        assert job.max_abs_diff() <= 1e-5  # the evaluations changed nothing
    finally:
        job.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(tmp_path / "tb")).Reload()
    loss = {e.step: e.value for e in scalars.Scalars("train/loss")}
    assert sorted(loss) == list(range(1, 8)) and loss[7] == pytest.approx(result.losses[6], rel=1e-6)
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in scalars.Scalars("eval/loss")] == [(x["step"], x["loss"]) for x in evals]
    assert [e.value for e in scalars.Scalars("train/lr")] == pytest.approx([0.05] * 7)
    assert "run/moves" in scalars.Tags()["scalars"] and "cost/usd_total" in scalars.Tags()["scalars"]


def test_the_evaluation_program_forwards_every_unit_once_and_nothing_else() -> None:
    plan = straight_plan([0, 3, 6, 8], 4, devices=[[0], [1, 2], [3]])
    programs = forward_only(plan).programs
    kinds = {a.kind for p in programs.values() for a in p}
    assert kinds <= {Kind.FORWARD, Kind.SEND_F, Kind.RECV_F} and Kind.FORWARD in kinds
    forwards = [(d, a.stage, a.unit) for d, p in programs.items() for a in p if a.kind is Kind.FORWARD]
    assert len(forwards) == len(set(forwards)) == sum(len(s.devices) for s in plan.stages) * 4


def test_evaluation_mode_is_restored_and_eval_needs_its_data() -> None:
    blocks = [nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)), nn.Dropout(0.5).eval()]
    with evaluation(blocks):
        assert not any(m.training for m in blocks) and not torch.is_grad_enabled()
    assert blocks[0].training and not blocks[1].training and torch.is_grad_enabled()
    base = train_config()
    with pytest.raises(UserError, match="eval_every needs an eval_data_fn"):
        TrainConfig(model_factory=base.model_factory, loss_fn=base.loss_fn, optimizer_factory=base.optimizer_factory,
                    data_fn=base.data_fn, eval_every=5)
