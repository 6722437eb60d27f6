"""Elastic spot training of a GPT-style model: one job that adapts, evacuates and migrates.

The model is profiled here and planned over ``--devices`` stage actors; training runs with
pipelined dispatch while the controller re-plans live. A preemption notice (the cloud's metadata
watcher with ``--watch``, or ``--inject-notice-at STEP`` to rehearse) is handled by moving the
doomed device's blocks to the survivors while training continues; only when that cannot fit
does the job checkpoint, migrate and restore. Checkpoints go to ``OUT/checkpoints`` or
``--storage s3://bucket/prefix``; every decision is a line of ``OUT/events.jsonl``. On a Ray
cluster, set ``RAY_ADDRESS`` (as ``ray job submit`` does). The storage location is the run: run
again with a larger ``--steps`` and it resumes at the newest committed checkpoint (``--resume``).
Under the supervisor (``orchestrator run ... -- examples/elastic_gpt.py``) the storage, run id
and resume setting come from its environment variables.

    .venv/bin/python examples/elastic_gpt.py --steps 24 --inject-notice-at 10 --notice-s 30 --out out/elastic --verify
    .venv/bin/python examples/elastic_gpt.py --steps 20 --inject-kill-at 5 --inject-kill-at 9 --max-failures 3 --out out/k --verify
"""

import argparse
from functools import partial

import torch

from orchestrator import ElasticJob, TrainConfig
from orchestrator.cli.commands import run_main
from orchestrator.cli.driver_args import add_job_arguments, job_configs
from orchestrator.profiling.models import example_batch, loss_fn, tiny_transformer

GPT = {"vocab": 256, "d_model": 128, "n_layers": 6, "n_heads": 4, "seq_len": 64}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=GPT["n_layers"], help="the model's number of decoder layers")
    p.add_argument("--rows", type=int, default=64, help="samples per iteration")
    add_job_arguments(p)  # --steps --devices --storage --resume --max-failures --inject-kill-at ... (the run's options)
    args = p.parse_args()
    gpt = {**GPT, "n_layers": args.layers}
    train = TrainConfig(model_factory=partial(tiny_transformer, sub_layer_blocks=True, **gpt), loss_fn=loss_fn("tiny_transformer"),
                        optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                        data_fn=partial(example_batch, "tiny_transformer", args.rows, **gpt), num_microbatches=8)
    with ElasticJob(train, *job_configs(args)) as job:
        result = job.fit(args.steps)
        print(f"{result.step} steps; {result.moves} live move(s), {result.restarts} restart(s); final loss {result.final_loss:.4f}")
        if args.verify:
            print(f"max_abs_diff={job.max_abs_diff():.3e}")


if __name__ == "__main__":
    run_main(main)
