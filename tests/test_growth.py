"""Live growth: a device that joins a running job gets a stage actor and, when the arbiter says it
pays, blocks by live two-worker moves — survivors keep their processes, nothing is restored, and
the final weights equal uninterrupted single-process training.

The signal from Ray itself (a node added to a multi-node cluster) is tested in
tests/test_multinode.py (scenario ``growth``); here the join is rehearsed (``Join`` in
``AdaptConfig.faults``) on the local instance.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.adapt.controller import ControllerConfig
from orchestrator.adapt.faults import FaultSchedule, Join, Slowdown
from orchestrator.adapt.policies import ArbiterConfig
from orchestrator.core.errors import UserError
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import straight_plan

WIDTHS = (64, 512, 512, 512, 512, 512, 512, 512, 8)  # 8 blocks heavy enough that a third stage pays
TRAIN = TrainConfig(model_factory=partial(mlp, WIDTHS), loss_fn=loss_fn("mlp"),
                    optimizer_factory=partial(torch.optim.SGD, lr=0.01, momentum=0.9),
                    data_fn=partial(example_batch, "mlp", 128, widths=WIDTHS), num_microbatches=8)
# The rehearsal: the job's two devices are slowed 5x (a sleep after each compute, in proportion
# to its CPU seconds, so the slowdown is deterministic on a loaded machine) and a full-speed one
# joins at iteration 6 — on 2 shared cores more actors only pay where time is not CPU time. The
# arbiter's noise floor and its price of a move are tested on their own (test_controller_*.py);
# on a loaded machine iteration times swing and transfer spans include waits for the peer (so
# moves look slow), which could hide the gain this test is about: the floor is off and a tenth
# of a move's predicted cost is enough.
ADAPT = ControllerConfig(straight=True, warmup_iterations=3, arbiter=ArbiterConfig(noise_z=0.0, margin=0.1))
SLOW = (Slowdown(0, 5.0, 0), Slowdown(1, 5.0, 0))


def events_named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def wait_until_up(job: ElasticJob, device: int, timeout_s: float = 300.0) -> None:
    """Between two ``fit`` calls, step the job's capacity watch (as its loop does between
    iterations) until ``device`` is up: on a loaded machine an actor start can take longer than
    the iterations the arbiter needs to see a move pay."""
    import time

    deadline = time.monotonic() + timeout_s
    while device not in job.alive and time.monotonic() < deadline:
        job.growth.poll(job.runtime.step)
        time.sleep(0.2)
    assert device in job.alive, f"device {device}'s worker did not start"


@pytest.mark.ray
def test_a_joined_device_receives_blocks_live_and_training_stays_exact(ray_session: Any, tmp_path: Path) -> None:
    job = ElasticJob(TRAIN, ScalingConfig(devices=2, max_devices=3, plan=straight_plan([0, 4, 8], 8), node_poll_s=0),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=0),
                     AdaptConfig(controller=ADAPT, faults=FaultSchedule(SLOW + (Join(2, 3),))), SpotConfig(enabled=False))
    try:
        job.fit(6)  # device 2's worker starts at iteration 3 while training goes on
        wait_until_up(job, 2)
        events = job.fit(30).events  # to step 30: 24 more
        before = {d["device"]: d["pid"] for d in events_named(events, "job_started")[0]["devices"]}
        (added,) = events_named(events, "capacity_added")
        assert added["step"] == 3 and [d["device"] for d in added["devices"]] == [2] and added["source"].startswith("rehearsal")
        assert added["decision"] == "move" and any(dst == 2 for _, dst in added["moves"]) and added["holding_blocks"] == [2], added
        assert 2 in job.runtime.plan.devices
        after = {d.device: d.pid for d in job.runtime.devices()}
        assert {d: after[d] for d in before if d in after} == {d: before[d] for d in before if d in after}  # not restarted
        assert not events_named(events, "resumed") and job.restarts == 0
        assert job.runtime.step == 30 and job.max_abs_diff() <= 1e-5
    finally:
        job.close()


@pytest.mark.ray
def test_with_adaptation_off_a_joined_device_waits_idle_and_the_reason_is_recorded(worker_group: Any, tmp_path: Path) -> None:
    job = ElasticJob(TRAIN, ScalingConfig(devices=2, max_devices=3, plan=straight_plan([0, 4, 8], 8), node_poll_s=0),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=0),
                     AdaptConfig(enabled=False, faults=FaultSchedule((Join(2, 2),))), SpotConfig(enabled=False),
                     workers=worker_group)
    try:
        events = job.fit(4).events
        (added,) = events_named(events, "capacity_added")
        assert added["decision"] == "none" and "switched off" in added["reason"] and added["moves"] == []
        assert 2 in job.alive and 2 not in job.runtime.plan.devices and job.max_abs_diff() <= 1e-5
    finally:
        job.close()


def test_growth_configs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="below devices"):
        ScalingConfig(devices=3, max_devices=2)
    with pytest.raises(UserError, match="rehearsed joins must name devices 2"):
        ElasticJob(TRAIN, ScalingConfig(devices=2, max_devices=4), RunConfig(storage=str(tmp_path)),
                   AdaptConfig(faults=FaultSchedule((Join(3, 5),))))
    with pytest.raises(UserError, match="names device 2, but the cluster has 2"):  # growth off: no device 2
        ElasticJob(TRAIN, ScalingConfig(devices=2), RunConfig(storage=str(tmp_path)), AdaptConfig(faults=FaultSchedule((Join(2, 5),))))


@pytest.mark.ray
def test_a_joined_idle_device_takes_over_an_evacuated_stage_live(worker_group: Any, tmp_path: Path) -> None:
    """Capacity that joined is room for an evacuation: the notified device's blocks go to the
    newcomer by live moves, which bring it into the process group. Exact, no restore."""
    from orchestrator import InjectedNotice

    job = ElasticJob(TRAIN, ScalingConfig(devices=2, max_devices=3, plan=straight_plan([0, 4, 8], 8), node_poll_s=0),
                     RunConfig(storage=str(tmp_path / "ckpt"), events=tmp_path / "events.jsonl", checkpoint_every=0),
                     AdaptConfig(enabled=False, faults=FaultSchedule((Join(2, 1),))),
                     SpotConfig(notices=(InjectedNotice(3, 60.0, (1,)),)), workers=worker_group)
    try:
        job.fit(2)  # the join is rehearsed at step 1; its worker starts in the background
        wait_until_up(job, 2)  # up before the notice after step 3, however loaded the machine (the decision made certain)
        events = job.fit(6).events
        (handled,) = events_named(events, "preemption_handled")
        # device 1's blocks go to the newcomer; the survivors' plan may also re-cut the boundary (the split follows
        # the measured profile), but only onto the newcomer: nothing is restored, nobody else receives
        assert handled["mode"] == "live" and [1, 2] in handled["moves"] and handled["lost_steps"] == 0
        assert all(dst == 2 for _, dst in handled["moves"]), handled["moves"]
        assert sorted(job.runtime.plan.devices) == [0, 2] and not events_named(events, "resumed")
        assert job.runtime.step == 6 and job.max_abs_diff() <= 1e-5
    finally:
        job.close()
