"""One loop: the job's layers call downwards only, and only the loop dispatches iterations.

The one training loop (``orchestrator/train/loop.py``) drives the runtime (``actors``, the rest of
``orchestrator/train``) and asks the job's policies (``orchestrator/elastic``), which ask the controller
(``orchestrator/adapt``); neither the runtime nor the controller may call back up into the job — no handle that "runs" an iteration by returning a stash, no move routed back
through the job. Traced with ``sys.setprofile`` (and ``threading.setprofile`` for threads started
meanwhile) over whole iterations with the controller on and a rehearsed slowdown (so knobs are
pushed and the controller decides), and over the controller's act carried out by the loop.
"""

from __future__ import annotations

import sys
import threading
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch

from orchestrator import ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.adapt.controller import ControllerConfig
from orchestrator.adapt.faults import FaultSchedule, Slowdown
from orchestrator.core.plan import straight_plan
from orchestrator.elastic.job_config import AdaptConfig
from orchestrator.profiling.models import example_batch, loss_fn, mlp

ROOT = Path(__file__).resolve().parents[1]
TOP = ("orchestrator/train/loop.py", "orchestrator/train/trainer.py")  # the loop and the fixed-plan trainer's policies
LOWER = tuple(str(ROOT / p) + "/" for p in ("actors", "orchestrator/adapt", "orchestrator/train"))
ELASTIC = str(ROOT / "orchestrator" / "elastic") + "/"


def _lower(filename: str) -> bool:
    return filename.startswith(LOWER) and not filename.endswith(TOP)
WIDTHS = (8, 16, 16, 16, 16, 4)


class UpwardCalls:
    """Records every call whose callee is elastic code and whose caller is a lower layer."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(ELASTIC):
            return
        caller = frame.f_back
        if caller is not None and _lower(caller.f_code.co_filename):
            self.found.append(f"{caller.f_code.co_filename}:{caller.f_lineno} -> "
                              f"{frame.f_code.co_filename}:{frame.f_code.co_name}")


def test_the_tracer_sees_an_upward_call() -> None:
    """The check itself can fail: a lower-layer frame calling an elastic function is recorded."""
    tracer = UpwardCalls()
    code = compile("from orchestrator.elastic.run_record import new_run_id\nnew_run_id()", str(ROOT / "orchestrator/adapt/x.py"), "exec")
    sys.setprofile(tracer)
    try:
        exec(code, {})
    finally:
        sys.setprofile(None)
    assert tracer.found and "new_run_id" in tracer.found[0]
    assert not _lower(str(ROOT / "orchestrator/train/loop.py")) and _lower(str(ROOT / "orchestrator/train/runtime.py"))


@pytest.mark.ray
def test_no_lower_layer_calls_into_the_job_loop(worker_group: Any, tmp_path: Path) -> None:
    train = TrainConfig(model_factory=partial(mlp, WIDTHS), loss_fn=loss_fn("mlp"),
                        optimizer_factory=partial(torch.optim.SGD, lr=0.05), data_fn=partial(example_batch, "mlp", 8, widths=WIDTHS),
                        num_microbatches=4)
    config = ControllerConfig(straight=True, warmup_iterations=1, plan_ahead=False)
    job = ElasticJob(train, ScalingConfig(devices=2, plan=straight_plan([0, 1, 5], 4)),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=2),
                     AdaptConfig(controller=config, faults=FaultSchedule((Slowdown(0, 4.0, 1),))), SpotConfig(enabled=False),
                     workers=worker_group)
    tracer = UpwardCalls()
    try:
        job.fit(1)  # started, warm
        sys.setprofile(tracer)
        threading.setprofile(tracer)
        try:
            job.fit(6)  # iterations, checkpoints, the controller's observations (and any act it returns)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        decided = [e for e in job.records if e["event"] == "adapt"]
    finally:
        job.close()
    assert job.runtime.step == 6
    assert not tracer.found, "\n".join(tracer.found[:10])
    assert job.controller is not None and len(job.controller.history) >= 4, decided


DISPATCH = ("submit_step", "complete_step", "complete_run")


def test_only_the_loop_dispatches_iterations() -> None:
    """Every call of the runtime's dispatch primitives in the packages is in the one loop (or the runtime itself)."""
    import ast

    callers: dict[str, list[str]] = {}
    for top in ("orchestrator", "actors", "cloud"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DISPATCH:
                    callers.setdefault(str(path.relative_to(ROOT)), []).append(f"{node.func.attr}:{node.lineno}")
    assert "orchestrator/train/loop.py" in callers  # the check sees the loop's own calls
    strays = {f: calls for f, calls in callers.items() if f not in {"orchestrator/train/loop.py", "orchestrator/train/runtime.py"}}
    assert not strays, strays
