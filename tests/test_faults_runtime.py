"""Slowdown injection in the real runtime, from the same specs as the simulator's, pushed as the elastic job's
rehearsal pushes them (:class:`~orchestrator.adapt.rehearsal.Rehearsal`).

A :class:`Slowdown` must show up in the measured compute seconds of that device (and nowhere
else) without changing a single gradient; a :class:`Throttle` must show up in the measured
transfer seconds of that link. (A :class:`Kill` is the job's failure policy's: ``test_elastic_job.py``.)
"""

from __future__ import annotations

from functools import partial
from typing import Any, Iterator

import pytest
import torch

from actors.reference import ReferenceTrainer, allclose
from orchestrator.core.cluster import flat
from orchestrator.adapt import FaultSchedule, IterationMetrics, Slowdown, Throttle
from orchestrator.adapt.live import to_controller_metrics
from orchestrator.adapt.rehearsal import Rehearsal
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import Plan, ScheduleKind, straight_plan
from orchestrator.train.runtime import PipelineRuntime

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)
MLP = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 11, widths=WIDTHS)
ADAM = partial(torch.optim.Adam, lr=0.01)
M = 4


def run(group: Any, plan: Plan, faults: FaultSchedule, steps: int) -> tuple[PipelineRuntime, list[IterationMetrics]]:
    """``steps`` iterations with the scenario's knobs of each pushed before it, measured in the controller's terms."""
    runtime = PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=plan, workers=group, pg_timeout_s=6)
    runtime.start(members=[0, 1, 2, 3], slots={d: d for d in range(4)}, size=4)
    rehearsal, out = Rehearsal(faults, flat(4, 10)), []
    for k in range(steps):
        rehearsal.push(runtime, plan, k)
        out.append(to_controller_metrics(runtime.complete_step(runtime.submit_step()), k, plan))
    return runtime, out


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
    runtime, metrics = run(pool, plan, faults, 7)
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
    assert allclose(runtime.state_dicts(), reference_after(plan, 7).state_dicts())
