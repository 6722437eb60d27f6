"""Runtime benchmark: our Ray pipeline vs the simulator's prediction vs torch.distributed.pipelining.

Same model, same 2-stage cut, same micro-batches, 1F1B, CPU/gloo, one torch thread per stage:

* **ours** - :class:`orchestrator.trainer.PipelineTrainer` on local Ray actors (driver wall time
  per iteration, Ray dispatch included);
* **predicted** - :func:`orchestrator.simulator.simulate` of the same plan over a profile measured
  here with :func:`orchestrator.profiler.profile_blocks` (one thread, like a stage);
* **torch** - ``torch.distributed.pipelining`` ``Schedule1F1B`` on two processes started with
  ``torch.multiprocessing.spawn`` (gloo on 127.0.0.1), optimizer step included like ours.

Then the per-micro-batch overhead of our runtime on a trivially small model: the slope of
iteration time over the micro-batch count (compute is negligible, so the slope is the cost of one
unit's F, B, send and receive bookkeeping), next to torch's on the same model.

Run: ``.venv/bin/python benchmarks/runtime.py`` (writes benchmarks/results/runtime.md).
"""

from __future__ import annotations

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.cluster import flat  # noqa: E402
from orchestrator.models import example_batch, mlp  # noqa: E402
from orchestrator.plan import Plan, straight_plan  # noqa: E402
from orchestrator.profiler import profile_blocks  # noqa: E402
from orchestrator.simulator import simulate  # noqa: E402

BIG = (256, 512, 512, 512, 512, 512, 512, 512, 256)  # 8 blocks
TINY = (4, 4, 4, 4, 4, 4, 4, 4, 4)
BATCH, M, WARMUP, ITERS = 256, 8, 3, 15
OUT = Path(__file__).resolve().parent / "results" / "runtime.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----- torch.distributed.pipelining -----
def _torch_rank(rank: int, widths: tuple[int, ...], cut: int, microbatches: int, batch: int, iters: int, port: int, out: Any) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    blocks = mlp(widths)
    mine = torch.nn.Sequential(*(blocks[:cut] if rank == 0 else blocks[cut:]))
    opt = torch.optim.SGD(mine.parameters(), lr=0.01)
    x, y = example_batch("mlp", batch, 0, widths=widths)
    mb = torch.tensor_split(x, microbatches)[0]
    with torch.no_grad():
        mid = torch.nn.Sequential(*blocks[:cut])(mb)
    stage = PipelineStage(mine, rank, 2, torch.device("cpu"), input_args=(mb if rank == 0 else mid,))
    schedule = Schedule1F1B(stage, n_microbatches=microbatches, loss_fn=torch.nn.functional.mse_loss)
    times = []
    for i in range(WARMUP + iters):
        dist.barrier()
        t = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        opt.step()
        opt.zero_grad()
        dist.barrier()
        if i >= WARMUP:
            times.append(time.perf_counter() - t)
    if rank == 1:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def torch_pipelining(widths: tuple[int, ...], cut: int, microbatches: int, batch: int, iters: int = ITERS) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(_torch_rank, args=(widths, cut, microbatches, batch, iters, _free_port(), queue), nprocs=2, join=True)
    return float(queue.get())


# ----- ours -----
def ours(group: Any, widths: tuple[int, ...], plan: Plan, batch: int, iters: int = ITERS) -> tuple[float, Any]:
    from orchestrator.trainer import PipelineTrainer

    trainer = PipelineTrainer(
        partial(mlp, widths), torch.nn.functional.mse_loss, partial(torch.optim.SGD, lr=0.01),
        partial(example_batch, "mlp", batch, widths=widths), plan.num_microbatches, plan=plan, workers=group, progress=False,
    )
    result = trainer.fit(WARMUP + iters)
    times = [m.iteration_s for m in result.metrics[WARMUP:]]
    inside = [max(m.busy_s[d] + m.bubble_s[d] for d in m.busy_s) for m in result.metrics[WARMUP:]]
    return statistics.median(times), (statistics.median(inside), result.metrics[-1])


def predicted(widths: tuple[int, ...], plan: Plan, batch: int) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    sample = torch.tensor_split(example_batch("mlp", batch, 0, widths=widths)[0], plan.num_microbatches)[0]
    profile = profile_blocks(mlp(widths), sample, "mlp", int(sample.shape[0]), warmup=3, repeats=15, device="cpu")
    torch.set_num_threads(os.cpu_count() or 1)
    return simulate(plan, profile, flat(2, gbps=10.0)).iteration_s


def main() -> None:
    import ray

    from actors.group import WorkerGroup

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    group = WorkerGroup(2, use_gpu=False)
    plan = straight_plan([0, 4, 8], M)
    rows: list[tuple[str, str]] = []
    # Alternate the two real runs and keep each one's best median: the box is shared, and load
    # from other processes would otherwise bias whichever ran during it.
    runs = [(ours(group, BIG, plan, BATCH), torch_pipelining(BIG, 4, M, BATCH)) for _ in range(2)]
    best = min(runs, key=lambda r: r[0][0])[0]
    t_ours, (t_inside, metrics) = best
    t_torch = min(r[1] for r in runs)
    t_pred = predicted(BIG, plan, BATCH)
    samples = BATCH
    rows += [
        ("model", f"mlp {BIG[0]}-{BIG[1]}x7-{BIG[-1]} (8 blocks), batch {BATCH}, {M} micro-batches, 2 stages [0,4)[4,8), 1F1B, gloo"),
        ("ours (Ray actors) s/iter", f"{t_ours * 1e3:.1f} ms  ({samples / t_ours:.0f} samples/s)"),
        ("ours, inside the actors (without Ray dispatch) s/iter", f"{t_inside * 1e3:.1f} ms"),
        ("predicted (simulator, profile measured here) s/iter", f"{t_pred * 1e3:.1f} ms  ({samples / t_pred:.0f} samples/s)"),
        ("torch.distributed.pipelining Schedule1F1B s/iter", f"{t_torch * 1e3:.1f} ms  ({samples / t_torch:.0f} samples/s)"),
        ("throughput ours / predicted (target >= 0.9)", f"{t_pred / t_ours:.2f}"),
        ("throughput ours / torch (target >= 1.0)", f"{t_torch / t_ours:.2f}"),
        ("measured bubble fraction per device", ", ".join(f"{d}: {f:.2f}" for d, f in sorted(metrics.bubble_fraction.items()))),
    ]
    tiny: dict[int, tuple[float, float]] = {}
    for m in (4, 32):
        tiny_plan = straight_plan([0, 4, 8], m)
        tiny[m] = (min(ours(group, TINY, tiny_plan, 64)[0] for _ in range(2)), min(torch_pipelining(TINY, 4, m, 64) for _ in range(2)))
    slope_ours = (tiny[32][0] - tiny[4][0]) / 28
    slope_torch = (tiny[32][1] - tiny[4][1]) / 28
    rows += [
        ("tiny model (4-wide mlp), s/iter at M=4 / M=32: ours", f"{tiny[4][0] * 1e3:.2f} / {tiny[32][0] * 1e3:.2f} ms"),
        ("tiny model, s/iter at M=4 / M=32: torch", f"{tiny[4][1] * 1e3:.2f} / {tiny[32][1] * 1e3:.2f} ms"),
        ("per-micro-batch overhead (slope): ours / torch", f"{slope_ours * 1e6:.0f} us / {slope_torch * 1e6:.0f} us"),
        ("fixed per-iteration overhead (intercept): ours / torch",
         f"{(tiny[4][0] - 4 * slope_ours) * 1e3:.2f} ms / {(tiny[4][1] - 4 * slope_torch) * 1e3:.2f} ms"),
    ]
    group.shutdown()
    ray.shutdown()
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    lines = [
        "# Runtime benchmark", "",
        f"Machine: {os.cpu_count()} CPU cores, torch {torch.__version__}, one torch thread per stage; "
        f"medians over {ITERS} iterations after {WARMUP} warm-up. Generated by `benchmarks/runtime.py`.", "",
        "| quantity | value |", "|---|---|",
    ] + [f"| {k} | {v} |" for k, v in rows]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
