"""The controller on real noise: recorded live traces replayed through the simulated runtime.

``tests/data/noise_traces`` holds what four Ray stage actors on this machine's two shared cores
reported with nothing changed (``benchmarks/noise_traces.py``): per-iteration speed and link
multipliers with their real size (±25% per sample under load), cross-device correlation and
bursts. Replayed on the live benchmark's model (8 equal blocks, 4 devices), the controller must
make no move when nothing changes, and after a 2x slowdown must reach a plan within 5% of a fresh
re-plan within 5 iterations (live goal of issue 15) — the settings of old, for contrast, chase
the same noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.cluster import flat
from orchestrator.adapt import (
    ArbiterConfig, ControllerConfig, FaultSchedule, MonitorConfig, NoiseTrace, SimulatedCosts, SimulatedJob, SimulatedRuntime, Slowdown,
    full_replan, scenario,
)
from orchestrator.core.plan import Plan, straight_plan
from orchestrator.core.profile import Block, Profile
from orchestrator.costmodel.simulator import simulate

TRACES = sorted((Path(__file__).parent / "data" / "noise_traces").glob("*.json"))
OFFSETS = (0, 8, 16, 24, 32)
WIDTH = 1024
# the live benchmark's MLP: 8 equal blocks of width 1024 (fp32), 32 rows per micro-batch
PROFILE = Profile("mlp8", tuple(Block(f"b{i}", 0.004, 0.008, 4.0 * 32 * WIDTH, 4.0 * WIDTH * WIDTH) for i in range(8)),
                  input_bytes=4.0 * 32 * WIDTH)
CLUSTER = flat(4, 10)
PLAN = straight_plan([0, 2, 4, 6, 8], 8)
OLD = ControllerConfig(straight=True, warmup_iterations=2, moves_per_pause=1, monitor=MonitorConfig(persist=2, noise_z=0.0),
                       arbiter=ArbiterConfig(noise_z=0.0))
NEW = ControllerConfig(straight=True)


def replay(trace: Path, offset: int, config: ControllerConfig, faults: FaultSchedule = FaultSchedule(),
           steps: int = 44) -> tuple[list[int], list[Plan]]:
    """Steps at which the controller moved, and the plan in force after each step."""
    pipe = SimulatedRuntime(PROFILE, CLUSTER, PLAN, faults, SimulatedCosts(trace=NoiseTrace.load(trace, offset)))
    job = SimulatedJob(pipe, config)
    plans = []
    try:
        for _ in range(steps):
            job.fit(1)
            plans.append(pipe.plan)
    finally:
        job.close()
    return [r.step for r in job.records if r.action in ("move", "path-move")], plans


@pytest.mark.skipif(not TRACES, reason="no recorded noise traces")
@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_no_move_when_nothing_changed(trace: Path) -> None:
    moved = {off: replay(trace, off, NEW)[0] for off in OFFSETS}
    assert all(not m for m in moved.values()), moved
    old = {off: replay(trace, off, OLD)[0] for off in OFFSETS}
    assert any(old.values())  # the fixed band and no noise floor chase this very noise


def iterations_to_fresh(costs: SimulatedCosts, device: int, seed: int = 0, at: int = 20) -> int:
    """Iterations from a 2x slowdown of ``device`` (counted from the first slowed iteration) until
    every plan in force is within 5% of a fresh re-plan for the slowed cluster (99: never).
    3 means: the change was confirmed after its third slowed iteration and the first move was right."""
    faults = scenario([Slowdown(device, 2.0, at)])
    truth = faults.conditions(CLUSTER, at).cluster
    fresh = simulate(full_replan(PROFILE, truth, range(4), PLAN, straight=True), PROFILE, truth).iteration_s
    pipe = SimulatedRuntime(PROFILE, CLUSTER, PLAN, faults, costs, seed=seed)
    job = SimulatedJob(pipe, NEW)
    plans = []
    try:
        for _ in range(44):
            job.fit(1)
            plans.append(pipe.plan)
    finally:
        job.close()
    ratio = [fresh / simulate(p, PROFILE, truth).iteration_s for p in plans]  # plans[k]: in force for iteration k + 1
    return next((k + 1 - at for k in range(at - 1, len(plans)) if min(ratio[k:]) >= 0.95), 99)


@pytest.mark.parametrize("device", range(4))
def test_slowdown_answered_within_five_iterations(device: int) -> None:
    """A 2x slowdown of any one of 4 devices is answered with a plan within 5% of a fresh re-plan,
    for good, within 5 iterations of the slowdown — every run, at independent per-sample noise
    up to 8% (a device's noise against the others on the lightly loaded recorded trace: 8-15%)."""
    runs = [iterations_to_fresh(SimulatedCosts(noise=sigma), device, seed) for sigma in (0.03, 0.08) for seed in range(5)]
    assert max(runs) <= 5, runs


@pytest.mark.skipif(not TRACES, reason="no recorded noise traces")
def test_slowdown_answered_within_five_iterations_on_recorded_noise() -> None:
    """The same on the recorded traces of the loaded machine, pooled over the slowed device, the
    traces and ten offsets: most runs within 5 iterations. Not every run: the noisiest recorded
    device swings by 25% per sample against the others (45% before the common mode is taken out)
    and by more than 2x in single samples, and a halving takes longer to tell from that; and a
    first move that is not yet the best plan is corrected only after the moved devices have
    re-learnt their speeds (five iterations; see ``monitor.relearn``). Measured when this was
    written: 58 of 80 runs within 5, median 4 (loaded-a 34 of 40, loaded-b 24 of 40, loaded-b's
    device 2 alone 9 of the 22 others); before the common mode was taken out of the device speeds
    and the noise floor, 20 of 40 runs of devices 1 and 2 (now 26 of 40)."""
    runs = sorted(iterations_to_fresh(SimulatedCosts(trace=NoiseTrace.load(t, off)), device)
                  for device in range(4) for t in TRACES for off in range(0, 40, 4))
    assert runs[(len(runs) - 1) // 2] <= 4, runs
    assert sum(b <= 5 for b in runs) >= 0.7 * len(runs), runs
