"""The Ray runtime executes the schedule IR exactly: pipelined == single-process training.

Every plan shape the IR can express (GPipe, 1F1B, interleaved, sliced units, replicated stages
with uneven row shares, a single device holding several virtual stages) must end with weights
``allclose`` to sequential gradient accumulation with the same micro-batching. One pool of five
workers is re-partitioned for every plan, which keeps the whole file well under a minute.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from actors.group import PipelineActorError
from actors.injection import arm_kills
from actors.reference import ReferenceTrainer, allclose, max_difference
from actors.transport import intersect, replica_range, split_range, unit_range
from orchestrator.profiling.models import example_batch, loss_fn, mlp, tiny_transformer
from orchestrator.core.plan import Plan, ScheduleKind, interleave, straight_plan
from orchestrator.schedule.lowering import peers
from orchestrator.train.trainer import PipelineTrainer

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)  # 8 blocks
MLP = partial(mlp, WIDTHS)
MLP_DATA = partial(example_batch, "mlp", 11, widths=WIDTHS)  # 11 rows: uneven micro-batches and shares
SGD = partial(torch.optim.SGD, lr=0.1, momentum=0.9)
ADAM = partial(torch.optim.Adam, lr=0.01)
TF_KW: dict[str, Any] = {"vocab": 32, "d_model": 16, "n_layers": 2, "n_heads": 2, "seq_len": 8}
TF = partial(tiny_transformer, sub_layer_blocks=True, **TF_KW)  # 6 blocks
TF_DATA = partial(example_batch, "tiny_transformer", 8, **TF_KW)

STEPS = 2


def sliced(plan: Plan, k: int) -> Plan:
    return replace(plan, sliced_microbatches=k)


EXACTNESS = {
    "1f1b-2stages": straight_plan([0, 4, 8], 4),
    "gpipe-3stages": straight_plan([0, 2, 5, 8], 3, ScheduleKind.GPIPE),
    "1f1b-4stages-sliced": sliced(straight_plan([0, 2, 4, 6, 8], 4), 2),
    "gpipe-3stages-sliced": sliced(straight_plan([0, 3, 5, 8], 3, ScheduleKind.GPIPE), 1),
    "interleaved-2x2": interleave(straight_plan([0, 4, 8], 4), 2),
    "interleaved-1x3-local-handoff": interleave(straight_plan([0, 8], 3), 3),
    "1f1b-replicas-2-3": straight_plan([0, 3, 8], 3, devices=[(0, 1), (2, 3, 4)]),
    "gpipe-replicas-3-2-sliced": sliced(straight_plan([0, 3, 8], 3, ScheduleKind.GPIPE, devices=[(0, 1, 2), (3, 4)]), 1),
    "interleaved-replicas": interleave(straight_plan([0, 4, 8], 4, devices=[(0, 1), (2,)]), 2),
    "1f1b-3stages-middle-replicated": straight_plan([0, 2, 5, 8], 4, devices=[(0,), (1, 2), (3,)]),
    # zero bubble: split backwards (BI now, W deferred) give the same weights
    "zb-h1-4stages": straight_plan([0, 2, 4, 6, 8], 6, ScheduleKind.ZB_H1),
    "zb-h1-replicas-2-3": straight_plan([0, 3, 8], 3, ScheduleKind.ZB_H1, devices=[(0, 1), (2, 3, 4)]),
    "zb-h1-3stages-sliced-middle-replicated": sliced(straight_plan([0, 2, 5, 8], 4, ScheduleKind.ZB_H1, devices=[(0,), (1, 2), (3,)]), 2),
}


def run_and_compare(group: Any, plan: Plan, optimizer: Any = SGD, model: Any = MLP, data: Any = MLP_DATA, loss: Any = None) -> None:
    loss = loss or loss_fn("mlp")
    trainer = PipelineTrainer(model, loss, optimizer, data, plan.num_microbatches, plan=plan, workers=group)
    result = trainer.fit(STEPS)
    reference = ReferenceTrainer.for_plan(plan, model, loss, optimizer, data)
    ref_losses = reference.train(STEPS)
    got, want = trainer.state_dicts(), reference.state_dicts()
    assert allclose(got, want), f"{plan.describe()}: max |diff| {max_difference(got, want):.3g}"
    assert list(result.losses.values()) == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)


@pytest.mark.ray
@pytest.mark.parametrize("name", list(EXACTNESS))
def test_pipelined_training_matches_single_process(worker_group: Any, name: str) -> None:
    run_and_compare(worker_group, EXACTNESS[name])


@pytest.mark.ray
def test_zero_bubble_bit_exact_and_transformer(worker_group: Any) -> None:
    """Split backwards run the whole backward's kernels on the same values in the same order:
    with one device per stage the weights are bitwise those of single-process training."""
    plan = straight_plan([0, 3, 5, 8], 5, ScheduleKind.ZB_H1)
    loss = loss_fn("mlp")
    trainer = PipelineTrainer(MLP, loss, SGD, MLP_DATA, plan.num_microbatches, plan=plan, workers=worker_group)
    trainer.fit(STEPS)
    reference = ReferenceTrainer.for_plan(plan, MLP, loss, SGD, MLP_DATA)
    reference.train(STEPS)
    assert max_difference(trainer.state_dicts(), reference.state_dicts()) == 0.0
    # integer inputs (stage 0 runs its whole backward at W), 3-d activations, attention
    run_and_compare(worker_group, straight_plan([0, 2, 4, 6], 4, ScheduleKind.ZB_H1), model=TF, data=TF_DATA,
                    loss=loss_fn("tiny_transformer"))


@pytest.mark.ray
def test_adam_exact_on_replicated_interleaved(worker_group: Any) -> None:
    run_and_compare(worker_group, interleave(straight_plan([0, 4, 8], 4, devices=[(0,), (1, 2)]), 2), optimizer=ADAM)


def tf_float64() -> list[torch.nn.Module]:
    return [b.double() for b in TF()]


@pytest.mark.ray
def test_transformer_with_integer_inputs_and_3d_activations(worker_group: Any) -> None:
    plan = sliced(straight_plan([0, 2, 4, 6], 4, devices=[(0,), (1, 2), (3,)]), 1)
    run_and_compare(worker_group, plan, model=TF, data=TF_DATA, loss=loss_fn("tiny_transformer"))


@pytest.mark.ray
def test_transformer_adam_float64(worker_group: Any) -> None:
    """Adam in float32 turns summation-order noise on zero-gradient parameters (attention key
    biases: softmax ignores them) into lr-sized steps, so its exactness is checked in float64."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    plan = straight_plan([0, 2, 4, 6], 4, devices=[(0,), (1, 2), (3,)])
    run_and_compare(worker_group, plan, optimizer=ADAM, model=tf_float64, data=TF_DATA, loss=loss_fn("tiny_transformer"))


@pytest.mark.ray
def test_metrics_and_measured_timeline(worker_group: Any, tmp_path: Path) -> None:
    plan = straight_plan([0, 3, 8], 4, devices=[(0,), (1, 2)])
    trainer = PipelineTrainer(MLP, loss_fn("mlp"), SGD, MLP_DATA, 4, plan=plan, workers=worker_group)
    result = trainer.fit(2)
    m = result.metrics[-1]
    compute = [s for s in m.spans if s.kind in ("F", "B")]
    assert len(compute) == 2 * 4 * 3  # F and B of 4 units on 3 devices
    assert all(0.0 <= s.start <= s.end for s in m.spans)
    assert {(t.src, t.dst) for t in m.transfers} == {(0, 1), (0, 2), (1, 0), (2, 0)}
    assert all(t.bytes > 0 for t in m.transfers) and all(bw > 0 for bw in m.link_bandwidth().values())
    assert set(m.bubble_s) == {0, 1, 2} and all(0.0 <= f <= 1.0 for f in m.bubble_fraction.values())
    assert m.memory_metric == "stash_high_water" and all(v > 0 for v in m.peak_memory_bytes.values())
    trace = json.loads(result.write_timeline(tmp_path / "measured.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert "0F0" in names and "1B3" in names and "2ALL_REDUCE" not in names and "1ALL_REDUCE" in names


@pytest.mark.ray
def test_actor_death_names_stage_and_device(worker_group: Any) -> None:
    plan = straight_plan([0, 3, 6, 8], 3)
    trainer = arm_kills(PipelineTrainer(MLP, loss_fn("mlp"), SGD, MLP_DATA, 3, plan=plan, workers=worker_group,
                                        pg_timeout_s=20), {(1, 1)})
    # fit runs steps 0-2 in one call per worker (iterations_per_call): the death names that run
    with pytest.raises(PipelineActorError, match=r"stage 1 \(device 1, blocks \[3,6\)\) died during steps 0-2") as info:
        trainer.fit(3)
    assert info.value.died and info.value.device == 1 and info.value.stages == (1,)


@pytest.mark.ray
def test_restarts_from_last_checkpoint_after_death(worker_group: Any, tmp_path: Path) -> None:
    plan = straight_plan([0, 3, 6, 8], 3, devices=[(0,), (1, 2), (3,)])
    trainer = arm_kills(PipelineTrainer(MLP, loss_fn("mlp"), ADAM, MLP_DATA, 3, plan=plan, workers=worker_group,
                                        checkpoint_dir=tmp_path, checkpoint_every=2, max_failures=1, pg_timeout_s=20), {(3, 2)})
    result = trainer.fit(5)
    assert result.restarts == 1 and trainer.step == 5
    reference = ReferenceTrainer.for_plan(plan, MLP, loss_fn("mlp"), ADAM, MLP_DATA)
    ref_losses = reference.train(5)
    assert allclose(trainer.state_dicts(), reference.state_dicts())
    assert list(result.losses.values()) == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)


@pytest.mark.ray
def test_a_fixed_plan_counts_each_death_once_and_the_budget_spans_fits(worker_group: Any, tmp_path: Path) -> None:
    """``max_failures=1``: the first death (fit 1) is survived by a restart, the second (fit 2) ends training: each
    death is counted once, by the loop, and the budget is the trainer's, not one fit's."""
    plan = straight_plan([0, 3, 6, 8], 3)
    trainer = arm_kills(PipelineTrainer(MLP, loss_fn("mlp"), SGD, MLP_DATA, 3, plan=plan, workers=worker_group,
                                        checkpoint_dir=tmp_path, checkpoint_every=1, max_failures=1, pg_timeout_s=20),
                        {(1, 1), (3, 2)})
    try:
        assert trainer.fit(2).restarts == 1 and trainer.failures == 1
        with pytest.raises(PipelineActorError, match="died during step 3"):
            trainer.fit(5)
        assert trainer.failures == 2 and trainer.step == 3
    finally:
        worker_group.respawn(sorted(worker_group.dead))
        worker_group.deaths_known()


# ----- row arithmetic (no Ray) -----
def test_unit_rows_follow_array_split() -> None:
    import numpy as np

    for rows, m in [(11, 4), (8, 3), (5, 5)]:
        parts = np.array_split(np.arange(rows), m)
        for mb in range(m):
            assert unit_range(rows, m, mb, 0) == (int(parts[mb][0]), int(parts[mb][-1]) + 1)
            halves = np.array_split(parts[mb], 2)
            assert unit_range(rows, m, mb, 1)[1] - unit_range(rows, m, mb, 1)[0] == len(halves[0])
    assert split_range(0, 7, 3, 2) == (5, 7)


@pytest.mark.parametrize("rows", range(1, 25))
def test_lowering_peers_cover_every_integer_overlap(rows: int) -> None:
    """With the ceil rule, any two replicas whose integer rows overlap are lowering peers."""
    for k1 in range(1, 6):
        for k2 in range(1, 6):
            plan = straight_plan([0, 1, 2], 1, devices=[tuple(range(k1)), tuple(range(k1, k1 + k2))])
            for i in range(k1):
                listed = {d - k1 for d, _ in peers(plan, 0, i, 1)}
                mine = replica_range((0, rows), k1, i)
                for j in range(k2):
                    lo, hi = intersect(mine, replica_range((0, rows), k2, j))
                    assert hi <= lo or j in listed, (rows, k1, i, k2, j)
            covered = sum(replica_range((0, rows), k1, i)[1] - replica_range((0, rows), k1, i)[0] for i in range(k1))
            assert covered == rows
