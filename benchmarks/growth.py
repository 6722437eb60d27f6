"""Live growth against checkpoint-restart, side by side in one run: a device joins a running job.

The rehearsal of tests/test_growth.py: an 8-block MLP on two devices slowed 5x (a sleep after
each compute, deterministic under load), and a third, full-speed device joins at iteration 3.
Once its worker is up, the job switches to the same three-device plan twice over (two jobs, the
same steps): by one live switch (two-worker hand-overs; the new worker joins the process group,
the survivors keep their processes and blocks) or — the baseline, the controller's
stop-and-restart — by a checkpoint, a restart of every worker on the new plan and a restore.
The controller is off, so both make exactly this one change. Reported: the stall, the state
moved, the median iteration time before the join and over the last iterations, and the max |Δ|
of the final weights against uninterrupted single-process training.

Run: ``.venv/bin/python benchmarks/growth.py [--steps N]`` → benchmarks/results/growth.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.adapt.faults import FaultSchedule, Join  # noqa: E402
from orchestrator.elastic.job_config import AdaptConfig, RunConfig, ScalingConfig, SpotConfig  # noqa: E402
from orchestrator.elastic.job_loop import ElasticJob  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402
from tests.test_growth import SLOW, TRAIN, wait_until_up  # noqa: E402


def train_config(width: int) -> Any:
    """The test's model at ``width`` (its state grows with width², its compute too)."""
    from functools import partial

    from orchestrator.profiling.models import example_batch, mlp

    widths = (64,) + (width,) * 7 + (8,)
    return replace(TRAIN, model_factory=partial(mlp, widths), data_fn=partial(example_batch, "mlp", 128, widths=widths))


def run(mode: str, steps: int, width: int, tmp: Path) -> dict[str, Any]:
    """One job; once device 2 is up, the same new plan over three devices by ``mode``."""
    import time

    name = f"{mode.replace(' ', '-')}-{width}"
    job = ElasticJob(train_config(width), ScalingConfig(devices=2, max_devices=3, plan=straight_plan([0, 4, 8], 8), node_poll_s=0),
                     RunConfig(storage=str(tmp / name), checkpoint_every=0, events=tmp / f"{name}.jsonl"),
                     AdaptConfig(enabled=False, faults=FaultSchedule(SLOW + (Join(2, 3),))), SpotConfig(enabled=False))
    try:
        job.fit(6)
        before = statistics.median(job.iteration_s[1:6])
        wait_until_up(job, 2)
        target = straight_plan([0, 3, 6, 8], 8)
        t0 = time.perf_counter()
        moved = job.switch_live(target).bytes_moved if mode == "live move" else 0.0
        if mode != "live move":
            job.restart_on(target, job.checkpoint_now("planned restart"), tuple(sorted(job.alive)))
        stall = time.perf_counter() - t0
        job.fit(steps)  # to step `steps`
        state_mb = sum(p.numel() * 4 for p in job.runtime.state_dicts()[1].values()) * 2 * 8 / 1e6
        return {"mode": mode, "width": width, "state_mb": state_mb, "moved_mb": moved / 1e6, "stall_s": stall, "before_s": before,
                "after_s": statistics.median(job.iteration_s[-8:]), "restarts": job.restarts, "diff": job.max_abs_diff()}
    finally:
        job.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--widths", default="512,1024", help="hidden widths to run (comma-separated)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "growth.md"))
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(mode, args.steps, int(w), Path(tmp)) for w in args.widths.split(",") for mode in ("live move", "checkpoint-restart")]
    lines = ["# Live growth vs checkpoint-restart (2 → 3 devices)", "",
             f"`benchmarks/growth.py --steps {args.steps} --widths {args.widths}`: 8-block MLP (8 micro-batches of 16 rows), "
             "devices 0 and 1 slowed 5x; a full-speed device 2 joins at iteration 3 (its worker starts while training goes on) "
             "and, once up, gets the same plan `[0:3)@0 [3:6)@1 [6:8)@2` either by one live switch (two-worker hand-overs, the "
             "process group re-formed with the newcomer, survivors keep their processes) or by checkpoint → restart of every "
             "worker on that plan → restore. Both in one run on this machine (2 CPU cores shared with other work: compare within "
             "a width). State: weights + SGD momentum of all 8 blocks.", "",
             "| width | state (MB) | answer | moved (MB) | stall (s) | iteration before (s) | iteration after (s) | restarts | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['width']} | {r['state_mb']:.0f} | {r['mode']} | {r['moved_mb']:.1f} | {r['stall_s']:.3f} | {r['before_s']:.3f} | "
                     f"{r['after_s']:.3f} | {r['restarts']} | {r['diff']:.1e} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
