"""Adaptive controller benchmark (AutoPipe-Hu scenarios), simulated on the shared real profiles.

Strategies, each driving the same :class:`SimulatedPipeline` (same scenario, same noise seed):
- ``static``: the initial plan forever;
- ``incremental``: our controller — two-worker live moves chosen by the switch arbiter;
- ``replan``: same monitor and arbiter, but the only option is a full re-plan (PipeDream DP)
  applied by stop-and-restart, charged its restart time (process restart + checkpoint I/O).

Scenarios: inter-node bandwidth 10 → 25 → 40 → 100 Gb/s at iterations 20/40/60; one then two
co-located jobs halving one GPU each at iterations 20/40; a 4-stage pipeline with one stage slowed
2× at iteration 20 (the live demo's targets, measured here in simulation); and the decision time
for a 100-block model. Run: ``python benchmarks/adaptive.py`` (writes results/adaptive.md).

LIVE (``live_slowdown``): the same 4-stage scenario on this machine through the Ray runtime's
:class:`orchestrator.live.RayPipeline` — four stage actors training an MLP of width 1024 (Adam),
one slowed 2x by the runtime's slowdown injection, the controller moving blocks live, over
several seeds; after each run, the plans it ran, the static plan and fresh re-plans for the
slowed conditions are measured side by side on the same pipeline (:func:`live_runs`); and runs
with nothing changed. ``--live-only`` runs just this section and splices it into the existing
results file; ``--no-live`` skips it.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.cluster import Cluster, flat, two_level  # noqa: E402
from orchestrator.controller import (  # noqa: E402
    Controller, ControllerConfig, FaultSchedule, SimulatedCosts, SimulatedPipeline, Slowdown, full_replan, scenario,
    set_inter_node_bandwidth,
)
from orchestrator.controller.estimate import Layout  # noqa: E402
from orchestrator.controller.moves import path_to, walk  # noqa: E402
from orchestrator.controller.estimate import CostModel  # noqa: E402
from orchestrator.plan import Plan, straight_plan  # noqa: E402
from orchestrator.profile import Block, Profile, load_profile  # noqa: E402
from orchestrator.simulator import simulate  # noqa: E402

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
    pipe = SimulatedPipeline(profile, cluster, plan, faults, SimulatedCosts(noise=0.03), seed=7)
    ctl = Controller(pipe, profile, ControllerConfig(straight=straight, total_iterations=iterations, **STRATEGIES[strategy]))  # type: ignore[arg-type]
    while pipe.iteration < iterations:
        ctl.step()
    bounds = phases + [pipe.step_index]
    tput = []
    for a, b in zip(bounds, bounds[1:]):
        spent = sum(s for ev, k, s in pipe.log if a <= k < b)
        done = sum(1 for ev, k, _ in pipe.log if ev == "iteration" and a <= k < b)
        tput.append(done * plan.num_microbatches * profile.microbatch_size / spent)
    dec = [r.decision_s * 1e3 for r in ctl.history if r.decision is not None]
    total = pipe.wall_s + sum(dec) / 1e3
    moves = sum(1 for r in ctl.history if r.action in ("move", "path-move"))
    restarts = sum(1 for r in ctl.history if r.action == "restart")
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
    pipe = SimulatedPipeline(profile, cluster, plan, faults, SimulatedCosts(noise=0.03), seed=7)
    ctl = Controller(pipe, profile, ControllerConfig(straight=True))
    records = ctl.run(40)
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
        f"- plan `{plan.describe()}` → `{pipe.current_plan().describe()}`",
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
            pipe = SimulatedPipeline(profile, cluster, plan, scenario([Slowdown(3, 2.0, 4)]), SimulatedCosts(noise=0.03), seed=1)
            ctl = Controller(pipe, profile, ControllerConfig(straight=straight))
            ctl.run(40)
            close = getattr(ctl, "close", None)
            if close is not None:
                close()
            recs = [r for r in ctl.history if r.decision is not None]
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
            "between iterations. Decisions are the same as before in this run and in the seeded scenarios of `tests/test_controller_speed.py`; reusing a re-plan within the change-detection band can choose a different re-plan path (1 of 36 seeded runs tried, ending on a faster plan). The max is load-sensitive: 24–45 ms over repeated measurements on this machine.", ""]


LIVE_WIDTH, LIVE_BLOCKS, LIVE_M, LIVE_ROWS = 1024, 8, 8, 256
LIVE_SEEDS, LIVE_ITERATIONS, LIVE_CHANGE = (1, 2, 3, 4, 5), 30, 12
LIVE_BASE = 3.0
"""Every device is first slowed this much by the same injection, so that four actors need 4/3 of the two cores and
compute like four devices of their own (the target hardware: one GPU per stage) instead of racing for CPU time —
where a sleeping (slowed) actor hands its core to the others and a plan's speed depends on how many actors share the
cores, which no per-device speed describes."""
QUIET_RUNS, QUIET_ITERATIONS = 5, 30
PAIRED_ROUNDS, PAIRED_ITERATIONS = 4, 3
LIVE_MARK = "### LIVE: 4-stage Ray pipeline"


def _live_model() -> list:  # type: ignore[type-arg]
    from orchestrator.models import mlp

    return mlp((LIVE_WIDTH,) * (LIVE_BLOCKS + 1))


def _live_data(step: int) -> tuple:  # type: ignore[type-arg]
    from orchestrator.models import example_batch

    return example_batch("mlp", LIVE_ROWS, step, widths=(LIVE_WIDTH,) * (LIVE_BLOCKS + 1))


def _live_optimizer(params):  # type: ignore[no-untyped-def]
    import torch

    return torch.optim.Adam(params, lr=1e-4)


@dataclass
class LiveRun:
    seed: int
    back: int | None  # iterations from the change until every plan in force is >= 0.95x fresh (paired)
    back_series: int | None  # the same from the raw per-iteration throughput (3-iteration median)
    ratios: dict[str, float]  # plan -> paired throughput / fresh optimal's
    fresh: str
    static_ratio: float
    final: str
    moves: int
    stall_over_iteration: list[float]
    events: list[str]
    load: float
    final_spread: tuple[float, float]  # the final plan's ratio, lowest and highest round


def _robust_profile(trainer_factory, rounds: int = 3) -> Profile:  # type: ignore[no-untyped-def]
    """The live model's profile measured ``rounds`` times, each block's fastest kept: a burst of
    another job's load during one block's few repeats must not make that block look 10x heavier
    (the controller would then plan around a phantom)."""
    from dataclasses import replace

    from orchestrator.live import measured_profile

    runs = [measured_profile(trainer_factory()) for _ in range(rounds)]
    blocks = tuple(min((r.blocks[i] for r in runs), key=lambda b: b.forward_s + b.backward_s) for i in range(runs[0].num_blocks))
    return replace(runs[0], blocks=blocks)


def _paired(pipe, plans: list[Plan], rounds: int, iterations: int) -> dict[Plan, list[float]]:  # type: ignore[no-untyped-def]
    """Samples/s of each plan per round, measured side by side on one pipeline under the same
    injection: ``rounds`` rounds, each moving live to every plan in turn (order rotated), one
    iteration to settle, then the median of ``iterations`` timed ones."""
    out: dict[Plan, list[float]] = {p: [] for p in plans}
    for r in range(rounds):
        for p in plans[r % len(plans):] + plans[: r % len(plans)]:
            if pipe.current_plan() != p:
                pipe.apply_move(p)
            pipe.run_iteration()
            out[p].append(LIVE_ROWS / statistics.median(pipe.run_iteration().iteration_s for _ in range(iterations)))
    return out


def live_runs(seeds: tuple[int, ...] = LIVE_SEEDS, base: float = LIVE_BASE) -> tuple[list[LiveRun], list[int], float]:
    """One stage of 4 slowed 2x at iteration ``LIVE_CHANGE`` per seed, the controller driving the
    real :class:`RayPipeline`; then the plans it ran after the change, the static plan and fresh
    re-plans for the slowed conditions measured side by side on the same pipeline. Also
    ``QUIET_RUNS`` runs with nothing injected (moves per run). Returns (runs, quiet moves, seconds)."""
    import ray
    import torch.nn.functional as F

    from actors.group import WorkerGroup
    from orchestrator.live import RayPipeline, run_adaptive
    from orchestrator.trainer import PipelineTrainer

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    t_start = time.perf_counter()
    group = WorkerGroup(4, use_gpu=False)
    cluster = flat(4, 10)
    static_plan = straight_plan([0, 2, 4, 6, 8], LIVE_M)

    def trainer(plan: Plan, seed: int = 0) -> PipelineTrainer:
        return PipelineTrainer(_live_model, F.mse_loss, _live_optimizer, _live_data, LIVE_M, plan=plan, workers=group, pg_timeout_s=60,
                               seed=seed)

    profile = _robust_profile(lambda: trainer(static_plan))
    truth = cluster.with_speeds([1.0, 0.5, 1.0, 1.0])
    runs = []
    for seed in seeds:
        load = float(open("/proc/loadavg").read().split()[0]) if Path("/proc/loadavg").exists() else float("nan")
        pipe = RayPipeline(trainer(static_plan, seed), cluster, FaultSchedule(), profile)
        run = run_adaptive(pipe, ControllerConfig(straight=True), LIVE_ITERATIONS, scenario(_base(base) + [Slowdown(1, 2.0, LIVE_CHANGE)]))
        in_force = _plans_in_force(run, static_plan)
        fresh_candidates = {full_replan(profile, c, range(4), static_plan, straight=True) for c in (truth, run.controller.model())}
        after = sorted({p for p in in_force[LIVE_CHANGE:]} | {static_plan} | fresh_candidates, key=lambda p: p.describe())
        pipe.faults = scenario(_base(base) + [Slowdown(1, 2.0, 0)])
        rounds = _paired(pipe, after, PAIRED_ROUNDS, PAIRED_ITERATIONS)
        tput = {p: statistics.median(v) for p, v in rounds.items()}
        fresh_plan = max(fresh_candidates, key=lambda p: tput[p])
        # a plan's ratio: the median over rounds of its throughput over fresh optimal's in that round
        per_round = {p: [a / b for a, b in zip(rounds[p], rounds[fresh_plan])] for p in after}
        ratio = {p: statistics.median(v) for p, v in per_round.items()}
        back = next((k - LIVE_CHANGE for k in range(LIVE_CHANGE, LIVE_ITERATIONS) if all(ratio[p] >= 0.95 for p in in_force[k:])), None)
        series = run.samples_per_s
        back_series = next((i - LIVE_CHANGE for i in range(LIVE_CHANGE, LIVE_ITERATIONS - 2)
                            if statistics.median(series[i:i + 3]) >= 0.95 * tput[fresh_plan]), None)
        moves = [r for r in run.records if r.action in ("move", "path-move")]
        events = [f"step {e.step}: {e.kind} {e.detail}" + (f" ({e.seconds * 1e3:.0f} ms)" if e.seconds else "")
                  for e in run.events if e.kind != "decision" or "switch" in e.detail]
        runs.append(LiveRun(seed, back, back_series, {p.describe(): r for p, r in ratio.items()}, fresh_plan.describe(),
                            ratio[static_plan], in_force[-1].describe(), len(moves), [r.action_s / r.iteration_s for r in moves],
                            events, load, (min(per_round[in_force[-1]]), max(per_round[in_force[-1]]))))
    quiet = []
    for seed in range(1, QUIET_RUNS + 1):
        q = run_adaptive(RayPipeline(trainer(static_plan, 100 + seed), cluster, FaultSchedule(), profile), ControllerConfig(straight=True),
                         QUIET_ITERATIONS, scenario(_base(base)))
        quiet.append(sum(1 for r in q.records if r.action in ("move", "path-move")))
    group.shutdown()
    return runs, quiet, time.perf_counter() - t_start


def _base(factor: float) -> list[Slowdown]:
    return [Slowdown(d, factor, 0) for d in range(4)] if factor != 1.0 else []


def _plans_in_force(run, static_plan: Plan) -> list[Plan]:  # type: ignore[no-untyped-def]
    """The plan each iteration of ``run`` ran on (``run.plans[k]`` is in force after step k's action)."""
    by_name = {static_plan.describe(): static_plan} | {m.plan.describe(): m.plan for m in run.controller.handle.move_reports}
    return [static_plan] + [by_name[name] for name in run.plans[:-1]]


def live_slowdown() -> list[str]:
    """The live section of the results file (see :func:`live_runs`)."""
    runs, quiet, wall = live_runs()
    backs = [r.back for r in runs]
    ok = [b for b in backs if b is not None]
    rows = [f"| {r.seed} | {r.load:.1f} | {r.back if r.back is not None else 'never'} | "
            f"{r.back_series if r.back_series is not None else 'never'} | {r.static_ratio:.2f} | {r.ratios[r.final]:.2f} "
            f"({r.final_spread[0]:.2f}–{r.final_spread[1]:.2f}) | {r.moves} | "
            f"{max(r.stall_over_iteration, default=0):.2f} | `{r.final}` | `{r.fresh}` |" for r in runs]
    return [
        f"{LIVE_MARK} on this machine (2 shared CPU cores), one stage slowed 2x at iteration {LIVE_CHANGE}", "",
        f"Four Ray stage actors (gloo, 1 torch thread each) train an MLP of {LIVE_BLOCKS} blocks of width {LIVE_WIDTH} with Adam, "
        f"{LIVE_ROWS} rows per iteration in M = {LIVE_M} micro-batches, starting on `{straight_plan([0, 2, 4, 6, 8], LIVE_M).describe()}`. "
        "Slowdowns are the runtime's injection (sleep (factor−1)× the action's own CPU seconds after every forward/backward, "
        f"so the injected amount does not depend on how the four actors share the two cores). Every device runs under a "
        f"{LIVE_BASE:g}× base injection from the start, so that the four actors need 4/3 of the two cores and compute like four "
        "devices of their own (one GPU per stage, the hardware this is for) rather than racing for CPU time — without it a "
        "sleeping (slowed) actor hands its core to the other three, and a plan's speed depends on how many actors share the "
        "cores, which no per-device speed describes (measured: the static plan under the slowdown was then 0.54–1.06× the "
        f"fresh plan from one run to the next). Device 1 is slowed 2× more at iteration {LIVE_CHANGE}. The controller sees only "
        "measured metrics and moves block state actor to actor.",
        "",
        f"**How it is measured.** After each run, on the same pipeline and under the same injection, every plan the controller "
        "ran after the change, the static plan and fresh re-plans for the slowed conditions (from scratch on the true speeds, "
        "and on the speeds the controller learned) are measured side by side: "
        f"{PAIRED_ROUNDS} rounds, each moving live to every plan in turn (order rotated), 1 iteration to settle and "
        f"{PAIRED_ITERATIONS} timed (median); a plan's ratio to fresh optimal is the median over rounds of the two "
        "measured in the same round. *Fresh optimal* is the faster fresh plan. "
        "**Iterations to 0.95×** counts from the first slowed iteration to the first iteration from which every plan in "
        "force is ≥ 0.95× fresh optimal (3 = the slowdown was confirmed after its third iteration and the first move was "
        "right). The raw-series column is the same from the per-iteration throughput (first 3-iteration median ≥ 0.95× "
        "fresh optimal; machine load moves it either way).", "",
        "| seed | load (1 min) | iterations to 0.95× (paired) | same, raw series | static / fresh | final / fresh (rounds' range) | moves | "
        "max stall / iteration | final plan | fresh optimal |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"- iterations to 0.95× fresh optimal: **{backs}** (target ≤ 5); "
        f"{sum(1 for b in ok if b <= 5)} of {len(runs)} runs within 5"
        + (f", median {statistics.median(ok):.0f}" if ok else ""),
        f"- nothing changed ({QUIET_RUNS} runs of {QUIET_ITERATIONS} iterations, no injection): moves per run **{quiet}** (target 0)",
        f"- events of seed {runs[0].seed}:", *[f"  - {e}" for e in runs[0].events],
        "", f"_Live section wall time: {wall:.0f} s._", "",
    ]


def main() -> int:
    if "--live-only" in sys.argv:
        return splice_live(live_slowdown())
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
    text = text.replace("- LIVE: TODO(runtime) — the same 4-stage scenario through the Ray trainer's `PipelineHandle`; skipped until it exists.",
                        "- LIVE: see the live section above (real Ray actors on this machine; 2 shared cores, so numbers vary with load).")
    dest.write_text(text)
    print("\n".join(section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
