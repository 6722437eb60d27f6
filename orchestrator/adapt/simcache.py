"""Memoized simulation for the controller's decisions.

A decision times a handful of plans with the discrete-event simulator; the same plans recur from
one decision to the next (the current plan was a confirmed candidate a step earlier; a path's end
may be the full re-plan already timed) and most candidates share their lowered schedule with the
current plan. :class:`SimCache` removes both repetitions without changing any number:

- **lowering**: a plan's schedule depends only on its device groups, micro-batch counts and
  schedule kind — not on where the cuts are (boundary shifts keep it) — and the simulator reads
  only the schedule's programs, so a schedule lowered once is reused for every plan of that shape;
- **results**: (iteration time, fits in memory) per plan shape and cuts, for the *exact* cluster it
  was simulated on (a new believed model starts a new table).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.schedule.ir import Schedule
from orchestrator.schedule.lowering import lower
from orchestrator.costmodel.simulator import memory_error, simulate


def cluster_key(cluster: Cluster) -> Hashable:
    """Everything about ``cluster`` the simulator and the planners read, exactly."""
    return (cluster.devices, cluster.bandwidth.tobytes(), cluster.latency_s)


def shape_key(plan: Plan) -> Hashable:
    """What lowering depends on: per-stage device groups, micro-batches, schedule kind."""
    return (tuple(s.devices for s in plan.stages), plan.num_microbatches, plan.schedule, plan.sliced_microbatches)


def sim_key(plan: Plan) -> Hashable:
    return (shape_key(plan), tuple(s.first for s in plan.stages), tuple(s.last for s in plan.stages))


class SimCache:
    def __init__(self, profile: Profile, max_schedules: int = 256, max_models: int = 4) -> None:
        self.profile = profile
        self._schedules: OrderedDict[Hashable, Schedule] = OrderedDict()
        self._results: OrderedDict[Hashable, dict[Hashable, tuple[float, bool]]] = OrderedDict()
        self._max_schedules, self._max_models = max_schedules, max_models
        self.hits = self.misses = 0

    def lowered(self, plan: Plan) -> Schedule:
        key = shape_key(plan)
        sched = self._schedules.get(key)
        if sched is None:
            sched = self._schedules[key] = lower(plan, check=False)
            if len(self._schedules) > self._max_schedules:
                self._schedules.popitem(last=False)
        else:
            self._schedules.move_to_end(key)
        return sched

    def run(self, plan: Plan, cluster: Cluster) -> tuple[float, bool]:
        """(simulated iteration seconds, fits in device memory) of ``plan`` on ``cluster``."""
        mkey = cluster_key(cluster)
        table = self._results.get(mkey)
        if table is None:
            table = self._results[mkey] = {}
            if len(self._results) > self._max_models:
                self._results.popitem(last=False)
        else:
            self._results.move_to_end(mkey)
        pkey = sim_key(plan)
        hit = table.get(pkey)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        sim = simulate(plan, self.profile, cluster, schedule=self.lowered(plan))
        table[pkey] = out = (sim.iteration_s, memory_error(sim, cluster) is None)
        return out

    def iteration_s(self, plan: Plan, cluster: Cluster) -> float:
        return self.run(plan, cluster)[0]
