"""Live moves on the real Ray runtime keep training exact.

The sacred property: a run whose plan changes *between iterations* — blocks shifted across a
boundary, a replica moved from one stage to another, a newly joined device taking over blocks —
ends with weights ``allclose`` to single-process training with the same micro-batching. Only the
actors that :func:`move_transfers` lists exchange state (weights and Adam moments, actor to
actor), every worker keeps its process, and the process group is rebuilt only when a device
joined. One shared pool of five workers (``conftest.worker_group``) serves every test.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch

from actors.stage_worker import StageWorker
from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.core.cluster import flat
from actors.metrics import MeasuredIteration, MoveReply
from orchestrator.adapt import move_transfers
from orchestrator.adapt.handle import SHIPPED_STATE_FACTOR
from orchestrator.schedule.ir import COMPUTE_KINDS
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import Plan, Stage, straight_plan
from orchestrator.core.profile import Block, Profile
from orchestrator.train.runtime import PipelineRuntime

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)  # 8 blocks
MLP = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 11, widths=WIDTHS)  # 11 rows: uneven micro-batches and replica shares
ADAM = partial(torch.optim.Adam, lr=0.01)
M = 4


def param_profile() -> Profile:
    """Exact parameter bytes per block (timings are irrelevant to these tests)."""
    blocks = MLP()
    return Profile("mlp", tuple(Block(f"b{i}", 1e-3, 2e-3, 64.0, float(sum(p.numel() * 4 for p in b.parameters())))
                                for i, b in enumerate(blocks)))


def started(group: Any, plan: Plan, cluster_size: int = 4, members: tuple[int, ...] = (0, 1, 2, 3)) -> PipelineRuntime:
    """A runtime pinned as the elastic job pins it: device ``d`` is worker ``d``, every member a rank."""
    runtime = PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=plan, workers=group, pg_timeout_s=20)
    runtime.start(members=list(members), slots={d: d for d in range(cluster_size)}, size=cluster_size)
    return runtime


def iterate(runtime: PipelineRuntime) -> MeasuredIteration:
    return runtime.complete_step(runtime.submit_step())


def move(runtime: PipelineRuntime, new: Plan, cluster_size: int, members: list[int]) -> tuple[float, list[MoveReply]]:
    """A live move as the elastic job makes it: the hand-overs :func:`move_transfers` lists, through the runtime."""
    transfers = move_transfers(runtime.plan, new, param_profile(), flat(cluster_size, 10))
    reports = runtime.move_live(new, [(t.src, t.dst, t.first, t.last) for t in transfers], members)
    return float(sum(r.bytes_sent for r in reports)), reports


def pids(group: Any, devices: list[int]) -> dict[int, int]:
    return {s.device: s.pid for s in group.call(StageWorker.status, devices=devices)}


@pytest.mark.ray
def test_moves_between_iterations_stay_exact(worker_group: Any) -> None:
    """Shift a block across a boundary, move a replica between stages, then hand blocks to a
    device that joined mid-run; parameters match the single-process run after every phase."""
    start = straight_plan([0, 2, 4, 6, 8], M)
    shifted = straight_plan([0, 3, 4, 6, 8], M)  # block 2: device 1 -> device 0
    replicated = Plan((Stage(0, 4, (0, 1)), Stage(4, 8, (2, 3))), M)
    replica_moved = Plan((Stage(0, 4, (0,)), Stage(4, 8, (1, 2, 3))), M)  # device 1 changes stage
    joined = Plan((Stage(0, 3, (0,)), Stage(3, 6, (4,)), Stage(6, 8, (2, 3))), M)  # device 4 joins at step 8
    pipe = started(worker_group, start, cluster_size=5)  # device 4 is up but no member until it joins
    reference = ReferenceTrainer.for_plan(start, MLP, loss_fn("mlp"), ADAM, DATA)
    profile, cluster = param_profile(), flat(5, 10)
    before = pids(worker_group, [0, 1, 2, 3])
    losses: list[float] = []

    def train(n: int) -> None:
        for _ in range(n):
            m = iterate(pipe)
            assert {s.device for s in m.spans if s.kind in COMPUTE_KINDS} == set(pipe.plan.devices)
            losses.append(m.loss)
        got, want = pipe.state_dicts(), (reference.train(n), reference.state_dicts())[1]
        assert allclose(got, want), f"{pipe.plan.describe()}: max |diff| {max_difference(got, want):.3g}"

    train(2)
    for new in (shifted, replicated, replica_moved):
        expected = move_transfers(pipe.plan, new, profile, cluster)
        moved, reports = move(pipe, new, 5, [0, 1, 2, 3])
        assert pipe.plan == new
        # exactly the listed senders shipped bytes: weights + two Adam moments (+ step counters)
        want_bytes = sum(t.nbytes for t in expected)
        assert want_bytes > 0 and moved == pytest.approx(want_bytes, rel=0.02)
        assert {r.device for r in reports if r.bytes_sent > 0} == {t.src for t in expected}
        assert not any(r.rejoined for r in reports), (reports, worker_group.rank_of)  # same members: no re-formation
        train(2)
    assert pids(worker_group, [0, 1, 2, 3]) == before  # nobody was restarted
    assert worker_group.rank_of == {0: 0, 1: 1, 2: 2, 3: 3}  # the joined device is no member yet
    expected = move_transfers(pipe.plan, joined, profile, cluster)
    assert {t.dst for t in expected} == {4}
    moved, reports = move(pipe, joined, 5, [0, 1, 2, 3, 4])
    assert all(r.rejoined for r in reports)  # membership changed: new process group
    assert moved == pytest.approx(sum(t.nbytes for t in expected), rel=0.02)
    train(2)
    assert pids(worker_group, [0, 1, 2, 3]) == before
    assert losses == pytest.approx(reference.losses, rel=1e-5, abs=1e-6)
    assert SHIPPED_STATE_FACTOR == 3.0  # the byte check above assumes Adam's two moments


@pytest.mark.ray
def test_move_that_only_drops_blocks_ships_nothing(worker_group: Any) -> None:
    """Giving up a replica needs no data: the survivors already hold everything."""
    plan = Plan((Stage(0, 4, (0, 1)), Stage(4, 8, (2,))), M)
    pipe = started(worker_group, plan)
    reference = ReferenceTrainer.for_plan(plan, MLP, loss_fn("mlp"), ADAM, DATA)
    iterate(pipe)
    moved, _ = move(pipe, straight_plan([0, 4, 8], M, devices=[(0,), (2,)]), 4, [0, 1, 2, 3])
    assert moved == 0
    iterate(pipe)
    reference.train(2)
    assert allclose(pipe.state_dicts(), reference.state_dicts())
