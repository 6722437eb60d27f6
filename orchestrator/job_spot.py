"""The glue between :class:`~orchestrator.job_loop.ElasticJob` and its policies.

- :class:`JobHandle`: the controller's :class:`~orchestrator.controller.handle.PipelineHandle`
  over the job. The job's loop runs the iterations; ``run_iteration`` hands the controller the
  metrics of the iteration the loop just finished (so the controller is a policy stepped between
  iterations, not a second loop), and ``apply_move`` is the job's live move.
- :func:`push_faults`: rehearsal slowdowns and link delays, as knobs on the workers.
- :func:`spot_decision`: the spot policy asked between iterations (replayed price changes
  update what it sees of the current offer); returns a ``Move`` that pays, else None.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from actors.metrics import IterationMetrics as Measured
from orchestrator.cluster import GBPS, Cluster
from orchestrator.controller.faults import Slowdown, Throttle
from orchestrator.controller.handle import IterationMetrics, MoveReport, RestartReport
from orchestrator.plan import Plan

if TYPE_CHECKING:
    from orchestrator.job_loop import ElasticJob


class JobHandle:
    """See the module docstring; mirrors :class:`orchestrator.live.RayPipeline` call for call."""

    def __init__(self, job: "ElasticJob") -> None:
        self.job = job
        self._staged: Measured | None = None

    def stage(self, m: Measured) -> None:
        self._staged = m

    def current_plan(self) -> Plan:
        return self.job.trainer.plan

    def nominal_cluster(self) -> Cluster:
        return self.job.cluster

    def alive_devices(self) -> tuple[int, ...]:
        return tuple(sorted(self.job.alive))

    def run_iteration(self) -> IterationMetrics:
        from orchestrator.live import to_controller_metrics

        assert self._staged is not None, "the job's loop stages each iteration's metrics first"
        m, self._staged = self._staged, None
        return to_controller_metrics(m, self.job.trainer.step - 1, self.current_plan())

    def apply_move(self, new_plan: Plan) -> MoveReport:
        return self.job.move(new_plan)

    def restart(self, new_plan: Plan, from_checkpoint: bool) -> RestartReport:
        job = self.job
        before = job.trainer.step
        source = job._checkpoint("planned restart") if not from_checkpoint else None
        import time

        t0 = time.perf_counter()
        resumed = job.trainer.restart_on(new_plan, source, members=sorted(job.alive),
                                         slots={d: d for d in range(job.scaling.devices)})
        return RestartReport(time.perf_counter() - t0, before - resumed, new_plan)


def push_faults(job: "ElasticJob", k: int) -> None:
    """Send each plan device its slowdown factor and outgoing link delays for iteration ``k``
    (on change only). Rehearsal only: CPU workers sleep, GPU workers refuse."""
    faults = job.adapt.faults.faults
    if not faults:
        return
    factor: dict[int, float] = {}
    delays: dict[int, dict[int, float]] = {}
    for f in faults:
        if isinstance(f, Slowdown) and f.active(k):
            factor[f.device] = factor.get(f.device, 1.0) * f.factor
        elif isinstance(f, Throttle) and f.active(k):
            for s, d in [(f.src, f.dst)] + ([(f.dst, f.src)] if f.symmetric else []):
                if f.delay_per_byte is not None:
                    delays.setdefault(s, {})[d] = f.delay_per_byte
                else:
                    assert f.gbps is not None
                    delays.setdefault(s, {})[d] = max(0.0, 1.0 / (f.gbps * GBPS) - 1.0 / job.cluster.link(s, d))
    knobs = job._knobs
    group = job.trainer.group
    assert group is not None
    for d in job.trainer.plan.devices:
        want = (factor.get(d, 1.0), tuple(sorted(delays.get(d, {}).items())))
        if knobs.get(d) != want:
            group.call("set_faults", want[0], dict(want[1]), devices=[d], what="set faults")
            knobs[d] = want


def spot_decision(job: "ElasticJob", step: int) -> Any:
    """Ask the spot policy (when due) whether moving elsewhere pays; a Move or None."""
    from cloud.migration import Move

    spot = job.spot
    assert spot.policy is not None
    for at, usd in spot.price_events:
        if at == step and job.placement is not None:
            job.placement = replace(job.placement, usd_per_hour=usd)
            job.emit("price_change", step=step, offer=job.placement.label(), usd_per_hour=usd)
    due = any(at == step for at, _ in spot.price_events) or (spot.migration_check_every and step % spot.migration_check_every == 0)
    if not due or job.placement is None:
        return None
    decision = spot.policy(job.placement, False, step)
    job.emit("migration_decision", step=step, decision=type(decision).__name__, reason=getattr(decision, "reason", ""))
    return decision if isinstance(decision, Move) else None
