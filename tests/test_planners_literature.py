"""Literature planners (spp, dapple, autopipe, 2bw, interleaving, auto) against brute force.

Exact algorithms (PRM's DP, DAPPLE's DP, AutoPipe's Algorithm 1) must equal exhaustive enumeration
of their own objective on small inputs; SPP's end-to-end plan must stay within its proven bound
against the enumerated optimum. Everything here is CPU-only and small; the data-driven checks skip
when ../shared is absent.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from orchestrator.core.cluster import GBPS, Cluster, Device, flat, heterogeneous_servers, two_level
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, Stage, straight_plan
from orchestrator.costmodel.terms import all_reduce_time, boundary_time, transfer_time
from orchestrator.planners import autopipe, dapple, dapple_placement, scoring, spp
from orchestrator.planners.base import PlannerOptions, get_planner, run_planner
from orchestrator.planners.interleaving import best_interleaving
from orchestrator.core.profile import Block, Profile
from orchestrator.schedule import lower
from orchestrator.costmodel.simulator import simulate

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
BERT24 = SHARED / "profiles" / "dapple" / "profiling_results" / "bert-24-pbs-6.txt"


def random_profile(rng: np.random.Generator, n: int, act_scale: float = 2e6, param_scale: float = 4e7) -> Profile:
    blocks = tuple(
        Block(f"b{i}", float(rng.uniform(1e-3, 5e-3)), float(rng.uniform(2e-3, 9e-3)), float(rng.uniform(0.2, 1.0) * act_scale), float(rng.uniform(0.1, 1.0) * param_scale))
        for i in range(n)
    )
    return Profile("rand", blocks)


def random_cluster(rng: np.random.Generator, n: int, memory: float = 64 * 2**30) -> Cluster:
    bw = rng.uniform(5, 100, size=(n, n)) * GBPS
    bw = (bw + bw.T) / 2
    np.fill_diagonal(bw, 0.0)
    return Cluster(tuple(Device(i, f"n{i}", 1.0, memory) for i in range(n)), bw)


def opts(M: int, **kw: object) -> PlannerOptions:
    return PlannerOptions(num_microbatches=M, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- SPP
def _run_plans(order: list[int], L: int, S: int):
    """Every S-stage plan whose stages are consecutive runs of ``order`` (any start, any lengths)."""
    V = len(order)
    for cuts in itertools.combinations(range(1, L), S - 1):
        bounds = [0, *cuts, L]
        for a in range(V):
            for reps in itertools.product(range(1, V + 1), repeat=S):
                if a + sum(reps) > V:
                    continue
                pos, stages = a, []
                for k in range(S):
                    stages.append(Stage(bounds[k], bounds[k + 1], tuple(order[pos : pos + reps[k]])))
                    pos += reps[k]
                yield Plan(tuple(stages), 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prm_dp_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    prof = random_profile(rng, 5)
    cl = random_cluster(rng, 4).with_latency(1e-4 * seed)
    M = 6
    order = spp.device_order(cl)
    tables = spp.prm_tables(cl, order)
    res = spp.prm(prof, tables, M, 4.0, 4, check_memory=False)
    for S in range(1, 5):
        brute = min((spp.prm_objective(p, prof, cl, M) for p in _run_plans(order, prof.num_blocks, S)), default=math.inf)
        dp_best = float(res.W[S - 1][0].min())
        assert dp_best == pytest.approx(brute, rel=1e-9), S
        # and the unwound plan achieves the DP value
        a, r = np.unravel_index(int(np.argmin(res.W[S - 1][0])), res.W[S - 1][0].shape)
        stages = spp.prm_stages(res, tables, S, int(a), int(r) + 1)
        assert spp.prm_objective(Plan(tuple(stages), M), prof, cl, M) == pytest.approx(dp_best, rel=1e-9)


def _all_plans(V: int, L: int):
    """Every plan on any ordered choice of disjoint device groups (not only runs of an order)."""
    devices = list(range(V))
    for S in range(1, min(V, L) + 1):
        for cuts in itertools.combinations(range(1, L), S - 1):
            bounds = [0, *cuts, L]
            labels_iter = itertools.product(range(S + 1), repeat=V)  # 0 = unused, k = stage k
            for labels in labels_iter:
                groups = [tuple(d for d in devices if labels[d] == k + 1) for k in range(S)]
                if any(not g for g in groups):
                    continue
                yield Plan(tuple(Stage(bounds[k], bounds[k + 1], groups[k]) for k in range(S)), 1)


def true_load(plan: Plan, prof: Profile, cl: Cluster, M: int) -> float:
    """Largest resource load of a plan under the simulator's costs: any schedule takes at least this."""
    worst = 0.0
    for j, s in enumerate(plan.stages):
        best_ring = max(cl.ring_bandwidth(perm) for perm in itertools.permutations(s.devices)) if s.replicas > 1 else math.inf
        ar = 2 * (s.replicas - 1) / s.replicas * prof.param_bytes(s.first, s.last) / best_ring if s.replicas > 1 else 0.0
        worst = max(worst, M * prof.compute_time(s.first, s.last) / s.replicas + ar)
        if j + 1 < len(plan.stages):
            nxt = plan.stages[j + 1].devices
            worst = max(worst, M * boundary_time(cl, s.devices, nxt, prof.boundary_bytes(s.last)))
            worst = max(worst, M * boundary_time(cl, nxt, s.devices, prof.boundary_bytes(s.last)))
    return worst


@pytest.mark.parametrize("seed,M", [(3, 2), (4, 4), (5, 8), (6, 3)])
def test_spp_within_proven_bound_of_enumerated_optimum(seed: int, M: int) -> None:
    rng = np.random.default_rng(seed)
    V, L = 3, 4
    prof = random_profile(rng, L, act_scale=float(rng.choice([1e5, 3e6])))
    cl = random_cluster(rng, V)
    plan = spp.plan_spp(prof, cl, opts(M))
    t = simulate(plan, prof, cl).iteration_s
    # W* lower-bounds the optimum of every plan and every schedule (enumerated over all plans).
    w_star = min(true_load(p, prof, cl, M) for p in _all_plans(V, L))
    order = spp.device_order(cl)
    res = spp.prm(prof, spp.prm_tables(cl, order), M, 4.0, V, check_memory=False)
    w_prm = min(float(w[0].min()) for w in res.W)
    assert w_prm >= w_star * (1 - 1e-9)
    phi = w_prm / w_star - 1.0
    bound = (2 + (4 * V - 4) / M) * (1 + phi)
    assert t <= bound * w_star * (1 + 1e-9), (t / w_star, bound)


@pytest.mark.parametrize("latency", [0.0, 2e-4])
def test_spp_pe_replays_the_simulator_with_replicas(latency: float) -> None:
    rng = np.random.default_rng(7)
    prof = random_profile(rng, 6)
    cl = heterogeneous_servers([2, 2, 2], [100, 60, 80], 10).with_latency(latency)
    stages = (Stage(0, 2, (0, 1)), Stage(2, 5, (2,)), Stage(5, 6, (3, 4, 5)))
    for kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE):
        for sliced in (0, 2):
            plan = Plan(stages, 5, kind, sliced)
            assert scoring.estimate(plan, prof, cl) == pytest.approx(simulate(plan, prof, cl).iteration_s, rel=1e-9)


def test_rdo_keeps_servers_together() -> None:
    cl = heterogeneous_servers([3, 3, 2], [120, 100, 150], 10)
    order = spp.device_order(cl)
    node = [cl.devices[d].node for d in order]
    # each server's devices are consecutive in the order
    assert sum(1 for a, b in zip(node, node[1:]) if a != b) == 2


# -------------------------------------------------------------------------------------- DAPPLE
def _dapple_brute(prof: Profile, cl: Cluster, M: int) -> float:
    servers = list(cl.nodes().values())
    types = dapple_placement.server_types(cl, servers)
    L = prof.num_blocks
    best = math.inf

    def rec(first: int, occ: tuple[int, ...], last: tuple[int, ...], stages: list[Stage]) -> None:
        nonlocal best
        for end in range(first + 1, L + 1):
            for m in range(1, cl.size + 1):
                for pol in dapple_placement.POLICIES:
                    got = dapple_placement.allocate(servers, occ, last, m, pol, types)
                    if got is None:
                        continue
                    nocc, group = got
                    st = [*stages, Stage(first, end, group)]
                    if end == L:
                        best = min(best, dapple.dp_objective(Plan(tuple(st), M), prof, cl, M))
                    else:
                        rec(end, nocc, group, st)

    rec(0, tuple(0 for _ in servers), (), [])
    return best


@pytest.mark.parametrize("seed,layout", [(0, (2, 2)), (1, (2, 2)), (2, (3, 2)), (3, (1, 1, 1))])
def test_dapple_dp_equals_brute_force(seed: int, layout: tuple[int, ...]) -> None:
    rng = np.random.default_rng(seed)
    prof = random_profile(rng, 4, act_scale=3e6)
    cl = heterogeneous_servers(list(layout), [float(x) for x in rng.uniform(50, 150, len(layout))], 10).with_latency(5e-5 * seed)
    M = 4
    dp = dapple.solve(prof, cl, opts(M, check_memory=False, dapple_beam=0))
    L = prof.num_blocks
    dp_best = min(float(b[L]) for b in dp.best)
    assert dp_best == pytest.approx(_dapple_brute(prof, cl, M), rel=1e-9)
    k = int(np.argmin([b[L] for b in dp.best]))
    plan = Plan(tuple(dapple_placement.unwind(dp, k, L)), M)
    assert dapple.dp_objective(plan, prof, cl, M) == pytest.approx(dp_best, rel=1e-9)


def test_dapple_latency_matches_simulator_for_a_balanced_pipeline() -> None:
    blocks = tuple(Block(f"b{i}", 1e-3, 2e-3, 0.0, 1e6) for i in range(8))
    prof = Profile("uniform", blocks)
    cl = flat(4, 10)
    plan = straight_plan([0, 2, 4, 6, 8], 8)
    # (M + S - 1)(F + B) with no transfers and no replicas
    assert dapple.latency(plan, prof, cl) == pytest.approx((8 + 3) * 6e-3)
    assert simulate(plan, prof, cl).iteration_s == pytest.approx((8 + 3) * 6e-3)


def test_dapple_policies_differ() -> None:
    servers = [[0, 1, 2, 3], [4, 5, 6, 7]]
    occ, last = (2, 0), (0, 1)
    assert dapple_placement.allocate(servers, occ, last, 2, "fresh_first") == ((2, 2), (4, 5))
    assert dapple_placement.allocate(servers, occ, last, 2, "append_first") == ((4, 0), (2, 3))
    assert dapple_placement.allocate(servers, occ, last, 2, "scatter_first") == ((3, 1), (2, 4))


# ------------------------------------------------------------------------------------ AutoPipe
@pytest.mark.parametrize("seed,n,p", [(0, 7, 3), (1, 8, 4), (2, 6, 6), (3, 9, 2)])
def test_autopipe_algorithm1_equals_brute_force(seed: int, n: int, p: int) -> None:
    w = np.random.default_rng(seed).uniform(0.1, 1.0, n)
    cuts, value = autopipe.balanced_partition(w, p)
    brute = min(max(w[a:b].sum() for a, b in zip((0, *c), (*c, n))) for c in itertools.combinations(range(1, n), p - 1))
    assert value == pytest.approx(brute)
    assert len(cuts) == p + 1 and max(w[a:b].sum() for a, b in zip(cuts, cuts[1:])) == pytest.approx(brute)


def test_autopipe_slicing_reaches_ir_and_simulator_and_helps() -> None:
    blocks = tuple(Block(f"b{i}", 2e-3, 4e-3, 1e5, 1e6) for i in range(8))
    prof = Profile("uniform", blocks)
    cl = flat(8, 100)
    sliced = Plan(straight_plan(list(range(9)), 4).stages, 4, ScheduleKind.ONE_F_ONE_B, 3)
    sched = lower(sliced)
    parts = {a.part for acts in sched.programs.values() for a in acts if a.kind.is_compute}
    assert parts == {0, 1, 2}
    t_sliced = simulate(sliced, prof, cl).iteration_s
    assert scoring.estimate(sliced, prof, cl) == pytest.approx(t_sliced)
    assert t_sliced < simulate(straight_plan(list(range(9)), 4), prof, cl).iteration_s
    plan = autopipe.plan_autopipe(prof, cl, opts(4))
    assert plan.sliced_microbatches > 0


def test_autopipe_sublayer_blocks_balance_better() -> None:
    rng = np.random.default_rng(5)
    prof = random_profile(rng, 6)
    fine = autopipe.split_transformer_layers(prof)
    assert fine.num_blocks == 12 and fine.total_compute_s == pytest.approx(prof.total_compute_s)
    coarse_w = [b.forward_s + b.backward_s for b in prof.blocks]
    fine_w = [b.forward_s + b.backward_s for b in fine.blocks]
    assert autopipe.balanced_partition(fine_w, 4)[1] <= autopipe.balanced_partition(coarse_w, 4)[1] + 1e-15
    plan = autopipe.plan_autopipe(fine, flat(4, 10), opts(8))
    assert plan.num_blocks == 12


# ------------------------------------------------------------------------------ 2BW, interleave
def test_2bw_respects_double_buffered_memory() -> None:
    prof = Profile("big", tuple(Block(f"b{i}", 1e-3, 2e-3, 1e6, 2e9) for i in range(8)))
    cl = flat(8, 100, memory_bytes=12e9)  # 2 blocks need 2·2e9·(4+1)=20e9 > 12e9: only 1 block per device fits
    plan = get_planner("2bw").fn(prof, cl, opts(8))
    for s in plan.stages:
        assert prof.param_bytes(s.first, s.last) * 5 <= 12e9
    with pytest.raises(UserError):
        get_planner("2bw").fn(prof, flat(4, 100, memory_bytes=12e9), opts(8))


def test_interleaving_picks_more_chunks_when_bubbles_dominate() -> None:
    prof = Profile("u", tuple(Block(f"b{i}", 1e-3, 2e-3, 1e3, 1e6) for i in range(16)))
    cl = flat(4, 100)
    base = straight_plan([0, 4, 8, 12, 16], 4)
    best = best_interleaving(base, prof, cl, opts(4))
    assert best.virtual_chunks > 1
    assert simulate(best, prof, cl).iteration_s < simulate(base, prof, cl).iteration_s
    odd = straight_plan([0, 4, 8, 12, 16], 5)  # 5 is not a multiple of 4: Megatron's rule
    assert best_interleaving(odd, prof, cl, opts(5)) is odd


# ----------------------------------------------------------------------------------- auto, misc
@pytest.mark.parametrize("seed", [0, 1])
def test_auto_is_never_worse_than_any_planner(seed: int) -> None:
    rng = np.random.default_rng(seed)
    prof = random_profile(rng, 10)
    cl = two_level(2, 3, 100, 10)
    o = opts(6)
    auto = run_planner("auto", prof, cl, o)
    assert auto.plan.algorithm.startswith("auto:")
    for name in ("even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw"):
        single = run_planner(name, prof, cl, o)
        assert auto.iteration_time_s <= single.iteration_time_s * (1 + 1e-12), name


@pytest.mark.parametrize("name", ["spp", "dapple", "autopipe", "2bw", "auto"])
def test_clear_error_when_nothing_fits(name: str) -> None:
    prof = Profile("huge", tuple(Block(f"b{i}", 1e-3, 2e-3, 1e6, 5e9) for i in range(4)))
    cl = flat(2, 10, memory_bytes=8e9)
    with pytest.raises(UserError, match="fit"):
        run_planner(name, prof, cl, opts(4))


@pytest.mark.parametrize("name", ["spp", "dapple", "autopipe", "2bw"])
def test_plans_fit_memory_and_carry_objective(name: str) -> None:
    rng = np.random.default_rng(11)
    prof = random_profile(rng, 12, param_scale=3e8)
    cl = two_level(2, 4, 100, 10, memory_bytes=6e9)
    res = run_planner(name, prof, cl, opts(8))
    assert res.objective_s is not None and res.objective_s > 0
    assert max(res.sim.peak_memory_bytes.values()) <= 6e9


@pytest.mark.skipif(not BERT24.exists(), reason="../shared profiles not available")
def test_spp_scenario_bert24_runs_and_auto_is_best() -> None:
    from orchestrator.core.profile_loader import load_profile

    prof = load_profile(BERT24)
    rng = np.random.default_rng(0)
    intra = list(rng.uniform(96, 128, 3)) + list(rng.uniform(160, 200, 5))
    cl = heterogeneous_servers([4] * 8, intra, rng.uniform(32, 40))
    o = opts(32)
    times = {n: run_planner(n, prof, cl, o).iteration_time_s for n in ("spp", "pipedream")}
    assert times["spp"] <= times["pipedream"] * 1.05


# ------------------------------------------------------------------- planning-speed invariants
@pytest.mark.parametrize("seed,layout,M", [(0, (2, 2), 4), (1, (3, 2), 8), (2, (2, 2, 2), 6), (3, (4, 4), 16)])
def test_dapple_pruned_scoring_picks_the_best_final_state(seed: int, layout: tuple[int, ...], M: int) -> None:
    """plan_dapple stops scoring final states once M·(DP value) exceeds the best latency (L ≥ M·v);
    it must pick the same latency as scoring every final state."""
    rng = np.random.default_rng(seed)
    prof = random_profile(rng, 7, act_scale=3e6)
    cl = heterogeneous_servers(list(layout), [float(x) for x in rng.uniform(50, 150, len(layout))], 10).with_latency(2e-5 * seed)
    o = opts(M, check_memory=False)
    dp = dapple.solve(prof, cl, o)
    L = prof.num_blocks
    every = []
    for k in range(len(dp.keys)):
        if np.isfinite(dp.best[k][L]):
            plan = Plan(tuple(dapple_placement.unwind(dp, k, L)), M)
            lat = dapple.latency(plan, prof, cl)
            assert lat >= M * float(dp.best[k][L]) * (1 - 1e-9)  # the bound the pruning relies on
            every.append(lat)
    got = dapple.plan_dapple(prof, cl, o)
    assert got.objective_s == pytest.approx(min(every), rel=1e-12)
    assert dapple.latency(got, prof, cl) == pytest.approx(min(every), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_auto_bounds_bracket_the_simulator(seed: int) -> None:
    """auto prunes with the group mode's plan_lower_bound (≤ simulated time) and accepts variants by
    the group mode's time (≥ simulated time; equal when a stage's replicas are alike) — on every planner's plan
    and its interleaved variants, with latency, replicas and heterogeneous links."""
    from orchestrator.costmodel.group_sim import plan_lower_bound, simulate_groups
    from orchestrator.costmodel.simulator import SimOptions
    from orchestrator.planners.interleaving import candidate_chunks, interleaved_plan
    from orchestrator.costmodel.simulator import memory_error

    rng = np.random.default_rng(seed)
    prof = random_profile(rng, 12, act_scale=float(rng.choice([1e5, 3e6, 3e7])))
    layouts = [two_level(2, 3, 100, 10), heterogeneous_servers([2, 3, 2], [100, 60, 80], 10), flat(4, 10)]
    cl = layouts[seed % 3].with_latency(float(rng.choice([0.0, 1e-4])))
    M = int(rng.choice([4, 6, 8]))
    for name in ("even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw"):
        try:
            base = get_planner(name).fn(prof, cl, opts(M, check_memory=False))
        except UserError:
            continue
        for v in candidate_chunks(base, prof):
            plan = base if v == 1 else interleaved_plan(base, prof, v)
            res = simulate(plan, prof, cl)
            grouped = simulate_groups(plan, prof, cl, SimOptions(state_factor=4.0))
            t, fits = grouped.iteration_s, grouped.fits
            assert plan_lower_bound(plan, prof, cl) <= res.iteration_s
            assert t >= res.iteration_s * (1 - 1e-12)
            assert t == pytest.approx(res.iteration_s, rel=1e-9)  # alike replicas: exact
            assert fits == (memory_error(res, cl) is None)


@pytest.mark.parametrize(
    "seed,cluster,M,kw",
    [
        (2, "het", 8, {}),
        (3, "flat", 4, {}),
        (4, "two", 12, {"max_stages": 3}),
        (5, "het-lat", 6, {}),
        (6, "two", 8, {"straight": True}),
        (7, "tight", 8, {}),
    ],
)
def test_auto_is_never_worse_than_any_planner_more_settings(seed: int, cluster: str, M: int, kw: dict[str, object]) -> None:
    rng = np.random.default_rng(seed)
    prof = random_profile(rng, 14, param_scale=3e8 if cluster == "tight" else 4e7)
    cl = {
        "het": heterogeneous_servers([2, 3, 2], [100, 60, 80], 10),
        "flat": flat(5, 10),
        "two": two_level(2, 4, 100, 10),
        "het-lat": heterogeneous_servers([3, 3], [120, 40], 5).with_latency(2e-4),
        "tight": two_level(2, 4, 100, 10, memory_bytes=6e9),
    }[cluster]
    o = opts(M, **kw)
    auto = run_planner("auto", prof, cl, o)
    assert auto.plan.algorithm.startswith("auto:")
    assert auto.objective_s is not None and auto.objective_s >= auto.iteration_time_s * (1 - 1e-9)
    for name in ("even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw"):
        try:
            single = run_planner(name, prof, cl, o)
        except UserError:
            continue
        assert auto.iteration_time_s <= single.iteration_time_s * (1 + 1e-12), name


# ------------------------------------------------------------------------- SPP planning speed
def _prm_dense_reference(profile: Profile, tables: spp.PRMTables, M: int, state_factor: float, max_stages: int, check_memory: bool = True) -> list[np.ndarray]:
    """PRM in the dense [l, l', a, r] formulation (the pre-pair-layout code): W tables only."""
    INF = np.inf
    L, V = profile.num_blocks, len(tables.order)
    fb = profile.prefix("forward_s") + profile.prefix("backward_s")
    pp, st = profile.prefix("param_bytes"), profile.prefix("stash_bytes")
    acts = np.array([profile.boundary_bytes(k) for k in range(L + 1)])
    li, lj = np.arange(L)[:, None], np.arange(L + 1)[None, :]
    ok = lj > li
    comp = np.where(ok, fb[lj] - fb[li], INF)
    par = np.where(ok, pp[lj] - pp[li], 0.0)
    sta = np.where(ok, st[lj] - st[li], 0.0)
    rr = np.arange(1, V + 1, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_unit = comp[:, :, None, None] / (rr[None, None, None, :] * tables.smin[None, None, :, :])
        ar = all_reduce_time(rr[None, None, None, :], par[:, :, None, None], tables.ring[None, None, :, :])
        load = M * per_unit + np.nan_to_num(ar, nan=0.0)
        load = np.where(tables.valid[None, None] & ok[:, :, None, None], load, INF)
        if check_memory:
            spare = tables.mem[None, None] - state_factor * par[:, :, None, None]
            kmax = np.where(sta[:, :, None, None] > 0, spare * rr[None, None, None, :] / np.where(sta > 0, sta, 1.0)[:, :, None, None], INF)
            kmax = np.nan_to_num(np.where(spare < 0, -INF, kmax), nan=-INF, posinf=INF)
        else:
            kmax = np.full(load.shape, INF)
        rmax = np.maximum(rr[:, None], rr[None, :])
        comm = np.nan_to_num(M * transfer_time(acts[:, None, None, None], 1.0 / (rmax[None, None] * tables.pair[None]), tables.latency), nan=INF)
    a_idx = np.arange(V)[:, None] + np.arange(1, V + 1)[None, :]
    a_ok = a_idx < V
    a_clip = np.where(a_ok, a_idx, 0)
    W = [np.where(kmax[:, L] >= 1, load[:, L], INF)]
    for j in range(2, min(max_stages, L, V) + 1):
        g = np.where(a_ok[None, :, :, None], W[-1][:, a_clip, :], INF)  # [l', a, r, r']
        h = np.min(np.maximum(g, comm[:L]), axis=3)  # [l' < L, a, r]
        stage = np.where(kmax >= min(j, M), load, INF)  # [l, l', a, r]
        w = np.min(np.maximum(stage[:, 1:L], h[None, 1:]), axis=1)
        W.append(w)
        if not np.isfinite(w).any():
            break
    return W


@pytest.mark.parametrize("seed", range(8))
def test_prm_pair_layout_equals_dense_formulation(seed: int) -> None:
    """The pair-layout PRM (only existing runs, blocked relaxations, in-place tables) computes
    bit-for-bit the W tables of the dense formulation, with memory limits that change with the stage
    count, replication forbidden (straight), latency and a stage cap."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(4, 13))
    prof = random_profile(rng, L, act_scale=float(rng.choice([1e5, 3e7, 3e8])), param_scale=float(rng.choice([4e7, 3e8])))
    need = sum(b.param_bytes for b in prof.blocks) * 4
    cl = two_level(int(rng.integers(1, 4)), int(rng.integers(2, 5)), 100, 10, memory_bytes=float(need * rng.uniform(0.2, 1.5)))
    if seed % 2:
        cl = random_cluster(rng, int(rng.integers(3, 9)), memory=float(need * rng.uniform(0.2, 1.5))).with_latency(1e-4)
    M = int(rng.choice([2, 4, 8, 16]))
    tables = spp.prm_tables(cl, spp.device_order(cl))
    if seed % 4 == 3:
        tables.valid[:, 1:] = False
    max_stages = cl.size if seed % 3 else 3
    for check in (True, False):
        got = spp.prm(prof, tables, M, 4.0, max_stages, check).W
        ref = _prm_dense_reference(prof, tables, M, 4.0, max_stages, check)
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("seed", range(6))
def test_spp_pe_lower_bound_holds(seed: int) -> None:
    """plan_spp skips a queue or a plan when scoring.pe_lower_bound (with or without transfers) already
    reaches the incumbent: it must never exceed PE's makespan."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        L, V = int(rng.integers(2, 10)), int(rng.integers(2, 7))
        prof = random_profile(rng, L, act_scale=float(rng.choice([1e5, 3e6, 3e7])))
        cl = random_cluster(rng, V).with_latency(float(rng.choice([0.0, 1e-4, 1e-3])))
        S = int(rng.integers(1, min(L, V) + 1))
        cuts = [0, *sorted(int(c) for c in rng.choice(np.arange(1, L), S - 1, replace=False)), L]
        reps = [1] * S
        for _ in range(int(rng.integers(0, V - S + 1))):
            reps[int(rng.integers(S))] += 1
        devs, pos, stages = [int(d) for d in rng.permutation(V)], 0, []
        for k in range(S):
            stages.append(Stage(cuts[k], cuts[k + 1], tuple(devs[pos : pos + reps[k]])))
            pos += reps[k]
        M = int(rng.integers(1, 10))
        sliced = int(rng.integers(0, M + 1)) if rng.random() < 0.3 else 0
        for kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE):
            plan = Plan(tuple(stages), M, kind, sliced)
            costs = scoring.plan_costs(plan, prof, cl)
            fr = scoring.unit_fractions(M, sliced)
            t = scoring.estimate(plan, prof, cl)
            assert scoring.pe_lower_bound(costs, fr) <= t
            load_bound, partial = scoring.compute_costs(plan, prof, cl)
            assert scoring.pe_lower_bound(partial, fr) <= t
            assert load_bound <= t * (1 + 1e-12)  # the unchanged load-bound rule (exact up to rounding)


@pytest.mark.parametrize("seed,cluster", [(0, "rand"), (1, "two"), (2, "het"), (3, "tight"), (4, "rand"), (5, "two")])
def test_spp_pruned_scoring_equals_scoring_every_candidate(seed: int, cluster: str) -> None:
    """plan_spp prunes PRM's per-stage-count candidates and queues by lower bounds; its makespan
    must equal the best PE makespan over every candidate and every queue that fits memory."""
    rng = np.random.default_rng(seed)
    prof = random_profile(rng, 10, act_scale=float(rng.choice([1e5, 3e6, 3e7])), param_scale=3e8 if cluster == "tight" else 4e7)
    cl = {
        "rand": random_cluster(rng, 6).with_latency(1e-4),
        "two": two_level(2, 4, 100, 10),
        "het": heterogeneous_servers([2, 3, 2], [100, 60, 80], 10),
        "tight": two_level(2, 4, 100, 10, memory_bytes=6e9),
    }[cluster]
    o = opts(8)
    got = spp.plan_spp(prof, cl, o)
    tables = spp.prm_tables(cl, spp.device_order(cl))
    res = spp.prm(prof, tables, 8, o.state_factor, cl.size, o.check_memory)
    every = []
    for S in range(1, len(res.W) + 1):
        w0 = res.W[S - 1][0]
        if not np.isfinite(w0).any():
            continue
        a, ri = np.unravel_index(int(np.argmin(w0)), w0.shape)
        stages = tuple(spp.prm_stages(res, tables, S, int(a), int(ri) + 1))
        for kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE):
            plan = Plan(stages, 8, kind)
            if scoring.plan_fits_memory(plan, prof, cl, o):
                every.append(scoring.estimate(plan, prof, cl))
    assert got.objective_s == pytest.approx(min(every), rel=1e-12)


def test_device_order_cache_hands_out_copies() -> None:
    cl = heterogeneous_servers([3, 3, 2], [120, 100, 150], 10)
    first = spp.device_order(cl)
    first.reverse()
    assert spp.device_order(cl) == spp._device_order(np.array(cl.bandwidth, dtype=np.float64))
    assert spp.device_order(cl) != first
