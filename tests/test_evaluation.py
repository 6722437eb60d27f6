"""Evaluation: a forward-only pass over the current plan, every N steps, equal to the single-process model's on the
same batches, and changing nothing (training after it stays exact). A replicated stage's replicas each add their
rows' share of the loss, as in training. The same short job writes to the three trackers, and each test reads the
scalars back with the tracker's own library."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
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
from orchestrator.sinks import MLflow, TensorBoard, WandB
from orchestrator.train.fit_result import JobResult
from tests.test_run_lifecycle import WIDTHS, train_config

EVAL = partial(example_batch, "mlp", 7, widths=WIDTHS)  # 7 rows: unequal micro-batches and replica shares


SCALARS = {"train/loss", "train/lr", "train/samples_per_s", "eval/loss", "run/moves", "run/recoveries", "run/stall_s",
           "cost/usd_per_hour", "cost/usd_total"}


@dataclass(frozen=True)
class Evaluated:
    """One short job with evaluations and all three trackers, read by the tests below."""

    result: JobResult
    evals: list[dict[str, Any]]
    max_abs_diff: float
    root: Path


@pytest.fixture(scope="module")
def evaluated(worker_group: Any, tmp_path_factory: pytest.TempPathFactory) -> Evaluated:
    root = tmp_path_factory.mktemp("evaluated")
    base = train_config()
    train = TrainConfig(model_factory=base.model_factory, loss_fn=base.loss_fn, optimizer_factory=base.optimizer_factory,
                        data_fn=base.data_fn, num_microbatches=4, eval_data_fn=EVAL, eval_every=3, eval_steps=2)
    plan = straight_plan([0, 3, 6, 8], 4, devices=[[0], [1, 2], [3]])
    trackers = (TensorBoard(str(root / "tb")), MLflow(f"sqlite:///{root}/mlflow.db", "evaluation"), WandB("evaluation", str(root)))
    job = ElasticJob(train, ScalingConfig(devices=4, plan=plan), RunConfig(storage=str(root / "ckpt"), events=root / "e.jsonl",
                     checkpoint_every=0, callbacks=trackers), AdaptConfig(enabled=False), SpotConfig(enabled=False), workers=worker_group)
    try:
        result = job.fit(7)
        diff = job.max_abs_diff()  # the evaluations changed nothing
    finally:
        job.close()
    return Evaluated(result, [e for e in result.events if e["event"] == "eval"], diff, root)


@pytest.mark.ray
def test_evaluations_equal_the_single_process_models_and_change_nothing(evaluated: Evaluated) -> None:
    evals = evaluated.evals
    assert [(e["step"], e["batches"]) for e in evals] == [(3, 2), (6, 2)]
    base = train_config()
    reference = ReferenceTrainer(base.model_factory, base.loss_fn, base.optimizer_factory, base.data_fn, 4)
    for e in evals:
        reference.train(e["step"] - reference.step)
        assert e["loss"] == pytest.approx(reference.evaluate(EVAL, 2), rel=1e-5, abs=1e-6)
    assert evaluated.max_abs_diff <= 1e-5


def run_id(run: Evaluated) -> str:
    return next(e["run_id"] for e in run.result.events if e["event"] == "job_started")


def check_scalars(series: dict[str, dict[int, float]], run: Evaluated) -> None:
    """What every tracker must hold: each scalar by step, the losses and evaluations the job reported."""
    assert set(series) == SCALARS - {"cost/usd_per_hour"}  # no price: dollars so far (0), no rate
    for name in set(series) - {"eval/loss"}:
        assert sorted(series[name]) == list(range(1, 8)), name
    assert series["train/loss"] == pytest.approx({s + 1: loss for s, loss in run.result.losses.items()}, rel=1e-6)
    assert series["eval/loss"] == pytest.approx({e["step"]: e["loss"] for e in run.evals}, rel=1e-6)
    assert list(series["train/lr"].values()) == pytest.approx([0.05] * 7)
    assert all(v > 0 for v in series["train/samples_per_s"].values())


@pytest.mark.ray
def test_tensorboard_reads_the_scalars_back(evaluated: Evaluated) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(evaluated.root / "tb")).Reload()
    check_scalars({name: {e.step: e.value for e in scalars.Scalars(name)} for name in scalars.Tags()["scalars"]}, evaluated)


@pytest.mark.ray
def test_mlflow_reads_the_scalars_back(evaluated: Evaluated) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{evaluated.root}/mlflow.db")
    experiment = client.get_experiment_by_name("evaluation")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags[MLflow.RUN_TAG] == run_id(evaluated)
    check_scalars({name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)} for name in run.data.metrics},
                  evaluated)


@pytest.mark.ray
def test_wandb_reads_the_scalars_back(evaluated: Evaluated) -> None:
    (offline,) = (evaluated.root / "wandb").glob("offline-run-*")  # wandb's own reader of its transaction log:
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(offline)],
                         capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, timeout=60)
    rows = [json.loads(line)["history"] for line in out.stdout.splitlines() if '"type":"history"' in line]
    series: dict[str, dict[int, float]] = {}
    for row in rows:
        for name, value in row["item"].items():
            if not name.startswith("_"):
                series.setdefault(name, {})[int(row["step"]["num"])] = value
    check_scalars(series, evaluated)
    assert offline.name.endswith(run_id(evaluated))


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


@pytest.mark.parametrize("flags, missing, message", [
    (["--tensorboard", "tb"], "tensorboard", "the TensorBoard sink needs the tensorboard package: pip install tensorboard"),
    (["--mlflow", "sqlite:///m.db"], "mlflow", "the MLflow sink needs the mlflow package: pip install mlflow-skinny"),
    (["--mlflow", "sqlite:///m.db"], "alembic", "sqlite store needs the sqlalchemy and alembic packages: pip install"),
    (["--wandb-offline", "wb"], "wandb", "the W&B sink needs the wandb package: pip install wandb"),
    (["--mlflow", "out/mlruns"], None, "use sqlite:///PATH/mlflow.db"),  # MLflow 3 refuses its retired file store
])
def test_a_tracker_flag_without_its_library_is_one_line_and_exit_2(flags: list[str], missing: str | None, message: str,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import importlib.util

    from orchestrator.cli.commands import run_main
    from orchestrator.cli.driver_args import add_job_arguments, job_configs

    find_spec = importlib.util.find_spec  # the package looks uninstalled to the sink's check
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    p = argparse.ArgumentParser()
    add_job_arguments(p)
    args = p.parse_args(flags)
    with pytest.raises(SystemExit) as exited:
        run_main(lambda: job_configs(args))
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err and err.count("\n") == 1, err
