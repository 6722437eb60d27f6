"""The simulator's group-level mode, the bounds built on it, and planning on large regular clusters.

* ``simulate_groups`` is exact (equal to the full simulator) whenever it says so, an upper bound
  otherwise, and its ``lower=True`` mode and ``plan_lower_bound`` never exceed the simulator — on
  random plans with replication (equal and unequal replica counts), heterogeneous speeds,
  latency, slicing, GPipe, 1F1B and interleaving; its memory verdict is the simulator's.
* Replicated pipelines on identical servers (the plans ``hierarchy`` builds) are exact in the
  group mode, so scoring a 1024-GPU plan does not need a per-device simulation.
* ``auto`` on a cluster of identical servers through the hierarchical search stays within 5% of the
  full search (simulated), and ``evaluate`` gives the full simulator's numbers through the group mode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.core.cluster import GBPS, Cluster, Device, heterogeneous_servers, two_level
from orchestrator.core.errors import UserError
from orchestrator.costmodel.group_sim import plan_lower_bound, simulate_groups
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.planners import auto, base, hierarchy
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.costmodel.simulator import SimOptions, memory_error, simulate
from tests.helpers import random_profile


def random_plan(rng: np.random.Generator, L: int, n: int, M: int) -> Plan:
    p = int(rng.integers(1, min(4, n, L) + 1))
    devices = rng.permutation(n)
    sizes = rng.multinomial(n - p, [1 / p] * p) + 1 if rng.random() < 0.6 else np.ones(p, dtype=int)
    groups, at = [], 0
    for k in sizes:
        groups.append(tuple(int(d) for d in devices[at : at + k]))
        at += k
    v = 1
    if p > 1 and M % p == 0 and rng.random() < 0.3 and 2 * p <= L:
        v = 2
    cuts = [0, *sorted(rng.choice(np.arange(1, L), p * v - 1, replace=False).tolist()), L]
    stages = tuple(Stage(cuts[i], cuts[i + 1], groups[i % p]) for i in range(p * v))
    if v > 1:
        return Plan(stages, M, ScheduleKind.INTERLEAVED)
    kind = ScheduleKind.GPIPE if rng.random() < 0.5 else ScheduleKind.ONE_F_ONE_B
    return Plan(stages, M, kind, int(rng.integers(0, M + 1)) if rng.random() < 0.4 else 0)


def random_cluster(rng: np.random.Generator, n: int, alike: bool) -> Cluster:
    if alike:
        return two_level(n // 2, 2, 100, float(rng.uniform(5, 40)), memory_bytes=8 * 2**30).with_latency(float(rng.choice([0.0, 1e-4])))
    bw = rng.uniform(2, 50, size=(n, n)) * GBPS
    bw = (bw + bw.T) / 2
    np.fill_diagonal(bw, 0.0)
    speeds = rng.uniform(0.5, 1.5, size=n)
    return Cluster(tuple(Device(i, f"n{i}", float(speeds[i]), 8 * 2**30) for i in range(n)), bw, float(rng.choice([0.0, 1e-3])))


@pytest.mark.parametrize("seed", range(40))
def test_group_mode_brackets_and_matches_the_simulator(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([2, 4, 6, 8]))
    L, M = int(rng.integers(4, 10)), int(rng.choice([2, 4, 6]))
    profile = random_profile(L, seed)
    cluster = random_cluster(rng, n, alike=seed % 2 == 0)
    plan = random_plan(rng, L, n, M)
    opts = SimOptions(state_factor=4.0)
    full = simulate(plan, profile, cluster, opts)
    up = simulate_groups(plan, profile, cluster, opts)
    low = simulate_groups(plan, profile, cluster, opts, lower=True)
    t = full.iteration_s
    assert plan_lower_bound(plan, profile, cluster) <= t * (1 + 1e-9)
    assert low.iteration_s <= t * (1 + 1e-9)
    assert up.iteration_s >= t * (1 - 1e-9)
    if up.exact:
        assert up.iteration_s == pytest.approx(t, rel=1e-9)
        assert low.iteration_s == pytest.approx(t, rel=1e-9)
        mine = up.as_sim_result(plan)
        for d in plan.devices:
            assert mine.busy_s[d] == pytest.approx(full.busy_s[d], rel=1e-9)
    assert up.fits == (memory_error(full, cluster) is None)


def test_group_mode_is_exact_for_replicated_pipelines_on_identical_servers() -> None:
    profile = random_profile(12, 3)
    cluster = two_level(4, 4, 200, 25, memory_bytes=64 * 2**30).with_latency(2e-5)
    order = hierarchy.regular_servers(cluster)
    assert order is not None
    for g, cuts, widths in ((4, [0, 5, 12], [2, 2]), (8, [0, 3, 6, 9, 12], [2, 2, 2, 2]), (2, [0, 12], [2])):
        R = cluster.size // g
        start = [sum(widths[:i]) for i in range(len(widths))]
        base_plan = Plan(tuple(Stage(cuts[i], cuts[i + 1], tuple(range(start[i], start[i] + widths[i]))) for i in range(len(widths))), 8)
        for kind, sliced in ((ScheduleKind.ONE_F_ONE_B, 0), (ScheduleKind.GPIPE, 3)):
            plan = Plan(hierarchy.replicate(base_plan, order, g, R), 8, kind, sliced)
            grouped = simulate_groups(plan, profile, cluster)
            assert grouped.exact
            assert grouped.iteration_s == pytest.approx(simulate(plan, profile, cluster).iteration_s, rel=1e-9)


def test_irregular_clusters_are_not_taken_for_regular() -> None:
    assert hierarchy.regular_servers(two_level(4, 4, 100, 10)) is not None
    assert hierarchy.regular_servers(two_level(4, 4, 100, 10, speeds=[1.0] * 15 + [2.0])) is None
    assert hierarchy.regular_servers(heterogeneous_servers([2, 2], [100, 50], 10)) is None  # one slower server
    assert hierarchy.regular_servers(heterogeneous_servers([2, 4], [100, 100], 10)) is None  # unequal servers


@pytest.mark.parametrize("seed,servers,per,M,scale", [(0, 4, 4, 8, 0.05), (1, 8, 2, 8, 0.05), (2, 4, 4, 16, 0.1), (3, 4, 4, 8, 0.02)])
def test_hierarchical_auto_is_within_5_percent_of_the_full_search(seed: int, servers: int, per: int, M: int, scale: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compute small against the gradient all-reduce, so the best plans pipeline (4–8 stages)."""
    profile = random_profile(16, seed, act_scale=5e7).scaled(scale)
    cluster = two_level(servers, per, 200, 20, memory_bytes=16 * 2**30)
    opts = PlannerOptions(num_microbatches=M)
    full = run_planner("auto", profile, cluster, opts)
    monkeypatch.setattr(auto, "FULL_SEARCH_DEVICES", 4)
    fast = run_planner("auto", profile, cluster, opts)
    assert len(full.plan.stages) > 1
    assert "@" in fast.plan.algorithm or "hier:" in fast.plan.algorithm, fast.plan.algorithm
    assert fast.iteration_time_s <= full.iteration_time_s * 1.05, (fast.plan.describe(), full.plan.describe())


def test_evaluate_uses_the_exact_group_mode_on_large_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = random_profile(12, 5)
    cluster = two_level(4, 4, 200, 25, memory_bytes=64 * 2**30)
    order = hierarchy.regular_servers(cluster)
    assert order is not None
    sub = Plan((Stage(0, 6, (0, 1)), Stage(6, 12, (2, 3))), 8)
    plan = Plan(hierarchy.replicate(sub, order, 4, 4), 8)
    opts = PlannerOptions(num_microbatches=8)
    monkeypatch.setattr(base, "GROUP_EVAL_DEVICES", 8)
    grouped = base.evaluate(plan, profile, cluster, opts)
    full = simulate(plan, profile, cluster, opts.sim_options)
    assert grouped.events == () and full.events
    assert grouped.iteration_s == pytest.approx(full.iteration_s, rel=1e-9)
    for d in plan.devices:
        assert grouped.peak_memory_bytes[d] == pytest.approx(full.peak_memory_bytes[d], rel=1e-9)
        assert grouped.bubble_fraction[d] == pytest.approx(full.bubble_fraction[d], rel=1e-9, abs=1e-12)


def test_auto_plans_256_gpus_as_a_replicated_pipeline() -> None:
    profile = random_profile(24, 7, act_scale=5e7)
    cluster = two_level(32, 8, 600, 100, memory_bytes=80 * 2**30)
    res = run_planner("auto", profile, cluster, PlannerOptions(num_microbatches=16))
    assert len(res.plan.devices) > auto.FULL_SEARCH_DEVICES
    assert res.sim.events == ()  # scored by the exact group mode
    assert res.iteration_time_s >= res.lower_bound_s


# ------------------------------------------------------------------ memory-aware planners, --schedule
@pytest.mark.parametrize("seed,memf", [(0, 0.3), (1, 0.5), (4, 0.3)])
def test_pipedream_is_memory_aware(seed: int, memf: float) -> None:
    """PipeDream's objective has no memory term: its first plan here needs more than a device has;
    the memory-aware pass returns a plan that fits (and the simulator agrees)."""
    from orchestrator.planners import pipedream

    profile = random_profile(12, seed, act_scale=1e7)
    cluster = two_level(2, 4, 100, 10, memory_bytes=profile.total_param_bytes * 4 * memf)
    opts = PlannerOptions(num_microbatches=8)
    first = pipedream._plan(profile, cluster, opts, None)
    assert memory_error(simulate(first, profile, cluster, opts.sim_options), cluster) is not None
    res = run_planner("pipedream", profile, cluster, opts)  # run_planner refuses a plan that does not fit
    assert memory_error(res.sim, cluster) is None


def test_pipedream_says_so_in_one_line_when_nothing_fits() -> None:
    profile = random_profile(6, 1)
    cluster = two_level(1, 2, 100, 10, memory_bytes=profile.param_bytes(0, 1) * 2)
    with pytest.raises(UserError, match="pipedream: no pipeline fits device memory"):
        run_planner("pipedream", profile, cluster, PlannerOptions(num_microbatches=4))


def test_dapple_widens_its_beam_before_giving_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.planners import dapple

    widths: list[int] = []

    def fake(profile: object, cluster: object, options: PlannerOptions) -> Plan:
        widths.append(options.dapple_beam or 0)
        raise UserError("dapple: no pipeline fits device memory")

    monkeypatch.setattr(dapple, "_plan_dapple", fake)
    with pytest.raises(UserError):
        dapple.plan_dapple(random_profile(4, 0), two_level(1, 2, 100, 10), PlannerOptions(num_microbatches=2))
    assert widths == [dapple.DEFAULT_BEAM, dapple.DEFAULT_BEAM * 8, 0]  # 0 = no beam: DAPPLE's whole DP


@pytest.mark.parametrize("name", ["even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw", "auto"])
@pytest.mark.parametrize("kind", list(ScheduleKind))
def test_every_planner_honours_the_asked_schedule(name: str, kind: ScheduleKind) -> None:
    """The plan runs the asked schedule, or the planner says in one line that it cannot (a
    one-stage plan cannot be interleaved)."""
    profile = random_profile(12, 2, act_scale=1e7)
    cluster = two_level(2, 2, 100, 10)
    try:
        res = run_planner(name, profile, cluster, PlannerOptions(num_microbatches=4, schedule=kind))
    except UserError as exc:
        assert kind is ScheduleKind.INTERLEAVED and str(exc).startswith(f"{name}: cannot produce the interleaved schedule")
        assert "\n" not in str(exc)
        return
    assert res.plan.schedule is kind
    if kind is ScheduleKind.INTERLEAVED:
        assert res.plan.virtual_chunks >= 2


def test_a_schedule_a_plan_cannot_run_is_one_line() -> None:
    profile = random_profile(12, 2, act_scale=1e7)
    with pytest.raises(UserError, match="cannot produce the interleaved schedule"):  # M = 3 is no multiple of any depth >= 2 here
        run_planner("even", profile, two_level(1, 2, 100, 10), PlannerOptions(num_microbatches=3, schedule=ScheduleKind.INTERLEAVED))


@pytest.mark.parametrize("kind", [ScheduleKind.GPIPE, ScheduleKind.ZB_H1])
def test_interleaving_another_schedule_is_one_line(kind: ScheduleKind) -> None:
    profile = random_profile(12, 2, act_scale=1e7)
    with pytest.raises(UserError, match=f"^even: cannot interleave the {kind.value} schedule"):
        run_planner("even", profile, two_level(1, 2, 100, 10), PlannerOptions(num_microbatches=4, schedule=kind, interleave=True))


def test_large_cluster_search_respects_straight_and_max_stages() -> None:
    profile = random_profile(24, 9, act_scale=5e7)
    cluster = two_level(16, 8, 600, 100, memory_bytes=80 * 2**30)
    res = run_planner("auto", profile, cluster, PlannerOptions(num_microbatches=8, straight=True))
    assert all(s.replicas == 1 for s in res.plan.stages)
    res = run_planner("auto", profile, cluster, PlannerOptions(num_microbatches=8, max_stages=4))
    assert res.plan.num_physical_stages <= 4


def test_more_servers_never_plan_slower_than_fewer() -> None:
    """A 12-block slice of the committed OPT-30B-like profile on servers of 8 GPUs at 100/25 Gb/s: beyond 12
    servers no pipeline is deeper, and copies all-reduce over the slow links, so the best plan leaves servers
    idle. (Before: 0.335 s on 12 servers, 0.650 s on 16, 0.585 s on 32.)"""
    from orchestrator.core.profile import Profile
    from orchestrator.core.profile_loader import load_profile

    full = load_profile(Path(__file__).resolve().parents[1] / "benchmarks" / "profiles" / "opt30-like-100.json")
    profile = Profile("opt30[40:52]", full.blocks[40:52], input_bytes=full.boundary_bytes(40))
    times = [run_planner("auto", profile, two_level(k, 8, 100, 25, memory_bytes=32 * 2**30), PlannerOptions(num_microbatches=64)).iteration_time_s
             for k in (12, 16, 32)]
    assert times[1] <= times[0] * (1 + 1e-9) and times[2] <= times[1] * (1 + 1e-9), times
