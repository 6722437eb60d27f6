"""Hugging Face causal LMs as pipeline blocks: built on the meta device, materialized per block
with per-path seeds, tied embeddings as summed copies, dropout seeded per (step, unit, block).

Unit tests run without Ray; one Ray test trains tied GPT-2 with dropout on 4 stage actors
against single-process training of the stock model, and one runs ``examples/hf_gpt2.py`` as a
user would and reads its printed contract lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
from transformers import BertConfig, GPT2Config, LlamaConfig, ViTConfig  # noqa: E402

from actors import seeding  # noqa: E402
from actors.materialize import materialize  # noqa: E402
from actors.reference import ReferenceTrainer  # noqa: E402
from actors.tied import counted_once, tie_table  # noqa: E402
from orchestrator.profiling import hf  # noqa: E402
from orchestrator.core.errors import UserError  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402
from orchestrator.profiling.profiler import profile_blocks  # noqa: E402
from orchestrator.train.trainer import PipelineTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB, SEQ = 64, 8
GPT2 = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0)
LLAMA = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                    vocab_size=VOCAB, max_position_embeddings=SEQ, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
DATA = partial(hf.token_batch, VOCAB, SEQ, 6)
ADAMW = partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.01)


def stock_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.named_parameters(remove_duplicate=False)}


def diff_to_stock(blocks: list[torch.nn.Module], weights: dict[int, dict[str, torch.Tensor]], stock: dict[str, torch.Tensor]) -> float:
    return max(float((weights[b][n].detach() - stock[p]).abs().max()) for (b, n), p in hf.param_paths(blocks).items())


@pytest.mark.parametrize("config", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_blocks_are_the_stock_model(config: Any) -> None:
    blocks = hf.causal_lm_blocks(config)
    assert all(p.is_meta for b in blocks for p in b.parameters())  # nothing materialized yet
    stock = hf.stock_model(config)
    assert counted_once(blocks) == stock.num_parameters()
    assert sum(p.numel() for b in blocks for p in b.parameters()) > stock.num_parameters()  # the tied copy
    assert len(tie_table(blocks)) == 1
    # materialized in reverse order, each on its own: weights do not depend on who builds what
    for b in reversed(range(len(blocks))):
        materialize(blocks[b], "cpu", seed=3, fallback_path=f"block{b}")
    materialize(hf.StockLM(stock), "cpu", seed=3)
    weights = {b: dict(m.named_parameters()) for b, m in enumerate(blocks)}
    assert diff_to_stock(blocks, weights, stock_params(stock)) == 0.0
    ids = hf.token_batch(VOCAB, SEQ, 3, step=0)[0]
    seeding.enter_unit(0, 1, (0, 0))
    try:
        x = ids
        for block in blocks:
            x = block(x)
        torch.testing.assert_close(x, hf.StockLM(stock)(ids), rtol=1e-5, atol=1e-6)
    finally:
        seeding.leave_unit()


def test_dropout_masks_follow_step_unit_and_block() -> None:
    blocks = [materialize(b, "cpu", 0, f"block{i}") for i, b in enumerate(hf.causal_lm_blocks(GPT2))]
    ids = hf.token_batch(VOCAB, SEQ, 3, step=0)[0]

    def run(step: int, unit: tuple[int, int]) -> torch.Tensor:
        seeding.enter_unit(0, step, unit)
        try:
            x = ids
            for block in blocks:
                x = block(x)
            return x
        finally:
            seeding.leave_unit()

    assert torch.equal(run(1, (0, 0)), run(1, (0, 0)))
    assert not torch.equal(run(1, (0, 0)), run(1, (1, 0)))  # dropout is on (GPT-2's default 0.1)
    assert not torch.equal(run(1, (0, 0)), run(2, (0, 0)))


@pytest.mark.parametrize("config", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_block_reference_equals_stock_training(config: Any) -> None:
    """Summed tied copies + per-block seeds == the stock model with one shared parameter."""
    plan = straight_plan([0, 4], 3)
    blocks = ReferenceTrainer.for_plan(plan, partial(hf.causal_lm_blocks, config), hf.lm_loss, ADAMW, DATA, seed=1)
    stock = ReferenceTrainer.for_plan(plan, partial(hf.stock_blocks, config), hf.lm_loss, ADAMW, DATA, seed=1)
    assert blocks.train(3) == pytest.approx(stock.train(3), rel=1e-5)
    assert diff_to_stock(blocks.blocks, blocks.state_dicts(), stock_params(stock.blocks[0].model)) < 1e-5


def test_profile_materializes_one_block_at_a_time() -> None:
    blocks = hf.causal_lm_blocks(GPT2)
    profile = profile_blocks(blocks, DATA(0)[0][:2], "gpt2", 2, warmup=0, repeats=1, device="cpu")
    assert len(profile.blocks) == 4
    assert profile.blocks[-1].activation_bytes == 2 * SEQ * VOCAB * 4
    assert all(p.is_meta for b in blocks for p in b.parameters())  # released again


def test_speed_probe_materializes_meta_blocks() -> None:
    from actors.probe import model_seconds

    assert model_seconds(partial(hf.causal_lm_blocks, GPT2), DATA, 2, 2, torch.device("cpu")) > 0


def test_not_a_causal_lm_is_one_line() -> None:
    with pytest.raises(UserError, match="ViTConfig is not the config of a causal language model"):
        hf.causal_lm_blocks(ViTConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32))
    with pytest.raises(UserError, match="BertLMHeadModel: only GPT-2 and Llama-style causal LMs are cut automatically"):
        hf.causal_lm_blocks(BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                                       is_decoder=True))
    with pytest.raises(UserError, match="needs a transformers config"):
        hf.causal_lm_blocks({"n_layer": 2})


@pytest.mark.ray
def test_tied_gpt2_with_dropout_on_four_stages(worker_group: Any) -> None:
    """Tied copies on stages 0 and 3, dropout on: pipelined == stock single-process training."""
    factory = partial(hf.causal_lm_blocks, GPT2)
    plan = straight_plan([0, 1, 2, 3, 4], 3)
    trainer = PipelineTrainer(factory, hf.lm_loss, ADAMW, DATA, 3, plan=plan, workers=worker_group, seed=1)
    result = trainer.fit(2)
    got = trainer.state_dicts()
    stock = ReferenceTrainer.for_plan(plan, partial(hf.stock_blocks, GPT2), hf.lm_loss, ADAMW, DATA, seed=1)
    assert result.losses == pytest.approx(stock.train(2), rel=1e-5)
    blocks = factory()
    assert diff_to_stock(blocks, got, stock_params(stock.blocks[0].model)) < 1e-5
    assert torch.equal(got[0]["wte.weight"], got[3]["lm_head.weight"])  # the copies stayed one weight


@pytest.mark.ray
def test_example_prints_its_contract(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "hf_gpt2.py"), "--steps", "2", "--verify"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    params = re.search(r"^params=(\d+) reference_params=(\d+)$", out.stdout, re.M)
    diff = re.search(r"^max_abs_diff=(\S+)$", out.stdout, re.M)
    assert params and diff, out.stdout
    assert params.group(1) == params.group(2)
    assert float(diff.group(1)) <= 1e-4
