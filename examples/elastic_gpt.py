"""Elastic spot training of a GPT-style model: one job that adapts, evacuates and migrates.

The model is profiled here and planned over ``--devices`` stage actors; training runs with
pipelined dispatch while the controller re-plans live. A preemption notice (the cloud's metadata
watcher with ``--watch``, or ``--inject-notice-at STEP`` to rehearse) is handled by moving the
doomed device's blocks to the survivors while training continues; only when that cannot fit
does the job checkpoint, migrate and restore. Checkpoints go to ``OUT/checkpoints`` or
``--storage s3://bucket/prefix``; every decision is a line of ``OUT/events.jsonl``. On a Ray
cluster, set ``RAY_ADDRESS`` (as ``ray job submit`` does).

    .venv/bin/python examples/elastic_gpt.py --steps 24 --inject-notice-at 10 --notice-s 30 --out out/elastic --verify
"""

import argparse
from functools import partial

import torch

from orchestrator import ElasticJob, InjectedNotice, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.cli.commands import run_main
from orchestrator.profiling.models import example_batch, loss_fn, tiny_transformer

GPT = {"vocab": 256, "d_model": 128, "n_layers": 6, "n_heads": 4, "seq_len": 64}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--rows", type=int, default=64, help="samples per iteration")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--inject-notice-at", type=int, help="rehearse a preemption notice after this step")
    p.add_argument("--notice-s", type=float, default=120.0, help="seconds left on the rehearsed notice")
    p.add_argument("--notice-device", type=int, help="the device the notice names (default: the middle stage's)")
    p.add_argument("--storage", help="checkpoint location (default OUT/checkpoints; s3://, gs://, az:// too)")
    p.add_argument("--watch", choices=["aws", "gcp", "azure"], help="poll this cloud's metadata service for notices")
    p.add_argument("--catalog", help="price file or folder for migration decisions (default: the bundled snapshot)")
    p.add_argument("--cloud-yaml", action="store_true", help="write the Ray cluster YAML of each migration target")
    p.add_argument("--ray-up", action="store_true", help="run `ray up` on the generated YAML (real clouds only)")
    p.add_argument("--verify", action="store_true", help="compare with uninterrupted single-process training")
    p.add_argument("--out", default="out/elastic")
    args = p.parse_args()
    train = TrainConfig(model_factory=partial(tiny_transformer, sub_layer_blocks=True, **GPT), loss_fn=loss_fn("tiny_transformer"),
                        optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                        data_fn=partial(example_batch, "tiny_transformer", args.rows, **GPT), num_microbatches=8)
    doomed = None if args.notice_device is None else (args.notice_device,)
    notices = () if args.inject_notice_at is None else (InjectedNotice(args.inject_notice_at, args.notice_s, doomed),)
    with ElasticJob(train, ScalingConfig(devices=args.devices, planner="even"),  # the controller re-balances live
                    RunConfig(storage=args.storage or f"{args.out}/checkpoints", events=f"{args.out}/events.jsonl",
                              checkpoint_every=args.checkpoint_every),
                    spot=SpotConfig(notices=notices, watch=args.watch, catalog=args.catalog, ray_up=args.ray_up,
                                    cloud_yaml=f"{args.out}/clusters" if args.cloud_yaml else None)) as job:
        result = job.fit(args.steps)
        print(f"{result.steps} steps; {result.moves} live move(s), {result.restarts} restart(s); final loss {result.final_loss:.4f}")
        if args.verify:
            print(f"max_abs_diff={job.max_abs_diff():.3e}")


if __name__ == "__main__":
    run_main(main)
