"""Reliability evidence: repeated actor deaths, notice edge cases, notice-to-durable-checkpoint time.

1. Kill a random stage actor during a random iteration, 20 times in one run: the trainer restarts
   from the last checkpoint each time, never loses more than the steps since that checkpoint, and
   ends with the same weights as uninterrupted single-process training (allclose).
2. Notice edge cases through the real job manager: a notice during a checkpoint write, a notice
   with too little time, a corrupted checkpoint, a checkpoint of a different model.
3. Time from a preemption notice to a durable (manifest-verified) checkpoint for 10 MB – 1 GB of
   model state (parameters + optimizer state) on this machine.
4. ``--snapshot-cost [--json]``: what an in-memory snapshot after every step costs (the stall, the step time) at
   about 10 MB, 100 MB and 1 GB of state per worker; with ``--json`` the last line is the rows as one JSON list.

Run: ``.venv/bin/python benchmarks/faults.py [--kills 20] [--quick]``; writes benchmarks/results/faults.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import ray
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors import checkpoint as ckpt  # noqa: E402
from actors.group import PipelineActorError  # noqa: E402
from actors.injection import arm_kills  # noqa: E402
from actors.reference import ReferenceTrainer, allclose, max_difference  # noqa: E402
from orchestrator.core.errors import UserError  # noqa: E402
from orchestrator.profiling.models import example_batch, loss_fn, mlp  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402
from orchestrator.train.trainer import PipelineTrainer  # noqa: E402
from orchestrator.train.runtime import PipelineRuntime  # noqa: E402

WIDTHS = (8, 32, 32, 32, 32, 32, 32, 4)
MODEL = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 16, widths=WIDTHS)
SGD = partial(torch.optim.SGD, lr=0.05, momentum=0.9)


def kills(count: int, seed: int, tmp: Path) -> list[str]:
    """``count`` deaths of random actors at random steps; checkpoints every 2 steps."""
    rng = random.Random(seed)
    plan = straight_plan([0, 2, 4, 5, 7], 4)
    steps = 2 * count + 4
    chosen = sorted(rng.sample(range(1, steps), count))
    kill_at = [(s, rng.randrange(4)) for s in chosen]
    trainer = arm_kills(PipelineTrainer(MODEL, loss_fn("mlp"), SGD, DATA, 4, plan=plan, checkpoint_dir=tmp / "kills",
                                        checkpoint_every=2, max_failures=count, progress=False), kill_at)
    t0 = time.perf_counter()
    result = trainer.fit(steps)
    wall = time.perf_counter() - t0
    got = trainer.state_dicts()
    trainer.shutdown()
    reference = ReferenceTrainer(MODEL, loss_fn("mlp"), SGD, DATA, 4)
    reference.train(steps)
    exact = allclose(got, reference.state_dicts())
    redone = sum(s % 2 for s, _ in kill_at)  # steps since the last checkpoint (every 2 steps) at each death
    return [
        f"| actor deaths injected | {len(kill_at)} at steps {', '.join(str(s) for s, _ in kill_at)} |",
        f"| restarts performed | {result.restarts} |",
        f"| steps completed | {len(result.losses)} of {steps} |",
        f"| steps redone (bounded by the checkpoint interval, 2) | {redone} |",
        f"| final weights allclose to uninterrupted single-process | {exact} (max abs diff {max_difference(got, reference.state_dicts()):.1e}) |",
        f"| wall time | {wall:.1f} s ({wall / max(1, result.restarts):.2f} s per recovery incl. training) |",
    ]


MODES = ("restart", "in_place", "in_place_snapshots")


def unnoticed_death(mode: str, kill_step: int, device: int, tmp: Path, checkpoint_every: int = 4, after: int = 6) -> dict[str, float]:
    """One death without notice (the ``Kill`` rehearsal: the worker's process exits mid-step) under ``mode``:

    * ``restart``: every worker is replaced and state is read from the newest checkpoint (``PipelineRuntime.recover``);
    * ``in_place``: the survivors keep their processes and roll back to the newest checkpoint's step from their
      own host copies, the dead worker's blocks from storage (``recover_in_place``);
    * ``in_place_snapshots``: the same with an in-memory snapshot after every step (``snapshot_in_memory``).

    ``stall_s``: from the completion of the last step before the death to the completion of the first step after
    the recovery (detection included); ``lost_steps``: steps computed again; ``iteration_s``: the median step
    before the death. The trainer's primitives are the ones the job loop calls."""
    plan = straight_plan([0, 2, 4, 5, 7], 4)
    survivors = [d for d in plan.devices if d != device]
    cuts = [0, 2, 4, 7] if device == 3 else [0, 2, 5, 7]
    rest = straight_plan(cuts, 4, devices=[[d] for d in survivors])
    trainer = arm_kills(PipelineRuntime(MODEL, loss_fn("mlp"), SGD, DATA, 4, plan=plan, checkpoint_dir=tmp / mode),
                        [(kill_step, device)])
    trainer.start()

    def one_step() -> None:  # the runtime's primitives, a checkpoint every ``checkpoint_every`` steps
        trainer.complete_step(trainer.submit_step())
        if trainer.step % checkpoint_every == 0:
            trainer.save_checkpoint()

    times: list[float] = []
    snapshot_s: list[float] = []
    snapshot_bytes = 0
    last = time.perf_counter()
    stall = lost = -1.0
    died_at = -1
    while trainer.step < kill_step + after:
        try:
            one_step()
        except PipelineActorError as exc:
            died_at = trainer.step
            if mode == "restart":
                trainer.recover(exc)
            else:
                trainer.recover_in_place([exc.device], rest)
            lost = died_at - trainer.step
            one_step()
            stall = time.perf_counter() - last
            last = time.perf_counter()
            continue
        if mode == "in_place_snapshots":
            t = time.perf_counter()
            trainer.snapshot_in_memory()  # copied in the background while the next step runs: this is what blocks
            snapshot_s.append(time.perf_counter() - t)
            if not snapshot_bytes:  # what the copies hold, read once (waited for, outside the timing)
                snapshot_bytes = max(trainer.settle_snapshots().values())
        now = time.perf_counter()
        if died_at < 0:
            times.append(now - last)
        last = now
    got = trainer.state_dicts()
    steps = trainer.step
    trainer.shutdown()
    reference = ReferenceTrainer(MODEL, loss_fn("mlp"), SGD, DATA, 4)
    reference.train(steps)
    iteration = sorted(times[1:])[len(times[1:]) // 2]
    snap = sorted(snapshot_s)[len(snapshot_s) // 2] if snapshot_s else 0.0
    return {"stall_s": stall, "lost_steps": lost, "iteration_s": iteration, "max_abs_diff": max_difference(got, reference.state_dicts()),
            "snapshot_s": snap, "snapshot_bytes": snapshot_bytes}


def death_side_by_side(tmp: Path, rounds: int) -> list[str]:
    """Each mode ``rounds`` times (kills at steps 6, 7, 9, ... on devices 1, 2, 3 in turn); median and range."""
    rng = random.Random(1)
    trials = [(rng.choice([5, 6, 7]), 1 + i % 3) for i in range(rounds)]
    rows = []
    anchor = None
    for mode in MODES:
        runs = [unnoticed_death(mode, step, dev, tmp / f"{mode}{i}") for i, (step, dev) in enumerate(trials)]
        stalls = sorted(r["stall_s"] for r in runs)
        its = sorted(r["stall_s"] / r["iteration_s"] for r in runs)
        lost = [int(r["lost_steps"]) for r in runs]
        median = stalls[len(stalls) // 2]
        anchor = anchor or median
        snap = max(r["snapshot_s"] for r in runs)
        cost = f"{snap * 1000:.0f} ms, {max(r['snapshot_bytes'] for r in runs) / 1024:.0f} KiB" if snap else "-"
        iteration = sorted(r["iteration_s"] for r in runs)[len(runs) // 2]
        rows.append(f"| {mode} | {median:.2f} s ({stalls[0]:.2f}-{stalls[-1]:.2f}) | {its[len(its) // 2]:.0f} ({its[0]:.0f}-{its[-1]:.0f}) "
                    f"| {', '.join(map(str, lost))} | {anchor / median:.1f}x | {iteration * 1000:.0f} ms | {cost} "
                    f"| {max(r['max_abs_diff'] for r in runs):.1e} |")
        print(rows[-1], flush=True)
    return rows


def edge_cases(tmp: Path) -> list[str]:
    """The job-manager edge cases, run through the same code as tests/test_job_manager.py."""
    rows = []
    good = tmp / "edge" / "step_00000001"
    trainer = PipelineTrainer(MODEL, loss_fn("mlp"), SGD, DATA, 4, plan=straight_plan([0, 3, 7], 4), progress=False)
    trainer.fit(1)
    trainer.save_checkpoint(good)
    block = next(good.glob("block_*.pt"))
    data = block.read_bytes()
    mid = len(data) // 2
    block.write_bytes(data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:])  # one flipped byte
    try:
        trainer.restore(good)
        rows.append("| corrupted block file | LOADED (bug) |")
    except UserError as exc:
        rows.append(f"| corrupted block file | refused: `{exc}` |")
    block.write_bytes(data)
    other = PipelineTrainer(partial(mlp, (8, 16, 4)), loss_fn("mlp"), SGD, partial(example_batch, "mlp", 16, widths=(8, 16, 4)), 4,
                            plan=straight_plan([0, 1, 2], 4), progress=False)
    try:
        other.restore(good)
        rows.append("| checkpoint of a different model | LOADED (bug) |")
    except UserError as exc:
        rows.append(f"| checkpoint of a different model | refused: `{exc}` |")
    other.shutdown()
    torn = tmp / "edge" / "step_00000002"
    shutil.copytree(good, torn)
    (torn / "manifest.json").unlink()
    rows.append(f"| torn checkpoint (no manifest) | latest() picks `{ckpt.latest(tmp / 'edge').name}` |")  # type: ignore[union-attr]
    trainer.shutdown()
    rows.append("| notice during a checkpoint write; notice with too little time | see tests/test_job_manager.py "
                "(`test_notice_during_checkpoint_write_is_handled_after_the_write`, `test_notice_too_short_falls_back_to_last_durable_checkpoint`, "
                "`test_checkpoint_finishing_after_deadline_is_discarded`) |")
    return rows


def checkpoint_latency(sizes_mb: list[int], tmp: Path) -> list[str]:
    """Notice → durable checkpoint: 4 actors each write their blocks, then the manifest is written and verified."""
    rows = []
    for size in sizes_mb:
        # Adam keeps two moments per parameter: state = 3 × parameter bytes.
        params = int(size * 2**20 / 4 / 3)
        width = int((params / 8) ** 0.5)
        widths = (width,) * 9
        trainer = PipelineTrainer(partial(mlp, widths), loss_fn("mlp"), partial(torch.optim.Adam, lr=1e-3),
                                  partial(example_batch, "mlp", 8, widths=widths), 4, plan=straight_plan([0, 2, 4, 6, 8], 4),
                                  progress=False)
        trainer.fit(1)
        target = tmp / f"size{size}"
        t0 = time.perf_counter()
        trainer.save_checkpoint(target)
        ckpt.verify(target)
        took = time.perf_counter() - t0
        written = sum(p.stat().st_size for p in target.iterdir())
        rows.append(f"| {size} MB | {written / 2**20:.0f} MB | {took:.2f} s | {written / 2**20 / took:.0f} MB/s |")
        trainer.shutdown()
        shutil.rmtree(target, ignore_errors=True)
    return rows


def snapshot_cost(size_mb: int, rounds: int, store_bytes: int, steps: int = 3) -> dict[str, float]:
    """The in-memory snapshots' cost at ``size_mb`` of state (parameters + SGD momentum) per worker: the faults
    benchmark's 4-stage MLP pipeline widened so that each worker holds about that much (the step grows with the
    state, as a real model's does). Side by side in one run, ``rounds`` times ``steps`` steps each of: no snapshots;
    a snapshot after every step as the job takes it (``snapshot_in_memory``: copied while the next step runs); and
    each snapshot waited for at once (``settle_snapshots``: the copy and the neighbour's copy between steps, as a
    synchronous snapshot costs). ``blocking_s``: per snapshot, the driver's time in ``snapshot_in_memory`` plus the
    longest wait of a worker's optimizer step for its copy (the ``copy_wait`` spans of the step after); medians.
    Measured in the steady state of a long run: the warm-up takes snapshots until the object store's memory
    (``store_bytes``) was written once (before that, each put also faults in fresh pages of the store)."""
    width = int((size_mb * 2**20 / 8 / 2) ** 0.5)  # two width x width blocks per worker, 4 bytes + 4 of momentum each
    widths = (width,) * 9
    runtime = PipelineRuntime(partial(mlp, widths), loss_fn("mlp"), SGD, partial(example_batch, "mlp", 16, widths=widths), 4,
                              plan=straight_plan([0, 2, 4, 6, 8], 4))
    used = MemoryPeak()
    runtime.start()
    for _ in range(2 + store_bytes // (4 * size_mb * 2**20)):
        runtime.snapshot_in_memory()
        runtime.complete_step(runtime.submit_step())
    runtime.settle_snapshots()
    plain: list[float] = []
    overlapped: list[float] = []
    blocking: list[float] = []
    waited: list[float] = []

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        m = runtime.complete_step(runtime.submit_step())
        stall = max([sum(s.end - s.start for s in m.spans if s.kind == "copy_wait" and s.device == d) for d in runtime.plan.devices])
        return time.perf_counter() - t0, stall

    for _ in range(rounds):
        plain += [step()[0] for _ in range(steps)]
        for _ in range(steps):
            t0 = time.perf_counter()
            runtime.snapshot_in_memory()
            call = time.perf_counter() - t0
            took, stall = step()
            overlapped.append(call + took)
            blocking.append(call + stall)
        runtime.settle_snapshots()
        for _ in range(steps):
            t0 = time.perf_counter()
            runtime.snapshot_in_memory()
            runtime.settle_snapshots()
            call = time.perf_counter() - t0
            waited.append(call + step()[0])
    state = 2 * (width * width + width) * 8 / 2**20  # two Linear(width, width) per worker: weight + bias, and momentum
    peak = used.stop()
    runtime.shutdown()
    med = statistics.median
    return {"state_mb": round(state, 1), "step_s": round(med(plain), 4), "step_s_with_snapshots": round(med(overlapped), 4),
            "blocking_s": round(med(blocking), 4), "step_s_with_waited_snapshots": round(med(waited), 4),
            "host_gb": round(peak, 2)}


class MemoryPeak:
    """The machine's used memory (total − available, the object store's shared memory included) at its highest
    since this was made, above what was used then: sampled every 0.1 s by a thread."""

    def __init__(self) -> None:
        self._base = self._peak = self._used()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @staticmethod
    def _used() -> float:
        fields = meminfo_gb()
        return fields["MemTotal"] - fields["MemAvailable"]

    def _watch(self) -> None:
        while not self._done.wait(0.1):
            self._peak = max(self._peak, self._used())

    def stop(self) -> float:
        """GB above the start at the highest point."""
        self._done.set()
        self._thread.join()
        return self._peak - self._base


SNAPSHOT_TITLE = "## In-memory snapshot cost (`--snapshot-cost`)"
SNAPSHOT_MEMORY_FACTOR = 4.4
"""Host memory per worker in multiples of its state with snapshots on: the state and its gradients (1.5), two
generations of its snapshot in the object store (2; the neighbour's copy is the same object on one node), the
optimizer step's temporaries and the process (about 17 GB measured at 4 x 1 GB)."""
STORE_PER_STATE = 2.5
"""Ray's object store per worker in multiples of its state: two generations of snapshots and room (Ray's default,
30% of memory, would spill the second generation of 1 GB per worker to disk)."""


def meminfo_gb() -> dict[str, float]:
    """/proc/meminfo's fields in GB."""
    with open("/proc/meminfo") as f:
        return {k: int(v.split()[0]) / 2**20 for k, v in (line.split(":", 1) for line in f)}


def available_gb() -> float:
    return meminfo_gb()["MemAvailable"]


def settled_available_gb(within_s: float = 30.0) -> float:
    """Available memory once it stops growing (an earlier row's processes still exiting), at most ``within_s``."""
    last, deadline = available_gb(), time.monotonic() + within_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = available_gb()
        if now < last + 0.1:
            return max(now, last)
        last = now
    return last


def snapshot_table(rows: list[dict[str, float]], skipped: list[str]) -> list[str]:
    return [SNAPSHOT_TITLE, "",
            "A snapshot after every step (`RunConfig(snapshot_every=1)`) on the 4-stage MLP pipeline widened to each "
            "state size per worker (parameters + SGD momentum), measured side by side in one run: steps without "
            "snapshots, with snapshots copied while the next step runs (each worker puts its state into Ray's object "
            "store, once, and its optimizer step waits for that copy; the neighbour maps the same object, without a "
            "copy on one node), and with each snapshot waited for between steps (what a synchronous snapshot costs). "
            "Blocking: the driver's call plus the longest wait of an optimizer step for its copy; medians. Host "
            "memory: the machine's used memory at its highest during the row, above what it was before the workers "
            "started (4 workers: state, gradients, the optimizer's temporaries, snapshots).", "",
            "| state per worker | step | step with snapshots (overlapped) | blocking per step | blocking / step "
            "| step with snapshots waited for | host memory |", "|---|---|---|---|---|---|---|",
            *(f"| {r['state_mb']:.0f} MB | {r['step_s'] * 1000:.0f} ms | {r['step_s_with_snapshots'] * 1000:.0f} ms "
              f"({r['step_s_with_snapshots'] / r['step_s'] - 1:+.0%}) | {r['blocking_s'] * 1000:.1f} ms | "
              f"{r['blocking_s'] / r['step_s']:.1%} | {r['step_s_with_waited_snapshots'] * 1000:.0f} ms "
              f"({r['step_s_with_waited_snapshots'] / r['step_s'] - 1:+.0%}) | {r['host_gb']:.1f} GB |" for r in rows), "",
            *([f"Not run here: {'; '.join(skipped)} (host memory per worker is about {SNAPSHOT_MEMORY_FACTOR:.1f}x its state "
               "with snapshots on: state and gradients, two generations of its snapshot in Ray's object store).", ""]
              if skipped else []),
            f"Machine: {os.cpu_count()} cores shared with other jobs (load average {os.getloadavg()[0]:.1f} at the end). "
            "Where training keeps every core busy, as here, the copies' CPU time shows as a longer step (overlapped "
            "or waited for alike) while the stall stays small: this model's step is bound by memory bandwidth (16 "
            "rows through width x width layers) and a snapshot reads and writes every byte of the state once more, "
            "on cores training already fills. Here overlapping costs step time rather than saving it (the overlapped "
            "column is above the waited one: the copies contend with training for the same cores and memory). On a "
            "GPU the copies run on the copy engine and on host cores training leaves idle. The warm-up takes "
            "snapshots until the object store's size was written once (a long run's steady state: until then a put "
            "may also fault in fresh pages of the store). Before this design the snapshot was one synchronous "
            "call between steps: 45 ms of a 79 ms step on the faults benchmark's small model (57%), all of it "
            "blocking; with copies in each worker's own memory, host memory was about 8x the state per worker and "
            "1 GB per worker did not fit in this machine's 23 GB.", ""]


def write_section(section: list[str], title: str) -> None:
    """Put ``section`` (starting with the heading ``title``) into faults.md in place of its last run's."""
    out = ROOT / "benchmarks" / "results" / "faults.md"
    text = out.read_text() if out.exists() else "# Reliability (benchmarks/faults.py)\n"
    head, _, rest = text.partition(title)
    tail = rest[rest.find("\n## "):] if "\n## " in rest else ""
    out.write_text(head.rstrip("\n") + "\n\n" + "\n".join(section).rstrip("\n") + "\n" + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="5 kills, sizes up to 100 MB")
    parser.add_argument("--rounds", type=int, default=3, help="deaths per recovery mode in the side-by-side table")
    parser.add_argument("--deaths-only", action="store_true",
                        help="only the side-by-side table; the other sections of faults.md are kept from their last run")
    parser.add_argument("--snapshot-cost", action="store_true",
                        help="only the in-memory snapshots' cost at about 10 MB, 100 MB and 1 GB of state per worker")
    parser.add_argument("--sizes", default="10,100,1000", help="with --snapshot-cost: MB of state per worker")
    parser.add_argument("--json", action="store_true", help="with --snapshot-cost: the rows as one JSON list, last line")
    args = parser.parse_args()
    if args.snapshot_cost:
        rows, skipped = [], []
        for size in [int(x) for x in args.sizes.split(",")]:
            need, free = 4 * SNAPSHOT_MEMORY_FACTOR * size / 1024, settled_available_gb()
            if need > 0.9 * free:  # 4 workers' state, gradients and two generations of snapshots
                skipped.append(f"{size} MB per worker needs about {need:.0f} GB, {free:.0f} GB were available")
                print(f"snapshot cost skipped: {skipped[-1]}", file=sys.stderr, flush=True)
                continue
            # a Ray of its own per size: the object store's pages stay with it until it shuts down
            store = int(4 * STORE_PER_STATE * size * 2**20 + 2**30)
            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=store)
            try:
                rows.append(snapshot_cost(size, rounds=4 if size < 100 else 2, store_bytes=store))
            finally:
                ray.shutdown()
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        section = snapshot_table(rows, skipped)
        write_section(section, section[0])
        print("\n".join(section))
        if args.json:
            print(json.dumps(rows))
        return
    kills_n = 5 if args.quick else args.kills
    sizes = [10, 100] if args.quick else [10, 100, 300, 1000]
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="faults-"))
    try:
        load = os.getloadavg()[0]
        lines = ["# Reliability (benchmarks/faults.py)", "",
                 f"Machine: {os.cpu_count()} cores (load average {load:.1f} at the start), {torch.get_num_threads()} torch threads, "
                 "local Ray, gloo; 4-stage MLP pipeline, SGD+momentum.", "",
                 "## A death without notice: full restart vs in place vs in place with in-memory snapshots", "",
                 f"{args.rounds} deaths per mode (the `Kill` rehearsal: a stage worker's process exits mid-step), checkpoints every "
                 "4 steps (synchronous). Stall: from the completion of the last step before the death to the completion of the "
                 "first step after the recovery, detection included; in iterations: stall / median step time before the death. "
                 "Lost steps: steps computed again, per death. In place: the survivors keep their processes, re-form their "
                 "process group and continue on a 3-stage plan; the dead worker's blocks come from storage (the checkpoint) or "
                 "from its neighbour's in-memory copy (snapshots).", "",
                 "Snapshot cost: the median `snapshot_in_memory` call between two steps (what blocks the driver: the "
                 "copies themselves run in the background while the next step runs, which the step column shows) and the "
                 "bytes of state in the copies per worker (its own two generations and its neighbour's newest, in Ray's object store; the checkpoint's host copy included).", "",
                 "| recovery | stall (median, range) | stall in iterations | lost steps | vs full restart | step (median) "
                 "| snapshot cost per step | max abs diff |",
                 "|---|---|---|---|---|---|---|---|", *death_side_by_side(tmp, args.rounds), ""]
        if args.deaths_only:
            out = ROOT / "benchmarks" / "results" / "faults.md"
            kept = out.read_text().split("## Random actor deaths", 1) if out.exists() else []
            if len(kept) == 2:
                lines += ["Sections below: from the last full run (checkpoints every 2 steps).", "", "## Random actor deaths" + kept[1]]
            text = "\n".join(lines).rstrip("\n") + "\n"
            print(text)
            out.write_text(text)
            return
        lines += ["Checkpoints every 2 steps below.", "",
                 "## Random actor deaths", "", "| what | result |", "|---|---|", *kills(kills_n, 0, tmp), "",
                 "## Bad checkpoints and notices", "", "| case | handling |", "|---|---|", *edge_cases(tmp), "",
                 "## Notice → durable checkpoint", "", "| model state | written | time | rate |", "|---|---|---|---|",
                 *checkpoint_latency(sizes, tmp), "",
                 "An AWS spot notice gives 120 s and GCP/Azure about 30 s; the job manager checkpoints only when the "
                 "measured checkpoint time plus a margin fits, else it falls back to the last durable checkpoint."]
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "benchmarks" / "results" / "faults.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = out.read_text().partition(SNAPSHOT_TITLE)[2] if out.exists() else ""  # --snapshot-cost's section: from its last run
    out.write_text(text + (f"\n{SNAPSHOT_TITLE}{kept}" if kept else ""))


if __name__ == "__main__":
    main()
