"""Pipelined dispatch in ``PipelineTrainer.fit``: iteration k+1 is submitted before k is gathered.

It must change nothing but timing: the same parameters and losses bit for bit as one-at-a-time
dispatch, the same checkpoints at the same steps (nothing submitted across a checkpoint), and a
worker death while a later step is already queued still recovers from the last checkpoint and
ends exact.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from actors import checkpoint as ckpt
from actors.injection import arm_kills
from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import straight_plan
from orchestrator.train.trainer import PipelineTrainer

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)
MLP = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 11, widths=WIDTHS)
ADAM = partial(torch.optim.Adam, lr=0.01)
PLAN = straight_plan([0, 3, 6, 8], 3)  # 3 stages, no replicas: no all-reduce order to differ
STEPS = 4


def identical(a: dict[int, dict[str, torch.Tensor]], b: dict[int, dict[str, torch.Tensor]]) -> bool:
    return set(a) == set(b) and all(set(a[k]) == set(b[k]) and all(torch.equal(v, b[k][n]) for n, v in a[k].items()) for k in a)


def trainer(group: Any, tmp: Path, pipelined: bool, **kw: Any) -> PipelineTrainer:
    kw = {"checkpoint_dir": tmp, "checkpoint_every": 2, "iterations_per_call": 1, **kw}
    return PipelineTrainer(MLP, loss_fn("mlp"), ADAM, DATA, 3, plan=PLAN, workers=group,
                           pipelined_dispatch=pipelined, pg_timeout_s=20, progress=False, **kw)


def spy(group: Any, log: list[tuple[str, Any]]) -> Callable[[], None]:
    """Record the order of submissions and gathers on ``group``; returns the undo."""
    submit, gather = group.submit, group.gather

    def logged_submit(method: Any, *args: Any, **kw: Any) -> Any:
        log.append(("submit", (method.__name__, *args)))
        return submit(method, *args, **kw)

    def logged_gather(refs: Any, what: str, *args: Any, **kw: Any) -> Any:
        log.append(("gather", what))
        return gather(refs, what, *args, **kw)

    group.submit, group.gather = logged_submit, logged_gather

    def undo() -> None:
        del group.submit, group.gather

    return undo


@pytest.mark.ray
def test_pipelined_fit_is_bit_identical_with_a_checkpoint_in_the_middle(worker_group: Any, tmp_path: Path) -> None:
    fast = trainer(worker_group, tmp_path / "pipelined", True)
    fast.runtime.start()  # configure the workers before watching the dispatch order
    log: list[tuple[str, Any]] = []
    undo = spy(worker_group, log)
    try:
        got = fast.fit(STEPS)
    finally:
        undo()
    got_state = fast.state_dicts()
    slow = trainer(worker_group, tmp_path / "serial", False)
    want = slow.fit(STEPS)
    want_state = slow.state_dicts()
    ref = ReferenceTrainer.for_plan(PLAN, MLP, loss_fn("mlp"), ADAM, DATA)
    ref_losses = ref.train(STEPS)

    assert got.losses == want.losses and identical(got_state, want_state), max_difference(got_state, want_state)
    assert identical(got_state, ref.state_dicts()), max_difference(got_state, ref.state_dicts())
    assert list(got.losses.values()) == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
    assert [Path(p).name for p in got.checkpoints] == [Path(p).name for p in want.checkpoints]
    assert len(got.checkpoints) == 2 and ckpt.latest(tmp_path / "pipelined") is not None
    assert [m.step for m in got.metrics] == [0, 1, 2, 3] and all(m.iteration_s > 0 for m in got.metrics)
    assert sum(m.iteration_s for m in got.metrics) <= got.wall_s

    # Step k+1 goes out before k is gathered, except across the checkpoint after step 1 and after the last step.
    events = [(kind, x[1] if kind == "submit" and x[0] == "run_iterations" else x if kind == "gather" else x[0]) for kind, x in log]
    assert events == [
        ("submit", 0), ("submit", 1), ("gather", "step 0"), ("gather", "step 1"),
        ("submit", "save_blocks"), ("gather", "checkpoint"),
        ("submit", 2), ("submit", 3), ("gather", "step 2"), ("gather", "step 3"),
        ("submit", "save_blocks"), ("gather", "checkpoint"),
    ]


@pytest.mark.ray
@pytest.mark.parametrize("kill", [(3, 2), (2, 0)])
def test_kill_during_pipelined_fit_recovers_exactly(worker_group: Any, tmp_path: Path, kill: tuple[int, int]) -> None:
    """(3, 2): the last stage dies in a step that was queued behind step 2; (2, 0): the first
    stage dies in step 2 while step 3 is queued behind it on every worker."""
    t = arm_kills(trainer(worker_group, tmp_path, True, max_failures=1), {kill})
    result = t.fit(5)
    assert result.restarts == 1 and t.step == 5
    assert result.checkpoints == [str(ckpt.step_dir(tmp_path, s)) for s in (2, 4, 5)]  # 5: the final one
    ref = ReferenceTrainer.for_plan(PLAN, MLP, loss_fn("mlp"), ADAM, DATA)
    ref_losses = ref.train(5)
    got = t.state_dicts()
    assert allclose(got, ref.state_dicts()) and identical(got, ref.state_dicts()), max_difference(got, ref.state_dicts())
    assert list(result.losses.values()) == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)


@pytest.mark.ray
def test_runs_of_several_steps_per_call_are_bit_identical_and_pipelined(worker_group: Any, tmp_path: Path) -> None:
    """``iterations_per_call=2``, no checkpoints: steps go out two per call, the next call before
    the current one is gathered, the last call short; weights and losses equal one step per call."""
    fast = trainer(worker_group, tmp_path, True, checkpoint_dir=None, checkpoint_every=0, iterations_per_call=2)
    fast.runtime.start()
    log: list[tuple[str, Any]] = []
    undo = spy(worker_group, log)
    try:
        got = fast.fit(5)
    finally:
        undo()
    got_state = fast.state_dicts()
    slow = trainer(worker_group, tmp_path, False, checkpoint_dir=None, checkpoint_every=0)
    want = slow.fit(5)
    assert got.losses == want.losses and identical(got_state, slow.state_dicts())
    events = [(kind, x[1:] if kind == "submit" else x) for kind, x in log]
    assert events == [("submit", (0, 2)), ("submit", (2, 2)), ("gather", "steps 0-1"), ("submit", (4, 1)),
                      ("gather", "steps 2-3"), ("gather", "step 4")]
    assert [m.step for m in got.metrics] == list(range(5)) and all(m.iteration_s >= 0 for m in got.metrics)
    assert sum(m.iteration_s for m in got.metrics) <= got.wall_s


@pytest.mark.ray
def test_kill_inside_a_run_of_steps_recovers_exactly(worker_group: Any, tmp_path: Path) -> None:
    """The middle stage dies at step 2, and again at step 3 of the replayed run [2, 4): each recovery from the
    checkpoint after step 2 (checkpoint_every=2), each kill fires once (the second was still due after the first),
    the end is exact."""
    t = arm_kills(trainer(worker_group, tmp_path, True, max_failures=2, iterations_per_call=4), {(2, 1), (3, 1)})
    result = t.fit(6)
    assert result.restarts == 2 and t.step == 6 and t.runtime.spec.injected is None
    ref = ReferenceTrainer.for_plan(PLAN, MLP, loss_fn("mlp"), ADAM, DATA)
    ref_losses = ref.train(6)
    got = t.state_dicts()
    assert identical(got, ref.state_dicts()), max_difference(got, ref.state_dicts())
    assert list(result.losses.values()) == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
