"""A fast, vectorized iteration-time estimate used to rank hundreds of candidate plans at once.

Simulating every O(L²) candidate with the discrete-event simulator costs milliseconds each, too
slow for a 50 ms decision on a 100-block model. So candidates are first ranked with the classic
pipeline bottleneck model, evaluated for all candidates of one depth in a handful of numpy
operations on the profile's prefix sums:

    c_s = (F+B)(stage s) / (replicas_s · slowest replica speed_s)         compute per micro-batch
    x_s = activation bytes at cut s / (link bandwidth · max(replicas))    one direction, per micro-batch
    T   = (M − 1) · max(max_s c_s, max_s x_s) + Σ c_s + 2 Σ x_s + max_s allreduce_s

i.e. the steady-state period times the micro-batches after the first, plus one micro-batch's trip
through the pipeline and back, plus the slowest gradient all-reduce. Memory is checked per stage
(weights and optimizer state × ``state_factor`` plus 1F1B's in-flight stash). A secondary score,
Σ c_s², breaks ties between plans with the same bottleneck in favour of better balance — this is
what lets a walk of single moves cross plateaus where two stages share the bottleneck.

Every term is :mod:`orchestrator.costmodel.terms`' (compute, transfer, ring all-reduce, in-flight
memory), evaluated on arrays. The estimate only *ranks*; the controller confirms the few best with the real simulator before
the arbiter sees any number (see :mod:`orchestrator.adapt.controller`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.core.profile import Profile
from orchestrator.costmodel.terms import DEFAULT_STATE_FACTOR, all_reduce_time, compute_time, fits_memory, in_flight, stage_memory, transfer_time

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """A straight (non-interleaved) plan as cut points and one device group per stage."""

    cuts: tuple[int, ...]
    groups: Groups

    @classmethod
    def of(cls, plan: Plan) -> "Layout":
        return cls(tuple(s.first for s in plan.stages) + (plan.num_blocks,), tuple(s.devices for s in plan.stages))

    def to_plan(self, template: Plan, algorithm: str = "incremental") -> Plan:
        stages = tuple(Stage(self.cuts[i], self.cuts[i + 1], g) for i, g in enumerate(self.groups))
        return Plan(stages, template.num_microbatches, template.schedule, min(template.sliced_microbatches, template.num_microbatches),
                    algorithm=algorithm)

    @property
    def devices(self) -> frozenset[int]:
        return frozenset(d for g in self.groups for d in g)


@dataclass(frozen=True)
class Estimates:
    time_s: np.ndarray  # [C] estimated iteration seconds (inf where memory does not fit)
    balance: np.ndarray  # [C] Σ c_s² (tie-breaker)
    fits: np.ndarray  # [C] bool


class CostModel:
    """The believed world (profile + cluster with observed speeds and bandwidths) as a ranker."""

    def __init__(self, profile: Profile, cluster: Cluster, num_microbatches: int,
                 schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B, state_factor: float = DEFAULT_STATE_FACTOR,
                 check_memory: bool = True) -> None:
        self.profile, self.cluster, self.m = profile, cluster, num_microbatches
        self.schedule, self.state_factor, self.check_memory = schedule, state_factor, check_memory
        self._work = profile.prefix("forward_s") + profile.prefix("backward_s")
        self._params = profile.prefix("param_bytes")
        self._stash = profile.prefix("stash_bytes")
        # activation bytes crossing a cut placed before block k (k = 0..L)
        self._cut_bytes = np.concatenate([[profile.input_bytes], profile.activations])
        self._speeds = cluster.speeds
        self._mem = cluster.memories
        # Device groups seen so far get small integer ids, so per-stage attributes and the link
        # bandwidth between consecutive groups become numpy gathers instead of Python lookups.
        self._gid: dict[tuple[int, ...], int] = {}
        self._groups: list[tuple[int, ...]] = []  # by id
        self._gattr = np.zeros((0, 4))
        self._glink = np.zeros((0, 0))
        self._members = np.zeros((0, cluster.size), dtype=bool)  # [G, n]: which devices each group holds
        self._from = np.zeros((0, cluster.size))  # [G, n]: slowest link from any device of the group to each device

    def group_ids(self, groups: Iterable[tuple[int, ...]]) -> list[int]:
        """Small integer ids of device groups (registering unseen ones), in the given order."""
        gid = self._gid
        groups = list(groups)
        fresh = {g for g in groups if g not in gid}
        if fresh:
            self._register(fresh)
        return [gid[g] for g in groups]

    def group_of(self, gid: int) -> tuple[int, ...]:
        return self._groups[gid]

    def _register(self, fresh: set[tuple[int, ...]]) -> None:
        gid = self._gid
        attrs = []
        for g in sorted(fresh):
            gid[g] = len(gid)
            self._groups.append(g)
            ids = list(g)
            attrs.append((float(self._speeds[ids].min()), float(len(g)), self.cluster.ring_bandwidth(g), float(self._mem[ids].min())))
        self._gattr = np.concatenate([self._gattr, np.array(attrs)])
        # slowest link from any device of group a to any device of group b: only the new rows and
        # columns are computed (a climb registers thousands of groups, a few at a time)
        old, n = len(self._glink), self.cluster.size
        members = np.zeros((len(self._groups) - old, n), dtype=bool)
        for k, g in enumerate(self._groups[old:]):
            members[k, list(g)] = True
        self._members = np.concatenate([self._members, members])
        from_new = np.where(members[:, :, None], self.cluster.effective[None, :, :], np.inf).min(axis=1)  # [new, n]
        self._from = np.concatenate([self._from, from_new])  # [G, n]: slowest link from group a to each device
        G = len(self._groups)
        link = np.full((G, G), np.inf)
        link[:old, :old] = self._glink
        link[:, old:] = np.where(members[None, :, :], self._from[:, None, :], np.inf).min(axis=2)
        link[old:, :old] = np.where(self._members[None, :old, :], from_new[:, None, :], np.inf).min(axis=2)
        self._glink = link

    def _ids(self, lays: list[Layout]) -> np.ndarray:
        gid = self._gid
        fresh = {g for lay in lays for g in lay.groups if g not in gid}
        if fresh:
            self._register(fresh)
        return np.array([[gid[g] for g in lay.groups] for lay in lays], dtype=np.int64)

    def estimate(self, layouts: Sequence[Layout]) -> Estimates:
        n = len(layouts)
        time_s, balance, fits = np.full(n, np.inf), np.full(n, np.inf), np.zeros(n, dtype=bool)
        by_depth: dict[int, list[int]] = {}
        for k, lay in enumerate(layouts):
            by_depth.setdefault(len(lay.groups), []).append(k)
        for depth, idx in by_depth.items():
            t, b, ok = self._estimate_depth([layouts[k] for k in idx], depth)
            time_s[idx], balance[idx], fits[idx] = t, b, ok
        return Estimates(time_s, balance, fits)

    def _estimate_depth(self, lays: list[Layout], S: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cuts = np.array([lay.cuts for lay in lays], dtype=np.int64)  # [n, S+1]
        return self.estimate_arrays(cuts, self._ids(lays))

    def estimate_arrays(self, cuts: np.ndarray, gid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time, balance, fits) of ``n`` layouts of one depth ``S`` given as arrays: cut points
        ``cuts`` [n, S+1] and device-group ids ``gid`` [n, S] (from :meth:`group_ids`)."""
        n, S = gid.shape
        attrs = self._gattr[gid]  # [n, S, 4]
        speed, reps, ring, mem = attrs[..., 0], attrs[..., 1], attrs[..., 2], attrs[..., 3]
        lo, hi = cuts[:, :-1], cuts[:, 1:]
        comp = compute_time(self._work[hi] - self._work[lo], speed, reps)
        params = self._params[hi] - self._params[lo]
        m = self.m
        if S > 1:
            link_bw = self._glink[gid[:, :-1], gid[:, 1:]]
            x = transfer_time(self._cut_bytes[cuts[:, 1:-1]], 1.0 / (link_bw * np.maximum(reps[:, :-1], reps[:, 1:])))
            period = np.maximum(comp.max(axis=1), x.max(axis=1))
            comm = 2.0 * x.sum(axis=1)
        else:
            period, comm = comp.max(axis=1), np.zeros(n)
        allreduce = all_reduce_time(reps, params, ring).max(axis=1)
        t = (m - 1) * period + comp.sum(axis=1) + comm + allreduce
        # ZB-H1 is timed as 1F1B (an upper bound); its memory is its own
        inflight = in_flight(self.schedule, np.arange(S), S, m).astype(float)
        need = stage_memory(params, self._stash[hi] - self._stash[lo], inflight[None, :], reps, self.state_factor)
        ok = np.all(fits_memory(need, mem), axis=1) if self.check_memory else np.ones(n, dtype=bool)
        return np.where(ok, t, np.inf), (comp**2).sum(axis=1), ok

    def estimate_plan(self, plan: Plan) -> float:
        return float(self.estimate([Layout.of(plan)]).time_s[0])
