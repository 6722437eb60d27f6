"""Preemption handling, side by side in one run: live evacuation against checkpoint-restart.

1. 4 and 8 stage actors (one per device, a small MLP so that 8 actors fit 2 CPU cores); a
   notice of 30 s and of 120 s on one device, and a loss without notice. Each case runs the
   same number of steps twice — live evacuation on, and off (checkpoint → migration → restore,
   today's baseline) — reporting lost steps, the stall, the total time and the max |Δ| of the
   final weights against uninterrupted single-process training.
2. The training stall of an asynchronous checkpoint (snapshot to host memory, upload in a
   thread) against a synchronous one, for 100 MB and 1 GB of state, to local disk and to a local
   S3 server (moto, started here).

Run: ``.venv/bin/python benchmarks/preemption.py [--quick]`` → benchmarks/results/preemption.md.
``--quick``: 12 steps per run and 100 MB only for the checkpoint stall.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors import checkpoint as ckpt  # noqa: E402
from orchestrator.adapt.faults import FaultSchedule, Kill  # noqa: E402
from orchestrator.elastic.job_config import AdaptConfig, InjectedNotice, RunConfig, ScalingConfig, SpotConfig, TrainConfig  # noqa: E402
from orchestrator.elastic.job_loop import ElasticJob  # noqa: E402
from orchestrator.profiling.models import example_batch, loss_fn, mlp  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402

WIDTHS = (16,) + (512,) * 16 + (4,)  # 17 blocks, about 16 MB of weights (+ momentum)
TRAIN = TrainConfig(model_factory=partial(mlp, WIDTHS), loss_fn=loss_fn("mlp"),
                    optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                    data_fn=partial(example_batch, "mlp", 32, widths=WIDTHS), num_microbatches=8)


def run_case(devices: int, case: str, live: bool, steps: int, at: int, out: Path) -> dict[str, Any]:
    cuts = [round(i * 17 / devices) for i in range(devices + 1)]
    notices = () if case == "loss" else (InjectedNotice(at, 30.0 if case == "notice 30 s" else 120.0, (devices // 2,)),)
    faults = FaultSchedule((Kill(devices // 2, at),)) if case == "loss" else FaultSchedule()
    job = ElasticJob(TRAIN, ScalingConfig(devices=devices, plan=straight_plan(cuts, 8)),
                     RunConfig(storage=str(out / "ckpt"), events=out / "events.jsonl", checkpoint_every=4),
                     AdaptConfig(enabled=False, faults=faults), SpotConfig(notices=notices, evacuate_live=live, margin_s=25.0))
    try:
        result = job.fit(steps)
        diff = job.max_abs_diff()
    finally:
        job.close()
    handled = [e for e in result.events if e["event"] in ("preemption_handled",)]
    resumed = [e for e in result.events if e["event"] in ("resumed", "recovered")]
    lost = handled[0]["lost_steps"] if handled else sum(e["lost_steps"] for e in resumed)
    stall = handled[0]["stall_s"] if handled else sum(e.get("stall_s", 0.0) for e in resumed)
    iteration = handled[0]["iteration_s"] if handled else (resumed[0].get("iteration_s", float("nan")) if resumed else float("nan"))
    left = [e["stall_s"] for e in result.events if e["event"] == "evacuated_left"]
    return {"devices": devices, "case": case, "mode": handled[0]["mode"] if handled else "restart (failure policy)",
            "leave_s": left[0] if left else None,
            "lost": lost, "stall_s": stall, "iteration_s": iteration, "total_s": result.wall_s, "diff": diff}


LATER_ITERATIONS = 20  # iterations run on while an asynchronous upload goes on, before waiting for its end
REPEATS = 3  # synchronous and periodic (warm) asynchronous checkpoints measured per row; the table shows medians


def checkpoint_stall(mb: int, where: str, rows: int = 32) -> dict[str, Any]:
    """The training stall of checkpointing ``mb`` MB of weights + SGD momentum, synchronously vs asynchronously.

    Measured as the runtime meets it: the checkpoint is asked for after an optimizer step, then the next iteration
    runs (forward and backward over every block, then the step). The stall is that iteration's time minus the
    median of plain ones. Synchronous: every block is written first. Asynchronous: the buffers are copied at once,
    the parameters and optimizer state by the upload thread while the forward and backward run; the step waits for
    that copy (``actors.checkpoint.deferred_snapshot``), and the blocks are uploaded while training goes on."""
    blocks = 8
    per = int(mb * 2**20 / 4 / 2 / blocks)  # float32, weights + one momentum buffer
    modules = [torch.nn.Linear(per // 1024, 1024, bias=False) for _ in range(blocks)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in modules]
    inputs = [torch.randn(rows, m.in_features) for m in modules]

    def forward_backward() -> None:
        for m, x in zip(modules, inputs):
            m(x).sum().backward()

    def step() -> None:
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)

    def iteration() -> float:
        t0 = time.perf_counter()
        forward_backward()
        step()
        return time.perf_counter() - t0

    def plain() -> float:
        """The reference each measurement is compared with: the median of the plain iterations just before it
        (side by side, since the machine's load drifts over a row's minute)."""
        return statistics.median(iteration() for _ in range(3))

    def sync_checkpoint(name: str) -> tuple[float, float]:
        base = plain()
        t0 = time.perf_counter()
        for b, (m, o) in enumerate(zip(modules, opts)):
            ckpt.write_block(f"{where}/{name}", b, m, o)
        forward_backward()
        step()
        return time.perf_counter() - t0 - base, base

    def async_checkpoint(name: str, warm: dict[int, Any]) -> tuple[float, float, float, bool, ckpt.BackgroundWrite]:
        base = plain()
        at_checkpoint = [m.weight.detach().clone() for m in modules]
        t0 = time.perf_counter()
        upload = ckpt.BackgroundWrite(f"{where}/{name}", [ckpt.deferred_snapshot(b, m, o, into=warm.get(b))
                                                          for b, (m, o) in enumerate(zip(modules, opts))])
        forward_backward()
        upload.snapshotted.wait()
        step()  # the weights change while the blocks are uploaded
        stall = max(0.0, time.perf_counter() - t0 - base)
        later = 0.0  # what the upload still costs the iterations that run while it goes on
        for _ in range(LATER_ITERATIONS):
            if upload.done():
                break
            later += iteration() - base
        entries = upload.result()
        upload_s = time.perf_counter() - t0
        exact = all(torch.equal(ckpt.read_block(f"{where}/{name}", e)["model"]["weight"], at_checkpoint[int(e["block"])]) for e in entries)
        return stall, later, upload_s, exact, upload

    iteration()
    syncs = [sync_checkpoint(f"sync-{k}") for k in range(REPEATS)]
    sync, base = (statistics.median(x[i] for x in syncs) for i in range(2))
    # The first asynchronous checkpoint allocates its host buffers; later ones (a job's periodic checkpoints) copy
    # into the previous upload's buffers (BackgroundWrite.staged): both are reported, the warm one is the steady state.
    cold, _, _, exact, last = async_checkpoint("async-first", {})
    warm = []
    for k in range(REPEATS):
        *measured, ok, last = async_checkpoint(f"async-{k}", dict(last.staged))
        warm.append(measured)
        exact = exact and ok
    stall, later, upload_s = (statistics.median(w[i] for w in warm) for i in range(3))
    return {"mb": mb, "rows": rows, "where": where.split("://")[0] if "://" in where else "local disk", "iteration_s": base,
            "sync_s": sync, "async_stall_s": stall, "cold_stall_s": cold, "later_s": later, "upload_s": upload_s, "exact": exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "preemption.md"))
    parser.add_argument("--stall-only", action="store_true", help="only part 2; replaces that section of --out in place")
    args = parser.parse_args()
    import ray

    steps, at = (12, 5) if args.quick else (40, 9)
    rows = []
    if not args.stall_only:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
        with tempfile.TemporaryDirectory() as tmp:
            for devices in (4, 8):
                for case in ("notice 30 s", "notice 120 s", "loss"):
                    for live in ((True, False) if case != "loss" else (True,)):
                        out = Path(tmp) / f"{devices}-{case.replace(' ', '')}-{live}"
                        rows.append(run_case(devices, case, live, steps, at, out))
                        print(json.dumps(rows[-1]), flush=True)
        ray.shutdown()
    stalls = []
    from moto.server import ThreadedMotoServer
    import boto3

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1").create_bucket(Bucket="bench")
    try:
        for mb in ((100,) if args.quick else (100, 1024)):
            for batch_rows in (32, 256):  # little compute per byte of state, and more: the copy hides behind compute
                for where in ("local", "s3"):
                    with tempfile.TemporaryDirectory() as tmp:
                        stalls.append(checkpoint_stall(mb, tmp if where == "local" else f"s3://bench/{mb}-{batch_rows}", batch_rows))
                    print(json.dumps(stalls[-1]), flush=True)
    finally:
        server.stop()
    if args.stall_only:
        text = Path(args.out).read_text()
        head, found, _ = text.partition("## Checkpoint stall")
        Path(args.out).write_text((head if found else text + "\n") + "\n".join(stall_section(stalls)[1:]) + "\n")
        print(f"wrote {args.out}")
        return
    write(Path(args.out), rows, stalls, args.quick, steps, at)


def write(path: Path, rows: list[dict[str, Any]], stalls: list[dict[str, Any]], quick: bool, steps: int, at: int) -> None:
    lines = ["# Preemption: live evacuation against checkpoint-restart", "",
             f"Produced by `benchmarks/preemption.py{' --quick' if quick else ''}` on this machine (2 shared CPU cores; "
             f"CPU stage actors, gloo). {steps} steps per run; the notice (or the kill) comes after step {at}; "
             "periodic checkpoints every 4 steps; deadline margin 25 s. `stall` is the time training stood still for the handling "
             "(live: insurance snapshot + the two-worker moves; the doomed device, idle from then on, leaves the process "
             "group later, before its deadline — that re-formation is the `leave` column, `-` when the deadline lay beyond "
             "the run; restart: checkpoint + "
             "re-configuration of the surviving processes + restore — a warm restart; the `loss` rows restart every "
             "process, as a cold restart after a crash, or today's job manager after any notice, does); `total` the wall time of the whole run of the same steps; `max |Δ|` the "
             "final weights against uninterrupted single-process training.", "",
             "| stage actors | event | mode | lost steps | stall s | iteration s | stall / iteration | leave s | total s | max abs diff |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["stall_s"] / r["iteration_s"] if r["iteration_s"] == r["iteration_s"] and r["iteration_s"] > 0 else float("nan")
        lines.append(f"| {r['devices']} | {r['case']} | {r['mode']} | {r['lost']} | {r['stall_s']:.3f} | {r['iteration_s']:.3f} | "
                     f"{ratio:.2f} | {'-' if r['leave_s'] is None else format(r['leave_s'], '.3f')} | {r['total_s']:.1f} | "
                     f"{r['diff']:.1e} |")
    lines += stall_section(stalls)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def stall_section(stalls: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Checkpoint stall: asynchronous against synchronous", "",
              "State = weights + SGD momentum in 8 blocks; the checkpoint is asked for after a step and the next "
              "iteration (forward, backward, step over every block, 32 or 256 rows) runs; the stall is that iteration's time "
              "minus the median of the 3 plain iterations just before it; every stall is the median of "
              f"{REPEATS} checkpoints. Synchronous: every block is written first. Asynchronous "
              "(`actors.checkpoint.BackgroundWrite`): the parameters and optimizer state are copied by the upload thread "
              "during the forward and backward, the step waits for the copy, the upload runs while the weights change; "
              "the thread runs under Linux's SCHED_IDLE policy, so it uses only CPU time the training leaves idle "
              "(on these 2 cores, where training keeps both busy, the copy mostly runs while the step waits for it). "
              f"`async stall` is a periodic checkpoint's (the copy goes into the previous upload's host buffers); "
              "`first async stall` the first one's (fresh buffers, page faults). `later iterations' extra`: the time the "
              f"iterations run during the rest of the upload (up to {LATER_ITERATIONS}) took beyond the plain median, summed — "
              "the stall does not hide cost there. `exact`: the uploaded blocks hold the weights of the moment the "
              "checkpoint was asked for (both checkpoints). On a GPU the copy is device-to-host and training keeps its device.", "",
              "| state | rows | storage | iteration s | sync stall s | async stall s | async / sync | first async stall s | later iterations' extra s | upload done after s | exact |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in stalls:
        lines.append(f"| {s['mb']} MB | {s['rows']} | {s['where']} | {s['iteration_s']:.3f} | {s['sync_s']:.3f} | {s['async_stall_s']:.3f} | "
                     f"{s['async_stall_s'] / s['sync_s']:.1%} | {s['cold_stall_s']:.3f} | {s['later_s']:.3f} | {s['upload_s']:.3f} | {s['exact']} |")
    return lines


if __name__ == "__main__":
    main()
