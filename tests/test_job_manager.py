"""The job manager's transitions, stepped with a fake session and an injected clock.

The fake session writes checkpoints in the real block-keyed format (actors.checkpoint), so
durability, verification and fallback are the production code paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from actors import checkpoint as ckpt
from cloud.migration import Migrate, KeepOffer
from cloud.records import Offer
from orchestrator.elastic.manager import JobConfig, JobManager, Placement
from orchestrator.elastic.launch import LaunchTarget
from orchestrator.elastic.observability import EventLog
from orchestrator.core.plan import Plan, straight_plan

OFFER_A = Offer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, True, 3.7)
OFFER_B = Offer("gcp", "us-central1", "us-central1-b", "n1-standard-32", "V100", 3, True, 2.2)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeSession:
    """Training whose state is a deterministic function of the step; checkpoints are real files."""

    def __init__(self, devices: int, resume: Path | None, clock: Clock, step_s: float = 1.0, ckpt_s: float = 0.5,
                 during_checkpoint: Callable[[], None] | None = None) -> None:
        self.devices, self.clock, self.step_s, self.ckpt_s = devices, clock, step_s, ckpt_s
        self.during_checkpoint = during_checkpoint
        self._plan = straight_plan(list(range(devices + 1)), 4)
        self._step = int(ckpt.verify(resume)["step"]) if resume is not None else 0
        self.closed = False

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def step(self) -> int:
        return self._step

    def train(self, steps: int) -> list[float]:
        out = []
        for _ in range(steps):
            self.clock.t += self.step_s
            out.append(1.0 / (1 + self._step))
            self._step += 1
        return out

    def checkpoint(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        entries = [ckpt.write_block(directory, b, torch.nn.Linear(2, 2), None) for b in range(self.devices)]
        if self.during_checkpoint is not None:
            self.during_checkpoint()
        self.clock.t += self.ckpt_s
        ckpt.write_manifest(directory, self._step, self.devices, entries, self._plan.to_dict())
        return directory

    def close(self) -> None:
        self.closed = True


def _manager(tmp_path: Path, policy: Any, clock: Clock, capacity: int = 8, **cfg: Any) -> tuple[JobManager, list[FakeSession]]:
    sessions: list[FakeSession] = []
    hooks: dict[str, Any] = cfg.pop("hooks", {})

    def factory(placement: Placement, resume: Path | None) -> FakeSession:
        s = FakeSession(placement.devices, resume, clock, **hooks)
        sessions.append(s)
        return s

    def launcher(p: Placement) -> Placement:
        return Placement(LaunchTarget("local"), min(p.devices, capacity), p.offer)

    config = JobConfig(name="t", total_steps=cfg.pop("total_steps", 12), checkpoint_dir=tmp_path / "ckpt", **cfg)
    manager = JobManager(config, Placement(LaunchTarget("local"), 4, OFFER_A), factory, launcher, policy,
                         EventLog(tmp_path / "events.jsonl", clock=clock), clock)
    return manager, sessions


def move_to_b(placement: Placement, preempted: bool, step: int) -> KeepOffer | Migrate:
    return Migrate(OFFER_B, "cheaper", 1.0)


def test_preemption_with_time_checkpoints_and_resumes_without_loss(tmp_path: Path) -> None:
    clock = Clock()
    manager, sessions = _manager(tmp_path, move_to_b, clock, checkpoint_every=5, rehearse_notice_at=7, rehearse_notice_s=120.0)
    report = manager.run()
    assert report.steps == 12 and report.preemptions == 1 and report.migrations == 1
    assert sorted(report.losses) == list(range(12))
    assert sessions[1].devices == 3 and sessions[0].closed
    events = [e["event"] for e in report.events]
    assert events.index("preemption_notice") < events.index("checkpoint", events.index("preemption_notice"))
    resumed = next(e for e in report.events if e["event"] == "resumed")
    assert resumed["step"] == 7 and resumed["lost_steps"] == 0
    assert all("ts" in e and "cost_usd" in e for e in report.events)
    assert report.placements[-1].startswith("gcp/")


def test_notice_too_short_falls_back_to_last_durable_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    manager, sessions = _manager(tmp_path, move_to_b, clock, checkpoint_every=5, initial_checkpoint_estimate_s=10.0,
                                 rehearse_notice_at=8, rehearse_notice_s=1.0)
    report = manager.run()
    short = next(e for e in report.events if e["event"] == "notice_too_short")
    assert short["fallback"].endswith("step_00000005") or "5" in short["fallback"]
    resumed = next(e for e in report.events if e["event"] == "resumed")
    assert resumed["step"] == 5 and resumed["lost_steps"] == 3
    assert sorted(report.losses) == list(range(12))  # the lost steps were redone


def test_checkpoint_finishing_after_deadline_is_discarded(tmp_path: Path) -> None:
    clock = Clock()
    # the estimate says it fits, but the real write takes 30 s: too late, must not be used
    manager, sessions = _manager(tmp_path, move_to_b, clock, checkpoint_every=4, initial_checkpoint_estimate_s=0.1,
                                 hooks={"ckpt_s": 30.0})
    manager.notify_preemption(20.0)
    report = manager.run()
    late = [e for e in report.events if e["event"] == "checkpoint" and not e["durable"]]
    assert late and not Path(late[0]["path"]).exists()


def test_notice_during_checkpoint_write_is_handled_after_the_write(tmp_path: Path) -> None:
    clock = Clock()
    box: dict[str, JobManager] = {}
    manager, sessions = _manager(tmp_path, move_to_b, clock, checkpoint_every=3,
                                 hooks={"during_checkpoint": lambda: box["m"].preemptions == 0 and box["m"].notify_preemption(clock.t + 60)})
    box["m"] = manager
    report = manager.run()
    events = [e["event"] for e in report.events]
    first_ckpt = events.index("checkpoint")
    assert events[first_ckpt + 1] == "preemption_notice"
    # the periodic checkpoint was complete, and so is every checkpoint the job resumed from
    for e in report.events:
        if e["event"] == "resumed" and e["checkpoint"]:
            ckpt.verify(e["checkpoint"])
    assert sorted(report.losses) == list(range(12))


def test_corrupted_checkpoint_is_never_resumed_from(tmp_path: Path) -> None:
    clock = Clock()
    manager, _ = _manager(tmp_path, move_to_b, clock, checkpoint_every=4, total_steps=4)
    manager.run()
    good = ckpt.latest(tmp_path / "ckpt")
    assert good is not None
    block = next(good.glob("block_*.pt"))
    block.write_bytes(block.read_bytes()[:-3] + b"xyz")
    with pytest.raises(Exception, match="block_"):
        ckpt.verify(good)
    # a new job on the same directory must not pick the corrupted checkpoint
    assert ckpt.latest(tmp_path / "ckpt") is None


def test_voluntary_migration_goes_through_the_same_path(tmp_path: Path) -> None:
    clock = Clock()
    calls: list[tuple[bool, int]] = []

    def policy(placement: Placement, preempted: bool, step: int) -> KeepOffer | Migrate:
        calls.append((preempted, step))
        return Migrate(OFFER_B, "cheaper", 2.0) if placement.offer == OFFER_A else KeepOffer("already cheapest")

    manager, sessions = _manager(tmp_path, policy, clock, migration_check_every=4)
    report = manager.run()
    assert report.migrations == 1 and report.preemptions == 0
    decision = next(e for e in report.events if e["event"] == "migration_decision")
    assert decision["forced"] is False and decision["expected_saving_usd"] == 2.0
    assert (False, 4) in calls and (False, 8) in calls  # asked again after moving, and stayed
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert all(json.loads(line)["ts"] >= 0 for line in lines)
    assert report.cost_usd > 0


def test_cloud_watcher_deadline_maps_onto_the_manager_clock(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    clock = Clock()
    clock.t = 1000.0
    manager, _ = _manager(tmp_path, move_to_b, clock)
    manager.on_cloud_notice(datetime.now(timezone.utc) + timedelta(seconds=90), "aws-imds")
    notice = manager._take_notice()
    assert notice is not None and notice.source == "aws-imds"
    assert 1089.0 < notice.deadline <= 1090.0


def test_rehearsed_notice_fires_once_at_the_configured_step(tmp_path: Path) -> None:
    clock = Clock()
    manager, sessions = _manager(tmp_path, move_to_b, clock, rehearse_notice_at=5, rehearse_notice_s=30.0)
    report = manager.run()
    assert report.preemptions == 1
    notice = next(e for e in report.events if e["event"] == "preemption_notice")
    assert notice["step"] == 5 and notice["source"] == "rehearsal" and notice["seconds_left"] == 30.0


def test_metrics_receive_throughput_cost_rate_and_moves(tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.iterations: list[tuple[float, float, float | None]] = []
            self.moves = 0

        def record_iteration(self, samples_per_s: float, bubble: float, usd_per_hour: float | None = None) -> None:
            self.iterations.append((samples_per_s, bubble, usd_per_hour))

        def record_move(self) -> None:
            self.moves += 1

    clock = Clock()
    FakeSession.samples_per_step = 8  # type: ignore[attr-defined]
    try:
        manager, _ = _manager(tmp_path, move_to_b, clock, total_steps=6, rehearse_notice_at=3)
        manager.metrics = Recorder()
        manager.run()
    finally:
        del FakeSession.samples_per_step  # type: ignore[attr-defined]
    rec = manager.metrics
    assert len(rec.iterations) == 6 and rec.moves == 1
    assert rec.iterations[0] == (8.0, 0.0, OFFER_A.usd_per_hour)  # 8 samples in a 1 s step
    assert rec.iterations[-1][2] == OFFER_B.usd_per_hour


def test_failed_preemption_checkpoint_falls_back_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    clock = Clock()
    box: dict[str, Any] = {"calls": 0}

    def explode_second_time() -> None:
        box["calls"] += 1
        if box["calls"] == 2:
            raise OSError("disk full")

    manager, sessions = _manager(tmp_path, move_to_b, clock, checkpoint_every=4, rehearse_notice_at=6,
                                 hooks={"during_checkpoint": explode_second_time})
    report = manager.run()
    failed = next(e for e in report.events if e["event"] == "checkpoint_failed")
    assert failed["step"] == 6 and "disk full" in failed["error"] and failed["fallback"].endswith("step_00000004")
    assert not (tmp_path / "ckpt" / "step_00000006").exists() or ckpt.verify(tmp_path / "ckpt" / "step_00000006")
    resumed = next(e for e in report.events if e["event"] == "resumed")
    assert resumed["step"] == 4 and resumed["lost_steps"] == 2
    assert sorted(report.losses) == list(range(12))
