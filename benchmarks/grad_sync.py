"""Gradient sync of a replicated stage: ours beside torch's DistributedDataParallel (issue 39, item 4).

The same stage (``BLOCKS`` blocks of ``Linear(WIDTH, WIDTH)``, about 38 MB of fp32 parameters) replicated on two
processes over gloo, one torch thread each, the same batch, micro-batches, loss and SGD optimizers (one per block):

* **ours**: the stage worker's executor (:class:`actors.execution.Executor`) running the lowered program of the
  plan ``[0, BLOCKS) on devices (0, 1)``: M forwards and backwards, the buckets all-reduced as they become final
  during the last backward (:mod:`actors.grad_sync`), the ``ALL_REDUCE`` action waiting for them, the steps;
* **DDP**: ``DistributedDataParallel`` over the same blocks, gradient accumulation with ``no_sync()`` on every
  micro-batch but the last (torch's recipe), the same losses scaled by the world size (DDP averages, we sum);
* **DDP bucket view**: the same with ``gradient_as_bucket_view=True`` (DDP without its two bucket copies).

Iterations alternate between the runners (the order flips every round), each between two barriers, and the
reported time is rank 0's barrier-to-barrier seconds; medians over rounds (a shared machine: the load is printed).
Both runners start from the same weights and see the same rows, so the last row also checks exactness: the largest
weight difference between ours and DDP after every round trained both.

Run: ``.venv/bin/python benchmarks/grad_sync.py [--rounds N]`` → ``benchmarks/results/grad_sync.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.execution import Executor  # noqa: E402
from actors.job_spec import JobSpec  # noqa: E402
from actors.transport import stage_rows  # noqa: E402
from orchestrator.core.plan import Plan, Stage  # noqa: E402
from orchestrator.schedule import lower  # noqa: E402

WIDTH, BLOCKS, BATCH, M, LR = 1536, 4, 256, 4, 0.05
OUT = ROOT / "benchmarks" / "results" / "grad_sync.md"
RUNNERS = ("ours", "ddp", "ddp_bucket_view")


def blocks() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(BLOCKS)]


def data(step: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def mse(out: Tensor, target: Tensor) -> Tensor:
    return nn.functional.mse_loss(out, target)


def _unused(*_: Any) -> Any:
    raise AssertionError("not called")


class Ours:
    """The executor of one replica of the replicated stage (what a stage worker runs each iteration)."""

    def __init__(self, rank: int) -> None:
        self.plan = Plan((Stage(0, BLOCKS, (0, 1)),), M)
        self.modules = dict(enumerate(blocks()))
        optimizers = {b: torch.optim.SGD(m.parameters(), lr=LR) for b, m in self.modules.items()}
        spec = JobSpec(_unused, mse, _unused, data)
        self.ex = Executor(spec, self.plan, rank, {0: 0, 1: 1}, lower(self.plan).programs[rank], self.modules, optimizers,
                           {(0, 1): dist.new_group([0, 1])}, [((WIDTH,), torch.float32)] * (BLOCKS + 1), BATCH,
                           torch.device("cpu"))

    def step(self, step: int) -> None:
        self.ex.run(step)

    def weights(self) -> list[Tensor]:
        return [p.detach() for b in sorted(self.modules) for p in self.modules[b].parameters()]


class DDP:
    """torch's DistributedDataParallel over the same blocks, with the same rows per micro-batch and replica."""

    def __init__(self, rank: int, bucket_view: bool) -> None:
        self.rank, self.plan = rank, Plan((Stage(0, BLOCKS, (0, 1)),), M)
        self.model = nn.Sequential(*blocks())
        self.ddp = DistributedDataParallel(self.model, process_group=dist.new_group([0, 1]), gradient_as_bucket_view=bucket_view)
        self.optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in self.model]

    def step(self, step: int) -> None:
        inputs, targets = data(step)
        for mb in range(M):
            lo, hi = stage_rows(self.plan, BATCH, 0, self.rank, (mb, 0))
            with self.ddp.no_sync() if mb < M - 1 else contextlib.nullcontext():
                loss = mse(self.ddp(inputs[lo:hi]), targets[lo:hi]) * ((hi - lo) / BATCH * 2)  # DDP averages over 2
                loss.backward()
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    def weights(self) -> list[Tensor]:
        return [p.detach() for p in self.model.parameters()]


def _rank(rank: int, port: int, rounds: int, warmup: int, queue: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    runners: dict[str, Any] = {"ours": Ours(rank), "ddp": DDP(rank, False), "ddp_bucket_view": DDP(rank, True)}
    times: dict[str, list[float]] = {name: [] for name in RUNNERS}
    for r in range(warmup + rounds):
        order = RUNNERS if r % 2 == 0 else RUNNERS[::-1]
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            runners[name].step(r)
            dist.barrier()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    diff = max(float((a - b).abs().max()) for a, b in zip(runners["ours"].weights(), runners["ddp"].weights()))
    moved = max(float((a - b).abs().max()) for a, b in zip(runners["ddp"].weights(), (p for m in blocks() for p in m.parameters())))
    if rank == 0:
        queue.put((times, diff, moved))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(rounds: int, warmup: int) -> tuple[dict[str, list[float]], float, float]:
    """Seconds per iteration of each runner, max abs(ours - DDP) over the weights, and how far training moved them."""
    queue = mp.get_context("spawn").Queue()
    mp.spawn(_rank, args=(_free_port(), rounds, warmup, queue), nprocs=2, join=True)
    return queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    args = parser.parse_args()
    load0 = os.getloadavg()[0]
    times, diff, moved = measure(args.rounds, args.warmup)
    load1 = os.getloadavg()[0]
    med = {name: statistics.median(ts) for name, ts in times.items()}
    pair = [o / d for o, d in zip(times["ours"], times["ddp"])]
    ratio = med["ours"] / med["ddp"]
    mb = sum(p.numel() * p.element_size() for b in blocks() for p in b.parameters()) / 2 ** 20
    rows = [
        ("stage", f"{BLOCKS} blocks of Linear({WIDTH}, {WIDTH}) + ReLU, {mb:.1f} MiB of fp32 parameters, replicated on 2 "
                  f"processes (gloo, CPU, one torch thread each); batch {BATCH}, M={M}, MSE, SGD"),
        ("rounds", f"{args.rounds} alternating rounds after {args.warmup} warm-up (order flipped every round)"),
        ("machine load (1-minute average) at start / end", f"{load0:.1f} / {load1:.1f} on {os.cpu_count()} cores"),
        *[(f"{name}: median / min seconds per iteration", f"{med[name] * 1e3:.1f} / {min(times[name]) * 1e3:.1f} ms")
          for name in RUNNERS],
        ("ours / DDP, ratio of medians (goal <= 1.05)", f"**{ratio:.3f}** ({'meets' if ratio <= 1.05 else 'misses'} the goal)"),
        ("ours / DDP, median of per-round ratios", f"{statistics.median(pair):.3f}"),
        ("ours / DDP with gradient_as_bucket_view, ratio of medians", f"{med['ours'] / med['ddp_bucket_view']:.3f}"),
        ("exactness: max abs(ours - DDP) over the weights after every round / max abs(change) from the initial weights",
         f"{diff:.3g} / {moved:.3g}"),
    ]
    table = "\n".join(["| what | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]])
    print(table)
    if not args.no_write:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        OUT.write_text(f"# Gradient sync of a replicated stage: ours beside DistributedDataParallel\n\n"
                       f"Written by `benchmarks/grad_sync.py` on {when}.\n\n{table}\n")


if __name__ == "__main__":
    main()
