"""The simulator's group-level mode: one timeline per device group instead of one per device.

A plan's stage replicas run the same compute order (the generator's order for their group), so
when a group's replicas are alike, one representative timeline per group gives the simulator's
result. :func:`simulate_groups` interprets the generators' orders with the simulator's cost terms
(compute at the slowest replica's speed divided over the replicas, one FIFO message chain per
directed group pair at its slowest replica pair, a split backward's ``BI`` and ``W`` apart, the
ring all-reduce after a stage's last weight gradients, static + stashed memory), so its cost grows with stages × units, not with devices: a
1024-GPU plan costs what its 8-group pipeline costs. Large clusters are planned with it
(:mod:`orchestrator.planners.hierarchy`), ``auto`` ranks candidates with it, SPP's list
scheduling (PE) is this mode, and AutoPipe walks its critical path in its trace. Every duration
and byte count is a term of :mod:`orchestrator.costmodel.terms`.

It is *exact* (equal to :func:`orchestrator.costmodel.simulator.simulate`) when every group's devices have
one speed and every receiving replica's slowest incoming message is the boundary's slowest
(``GroupSim.exact``); otherwise it is an upper bound, because every device then waits at least as
long as in the full simulation. :func:`plan_lower_bound` is a true lower bound for any plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.terms import compute_time, fits_memory, group_all_reduce, pair_stats, stash_bytes, static_bytes, transfer_time
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.core.profile import Profile
from orchestrator.schedule.generators import GENERATORS
from orchestrator.schedule.ir import Action, Kind, unit_fraction, units_of
from orchestrator.costmodel.simulator import SimOptions, SimResult, backward_parts, stash_sign

INF = float("inf")


Traced = tuple[Action, float, float, bool]
"""A compute action's (action, start, end, waited): ``waited`` when its input's arrival, not its
group's previous action, bounded its start (what a critical path walks back along)."""


@dataclass(frozen=True)
class GroupSim:
    iteration_s: float  # inf when the orders deadlock
    peak_bytes: tuple[float, ...]  # per device group: static state + peak stash of one replica
    fits: bool  # every group's peak within its smallest device memory
    exact: bool  # equal to the full simulation (see the module docstring)
    busy_s: tuple[float, ...] = ()  # per device group: compute + all-reduce seconds of one replica
    static_bytes: tuple[float, ...] = ()  # per device group
    trace: tuple[tuple[Traced, ...], ...] = ()  # per device group, with ``trace=True``

    def as_sim_result(self, plan: Plan) -> SimResult:
        """The per-device result the full simulator would give (no events: a large plan's trace
        would be as large as its cluster). Only meaningful when ``exact`` and simulated with ``memory``."""
        busy, stash, static = {}, {}, {}
        for g, devs in enumerate(plan.device_groups):
            for d in devs:
                busy[d] = self.busy_s[g]
                static[d] = self.static_bytes[g]
                stash[d] = self.peak_bytes[g] - self.static_bytes[g]
        return SimResult(self.iteration_s, busy, stash, static, (), ())


Op = tuple[int, int, int, int, bool]
"""A compute action compiled for the interpreter: (kind code, stage, unit index, half, whether it
is its stage's last weight-gradient pass on the group — the all-reduce follows it)."""
_CODE = {Kind.FORWARD: 0, Kind.BACKWARD: 1, Kind.BACKWARD_INPUT: 2, Kind.BACKWARD_WEIGHT: 3}
_WEIGHT_KINDS = frozenset(kind for kind in Kind if kind.grads_weights)
_Shape = tuple[list[list[Action]], list[tuple[Op, ...]], list[np.ndarray]]
_ORDERS: dict[tuple[object, ...], _Shape] = {}


_HOLD = np.array([float(stash_sign(kind)) for kind in sorted(_CODE, key=_CODE.__getitem__)])
""":func:`~orchestrator.costmodel.simulator.stash_sign` by :data:`Op` code."""


def _stash_rows(ops: tuple[Op, ...], p: int) -> np.ndarray:
    """[K, v]: the units (halves count 0.5) each of a group's ``v`` stages holds at every point of
    its order where its stash can peak — the start, before each release, and the end. With the
    stages' bytes per unit ``b`` (never negative) the peak stash is ``max(rows @ b)``: the walk over
    the actions, done once per schedule shape."""
    if not ops:
        return np.zeros((1, 1))
    arr = np.array(ops, dtype=np.int64)
    code, local, half = arr[:, 0], arr[:, 1] // p, arr[:, 3]
    step = _HOLD[code] * np.where(half != 0, 0.5, 1.0)
    held = np.zeros((len(ops) + 1, int(local.max()) + 1))
    held[np.arange(1, len(ops) + 1), local] = step
    np.cumsum(held, axis=0, out=held)  # row k: what the first k actions hold
    if held.shape[1] == 1:  # one stage per group: its peak count is the row
        return held.max(axis=0, keepdims=True)
    return held[np.append(0, np.flatnonzero(np.append(step < 0, True)))]  # the start, before each release, the end


def _orders(kind: ScheduleKind, p: int, v: int, M: int, sliced: int, plan: Plan) -> _Shape:
    """The generator's compute orders, the same compiled to :data:`Op` tuples, and each group's
    stash rows (:func:`_stash_rows`); they depend only on the schedule's shape, so candidates of one
    shape share them."""
    key = (kind, p, v, M, sliced)
    got = _ORDERS.get(key)
    if got is None:
        units = units_of(plan)
        index = {u: i for i, u in enumerate(units)}
        orders = GENERATORS[kind](plan, units)
        compiled: list[tuple[Op, ...]] = []
        code, weights = _CODE, _WEIGHT_KINDS
        for order in orders:
            last = {act.stage: pos for pos, act in enumerate(order) if act.kind in weights}
            compiled.append(tuple([(code[a.kind], a.stage, index[a.microbatch, a.part], 1 if a.part else 0, last[a.stage] == pos)
                                   for pos, a in enumerate(order)]))
        if len(_ORDERS) > 256:
            _ORDERS.clear()
        got = _ORDERS[key] = (orders, compiled, [_stash_rows(c, p) for c in compiled])
    return got


@dataclass(frozen=True)
class GroupMemory:
    peak_bytes: tuple[float, ...]  # per device group: static state + peak stash of one replica
    static_bytes: tuple[float, ...]
    fits: bool  # every group's peak within its smallest device memory


def group_memory(plan: Plan, profile: Profile, cluster: Cluster, options: SimOptions | None = None) -> GroupMemory:
    """Each device group's peak memory under ``plan`` (the simulator's accounting: static state,
    and the stash of the units its schedule holds at once), without timing anything: what a search
    checks before it pays for a timing (issue 42: most candidates of a memory-bound instance do
    not fit)."""
    options = options or SimOptions()
    rows = _orders(plan.schedule, plan.num_physical_stages, plan.virtual_chunks, plan.num_microbatches, plan.sliced_microbatches, plan)[2]
    groups, stages = plan.device_groups, plan.stages
    p, S = len(groups), len(stages)
    memories = cluster.memories
    peaks, statics = [], []
    fits = True
    for g in range(p):
        mine = range(g, S, p)
        static = static_bytes(sum(profile.param_bytes(stages[j].first, stages[j].last) for j in mine), options.state_factor)
        per_unit = np.array([stash_bytes(profile.stage_stash_bytes(stages[j].first, stages[j].last, stages[j].recompute), 1.0, len(stages[j].devices)) for j in mine])
        peak = static + max(0.0, float((rows[g] @ per_unit).max()))
        peaks.append(peak)
        statics.append(static)
        if not fits_memory(peak, float(memories[list(groups[g])].min())):
            fits = False
    return GroupMemory(tuple(peaks), tuple(statics), fits)


def simulate_groups(plan: Plan, profile: Profile, cluster: Cluster, options: SimOptions | None = None, lower: bool = False,
                    trace: bool = False, memory: bool = True) -> GroupSim:
    """One iteration of ``plan`` with one timeline per device group (see the module docstring);
    ``trace`` records every compute action's interval (:data:`Traced`). ``memory=False`` leaves out the
    peak-memory walk (no peaks; ``fits`` True unless the orders deadlock): what a caller that only bounds
    the time needs, a third of the cost.

    ``lower=True`` gives a lower bound instead: each group at its fastest replica's speed, each
    boundary at its cheapest receiver's slowest message. The simulator is a max-plus system over
    fixed per-device and per-link orders, monotone in every duration, and every replica's own
    durations are at least these, so no event of the full simulation is earlier."""
    options = options or SimOptions()
    units = units_of(plan)
    orders, ops, _ = _orders(plan.schedule, plan.num_physical_stages, plan.virtual_chunks, plan.num_microbatches, plan.sliced_microbatches, plan)
    groups = plan.device_groups
    p = len(groups)
    stages = plan.stages
    S = len(stages)
    speeds = cluster.speeds
    exact = True
    speed, slowest = [], []
    for devs in groups:
        if options.slowdown:
            sp = [float(speeds[d]) / options.slowdown.get(d, 1.0) for d in devs]
            lo, hi = min(sp), max(sp)
        else:  # numpy's min and max of a 1024-device group: the same floats, 50× cheaper than a list
            arr = speeds[list(devs)]
            lo, hi = float(arr.min()), float(arr.max())
        speed.append(hi if lower else lo)
        slowest.append(lo)
        exact = exact and hi == lo
    fw = [compute_time(profile.forward_time(s.first, s.last), speed[j % p], s.replicas) for j, s in enumerate(stages)]
    bw = [compute_time(profile.stage_backward_time(s.first, s.last, s.recompute), speed[j % p], s.replicas) for j, s in enumerate(stages)]
    split = [backward_parts(profile, j, s.first, s.last, s.recompute) for j, s in enumerate(stages)]
    bi = [compute_time(split[j][0], speed[j % p], s.replicas) for j, s in enumerate(stages)]
    ww = [compute_time(split[j][1], speed[j % p], s.replicas) for j, s in enumerate(stages)]
    out_bytes = [profile.boundary_bytes(s.last) for s in stages]
    in_bytes = [profile.boundary_bytes(s.first) for s in stages]
    spb: dict[tuple[int, int], float] = {}
    latp: dict[tuple[int, int], float] = {}
    for j in range(S - 1):
        ga, gb = j % p, (j + 1) % p
        for src_g, dst_g in ((ga, gb), (gb, ga)):
            if (src_g, dst_g) not in spb and src_g != dst_g:
                stats = pair_stats(cluster, groups[src_g], groups[dst_g])
                exact = exact and stats.uniform
                if not lower:
                    spb[(src_g, dst_g)], latp[(src_g, dst_g)] = stats.top, cluster.latency_s
                elif stats.first < 0:  # some receiver gets its rows on its own device: no wait at all
                    spb[(src_g, dst_g)], latp[(src_g, dst_g)] = 0.0, 0.0
                else:
                    spb[(src_g, dst_g)], latp[(src_g, dst_g)] = stats.first, cluster.latency_s
    fracs = (1.0, 0.5)  # a whole unit, a sliced half (unit_fraction)
    # each message's time per (half, stage): forward to stage j+1, backward to j−1
    msg_f = [[0.0] * S for _ in fracs]
    msg_b = [[0.0] * S for _ in fracs]
    for h, fr in enumerate(fracs):
        for j in range(S):
            g = j % p
            if j + 1 < S and (j + 1) % p != g:
                pair = (g, (j + 1) % p)
                msg_f[h][j] = transfer_time(out_bytes[j] * fr, spb[pair], latp[pair])
            if j > 0 and (j - 1) % p != g:
                pair = (g, (j - 1) % p)
                msg_b[h][j] = transfer_time(in_bytes[j] * fr, spb[pair], latp[pair])
    ar = [group_all_reduce(cluster, s.devices, profile.param_bytes(s.first, s.last)) for s in stages]
    comp = (fw, bw, bi, ww)  # by kind code
    dst_f = [(j + 1) % p if j + 1 < S else -1 for j in range(S)]
    dst_b = [(j - 1) % p if j > 0 else -1 for j in range(S)]

    U = len(units)
    arr_f = [[-1.0] * U for _ in range(S)]  # when unit u's input reaches stage j (-1: not sent yet)
    arr_b = [[-1.0] * U for _ in range(S)]  # when its output gradient does
    link = [[0.0] * p for _ in range(p)]  # when the message chain from group a to group b is free
    pc = [0] * p
    clock = [0.0] * p
    busy = [0.0] * p
    rec: list[list[Traced]] | None = [[] for _ in range(p)] if trace else None
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for g in range(p):
            order = ops[g]
            k = pc[g]
            t = clock[g]
            n = len(order)
            free_g = link[g]
            while k < n:
                code, j, u, half, last = order[k]
                t0 = t
                if code == 0:  # forward: waits for its input, sends its output
                    if j > 0:
                        got = arr_f[j][u]
                        if got < 0:
                            break
                        if got > t:
                            t = got
                    start = t
                    d = fw[j] * fracs[half]
                    t += d
                    busy[g] += d
                    dst = dst_f[j]
                    if dst == g:
                        arr_f[j + 1][u] = t
                    elif dst >= 0:
                        free = free_g[dst]
                        free_g[dst] = (t if t > free else free) + msg_f[half][j]
                        arr_f[j + 1][u] = free_g[dst]
                elif code == 3:  # weight gradients: nobody waits for them
                    start = t
                    d = ww[j] * fracs[half]
                    t += d
                    busy[g] += d
                else:  # backward or its input-gradient half: waits for the gradient, sends one back
                    if j + 1 < S:
                        got = arr_b[j][u]
                        if got < 0:
                            break
                        if got > t:
                            t = got
                    start = t
                    d = comp[code][j] * fracs[half]
                    t += d
                    busy[g] += d
                    dst = dst_b[j]
                    if dst == g:
                        arr_b[j - 1][u] = t
                    elif dst >= 0:
                        free = free_g[dst]
                        free_g[dst] = (t if t > free else free) + msg_b[half][j]
                        arr_b[j - 1][u] = free_g[dst]
                if rec is not None:
                    rec[g].append((orders[g][k], start, t, start > t0))
                if last:  # the stage's last weight gradients: its all-reduce runs on the group
                    t += ar[j]
                    busy[g] += ar[j]
                k += 1
            if k != pc[g]:
                remaining -= k - pc[g]
                pc[g], clock[g] = k, t
                progressed = True
        if not progressed:
            return GroupSim(INF, (), False, False)
    if lower and not exact:
        # The slowest replica of each group runs its own order at its own speed, and its messages
        # arrive no earlier than in the pass above (which bounds every sender's replicas): a
        # tighter bound on that replica, hence on the iteration.
        for g in range(p):
            t = 0.0
            for code, j, u, half, last in ops[g]:
                if code == 0 and j > 0:
                    t = max(t, arr_f[j][u])
                elif code in (1, 2) and j + 1 < S:
                    t = max(t, arr_b[j][u])
                t += comp[code][j] * fracs[half] * speed[g] / slowest[g]
                if last:
                    t += ar[j]
            clock[g] = max(clock[g], t)
    step = options.step_s_per_param_byte
    if step:  # every device ends with its stages' optimizer steps
        for g in range(p):
            extra = sum(step * profile.param_bytes(stages[j].first, stages[j].last) for j in range(g, S, p))
            clock[g] += extra
            busy[g] += extra
    traced = tuple(tuple(r) for r in rec) if rec is not None else ()
    if not memory:
        return GroupSim(max(clock), (), True, exact, tuple(busy), (), traced)
    mem = group_memory(plan, profile, cluster, options)
    return GroupSim(max(clock), mem.peak_bytes, mem.fits, exact, tuple(busy), mem.static_bytes, traced)


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
        self.f = [compute_time(profile.forward_time(s.first, s.last), fast[j % p], s.replicas) for j, s in enumerate(stages)]
        self.b = [compute_time(profile.stage_backward_time(s.first, s.last, s.recompute), fast[j % p], s.replicas) for j, s in enumerate(stages)]
        # a split backward's input-gradient part (what the chain back to stage 0 waits for)
        self.bi = [compute_time(backward_parts(profile, j, s.first, s.last, s.recompute)[0], fast[j % p], s.replicas) for j, s in enumerate(stages)]
        out_bytes = [profile.boundary_bytes(s.last) for s in stages]
        # per boundary and direction: (bytes × slowest receiver-side cost, bytes × cheapest receiver's slowest)
        self.msg_first: list[tuple[float, float]] = []  # (forward, backward) first-message byte-seconds
        self.msg_link: list[tuple[float, float]] = []  # (forward, backward) slowest pair byte-seconds (-1: none)
        self.has_msg: list[tuple[bool, bool]] = []
        for j in range(S - 1):
            src, dst = stages[j].devices, stages[j + 1].devices
            fw_st, bw_st = pair_stats(cluster, src, dst), pair_stats(cluster, dst, src)
            nbytes = out_bytes[j]
            self.msg_first.append((first_message(cluster, src, dst, nbytes), first_message(cluster, dst, src, nbytes)))
            self.msg_link.append((fw_st.top * nbytes, bw_st.top * nbytes))
            self.has_msg.append((fw_st.top > 0, bw_st.top > 0))
        self.lat = lat
        ar = [group_all_reduce(cluster, s.devices, profile.param_bytes(s.first, s.last)) for s in stages]
        self.groups: list[tuple[int, float, float, float]] = []  # (group, compute per unit, speed, all-reduces)
        for k in range(p):
            work = sum(profile.compute_time(stages[j].first, stages[j].last) / stages[j].replicas for j in range(k, S, p))
            self.groups.append((k, work, fast[k], sum(ar[j] for j in range(k, S, p))))
        self.S = S

    def bound(self, total: float, fmin: float, n_units: int, split: bool = False) -> float:
        """Lower bound for ``n_units`` units of ``total`` micro-batches, the smallest ``fmin``.

        ``split``: the schedule splits backwards (zero bubble). Then only input gradients chain
        back to stage 0 (its own backward is all weight gradient, run whole after its ``BI``),
        and a device's last action may be a deferred ``W`` that nothing waits for, so its
        term ends with its all-reduce rather than with the chain."""
        S, lat = self.S, self.lat
        f, b = self.f, self.b
        chain = [b[0]] + self.bi[1:] if split else b

        def first(j: int, k: int) -> float:
            return first_wait(self.msg_first[j][k], lat, fmin)

        head = [0.0] * S
        for j in range(S - 1):
            head[j + 1] = head[j] + f[j] * fmin + first(j, 0)
        tail = [0.0] * S
        for j in range(1, S):
            tail[j] = tail[j - 1] + chain[j - 1] * fmin + first(j - 1, 1)
        best = 0.0
        for g, work, speed, ar in self.groups:
            best = max(best, head[g] + compute_time(work * total, speed) + (ar if split else max(ar, tail[g])))
        for j in range(S - 1):
            fb_next = (f[j + 1] + chain[j + 1]) * fmin
            if self.has_msg[j][0]:
                link = n_units * lat + self.msg_link[j][0] * total
                best = max(best, head[j] + f[j] * fmin + link + fb_next + tail[j + 1])
            if self.has_msg[j][1]:
                link = n_units * lat + self.msg_link[j][1] * total
                after = max(b[j] * fmin, chain[j] * fmin + tail[j]) if split else b[j] * fmin + tail[j]
                best = max(best, head[j + 1] + fb_next + link + after)
        return best * (1 - 1e-9)


def plan_lower_bound(plan: Plan, profile: Profile, cluster: Cluster) -> float:
    """A lower bound on ``simulate(plan).iteration_s`` (any schedule kind, any plan)."""
    units = units_of(plan)
    fmin = min(unit_fraction(part) for _, part in units)
    total = sum(unit_fraction(part) for _, part in units)
    return BoundTerms(plan.stages, profile, cluster).bound(total, fmin, len(units), plan.schedule is ScheduleKind.ZB_H1)


class FirstUnitPath:
    """How long the first unit takes to reach a stage, for bounding *partial* structures (the walk's
    ``head``, :func:`orchestrator.planners.exhaustive.structures`): :class:`BoundTerms`' ``head`` built
    one stage at a time. No replica of a stage starts before one unit went forward through every stage
    before it, each boundary costing at least its cheapest receiver's slowest message, so a device group
    is busy from its first stage's head on; its work bound added to that is a lower bound of every
    schedule and slicing variant. ``fmin``: the smallest unit (half a micro-batch: every variant's
    slicing is allowed)."""

    def __init__(self, profile: Profile, cluster: Cluster, fmin: float = 0.5) -> None:
        self.profile, self.cluster, self.fmin = profile, cluster, fmin
        self.speeds = cluster.speeds
        self._forward: dict[tuple[int, int, tuple[int, ...]], float] = {}
        self._message: dict[tuple[int, tuple[int, ...], tuple[int, ...]], float] = {}

    def forward(self, first: int, last: int, devices: tuple[int, ...]) -> float:
        """The smallest unit's forward through blocks ``[first, last)`` at the group's fastest speed."""
        key = (first, last, devices)
        got = self._forward.get(key)
        if got is None:
            fast = float(self.speeds[list(devices)].max())
            got = self._forward[key] = compute_time(self.profile.forward_time(first, last), fast, len(devices)) * self.fmin
        return got

    def message(self, boundary: int, src: tuple[int, ...], dst: tuple[int, ...]) -> float:
        """The first unit's message across the cut before block ``boundary`` from ``src`` to ``dst`` (0 when a
        receiver shares a device with a sender)."""
        key = (boundary, src, dst)
        got = self._message.get(key)
        if got is None:
            cost = first_message(self.cluster, src, dst, self.profile.boundary_bytes(boundary))
            got = self._message[key] = first_wait(cost, self.cluster.latency_s, self.fmin)
        return got


def first_message(cluster: Cluster, src: tuple[int, ...], dst: tuple[int, ...], nbytes: float) -> float:
    """A whole unit's message from ``src`` to ``dst`` at its cheapest receiver's slowest pair, in byte-seconds
    (no latency); -1 when some receiver shares a device with a sender and so waits for nothing."""
    first = pair_stats(cluster, src, dst).first
    return first * nbytes if first > 0 else -1.0


def first_wait(cost: float, latency_s: float, fraction: float) -> float:
    """How long the first unit (``fraction`` of a micro-batch) waits for a message of :func:`first_message`'s ``cost``."""
    return 0.0 if cost < 0 else latency_s + cost * fraction


def work_bound(stages: Sequence[Stage], profile: Profile, cluster: Cluster, total: float) -> float:
    """The cheapest true lower bound of every schedule and slicing variant of ``stages``: per
    device group, the busy time of its slowest replica (every replica computes an equal share of
    the rows at its own speed) for ``total`` micro-batches plus its all-reduces (no messages, so
    no pair costs: a few operations per group)."""
    speeds = cluster.speeds
    per_group: dict[tuple[int, ...], float] = {}
    for s in stages:
        per_group[s.devices] = per_group.get(s.devices, 0.0) + stage_work(profile, cluster, speeds, s.first, s.last, s.devices, total)
    return max(per_group.values()) * (1 - 1e-9)


def stage_work(profile: Profile, cluster: Cluster, speeds: np.ndarray, first: int, last: int, devices: tuple[int, ...], total: float) -> float:
    """One stage's share of :func:`work_bound`: blocks [first, last) for ``total`` micro-batches at the
    slowest of ``devices`` (``speeds``: ``cluster.speeds``, passed in because it is built per call),
    rows split evenly over them, plus their all-reduce of the stage's gradients."""
    return (compute_time(profile.compute_time(first, last) * total, float(speeds[list(devices)].min()), len(devices))
            + group_all_reduce(cluster, devices, profile.param_bytes(first, last)))
