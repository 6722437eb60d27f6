"""The user's callbacks: every step seen once and in order, a checkpoint and a stop on demand, events as they are
recorded, and a callback's exception as the user's mistake (one line naming it, no retry, a committed checkpoint,
``failed``). A stopped run resumes exactly."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import orchestrator
from actors import checkpoint as ckpt
from orchestrator.elastic import run_record
from orchestrator.train.callbacks import CallbackError
from tests.test_run_lifecycle import job

ROOT = Path(__file__).resolve().parents[1]


class Recorder(orchestrator.Callback):
    def __init__(self, checkpoint_at: int = 0, stop_at: int = 0, raise_at: int = 0) -> None:
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.rates: list[float | None] = []
        self.events: list[str] = []
        self.starts: list[orchestrator.StartInfo] = []
        self.ended: list[Any] = []
        self.checkpoint_at, self.stop_at, self.raise_at = checkpoint_at, stop_at, raise_at

    def on_start(self, info: orchestrator.StartInfo) -> None:
        self.starts.append(info)

    def on_step_end(self, info: orchestrator.StepInfo) -> orchestrator.Checkpoint | orchestrator.Stop | None:
        self.steps.append(info.step)
        self.losses.append(info.loss)
        self.rates.append(info.lr)
        assert info.samples_per_s > 0
        if info.step == self.raise_at:
            raise ValueError("boom")
        if info.step == self.checkpoint_at:
            return orchestrator.Checkpoint()
        if info.step == self.stop_at:
            return orchestrator.Stop("enough")
        return None

    def on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event["event"])

    def on_end(self, result: Any) -> None:
        self.ended.append(result)


def committed_steps(events: list[dict[str, Any]]) -> list[int]:
    return [e["step"] for e in events if (e["event"] == "checkpoint" and not e["background"]) or e["event"] == "checkpoint_committed"]


@pytest.mark.ray
def test_a_callback_checkpoints_and_stops_the_run_which_then_resumes_exactly(worker_group: Any, tmp_path: Path) -> None:
    cb = Recorder(checkpoint_at=7, stop_at=9)
    j = job(worker_group, tmp_path, checkpoint_every=0, callbacks=[cb])
    try:
        result = j.fit(20)
        assert result.step in (9, 10) and cb.ended == [result]
        assert cb.steps == list(range(1, result.step + 1)) and all(math.isfinite(x) for x in cb.losses)
        assert cb.rates == [0.05] * result.step  # the SGD rate of the first block optimizer
        assert cb.starts[0].step == 0 and cb.starts[0].target == 20 and cb.starts[0].resumed_from is None
        steps = committed_steps(result.events)
        assert any(s in (7, 8) for s in steps) and steps[-1] == result.step
        assert result.events[-1]["event"] == "stopped" and result.events[-1]["reason"] == "enough"
        assert "job_finished" not in cb.events and cb.events[0] == "job_started" and cb.events[-1] == "stopped"
        record = run_record.read(str(tmp_path / "ckpt"))
        assert record is not None and record.status == "stopped" and record.last_committed == result.step
    finally:
        j.close()
    again = job(worker_group, tmp_path, checkpoint_every=0)
    try:
        resumed = again.fit(12)
        assert resumed.events[0]["resumed_from"] == result.step and resumed.step == 12
        assert again.max_abs_diff() <= 1e-5
        assert run_record.read(str(tmp_path / "ckpt")).status == "running"  # type: ignore[union-attr]  # fit(M) may follow
    finally:
        again.close()
    assert run_record.read(str(tmp_path / "ckpt")).status == "finished"  # type: ignore[union-attr]


@pytest.mark.ray
def test_a_raising_callback_ends_the_run_once_on_a_committed_checkpoint_as_the_users_mistake(worker_group: Any, tmp_path: Path) -> None:
    cb = Recorder(raise_at=3)
    j = job(worker_group, tmp_path, checkpoint_every=0, max_failures=3, callbacks=[cb])
    try:
        with pytest.raises(CallbackError, match=r"callback Recorder.on_step_end raised ValueError: boom"):
            j.fit(20)
        assert cb.steps == [1, 2, 3]  # never called again after it raised
        events = j.records
        error = [e for e in events if e["event"] == "user_error"]
        assert len(error) == 1 and "boom" in error[0]["error"] and "raise ValueError" in error[0]["traceback"]
        assert not [e for e in events if e["event"] in ("worker_failed", "recovered", "job_finished")]
        step = j.runtime.step
        assert step in (3, 4) and ckpt.verify(ckpt.latest(tmp_path / "ckpt"))["step"] == step  # type: ignore[arg-type]
        assert run_record.read(str(tmp_path / "ckpt")).status == "failed"  # type: ignore[union-attr]
    finally:
        j.close()


def test_callbacks_must_be_callbacks(tmp_path: Path) -> None:
    from orchestrator.core.errors import UserError
    from orchestrator.train.callbacks import Callbacks

    with pytest.raises(UserError, match="is not an orchestrator.Callback"):
        Callbacks([object()])  # type: ignore[list-item]


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_file(tmp_path: Path) -> None:
    import fcntl
    import io
    import os
    import struct
    import termios

    from orchestrator.train.callbacks import Progress

    def drive(out: Any) -> None:
        progress = Progress(every=5, out=out)
        progress.on_start(orchestrator.StartInfo(0, 10, "r1", "ckpt", "plan", None))
        for step in range(1, 11):
            progress.on_step_end(orchestrator.StepInfo(step, 10, 1.0 / step, 0.1, 80.0, 0.05, 0, 0, 0))
        progress.on_end(None)

    master, replica = os.openpty()  # a real terminal, 120 columns wide
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    with os.fdopen(replica, "w") as terminal:
        drive(terminal)
    chunks = []
    while True:  # the terminal's output, to its end (EIO once the writer is closed and all is read)
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    screen = b"".join(chunks).decode()
    assert "[raypipe] run r1" in screen and "10/10" in screen and "\r" in screen and "loss 0.1000" in screen
    assert "[raypipe] step 5/10" not in screen  # the bar, not the lines
    log = io.StringIO()  # not a terminal: lines every 5 steps, no carriage returns
    drive(log)
    lines = log.getvalue().splitlines()
    assert lines[1:] == ["[raypipe] step 5/10 loss 0.2000 lr 0.05 80.0 samples/s", "[raypipe] step 10/10 loss 0.1000 lr 0.05 80.0 samples/s"]
    assert "\r" not in log.getvalue()


@pytest.mark.ray
def test_a_driver_whose_callback_raises_exits_2_with_one_line(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = subprocess.run([sys.executable, str(driver), "--steps", "12", "--devices", "2", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert lines == ["error: callback Boom.on_step_end raised ValueError: boom"], out.stderr[-2000:]
    assert "[raypipe] run" in out.stdout  # progress goes to stdout, never stderr
    events = [json.loads(x) for x in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("job_started") == 1 and events[-1]["event"] == "user_error"


DRIVER = '''
import argparse
from functools import partial
import torch
import orchestrator
from orchestrator import ElasticJob, TrainConfig
from orchestrator.cli.commands import run_main
from orchestrator.cli.driver_args import add_job_arguments, job_configs
from orchestrator.profiling.models import example_batch, loss_fn, mlp

class Boom(orchestrator.Callback):
    def on_step_end(self, info):
        if info.step == 3:
            raise ValueError("boom")

def main():
    p = argparse.ArgumentParser()
    add_job_arguments(p)
    args = p.parse_args()
    widths = (8, 16, 16, 4)
    train = TrainConfig(model_factory=partial(mlp, widths), loss_fn=loss_fn("mlp"), optimizer_factory=partial(torch.optim.SGD, lr=0.05),
                        data_fn=partial(example_batch, "mlp", 8, widths=widths), num_microbatches=2)
    with ElasticJob(train, *job_configs(args), callbacks=[Boom()]) as job:
        job.fit(args.steps)

run_main(main)
'''


@pytest.mark.ray
def test_the_fixed_plan_trainer_is_a_typed_preset_with_the_same_callbacks_and_result(worker_group: Any, tmp_path: Path) -> None:
    import inspect

    from orchestrator.core.plan import straight_plan
    from tests.test_run_lifecycle import train_config

    params = inspect.signature(orchestrator.PipelineTrainer).parameters.values()
    assert not [p for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)] and "callbacks" in {p.name for p in params}
    assert not issubclass(orchestrator.PipelineTrainer, orchestrator.PipelineRuntime)
    t = train_config()
    cb = Recorder(checkpoint_at=2, stop_at=4)
    trainer = orchestrator.PipelineTrainer(t.model_factory, t.loss_fn, t.optimizer_factory, t.data_fn, t.num_microbatches,
                                           plan=straight_plan([0, 4, 8], 4), workers=worker_group, checkpoint_dir=tmp_path,
                                           iterations_per_call=1, callbacks=[cb])
    try:
        result = trainer.fit(10)
        assert type(result) is orchestrator.JobResult and cb.ended == [result]
        assert result.step in (4, 5) and cb.steps == list(range(1, result.step + 1))
        assert sorted(result.losses) == [s - 1 for s in cb.steps] and len(result.metrics) == result.step
        assert any(c.endswith(("step_00000002", "step_00000003")) for c in result.checkpoints)
        assert result.checkpoints[-1].endswith(f"step_{result.step:08d}")  # the run ends committed
    finally:
        trainer.shutdown()


def printing_data(step: int) -> Any:
    from orchestrator.profiling.models import example_batch

    print(f"reading batch {step}")
    return example_batch("mlp", 11, step, widths=(8, 16, 16, 16, 16, 16, 16, 16, 4))


@pytest.mark.ray
def test_what_the_users_code_prints_on_the_workers_reaches_the_drivers_stdout_by_stage(worker_group: Any, tmp_path: Path,
                                                                                         capsys: Any) -> None:
    import ray

    from orchestrator import ElasticJob, RunConfig, ScalingConfig, SpotConfig
    from orchestrator.core.plan import straight_plan
    from orchestrator.elastic.job_config import AdaptConfig, TrainConfig
    from tests.test_run_lifecycle import train_config

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    base = train_config()
    train = TrainConfig(model_factory=base.model_factory, loss_fn=base.loss_fn, optimizer_factory=base.optimizer_factory,
                        data_fn=printing_data, num_microbatches=4)
    job = ElasticJob(train, ScalingConfig(devices=2, plan=straight_plan([0, 4, 8], 4)),
                     RunConfig(storage=str(tmp_path / "ckpt"), checkpoint_every=0, progress=False), AdaptConfig(enabled=False),
                     SpotConfig(enabled=False), workers=worker_group)
    try:
        capsys.readouterr()
        job.fit(2)
    finally:
        job.close()
    out = capsys.readouterr().out.splitlines()
    for step in (0, 1):
        assert f"[stage 0 device 0] reading batch {step}" in out and f"[stage 1 device 1] reading batch {step}" in out


def shard_failing_data(step: int) -> Any:
    if step == 2:
        raise ValueError("bad shard")
    return printing_data(step)


@pytest.mark.ray
def test_a_user_error_on_a_worker_fails_the_run_once_with_the_users_frames_in_the_log(worker_group: Any, tmp_path: Path) -> None:
    import ray

    from orchestrator import ElasticJob, RunConfig, ScalingConfig, SpotConfig
    from orchestrator.core.errors import UserError
    from orchestrator.core.plan import straight_plan
    from orchestrator.elastic.job_config import AdaptConfig, TrainConfig
    from tests.test_run_lifecycle import train_config

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    base = train_config()
    train = TrainConfig(model_factory=base.model_factory, loss_fn=base.loss_fn, optimizer_factory=base.optimizer_factory,
                        data_fn=shard_failing_data, num_microbatches=4)
    job = ElasticJob(train, ScalingConfig(devices=2, plan=straight_plan([0, 4, 8], 4)),
                     RunConfig(storage=str(tmp_path / "ckpt"), checkpoint_every=0, progress=False, max_failures=3),
                     AdaptConfig(enabled=False), SpotConfig(enabled=False), workers=worker_group)
    try:
        with pytest.raises(UserError, match="bad shard"):
            job.fit(6)
        (error,) = [e for e in job.records if e["event"] == "user_error"]
        assert "bad shard" in error["error"] and 'raise ValueError("bad shard")' in error["traceback"]
        assert not [e for e in job.records if e["event"] in ("worker_failed", "recovered")]
        assert run_record.read(str(tmp_path / "ckpt")).status == "failed"  # type: ignore[union-attr]
    finally:
        job.close()
