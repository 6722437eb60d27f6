"""Planning only: profile a model on this machine, compare every planner, write timelines.

Copy this script and replace ``build_blocks`` with your own model as a list of blocks (each block
one tensor in, one tensor out). Run:

    .venv/bin/python examples/plan_model.py --gpus 16 --servers 4 --intra-gbps 100 --inter-gbps 25 --out out/plan

Profiles measured here are on this machine's device; for a GPU cluster, profile on one of its GPUs
(the profiler picks CUDA automatically) or scale with ``--speed`` (device speed relative to here).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from orchestrator.core.cluster import flat, two_level
from orchestrator.cli.demo import compare_planners
from orchestrator.profiling.models import example_batch, tiny_transformer
from orchestrator.profiling.profiler import profile_blocks
from orchestrator.core.timeline import spans_from_events, write_chrome_trace, write_gantt_png


def build_blocks() -> list[torch.nn.Module]:
    return tiny_transformer(vocab=256, d_model=64, n_layers=6, n_heads=4, seq_len=32, sub_layer_blocks=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--intra-gbps", type=float, default=100.0)
    parser.add_argument("--inter-gbps", type=float, default=10.0)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--microbatch-size", type=int, default=8)
    parser.add_argument("--out", default="out/plan")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks = build_blocks()
    inputs, _ = example_batch("tiny_transformer", args.microbatch_size, seed=0, vocab=256, seq_len=32)
    profile = profile_blocks(blocks, inputs, "my-model", args.microbatch_size)
    out = Path(args.out)
    profile.save(out / "profile.json")
    if args.servers > 1:
        cluster = two_level(args.servers, args.gpus // args.servers, args.intra_gbps, args.inter_gbps)
    else:
        cluster = flat(args.gpus, args.inter_gbps)
    results = compare_planners(profile, cluster, args.microbatches)
    for r in results:
        spans = spans_from_events(r.sim.events)
        write_chrome_trace(spans, out / f"{r.algorithm}.trace.json", r.algorithm)
        write_gantt_png(spans, out / f"{r.algorithm}.png", f"{r.algorithm}: {r.plan.describe()}")
    print(f"timelines in {out}/ (*.trace.json for ui.perfetto.dev, *.png)")


if __name__ == "__main__":
    main()
