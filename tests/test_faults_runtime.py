"""Fault and slowdown injection in the real runtime, from the same specs as the simulator's.

A :class:`Slowdown` must show up in the measured compute seconds of that device (and nowhere
else) without changing a single gradient; a :class:`Throttle` must show up in the measured
transfer seconds of that link; a :class:`Kill` must surface as a failed iteration with the lost
device, after which the controller either drops the dead replica live or restarts on the
survivors from the last checkpoint — and training is still exact.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.core.cluster import flat
from orchestrator.adapt import Controller, ControllerConfig, FaultSchedule, Kill, Slowdown, ControllerState, Throttle
from orchestrator.elastic.harness import RayPipeline, run_adaptive
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import Plan, ScheduleKind, Stage, straight_plan
from orchestrator.train.runtime import PipelineRuntime

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)
MLP = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 11, widths=WIDTHS)
ADAM = partial(torch.optim.Adam, lr=0.01)
M = 4
STILL = ControllerConfig(use_moves=False)  # failure handling only: no speculative moves


def make(group: Any, plan: Plan, faults: FaultSchedule, tmp: Path | None = None, **kw: Any) -> RayPipeline:
    trainer = PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=plan, workers=group, pg_timeout_s=6,
                              checkpoint_dir=tmp, **kw)
    return RayPipeline(trainer, flat(4, 10), faults, checkpoint_every=2 if tmp else 0)


def reference_after(plan: Plan, steps: int) -> ReferenceTrainer:
    ref = ReferenceTrainer.for_plan(plan, MLP, loss_fn("mlp"), ADAM, DATA)
    ref.train(steps)
    return ref


@pytest.fixture
def pool(worker_group: Any) -> Iterator[Any]:
    """The shared pool, with any worker a test killed replaced afterwards."""
    yield worker_group
    worker_group.respawn(sorted(worker_group.dead))
    worker_group.deaths_known()


@pytest.mark.ray
@pytest.mark.parametrize("kind", [ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1])
def test_slowdown_and_throttle_show_in_measured_metrics(pool: Any, kind: ScheduleKind) -> None:
    """Measured seconds on a loaded 2-core box swing several-fold from one iteration to the next (iteration 1 of a
    run measured device 2 at 5x device 0 with no slowdown at all), so the injected effects are made large enough to
    stand out of that noise for certain: a 100x slowdown (a sleep of 99x the compute's own CPU seconds, which load
    does not change) and a 300 ms link delay, compared as medians of three iterations before and after."""
    plan = straight_plan([0, 3, 6, 8], M, kind)  # ZB-H1: the split halves BI and W are slowed too
    faults = FaultSchedule((Slowdown(2, 100.0, 4), Throttle(0, 1, 4, delay_per_byte=1.5e-3 / 3, symmetric=False)))
    pipe = make(pool, plan, faults)
    metrics = [pipe.run_iteration() for _ in range(7)]
    assert all(m.completed for m in metrics)
    before, after = metrics[1:4], metrics[4:7]
    med = lambda ms, f: sorted(f(m) for m in ms)[1]  # noqa: E731 - median of three
    growth = {d: med(after, lambda m: m.compute_s[d]) / med(before, lambda m: m.compute_s[d]) for d in (0, 1, 2)}
    assert growth[2] > 3.0 * max(growth[0], growth[1]), growth  # the slowed device, and only it
    # 0->1 carries 11 rows x 16 floats per iteration: the delay adds about 350 ms to it, not to 1->0. A transfer
    # span also covers time the receiver was busy elsewhere, so part of the delay hides in it.
    link = lambda ms, k: med(ms, lambda m: m.link_s[k])  # noqa: E731
    assert link(after, (0, 1)) >= link(before, (0, 1)) + 0.5 * 5e-4 * after[0].link_bytes[(0, 1)]
    assert link(after, (1, 0)) - link(before, (1, 0)) < link(after, (0, 1)) - link(before, (0, 1))  # on 0->1 only
    # sleeping never changes a gradient
    assert allclose(pipe.runtime.state_dicts(), reference_after(plan, 7).state_dicts())


@pytest.mark.ray
def test_kill_of_a_replica_drops_it_and_continues_live(pool: Any) -> None:
    plan = Plan((Stage(0, 4, (0, 1)), Stage(4, 8, (2,))), M)
    pipe = make(pool, plan, FaultSchedule((Kill(1, 2),)))
    survivors = {s["device"]: s["pid"] for s in pool.call("status", devices=[0, 2])}
    ctl = Controller(pipe, pipe.profile, STILL)
    records = ctl.run(4)
    failed = records[2]
    assert not failed.completed and failed.state is ControllerState.RECOVERING and failed.action == "drop-replicas"
    assert pipe.current_plan().devices == (0, 2) and pipe.alive_devices() == (0, 2, 3)
    assert records[3].completed and records[3].iteration == 2  # only the failed iteration is redone
    assert {s["device"]: s["pid"] for s in pool.call("status", devices=[0, 2])} == survivors  # kept their processes
    assert pipe.iteration == 3
    got, want = pipe.runtime.state_dicts(), reference_after(plan, 3).state_dicts()
    assert allclose(got, want), max_difference(got, want)


@pytest.mark.ray
def test_kill_of_the_only_holder_restarts_from_checkpoint(pool: Any, tmp_path: Path) -> None:
    plan = straight_plan([0, 3, 6, 8], M)
    pipe = make(pool, plan, FaultSchedule((Kill(1, 3),)), tmp_path)
    ctl = Controller(pipe, pipe.profile, STILL)
    records = ctl.run(6)
    failed = records[3]
    assert not failed.completed and failed.action == "restart" and failed.state is ControllerState.RECOVERING
    assert 1 not in pipe.current_plan().devices and set(pipe.current_plan().devices) <= {0, 2, 3}
    assert records[4].iteration == 2  # the checkpoint holds steps 0-1, so iteration 2 is redone
    assert pipe.iteration == 4
    got, want = pipe.runtime.state_dicts(), reference_after(plan, 4).state_dicts()
    assert allclose(got, want), max_difference(got, want)


@pytest.mark.ray
def test_run_adaptive_reports_events(pool: Any) -> None:
    """The demo's entry point: per-step throughput and the injected fault as an event."""
    plan = straight_plan([0, 4, 8], M)
    trainer = PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=plan, workers=pool, pg_timeout_s=6)
    run = run_adaptive(trainer, ControllerConfig(straight=True, warmup_iterations=2), 4, [Slowdown(1, 2.0, 2)], cluster=flat(4, 10))
    assert len(run.samples_per_s) == 4 and all(t > 0 for t in run.samples_per_s)
    assert [e.kind for e in run.events if e.kind == "slowdown"] == ["slowdown"]
    assert any(e.kind == "decision" for e in run.events)
    assert "slowdown" in run.summary()
