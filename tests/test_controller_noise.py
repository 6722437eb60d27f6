"""The controller on real noise: recorded live traces replayed through the simulated pipeline.

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
    ArbiterConfig, Controller, ControllerConfig, FaultSchedule, MonitorConfig, NoiseTrace, SimulatedCosts, SimulatedPipeline, Slowdown,
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
    pipe = SimulatedPipeline(PROFILE, CLUSTER, PLAN, faults, SimulatedCosts(trace=NoiseTrace.load(trace, offset)))
    ctl = Controller(pipe, PROFILE, config)
    plans = []
    try:
        for _ in range(steps):
            ctl.step()
            plans.append(pipe.current_plan())
    finally:
        ctl.close()
    return [r.step for r in ctl.history if r.action in ("move", "path-move")], plans


@pytest.mark.skipif(not TRACES, reason="no recorded noise traces")
@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_no_move_when_nothing_changed(trace: Path) -> None:
    moved = {off: replay(trace, off, NEW)[0] for off in OFFSETS}
    assert all(not m for m in moved.values()), moved
    old = {off: replay(trace, off, OLD)[0] for off in OFFSETS}
    assert any(old.values())  # the fixed band and no noise floor chase this very noise


@pytest.mark.skipif(not TRACES, reason="no recorded noise traces")
def test_slowdown_answered_within_five_iterations() -> None:
    """Pooled over every trace and offset: the median run is within 5% of a fresh re-plan (for
    good) within 5 iterations of the slowdown; at most one run in ten never gets there (the
    recorded load makes iteration times vary by ~17%, more than the 5% asked for)."""
    at = 20
    faults = scenario([Slowdown(1, 2.0, at)])
    truth = faults.conditions(CLUSTER, at).cluster
    fresh = simulate(full_replan(PROFILE, truth, range(4), PLAN, straight=True), PROFILE, truth).iteration_s
    back = []
    for trace in TRACES:
        for off in OFFSETS:
            _, plans = replay(trace, off, NEW, faults)
            ratio = [fresh / simulate(p, PROFILE, truth).iteration_s for p in plans]  # plans[k]: in force for iteration k + 1
            back.append(next((k + 1 - at for k in range(at - 1, len(plans)) if min(ratio[k:]) >= 0.95), 99))
    back.sort()
    assert back[(len(back) - 1) // 2] <= 5, back
    assert sum(b == 99 for b in back) <= len(back) // 10, back
