"""Training features, each exact against plain single-process training of the stock model:
gradient clipping by the global norm (across stages and replicas, a tied weight counted once),
LR schedulers, weight-decay parameter groups, bf16 autocast.

The single-process side is written here with torch's own tools (``clip_grad_norm_``,
``LambdaLR``, ``torch.autocast``, one optimizer over the whole stock model), not with ours.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
from transformers import GPT2Config  # noqa: E402

from actors import seeding  # noqa: E402
from actors.job_spec import cpu_threads  # noqa: E402
from actors.materialize import materialize  # noqa: E402
from actors.reference import ReferenceTrainer  # noqa: E402
from actors.training import LossScale, TrainingOptions, autocast_blocks, decay_groups  # noqa: E402
from actors.transport import unit_range  # noqa: E402
from orchestrator.profiling import hf  # noqa: E402
from orchestrator.core.errors import UserError  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402
from orchestrator.train.trainer import PipelineTrainer  # noqa: E402

VOCAB, SEQ, ROWS, MB = 64, 8, 6, 3


def gpt2(dropout: float = 0.1) -> GPT2Config:
    return GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0,
                      resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)


DATA = partial(hf.token_batch, VOCAB, SEQ, ROWS)
ADAMW = partial(torch.optim.AdamW, lr=1e-2)


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / 3)


def scheduler(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, warmup)


def single_process(config: GPT2Config, steps: int, optimizer: Any = ADAMW, max_norm: float | None = None,
                   schedule: bool = False, autocast: torch.dtype | None = None, seed: int = 1,
                   loss_scale: LossScale | None = None, scales: list[float] | None = None) -> dict[str, torch.Tensor]:
    """The stock model, its own forward, one optimizer, torch's clipping/scheduler/autocast/GradScaler."""
    model = materialize(hf.StockLM(hf.stock_model(config)), "cpu", seed).model
    opt = optimizer(model.parameters())
    sched = scheduler(opt) if schedule else None
    scaler = None if loss_scale is None else torch.amp.GradScaler(
        "cpu", init_scale=loss_scale.init_scale, growth_factor=loss_scale.growth_factor,
        backoff_factor=loss_scale.backoff_factor, growth_interval=loss_scale.growth_interval)
    for step in range(steps):
        inputs, targets = DATA(step)
        for mb in range(MB):
            lo, hi = unit_range(ROWS, MB, mb, 0)
            seeding.enter_unit(seed, step, (mb, 0))
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                logits = model(input_ids=inputs[lo:hi], use_cache=False).logits
            seeding.leave_unit()
            loss = hf.lm_loss(logits.float(), targets[lo:hi]) * ((hi - lo) / ROWS)
            (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:
            scaler.unscale_(opt)
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
            if scales is not None:
                scales.append(scaler.get_scale())
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
    return {k: v.detach() for k, v in model.named_parameters(remove_duplicate=False)}


def diff(blocks: list[torch.nn.Module], got: dict[int, dict[str, torch.Tensor]], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[b][n] - want[p]).abs().max()) for (b, n), p in hf.param_paths(blocks).items())


FEATURES = {
    "clip": (dict(max_norm=0.05), dict(training=TrainingOptions(max_grad_norm=0.05))),
    "lr-schedule": (dict(schedule=True), dict(training=TrainingOptions(lr_scheduler=scheduler))),
    "decay-groups": (dict(optimizer=decay_groups(ADAMW, 0.5)), dict(optimizer=decay_groups(ADAMW, 0.5))),
    "bf16-autocast": (dict(autocast=torch.bfloat16), dict(autocast=torch.bfloat16)),
}


@pytest.mark.parametrize("feature", FEATURES)
def test_block_training_equals_torch_single_process(feature: str) -> None:
    ours_kw, theirs_kw = FEATURES[feature][1], FEATURES[feature][0]
    factory: Any = partial(hf.causal_lm_blocks, gpt2())
    if "autocast" in ours_kw:
        factory = autocast_blocks(factory, ours_kw["autocast"])
    ref = ReferenceTrainer.for_plan(straight_plan([0, 4], MB), factory, hf.lm_loss, ours_kw.get("optimizer", ADAMW), DATA,
                                    seed=1, training=ours_kw.get("training"))
    ref.train(3)
    want = single_process(gpt2(), 3, **theirs_kw)
    tol = 2e-3 if feature == "bf16-autocast" else 1e-5  # bf16: the same ops, summed in another order
    blocks = list(factory())  # parameter names as the trained blocks have them
    assert diff(blocks, ref.state_dicts(), want) < tol
    plain = single_process(gpt2(), 3)
    assert diff(blocks, ref.state_dicts(), plain) > 10 * tol  # the feature changed training


def test_bad_clip_norm_is_one_line() -> None:
    with pytest.raises(UserError, match="max_grad_norm must be a positive number, got -1"):
        TrainingOptions(max_grad_norm=-1)


@pytest.mark.ray
def test_clip_schedule_decay_across_stages_and_replicas(worker_group: Any, ray_session: Any) -> None:
    """Global norm over 3 stages, the middle one replicated (counted once), the tied embedding
    on the first and last stage (counted once); LR schedule and decay groups on every stage."""
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    config = gpt2(dropout=0.0)  # replicas split a micro-batch's rows: masks would be drawn per share
    factory = partial(hf.causal_lm_blocks, config)
    plan = straight_plan([0, 1, 3, 4], MB, devices=[(0,), (1, 2), (3,)])
    options = TrainingOptions(max_grad_norm=0.05, lr_scheduler=scheduler)
    trainer = PipelineTrainer(factory, hf.lm_loss, decay_groups(ADAMW, 0.5), DATA, MB, plan=plan, workers=worker_group,
                              seed=1, training=options)
    trainer.fit(3)
    want = single_process(config, 3, optimizer=decay_groups(ADAMW, 0.5), max_norm=0.05, schedule=True)
    assert diff(factory(), trainer.state_dicts(), want) < 1e-5


@pytest.mark.ray
def test_bf16_autocast_with_dropout_on_four_stages(worker_group: Any) -> None:
    factory = autocast_blocks(partial(hf.causal_lm_blocks, gpt2()), torch.bfloat16)
    trainer = PipelineTrainer(factory, hf.lm_loss, ADAMW, DATA, MB, plan=straight_plan([0, 1, 2, 3, 4], MB),
                              workers=worker_group, seed=1)
    trainer.fit(3)
    got = trainer.state_dicts()
    ref = ReferenceTrainer.for_plan(straight_plan([0, 4], MB), factory, hf.lm_loss, ADAMW, DATA, seed=1)
    ref.train(3)
    assert max(float((got[b][k] - v).abs().max()) for b, sd in ref.state_dicts().items() for k, v in sd.items()) < 1e-6
    assert diff(list(factory()), got, single_process(gpt2(), 3, autocast=torch.bfloat16)) < 2e-3
    # the hooks keep the user's names: the weights load strictly into the stock model
    from orchestrator.profiling.export import user_state_dict
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_config(gpt2())
    stock.load_state_dict(user_state_dict(factory(), got), strict=True)


@pytest.mark.ray
def test_bf16_boundaries_halve_what_travels_and_equal_the_reference(worker_group: Any) -> None:
    """``boundary=torch.bfloat16``: activations and gradients cross the stages in bf16 (2 bytes per value: a
    micro-batch of 2 rows of 8 x 16 is 512 bytes, float32's 1024), and training is still exactly the reference's run
    with the workers' torch threads (bf16 reductions on the CPU are summed per thread: with 2 threads instead of 1 the
    reference itself moves 2e-2 in 2 steps)."""
    factory = autocast_blocks(partial(hf.causal_lm_blocks, gpt2()), torch.bfloat16, boundary=torch.bfloat16)
    plan = straight_plan([0, 1, 2, 3, 4], MB)
    trainer = PipelineTrainer(factory, hf.lm_loss, ADAMW, DATA, MB, plan=plan, workers=worker_group, seed=1)
    result = trainer.fit(2)
    assert {t.bytes for m in result.metrics for t in m.transfers} == {2 * SEQ * 16 * 2}
    ref = ReferenceTrainer.for_plan(straight_plan([0, 4], MB), factory, hf.lm_loss, ADAMW, DATA, seed=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(cpu_threads(0, len(plan.devices)))  # the stage workers' rule
    try:
        ref.train(2)
    finally:
        torch.set_num_threads(threads)
    got = trainer.state_dicts()
    assert max(float((got[b][k] - v).abs().max()) for b, sd in ref.state_dicts().items() for k, v in sd.items()) < 1e-6


@pytest.mark.ray
def test_fp16_loss_scaling_skips_on_every_stage_together(worker_group: Any) -> None:
    """An overflow on some stage skips the step on all of them and backs the scale off, exactly
    as GradScaler does in one process; clipping applies to the unscaled gradients. A replicated
    stage joins the one reduction with its first replica's norms only (issue #29: its zero was a
    host tensor that NCCL refuses; tests/test_gpu_collectives_cpu.py checks the devices)."""
    scale = LossScale(init_scale=2.0 ** 20, growth_interval=2)  # here: 2 overflows, then 2 steps
    config = gpt2(dropout=0.0)  # replicas split a micro-batch's rows: masks would be drawn per share
    factory = autocast_blocks(partial(hf.causal_lm_blocks, config), torch.float16)
    options = TrainingOptions(loss_scale=scale, max_grad_norm=0.05)
    plan = straight_plan([0, 1, 2, 3, 4], MB, devices=[(0,), (1, 4), (2,), (3,)])
    trainer = PipelineTrainer(factory, hf.lm_loss, ADAMW, DATA, MB, plan=plan, workers=worker_group, seed=1, training=options)
    trainer.fit(4)
    scales: list[float] = []
    want = single_process(config, 4, autocast=torch.float16, loss_scale=scale, max_norm=0.05, scales=scales)
    assert scales[0] < scale.init_scale and len(set(scales)) > 1, scales  # it skipped, then stepped
    assert diff(list(factory()), trainer.state_dicts(), want) < 2e-3
