"""Recovery in place after a death without notice, at the trainer level.

A stage worker dies mid-step (the ``Kill`` rehearsal: its process exits); the survivors keep their processes,
re-form a process group among themselves on a plan over survivors, roll back to the newest restorable step from
host copies (their own, a neighbour's) or the committed checkpoint, and training goes on — exactly as
single-process training with the same micro-batches.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch import nn

from actors.host_copies import HostCopies
from actors.snapshot import from_wire, to_wire
from actors.stage_worker import StageWorker
from actors.group import PipelineActorError
from actors.injection import arm_kills
from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.core.plan import Plan, straight_plan
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.train.recovery import InPlaceImpossible, InPlaceRecovery
from orchestrator.train.runtime import PipelineRuntime

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)
MLP = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 11, widths=WIDTHS)
ADAM = partial(torch.optim.Adam, lr=0.01)
M = 4
PLAN = straight_plan([0, 2, 4, 6, 8], M)  # devices 0-3, two blocks each
SURVIVORS = straight_plan([0, 3, 6, 8], M, devices=[[0], [2], [3]])  # device 1 gone


@pytest.fixture
def pool(worker_group: Any) -> Iterator[Any]:
    """The shared pool, whole again after a test that killed a worker: a fresh process on each dead slot, the survivors
    kept, as a recovery in place keeps them (no call is cancelled any more, so none can leave a hole in Ray's
    per-caller sequence numbers for the next test to wait on); every worker replaced only if the group is broken.
    Restarting all four after each kill cost 30-45 s of teardown per test on a loaded machine."""
    yield worker_group
    if worker_group.broken:
        worker_group.restart()
    elif worker_group.dead:
        worker_group.respawn(sorted(worker_group.dead))


def trainer_on(pool: Any, tmp: Path | None = None) -> PipelineRuntime:
    """The runtime alone: its recovery primitives are under test."""
    return PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=PLAN, workers=pool, pg_timeout_s=60, checkpoint_dir=tmp)


def one_step(runtime: PipelineRuntime, every: int = 0) -> None:
    """One step through the runtime's primitives, then a checkpoint if one is due every ``every`` steps."""
    runtime.complete_step(runtime.submit_step())
    if every and runtime.step % every == 0:
        runtime.save_checkpoint()


def train_through_a_death(trainer: PipelineRuntime, steps: int, snapshots: bool = False, every: int = 0,
                          settle: bool = True) -> list[InPlaceRecovery]:
    """``steps`` steps with ``one_step``; each death is recovered in place onto SURVIVORS. ``snapshots``: one after
    every step, copied while the next runs; ``settle``: each waited for before that next step (so a death in it
    finds the snapshot complete everywhere), else left to race with the step."""
    done: list[InPlaceRecovery] = []
    while trainer.step < steps:
        try:
            one_step(trainer, every)
        except PipelineActorError as exc:
            assert exc.died, exc
            done.append(trainer.recover_in_place([exc.device], SURVIVORS))
            continue
        if snapshots:
            trainer.snapshot_in_memory()
            if settle:
                trainer.settle_snapshots()
    return done


def check_exact(trainer: PipelineRuntime, steps: int) -> None:
    ref = ReferenceTrainer.for_plan(PLAN, MLP, loss_fn("mlp"), ADAM, DATA)
    ref.train(steps)
    got, want = trainer.state_dicts(), ref.state_dicts()
    assert allclose(got, want), max_difference(got, want)


@pytest.mark.ray
def test_a_death_with_snapshots_every_step_loses_no_step_and_keeps_the_survivors(pool: Any) -> None:
    trainer = arm_kills(trainer_on(pool), [(4, 1)])
    trainer.start()
    pids = {d.device: d.pid for d in trainer.devices()}
    trainer.snapshot_in_memory()
    held = trainer.settle_snapshots()
    assert set(held) == {0, 1, 2, 3} and all(b > 0 for b in held.values())  # own + a neighbour's copy each
    [rec] = train_through_a_death(trainer, 7, snapshots=True)
    assert rec.resumed_step == 4  # the snapshot after step 3, complete before step 4 ran: nothing lost
    assert rec.source == "peer" and rec.blocks_from["peer"] >= 1  # device 1's blocks came from device 2's memory
    assert {d["device"]: d["pid"] for d in rec.devices} == {d: pids[d] for d in (0, 2, 3)}  # same processes
    assert {s.device: s.pid for s in pool.call(StageWorker.status, devices=[0, 2, 3])} == {d: pids[d] for d in (0, 2, 3)}
    assert trainer.plan == SURVIVORS and set(rec.snapshot_bytes) == {0, 2, 3}
    check_exact(trainer, 7)


@pytest.mark.ray
def test_a_death_while_the_snapshot_copies_overlap_the_step_recovers_exactly(pool: Any) -> None:
    """Nothing waited for between steps: each snapshot is copied and sent while the next step runs, and device 1 dies
    halfway through one of them. The newest snapshot complete everywhere is the one before the step (nothing lost)
    or, when the dying worker's copy had not reached its neighbour yet, the one before (one step); either way the
    state restored is exactly that step's."""
    trainer = arm_kills(trainer_on(pool), [(4, 1)])
    [rec] = train_through_a_death(trainer, 6, snapshots=True, settle=False)
    assert rec.resumed_step in (3, 4) and rec.source == "peer", rec
    check_exact(trainer, 6)


@pytest.mark.ray
def test_a_death_without_snapshots_rolls_back_to_the_checkpoint_from_host_copies_and_storage(pool: Any, tmp_path: Path) -> None:
    trainer = arm_kills(trainer_on(pool, tmp_path), [(3, 1)])
    [rec] = train_through_a_death(trainer, 6, every=2)
    assert rec.resumed_step == 2 and rec.source == "storage"
    # the survivors' own blocks from the host copy their checkpoint was written from; device 1's from storage
    assert rec.blocks_from["own"] >= 4 and rec.blocks_from["storage"] >= 1, rec.blocks_from
    check_exact(trainer, 6)


@pytest.mark.ray
def test_a_death_with_nothing_kept_resumes_from_the_seed_in_place(pool: Any) -> None:
    trainer = arm_kills(trainer_on(pool), [(2, 1)])
    [rec] = train_through_a_death(trainer, 4)
    assert rec.resumed_step == 0 and rec.source == "seed"
    check_exact(trainer, 4)


@pytest.mark.ray
def test_two_deaths_at_once_lose_their_copies_together_and_roll_back_to_the_checkpoint_in_place(pool: Any, tmp_path: Path) -> None:
    """Devices 1 and 2 die together (as a node's would): device 1's snapshot copy was on device 2, so its blocks
    come from the committed checkpoint, and the two survivors continue in their own processes, exactly."""
    trainer = trainer_on(pool, tmp_path)
    trainer.start()
    pids = {d.device: d.pid for d in trainer.devices()}
    for _ in range(5):
        one_step(trainer, every=2)
        trainer.snapshot_in_memory()
    trainer.settle_snapshots()
    pool.kill_worker(1)
    pool.kill_worker(2)
    with pytest.raises(PipelineActorError):
        one_step(trainer, every=2)
    rec = trainer.recover_in_place([1], straight_plan([0, 4, 8], M, devices=[[0], [3]]))
    assert rec.resumed_step == 4 and rec.source == "storage", rec
    assert {d["device"]: d["pid"] for d in rec.devices} == {0: pids[0], 3: pids[3]}
    while trainer.step < 7:
        one_step(trainer, every=2)
    check_exact(trainer, 7)


@pytest.mark.ray
def test_a_plan_over_a_dead_device_is_refused_with_a_reason(pool: Any) -> None:
    trainer = trainer_on(pool)
    trainer.start()
    one_step(trainer)
    pool.kill_worker(1)
    with pytest.raises(PipelineActorError):
        one_step(trainer)
    with pytest.raises(InPlaceImpossible) as err:
        trainer.recover_in_place([1], PLAN)
    assert "no live worker" in err.value.reason and "[1]" in err.value.reason


@pytest.mark.ray
def test_the_step_an_asynchronous_checkpoint_is_uploading_is_a_host_copy_before_it_commits(pool: Any, tmp_path: Path) -> None:
    """A death during an asynchronous upload (the step after the checkpoint) may roll back to the uploaded step: each
    worker's snapshot for the upload is that step's state already. Here device 1 dies holding no blocks (the plan is
    over devices 0, 2 and 3), so every block has a copy at the uploaded step and nothing is lost, with nothing read
    from storage (the upload never commits)."""
    plan = straight_plan([0, 3, 6, 8], M, devices=[[0], [2], [3]])
    runtime = PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=plan, workers=pool, pg_timeout_s=60, checkpoint_dir=tmp_path)
    runtime.start(members=[0, 1, 2, 3])
    for _ in range(3):
        one_step(runtime)
    runtime.save_checkpoint(background=True)
    one_step(runtime)  # the upload's snapshot is taken before this step's optimizer step
    held = pool.call(StageWorker.host_copies, devices=[0, 2, 3])
    assert all(3 in r.steps for r in held), held
    pool.kill_worker(1)
    rec = runtime.recover_in_place([1], plan)
    assert rec.resumed_step == 3 and rec.source == "snapshot" and rec.blocks_from.get("storage", 0) == 0, rec
    assert runtime.latest() is None  # the upload was never committed
    while runtime.step < 6:
        one_step(runtime)
    ref = ReferenceTrainer.for_plan(plan, MLP, loss_fn("mlp"), ADAM, DATA)
    ref.train(6)
    assert allclose(runtime.state_dicts(), ref.state_dicts())


@pytest.mark.ray
def test_a_full_restart_leaves_the_slots_of_a_node_that_left_dead_instead_of_waiting_for_it(ray_session: Any) -> None:
    """The restart fallback after a node left: a hard node affinity to a removed node can never be scheduled, so
    those slots stay dead (no actor), the others get fresh processes, and a plan over the reachable devices runs."""
    from dataclasses import replace

    from actors.group import WorkerGroup
    from orchestrator.core.errors import UserError

    group = WorkerGroup(2, use_gpu=False)
    try:
        before = [i["pid"] for i in group.identities]
        group.processes.slots[1] = replace(group.processes.slots[1], node_id="f" * 56)  # device 1's node is gone from Ray's node table
        assert group.node_lost_slots() == {1}
        group.restart()
        assert group.dead == {1} and group.processes.actors[1] is None and group.identities[1] == {}
        assert group.identities[0]["pid"] != before[0]  # a fresh process on the slot that is still there
        runtime = PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=straight_plan([0, 8], M), workers=group, pg_timeout_s=60)
        runtime.start(members=[0])
        one_step(runtime)
        with pytest.raises(UserError, match="no live worker"):
            group.configure(runtime.spec, straight_plan([0, 4, 8], M), members=[0, 1])
    finally:
        group.shutdown()


@pytest.mark.ray
def test_host_copies_keep_two_own_generations_in_the_object_store_and_the_neighbours_newest(ray_session: Any) -> None:
    """Own snapshots are objects of the store, copies of the live state (a later in-place change does not reach
    them); two generations are kept, each read back as a copy of the reader's own; a neighbour's newest only."""
    torch.manual_seed(0)
    block = nn.Linear(4, 4)
    opt = torch.optim.SGD(block.parameters(), lr=0.1, momentum=0.9)
    block(torch.ones(2, 4)).sum().backward()
    opt.step()
    copies = HostCopies()
    for step in (1, 2):
        copies.take(step, {0: block}, {0: opt}).snapshotted.wait()
    before = block.weight.detach().clone()
    with torch.no_grad():
        block.weight.add_(1.0)  # after the copy was taken: the snapshot keeps step 2's state
    copies.take(3, {0: block}, {0: opt}).snapshotted.wait()  # on CPU the put of the live tensors is the copy
    taken = block.weight.detach().clone()
    with torch.no_grad():
        block.weight.add_(1.0)  # as the next optimizer step would, once the copy exists
    assert copies.inventory() == {2: [0], 3: [0]}
    at2, at3 = copies.get(2, 0), copies.get(3, 0)
    assert at2 is not None and at3 is not None
    assert torch.equal(at2["model"]["weight"], before) and torch.equal(at3["model"]["weight"], taken)
    at3["model"]["weight"].zero_()  # the reader's own copy: the held one is unchanged
    again = copies.get(3, 0)
    assert again is not None and torch.equal(again["model"]["weight"], taken)
    assert isinstance(copies.own_objects(3)[0], ray_session.ObjectRef)
    assert copies.nbytes() == 2 * (16 + 4 + 16 + 4) * 4  # weights and momentum, two generations
    copies.keep_peer(8, {1: to_wire(at2), 2: to_wire(at2)})
    copies.keep_peer(9, {1: to_wire(again)})  # the ring changed: block 2's owner now sends elsewhere
    assert copies.inventory() == {2: [0], 3: [0], 8: [2], 9: [1]}  # block 1's older copy is freed, block 2's kept
    copies.take(4, {0: block}, {0: opt})  # the driver starts a snapshot once the last one is complete everywhere
    assert copies.inventory() == {3: [0], 4: [0], 9: [1]}
    copies.drop_after(3)
    assert copies.inventory() == {3: [0]}


@pytest.mark.ray
def test_a_checkpoint_copy_is_read_as_a_copy_exported_through_the_store_and_forgotten_before_reuse(ray_session: Any) -> None:
    block = nn.Linear(2, 2)
    copies = HostCopies()
    staged = {0: {"block": 0, "model": {k: v.clone() for k, v in block.state_dict().items()}, "optimizer": None}}
    copies.keep_checkpoint(4, staged)
    got = copies.get(4, 0)
    assert got is not None and got["model"]["weight"] is not staged[0]["model"]["weight"]
    assert torch.equal(got["model"]["weight"], staged[0]["model"]["weight"])
    sent = from_wire(ray_session.get(copies.export(4, 0)))
    assert torch.equal(sent["model"]["bias"], staged[0]["model"]["bias"])
    copies.forget(staged)
    assert 4 not in copies.inventory() and copies.export(4, 0) is None
    for step in (5, 6):
        copies.take(step, {0: block}, {})
    copies.keep_checkpoint(4, staged)  # an older checkpoint's copy evicts no snapshot
    assert copies.inventory() == {4: [0], 5: [0], 6: [0]}
