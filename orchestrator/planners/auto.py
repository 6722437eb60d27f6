"""``auto``: the fastest simulated plan that fits memory, over every schedule each structure can use.

Candidate *structures* (stages: block ranges on device groups) come from:

* every registered literature and baseline planner (``even``, ``params``, ``pipedream``, ``spp``,
  ``dapple``, ``autopipe``, ``2bw``) — on clusters of identical servers larger than
  ``FULL_SEARCH_DEVICES``, run on one pipeline's share of the cluster and replicated as data
  parallelism (:mod:`hierarchy`), because their cost grows with every device;
* on small instances, every structure there is, one per device-symmetry class (:mod:`exhaustive`,
  when that space has at most ``WALK_STRUCTURES``): walked after the planners' structures are
  searched, dropping every partial structure whose bound reaches the best time found, within
  ``WALK_BUDGET`` visits. When the walk completes (and M <= ``ALL_SLICES``), ``auto`` is the simulator's
  optimum over that space.
* where it did not (clusters of up to ``CLIMB_DEVICES`` different devices), a hill-climb
  (:mod:`climb`): rounds of the structures one move away from the best plans timed so far.

Each structure is then timed under every schedule the options allow: GPipe, 1F1B and ZB-H1 (zero
bubble: split backwards, weight passes deferred into bubbles), each with AutoPipe's slicing of the first ``s`` micro-batches (every ``s`` on exhaustive structures
while M <= ``ALL_SLICES``; 0, the planner's own, the powers of two and M otherwise), and Megatron's interleaving with
``v = 2..MAX_CHUNKS`` balanced chunks, sliced as well where M + s stays a multiple of the depth. ``options.schedule`` (CLI ``--schedule``) restricts the kinds.

Search without simulating everything: best-first branch and bound on the simulator's own terms
(:mod:`orchestrator.costmodel.group_sim`). A structure enters a heap with its cheapest bound (each group's
compute and all-reduces); popped, it is expanded into its variants, each with a true lower bound
(fill, drain and link terms); a popped variant is timed by the simulator's group-level mode. The
search stops when the least bound left reaches the best time found. The group mode is exact when a
group's replicas are alike (flagged); otherwise it is an upper bound, a second group pass gives a
lower one, and every contender whose lower bound is below the winner is simulated in full, so
``auto`` is never worse than any of its candidates. Memory is checked exactly (the group mode's
accounting is the simulator's). On large clusters (``> FULL_SEARCH_DEVICES``) a full simulation
costs minutes, so only candidates the group mode times exactly compete, the first pass offers
slicing only as the planner chose it, and the ``REFINE`` best structures then get every slicing
count of the powers of two up to their depth.

Memory: a variant over some device group's memory is retried with activation recomputation on
that group's stages (not under ZB-H1, whose split backward needs the saved graph); on large
clusters, when nothing fits, every structure is retried with every slicing count before ``auto``
refuses, and the refusal names the least memory per GPU any timed candidate needed. Above
``RESOLVE_DEVICES`` candidates compete by the group mode's upper bound (a full simulation costs
seconds there); the final plan is still simulated in full by ``run_planner``.

``options.auto_planners`` (names) restricts the planners.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.costmodel.group_sim import BoundTerms, FirstUnitPath, group_memory, simulate_groups, stage_work, work_bound
from orchestrator.costmodel.terms import fits_memory, static_bytes
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.planners import climb as climbing, exhaustive, hierarchy
from orchestrator.planners.catalog import baseline
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.planners.interleaving import MAX_CHUNKS
from orchestrator.planners.partition import min_max_partition, regular_servers
from orchestrator.core.profile import Profile
from orchestrator.costmodel.simulator import memory_error, simulate

CANDIDATES = ("even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw")
WALK_STRUCTURES = 2 * 10**7
"""``auto`` walks every structure (:mod:`exhaustive`) when the space, one per device-symmetry class, has
at most this many. 10 blocks × 8 devices, up to 8 stages: 21 800 on identical devices, 505 560 on two
servers of four, 1.1·10^8 when every device differs (not walked). Below ``EXACT_STRUCTURES`` the walk
always completes; above, bounds must cut it down to ``WALK_BUDGET`` visits."""
EXACT_STRUCTURES = 45000
"""Up to this many structures the walk needs no bound: every instance of up to 16 blocks on 4 devices
(40 735). It is also the walk's budget while no plan that fits has been timed (every bound is then infinite)."""
WALK_BUDGET = 10**6
"""Partial structures the walk may visit (~5 s of CPU; the hardest 10 × 8 instance measured needs 6.5·10^5);
beyond it ``auto`` is not exhaustive: its plan is the best it timed (then climbed, on clusters of different devices)."""
FULL_SEARCH_DEVICES = 64
ALL_SLICES = 16
"""Walked structures are timed with every slicing count up to this many micro-batches; above, with 0, the powers
of two and M (``_slices``' ``some``): at M = 64 every count is 195 variants per structure, and 100 blocks on 4
GPUs at 80 GiB timed 32 000 of them, nearly all over memory and retried with recomputation (20 s)."""
CLIMB_DEVICES = 16
"""``auto`` climbs (:mod:`climb`) on clusters of different devices up to this size where it did not walk every structure."""
CLIMB_ROUNDS = 1024
CLIMB_WIDTH = 24
"""Structures pushed per climbing round: the best of one move's neighbours by the cost model's estimate (straight
parents) or by ``work_bound`` (interleaved ones, which the cost model does not know)."""
CLIMB_WORK = 2 * 10**6
"""Ticks of timing the climb may spend (~3 s of CPU): enough for the 10-block, 8-device instances of
all-different devices measured (the last improvement came at 1.3·10^6)."""
NEIGHBOUR_TICKS = 5
"""A neighbour's cost in ticks: generated and ranked by the cost model (~6 µs)."""
TIMING_TICKS = 300
"""A timing's fixed cost in ticks; it also costs one tick per stage and unit it steps through
(measured: ~0.35 ms per timing plus ~1.2 µs per stage-unit)."""
REFINE = 3
RESOLVE_DEVICES = 32
DIRECT_DEVICES = {"dapple": 32}
"""Planners that seed ``auto`` only up to this many devices: DAPPLE's DP over device runs costs
seconds per seed beyond (5 s at 64 GPUs), and its structures are also SPP's and the hierarchy's."""
INF = float("inf")

STRAIGHT_KINDS = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1)
"""The schedules of a structure with one stage per device group (the others interleave)."""


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
        return (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED, ScheduleKind.ZB_H1)
    return (options.schedule,)


def _slices(M: int, depth: int, own: int, slicing: str) -> list[int]:
    """Slicing counts to try: every one (``all``), or 0, the planner's own and (``some``) the powers of two up
    to M and M itself — not only up to the depth: halving more warm-up micro-batches than the pipeline is
    deep still shortens its fill where the first stages are slow (issue 28: sliced=8 1.9% faster than 1 at depth 2)."""
    if slicing == "all":
        return list(range(M + 1))
    out = {0, own}
    if slicing == "some":
        s = 1
        while s <= M:
            out.add(s)
            s *= 2
        out.add(M)
    return sorted(x for x in out if x <= M)


class _StageCost:
    """One stage's share of its device group's cheapest bound (:func:`work_bound`'s terms), cached
    per (blocks, devices): the walk asks for the same stages over and over. A stage whose weights
    and optimizer state alone exceed a device's memory (``state_factor``, checked when memory is)
    costs infinity: no schedule, slicing or recomputation makes it fit."""

    def __init__(self, profile: Profile, cluster: Cluster, options: PlannerOptions) -> None:
        self.profile, self.cluster, self.total = profile, cluster, options.num_microbatches
        self.state_factor = options.state_factor if options.check_memory else None
        self.speeds, self.memories = cluster.speeds, cluster.memories
        self.cache: dict[tuple[int, int, tuple[int, ...]], float] = {}

    def __call__(self, first: int, last: int, devices: tuple[int, ...]) -> float:
        key = (first, last, devices)
        got = self.cache.get(key)
        if got is None:
            p, devs = self.profile, list(devices)
            params = p.param_bytes(first, last)
            if self.state_factor is not None and not fits_memory(static_bytes(params, self.state_factor), float(self.memories[devs].min())):
                got = INF
            else:
                got = stage_work(p, self.cluster, self.speeds, first, last, devices, self.total)
            self.cache[key] = got
        return got


class _RestCost:
    """A lower bound for the blocks a partial structure has not placed yet, on the devices it left
    free: their work for every micro-batch at the free devices' summed speed. A device group's slowest
    replica is busy at least its share at its own speed (:func:`stage_work`), and the groups' shares
    add up to the work, so the busiest group is busy at least this long."""

    def __init__(self, profile: Profile, cluster: Cluster, options: PlannerOptions) -> None:
        self.profile, self.total, self.speeds = profile, options.num_microbatches, cluster.speeds

    def __call__(self, first: int, free: tuple[int, ...]) -> float:
        work = self.profile.compute_time(first, self.profile.num_blocks) * self.total
        return work / float(self.speeds[list(free)].sum())


class _Cuts:
    """Balanced cuts (min-max of forward + backward) per part count, shared by every structure."""

    def __init__(self, profile: Profile) -> None:
        self.weights = np.array([b.forward_s + b.backward_s for b in profile.blocks])
        self.cache: dict[int, list[int]] = {}
        self.stages: dict[tuple[int, int, tuple[int, ...]], Stage] = {}

    def stage(self, first: int, last: int, devices: tuple[int, ...]) -> Stage:
        """One Stage object per (blocks, devices): validating a 1024-device stage is not free."""
        key = (first, last, devices)
        got = self.stages.get(key)
        if got is None:
            got = self.stages[key] = Stage(first, last, devices)
        return got

    def __call__(self, k: int) -> list[int]:
        got = self.cache.get(k)
        if got is None:
            got = self.cache[k] = min_max_partition(self.weights, k)
        return got


@dataclass(order=True)
class _Item:
    """A heap entry: a structure still to expand (``kind`` None) or one plan to time."""

    lo: float
    rank: int
    label: str = field(compare=False)
    stages: tuple[Stage, ...] = field(compare=False)
    kind: ScheduleKind | None = field(compare=False, default=None)
    sliced: int = field(compare=False, default=0)
    own: Plan | None = field(compare=False, default=None)


def _interleaved(stages: tuple[Stage, ...], label: str, profile: Profile, options: PlannerOptions, cuts: _Cuts) -> list[tuple[str, tuple[Stage, ...]]]:
    """Megatron's balanced re-cuts of a straight structure into ``v`` chunks per device group."""
    p, M = len(stages), options.num_microbatches
    if p < 2 or M % p:  # (depths that need slicing to divide the units: only in the exhaustive space, where
        return []        # it is cheap; building these re-cuts for every seed costs seconds at 1024 GPUs)
    out = []
    for v in range(2, min(MAX_CHUNKS, profile.num_blocks // p) + 1):
        c = cuts(p * v)
        out.append((f"{label}+v{v}", tuple(cuts.stage(c[i], c[i + 1], stages[i % p].devices) for i in range(p * v))))
    return out


def _interleavable(M: int, p: int) -> bool:
    """Whether some slicing count s <= M makes the unit count M + s a multiple of the depth p (Megatron's rule)."""
    return any((M + s) % p == 0 for s in range(min(M, p - 1) + 1))


def _expand(item: _Item, profile: Profile, cluster: Cluster, options: PlannerOptions, kinds: tuple[ScheduleKind, ...], slicing: str, below: float = INF) -> list[_Item]:
    """Every schedule variant of one structure whose lower bound (:class:`BoundTerms`) is under
    ``below``. Slicing counts: ``all`` (small instances), ``some`` (0, the planner's own, the powers of
    two and M) or ``own`` (0 and the planner's own: the first pass on large clusters).

    Every sliced variant (s >= 1) has the same smallest unit (half a micro-batch), so its bound
    differs from another's only by the per-message latency of its M + s units: it grows with s.
    The bound is computed once per unit count that changes it, and the first sliced count at or
    over ``below`` ends that kind's counts."""
    M = options.num_microbatches
    stages, own = item.stages, item.own
    p = len({s.devices for s in stages})
    terms = BoundTerms(stages, profile, cluster)
    memo: dict[tuple[float, int, bool], float] = {}

    def bound(s: int, split: bool = False) -> float:
        key = (0.5 if s else 1.0, M + s if terms.lat else M, split)
        got = memo.get(key)
        if got is None:
            got = memo[key] = terms.bound(M, key[0], M + s, split)
        return got

    out: list[_Item] = []
    if p < len(stages):  # interleaved: sliced too, where the unit count stays a multiple of the depth
        for s in _slices(M, p, 0, slicing):
            if (M + s) % p == 0:
                lo = bound(s)
                if lo >= below and s:
                    break
                tag = f"/s{s}" if s else ""
                out.append(_Item(lo, item.rank, item.label + tag, stages, ScheduleKind.INTERLEAVED, s))
        return out
    own_slices = own.sliced_microbatches if own is not None else 0
    recomputes = any(s.recompute for s in stages)  # a structure that fitted by recomputing (refined on large clusters)
    for kind in STRAIGHT_KINDS:
        if kind not in kinds or (recomputes and kind is ScheduleKind.ZB_H1):  # ZB-H1's split backward cannot recompute
            continue
        for s in _slices(M, p, own_slices, slicing):
            lo = bound(s, kind is ScheduleKind.ZB_H1)
            if lo >= below and s:
                break
            same = own is not None and kind is own.schedule and s == own_slices
            tag = "" if same else f"/{kind.value}" + (f"/s{s}" if s else "")
            out.append(_Item(lo, item.rank, item.label + tag, stages, kind, s))
    return out


def _recompute_over(plan: Plan, peaks: tuple[float, ...], cluster: Cluster) -> tuple[Stage, ...] | None:
    """The stages of ``plan`` with activation recomputation on every stage of a device group over
    its memory (its stash shrinks to the stage inputs), or None when those already recompute or
    the schedule cannot (ZB-H1's split backward needs the saved graph)."""
    if plan.schedule is ScheduleKind.ZB_H1:
        return None
    mem = cluster.memories
    groups = plan.device_groups
    over = {groups[g] for g, peak in enumerate(peaks) if not fits_memory(peak, float(min(mem[list(groups[g])])))}
    stages = tuple(replace(s, recompute=True) if s.devices in over and not s.recompute else s for s in plan.stages)
    return None if stages == plan.stages else stages


class _Need:
    """The least memory per device any timed candidate needs (what a refusal names): a candidate
    needs, on every device, its group's peak (static state + peak stash of one replica)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.best = INF
        self.plan: Plan | None = None

    def note(self, plan: Plan, peaks: tuple[float, ...]) -> None:
        peak = max(peaks, default=INF)
        if peak < self.best:
            self.best, self.plan = peak, plan

    def describe(self) -> str:
        have = float(self.cluster.memories.min()) / 2**30
        if self.plan is None:
            return f"no candidate was timed (devices have {have:.2f} GiB)"
        need = math.ceil(self.best / 2**30 * 100 - 1e-9) / 100  # rounded up: the figure named must be enough
        return f"the least memory any candidate plan needs is {need:.2f} GiB per GPU (devices have {have:.2f} GiB)"


def _bare(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """The structure without recomputation flags (a structure timed both ways is climbed from once)."""
    return tuple(Stage(s.first, s.last, s.devices) for s in stages)


def _uniform(cluster: Cluster, classes: list[tuple[int, ...]]) -> bool:
    """Identical devices, or identical servers: the clusters the literature planners are built for.
    There their answers (with the hierarchy's) were within 0.2% of the climb's at every 8- and
    16-GPU point of the scale contract, which the climb cost 2–4 s each; on clusters of different
    devices they were up to 15% behind (issue 28)."""
    return len(classes) == 1 or regular_servers(cluster) is not None


def _seed_plans(profile: Profile, cluster: Cluster, options: PlannerOptions, names: list[str], failures: list[str]) -> list[tuple[str, Plan]]:
    inner = replace(options, interleave=False, auto_planners=None)
    if cluster.size > FULL_SEARCH_DEVICES and hierarchy.regular_servers(cluster) is not None:
        return hierarchy.replicated_plans(profile, cluster, inner, names, failures)
    out: list[tuple[str, Plan]] = []
    for name in names:
        if cluster.size > DIRECT_DEVICES.get(name, cluster.size):
            continue
        try:
            out.append((name, baseline(name).fn(profile, cluster, hierarchy.seed_options(name, cluster.size, inner))))
        except UserError as exc:
            failures.append(f"{name}: {exc}")
    return out


def plan_auto(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    names = [n for n in (options.auto_planners or CANDIDATES) if n != "auto"]
    kinds = allowed_kinds(options)
    failures: list[str] = []
    M = options.num_microbatches
    heap: list[_Item] = []
    seen: set[tuple[Stage, ...]] = set()
    cuts = _Cuts(profile)

    def push(label: str, stages: tuple[Stage, ...], own: Plan | None) -> None:
        if stages not in seen:  # several planners often return the same structure: score it once
            seen.add(stages)
            heapq.heappush(heap, _Item(work_bound(stages, profile, cluster, M), len(seen), label, stages, None, 0, own))

    interleave = ScheduleKind.INTERLEAVED in kinds
    for name, plan in _seed_plans(profile, cluster, options, names, failures):
        stages = plan.stages[: plan.num_physical_stages]
        if any(kind in kinds for kind in STRAIGHT_KINDS):
            push(name, stages, plan)
        if interleave:
            for label, var in _interleaved(stages, name, profile, options, cuts):
                push(label, var, None)
    L, n = profile.num_blocks, cluster.size
    max_stages = min(options.max_stages or n, n)
    walk: Callable[[float], bool] | None = None
    classes = exhaustive.device_classes(cluster) if n <= FULL_SEARCH_DEVICES else []
    if classes and exhaustive.space_size(L, classes, max_stages, options.straight, interleave) <= WALK_STRUCTURES:
        cost, rest = _StageCost(profile, cluster, options), _RestCost(profile, cluster, options)
        head = FirstUnitPath(profile, cluster)

        def walk(below: float) -> bool:
            """Push every structure whose bound is under ``below``; False if the budget ran out first
            (with nothing timed yet that fits, no bound prunes: the budget is ``EXACT_STRUCTURES``)."""
            try:
                budget = WALK_BUDGET if below < INF else EXACT_STRUCTURES
                for stages in exhaustive.structures(L, classes, max_stages, options.straight, interleave, cost, below, budget, rest, head):
                    p = len({s.devices for s in stages})
                    if p == len(stages) or _interleavable(M, p):
                        push("exhaustive", stages, None)
            except exhaustive.Budget:
                return False
            return True

    climb: Callable[[Plan], int] | None = None
    if n <= min(CLIMB_DEVICES, FULL_SEARCH_DEVICES) and not _uniform(cluster, classes):
        neighbours = climbing.Neighbours(profile, cluster, M, options.straight, max_stages, CLIMB_WIDTH,
                                         lambda st: work_bound(st, profile, cluster, M))

        def climb(plan: Plan) -> int:
            """Push the structures one move from ``plan``'s (:mod:`climb`), and their interleaved re-cuts;
            the number of neighbours ranked."""
            base = _bare(plan.stages)
            before = neighbours.considered
            for nb in neighbours(base):
                push("climb", nb, None)
            if interleave and plan.num_physical_stages == len(base):
                for label, var in _interleaved(base, "climb", profile, options, cuts):
                    push(label, var, None)
            return neighbours.considered - before

    if not heap and walk is None:
        detail = "; ".join(failures) or "no candidate plan"
        raise UserError(f"auto: no planner produced a plan ({detail})")
    return _branch_and_bound(heap, profile, cluster, options, kinds, walk, climb, failures)


def _branch_and_bound(heap: list[_Item], profile: Profile, cluster: Cluster, options: PlannerOptions, kinds: tuple[ScheduleKind, ...], walk: Callable[[float], bool] | None,
                      climb: Callable[[Plan], int] | None, failures: list[str]) -> Plan:
    """Best-first: pop the least lower bound; expand a structure into its variants, or time a
    variant in the group mode; stop when the least bound reaches the best time found. With
    ``walk``, the planners' structures are searched first and the best time found bounds the walk
    of every structure (:mod:`exhaustive`), whose survivors are then searched the same way."""
    every = walk is not None
    check = options.check_memory
    sim_options = options.sim_options
    M = options.num_microbatches

    def simulate_exact(c: _Candidate) -> bool:
        """Simulate ``c`` in full (its time becomes exact); False if it exceeds device memory."""
        res = simulate(c.plan, profile, cluster, sim_options)
        if check and memory_error(res, cluster):
            return False
        c.lo = c.hi = res.iteration_s
        c.exact = True
        return True

    large = cluster.size > FULL_SEARCH_DEVICES
    need = _Need(cluster)
    alive: list[_Candidate] = []
    best_hi = INF
    too_big = inexact = 0
    work = 0  # ticks spent timing variants (see TIMING_TICKS)
    timed: set[tuple[object, ...]] = set()
    refined: set[tuple[Stage, ...]] = set()
    refined_all: set[tuple[Stage, ...]] = set()

    def search() -> None:
        nonlocal best_hi, too_big, inexact, work
        while heap and heap[0].lo < best_hi:  # the least bound left cannot beat the best: done
            item = heapq.heappop(heap)
            if item.kind is None:
                refined_all.add(item.stages)
                slicing = "all" if every and M <= ALL_SLICES else ("own" if large and item.stages not in refined else "some")
                for var in _expand(item, profile, cluster, options, kinds, slicing, best_hi):
                    if var.lo < best_hi:
                        heapq.heappush(heap, var)
                continue
            key = (item.stages, item.kind, item.sliced)
            if key in timed:
                continue
            timed.add(key)
            plan = Plan(item.stages, M, item.kind, item.sliced)
            work += TIMING_TICKS + len(item.stages) * (M + item.sliced)
            if check:  # memory first: a variant over memory is not timed at all
                mem = group_memory(plan, profile, cluster, sim_options)
                if not mem.fits:
                    too_big += 1
                    need.note(plan, mem.peak_bytes)
                    fitted = _recompute_over(plan, mem.peak_bytes, cluster)
                    if fitted is not None:  # recomputing only adds work: the same bound still holds
                        heapq.heappush(heap, replace(item, stages=fitted, label=item.label + "/recompute"))
                    continue
            res = simulate_groups(plan, profile, cluster, sim_options, memory=False)
            if check and not res.fits:  # the orders deadlock
                too_big += 1
                continue
            if large and not res.exact:  # a full simulation of a large cluster costs minutes: only exact candidates
                inexact += 1
                continue
            c = _Candidate(item.rank, item.label, plan, item.lo, res.iteration_s, res.exact)
            if res.iteration_s == INF and not simulate_exact(c):
                continue
            if not c.exact:  # tighten the bound before anyone pays for a full simulation
                c.lo = max(c.lo, simulate_groups(plan, profile, cluster, sim_options, lower=True, memory=False).iteration_s * (1 - 1e-9))
            alive.append(c)
            best_hi = min(best_hi, c.hi)

    heapq.heapify(heap)
    search()
    walked = False
    if walk is not None:
        walked = walk(best_hi)
        search()
    if climb is not None and not walked:
        # Hill-climbing where the walk did not cover the space (:mod:`climb`): each round pushes the
        # structures one move from the best timed plan not yet climbed from, searched like any other,
        # until no plan is left to climb from, CLIMB_ROUNDS rounds, or CLIMB_WORK ticks of timing.
        seen_bases: set[tuple[Stage, ...]] = set()
        budget = work + CLIMB_WORK
        order: list[tuple[float, int, int]] = []  # every timed plan by (time, rank): the next parent is the first not climbed
        listed = 0
        for _ in range(CLIMB_ROUNDS):
            for i in range(listed, len(alive)):
                heapq.heappush(order, (alive[i].hi, alive[i].rank, i))
            listed = len(alive)
            while order and _bare(alive[order[0][2]].plan.stages) in seen_bases:
                heapq.heappop(order)
            if not order or work >= budget:
                break
            parent = alive[heapq.heappop(order)[2]].plan
            seen_bases.add(_bare(parent.stages))
            work += NEIGHBOUR_TICKS * climb(parent)
            search()
    if large:  # second pass: every slicing count for the REFINE best structures
        for c in sorted(alive, key=lambda c: c.hi):
            base = c.plan.stages
            if len(refined) >= REFINE or base in refined:  # interleaved ones too: sliced, they can win
                continue
            refined.add(base)
            heapq.heappush(heap, _Item(c.lo, c.rank, c.label.split("/")[0], base))
        search()
    if not alive and large:  # nothing fit: before refusing, every structure gets every slicing count and recomputation
        for stages in sorted(refined_all, key=lambda st: len(st)):
            if stages not in refined:
                refined.add(stages)
                heapq.heappush(heap, _Item(0.0, len(refined), "retry", stages))
        search()
    if not alive:
        detail = "; ".join(([f"{too_big} candidate plans over memory, with every schedule, slicing count and recomputation"] if too_big else [])
                           + ([f"{inexact} not timed exactly at this scale"] if inexact else []))
        raise UserError(f"auto: no plan fits device memory: {need.describe()} ({detail or 'nothing to try'})")
    # The winner W has the least upper bound; every other plan must provably be no faster:
    # its lower bound is >= W's upper bound, or it is simulated (then exact) and is not faster.
    # One contender at a time, least lower bound first: each exact time can lower the bar.
    # Above RESOLVE_DEVICES a full simulation costs seconds: candidates compete by their upper
    # bounds (the group mode's time, never below the simulator's), the winner among them.
    win = min(alive, key=lambda c: (c.hi, c.rank))
    if cluster.size <= RESOLVE_DEVICES:
        # Contenders in order of their lower bounds: an exact time only lowers the bar (win.hi), so
        # once one contender's bound reaches it, every later one's does too (one pass, not one
        # scan of every candidate per simulation: a walk leaves 10^5 of them).
        for c in sorted((c for c in alive if not c.exact), key=lambda c: (c.lo, c.rank)):
            if c is win or c.exact:  # exact already: a replaced winner, timed below (its lo is not its sort key now)
                continue
            if c.lo >= win.hi:
                break
            if not simulate_exact(c) or (c.hi, c.rank) >= (win.hi, win.rank):
                continue
            old, win = win, c
            # the winner it replaces, if it was timed by the group mode only, is now a contender too
            if not old.exact and old.lo < win.hi and simulate_exact(old) and (old.hi, old.rank) < (win.hi, win.rank):
                win = old
    return replace(win.plan, algorithm=f"auto:{win.label}", objective_s=win.hi)


SPEC = PlannerSpec("auto", plan_auto, "every planner and schedule (+ exhaustive on small instances), fastest simulated plan that fits memory")
