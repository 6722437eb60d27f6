"""``auto``: the fastest simulated plan that fits memory, over every schedule each structure can use.

Candidate *structures* (stages: block ranges on device groups) come from:

* every registered literature and baseline planner (``even``, ``params``, ``pipedream``, ``spp``,
  ``dapple``, ``autopipe``, ``2bw``) — on clusters of identical servers larger than
  ``FULL_SEARCH_DEVICES``, run on one pipeline's share of the cluster and replicated as data
  parallelism (:mod:`hierarchy`), because their cost grows with every device;
* on small instances, every structure there is (:mod:`exhaustive`, when the space has at most
  ``EXACT_STRUCTURES``), so there ``auto`` is the simulator's optimum over that space.

Each structure is then timed under every schedule the options allow: GPipe and 1F1B, each with
AutoPipe's slicing of the first ``s`` micro-batches (every ``s`` on exhaustive structures; 0, the
planner's own and powers of two up to the depth otherwise), and Megatron's interleaving with
``v = 2..MAX_CHUNKS`` balanced chunks. ``options.schedule`` (CLI ``--schedule``) restricts the kinds.

Search without simulating everything, branch and bound on the simulator's own terms
(:mod:`orchestrator.group_sim`): every variant gets a true lower bound (a few operations per
variant once per structure); variants are visited in bound order and timed by the simulator's
group-level mode until the bound reaches the best time found. That mode is exact when a group's
replicas are alike (flagged); where it is only an upper bound, every contender whose bound is
below the winner is simulated in full, so ``auto`` is never worse than any of its candidates.
Memory is checked exactly (the group mode's accounting is the simulator's).

``options.extra["auto_planners"]`` (a list of names) restricts the planners.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.cluster import Cluster
from orchestrator.errors import UserError
from orchestrator.group_sim import BoundTerms, plan_lower_bound, simulate_groups
from orchestrator.plan import Plan, ScheduleKind, Stage
from orchestrator.planners import exhaustive, hierarchy
from orchestrator.planners.base import REGISTRY, PlannerOptions, PlannerSpec, get_planner, register
from orchestrator.planners.interleaving import candidate_chunks, interleaved_plan
from orchestrator.profile import Profile
from orchestrator.simulator import memory_error, simulate

CANDIDATES = ("even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw")
EXACT_STRUCTURES = 4000
FULL_SEARCH_DEVICES = 64
INF = float("inf")

PlanKey = tuple[object, ...]


def plan_key(plan: Plan) -> PlanKey:
    return (plan.stages, plan.num_microbatches, plan.schedule, plan.sliced_microbatches)


def time_lower_bound(plan: Plan, profile: Profile, cluster: Cluster) -> float:
    """A true lower bound on ``simulate(plan).iteration_s`` (:func:`group_sim.plan_lower_bound`)."""
    return plan_lower_bound(plan, profile, cluster)


def replay(plan: Plan, profile: Profile, cluster: Cluster, state_factor: float) -> tuple[float, bool]:
    """(group-level simulated iteration seconds — an upper bound, exact for alike replicas — and
    whether it fits memory); inf when the orders deadlock."""
    from orchestrator.simulator import SimOptions

    res = simulate_groups(plan, profile, cluster, SimOptions(state_factor=state_factor))
    return res.iteration_s, res.fits


@dataclass
class _Candidate:
    rank: int  # order of discovery (ties go to the earlier: planners before the exhaustive search)
    label: str
    plan: Plan
    lo: float
    hi: float = INF
    exact: bool = False


def allowed_kinds(options: PlannerOptions) -> tuple[ScheduleKind, ...]:
    if options.schedule is None:
        return (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED)
    return (options.schedule,)


def _slices(M: int, depth: int, own: int, every: bool) -> list[int]:
    if every:
        return list(range(M + 1))
    out = {0, own}
    s = 1
    while s <= min(M, depth):
        out.add(s)
        s *= 2
    return sorted(x for x in out if x <= M)


def _variants(stages: tuple[Stage, ...], own: Plan | None, label: str, profile: Profile, cluster: Cluster, options: PlannerOptions, kinds: tuple[ScheduleKind, ...], every: bool) -> list[tuple[float, str, Plan]]:
    """(lower bound, label, plan) of every schedule variant of one structure."""
    M = options.num_microbatches
    p = len({s.devices for s in stages})
    out: list[tuple[float, str, Plan]] = []
    if p < len(stages):  # an interleaved structure (exhaustive search only)
        if ScheduleKind.INTERLEAVED in kinds and M % p == 0:
            out.append((BoundTerms(stages, profile, cluster).bound(M, 1.0, M), label, Plan(stages, M, ScheduleKind.INTERLEAVED)))
        return out
    terms = BoundTerms(stages, profile, cluster)
    own_kind = own.schedule if own is not None else None
    own_slices = own.sliced_microbatches if own is not None else 0
    for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        if kind not in kinds:
            continue
        for s in _slices(M, p, own_slices, every):
            same = own is not None and kind is own_kind and s == own_slices
            tag = "" if same else f"/{kind.value}" + (f"/s{s}" if s else "")
            out.append((terms.bound(M, 0.5 if s else 1.0, M + s), label + tag, Plan(stages, M, kind, s)))
    if ScheduleKind.INTERLEAVED in kinds and own is not None and not every:
        base = Plan(stages, M)
        for v in candidate_chunks(base, profile)[1:]:
            try:
                var = interleaved_plan(base, profile, v)
            except UserError:
                continue
            out.append((plan_lower_bound(var, profile, cluster), f"{label}+v{v}", var))
    return out


def _seed_plans(profile: Profile, cluster: Cluster, options: PlannerOptions, names: list[str], failures: list[str]) -> list[tuple[str, Plan]]:
    inner = replace(options, extra={k: v for k, v in options.extra.items() if k not in ("interleave", "auto_planners")})
    if cluster.size > FULL_SEARCH_DEVICES and hierarchy.regular_servers(cluster) is not None:
        return hierarchy.replicated_plans(profile, cluster, inner, names, failures)
    out: list[tuple[str, Plan]] = []
    for name in names:
        try:
            out.append((name, get_planner(name).fn(profile, cluster, inner)))
        except UserError as exc:
            failures.append(f"{name}: {exc}")
    return out


def plan_auto(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    names = [n for n in options.extra.get("auto_planners", CANDIDATES) if n != "auto"]
    kinds = allowed_kinds(options)
    failures: list[str] = []
    pool: list[tuple[float, int, str, Plan]] = []
    seen: set[PlanKey] = set()

    def add(items: list[tuple[float, str, Plan]]) -> None:
        for lo, label, plan in items:
            key = plan_key(plan)
            if key not in seen:  # several planners often return the same plan: score it once
                seen.add(key)
                pool.append((lo, len(pool), label, plan))

    for name, plan in _seed_plans(profile, cluster, options, names, failures):
        stages = plan.stages[: plan.num_physical_stages]
        add(_variants(stages, plan, name, profile, cluster, options, kinds, every=False))
    L, n = profile.num_blocks, cluster.size
    max_stages = min(options.max_stages or n, n)
    interleave = ScheduleKind.INTERLEAVED in kinds
    if exhaustive.space_size(L, n, max_stages, options.straight, interleave) <= EXACT_STRUCTURES:
        for stages in exhaustive.structures(L, n, max_stages, options.straight, interleave):
            add(_variants(stages, None, "exhaustive", profile, cluster, options, kinds, every=True))
    if not pool:
        detail = "; ".join(failures) or "no candidate plan"
        raise UserError(f"auto: no planner produced a plan ({detail})")
    return _branch_and_bound(pool, profile, cluster, options, failures)


def _branch_and_bound(pool: list[tuple[float, int, str, Plan]], profile: Profile, cluster: Cluster, options: PlannerOptions, failures: list[str]) -> Plan:
    check = options.check_memory
    sim_options = options.sim_options

    def simulate_exact(c: _Candidate) -> bool:
        """Simulate ``c`` in full (its time becomes exact); False if it exceeds device memory."""
        res = simulate(c.plan, profile, cluster, sim_options)
        if check and memory_error(res, cluster):
            return False
        c.lo = c.hi = res.iteration_s
        c.exact = True
        return True

    alive: list[_Candidate] = []
    best_hi = INF
    too_big = 0
    for lo, rank, label, plan in sorted(pool, key=lambda x: (x[0], x[1])):
        if lo >= best_hi:
            break  # sorted by bound: nothing after this can win
        res = simulate_groups(plan, profile, cluster, sim_options)
        if check and not res.fits:
            too_big += 1
            continue
        c = _Candidate(rank, label, plan, lo, res.iteration_s, res.exact)
        if res.iteration_s == INF and not simulate_exact(c):
            continue
        alive.append(c)
        best_hi = min(best_hi, c.hi)
    if not alive:
        detail = "; ".join(failures + ([f"{too_big} candidate plans exceed device memory"] if too_big else []))
        raise UserError(f"auto: no candidate plan fits device memory ({detail or 'nothing to try'})")
    # The winner W has the least upper bound; every other plan must provably be no faster:
    # its lower bound is >= W's upper bound, or it is simulated (then exact) and is not faster.
    while True:
        win = min(alive, key=lambda c: (c.hi, c.rank))
        pending = [c for c in alive if c is not win and not c.exact and c.lo < win.hi]
        if not pending:
            break
        for c in pending:
            if not simulate_exact(c):
                alive.remove(c)
    return replace(win.plan, algorithm=f"auto:{win.label}", objective_s=win.hi)


register(PlannerSpec("auto", plan_auto, "every planner and schedule (+ exhaustive on small instances), fastest simulated plan that fits memory"))
assert "auto" in REGISTRY
