"""``auto`` against the exhaustive oracle (tests/oracle.py): optimal for its own simulator.

On small random instances — heterogeneous device speeds, random bandwidth, per-message latency,
memory limits that rule out some plans, 2–4 micro-batches — and on slices of the shared profiles,
the oracle simulates every plan of the space (every partition into 1–4 stages, every placement
with replication and order, GPipe and 1F1B with every slicing count, interleaving) with the full
simulator and keeps the fastest that fits. ``auto`` must find a plan at least that fast, checked by
the full simulator too (it may be faster only through interleavings the oracle does not list).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from orchestrator.core.cluster import GBPS, Cluster, Device
from orchestrator.core.errors import UserError
from orchestrator.core.plan import ScheduleKind
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.core.profile import Block, Profile
from orchestrator.core.profile_loader import load_profile
from tests.helpers import SHARED, random_profile
from tests.oracle import optimum, optimum_by_classes

STATE = 4.0


def random_cluster(rng: np.random.Generator, n: int, profile: Profile, M: int) -> Cluster:
    """Random speeds, bandwidths and latency; memory between 'fits nowhere alone' and 'fits anywhere'."""
    bw = rng.uniform(2, 50, size=(n, n)) * GBPS
    bw = (bw + bw.T) / 2
    np.fill_diagonal(bw, 0.0)
    whole = profile.total_param_bytes * STATE + M * profile.stash_bytes(0, profile.num_blocks)
    memory = whole * float(rng.uniform(0.35, 1.2))
    speeds = rng.uniform(0.5, 1.5, size=n)
    latency = float(rng.choice([0.0, 1e-3]))
    return Cluster(tuple(Device(i, f"n{i // 2}", float(speeds[i]), memory) for i in range(n)), bw, latency)


def check(profile: Profile, cluster: Cluster, M: int, oracle=optimum) -> None:  # type: ignore[no-untyped-def]
    best, plan, count = oracle(profile, cluster, M, STATE)
    opts = PlannerOptions(num_microbatches=M, state_factor=STATE)
    if plan is None:  # nothing fits without recomputation: auto refuses, or recomputes (run_planner checks its memory)
        try:
            got = run_planner("auto", profile, cluster, opts)
        except UserError as exc:
            assert "GiB per GPU" in str(exc), exc  # the refusal names the memory it would need
            return
        assert any(s.recompute for s in got.plan.stages), got.plan.describe()
        return
    got = run_planner("auto", profile, cluster, opts)
    assert got.iteration_time_s <= best * (1 + 1e-9), (
        f"auto {got.iteration_time_s:.6g} s ({got.plan.describe()}) vs optimum {best:.6g} s ({plan.describe()}) over {count} plans"
    )


# (blocks, devices, micro-batches) per seed: 3-device spaces cost ~1 s of oracle, 4-device ~5 s.
# The last one is the edge of the exhaustive space (12 blocks, 4 devices: 55 200 plans, ~20 s for the plain oracle).
RANDOM = [(0, 6, 3, 4), (1, 7, 3, 2), (2, 5, 3, 3), (3, 6, 3, 2), (4, 7, 3, 4), (5, 6, 3, 3), (6, 5, 4, 2), (7, 6, 4, 2), (8, 6, 2, 4), (9, 8, 2, 3), (5, 12, 4, 2)]


@pytest.mark.parametrize("seed,L,n,M", RANDOM)
def test_auto_equals_exhaustive_optimum_random(seed: int, L: int, n: int, M: int) -> None:
    rng = np.random.default_rng(seed if L == 12 else 100 + seed)
    profile = random_profile(L, seed)
    # the 12-block edge goes to the class oracle (the same optimum, checked below; seconds instead of ~20 s)
    check(profile, random_cluster(rng, n, profile, M), M, optimum_by_classes if L == 12 else optimum)


SLICES = [("dapple/profiling_results/bert-24-pbs-6.txt", 3, 6, 3, 4), ("dapple/profiling_results/bert-48-pbs-2.txt", 20, 6, 3, 3), ("pipedream", 0, 6, 4, 2)]


@pytest.mark.parametrize("path,start,L,n,M", SLICES)
def test_auto_equals_exhaustive_optimum_shared_slices(path: str, start: int, L: int, n: int, M: int) -> None:
    root = SHARED / "profiles"
    if not root.exists():
        pytest.skip("../shared is absent")
    if path == "pipedream":
        found = sorted((root / "pipedream").rglob("graph.txt"))
        if not found:
            pytest.skip("no PipeDream profile")
        full = load_profile(found[0])
    else:
        full = load_profile(root / path)
    blocks = full.blocks[start : start + L]
    profile = Profile(f"{full.name}[{start}:{start + L}]", tuple(Block(b.name, b.forward_s, b.backward_s, b.activation_bytes, b.param_bytes, b.stash_bytes) for b in blocks), input_bytes=full.boundary_bytes(start))
    rng = np.random.default_rng(start + L)
    check(profile, random_cluster(rng, n, profile, M), M)


def test_auto_honours_the_asked_schedule_and_stays_optimal_in_it() -> None:
    profile = random_profile(6, 11)
    rng = np.random.default_rng(11)
    cluster = random_cluster(rng, 3, profile, 4)
    start = time.perf_counter()
    got = run_planner("auto", profile, cluster, PlannerOptions(num_microbatches=4, state_factor=STATE, schedule=ScheduleKind.GPIPE))
    assert time.perf_counter() - start < 5
    assert got.plan.schedule is ScheduleKind.GPIPE
    free = run_planner("auto", profile, cluster, PlannerOptions(num_microbatches=4, state_factor=STATE))
    assert free.iteration_time_s <= got.iteration_time_s * (1 + 1e-12)


@pytest.mark.parametrize("seed,M", [(21, 2), (22, 4)])
def test_auto_equals_exhaustive_optimum_on_symmetric_clusters(seed: int, M: int) -> None:
    """Identical devices: ``auto`` times one structure per symmetry class; the oracle times all."""
    from orchestrator.core.cluster import two_level

    profile = random_profile(6, seed)
    whole = profile.total_param_bytes * STATE + M * profile.stash_bytes(0, profile.num_blocks)
    check(profile, two_level(2, 2, 100, 5, memory_bytes=whole * 0.6).with_latency(1e-4), M)


def symmetric_cluster(kind: str, servers: int, per_server: int, memory: float) -> Cluster:
    """``flat``: identical devices on one 25 Gb/s switch; ``two-level``: servers at 100/5 Gb/s;
    ``mixed``: the same, every server after the first half as fast."""
    n = servers * per_server
    server = np.arange(n) // per_server
    if kind == "flat":
        bw = np.full((n, n), 25.0) * GBPS
    else:
        bw = np.where(server[:, None] == server[None, :], 100.0, 5.0) * GBPS
    np.fill_diagonal(bw, 0.0)
    speeds = np.where(server == 0, 1.0, 0.5) if kind == "mixed" else np.ones(n)
    return Cluster(tuple(Device(i, f"n{server[i]}", float(speeds[i]), memory) for i in range(n)), bw, 1e-4)


@pytest.mark.parametrize("kind,seed,L,M,share", [("flat", 31, 5, 3, 0.7), ("two-level", 32, 5, 2, 0.6), ("mixed", 33, 5, 2, 0.5)])
def test_the_class_oracle_equals_the_plain_one(kind: str, seed: int, L: int, M: int, share: float) -> None:
    """One structure per device-class pattern, timed in order of the busiest group's compute:
    the same optimum as timing every plan (what lets the oracle reach 10 blocks × 8 devices)."""
    profile = random_profile(L, seed)
    whole = profile.total_param_bytes * STATE + M * profile.stash_bytes(0, profile.num_blocks)
    cluster = symmetric_cluster(kind, 2, 2, whole * share)
    plain, classes = optimum(profile, cluster, M, STATE), optimum_by_classes(profile, cluster, M, STATE)
    assert plain[0] == classes[0]
    assert classes[2] < plain[2] / 10  # the bound, not luck, made it cheap


@pytest.mark.parametrize("kind,servers,seed,L,M", [("flat", 1, 41, 10, 4), ("two-level", 2, 42, 6, 2), ("mixed", 2, 43, 6, 2)])
def test_auto_equals_the_optimum_on_eight_devices(kind: str, servers: int, seed: int, L: int, M: int) -> None:
    """Issue 28: the optimum up to 10 blocks × 8 devices (up to 8 stages), memory binding."""
    profile = random_profile(L, seed)
    whole = profile.total_param_bytes * STATE + M * profile.stash_bytes(0, profile.num_blocks)
    check(profile, symmetric_cluster(kind, servers, 8 // servers, whole * 0.3), M, optimum_by_classes)


@pytest.mark.parametrize("seed,L,n,M", [(61, 6, 4, 3), (62, 5, 5, 2), (63, 7, 4, 4)])
def test_the_certifying_oracle_finds_the_optimum_and_nothing_under_it(seed: int, L: int, n: int, M: int) -> None:
    """``optimum_below`` (the x8r benchmark's certificate) against the class oracle: under a bar just
    above the optimum it finds the optimum's time; under the optimum itself, nothing."""
    from tests.oracle import optimum_below

    rng = np.random.default_rng(seed)
    profile = random_profile(L, seed)
    cluster = random_cluster(rng, n, profile, M)
    best, plan, _ = optimum_by_classes(profile, cluster, M, STATE)
    assert plan is not None
    got, found, _ = optimum_below(profile, cluster, M, STATE, best * (1 + 1e-6))
    assert found is not None and got == pytest.approx(best, rel=1e-12)
    assert optimum_below(profile, cluster, M, STATE, best * (1 - 1e-9))[1] is None
