"""``make demo``: the whole story on this machine, one chapter per capability.

Chapter 1 (planning): profile a small real transformer here, plan it for a simulated 8-GPU,
2-server cluster with every planner, print the comparison and write the timelines.
Later chapters (training on Ray, adaptive moves, spot migration) run when their parts exist.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from orchestrator.cluster import Cluster, two_level
from orchestrator.errors import UserError
from orchestrator.planners.base import PlannerOptions, PlanResult, available, run_planner
from orchestrator.profile import Profile
from orchestrator.timeline import spans_from_events, write_chrome_trace, write_gantt_png

DEMO_MODEL = {"n_layers": 8, "d_model": 64, "n_heads": 4, "seq_len": 32, "vocab": 128, "sub_layer_blocks": True}


def _banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def profile_demo_model(microbatch_size: int = 8) -> Profile:
    from orchestrator.profiler import profile_example

    torch.set_num_threads(1)  # small kernels: one thread times stably on a shared machine
    return profile_example("tiny_transformer", microbatch_size, model_kwargs=DEMO_MODEL, warmup=2, repeats=5)


def compare_planners(profile: Profile, cluster: Cluster, microbatches: int) -> list[PlanResult]:
    results: list[PlanResult] = []
    options = PlannerOptions(num_microbatches=microbatches)
    print(f"{'planner':<12}{'stages':>7}{'iter ms':>10}{'÷ bound':>9}{'bubble':>8}{'plan ms':>9}  plan")
    for name in available():
        try:
            r = run_planner(name, profile, cluster, options)
        except UserError as exc:
            print(f"{name:<12}  skipped: {exc}")
            continue
        results.append(r)
        bubble = sum(r.sim.bubble_fraction.values()) / max(1, len(r.sim.bubble_fraction))
        print(
            f"{name:<12}{len(r.plan.stages):>7}{r.iteration_time_s * 1e3:>10.3f}"
            f"{r.iteration_time_s / r.lower_bound_s:>9.3f}{bubble:>8.2f}{r.planning_time_s * 1e3:>9.2f}  {r.plan.describe()}"
        )
    return results


def chapter_planning(out: Path) -> PlanResult:
    _banner("1. profile a real model here, plan it for 8 GPUs on 2 servers")
    t0 = time.perf_counter()
    profile = profile_demo_model()
    profile.save(out / "profile.json")
    print(
        f"profiled {profile.name}: {profile.num_blocks} blocks (attention/FFN sub-layers), "
        f"{profile.total_compute_s * 1e3:.2f} ms fwd+bwd per micro-batch of {profile.microbatch_size} "
        f"on {profile.source.removeprefix('profiled on ')} in {time.perf_counter() - t0:.1f} s"
    )
    # A simulated cluster: two servers of 4 GPUs, NVLink-class inside, 10 Gb/s between.
    cluster = two_level(2, 4, intra_gbps=100.0, inter_gbps=10.0, memory_bytes=16 * 2**30)
    results = compare_planners(profile, cluster, microbatches=16)
    best = min(results, key=lambda r: r.iteration_time_s)
    spans = spans_from_events(best.sim.events)
    write_chrome_trace(spans, out / "simulated_timeline.json", f"simulated {best.algorithm}")
    write_gantt_png(spans, out / "simulated_timeline.png", f"simulated: {best.algorithm} {best.plan.describe()}")
    print(f"best: {best.algorithm}; timeline -> {out / 'simulated_timeline.json'} (open in ui.perfetto.dev) and .png")
    return best


def run_demo(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    chapter_planning(out)
    print(f"\ndemo finished; outputs in {out}/")
    return 0
