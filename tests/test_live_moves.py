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

from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.core.cluster import flat
from orchestrator.adapt import FaultSchedule, Join, PipelineHandle, move_transfers
from orchestrator.adapt.handle import SHIPPED_STATE_FACTOR
from orchestrator.elastic.harness import RayPipeline
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


def handle(group: Any, plan: Plan, cluster_size: int = 4, faults: FaultSchedule = FaultSchedule()) -> RayPipeline:
    trainer = PipelineRuntime(MLP, loss_fn("mlp"), ADAM, DATA, M, plan=plan, workers=group, pg_timeout_s=20)
    return RayPipeline(trainer, flat(cluster_size, 10), faults, param_profile())


def pids(group: Any, devices: list[int]) -> dict[int, int]:
    return {s["device"]: s["pid"] for s in group.call("status", devices=devices)}


@pytest.mark.ray
def test_moves_between_iterations_stay_exact(worker_group: Any) -> None:
    """Shift a block across a boundary, move a replica between stages, then hand blocks to a
    device that joined mid-run; parameters match the single-process run after every phase."""
    start = straight_plan([0, 2, 4, 6, 8], M)
    shifted = straight_plan([0, 3, 4, 6, 8], M)  # block 2: device 1 -> device 0
    replicated = Plan((Stage(0, 4, (0, 1)), Stage(4, 8, (2, 3))), M)
    replica_moved = Plan((Stage(0, 4, (0,)), Stage(4, 8, (1, 2, 3))), M)  # device 1 changes stage
    joined = Plan((Stage(0, 3, (0,)), Stage(3, 6, (4,)), Stage(6, 8, (2, 3))), M)  # device 4 joins at step 8
    faults = FaultSchedule((Join(4, 8),), frozenset({4}))
    pipe = handle(worker_group, start, cluster_size=5, faults=faults)
    assert isinstance(pipe, PipelineHandle)
    reference = ReferenceTrainer.for_plan(start, MLP, loss_fn("mlp"), ADAM, DATA)
    profile = pipe.profile
    before = pids(worker_group, [0, 1, 2, 3])
    losses: list[float] = []

    def train(n: int) -> None:
        for _ in range(n):
            m = pipe.run_iteration()
            assert m.completed and set(m.compute_s) == set(pipe.current_plan().devices)
            losses.append(pipe.last_measured.loss)
        got, want = pipe.runtime.state_dicts(), (reference.train(n), reference.state_dicts())[1]
        assert allclose(got, want), f"{pipe.current_plan().describe()}: max |diff| {max_difference(got, want):.3g}"

    train(2)
    for new, expect_rejoin in ((shifted, False), (replicated, False), (replica_moved, False)):
        old = pipe.current_plan()
        expected = move_transfers(old, new, profile, pipe.cluster)
        report = pipe.apply_move(new)
        assert report.plan == new == pipe.current_plan() and report.stall_s > 0
        # exactly the listed senders shipped bytes: weights + two Adam moments (+ step counters)
        want_bytes = sum(t.nbytes for t in expected)
        assert want_bytes > 0 and report.bytes_moved == pytest.approx(want_bytes, rel=0.02)
        senders = {t.src for t in expected}
        sent = {r["device"]: r["bytes_sent"] for r in pipe.last_move_reports}
        assert {d for d, b in sent.items() if b > 0} == senders
        assert all(r["rejoined"] is expect_rejoin for r in pipe.last_move_reports), (pipe.last_move_reports, worker_group.rank_of)
        train(2)
    assert pids(worker_group, [0, 1, 2, 3]) == before  # nobody was restarted
    assert worker_group.rank_of == {0: 0, 1: 1, 2: 2, 3: 3}  # the joined device is no member yet
    assert pipe.alive_devices() == (0, 1, 2, 3, 4)
    expected = move_transfers(pipe.current_plan(), joined, profile, pipe.cluster)
    assert {t.dst for t in expected} == {4}
    report = pipe.apply_move(joined)
    assert all(r["rejoined"] for r in pipe.last_move_reports)  # membership changed: new process group
    assert report.bytes_moved == pytest.approx(sum(t.nbytes for t in expected), rel=0.02)
    train(2)
    assert pids(worker_group, [0, 1, 2, 3]) == before
    assert losses == pytest.approx(reference.losses, rel=1e-5, abs=1e-6)
    assert SHIPPED_STATE_FACTOR == 3.0  # the byte check above assumes Adam's two moments


@pytest.mark.ray
def test_move_that_only_drops_blocks_ships_nothing(worker_group: Any) -> None:
    """Giving up a replica needs no data: the survivors already hold everything."""
    plan = Plan((Stage(0, 4, (0, 1)), Stage(4, 8, (2,))), M)
    pipe = handle(worker_group, plan)
    reference = ReferenceTrainer.for_plan(plan, MLP, loss_fn("mlp"), ADAM, DATA)
    pipe.run_iteration()
    report = pipe.apply_move(straight_plan([0, 4, 8], M, devices=[(0,), (2,)]))
    assert report.bytes_moved == 0
    pipe.run_iteration()
    reference.train(2)
    assert allclose(pipe.runtime.state_dicts(), reference.state_dicts())
