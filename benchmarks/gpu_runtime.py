"""GPU runtime benchmark: our Ray pipeline on NCCL vs torch.distributed.pipelining on the same GPUs.

Same model (an MLP of ``--blocks`` Linear+GELU blocks of ``--width``), same cut, same batch and
micro-batches, same optimizer (SGD), both on NCCL with one process per GPU:

* **ours** - :class:`orchestrator.train.trainer.PipelineTrainer` with ``use_gpu=True`` on local Ray
  actors, ``fit(N)`` with pipelined dispatch (driver wall time per iteration, Ray included);
* **torch** - ``torch.distributed.pipelining`` (``Schedule1F1B``; ``ScheduleGPipe`` for one
  stage, where the two are the same schedule) on processes started with
  ``torch.multiprocessing.spawn``, optimizer step included like ours.

Stages: ``min(--stages, GPUs)``. On a one-GPU machine both run one stage: the comparison then
measures the per-iteration and per-micro-batch cost of each runtime around the same kernels
(NCCL refuses two ranks on one GPU). Ours runs its rounds, then torch its rounds (both hold
the GPUs, so they cannot run at once; a lent GPU machine is not shared, unlike the CPU box);
the table reports medians and the median per-round ratio. Needs CUDA; says so and exits 2
without it.

Run: ``.venv/bin/python benchmarks/gpu_runtime.py [--quick]`` (writes
benchmarks/results/gpu_runtime.md; the last stdout line is one JSON object).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_runtime.md"


def blocks(n: int, width: int) -> list[nn.Module]:
    return [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(n)]


def batch(step: int, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)  # one fixed batch, as torch's loop below uses
    return torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torch_rank(rank: int, world: int, args: Any, port: int, iters: int, out: Any) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device)
    torch.manual_seed(0)
    model = blocks(args.blocks, args.width)
    per = args.blocks // world
    mine = nn.Sequential(*model[rank * per: (rank + 1) * per if rank < world - 1 else len(model)]).to(device)
    opt = torch.optim.SGD(mine.parameters(), lr=0.01)
    x, y = (t.to(device) for t in batch(0, args.rows, args.width))
    mb = torch.tensor_split(x, args.microbatches)[0]
    stage = PipelineStage(mine, rank, world, device, input_args=(mb,))
    kind = Schedule1F1B if world > 1 else ScheduleGPipe
    schedule = kind(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)

    def one() -> None:
        if world == 1:
            schedule.step(x, target=y, losses=[])
        elif rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        one()
    times = []
    for _ in range(args.rounds):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            one()
        torch.cuda.synchronize()
        dist.barrier()
        times.append((time.perf_counter() - t0) / iters)
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def torch_times(args: Any, world: int, iters: int) -> list[float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_torch_rank, args=(r, world, args, port, iters, out)) for r in range(world)]
    for p in procs:
        p.start()
    import queue

    deadline = time.monotonic() + 540  # inside one device call; a crashed rank must not leave us waiting
    while True:
        try:
            times = out.get(timeout=5)
            break
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit(f"gpu_runtime: torch rank failed (exit codes {[p.exitcode for p in procs]}) or timed out")
    for p in procs:
        p.join(timeout=60)
    return list(times)


def ours_times(args: Any, world: int, iters: int) -> tuple[list[float], float]:
    from orchestrator.core.plan import ScheduleKind, straight_plan
    from orchestrator.train.trainer import PipelineTrainer

    per = args.blocks // world
    cuts = [r * per for r in range(world)] + [args.blocks]
    plan = straight_plan(cuts, args.microbatches, ScheduleKind.ONE_F_ONE_B if world > 1 else ScheduleKind.GPIPE)
    trainer = PipelineTrainer(partial(blocks, args.blocks, args.width), nn.functional.mse_loss,
                              partial(torch.optim.SGD, lr=0.01), partial(batch, rows=args.rows, width=args.width),
                              args.microbatches, plan=plan, use_gpu=True, progress=False)
    try:
        trainer.fit(3)
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            trainer.fit(trainer.step + iters)
            times.append((time.perf_counter() - t0) / iters)
        predicted = plan.predicted_iteration_s or float("nan")
        return times, predicted
    finally:
        trainer.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and iterations")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_runtime: needs a CUDA GPU (this machine has none); benchmarks/runtime.py is the CPU comparison",
              file=sys.stderr)
        return 2
    if args.quick:
        args.rounds, args.iters = 3, 10
    world = max(1, min(args.stages, torch.cuda.device_count()))
    if args.blocks < world:
        print(f"gpu_runtime: --blocks {args.blocks} < {world} stages", file=sys.stderr)
        return 2
    import ray

    ray.init(address="local", num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    ours, _ = ours_times(args, world, args.iters)
    ray.shutdown()
    theirs = torch_times(args, world, args.iters)
    ratios = [t / o for o, t in zip(ours, theirs)]  # throughput ratio: ours / torch
    summary = {
        "ours_over_torch": statistics.median(ratios), "ours_iter_ms": 1e3 * statistics.median(ours),
        "torch_iter_ms": 1e3 * statistics.median(theirs), "stages": world, "microbatches": args.microbatches,
        "schedule": "1f1b" if world > 1 else "gpipe", "model": f"mlp {args.blocks}x{args.width}", "rows": args.rows,
        "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# GPU runtime: ours vs torch.distributed.pipelining\n\n"
        f"Device: {summary['device']} x {summary['gpus']}; {world} stage(s), {args.microbatches} micro-batches, "
        f"{summary['model']}, {args.rows} rows, SGD, NCCL. Median of {args.rounds} rounds of {args.iters} iterations.\n\n"
        "| | ms / iteration |\n|---|---|\n"
        f"| ours (Ray actors, pipelined dispatch) | {summary['ours_iter_ms']:.2f} |\n"
        f"| torch.distributed.pipelining | {summary['torch_iter_ms']:.2f} |\n"
        f"| ours / torch (throughput) | {summary['ours_over_torch']:.3f} |\n"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_worker_niceness", "0")
    raise SystemExit(main())
