"""Adaptive controller benchmark (AutoPipe-Hu scenarios), simulated on the shared real profiles.

Strategies, each the simulated job (:class:`SimulatedJob`) over the same :class:`SimulatedRuntime` (same scenario,
same noise seed):
- ``static``: the initial plan forever;
- ``incremental``: our controller — two-worker live moves chosen by the switch arbiter;
- ``replan``: same monitor and arbiter, but the only option is a full re-plan (PipeDream DP)
  applied by stop-and-restart, charged its restart time (process restart + checkpoint I/O).

Scenarios: inter-node bandwidth 10 → 25 → 40 → 100 Gb/s at iterations 20/40/60; one then two
co-located jobs halving one GPU each at iterations 20/40; a 4-stage pipeline with one stage slowed
2× at iteration 20 (the live demo's targets, measured here in simulation); and the decision time
for a 100-block model. Run: ``python benchmarks/adaptive.py`` (writes results/adaptive.md).

LIVE (``live_slowdown``): the same 4-stage scenario on this machine in the real
:class:`orchestrator.ElasticJob` — four stage actors training an MLP of width 1024 (Adam),
one slowed 2x by the runtime's slowdown injection, the controller moving blocks live, over
several seeds; after each run, the plans it ran, the static plan and fresh re-plans for the
slowed conditions are measured side by side on the same pipeline (:func:`live_runs`); and runs
with nothing changed. ``--live-only`` runs just this section and splices it into the existing
results file (with ``--json``, its headline figures as the last line: ``iterations_to_095``, ``moves_on_noise``);
``--no-live`` skips it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.core.cluster import Cluster, flat, two_level  # noqa: E402
from orchestrator.adapt import (  # noqa: E402
    ControllerConfig, FaultSchedule, SimulatedCosts, SimulatedJob, SimulatedRuntime, Slowdown, full_replan, scenario,
    set_inter_node_bandwidth,
)
from orchestrator.costmodel.estimate import Layout  # noqa: E402
from orchestrator.planners.moves import path_to, walk  # noqa: E402
from orchestrator.costmodel.estimate import CostModel  # noqa: E402
from orchestrator.core.plan import Plan, straight_plan  # noqa: E402
from orchestrator.core.profile import Block, Profile  # noqa: E402
from orchestrator.core.profile_loader import load_profile  # noqa: E402
from orchestrator.costmodel.simulator import simulate  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
STRATEGIES = {
    "static": dict(use_moves=False, use_restart=False),
    "incremental": dict(use_moves=True, use_restart=False),
    "replan": dict(use_moves=False, use_restart=True),
}


@dataclass
class Run:
    strategy: str
    phase_tput: list[float]  # samples/s per phase
    total_s: float
    moves: int
    restarts: int
    decision_ms: list[float]


def run(profile: Profile, cluster: Cluster, plan: Plan, faults: FaultSchedule, iterations: int, phases: list[int],
        strategy: str, straight: bool) -> Run:
    pipe = SimulatedRuntime(profile, cluster, plan, faults, SimulatedCosts(noise=0.03), seed=7)
    job = SimulatedJob(pipe, ControllerConfig(straight=straight, total_iterations=iterations, **STRATEGIES[strategy]))  # type: ignore[arg-type]
    with job:
        while pipe.step < iterations:
            job.fit(1)
    bounds = phases + [pipe.step_index]
    tput = []
    for a, b in zip(bounds, bounds[1:]):
        spent = sum(s for ev, k, s in pipe.log if a <= k < b)
        done = sum(1 for ev, k, _ in pipe.log if ev == "iteration" and a <= k < b)
        tput.append(done * plan.num_microbatches * profile.microbatch_size / spent)
    dec = [r.decision_s * 1e3 for r in job.records if r.decision is not None]
    total = pipe.wall_s + sum(dec) / 1e3
    moves = sum(1 for r in job.records if r.action in ("move", "path-move"))
    restarts = sum(1 for r in job.records if r.action == "restart")
    return Run(strategy, tput, total, moves, restarts, dec)


def oracle(profile: Profile, cluster: Cluster, plan: Plan, faults: FaultSchedule, phases: list[int], straight: bool) -> list[float]:
    """Throughput of a fresh plan (PipeDream + polishing walk) for each phase's *true* conditions, no switch costs."""
    out = []
    for start in phases:
        truth = faults.conditions(cluster, start).cluster
        best = full_replan(profile, truth, range(cluster.size), plan, straight=straight)
        out.append(plan.num_microbatches * profile.microbatch_size / simulate(best, profile, truth).iteration_s)
    return out


def table(title: str, runs: list[Run], best: list[float], labels: list[str]) -> list[str]:
    lines = [f"### {title}", "", "| strategy | " + " | ".join(labels) + " | total time (s) | moves | restarts |",
             "|---" * (len(labels) + 4) + "|"]
    for r in runs:
        lines.append(f"| {r.strategy} | " + " | ".join(f"{t:.2f}" for t in r.phase_tput) + f" | {r.total_s:.0f} | {r.moves} | {r.restarts} |")
    lines.append("| fresh re-plan per phase (oracle, no switch cost) | " + " | ".join(f"{t:.2f}" for t in best) + " | | | |")
    return lines + [""]


def scenario_block(title: str, profile: Profile, cluster: Cluster, faults: FaultSchedule, iterations: int, phases: list[int],
                   labels: list[str], straight: bool, m: int = 16) -> list[str]:
    plan = full_replan(profile, cluster, range(cluster.size), straight_plan([0, profile.num_blocks], m), straight=straight)
    runs = [run(profile, cluster, plan, faults, iterations, phases, s, straight) for s in STRATEGIES]
    lines = table(title, runs, oracle(profile, cluster, plan, faults, phases, straight), labels)
    lines.append(f"Initial plan: `{plan.describe()}`. Throughput in samples/s (micro-batch size "
                 f"{profile.microbatch_size}); total = simulated wall time incl. stalls, restarts and decision time.")
    return lines + [""]


def live_style_targets(profile: Profile) -> list[str]:
    """4-stage pipeline, stage 1 slowed 2x at iteration 20: the live demo's targets, in simulation."""
    cluster = flat(4, 100)
    m = 16
    plan = full_replan(profile, cluster, range(4), straight_plan([0, profile.num_blocks], m), straight=True)
    faults = scenario([Slowdown(1, 2.0, 20)])
    pipe = SimulatedRuntime(profile, cluster, plan, faults, SimulatedCosts(noise=0.03), seed=7)
    with SimulatedJob(pipe, ControllerConfig(straight=True)) as job:
        records = job.fit(40)
    ctl = job.controller
    truth = faults.conditions(cluster, 20).cluster
    fresh = simulate(full_replan(profile, truth, range(4), plan, straight=True), profile, truth).iteration_s
    static = simulate(plan, profile, truth).iteration_s
    after = [r for r in records if r.step >= 20]
    back = next((r.step - 20 for r in after if r.completed and fresh / r.iteration_s >= 0.95 and r.step > 20 and
                 all(fresh / x.iteration_s >= 0.9 for x in after if x.step >= r.step)), None)
    stalls = [r.action_s / r.iteration_s for r in after if r.action]
    steady = statistics.median(r.iteration_s for r in records[-10:])
    # moves from the pre-change plan to the re-plan partition, and what a greedy walk reaches
    model = ctl.model()
    start, target = Layout.of(plan), Layout.of(full_replan(profile, model, range(4), plan, straight=True))
    w = walk(start, CostModel(profile, model, m), range(4), straight=True)
    return [
        "### 4-stage pipeline, one stage slowed 2x at iteration 20 (live targets, simulated)", "",
        f"- plan `{plan.describe()}` → `{pipe.plan.describe()}`",
        f"- iterations after the change until throughput ≥ 0.95 × fresh optimal (and stays ≥ 0.9): **{back}** (target ≤ 5)",
        f"- stall per move / iteration time: max **{max(stalls, default=0):.4f}** over {len(stalls)} moves (target < 0.5)",
        f"- throughput after the change vs static plan: **{static / steady:.2f}×** (target ≥ 1.3); vs fresh optimal: {fresh / steady:.3f}",
        f"- moves to the full re-plan's partition from the pre-change plan: path_to = {len(path_to(start, target, range(4)))}, "
        f"greedy walk = {len(w.moves)} moves reaching estimate {w.estimates[-1]:.3f} s vs re-plan {CostModel(profile, model, m).estimate([target]).time_s[0]:.3f} s",
        "",
    ]


def decision_times(repeats: int = 5) -> dict[str, tuple[int, list[float], list[float]]]:
    """Decision times (ms) of the controller for a 100-block model on 8 devices (M = 16) after a 2x
    slowdown, pooled over ``repeats`` identical runs: {label: (decisions per run, fast path, all)}."""
    rng = np.random.default_rng(0)
    blocks = tuple(Block(f"b{i}", float(rng.uniform(5e-3, 2e-2)), float(rng.uniform(1e-2, 4e-2)), float(rng.uniform(1e6, 3e7)),
                         float(rng.uniform(1e6, 5e7))) for i in range(100))
    profile = Profile("synthetic-100", blocks, input_bytes=1e6)
    cluster = two_level(2, 4, 100, 25)
    out = {}
    for straight in (True, False):
        fast: list[float] = []
        every: list[float] = []
        count = 0
        for _ in range(repeats):
            plan = straight_plan([round(i * 100 / 8) for i in range(9)], 16)
            pipe = SimulatedRuntime(profile, cluster, plan, scenario([Slowdown(3, 2.0, 4)]), SimulatedCosts(noise=0.03), seed=1)
            with SimulatedJob(pipe, ControllerConfig(straight=straight)) as job:
                job.fit(40)
            # waiting for devices that re-learn after a move is no decision (nothing is weighed)
            recs = [r for r in job.records if r.decision is not None and "re-learning" not in getattr(r.decision, "reason", "")]
            count = len(recs)
            fast += [r.decision_s * 1e3 for r in recs if "single" in getattr(getattr(r.decision, "option", None), "label", "")]
            every += [r.decision_s * 1e3 for r in recs]
        out["straight" if straight else "with replication"] = (count, fast, every)
    return out


# Before the decision-path speed-ups: the same harness run on the previous controller, 5 runs pooled,
# median of 3 such measurements on this machine (the max includes the one-off import of the planner
# modules by the first slow-path decision of the process, which now happens at start-up).
DECISION_BEFORE = {"straight": (5, 13.9, 83.5, 233.4), "with replication": (9, 16.4, 16.6, 59.4)}


def decision_time(repeats: int = 5) -> list[str]:
    """Controller decision time for a 100-block model on 8 devices (M = 16), after a 2x slowdown."""
    rows = []
    for label, (count, fast, every) in decision_times(repeats).items():
        b = DECISION_BEFORE[label]
        rows.append(f"| {label} | {count} | {b[1]:.1f} → **{statistics.median(fast) if fast else float('nan'):.1f}** "
                    f"| {b[2]:.1f} → **{statistics.median(every):.1f}** | {b[3]:.1f} → **{max(every):.1f}** |")
    return [f"### Decision time, 100 blocks, 8 devices, M = 16 (this machine, 2 shared cores; {repeats} runs pooled)", "",
            "| moves | decisions per run | median ms (single-move fast path), before → after | median ms (all), before → after "
            "| max ms (incl. walk + re-plan path), before → after |",
            "|---|---|---|---|---|", *rows, "",
            "Before: every slow-path decision (no single move pays: multi-move walk + path to a polished full re-plan) re-ran "
            "the planner (PipeDream DP, ~35 ms here), its polishing walk and ~6 discrete-event simulations (~4 ms each) and "
            "walked by building a Python object per candidate. After: candidates are built and ranked as arrays (walk 3×, "
            "identical moves); simulations reuse lowered schedules and memoize per believed model; the re-plan is computed "
            "once per detected change (reused within the monitor's change-detection band; PipeDream's speed-agnostic answer "
            "only re-polished after speed-only changes), the nominal one at start-up and later ones in a background thread "
            "between iterations. Decisions were the same as before the speed-ups in this run and in the seeded scenarios of `tests/test_controller_speed.py` (later controller changes — waiting for devices that re-learn after a move, checking moves against what they delivered — change decisions, not their cost); reusing a re-plan within the change-detection band can choose a different re-plan path (1 of 36 seeded runs tried, ending on a faster plan). The max is load-sensitive: 24–45 ms over repeated measurements on this machine.", ""]


from adaptive_live import LIVE_MARK, live_slowdown  # noqa: E402  (beside this file)


def main() -> int:
    if "--live-only" in sys.argv:
        figures: dict[str, object] = {}
        code = splice_live(live_slowdown(figures))
        if "--json" in sys.argv:
            print(json.dumps(figures))
        return code
    if not SHARED.exists():
        print(f"shared profiles not found at {SHARED}; nothing to benchmark")
        return 0
    dapple = SHARED / "profiles" / "dapple" / "profiling_results"
    bert = load_profile(dapple / "bert-24-pbs-6.txt")
    gnmt = load_profile(dapple / "gnmt-16-pbs-64.txt")
    out = ["# Adaptive controller (AutoPipe-Hu scenarios, simulated)", "",
           "Generated by `benchmarks/adaptive.py`. Same simulator, profiles, scenario and noise (3% log-normal) for every strategy; "
           "`replan` restarts are charged 20 s + checkpoint I/O at 8 Gb/s; live moves are charged the parameter+Adam hand-over "
           "on the true link + 50 ms.", ""]
    t0 = time.perf_counter()
    bw_cluster = flat(4, 10)
    bw_faults = scenario([t for g, at in ((25, 20), (40, 40), (100, 60)) for t in set_inter_node_bandwidth(bw_cluster, g, at)])
    labels = ["10 Gb/s", "25 Gb/s", "40 Gb/s", "100 Gb/s"]
    for name, prof in (("GNMT-16", gnmt), ("BERT-24", bert)):
        out += scenario_block(f"Bandwidth 10 → 25 → 40 → 100 Gb/s, {name}, 4 GPUs on 4 nodes", prof, bw_cluster, bw_faults, 80,
                              [0, 20, 40, 60], labels, straight=False)
    colo = two_level(2, 2, 100, 25)
    colo_faults = scenario([Slowdown(1, 2.0, 20), Slowdown(2, 2.0, 40)])
    for name, prof in (("BERT-24", bert), ("GNMT-16", gnmt)):
        out += scenario_block(f"Co-located jobs (GPU 1 halved at 20, GPU 2 at 40), {name}, 2 nodes × 2 GPUs", prof, colo, colo_faults, 60,
                              [0, 20, 40], ["no job", "one job", "two jobs"], straight=False)
    out += live_style_targets(bert)
    out += decision_time()
    from adaptive_replay import replay_section  # beside this file

    out += replay_section()
    if "--no-live" not in sys.argv:
        out += live_slowdown()
    out += ["### Notes", "",
            "- The oracle row is a fresh plan for each phase's *true* conditions (PipeDream DP, then a polishing walk of moves on "
            "the true cost model, whichever simulates faster); it is a strong heuristic, not a proven optimum, so a controller "
            "that walked from a different start can beat it.",
            "- PipeDream's DP ignores device speeds; `replan` therefore polishes its output the same way before restarting. "
            "It restarts only when the arbiter finds the predicted gain over the horizon worth the 20 s+ downtime.",
            "- Decision time: the fast path (rank all O(L²) two-worker moves with the vectorized estimate, confirm the best "
            "two with the simulator) is what runs on most decisions; the slow path (multi-move walk + path to a polished "
            "full re-plan) runs when no single move pays and right after a detected change (the best destination is wanted then, "
            "carried out in one pause as one hand-over to the path's end); both stay well under 50 ms at 100 blocks on this machine (table above). A `nan` "
            "fast-path median means every decision of that run followed a change.",
            "- LIVE: on 2 shared cores four compute-bound actors contend for CPU, so a sleeping (slowed) stage frees CPU for the "
            "others; the live section therefore runs every device under a common base injection (see there). Numbers vary with "
            "machine load (the 1-minute load average is in the table; other engineers share the machine).",
            ""]
    out.append(f"_Benchmark wall time: {time.perf_counter() - t0:.0f} s._")
    text = "\n".join(out) + "\n"
    dest = ROOT / "benchmarks" / "results" / "adaptive.md"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    print(text)
    return 0


def splice_live(section: list[str]) -> int:
    """Replace (or append) the live section of an existing results file, keeping the simulated ones."""
    dest = ROOT / "benchmarks" / "results" / "adaptive.md"
    text = dest.read_text() if dest.exists() else "# Adaptive controller\n\n"
    start = text.find(LIVE_MARK)
    if start >= 0:
        end = text.find("_Live section wall time", start)
        end = text.find("\n", end) + 1 if end >= 0 else len(text)
        text = text[:start] + "\n".join(section).rstrip("\n") + "\n" + text[end:]
    else:
        notes = text.find("### Notes")
        at = notes if notes >= 0 else len(text)
        text = text[:at] + "\n".join(section) + "\n" + text[at:]
    dest.write_text(text)
    print("\n".join(section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
