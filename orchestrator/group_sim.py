"""The simulator's group-level mode: one timeline per device group instead of one per device.

A plan's stage replicas run the same compute order (the generator's order for their group), so
when a group's replicas are alike, one representative timeline per group gives the simulator's
result. :func:`simulate_groups` interprets the generators' orders with the simulator's cost terms
(compute at the slowest replica's speed divided over the replicas, one FIFO message chain per
directed group pair at its slowest replica pair, the ring all-reduce after a stage's last
backward, static + stashed memory), so its cost grows with stages × units, not with devices: a
1024-GPU plan costs what its 8-group pipeline costs. Large clusters are planned with it
(:mod:`orchestrator.planners.hierarchy`), and ``auto`` ranks candidates with it.

It is *exact* (equal to :func:`orchestrator.simulator.simulate`) when every group's devices have
one speed and every receiving replica's slowest incoming message is the boundary's slowest
(``GroupSim.exact``); otherwise it is an upper bound, because every device then waits at least as
long as in the full simulation. :func:`plan_lower_bound` is a true lower bound for any plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from orchestrator.cluster import Cluster
from orchestrator.plan import Plan, Stage
from orchestrator.profile import Profile
from orchestrator.schedule.generators import GENERATORS
from orchestrator.schedule.ir import Kind, overlap, row_share, unit_fraction, units_of
from orchestrator.simulator import SimOptions

INF = float("inf")


@lru_cache(maxsize=4096)
def row_shares(ra: int, rb: int) -> np.ndarray:
    """[ra, rb] fraction of a micro-batch's rows replica a of one stage hands replica b of the next."""
    out = np.array([[overlap(row_share(i, ra), row_share(j, rb)) for j in range(rb)] for i in range(ra)])
    out[out <= 1e-12] = 0.0
    out.flags.writeable = False
    return out


def pair_costs(cluster: Cluster, src: Sequence[int], dst: Sequence[int]) -> np.ndarray:
    """[len(src), len(dst)] seconds per boundary byte of each replica pair (0 where rows do not overlap)."""
    links = cluster.effective[np.ix_(list(src), list(dst))]
    return row_shares(len(src), len(dst)) / links


def all_reduce_time(cluster: Cluster, group: Sequence[int], param_bytes: float) -> float:
    """Ring all-reduce of a stage's gradients over its replicas (the simulator's term)."""
    k = len(group)
    if k < 2:
        return 0.0
    return 2.0 * (k - 1) / k * param_bytes / cluster.ring_bandwidth(group)


@dataclass(frozen=True)
class GroupSim:
    iteration_s: float  # inf when the orders deadlock
    peak_bytes: tuple[float, ...]  # per device group: static state + peak stash of one replica
    fits: bool  # every group's peak within its smallest device memory
    exact: bool  # equal to the full simulation (see the module docstring)


def _uniform(costs: np.ndarray) -> bool:
    """Every receiver (column) waits for a message as slow as the boundary's slowest pair."""
    top = float(costs.max())
    return bool(np.all(costs.max(axis=0) >= top * (1 - 1e-12)))


def simulate_groups(plan: Plan, profile: Profile, cluster: Cluster, options: SimOptions | None = None) -> GroupSim:
    """One iteration of ``plan`` with one timeline per device group (see the module docstring)."""
    options = options or SimOptions()
    units = units_of(plan)
    orders = GENERATORS[plan.schedule](plan, units)
    groups = plan.device_groups
    p = len(groups)
    stages = plan.stages
    S = len(stages)
    speeds = cluster.speeds
    exact = not options.slowdown and options.step_s_per_param_byte == 0.0
    slow = []
    for devs in groups:
        sp = speeds[list(devs)]
        slow.append(float(sp.min()))
        exact = exact and float(sp.max()) == slow[-1]
    fw = [profile.forward_time(s.first, s.last) / slow[j % p] / s.replicas for j, s in enumerate(stages)]
    bw = [profile.backward_time(s.first, s.last) / slow[j % p] / s.replicas for j, s in enumerate(stages)]
    out_bytes = [profile.boundary_bytes(s.last) for s in stages]
    in_bytes = [profile.boundary_bytes(s.first) for s in stages]
    lat = cluster.latency_s
    spb: dict[tuple[int, int], float] = {}
    for j in range(S - 1):
        ga, gb = j % p, (j + 1) % p
        for src_g, dst_g in ((ga, gb), (gb, ga)):
            if (src_g, dst_g) not in spb and src_g != dst_g:
                c = pair_costs(cluster, groups[src_g], groups[dst_g])
                spb[(src_g, dst_g)] = float(c.max())
                exact = exact and _uniform(c)
    frac = {u: unit_fraction(u[1]) for u in units}
    last_backward: list[dict[int, int]] = []
    for order in orders:
        lb: dict[int, int] = {}
        for pos, act in enumerate(order):
            if act.kind is Kind.BACKWARD:
                lb[act.stage] = pos
        last_backward.append(lb)
    ar = [all_reduce_time(cluster, s.devices, profile.param_bytes(s.first, s.last)) for s in stages]

    arr_f: dict[tuple[int, tuple[int, int]], float] = {}
    arr_b: dict[tuple[int, tuple[int, int]], float] = {}
    link: dict[tuple[int, int], float] = {}
    pc = [0] * p
    clock = [0.0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for g in range(p):
            order = orders[g]
            k = pc[g]
            t = clock[g]
            while k < len(order):
                act = order[k]
                j = act.stage
                u = (act.microbatch, act.part)
                fr = frac[u]
                if act.kind is Kind.FORWARD:
                    if j > 0:
                        got = arr_f.get((j, u))
                        if got is None:
                            break
                        t = max(t, got)
                    t += fw[j] * fr
                    if j + 1 < S:
                        dst = (j + 1) % p
                        if dst == g:
                            arr_f[(j + 1, u)] = t
                        else:
                            st = max(t, link.get((g, dst), 0.0))
                            link[(g, dst)] = st + lat + out_bytes[j] * fr * spb[(g, dst)]
                            arr_f[(j + 1, u)] = link[(g, dst)]
                else:
                    if j + 1 < S:
                        got = arr_b.get((j, u))
                        if got is None:
                            break
                        t = max(t, got)
                    t += bw[j] * fr
                    if j > 0:
                        dst = (j - 1) % p
                        if dst == g:
                            arr_b[(j - 1, u)] = t
                        else:
                            st = max(t, link.get((g, dst), 0.0))
                            link[(g, dst)] = st + lat + in_bytes[j] * fr * spb[(g, dst)]
                            arr_b[(j - 1, u)] = link[(g, dst)]
                    if last_backward[g].get(j) == k:
                        t += ar[j]
                k += 1
            if k != pc[g]:
                remaining -= k - pc[g]
                pc[g], clock[g] = k, t
                progressed = True
        if not progressed:
            return GroupSim(INF, (), False, False)
    peaks = []
    fits = True
    for g, order in enumerate(orders):
        static = sum(profile.param_bytes(stages[j].first, stages[j].last) for j in range(g, S, p)) * options.state_factor
        stash = peak = 0.0
        for act in order:
            s = stages[act.stage]
            delta = profile.stash_bytes(s.first, s.last) * unit_fraction(act.part) / s.replicas
            stash += delta if act.kind is Kind.FORWARD else -delta
            peak = max(peak, stash)
        peaks.append(static + peak)
        if static + peak > float(cluster.memories[list(groups[g])].min()):
            fits = False
    return GroupSim(max(clock), tuple(peaks), fits, exact)


class BoundTerms:
    """The parts of :func:`plan_lower_bound` that depend only on the stages (cuts and devices), so
    the bound of every schedule and slicing variant of one structure costs a few operations.

    ``head[j]``: no replica of stage j starts a forward before one unit went forward through
    stages 0..j−1, each boundary costing at least its cheapest receiver's slowest message;
    ``tail[j]``: after a backward on stage j the backwards of j−1..0 (and their messages) remain.
    Then, per device group g: ``head[g]`` + all of its compute at its fastest speed + the larger of
    ``tail[g]`` and its all-reduces (its last compute is a backward; all-reduces run on it). Per
    boundary and direction: the first message leaves after ``head[j]`` + one forward, the link of
    the slowest replica pair carries every unit's message in turn, and the last one still has a
    forward and backward after it and the backward chain to stage 0. The cost grows with groups
    and replica pairs, never with units."""

    def __init__(self, stages: Sequence[Stage], profile: Profile, cluster: Cluster) -> None:
        S = len(stages)
        groups: list[tuple[int, ...]] = []
        for st in stages:
            if st.devices in groups:
                break
            groups.append(st.devices)
        p = len(groups)
        speeds = cluster.speeds
        lat = cluster.latency_s
        fast = [float(speeds[list(devs)].max()) for devs in groups]
        self.f = [profile.forward_time(s.first, s.last) / fast[j % p] / s.replicas for j, s in enumerate(stages)]
        self.b = [profile.backward_time(s.first, s.last) / fast[j % p] / s.replicas for j, s in enumerate(stages)]
        out_bytes = [profile.boundary_bytes(s.last) for s in stages]
        # per boundary and direction: (bytes × slowest receiver-side cost, bytes × cheapest receiver's slowest)
        self.msg_first: list[tuple[float, float]] = []  # (forward, backward) first-message byte-seconds
        self.msg_link: list[tuple[float, float]] = []  # (forward, backward) slowest pair byte-seconds (-1: none)
        self.has_msg: list[tuple[bool, bool]] = []
        for j in range(S - 1):
            src, dst = stages[j].devices, stages[j + 1].devices
            firsts, links, has = [], [], []
            for c, axis in ((pair_costs(cluster, src, dst), 0), (pair_costs(cluster, dst, src), 0)):
                nz = c > 0
                per_recv = np.where(nz, c, 0.0).max(axis=axis)
                msg_recv = np.where(nz.any(axis=axis), per_recv, -1.0)  # -1: this receiver needs no message
                firsts.append(float(msg_recv.min()) * out_bytes[j])
                links.append(float(c[nz].max(initial=0.0)) * out_bytes[j])
                has.append(bool(nz.any()))
            self.msg_first.append((firsts[0], firsts[1]))
            self.msg_link.append((links[0], links[1]))
            self.has_msg.append((has[0], has[1]))
        self.lat = lat
        ar = [all_reduce_time(cluster, s.devices, profile.param_bytes(s.first, s.last)) for s in stages]
        self.groups: list[tuple[int, float, float, float]] = []  # (group, compute per unit, speed, all-reduces)
        for k in range(p):
            work = sum(profile.compute_time(stages[j].first, stages[j].last) / stages[j].replicas for j in range(k, S, p))
            self.groups.append((k, work, fast[k], sum(ar[j] for j in range(k, S, p))))
        self.S = S

    def bound(self, total: float, fmin: float, n_units: int) -> float:
        """Lower bound for ``n_units`` units of ``total`` micro-batches, the smallest ``fmin``."""
        S, lat = self.S, self.lat
        f, b = self.f, self.b

        def first(j: int, k: int) -> float:
            v = self.msg_first[j][k]
            return 0.0 if v < 0 else lat + v * fmin  # a receiver that needs no message (same device) waits 0

        head = [0.0] * S
        for j in range(S - 1):
            head[j + 1] = head[j] + f[j] * fmin + first(j, 0)
        tail = [0.0] * S
        for j in range(1, S):
            tail[j] = tail[j - 1] + b[j - 1] * fmin + first(j - 1, 1)
        best = 0.0
        for g, work, speed, ar in self.groups:
            best = max(best, head[g] + work * total / speed + max(ar, tail[g]))
        for j in range(S - 1):
            fb_next = (f[j + 1] + b[j + 1]) * fmin
            if self.has_msg[j][0]:
                link = n_units * lat + self.msg_link[j][0] * total
                best = max(best, head[j] + f[j] * fmin + link + fb_next + tail[j + 1])
            if self.has_msg[j][1]:
                link = n_units * lat + self.msg_link[j][1] * total
                best = max(best, head[j + 1] + fb_next + link + b[j] * fmin + tail[j])
        return best * (1 - 1e-9)


def plan_lower_bound(plan: Plan, profile: Profile, cluster: Cluster) -> float:
    """A lower bound on ``simulate(plan).iteration_s`` (any schedule kind, any plan)."""
    units = units_of(plan)
    fmin = min(unit_fraction(part) for _, part in units)
    total = sum(unit_fraction(part) for _, part in units)
    return BoundTerms(plan.stages, profile, cluster).bound(total, fmin, len(units))
