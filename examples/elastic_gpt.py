"""Elastic spot training of a GPT-style model: the job manager keeps it alive and cheap.

What happens:
- the model is profiled here and planned for the devices of the current placement;
- training runs on Ray stage actors, checkpointing every ``--checkpoint-every`` steps (block-keyed);
- on a spot preemption notice (the cloud's metadata watcher when running on a cloud VM, or
  ``--inject-notice-at STEP`` to rehearse locally) the manager writes a checkpoint that is durable
  before the deadline, asks the migration planner for the next offer (bundled prices, or your own
  catalog), brings the target up, re-plans for the devices it actually got and resumes;
- every transition is a line in ``OUT/events.jsonl``.

Local rehearsal (the default): the local Ray instance stands in for each cloud target and offers
``--local-capacity`` devices. With ``--cloud-yaml`` the launcher also writes the validated Ray
cluster-launcher YAML for each chosen offer into OUT (``ray up`` is not run unless ``--ray-up``).

    .venv/bin/python examples/elastic_gpt.py --steps 30 --inject-notice-at 12 --out out/elastic
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import ray
import torch

from cloud.importers import load_any, load_snapshot
from cloud.migration import MigrationCosts
from cloud.preemption import watcher_for
from cloud.records import Offer
from orchestrator.elastic import ModelSpec, TrainerSession, cloud_launcher, local_launcher, plan_for, simulated_throughputs, snapshot_policy
from orchestrator.discovery import connect
from orchestrator.job import JobConfig, JobManager, Placement
from orchestrator.launch import LaunchTarget
from orchestrator.models import example_batch, loss_fn, tiny_transformer
from orchestrator.observability import EventLog
from orchestrator.profiler import profile_blocks

GPT = {"vocab": 256, "d_model": 128, "n_layers": 6, "n_heads": 4, "seq_len": 64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="samples per iteration")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs of the starting placement")
    parser.add_argument("--catalog", help="price file or folder (default: the bundled snapshot)")
    parser.add_argument("--local-capacity", type=int, default=3, help="devices the local rehearsal target offers")
    parser.add_argument("--inject-notice-at", type=int, default=None, help="rehearse a 2-minute notice at this step")
    parser.add_argument("--watch", choices=["aws", "gcp", "azure"], help="poll this cloud's metadata service for notices")
    parser.add_argument("--cloud-yaml", action="store_true", help="also write the Ray cluster YAML of each target")
    parser.add_argument("--ray-up", action="store_true", help="run `ray up` on the generated YAML (real clouds only)")
    parser.add_argument("--out", default="out/elastic")
    args = parser.parse_args()
    out = Path(args.out)

    model = ModelSpec(partial(tiny_transformer, sub_layer_blocks=True, **GPT), loss_fn("tiny_transformer"),
                      partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                      partial(example_batch, "tiny_transformer", args.rows, **GPT), args.microbatches)
    torch.manual_seed(0)
    sample = torch.tensor_split(model.data_fn(0)[0], args.microbatches)[0]
    profile = profile_blocks(model.model_factory(), sample, "gpt", int(sample.shape[0]), device="cpu")

    offers = load_any(args.catalog) if args.catalog else load_snapshot()
    offers = offers[(offers.gpu_count >= 2) & (offers.usd_per_hour > 0)]
    start = offers[offers.spot & (offers.gpu_count == args.gpus)].sort_values("usd_per_hour").iloc[0]
    current = Offer(str(start.cloud), str(start.region), str(start.zone), str(start.instance_type),
                    str(start.gpu_type), int(start.gpu_count), True, float(start.usd_per_hour))
    table = simulated_throughputs(profile, set(zip(offers.gpu_type, offers.gpu_count)), args.microbatches)
    policy = snapshot_policy(offers, table, "job", total_samples=args.steps * args.rows * 1e4, samples_per_step=args.rows,
                             costs=MigrationCosts(checkpoint_gb=0.05))

    local = local_launcher(capacity=args.local_capacity)
    yaml_writer = cloud_launcher(out / "clusters", project_id="my-project", dry_run=not args.ray_up)

    def launcher(placement: Placement) -> Placement:
        if args.cloud_yaml and placement.offer is not None:
            yaml_writer(placement)  # validated YAML for the real target; the rehearsal runs locally
        return local(placement)

    def factory(placement: Placement, resume: Path | None) -> TrainerSession:
        assert placement.cluster is not None
        return TrainerSession(model, plan_for(profile, placement.cluster, args.microbatches), resume)

    connect(None)  # RAY_ADDRESS (e.g. under `ray job submit`) or a local instance
    manager = JobManager(JobConfig(name="elastic-gpt", total_steps=args.steps, checkpoint_dir=out / "checkpoints",
                                   checkpoint_every=args.checkpoint_every, rehearse_notice_at=args.inject_notice_at),
                         Placement(LaunchTarget("local"), args.gpus, current), factory, launcher, policy, EventLog(out / "events.jsonl"))
    watcher = watcher_for(args.watch, manager.on_cloud_notice).start() if args.watch else None
    try:
        report = manager.run()
    finally:
        if watcher is not None:
            watcher.stop()
        ray.shutdown()
    print(f"{report.steps} steps; {' -> '.join(report.placements)}; {report.migrations} migration(s); "
          f"final loss {report.losses[max(report.losses)]:.4f}; events in {out / 'events.jsonl'}")


if __name__ == "__main__":
    main()
