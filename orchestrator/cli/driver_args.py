"""The command-line flags every driver script of an elastic job wants, in one place.

Why: a driver is the user's model and data plus one call; the run's options (storage, resume,
failure budget, checkpoints, rehearsals of deaths and notices, cloud watchers, prices) are the
same for every model, so they are parsed here once instead of copied into each script::

    p = argparse.ArgumentParser()
    add_job_arguments(p)
    args = p.parse_args()
    with ElasticJob(train, *job_configs(args)) as job:
        job.fit(args.steps)

Under the supervisor (``orchestrator run ... -- driver.py``) the storage, run id and resume
setting come from its environment (:class:`~orchestrator.elastic.job_config.RunConfig`'s defaults),
so the same script runs unmodified.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from orchestrator.adapt.faults import FaultSchedule, Kill
from orchestrator.core.errors import UserError
from orchestrator.core.files import check_output_dir
from orchestrator.elastic.job_config import AdaptConfig, InjectedNotice, RunConfig, ScalingConfig, SpotConfig
from orchestrator.sinks import MLflow, Sink, TensorBoard, WandB


def _every(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of steps nor 'auto'") from None


def add_job_arguments(p: argparse.ArgumentParser, devices: int = 4, steps: int = 24, checkpoint_every: int = 10) -> None:
    p.add_argument("--steps", type=int, default=steps, help="train up to this step (a resumed run continues to it)")
    p.add_argument("--devices", type=int, default=devices, help="stage actors (one device each)")
    p.add_argument("--planner", default="even", help="the starting plan's planner (the controller re-balances live)")
    p.add_argument("--checkpoint-every", type=_every, default=checkpoint_every,
                   help="steps between checkpoints (0: only the final one), or 'auto': as often as pays for the failures seen")
    p.add_argument("--snapshot-every", type=int, default=0, help="in-memory snapshots every N steps (0: off)")
    p.add_argument("--resume", choices=["auto", "never", "require", "force"],
                   help="continue the run in the storage location (default auto; force: even on other data, recorded)")
    p.add_argument("--max-failures", type=int, default=3, help="worker deaths without notice the job survives")
    p.add_argument("--inject-kill-at", action="append", default=[], metavar="STEP[:DEVICE]",
                   help="rehearse a death without notice: DEVICE's stage worker (default: the middle stage's) exits mid-step STEP")
    p.add_argument("--inject-hang-at", action="append", default=[], metavar="STEP[:DEVICE]",
                   help="rehearse a hung rank: DEVICE's stage worker stops making progress mid-step STEP (detected, recovered)")
    p.add_argument("--hang-timeout-s", type=float, help="a step past this many seconds is a hang (default: 10x the median, >= 30 s)")
    p.add_argument("--inject-notice-at", type=int, help="rehearse a preemption notice after this step")
    p.add_argument("--notice-s", type=float, default=120.0, help="seconds left on the rehearsed notice")
    p.add_argument("--notice-device", type=int, help="the device the notice names (default: the middle stage's)")
    p.add_argument("--storage", help="the run's location (default $RAYPIPE_STORAGE, else OUT/checkpoints; s3://, gs://, az:// too)")
    p.add_argument("--watch", choices=["aws", "gcp", "azure"], help="poll this cloud's metadata service for notices")
    p.add_argument("--catalog", help="price file or folder for migration decisions (default: the bundled snapshot)")
    p.add_argument("--verify", action="store_true", help="compare with uninterrupted single-process training")
    p.add_argument("--out", default="out/elastic", help="events.jsonl (and the default storage) go here")
    p.add_argument("--tensorboard", metavar="DIR", help="write per-step scalars for TensorBoard under DIR")
    p.add_argument("--mlflow", metavar="URI", help="log per-step scalars to MLflow at URI (a local store: sqlite:///PATH/mlflow.db)")
    p.add_argument("--mlflow-experiment", default="raypipe", metavar="NAME", help="the MLflow experiment (default raypipe)")
    p.add_argument("--wandb-offline", metavar="DIR", help="log per-step scalars to an offline W&B run under DIR (wandb sync uploads it)")
    p.add_argument("--wandb-project", default="raypipe", metavar="NAME", help="the W&B project (default raypipe)")


def parse_kill(text: str, hang: bool = False) -> Kill:
    """``STEP[:DEVICE]``; without DEVICE, the device of the middle stage when the step runs."""
    step, _, device = text.partition(":")
    try:
        return Kill(int(device) if device else None, int(step), hang)
    except ValueError:
        flag = "--inject-hang-at" if hang else "--inject-kill-at"
        raise UserError(f"{flag} {text!r}: expected STEP or STEP:DEVICE (whole numbers)") from None


def sinks(args: argparse.Namespace) -> tuple[Sink, ...]:
    """The trackers the flags ask for (a missing library is one line naming what to install)."""
    made: list[Sink] = []
    if args.tensorboard:
        made.append(TensorBoard(args.tensorboard))
    if args.mlflow:
        made.append(MLflow(args.mlflow, args.mlflow_experiment))
    if args.wandb_offline:
        made.append(WandB(args.wandb_project, args.wandb_offline, mode="offline"))
    return tuple(made)


def job_configs(args: argparse.Namespace) -> tuple[ScalingConfig, RunConfig, AdaptConfig, SpotConfig]:
    """The four run configurations :class:`~orchestrator.elastic.job_loop.ElasticJob` takes after its ``TrainConfig``."""
    doomed = None if args.notice_device is None else (args.notice_device,)
    notices = () if args.inject_notice_at is None else (InjectedNotice(args.inject_notice_at, args.notice_s, doomed),)
    resume: dict[str, Any] = {"resume": args.resume} if args.resume else {}
    catalog: dict[str, Any] = {"catalog": args.catalog} if args.catalog else {}
    check_output_dir(args.out, "--out")  # a read-only one: one line before the storage is touched
    where = args.storage or os.environ.get("RAYPIPE_STORAGE") or f"{args.out}/checkpoints"
    run = RunConfig(storage=where, events=f"{args.out}/events.jsonl", checkpoint_every=args.checkpoint_every,
                    max_failures=args.max_failures, snapshot_every=args.snapshot_every, callbacks=sinks(args),
                    hang_timeout_s=args.hang_timeout_s, **resume)
    faults = [parse_kill(t) for t in args.inject_kill_at] + [parse_kill(t, hang=True) for t in args.inject_hang_at]
    adapt = AdaptConfig(faults=FaultSchedule(tuple(faults)))
    return ScalingConfig(devices=args.devices, planner=args.planner), run, adapt, SpotConfig(notices=notices, watch=args.watch, **catalog)


__all__ = ["add_job_arguments", "job_configs", "parse_kill", "sinks"]
