"""End to end on local Ray: 4 stages → preemption notice → checkpoint → migrate → 3 stages.

The job continues exactly where it was: final weights equal uninterrupted single-process training.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from actors.reference import ReferenceTrainer, allclose, max_difference
from cloud.records import Offer
from orchestrator.core.cluster import flat
from orchestrator.elastic.parts import ModelSpec, TrainerSession, local_launcher, plan_for, simulated_throughputs, snapshot_policy
from orchestrator.elastic.manager import JobConfig, JobManager, Placement
from orchestrator.elastic.launch import LaunchTarget
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.elastic.observability import EventLog
from orchestrator.core.profile import Block, Profile

pytestmark = pytest.mark.ray

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 4)  # 7 blocks
MODEL = ModelSpec(partial(mlp, WIDTHS), loss_fn("mlp"), partial(torch.optim.Adam, lr=0.01),
                  partial(example_batch, "mlp", 12, widths=WIDTHS), num_microbatches=4)
PROFILE = Profile("mlp", tuple(Block(f"b{i}", 1e-3, 2e-3, 16 * 4 * 3, 16 * 16 * 4) for i in range(7)), microbatch_size=3)
AWS = Offer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, True, 3.67)
GCP = Offer("gcp", "us-central1", "us-central1-b", "n1-standard-16+3xV100", "V100", 3, True, 2.2)


def test_preempted_job_migrates_to_three_stages_and_stays_exact(worker_group: Any, tmp_path: Path) -> None:
    offers = pd.DataFrame([{"cloud": o.cloud, "region": o.region, "zone": o.zone, "instance_type": o.instance_type,
                            "gpu_type": o.gpu_type, "gpu_count": o.gpu_count, "spot": o.spot, "usd_per_hour": o.usd_per_hour}
                           for o in (AWS, GCP)])
    table = simulated_throughputs(PROFILE, [(o.gpu_type, o.gpu_count) for o in (AWS, GCP)], MODEL.num_microbatches)
    policy = snapshot_policy(offers, table, "job", total_samples=1e6, samples_per_step=12)

    def factory(placement: Placement, resume: Path | None) -> TrainerSession:
        assert placement.cluster is not None
        plan = plan_for(PROFILE, placement.cluster, MODEL.num_microbatches, planner="even")
        return TrainerSession(MODEL, plan, resume, workers=worker_group)

    config = JobConfig(name="e2e", total_steps=6, checkpoint_dir=tmp_path / "ckpt", checkpoint_every=0)
    events = EventLog(tmp_path / "events.jsonl")
    manager = JobManager(config, Placement(LaunchTarget("local"), 4, AWS), factory, local_launcher(capacity=4), policy, events)
    first = factory(manager.launcher(manager.placement), None)
    assert len(first.plan.stages) == 4
    first.train(3)
    manager.notify_preemption(manager.clock() + 600.0, "test")
    report = manager.run(session=first)

    assert report.steps == 6 and report.preemptions == 1
    resumed = next(e for e in report.events if e["event"] == "resumed")
    assert resumed["step"] == 3 and resumed["lost_steps"] == 0 and resumed["plan"].count("[") == 3
    decision = next(e for e in report.events if e["event"] == "migration_decision")
    assert decision["target"].startswith("gcp/")

    reference = ReferenceTrainer(MODEL.model_factory, MODEL.loss_fn, MODEL.optimizer_factory, MODEL.data_fn, MODEL.num_microbatches)
    ref_losses = reference.train(6)
    assert _latest(tmp_path).endswith("step_00000006")
    final = TrainerSession(MODEL, plan_for(PROFILE, flat(3, 100), 4, planner="even"), Path(_latest(tmp_path)), workers=worker_group)
    got = final.trainer.state_dicts()
    final.close()
    assert allclose(got, reference.state_dicts()), max_difference(got, reference.state_dicts())
    assert [round(report.losses[s], 5) for s in range(3, 6)] == [round(v, 5) for v in ref_losses[3:]]


def _latest(tmp_path: Path) -> str:
    from actors import checkpoint as ckpt

    return str(ckpt.latest(tmp_path / "ckpt"))
