"""Host memory of stage actors that build only their own blocks, for a GPT-2-style model of
1.5 B parameters (GPT-2 XL's shape: 48 layers, width 1600) over CPU actors.

Every actor and the driver build the whole model on the meta device (structure only); each
actor materializes and initializes only its blocks (actors/materialize.py). Measured per actor,
from /proc (same machine): resident memory after setup (weights in place) and the high-water
mark after one training step (SGD without momentum: weights + gradients + activations), next to
the bytes of the parameters it owns; and the driver's own peak. Before this change every actor
built the whole model from the factory and kept its blocks: each would have held the whole
model's bytes at least once, the "whole model" column.

Run: ``.venv/bin/python benchmarks/hf_memory.py [--stages 4] [--small]`` (writes
benchmarks/results/hf_memory.md; ``--small`` is a 2-layer smoke run that writes nothing).
"""

from __future__ import annotations

from actors.stage_worker import StageWorker
import argparse
import os
import resource
import time
from functools import partial
from pathlib import Path

import torch

from orchestrator.profiling import hf
from orchestrator.core.plan import straight_plan
from orchestrator.train.trainer import PipelineTrainer

RESULTS = Path(__file__).resolve().parent / "results" / "hf_memory.md"
GIB = 1024 ** 3


def proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--embd", type=int, default=1600)
    parser.add_argument("--heads", type=int, default=25)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    if args.small:
        args.layers, args.embd, args.heads = 2, 64, 4
    from transformers import GPT2Config

    dtype = getattr(torch, args.dtype)
    seq, rows, vocab = 16, 2, 50257
    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, n_positions=seq, bos_token_id=0,
                        eos_token_id=0)
    factory = partial(hf.causal_lm_blocks, config, dtype)
    blocks = factory()
    from actors.tied import counted_once

    n_params = counted_once(blocks)
    size = torch.tensor([], dtype=dtype).element_size()
    cuts = [round(i * len(blocks) / args.stages) for i in range(args.stages + 1)]
    plan = straight_plan(cuts, 2)
    owned = [sum(p.numel() for b in blocks[lo:hi] for p in b.parameters()) for lo, hi in zip(cuts, cuts[1:])]
    data = partial(hf.token_batch, vocab, seq, rows)
    t0 = time.perf_counter()
    with PipelineTrainer(factory, hf.lm_loss, partial(torch.optim.SGD, lr=1e-3), data, 2, plan=plan) as trainer:
        group = trainer.runtime._workers()
        pids = group.call(StageWorker.pid, what="pids")
        setup_s = time.perf_counter() - t0
        after_setup = [proc_kib(p, "VmRSS") * 1024 for p in pids]
        result = trainer.fit(1)
        peak = [proc_kib(p, "VmHWM") * 1024 for p in pids]
    driver_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    whole = n_params * size
    lines = [
        "# Stage actors build only their own blocks: host memory per actor",
        "",
        f"GPT-2 shape, {args.layers} layers, width {args.embd}, vocab {vocab}: **{n_params / 1e9:.2f} B parameters** "
        f"(tied embedding counted once), {args.dtype} weights ({whole / GIB:.2f} GiB for the whole model); "
        f"{args.stages} CPU stage actors on this machine, one step of SGD on {rows} rows x {seq} tokens, "
        f"setup {setup_s:.0f} s, loss {result.final_loss:.3f}. Measured from /proc: resident memory after setup "
        "and the high-water mark after the step. Before, every actor built the whole model first "
        "(the last column: what it held at least, on top of its runtime).",
        "",
        "| stage | blocks | parameters owned | owned weights GiB | RSS after setup GiB | RSS after setup - owned GiB | "
        "peak RSS GiB | peak / owned weights | whole model GiB (before) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for j, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        mine = owned[j] * size
        lines.append(f"| {j} | {lo}-{hi - 1} | {owned[j] / 1e6:.0f} M | {mine / GIB:.2f} | {after_setup[j] / GIB:.2f} | "
                     f"{(after_setup[j] - mine) / GIB:.2f} | {peak[j] / GIB:.2f} | {peak[j] / mine:.2f} | {whole / GIB:.2f} |")
    lines += [
        "",
        f"Sum of actor peaks: {sum(peak) / GIB:.2f} GiB for {whole / GIB:.2f} GiB of weights (+ as much again in "
        f"gradients during the step). The driver's peak RSS: **{driver_peak / GIB:.2f} GiB** — it holds the model "
        "on the meta device only (structure, no weights).",
        "",
        "The tied embedding (50257 x width) is held twice, by the first and the last stage (Megatron's "
        "layout), which is why those two own more than the middle ones.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.small:
        RESULTS.write_text(text)


if __name__ == "__main__":
    os.environ.setdefault("RAY_worker_niceness", "0")
    main()
