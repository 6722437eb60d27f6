"""Quick steady-state runtime comparison: ours vs torch.distributed.pipelining, one JSON line.

``benchmarks/runtime.py --quick [--json]`` runs this (under 3 minutes on the shared 2-core box).
Same model, cut, micro-batches, schedule (1F1B), optimizer, threads and niceness as the full
benchmark (:mod:`benchmarks.runtime`, whose runners are reused): both process sets stay alive and
blocks of N back-to-back iterations alternate: ours ``PipelineTrainer.fit(N)`` (pipelined dispatch,
runs of steps per remote call, Ray included), ours with one step per remote call (the dispatch
before runs of steps, for the before/after ratio) and torch's ``Schedule1F1B`` training loop, the
order rotating through all six orders, so the runners see the same background load on average. Per block the median time between consecutive
completions; per round the ratio torch / ours (throughput ours / torch); reported: the median over
rounds.

Why the steady state and not single iterations: a trainer runs iterations back to back; single
iterations measure the driver's round trip, which pipelined dispatch hides.

The simulator's prediction uses the cost model measured at the start (one-thread block profile,
gloo latency and bandwidth, the optimizer step). Bubbles are measured in the steady state against
the time between completions (the per-iteration
spans overlap under pipelined dispatch, which double-counted idle time: ``bubble_measured_span``).
``measured_over_predicted_plain``: that bubble over the plain prediction (what issue 15 found
2-3x off). The two terms the plain cost model lacks are measured inside the actors: the
per-action overhead (a device's time neither computing nor blocked on a receive, per action) and
the compute inflation (F/B/step spans over the profile: cores shared with Ray, the driver, gloo's
threads and other jobs). ``measured_over_predicted``: the measured idle share (neither computing
nor in a handler) over the bubble the simulator predicts with both terms in the cost model
(``SimOptions.slowdown``); ``iter_measured_over_predicted[_with_overheads]`` the same for the
iteration time. The
per-micro-batch and fixed per-iteration overheads are the slope and intercept of the steady
iteration time of a 4-wide MLP (compute negligible) over M = 4 and 32.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import runtime as full
from orchestrator.core.cluster import GBPS, flat
from orchestrator.core.plan import straight_plan
from orchestrator.costmodel.simulator import SimOptions, simulate

OUT = Path(__file__).resolve().parent / "results" / "runtime_quick.md"
ROUNDS, N = 6, 12  # MLP: 6 rounds (each order of the three runners once) of 12-iteration blocks
TINY_ROUNDS, TINY_N = 3, 12


ORDERS = (("ours", "single", "torch"), ("torch", "single", "ours"), ("single", "ours", "torch"),
          ("torch", "ours", "single"), ("ours", "torch", "single"), ("single", "torch", "ours"))


def _rounds(ours: Any, theirs: Any, n: int, rounds: int) -> tuple[dict[str, list[float]], list[Any]]:
    """Per-round median seconds per iteration of ours, ours with one step per remote call
    ("single", the dispatch before runs of steps; absent on a runtime without it) and torch, the
    order rotating through all six orders (and, under ``NAME_wall``, each block's wall time per
    iteration, first dispatch included); and ours' iteration metrics of every round."""
    chunked = hasattr(ours.trainer, "iterations_per_call")
    per_call = ours.trainer.iterations_per_call if chunked else 1
    ours.run(n, True)  # warm-up blocks (first-iteration setup, allocator, gloo connections)
    theirs.run(n)
    med: dict[str, list[float]] = {"ours": [], "single": [], "torch": []}
    wall: dict[str, list[float]] = {"ours": [], "single": [], "torch": []}  # block wall time per iteration
    metrics = []
    for i in range(rounds):
        for who in ORDERS[i % len(ORDERS)]:
            if who == "torch":
                times, block = theirs.run(n)
                med[who].append(statistics.median(times))
                wall[who].append(block / n)
            elif who == "ours" or chunked:
                if chunked:
                    ours.trainer.iterations_per_call = per_call if who == "ours" else 1
                result = ours.trainer.fit(ours.trainer.step + n)
                med[who].append(statistics.median(m.iteration_s for m in result.metrics))
                wall[who].append(result.wall_s / n)
                if who == "ours":
                    metrics += result.metrics
    if chunked:
        ours.trainer.iterations_per_call = per_call
    med.update({f"{k}_wall": v for k, v in wall.items()})
    return med, metrics


def _tiny(group: Any) -> dict[int, dict[str, float]]:
    """Median steady seconds per iteration (ours, single, torch) of the tiny model at M = 4 and 32."""
    out = {}
    for m in (4, 32):
        theirs = full.TorchPipeline(full.TINY, 4, m, 64)
        try:
            ours = full.Ours(group, full.TINY, straight_plan([0, 4, 8], m), 64)
            med, _ = _rounds(ours, theirs, TINY_N, TINY_ROUNDS)
        finally:
            theirs.close()
        out[m] = {k: statistics.median(v) if v else float("nan") for k, v in med.items()}
    return out


def main(as_json: bool) -> dict[str, Any]:
    import ray

    from actors.group import WorkerGroup

    t_start = time.perf_counter()
    plan = straight_plan([0, 4, 8], full.M)
    profile, step_s = full.measured_profile(full.BIG, plan, full.BATCH)
    boundary = int(profile.boundary_bytes(4))
    link = full.gloo_link([1, boundary // 4, 1 << 20], reps=20)
    latency = link[4]
    bandwidth = ((1 << 22) - boundary) / max(1e-9, link[1 << 22] - link[boundary])
    sim = full.predicted(plan, profile, latency, bandwidth, step_s)

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    group = WorkerGroup(2, use_gpu=False)
    try:
        theirs = full.TorchPipeline(full.BIG, 4, full.M, full.BATCH)
        try:
            ours = full.Ours(group, full.BIG, plan, full.BATCH)
            med, metrics = _rounds(ours, theirs, N, ROUNDS)
        finally:
            theirs.close()
        tiny = _tiny(group)
    finally:
        group.shutdown()
        ray.shutdown()

    o_med, t_med = med["ours"], med["torch"]
    ratios = [t / o for o, t in zip(o_med, t_med)]
    runs_gain = [s1 / o for o, s1 in zip(o_med, med["single"])]
    wall_ratios = [t / o for o, t in zip(med["ours_wall"], med["torch_wall"])]
    inside = statistics.median(m.span_s for m in metrics)
    devices = sorted(sim.busy_s)

    def mean(values: dict[int, float]) -> float:
        return sum(values[d] for d in devices) / len(devices)

    b_span = statistics.median(mean(m.bubble_fraction) for m in metrics)  # the old, overlapping-span measure
    # Steady state: against the time between completions, not the per-iteration span. With
    # pipelined dispatch a device starts k+1 while another still finishes k, so consecutive spans
    # overlap and their idle time would be counted in both.
    b_meas = statistics.median(mean({d: max(0.0, 1.0 - m.busy_s[d] / m.iteration_s) for d in devices}) for m in metrics)
    b_pred = mean(sim.bubble_fraction)
    # The cost model's missing terms, measured inside the actors: per-action overhead (time neither
    # computing nor blocked on a receive, per action) and compute inflation (F/B/step spans vs profile).
    measured = all(getattr(m, "actions", None) for m in metrics)  # (a runtime from before these fields: no terms)
    per_action = statistics.median(mean({d: m.overhead_s[d] / max(1, m.actions[d]) for d in devices})
                                   for m in metrics) if measured else 0.0
    busy = {d: statistics.median(m.busy_s[d] for m in metrics) for d in devices}
    actions = {d: metrics[0].actions[d] if measured else 0 for d in devices}
    factor = {d: (busy[d] + per_action * actions[d]) / sim.busy_s[d] for d in devices}
    cluster = flat(2, gbps=bandwidth / GBPS).with_latency(latency)
    fitted = simulate(plan, profile, cluster, SimOptions(step_s_per_param_byte=step_s, slowdown=factor))
    b_fit = mean(fitted.bubble_fraction)
    # Against that prediction the overhead is busy time, so the measured counterpart is the idle
    # share alone: blocked on receives or between iterations, neither computing nor in a handler.
    b_idle = statistics.median(mean({d: max(0.0, 1.0 - (m.busy_s[d] + (m.overhead_s[d] if measured else 0.0)) / m.iteration_s)
                                     for d in devices}) for m in metrics)
    slope = {who: (tiny[32][who] - tiny[4][who]) / 28 for who in ("ours", "single", "torch")}
    fixed = {who: tiny[4][who] - 4 * slope[who] for who in ("ours", "single", "torch")}
    summary: dict[str, Any] = {
        "ours_over_torch": round(statistics.median(ratios), 4),
        "ours_over_torch_min": round(min(ratios), 4), "ours_over_torch_max": round(max(ratios), 4),
        "ours_over_torch_block_wall": round(statistics.median(wall_ratios), 4),
        # the fastest round of each: what each runner does in the box's quietest moments (load here is bimodal)
        "ours_over_torch_best_rounds": round(min(t_med) / min(o_med), 4),
        "runs_over_one_step_per_call_best_rounds": round(min(med["single"]) / min(o_med), 4) if med["single"] else None,
        "ours_iter_ms": round(1e3 * statistics.median(o_med), 3), "torch_iter_ms": round(1e3 * statistics.median(t_med), 3),
        "ours_one_step_per_call_iter_ms": round(1e3 * statistics.median(med["single"]), 3) if med["single"] else None,
        "runs_over_one_step_per_call": round(statistics.median(runs_gain), 4) if runs_gain else None,
        "tiny_m4_iter_ms": {k: round(v * 1e3, 3) for k, v in tiny[4].items()},
        "ours_inside_iter_ms": round(1e3 * inside, 3), "predicted_iter_ms": round(1e3 * sim.iteration_s, 3),
        "measured_over_predicted": round(b_idle / b_fit if b_fit > 0 else float("nan"), 3),
        "idle_measured": round(b_idle, 4),
        "measured_over_predicted_plain": round(b_meas / b_pred if b_pred > 0 else float("nan"), 3),
        "measured_over_predicted_span": round(b_span / b_pred if b_pred > 0 else float("nan"), 3),
        "bubble_measured": round(b_meas, 4), "bubble_measured_span": round(b_span, 4),
        "bubble_predicted": round(b_pred, 4), "bubble_predicted_with_overheads": round(b_fit, 4),
        "per_action_overhead_us": round(per_action * 1e6, 1),
        "compute_inflation": {str(d): round(busy[d] / sim.busy_s[d], 3) for d in devices},
        "iter_measured_over_predicted": round(statistics.median(o_med) / sim.iteration_s, 3),
        "iter_measured_over_predicted_with_overheads": round(statistics.median(o_med) / fitted.iteration_s, 3),
        "per_microbatch_us": {k: round(v * 1e6, 1) for k, v in slope.items() if v == v},
        "fixed_per_iteration_ms": {k: round(v * 1e3, 3) for k, v in fixed.items() if v == v},
        "gloo_latency_us": round(latency * 1e6, 1),
        "model": f"mlp {full.BIG[0]}-{full.BIG[1]}x7-{full.BIG[-1]} (8 blocks), batch {full.BATCH}",
        "stages": 2, "microbatches": full.M, "schedule": "1f1b", "backend": "gloo", "device": "cpu",
        "rounds": ROUNDS, "iterations_per_block": N, "load_avg_1m": round(os.getloadavg()[0], 2),
        "wall_s": round(time.perf_counter() - t_start, 1), "torch": torch.__version__,
    }
    _write(summary, med)
    if as_json:
        print(json.dumps(summary))
    else:
        print("\n".join(f"{k}: {v}" for k, v in summary.items()))
    return summary


def _write(s: dict[str, Any], med: dict[str, list[float]]) -> None:
    rows = [
        ("configuration", f"{s['model']}, {s['stages']} stages, {s['microbatches']} micro-batches, {s['schedule']}, "
                          f"{s['backend']}, {s['rounds']} rounds of {s['iterations_per_block']} iterations"),
        ("ours / torch throughput: median per-round ratio [min, max]",
         f"{s['ours_over_torch']:.3f} [{s['ours_over_torch_min']:.3f}, {s['ours_over_torch_max']:.3f}]"),
        ("ms per iteration, ours (fit, Ray included) / torch", f"{s['ours_iter_ms']:.2f} / {s['torch_iter_ms']:.2f}"),
        ("ours / torch from block wall times (first dispatch included): median per-round ratio; from the fastest "
         "round of each (the box's quietest moments)",
         f"{s['ours_over_torch_block_wall']:.3f}; {s['ours_over_torch_best_rounds']:.3f}"),
        ("ms per iteration, ours with one step per remote call (the dispatch before runs of steps); "
         "throughput gain of runs of steps: median per-round ratio",
         f"{s['ours_one_step_per_call_iter_ms']} ms; x{s['runs_over_one_step_per_call']} "
         f"(fastest rounds x{s['runs_over_one_step_per_call_best_rounds']})"),
        *((f"round medians, {k}", ", ".join(f"{v * 1e3:.1f}" for v in med[k])) for k in ("ours", "single", "torch")),
        ("tiny model at M=4, ms per iteration: ours / one step per call / torch",
         " / ".join(f"{s['tiny_m4_iter_ms'][k]:.2f}" for k in ("ours", "single", "torch"))),
        ("ms per iteration inside the actors / predicted", f"{s['ours_inside_iter_ms']:.2f} / {s['predicted_iter_ms']:.2f}"),
        ("bubble fraction (mean over devices), steady state (against the time between completions) / "
         "overlapping spans (the old measure) / predicted",
         f"{s['bubble_measured']:.3f} / {s['bubble_measured_span']:.3f} / {s['bubble_predicted']:.3f} "
         f"(x{s['measured_over_predicted_plain']:.2f}; old measure x{s['measured_over_predicted_span']:.2f})"),
        ("measured in the actors: per-action overhead; compute inflation (F/B/step spans over the profile)",
         f"{s['per_action_overhead_us']:.0f} us; " + ", ".join(f"device {d}: x{v:.2f}" for d, v in s['compute_inflation'].items())),
        ("predicted with both terms (overhead counted as busy): bubble; measured idle share (neither computing nor "
         "in a handler); measured / predicted; iteration measured / predicted",
         f"{s['bubble_predicted_with_overheads']:.3f}; {s['idle_measured']:.3f}; x{s['measured_over_predicted']:.2f}; "
         f"x{s['iter_measured_over_predicted_with_overheads']:.2f} (without the terms x{s['iter_measured_over_predicted']:.2f})"),
        ("per-micro-batch overhead (tiny model slope), ours / one step per call / torch",
         " / ".join(f"{s['per_microbatch_us'].get(k, float('nan')):.0f}" for k in ("ours", "single", "torch")) + " us"),
        ("fixed per-iteration overhead (tiny model intercept), ours / one step per call / torch",
         " / ".join(f"{s['fixed_per_iteration_ms'].get(k, float('nan')):.2f}" for k in ("ours", "single", "torch")) + " ms"),
        ("gloo one-way latency (ping-pong)", f"{s['gloo_latency_us']:.0f} us"),
        ("load average (1 min) at the end; wall time of the run", f"{s['load_avg_1m']}; {s['wall_s']} s"),
    ]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    kept = OUT.read_text().split(full.KEEP, 1)[1] if OUT.exists() and full.KEEP in OUT.read_text() else "\n"
    OUT.write_text("# Runtime, quick steady-state comparison\n\nGenerated by `benchmarks/runtime.py --quick`; "
                   "see benchmarks/runtime_quick.py for the method.\n\n| quantity | value |\n|---|---|\n"
                   + "".join(f"| {k} | {v} |\n" for k, v in rows) + "\n" + full.KEEP + kept)
