"""One elastic job on the real Ray runtime: live evacuation, its fallback, and bad input.

The sacred property holds through every path: the final weights equal uninterrupted
single-process training on the same data (allclose). A notice with room on the survivors is
handled live (moves, no lost step, no restore); with no room it is checkpoint → migration →
restore, recorded with its reason. One shared pool of stage workers serves every test.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator import ElasticJob, InjectedNotice, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.core.cluster import flat
from orchestrator.core.errors import UserError
from orchestrator.elastic.job_config import AdaptConfig
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import straight_plan

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)  # 8 blocks
TRAIN = TrainConfig(model_factory=partial(mlp, WIDTHS), loss_fn=loss_fn("mlp"),
                    optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                    data_fn=partial(example_batch, "mlp", 11, widths=WIDTHS), num_microbatches=4)
PLAN = straight_plan([0, 2, 4, 6, 8], 4)


def run_job(pool: Any, tmp_path: Path, steps: int, notice: InjectedNotice, **scaling: Any) -> tuple[ElasticJob, list[dict[str, Any]]]:
    job = ElasticJob(TRAIN, ScalingConfig(devices=4, plan=PLAN, **scaling),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=4),
                     AdaptConfig(enabled=False), SpotConfig(notices=(notice,)), workers=pool)
    result = job.fit(steps)
    return job, result.events


def one(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [e for e in events if e["event"] == name]
    assert len(found) == 1, (name, [e["event"] for e in events])
    return found[0]


@pytest.mark.ray
def test_notice_with_room_is_evacuated_live_and_exactly(worker_group: Any, tmp_path: Path) -> None:
    job, events = run_job(worker_group, tmp_path, 9, InjectedNotice(5, 30.0, (1,)))
    try:
        assert events[0]["event"] == "job_started" and [d["device"] for d in events[0]["devices"]] == [0, 1, 2, 3]
        handled = one(events, "preemption_handled")
        assert handled["mode"] == "live" and handled["lost_steps"] == 0 and handled["moves"]
        # one live switch to the plan the job makes for the survivors: the doomed device hands its blocks over
        assert [1, 0] in handled["moves"] or [1, 2] in handled["moves"] or [1, 3] in handled["moves"]
        assert "re-made for the 3 survivors" in handled["reason"] and handled["iteration_s"] > 0 and handled["stall_s"] > 0
        assert not [e for e in events if e["event"] == "resumed"]
        assert 1 not in job.runtime.plan.devices and job.runtime.step == 9
        assert job.max_abs_diff() <= 1e-5
    finally:
        job.close()


@pytest.mark.ray
def test_notice_without_room_restarts_from_a_checkpoint_exactly(worker_group: Any, tmp_path: Path) -> None:
    params = sum(p.numel() * 4 for p in partial(mlp, WIDTHS)()[2].parameters())
    tight = flat(4, 10, memory_bytes=params * 2 * 4.5)  # two blocks each, no room for a third
    job, events = run_job(worker_group, tmp_path, 9, InjectedNotice(5, 30.0, (1,)), cluster=tight)
    try:
        refused = one(events, "evacuation_refused")
        assert "no room" in refused["reason"]
        handled = one(events, "preemption_handled")
        assert handled["mode"] == "restart" and handled["lost_steps"] == 0 and handled["moves"] == []
        # unsupervised, the job cannot move itself to another cluster: it restarts on the survivors
        relocated = one(events, "relocated")
        assert one(events, "resumed")["step"] == 5 and relocated["forced"] is True and relocated["devices"] == [0, 2, 3]
        assert not [e for e in events if e["event"] == "migration"]
        assert 1 not in job.runtime.plan.devices and job.runtime.step == 9 and job.max_abs_diff() <= 1e-5
    finally:
        job.close()


def test_bad_configs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown storage scheme"):
        RunConfig(storage="ftp://host/ckpt")
    with pytest.raises(UserError, match="does not use"):
        ElasticJob(TRAIN, ScalingConfig(devices=4), RunConfig(storage=str(tmp_path)), spot=SpotConfig(notices=(InjectedNotice(3, 30.0, (9,)),)))
    with pytest.raises(UserError, match="cluster has 2 devices"):
        ScalingConfig(devices=4, cluster=flat(2, 10))
    with pytest.raises(UserError, match="need enabled=True"):
        SpotConfig(enabled=False, notices=(InjectedNotice(3),))


@pytest.mark.ray
def test_loss_without_notice_restores_the_newest_checkpoint_and_bad_notices_are_recorded(worker_group: Any, tmp_path: Path) -> None:
    from orchestrator.adapt.faults import FaultSchedule, Kill

    job = ElasticJob(TRAIN, ScalingConfig(devices=4, plan=PLAN),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=4),
                     AdaptConfig(enabled=False, faults=FaultSchedule((Kill(2, 6),))), SpotConfig(), workers=worker_group)
    torn = tmp_path / "ckpt" / "step_00000050"  # a newer checkpoint whose commit marker never landed
    torn.mkdir(parents=True)
    (torn / "block_00000.pt").write_bytes(b"half")
    job.notify((1,), -5.0, "late")  # its deadline passed before anyone could act
    job.notify((9,), 30.0, "confused")  # a device the job does not have
    try:
        events = job.fit(9).events
        rejected = [e for e in events if e["event"] == "notice_rejected"]
        assert [e["source"] for e in rejected] == ["late", "confused"]
        assert "deadline passed" in rejected[0]["reason"] and "does not use" in rejected[1]["reason"]
        assert one(events, "worker_failed")["step"] == 6
        # the asynchronous checkpoint of step 4 was committed before the crash: 2 steps lost, not 6
        recovered = one(events, "recovered")
        assert recovered["step"] == 4 and recovered["lost_steps"] == 2 and recovered["mode"] == "in_place" and recovered["reason"]
        pids = {d["device"]: d["pid"] for d in one(events, "job_started")["devices"]}
        assert sorted(d["device"] for d in recovered["devices"]) == [0, 1, 3]  # the survivors kept their processes
        assert all(d["pid"] == pids[d["device"]] for d in recovered["devices"]) and recovered["stall_s"] > 0
        assert not [e for e in events if e["event"] == "preemption_handled"]
        skipped = one(events, "checkpoint_skipped")  # recorded once, before the restore it was skipped by
        assert skipped["path"].endswith("step_00000050") and "commit marker" in skipped["reason"]
        assert events.index(skipped) < events.index(recovered)
        assert job.runtime.step == 9 and job.max_abs_diff() <= 1e-5
    finally:
        job.close()


@pytest.mark.ray
def test_evacuated_device_leaves_the_process_group_before_its_deadline(worker_group: Any, tmp_path: Path) -> None:
    """The evacuation's stall is the hand-over only; the doomed device stays an idle member and
    the process group is re-formed without it before the deadline (here a clock running 1000x fast,
    so a 30 s notice leaves well inside the run). Training stays exact across both."""
    import time

    job = ElasticJob(TRAIN, ScalingConfig(devices=4, plan=PLAN),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every="auto"),
                     AdaptConfig(enabled=False), SpotConfig(notices=(InjectedNotice(3, 30.0, (2,)),), margin_s=5.0),
                     clock=lambda: 1000.0 * time.monotonic(), workers=worker_group)
    try:
        events = job.fit(40).events
        handled = one(events, "preemption_handled")
        left = one(events, "evacuated_left")
        assert handled["mode"] == "live" and left["devices"] == [2] and left["step"] > handled["step"]
        # checkpoint_every="auto": the first one, once a step was timed, measures the stall (how often the next ones come
        # rests on measured times: checkpoint_interval's own test covers that rule)
        periodic = [e["step"] for e in events if e["event"] == "checkpoint" and e["why"] == "periodic"]
        assert periodic and periodic[0] <= 2
        assert job.runtime.step == 40 and 2 not in job.runtime.plan.devices and job.max_abs_diff() <= 1e-5
    finally:
        job.close()


@pytest.mark.ray
def test_short_notice_without_room_restarts_on_the_survivors_from_the_newest_durable_checkpoint(worker_group: Any, tmp_path: Path) -> None:
    """The notice is too short for a checkpoint, so the job resumes from the newest durable one
    (2 steps lost, redone). A cheaper offer elsewhere would pay, but an unsupervised job cannot go
    there: it says so and restarts on the survivors of this cluster, exactly."""
    from cloud.records import Offer

    aws = Offer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, True, 3.67)
    gcp = Offer("gcp", "us-central1", "us-central1-b", "n1-standard-16+3xV100", "V100", 3, True, 2.2)
    catalog = tmp_path / "prices.csv"
    catalog.write_text("timestamp,cloud,region,zone,instance_type,gpu_type,gpu_count,spot,usd_per_hour,source,observed_at\n"
                       + "".join(f"2026-01-01T00:00:00Z,{o.cloud},{o.region},{o.zone},{o.instance_type},{o.gpu_type},"
                                 f"{o.gpu_count},True,{o.usd_per_hour},test,2026-01-01T00:00:00Z\n" for o in (aws, gcp)))
    params = sum(p.numel() * 4 for p in partial(mlp, WIDTHS)()[2].parameters())
    tight = flat(4, 10, memory_bytes=params * 2 * 4.5)  # no room on the survivors
    job = ElasticJob(TRAIN, ScalingConfig(devices=4, plan=PLAN, cluster=tight),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=4),
                     AdaptConfig(enabled=False),
                     SpotConfig(notices=(InjectedNotice(6, 2.0, (1,)),), catalog=str(catalog), offer=aws), workers=worker_group)
    try:
        events = job.fit(9).events
        assert one(events, "notice_too_short")["fallback"].endswith("step_00000004")
        relocated = one(events, "relocated")
        assert relocated["forced"] is True and relocated["devices"] == [0, 2, 3] and "gcp/" in relocated["detail"]
        assert one(events, "resumed")["step"] == 4 and one(events, "resumed")["lost_steps"] == 2
        handled = one(events, "preemption_handled")
        assert handled["mode"] == "restart" and handled["lost_steps"] == 2
        assert sorted(job.runtime.plan.devices) == [0, 2, 3] and job.runtime.step == 9
        assert job.max_abs_diff() <= 1e-5
    finally:
        job.close()


@pytest.mark.ray
def test_a_hung_rank_is_detected_by_its_deadline_ended_and_recovered_in_place_exactly(worker_group: Any, tmp_path: Path) -> None:
    from orchestrator.adapt.faults import FaultSchedule, Kill

    job = ElasticJob(TRAIN, ScalingConfig(devices=4, plan=PLAN),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=3, hang_timeout_s=15.0),
                     AdaptConfig(enabled=False, faults=FaultSchedule((Kill(2, 5, hang=True),))), SpotConfig(), workers=worker_group)
    try:
        events = job.fit(8).events
        failed = one(events, "worker_failed")
        assert failed["cause"] == "hang" and failed["dead"] == [2] and failed["hang_detect_s"] == 15.0
        recovered = one(events, "recovered")
        pids = {d["device"]: d["pid"] for d in one(events, "job_started")["devices"]}
        assert recovered["mode"] == "in_place" and sorted(d["device"] for d in recovered["devices"]) == [0, 1, 3]
        assert all(d["pid"] == pids[d["device"]] for d in recovered["devices"])  # the survivors were released, not ended
        assert recovered["stall_s"] >= failed["hang_detect_s"]  # detected by the deadline, not earlier (no timing bound)
        assert job.runtime.step == 8 and job.max_abs_diff() <= 1e-5
    finally:
        job.close()
