"""Planning time and memory of ``auto`` against cluster size, 32 → 1024 GPUs.

    python benchmarks/planner_scale.py [--sizes 32,64,...] [--reference PATH] [--out FILE]

The model is a 100-block OPT-30B-like chain (issue 15's setting: 49 decoder layers split into an
attention and an FFN block each, plus embedding and head; per-layer figures of OPT-30B on one
A100-class GPU, micro-batch 1 × 2048 tokens), on servers of 8 GPUs, 600 Gb/s inside a server and
100 Gb/s between servers, 80 GiB per GPU, 64 micro-batches. Each size runs in a fresh process
(planning time = ``run_planner``'s wall time; CPU time = the process's CPU seconds for the whole
``run_planner`` call including the final simulation, which a loaded shared machine distorts less;
peak memory = the process's peak RSS), so sizes do not share caches. ``--reference`` points at another checkout (e.g. a git worktree of the commit before) whose
``auto`` runs on the same inputs for the before/after columns, with ``--ref-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from orchestrator.core.cluster import two_level
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.core.profile import Block, Profile
GB = 1e9
def opt_like(layers=49):
    h, s = 7168, 2048
    attn_p, ffn_p = 4 * h * h * 2, 8 * h * h * 2          # fp16 bytes
    act = s * h * 2                                          # one micro-batch's hidden state
    blocks = [Block("embed", 0.002, 0.004, act, 50272 * h * 2, act)]
    for i in range(layers):
        blocks.append(Block(f"attn{{i}}", 0.0045, 0.009, act, attn_p, 10 * act))
        blocks.append(Block(f"ffn{{i}}", 0.0075, 0.015, act, ffn_p, 8 * act))
    blocks.append(Block("head", 0.003, 0.006, act, 50272 * h * 2, act))
    return Profile("opt30-like-100", tuple(blocks), input_bytes=s * 8)
prof = opt_like()
n = {n}
cl = two_level(n // 8, 8, 600, 100, memory_bytes=80 * 2**30)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, c = time.perf_counter(), time.process_time()
r = run_planner("auto", prof, cl, PlannerOptions(num_microbatches=64))
wall, cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps({{"n": n, "planning_s": r.planning_time_s, "wall_s": wall, "cpu_s": cpu, "iteration_s": r.iteration_time_s,
    "plan": r.plan.algorithm, "stages": len(r.plan.stages), "replicas": r.plan.stages[0].replicas, "schedule": r.plan.schedule.value,
    "sliced": r.plan.sliced_microbatches, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "base_rss_mb": base / 1024}}))
"""


def run(root: Path, n: int, timeout: float) -> dict[str, Any] | None:
    try:
        out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(root), n=n)], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    res: dict[str, Any] = json.loads(lines[-1])
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32,64,128,256,512,1024")
    ap.add_argument("--reference", help="another checkout whose auto gives the 'before' columns")
    ap.add_argument("--ref-timeout", type=float, default=120.0)
    ap.add_argument("--ref-sizes", default="32,64,128")
    ap.add_argument("--out", help="append the markdown table to this file")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    ref_sizes = {int(x) for x in args.ref_sizes.split(",")}
    rows = ["| GPUs | planning time (wall / CPU) | peak RSS | simulated iteration | plan | before: planning time (wall / CPU) | before: peak RSS | before: iteration | after / before |", "|---|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        new = run(ROOT, n, 600.0)
        ref = run(Path(args.reference), n, args.ref_timeout) if args.reference and n in ref_sizes else None
        if new is None:
            rows.append(f"| {n} | failed | | | | | | | |")
            continue
        plan = f"{new['plan']}: {new['stages']} stages × {new['replicas']} replicas, {new['schedule']}" + (f", {new['sliced']} sliced" if new["sliced"] else "")
        if ref is not None:
            before = f"{ref['planning_s']:.2f} / {ref['cpu_s']:.2f} s | {ref['peak_rss_mb']:.0f} MB | {ref['iteration_s'] * 1e3:.1f} ms | {new['iteration_s'] / ref['iteration_s']:.4f}"
        elif args.reference and n in ref_sizes:
            before = f"> {args.ref_timeout:.0f} s (stopped) | | | "
        else:
            before = "not run | | | "
        rows.append(f"| {n} | {new['planning_s']:.2f} / {new['cpu_s']:.2f} s | {new['peak_rss_mb']:.0f} MB | {new['iteration_s'] * 1e3:.1f} ms | {plan} | {before} |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
