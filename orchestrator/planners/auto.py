"""``auto``: run every applicable planner and keep the plan the simulator scores fastest.

Every registered literature and baseline planner (``even``, ``params``, ``pipedream``, ``spp``,
``dapple``, ``autopipe``, ``2bw``) is run on the same input; the fastest plan that fits device
memory wins and is labelled ``auto:<planner>`` (``auto:<planner>+v<k>`` when an interleaved variant
of it won). Planners that return the same plan share one evaluation.

Scoring without simulating everything (the simulator costs 40–300 ms per plan at 32 GPUs, more
than most planners):

* :func:`replay` — a group-level list-scheduling replay of the plan's schedule (the generator's
  compute order per device group, FIFO transfers per directed group pair, each stage's all-reduce
  after its last backward, the simulator's memory accounting). It is exact for the cost model when
  a stage's replicas are alike (it generalizes SPP's PE, :func:`spp.list_schedule`, to interleaved
  plans) and costs a few milliseconds; it only *orders* candidates.
* :func:`time_lower_bound` — a true lower bound on the simulated time of any plan: on every
  device, the first micro-batch's forward through the stages before it, then all of its own work,
  then the last backward back to the first stage (or its all-reduces).

The planners' plans are simulated in replay order, and a plan is skipped only when its lower
bound cannot beat the best simulated time so far — so ``auto`` is never worse than any single
planner (each one's plan is either simulated or provably slower). Interleaving (Megatron's
virtual chunks, :mod:`interleaving`) is offered to the ``TOP_INTERLEAVE`` leaders: every chunk
count is replayed and only the ``INTERLEAVE_SIMS`` most promising variants that the replay says
can win are simulated (a heuristic: an interleaved variant the replay misranks can be missed).

``options.extra["auto_planners"]`` (a list of names) restricts the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from orchestrator.cluster import Cluster
from orchestrator.errors import UserError
from orchestrator.plan import Plan
from orchestrator.planners.base import REGISTRY, PlannerOptions, PlannerSpec, get_planner, register
from orchestrator.planners.interleaving import candidate_chunks, interleaved_plan
from orchestrator.planners.spp import _shares, seconds_per_byte
from orchestrator.profile import Profile
from orchestrator.schedule.generators import GENERATORS
from orchestrator.schedule.ir import Kind, unit_fraction, units_of
from orchestrator.simulator import memory_error, simulate

TOP_INTERLEAVE = 3
CANDIDATES = ("even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw")
INF = float("inf")

PlanKey = tuple[object, ...]


def plan_key(plan: Plan) -> PlanKey:
    return (plan.stages, plan.num_microbatches, plan.schedule, plan.sliced_microbatches)


def _stage_terms(plan: Plan, profile: Profile, cluster: Cluster) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per stage: forward/backward seconds per whole unit at the slowest and at the fastest replica."""
    speeds = cluster.speeds
    f_slow, b_slow, f_fast, b_fast = [], [], [], []
    for s in plan.stages:
        sp = speeds[list(s.devices)]
        r = s.replicas
        fw, bw = profile.forward_time(s.first, s.last), profile.backward_time(s.first, s.last)
        f_slow.append(fw / float(sp.min()) / r)
        b_slow.append(bw / float(sp.min()) / r)
        f_fast.append(fw / float(sp.max()) / r)
        b_fast.append(bw / float(sp.max()) / r)
    return f_slow, b_slow, f_fast, b_fast


def _all_reduce(plan: Plan, profile: Profile, cluster: Cluster, j: int) -> float:
    group = plan.stages[j].devices
    k = len(group)
    if k < 2:
        return 0.0
    return 2.0 * (k - 1) / k * profile.param_bytes(plan.stages[j].first, plan.stages[j].last) / cluster.ring_bandwidth(group)


def time_lower_bound(plan: Plan, profile: Profile, cluster: Cluster) -> float:
    """A lower bound on ``simulate(plan).iteration_s`` (any schedule kind, any plan).

    ``head[j]``: no replica of stage j starts a forward before one unit went forward through
    stages 0..j−1, each boundary costing at least its cheapest receiver's slowest message;
    ``tail[j]``: after a backward on stage j the backwards of j−1..0 (and their messages) remain.
    Then, per device d with lowest stage j0: ``head[j0]`` + all of d's compute + the larger of
    ``tail[j0]`` and d's all-reduces (its last compute is a backward; all-reduces run on d). Per
    replica pair of a boundary: its first message leaves after ``head[j]`` + one forward, the link
    carries every unit's message in turn, and the last one still has a forward and backward after
    it and the backward chain to stage 0 (likewise for gradients)."""
    units = units_of(plan)
    fmin = min(unit_fraction(part) for _, part in units)
    total = sum(unit_fraction(part) for _, part in units)
    n_units = len(units)
    _, _, f_fast, b_fast = _stage_terms(plan, profile, cluster)
    lat = cluster.latency_s
    stages = plan.stages
    S = len(stages)
    eff = cluster.effective
    # pairs[j]: (sender replica device, receiver device, share) for the forward message j -> j+1
    pairs: list[list[tuple[int, int, float]]] = []
    for j in range(S - 1):
        src, dst = stages[j].devices, stages[j + 1].devices
        shares = _shares(len(src), len(dst))
        pairs.append([(a, b, float(shares[x, y])) for x, a in enumerate(src) for y, b in enumerate(dst) if shares[x, y] > 0])
    out_bytes = [profile.boundary_bytes(s.last) for s in stages]

    def first_msg(j: int, forward: bool) -> float:
        """Least time for the first message of boundary j (a receiver needs all its peers' rows)."""
        by_recv: dict[int, float] = {}
        for a, b, sh in pairs[j]:
            src, dst = (a, b) if forward else (b, a)
            t = 0.0 if src == dst else lat + out_bytes[j] * sh * fmin / float(eff[src, dst])  # same device: no message
            by_recv[dst] = max(by_recv.get(dst, 0.0), t)
        return min(by_recv.values())

    head = [0.0] * S
    for j in range(S - 1):
        head[j + 1] = head[j] + f_fast[j] * fmin + first_msg(j, True)
    tail = [0.0] * S
    for j in range(1, S):
        tail[j] = tail[j - 1] + b_fast[j - 1] * fmin + first_msg(j - 1, False)
    speeds = cluster.speeds
    best = 0.0
    for d in plan.devices:
        js = plan.stages_of_device(d)
        j0 = min(js)
        work = 0.0
        ar = 0.0
        for j in js:
            s = stages[j]
            work += profile.compute_time(s.first, s.last) * total / float(speeds[d]) / s.replicas
            ar += _all_reduce(plan, profile, cluster, j)
        best = max(best, head[j0] + work + max(ar, tail[j0]))
    for j in range(S - 1):
        fb_next = (f_fast[j + 1] + b_fast[j + 1]) * fmin
        for a, b, sh in pairs[j]:
            if a == b:
                continue
            fwd_link = n_units * lat + out_bytes[j] * sh * total / float(eff[a, b])
            best = max(best, head[j] + f_fast[j] * fmin + fwd_link + fb_next + tail[j + 1])
            bwd_link = n_units * lat + out_bytes[j] * sh * total / float(eff[b, a])
            best = max(best, head[j + 1] + fb_next + bwd_link + b_fast[j] * fmin + tail[j])
    return best * (1 - 1e-9)


def replay(plan: Plan, profile: Profile, cluster: Cluster, state_factor: float) -> tuple[float, bool]:
    """(estimated iteration seconds, fits memory) of ``plan`` by a group-level list schedule of its
    lowered schedule; inf when the orders deadlock."""
    units = units_of(plan)
    orders = GENERATORS[plan.schedule](plan, units)
    groups = plan.device_groups
    p = len(groups)
    stages = plan.stages
    S = len(stages)
    f_slow, b_slow, _, _ = _stage_terms(plan, profile, cluster)
    spb: dict[tuple[int, int], float] = {}
    out_bytes = [profile.boundary_bytes(s.last) for s in stages]
    in_bytes = [profile.boundary_bytes(s.first) for s in stages]
    lat = cluster.latency_s
    frac = {u: unit_fraction(u[1]) for u in units}
    last_backward: list[dict[int, int]] = []
    for order in orders:
        lb: dict[int, int] = {}
        for pos, act in enumerate(order):
            if act.kind is Kind.BACKWARD:
                lb[act.stage] = pos
        last_backward.append(lb)
    ar = [_all_reduce(plan, profile, cluster, j) if stages[j].replicas > 1 else 0.0 for j in range(S)]

    def cost(src: int, dst: int) -> float:
        got = spb.get((src, dst))
        if got is None:
            got = spb[(src, dst)] = seconds_per_byte(cluster, groups[src], groups[dst])
        return got

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
                act = orders[g][k]
                j = act.stage
                u = (act.microbatch, act.part)
                fr = frac[u]
                if act.kind is Kind.FORWARD:
                    if j > 0:
                        a = arr_f.get((j, u))
                        if a is None:
                            break
                        t = max(t, a)
                    t += f_slow[j] * fr
                    if j + 1 < S:
                        dst = (j + 1) % p
                        if dst == g:
                            arr_f[(j + 1, u)] = t
                        else:
                            st = max(t, link.get((g, dst), 0.0))
                            link[(g, dst)] = st + lat + out_bytes[j] * fr * cost(g, dst)
                            arr_f[(j + 1, u)] = link[(g, dst)]
                else:
                    if j + 1 < S:
                        a = arr_b.get((j, u))
                        if a is None:
                            break
                        t = max(t, a)
                    t += b_slow[j] * fr
                    if j > 0:
                        dst = (j - 1) % p
                        if dst == g:
                            arr_b[(j - 1, u)] = t
                        else:
                            st = max(t, link.get((g, dst), 0.0))
                            link[(g, dst)] = st + lat + in_bytes[j] * fr * cost(g, dst)
                            arr_b[(j - 1, u)] = link[(g, dst)]
                    if last_backward[g].get(j) == k:
                        t += ar[j]
                k += 1
            if k != pc[g]:
                remaining -= k - pc[g]
                pc[g], clock[g] = k, t
                progressed = True
        if not progressed:
            return INF, False
    # Memory: the simulator's accounting (static state + peak stash), identical for every replica.
    fits = True
    for g, order in enumerate(orders):
        devs = groups[g]
        static = sum(profile.param_bytes(stages[j].first, stages[j].last) for j in range(g, S, p)) * state_factor
        stash = peak = 0.0
        for act in order:
            s = stages[act.stage]
            delta = profile.stash_bytes(s.first, s.last) * unit_fraction(act.part) / s.replicas
            stash += delta if act.kind is Kind.FORWARD else -delta
            peak = max(peak, stash)
        if static + peak > min(cluster.devices[d].memory_bytes for d in devs):
            fits = False
    return max(clock), fits


@dataclass
class _Candidate:
    rank: int  # position of the first planner that produced it (ties go to the earlier planner)
    label: str
    plan: Plan
    lo: float  # lower bound on its simulated time
    hi: float = INF  # upper bound (replay, or the simulated time once ``exact``)
    exact: bool = False
    replayed: bool = False


def plan_auto(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    names = [n for n in options.extra.get("auto_planners", CANDIDATES) if n != "auto"]
    inner = replace(options, extra={k: v for k, v in options.extra.items() if k not in ("interleave", "auto_planners")})
    failures: list[str] = []
    cands: dict[PlanKey, _Candidate] = {}
    for rank, name in enumerate(names):
        try:
            plan = get_planner(name).fn(profile, cluster, inner)
        except UserError as exc:
            failures.append(f"{name}: {exc}")
            continue
        if plan_key(plan) not in cands:  # several planners often return the same plan: score it once
            cands[plan_key(plan)] = _Candidate(rank, name, plan, time_lower_bound(plan, profile, cluster))
    check = options.check_memory

    def simulate_exact(c: _Candidate) -> bool:
        """Simulate ``c`` (its time becomes exact); False if it exceeds device memory."""
        res = simulate(c.plan, profile, cluster, options.sim_options)
        if check and memory_error(res, cluster):
            failures.append(f"{c.label}: plan exceeds device memory")
            return False
        c.lo = c.hi = res.iteration_s
        c.exact = True
        return True

    # 1. Upper bounds by replay, in lower-bound order; a plan whose lower bound is no better than
    #    some plan's upper bound can never win and is not even replayed.
    alive: list[_Candidate] = []
    best_hi = INF
    for c in sorted(cands.values(), key=lambda c: (c.lo, c.rank)):
        if c.lo >= best_hi:
            continue
        t, fits = replay(c.plan, profile, cluster, options.state_factor)
        c.replayed = True
        if check and not fits:
            failures.append(f"{c.label}: plan exceeds device memory")
            continue
        if np.isfinite(t):
            c.hi = t
        elif not simulate_exact(c):
            continue
        alive.append(c)
        best_hi = min(best_hi, c.hi)
    if not alive:
        detail = "; ".join(failures) or "every candidate plan exceeds device memory"
        raise UserError(f"auto: no planner produced a plan that fits ({detail})")
    # 2. The winner W has the least upper bound; every other plan must provably be no faster:
    #    its lower bound is >= W's upper bound, or it is simulated (then exact) and is not faster.
    while True:
        win = min(alive, key=lambda c: (c.hi, c.rank))
        pending = [c for c in alive if c is not win and not c.exact and c.lo < win.hi]
        if not pending:
            break
        for c in pending:
            if not simulate_exact(c):
                alive.remove(c)
    # 3. Interleaved variants of the leaders (Megatron's virtual chunks shrink the bubble). A variant
    #    replaces W only when its replay — an upper bound on its simulated time — is below W's
    #    simulated time, so it needs no simulation of its own.
    leaders = sorted(alive, key=lambda c: (c.hi, c.rank))[:TOP_INTERLEAVE]
    best_var: tuple[float, Plan, str] | None = None
    for c in leaders:
        for v in candidate_chunks(c.plan, profile)[1:]:
            try:
                var = interleaved_plan(c.plan, profile, v)
            except UserError:
                continue
            bar = best_var[0] if best_var is not None else win.hi
            if time_lower_bound(var, profile, cluster) >= bar:
                continue
            t, fits = replay(var, profile, cluster, options.state_factor)
            if (fits or not check) and t * (1 + 1e-9) < bar:
                best_var = (t, var, f"{c.label}+v{v}")
    if best_var is not None and not win.exact and best_var[0] * (1 + 1e-9) >= win.lo:
        simulate_exact(win)  # its replay is only an upper bound: compare with its exact time
    if best_var is not None and best_var[0] * (1 + 1e-9) < win.hi:
        t, plan, label = best_var
        return replace(plan, algorithm=f"auto:{label}", objective_s=t)
    return replace(win.plan, algorithm=f"auto:{win.label}", objective_s=win.hi)


register(PlannerSpec("auto", plan_auto, "every planner (+ interleaving), fastest simulated plan that fits memory"))
assert "auto" in REGISTRY
