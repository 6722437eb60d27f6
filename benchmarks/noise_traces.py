"""Record measurement-noise traces from live Ray pipelines, for replay through the controller.

Why: the controller must not move blocks when nothing changed, and log-normal noise in the
simulator is only a guess at what a real runtime reports. This script runs the live benchmark's
pipeline (4 Ray stage actors, gloo, MLP of width 1024, Adam) for a number of iterations with no
injected change and stores, per iteration, what the controller would observe relative to the
trace's own median: each device's speed multiplier (expected compute / reported compute), each
used link's bandwidth multiplier and the iteration time's multiplier. Those multipliers carry the
machine's real noise — CPU contention of four actors on shared cores, gloo latency, scheduler
hiccups, their correlations between devices and over time — and nothing of the model or the plan,
so :class:`orchestrator.adapt.SimulatedPipeline` can replay them on any plan and scenario
(``SimulatedCosts(trace=...)``).

Run: ``python benchmarks/noise_traces.py [--iterations 40] [--name NAME]``; writes
``tests/data/noise_traces/NAME.json`` (small: a few KB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from orchestrator.core.cluster import flat  # noqa: E402
from orchestrator.adapt import FaultSchedule  # noqa: E402
from orchestrator.adapt.monitor import expected_compute  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402

OUT = ROOT / "tests" / "data" / "noise_traces"


def record(iterations: int, bounds: list[int]) -> dict[str, object]:
    import ray
    import torch.nn.functional as F

    from actors.group import WorkerGroup
    from adaptive_live import LIVE_M, _live_data, _live_model, _live_optimizer
    from orchestrator.adapt.live import measured_profile
    from orchestrator.elastic.harness import RayPipeline
    from orchestrator.train.runtime import PipelineRuntime

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    group = WorkerGroup(4, use_gpu=False)
    plan = straight_plan(bounds, LIVE_M)
    trainer = PipelineRuntime(_live_model, F.mse_loss, _live_optimizer, _live_data, LIVE_M, plan=plan, workers=group, pg_timeout_s=60)
    profile = measured_profile(PipelineRuntime(_live_model, F.mse_loss, _live_optimizer, _live_data, LIVE_M, plan=plan,
                                               workers=group, pg_timeout_s=60))
    pipe = RayPipeline(trainer, flat(4, 10), FaultSchedule(), profile)
    pipe.run_iteration()  # warm-up, not recorded
    metrics = [pipe.run_iteration() for _ in range(iterations)]
    group.shutdown()
    expect = expected_compute(plan, profile)
    speeds = {d: [expect[d] / m.compute_s[d] for m in metrics] for d in sorted(expect)}
    links = sorted({link for m in metrics for link in m.link_bytes})
    bws = {lk: [m.link_bytes.get(lk, 0.0) / m.link_s[lk] if m.link_s.get(lk) else 0.0 for m in metrics] for lk in links}
    iters = [m.iteration_s for m in metrics]

    def rel(xs: list[float]) -> list[float]:
        med = statistics.median([x for x in xs if x > 0])
        return [round(x / med, 4) if x > 0 else 1.0 for x in xs]

    return {
        "source": "benchmarks/noise_traces.py: 4 Ray stage actors (gloo, CPU), MLP width 1024, Adam, "
                  f"plan {plan.describe()}, no injected change",
        "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "speed": {str(d): rel(v) for d, v in speeds.items()},
        "link": [rel(v) for v in bws.values()],
        "iteration": rel(iters),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--name", default="live")
    ap.add_argument("--bounds", default="0,2,4,6,8", help="stage boundaries of the recorded plan (8 blocks)")
    args = ap.parse_args()
    if not 2 <= args.iterations <= 1000:
        print("--iterations must be in 2..1000", file=sys.stderr)
        return 2
    trace = record(args.iterations, [int(x) for x in args.bounds.split(",")])
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{args.name}.json"
    path.write_text(json.dumps(trace, indent=None) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
