"""Activation recomputation per stage: its cost in the simulator (one more forward in backward,
only the stage input kept per in-flight micro-batch), planners turning it on to fit memory, and
the runtime staying exact with it (dropout masks recomputed identically)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch

from actors.reference import ReferenceTrainer, max_difference
from orchestrator.core.cluster import flat
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, Stage, straight_plan
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.core.profile import Block, Profile
from orchestrator.costmodel.simulator import simulate
from orchestrator.train.trainer import PipelineTrainer

MB = 1e6
PROFILE = Profile("chain", tuple(Block(f"b{i}", 1.0, 2.0, 1 * MB, 1 * MB, 10 * MB) for i in range(4)), 1, 1 * MB)


def with_recompute(plan: Plan, *stages: int) -> Plan:
    return Plan(tuple(Stage(s.first, s.last, s.devices, j in stages) for j, s in enumerate(plan.stages)), plan.num_microbatches,
                plan.schedule)


def test_recompute_costs_a_forward_and_saves_the_stash() -> None:
    cluster = flat(2, 10.0, memory_bytes=1e12)
    plain = straight_plan([0, 2, 4], 4)
    both = with_recompute(plain, 0, 1)
    a, b = simulate(plain, PROFILE, cluster), simulate(both, PROFILE, cluster)
    # stage 0 of 1F1B keeps 2 micro-batches in flight: 2 x 20 MB of saved activations, or 2 x its 1 MB input
    assert a.peak_stash_bytes[0] == pytest.approx(40 * MB)
    assert b.peak_stash_bytes[0] == pytest.approx(2 * MB)
    assert b.busy_s[0] == pytest.approx(a.busy_s[0] + 4 * 2.0)  # 4 micro-batches x one more 2-block forward
    assert b.iteration_s > a.iteration_s


def test_planner_recomputes_to_fit_memory() -> None:
    options = PlannerOptions(num_microbatches=4)
    roomy = run_planner("even", PROFILE, flat(2, 10.0, memory_bytes=1e12), options).plan
    assert not any(s.recompute for s in roomy.stages)
    tight = run_planner("even", PROFILE, flat(2, 10.0, memory_bytes=20 * MB), options)
    assert [s.recompute for s in tight.plan.stages] == [True, True]
    assert all(m <= 20 * MB for m in tight.sim.peak_memory_bytes.values())
    with pytest.raises(UserError, match="plan does not fit in device memory"):
        run_planner("even", PROFILE, flat(2, 10.0, memory_bytes=5 * MB), options)


def test_plan_json_keeps_recompute() -> None:
    plan = with_recompute(straight_plan([0, 2, 4], 4), 1)
    assert Plan.from_dict(plan.to_dict()) == plan
    assert "recompute" not in plan.to_dict()["stages"][0]
    assert "+recompute" in plan.describe()
    bad = plan.to_dict()
    bad["stages"][1]["recompute"] = "yes"
    with pytest.raises(UserError, match='stage 1: "recompute" must be true or false'):
        Plan.from_dict(bad)


@pytest.mark.ray
def test_recomputed_stages_train_exactly_with_dropout(worker_group: Any) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config

    from orchestrator.profiling import hf

    config = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=8, bos_token_id=0, eos_token_id=0)
    factory = partial(hf.causal_lm_blocks, config)
    data = partial(hf.token_batch, 64, 8, 6)
    adam = partial(torch.optim.AdamW, lr=1e-2)
    plan = with_recompute(straight_plan([0, 2, 3, 4], 3), 0, 2)  # the first and last stage recompute
    trainer = PipelineTrainer(factory, hf.lm_loss, adam, data, 3, plan=plan, workers=worker_group, seed=4)
    result = trainer.fit(2)
    reference = ReferenceTrainer.for_plan(plan, factory, hf.lm_loss, adam, data, seed=4)
    assert list(result.losses.values()) == pytest.approx(reference.train(2), rel=1e-5)
    got, want = trainer.state_dicts(), reference.state_dicts()
    assert max_difference(got, want) < 1e-5  # float order only: a wrong dropout mask moves weights far more


def test_a_block_that_fits_no_device_is_named() -> None:
    big = Profile("big", PROFILE.blocks[:2] + (Block("huge", 1.0, 2.0, MB, 1e9, MB),), 1, MB)
    with pytest.raises(UserError, match=r"block 2 \('huge'\) alone needs 3\.73 GiB .* largest device has 0\.93 GiB"):
        run_planner("even", big, flat(2, 10.0, memory_bytes=1e9), PlannerOptions(num_microbatches=4))


def test_zb_h1_refuses_recomputation_in_one_line() -> None:
    """A split backward needs the saved graph: a plan asking for both is refused, and the memory
    fallback of the planners does not turn recomputation on under ZB-H1."""
    from orchestrator.core.errors import UserError
    from orchestrator.core.plan import Plan, ScheduleKind, Stage

    with pytest.raises(UserError, match="zb-h1 cannot recompute"):
        Plan((Stage(0, 2, (0,), recompute=True), Stage(2, 4, (1,))), 4, ScheduleKind.ZB_H1)
    Plan((Stage(0, 2, (0,), recompute=True), Stage(2, 4, (1,))), 4, ScheduleKind.ONE_F_ONE_B)  # fine under 1F1B
