"""Runtime benchmark: our Ray pipeline vs the simulator's prediction vs torch.distributed.pipelining.

Same model, same 2-stage cut, same micro-batches, 1F1B, CPU/gloo, one torch thread per stage:

* **ours** - :class:`orchestrator.train.trainer.PipelineTrainer` on local Ray actors (driver wall time
  per iteration, Ray dispatch included);
* **predicted** - :func:`orchestrator.costmodel.simulator.simulate` of the same plan over a cost model
  measured here: per-block forward/backward with :func:`orchestrator.profiling.profiler.profile_blocks` in a
  process with one torch thread (what each stage actor uses), the optimizer step's time per
  parameter byte, and gloo's point-to-point latency and bandwidth from a ping-pong between two
  processes with pre-posted receives (how the runtime receives);
* **torch** - ``torch.distributed.pipelining`` ``Schedule1F1B`` on two processes started with
  ``torch.multiprocessing.spawn`` (gloo on 127.0.0.1), optimizer step included like ours.

Apples to apples: two processes, one intra-op and one inter-op thread each, the same niceness
(Ray starts workers at nice 15 by default; this benchmark sets ``RAY_worker_niceness=0``, the
niceness of the spawned torch processes, because on a shared box a nice-15 process loses the CPU to
everybody else's work), the same batch every iteration (torch's benchmark feeds one fixed batch, so
ours gets a ``data_fn`` that returns one precomputed batch) and the same loss (MSE per micro-batch).
The box is shared and noisy: both process sets stay up and single iterations alternate, ours then
torch then torch then ours..., so each pair sees the same background load; the table reports
medians, quartiles and the median per-pair ratio.

Then the per-micro-batch overhead of our runtime on a trivially small model: the slope of
iteration time over the micro-batch count (compute is negligible, so the slope is the cost of one
unit's F, B, send and receive bookkeeping plus two message latencies), next to torch's.

Then the steady state: blocks of N back-to-back iterations, ours ``fit(N)`` with and without
pipelined dispatch against torch's training loop (see ``STEADY_NOTE``).

Run: ``.venv/bin/python benchmarks/runtime.py`` (writes benchmarks/results/runtime.md);
``--steady-only [ROUNDS]`` prints only the steady-state comparison; ``--quick [--json]`` the quick
steady-state comparison of :mod:`benchmarks.runtime_quick` (last stdout line one JSON object);
``--device cuda`` the same comparison on GPUs (:mod:`benchmarks.gpu_runtime`).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_worker_niceness", "0")  # before Ray starts: see the module docstring

import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.core.cluster import GBPS, flat  # noqa: E402
from orchestrator.profiling.models import example_batch, mlp  # noqa: E402
from orchestrator.core.plan import Plan, straight_plan  # noqa: E402
from orchestrator.core.profile import Profile  # noqa: E402
from orchestrator.profiling.profiler import profile_blocks  # noqa: E402
from orchestrator.costmodel.simulator import SimOptions, SimResult, simulate  # noqa: E402

BIG = (256, 512, 512, 512, 512, 512, 512, 512, 256)  # 8 blocks
TINY = (4, 4, 4, 4, 4, 4, 4, 4, 4)
BATCH, M, WARMUP = 256, 8, 3
PAIRS_BIG, PAIRS_TINY = 60, 40
STEADY_N, STEADY_ROUNDS = 30, 6  # MLP: blocks of 30 iterations, 6 rounds of the three runners
STEADY_N_TINY = 100  # tiny model at M=4, where the per-iteration dispatch is a larger share
OUT = Path(__file__).resolve().parent / "results" / "runtime.md"
KEEP = "<!-- hand-written notes below this line are kept when benchmarks/runtime.py regenerates the table -->"
PREDICTION_NOTE = """\
What the prediction includes: the simulator runs the same lowered 1F1B program as the actors, with
per-block forward/backward medians profiled here in one process with one torch thread (the actors'
setting), one message latency plus bytes / bandwidth per send (gloo ping-pong with pre-posted
receives, measured at the start of the run, one transfer at a time per link), and the optimizer
step (SGD, timed here, per parameter byte). It assumes each stage has a core to itself for the
whole iteration. It leaves out: the loss computation, Python dispatch per action, gloo's
background thread and Ray's threads competing for the two cores, and the other jobs on the box;
the row "predicted with the compute slowdown measured in our run" puts the measured compute
inflation back in, so the rest of the gap is waiting and overhead."""

STEADY_NOTE = """\
The table above times single iterations (`fit(1)`, which never overlaps dispatch). Here each
runner trains blocks of N back-to-back iterations on the same live processes, model, plan, threads
and niceness: ours `fit(N)` with `pipelined_dispatch=True` (iteration k+1 submitted to the actors
before k is gathered) and `False` (one remote call per actor per iteration, gathered before the
next is sent), and torch's `schedule.step` + `opt.step()` loop. MLP: N={n}; tiny model at M=4:
N={tiny}; {rounds} rounds, the order of the three runners rotating through all six orders; one
warm-up block each. Per-iteration time: ours as `fit` reports it (driver time between consecutive
completions; the first of a block from its submission), torch as the time between consecutive
completions of the later rank (first from the start barrier). Each block gives a median per
iteration (and a mean: block wall / N); ratios are per round, then the median over rounds."""

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_thread() -> None:
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already ran in this process
        pass


class FixedBatch:
    """``data_fn`` returning one precomputed batch for every step (what the torch baseline feeds)."""

    def __init__(self, widths: tuple[int, ...], batch: int) -> None:
        self.widths, self.batch = widths, batch
        self._data: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._data is None:
            self._data = example_batch("mlp", self.batch, 0, widths=self.widths)
        return self._data

    def __getstate__(self) -> dict[str, Any]:
        return {"widths": self.widths, "batch": self.batch, "_data": None}


# ----- torch.distributed.pipelining -----
def _torch_rank(rank: int, widths: tuple[int, ...], cut: int, microbatches: int, batch: int, port: int, cmds: Any, out: Any,
                zero_bubble: bool = False) -> None:
    """One torch pipeline rank: runs one timed iteration per "step" command until "stop".
    ``zero_bubble``: torch's ``ScheduleInterleavedZeroBubble`` (one stage per rank) instead of
    ``Schedule1F1B``; the ready message carries the rank's action order either way."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleavedZeroBubble

    _one_thread()
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
    schedule: Any
    if zero_bubble:
        schedule = ScheduleInterleavedZeroBubble([stage], n_microbatches=microbatches, loss_fn=torch.nn.functional.mse_loss)
        order = [str(a) for a in schedule.pipeline_order[rank] if a is not None]
    else:
        schedule, order = Schedule1F1B(stage, n_microbatches=microbatches, loss_fn=torch.nn.functional.mse_loss), []
    out.put((rank, "ready", os.getpriority(os.PRIO_PROCESS, 0), order))
    while (cmd := cmds.get()) != "stop":
        if cmd != "step":  # ("run", n): n back-to-back iterations, the plain training loop
            dist.barrier()
            t0, marks = time.perf_counter(), []
            for _ in range(int(cmd[1])):
                if rank == 0:
                    schedule.step(x)
                else:
                    schedule.step(target=y, losses=[])
                opt.step()
                opt.zero_grad()
                marks.append(time.perf_counter())
            dist.barrier()
            out.put((rank, t0, marks, time.perf_counter()))
            continue
        dist.barrier()
        t, c = time.perf_counter(), time.thread_time()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        opt.step()
        opt.zero_grad()
        c = time.thread_time() - c
        dist.barrier()
        out.put((rank, time.perf_counter() - t, c))
    dist.destroy_process_group()


class TorchPipeline:
    """Two live torch.distributed.pipelining ranks driven one iteration at a time (``Schedule1F1B``,
    or with ``zero_bubble`` ``ScheduleInterleavedZeroBubble``; ``orders``: torch's per-rank order then)."""

    def __init__(self, widths: tuple[int, ...], cut: int, microbatches: int, batch: int, zero_bubble: bool = False) -> None:
        ctx = mp.get_context("spawn")
        self.cmds = [ctx.Queue() for _ in range(2)]
        self.out = ctx.Queue()
        port = _free_port()
        self.procs = [ctx.Process(target=_torch_rank, args=(r, widths, cut, microbatches, batch, port, self.cmds[r], self.out, zero_bubble))
                      for r in range(2)]
        for p in self.procs:
            p.start()
        ready = sorted((self.out.get(timeout=300) for _ in range(2)), key=lambda r: r[0])
        self.nice = ready[0][2]
        self.orders: list[list[str]] = [r[3] for r in ready]

    def step(self) -> tuple[float, float]:
        """(seconds, busiest rank's main-thread CPU seconds) of one iteration."""
        for q in self.cmds:
            q.put("step")
        res = [self.out.get(timeout=300) for _ in range(2)]
        return max(r[1] for r in res), max(r[2] for r in res)

    def run(self, n: int) -> tuple[list[float], float]:
        """``n`` back-to-back iterations: (seconds between consecutive completions, where an
        iteration completes when its later rank finishes it; block wall time barrier to barrier).
        ``perf_counter`` is the system-wide monotonic clock, so the ranks' marks compare."""
        for q in self.cmds:
            q.put(("run", n))
        res = [self.out.get(timeout=600) for _ in range(2)]
        start = min(r[1] for r in res)
        done = [max(r[2][i] for r in res) for i in range(n)]
        return [b - a for a, b in zip([start] + done, done)], max(r[3] for r in res) - start

    def close(self) -> None:
        for q in self.cmds:
            q.put("stop")
        for p in self.procs:
            p.join(timeout=60)


class Ours:
    """Our trainer on the shared Ray worker group, driven one iteration at a time."""

    def __init__(self, group: Any, widths: tuple[int, ...], plan: Plan, batch: int) -> None:
        from orchestrator.train.trainer import PipelineTrainer

        self.trainer = PipelineTrainer(
            partial(mlp, widths), torch.nn.functional.mse_loss, partial(torch.optim.SGD, lr=0.01),
            FixedBatch(widths, batch), plan.num_microbatches, plan=plan, workers=group, progress=False,
        )
        self.inside: dict[bool, list[float]] = {}  # per run() block: median iteration time inside the actors

    def step(self) -> Any:
        return self.trainer.fit(self.trainer.step + 1).metrics[0]

    def run(self, n: int, pipelined: bool) -> tuple[list[float], float]:
        """``fit(n)``: (per-iteration seconds as ``fit`` measures them, i.e. between consecutive
        completions on the driver; the whole call's wall time)."""
        self.trainer.loop.dispatch(pipelined)
        result = self.trainer.fit(self.trainer.step + n)
        self.inside.setdefault(pipelined, []).append(
            statistics.median(max(m.busy_s[d] + m.bubble_s[d] for d in m.busy_s) for m in result.metrics))
        return [m.iteration_s for m in result.metrics], result.wall_s


def paired(ours: Ours, theirs: TorchPipeline, pairs: int) -> list[tuple[Any, tuple[float, float]]]:
    """Alternate single iterations of ours and torch (order flipped every pair) after warm-up.

    Both process sets stay alive; the idle one blocks on a queue or an actor call, so each pair
    of iterations sees the same background load and the per-pair ratio cancels most of it.
    """
    for _ in range(WARMUP):
        ours.step()
        theirs.step()
    out = []
    for i in range(pairs):
        if i % 2:
            t = theirs.step()
            o = ours.step()
        else:
            o = ours.step()
            t = theirs.step()
        out.append((o, t))
    return out


STEADY_ORDERS = (("pipelined", "serial", "torch"), ("torch", "serial", "pipelined"), ("serial", "pipelined", "torch"),
                 ("torch", "pipelined", "serial"), ("pipelined", "torch", "serial"), ("serial", "torch", "pipelined"))


def steady(ours: Ours, theirs: TorchPipeline, n: int, rounds: int) -> dict[str, list[tuple[list[float], float]]]:
    """Blocks of ``n`` back-to-back iterations: ours ``fit(n)`` pipelined and serial, torch's
    ``schedule.step`` loop; the order of the three rotates every round (all six orders), so each
    sees the same background load on average. One warm-up block each first."""
    runs: dict[str, Any] = {
        "pipelined": partial(ours.run, n, True), "serial": partial(ours.run, n, False), "torch": partial(theirs.run, n),
    }
    for run in runs.values():
        run()
    out: dict[str, list[tuple[list[float], float]]] = {k: [] for k in runs}
    for i in range(rounds):
        for name in STEADY_ORDERS[i % len(STEADY_ORDERS)]:
            out[name].append(runs[name]())
    return out


def steady_rows(label: str, got: dict[str, list[tuple[list[float], float]]], n: int, ours: Ours) -> list[tuple[str, str]]:
    """Per-iteration medians and per-round ratios (torch time / ours time: > 1 means ours is faster)."""
    med = {k: [statistics.median(times) for times, _ in blocks] for k, blocks in got.items()}
    mean = {k: [wall / n for _, wall in blocks] for k, blocks in got.items()}
    rows = [(f"{label}: s/iter, median over blocks of the per-block median (per-block mean incl. first dispatch) [{k}]",
             f"{statistics.median(med[k]) * 1e3:.2f} ms ({statistics.median(mean[k]) * 1e3:.2f} ms)  "
             f"[block medians {', '.join(f'{v * 1e3:.1f}' for v in med[k])}]")
            for k in ("pipelined", "serial", "torch")]
    inside = {k: statistics.median(ours.inside[k == "pipelined"][-len(got[k]):]) for k in ("pipelined", "serial")}
    rows.append((f"{label}: ours inside the actors (first action to last, slowest device), median of block medians: pipelined / serial",
                 f"{inside['pipelined'] * 1e3:.2f} / {inside['serial'] * 1e3:.2f} ms"))

    def ratio(num: str, den: str, src: dict[str, list[float]]) -> str:
        r = [a / b for a, b in zip(src[num], src[den])]
        return f"{statistics.median(r):.2f} [min {min(r):.2f}, max {max(r):.2f}]"

    rows += [
        (f"{label}: throughput ours pipelined / torch (target >= 1.0), median per-round ratio of block medians (of block means)",
         f"{ratio('torch', 'pipelined', med)} ({ratio('torch', 'pipelined', mean)})"),
        (f"{label}: throughput ours serial / torch, same", f"{ratio('torch', 'serial', med)} ({ratio('torch', 'serial', mean)})"),
        (f"{label}: throughput ours pipelined / ours serial, same",
         f"{ratio('serial', 'pipelined', med)} ({ratio('serial', 'pipelined', mean)})"),
    ]
    return rows


# ----- gloo link: latency and bandwidth -----
def _pingpong_rank(rank: int, sizes: list[int], reps: int, port: int, out: Any) -> None:
    _one_thread()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    peer = 1 - rank
    result = {}
    for numel in sizes:
        buf, back = torch.zeros(numel), torch.zeros(numel)
        times = []
        for i in range(reps + 5):
            work: Any = dist.irecv(back, peer)  # pre-posted, like the runtime's receives
            dist.barrier()
            t = time.perf_counter()
            if rank == 0:
                send: Any = dist.isend(buf, peer)
                send.wait()
                work.wait()
            else:
                work.wait()
                send = dist.isend(buf, peer)
                send.wait()
            if i >= 5:
                times.append(time.perf_counter() - t)
        result[numel * 4] = statistics.median(times) / 2  # one way
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def gloo_link(sizes: list[int], reps: int = 40) -> dict[int, float]:
    """One-way seconds per message size in bytes (half the median round trip)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(_pingpong_rank, args=(sizes, reps, _free_port(), queue), nprocs=2, join=True)
    return dict(queue.get())


# ----- ours -----
def actor_settings(group: Any) -> str:
    import ray

    def probe() -> tuple[int, int, int]:
        return torch.get_num_threads(), torch.get_num_interop_threads(), os.getpriority(os.PRIO_PROCESS, 0)

    found = {ray.get(a.__ray_call__.remote(lambda _self: probe())) for a in group.processes.actors[:2]}
    return ", ".join(f"{t} intra-op / {i} inter-op threads, nice {n}" for t, i, n in sorted(found))


# ----- prediction -----
def measured_profile(widths: tuple[int, ...], plan: Plan, batch: int) -> tuple[Profile, float]:
    """Block profile with one thread, and the optimizer step's seconds per parameter byte."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = mlp(widths)
    sample = torch.tensor_split(example_batch("mlp", batch, 0, widths=widths)[0], plan.num_microbatches)[0]
    profile = profile_blocks(blocks, sample, "mlp", int(sample.shape[0]), warmup=3, repeats=15, device="cpu")
    params = [p for b in blocks for p in b.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    steps = []
    for _ in range(20):
        for p in params:
            p.grad = torch.ones_like(p)
        t = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps.append(time.perf_counter() - t)
    torch.set_num_threads(before)
    return profile, statistics.median(steps[5:]) / profile.total_param_bytes


def predicted(plan: Plan, profile: Profile, latency_s: float, bytes_per_s: float, step_s_per_byte: float) -> SimResult:
    cluster = flat(2, gbps=bytes_per_s / GBPS).with_latency(latency_s)
    return simulate(plan, profile, cluster, SimOptions(step_s_per_param_byte=step_s_per_byte))


def _q(values: list[float], k: int) -> float:
    """k-th quartile (1 or 3) of ``values``."""
    return statistics.quantiles(values, n=4)[k - 1]


def main() -> None:
    import ray

    from actors.group import WorkerGroup

    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cuda"]:
        from benchmarks import gpu_runtime  # the same comparison on NCCL; refuses in one line without a GPU

        raise SystemExit(gpu_runtime.main(["--quick"] if "--quick" in sys.argv else []))
    if "--quick" in sys.argv:  # steady state only, one JSON line last (benchmarks/runtime_quick.py)
        from benchmarks import runtime_quick

        runtime_quick.main("--json" in sys.argv)
        return

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    group = WorkerGroup(2, use_gpu=False)
    plan = straight_plan([0, 4, 8], M)
    if "--steady-only" in sys.argv:  # quick check: only the steady-state comparison, printed, nothing written
        rounds = int(sys.argv[-1]) if sys.argv[-1].isdigit() else STEADY_ROUNDS
        for widths, m, batch, n, label in ((BIG, M, BATCH, STEADY_N, "MLP"), (TINY, 4, 64, STEADY_N_TINY, "tiny, M=4")):
            theirs = TorchPipeline(widths, 4, m, batch)
            runner = Ours(group, widths, straight_plan([0, 4, 8], m), batch)
            blocks = steady(runner, theirs, n, rounds)
            theirs.close()
            print("\n".join(f"{k}  {v}" for k, v in steady_rows(f"{label}, N={n}", blocks, n, runner)))
        group.shutdown()
        ray.shutdown()
        return
    rows: list[tuple[str, str]] = []

    # cost model measured here
    profile, step_s = measured_profile(BIG, plan, BATCH)
    boundary = int(profile.boundary_bytes(4))
    link = gloo_link([1, boundary // 4, 1 << 20])
    latency = link[4]
    bandwidth = ((1 << 22) - boundary) / max(1e-9, link[1 << 22] - link[boundary])  # slope between the two larger sizes
    sim = predicted(plan, profile, latency, bandwidth, step_s)
    sim_compute_only = simulate(plan, profile, flat(2, gbps=10.0))

    # ours and torch, alternating single iterations
    theirs = TorchPipeline(BIG, 4, M, BATCH)
    ours = Ours(group, BIG, plan, BATCH)
    pairs = paired(ours, theirs, PAIRS_BIG)
    # steady state with the same process sets: fit(N) pipelined / serial vs torch's loop
    steady_big = steady(ours, theirs, STEADY_N, STEADY_ROUNDS)
    theirs.close()
    settings = actor_settings(group)
    o_s = [o.iteration_s for o, _ in pairs]
    t_s = [t[0] for _, t in pairs]
    ratios = [t[0] / o.iteration_s for o, t in pairs]
    t_ours, t_torch, ratio = statistics.median(o_s), statistics.median(t_s), statistics.median(ratios)
    t_inside = statistics.median(max(o.busy_s[d] + o.bubble_s[d] for d in o.busy_s) for o, _ in pairs)
    cpu_ours = statistics.median(max(o.cpu_s.values(), default=0.0) for o, _ in pairs)
    cpu_torch = statistics.median(t[1] for _, t in pairs)
    compute = {d: statistics.median(sum(s.end - s.start for s in o.spans if s.device == d and s.kind in ("F", "B")) for o, _ in pairs)
               for d in (0, 1)}
    sim_busy = {d: sum(e.end - e.start for e in sim.events if e.device == d and e.kind in ("F", "B")) for d in (0, 1)}
    bubble = {d: statistics.median(o.bubble_fraction[d] for o, _ in pairs) for d in (0, 1)}
    t_pred = sim.iteration_s
    # The same cost model with each stage's compute slowed by what was measured in the run (the
    # box's other load and the two stages sharing caches): what is left is waiting and overhead.
    slowed = simulate(plan, profile, flat(2, gbps=bandwidth / GBPS).with_latency(latency),
                      SimOptions(step_s_per_param_byte=step_s, slowdown={d: compute[d] / sim_busy[d] for d in (0, 1)}))
    samples = BATCH
    rows += [
        ("model", f"mlp {BIG[0]}-{BIG[1]}x7-{BIG[-1]} (8 blocks), batch {BATCH}, {M} micro-batches, 2 stages [0,4)[4,8), 1F1B, gloo"),
        ("process settings: ours (Ray actors) / torch (spawned)", f"{settings} / 1 intra-op / 1 inter-op threads, nice {theirs.nice}"),
        ("gloo one-way time (ping-pong, pre-posted receive): 4 B / boundary message / 4 MiB",
         f"{latency * 1e6:.0f} us / {link[boundary] * 1e6:.0f} us ({boundary // 1024} KiB) / {link[1 << 22] * 1e3:.2f} ms"),
        ("cost model: message latency, bandwidth, optimizer step",
         f"{latency * 1e6:.0f} us, {bandwidth / 1e9:.2f} GB/s, {step_s * profile.total_param_bytes * 1e3:.2f} ms for all 8 blocks"),
        ("profile (1 thread): F+B per micro-batch, stage 0 / stage 1",
         f"{profile.compute_time(0, 4) * 1e3:.2f} / {profile.compute_time(4, 8) * 1e3:.2f} ms"),
        ("predicted (simulator, cost model above) s/iter", f"{t_pred * 1e3:.1f} ms  ({samples / t_pred:.0f} samples/s)"),
        ("predicted, compute only (no latency, 10 Gb/s, no optimizer step) s/iter", f"{sim_compute_only.iteration_s * 1e3:.1f} ms"),
        ("predicted with the compute slowdown measured in our run (stage 0, 1: "
         + ", ".join(f"x{compute[d] / sim_busy[d]:.2f}" for d in (0, 1)) + ") s/iter",
         f"{slowed.iteration_s * 1e3:.1f} ms  (ours / this: {slowed.iteration_s / t_ours:.2f})"),
        (f"ours (Ray actors) s/iter, median of {PAIRS_BIG} [quartiles]",
         f"{t_ours * 1e3:.1f} ms [{_q(o_s, 1) * 1e3:.1f}, {_q(o_s, 3) * 1e3:.1f}]  ({samples / t_ours:.0f} samples/s)"),
        ("ours, inside the actors (without Ray dispatch) s/iter", f"{t_inside * 1e3:.1f} ms"),
        (f"torch.distributed.pipelining Schedule1F1B s/iter, median of {PAIRS_BIG} [quartiles]",
         f"{t_torch * 1e3:.1f} ms [{_q(t_s, 1) * 1e3:.1f}, {_q(t_s, 3) * 1e3:.1f}]  ({samples / t_torch:.0f} samples/s)"),
        ("throughput ours / predicted (target >= 0.9): median; fastest quartile", f"{t_pred / t_ours:.2f}; {t_pred / _q(o_s, 1):.2f}"),
        ("throughput ours / torch (target >= 1.0): median per-pair ratio [quartiles]",
         f"{ratio:.2f} [{_q(ratios, 1):.2f}, {_q(ratios, 3):.2f}]"),
        ("main-thread CPU per iteration, busiest stage: ours / torch", f"{cpu_ours * 1e3:.1f} / {cpu_torch * 1e3:.1f} ms"),
        ("compute (F+B spans) per iteration, measured in ours / profile: stage 0; stage 1",
         "; ".join(f"{compute[d] * 1e3:.1f} / {sim_busy[d] * 1e3:.1f} ms" for d in (0, 1))),
        ("bubble fraction per device: measured (median) / predicted",
         ", ".join(f"{d}: {bubble[d]:.2f} / {sim.bubble_fraction[d]:.2f}" for d in (0, 1))),
    ]

    tiny: dict[int, tuple[float, float]] = {}
    for m in (4, 32):
        theirs = TorchPipeline(TINY, 4, m, 64)
        got = paired(Ours(group, TINY, straight_plan([0, 4, 8], m), 64), theirs, PAIRS_TINY)
        theirs.close()
        tiny[m] = (statistics.median(o.iteration_s for o, _ in got), statistics.median(t[0] for _, t in got))
    theirs = TorchPipeline(TINY, 4, 4, 64)
    ours_tiny = Ours(group, TINY, straight_plan([0, 4, 8], 4), 64)
    steady_tiny = steady(ours_tiny, theirs, STEADY_N_TINY, STEADY_ROUNDS)
    theirs.close()
    steady_table = steady_rows(f"MLP, N={STEADY_N}", steady_big, STEADY_N, ours) + steady_rows(
        f"tiny, M=4, N={STEADY_N_TINY}", steady_tiny, STEADY_N_TINY, ours_tiny)
    slope_ours = (tiny[32][0] - tiny[4][0]) / 28
    slope_torch = (tiny[32][1] - tiny[4][1]) / 28
    rows += [
        ("tiny model (4-wide mlp, batch 64), s/iter at M=4 / M=32: ours", f"{tiny[4][0] * 1e3:.2f} / {tiny[32][0] * 1e3:.2f} ms"),
        ("tiny model, s/iter at M=4 / M=32: torch", f"{tiny[4][1] * 1e3:.2f} / {tiny[32][1] * 1e3:.2f} ms"),
        ("per-micro-batch overhead (slope): ours / torch", f"{slope_ours * 1e6:.0f} us / {slope_torch * 1e6:.0f} us"),
        ("fixed per-iteration overhead (intercept): ours / torch",
         f"{(tiny[4][0] - 4 * slope_ours) * 1e3:.2f} ms / {(tiny[4][1] - 4 * slope_torch) * 1e3:.2f} ms"),
    ]
    group.shutdown()
    ray.shutdown()
    width = max(len(k) for k, _ in rows + steady_table)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows + steady_table))
    lines = [
        "# Runtime benchmark", "",
        f"Machine: {os.cpu_count()} CPU cores shared with other jobs (load varies), torch {torch.__version__}. "
        f"Ours and torch alternate single iterations after {WARMUP} warm-up each ({PAIRS_BIG} pairs for the MLP, "
        f"{PAIRS_TINY} per micro-batch count for the tiny model). Generated by `benchmarks/runtime.py`.", "",
        "| quantity | value |", "|---|---|",
    ] + [f"| {k} | {v} |" for k, v in rows]
    kept = OUT.read_text().split(KEEP, 1)[1] if OUT.exists() and KEEP in OUT.read_text() else "\n"
    lines += ["", PREDICTION_NOTE, "", "## Steady state: `fit(N)` vs torch's training loop", "",
              STEADY_NOTE.format(n=STEADY_N, tiny=STEADY_N_TINY, rounds=STEADY_ROUNDS), "",
              "| quantity | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in steady_table]
    lines += ["", KEEP]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + kept)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
