"""Record measurement-noise traces from live Ray pipelines, for replay through the controller.

Why: the controller must not move blocks when nothing changed, and log-normal noise in the
simulator is only a guess at what a real runtime reports. This script runs the live benchmark's
pipeline (4 Ray stage actors, gloo, MLP of width 1024, Adam) for a number of iterations with no
injected change and stores, per iteration, what the controller would observe relative to the
trace's own median: each device's speed multiplier (expected compute / reported compute), each
used link's bandwidth multiplier and the iteration time's multiplier. Those multipliers carry the
machine's real noise — CPU contention of four actors on shared cores, gloo latency, scheduler
hiccups, their correlations between devices and over time — and nothing of the model or the plan,
so :class:`orchestrator.adapt.SimulatedRuntime` can replay them on any plan and scenario
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
from orchestrator.adapt.monitor import expected_compute  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402

OUT = ROOT / "tests" / "data" / "noise_traces"


def record(iterations: int, bounds: list[int]) -> dict[str, object]:
    import tempfile

    import torch.nn.functional as F

    from adaptive_live import LIVE_M, _live_data, _live_model, _live_optimizer
    from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig
    from orchestrator.adapt.live import to_controller_metrics

    plan = straight_plan(bounds, LIVE_M)
    train = TrainConfig(model_factory=_live_model, loss_fn=F.mse_loss, optimizer_factory=_live_optimizer, data_fn=_live_data,
                        num_microbatches=LIVE_M)
    with tempfile.TemporaryDirectory() as tmp:  # the elastic job as users run it, with the controller off
        with ElasticJob(train, ScalingConfig(devices=4, plan=plan, cluster=flat(4, 10), use_gpu=False),
                        RunConfig(storage=tmp, checkpoint_every=0, progress=False), AdaptConfig(enabled=False),
                        SpotConfig(enabled=False)) as job:
            measured = job.fit(iterations + 1).metrics[1:]  # the first is warm-up, not recorded
            profile = job.profile
    metrics = [to_controller_metrics(m, k, plan) for k, m in enumerate(measured)]
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
