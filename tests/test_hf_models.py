"""Hugging Face causal LMs as pipeline blocks, every supported family against the STOCK model:
built on the meta device, materialized per block with per-path seeds, rotary embeddings and
attention masks (sliding windows included) recomputed per block, tied embeddings as summed
copies, dropout seeded per (step, unit, block), trained weights back under the stock names.

Families the cutter was never told about go through the generic cut, checked against the
stock model at build time: exact (OLMo2, Phi, GPT-NeoX, StarCoder2, OLMo3), or refused with one
line (Granite's and Cohere's scales outside the layers) until ``hf.register_family`` says what
the stock forward does there.

Unit tests run without Ray; Ray tests train Llama (rotary) and tied GPT-2 with dropout on 4
stage actors through ``ElasticJob`` against the stock model trained in one process, load the
returned state dict into a fresh stock model, and run ``examples/hf_causal_lm.py`` as a user would.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
from transformers import BertConfig, GPT2Config, GraniteConfig, LlamaConfig, ViTConfig  # noqa: E402

from actors import seeding  # noqa: E402
from actors.materialize import materialize  # noqa: E402
from actors.reference import ReferenceTrainer  # noqa: E402
from actors.tied import counted_once, tie_table  # noqa: E402
from orchestrator.profiling import export, hf  # noqa: E402
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
FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3"]
LONG = 12  # a sequence longer than the window below: sliding windows change the result


def tiny(family: str, window: int | None = 4) -> Any:
    return hf.tiny_config(family, layers=2, hidden=16, heads=2, vocab=VOCAB, seq=LONG, window=window)


def stock_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.named_parameters(remove_duplicate=False)}


def diff_to_stock(blocks: list[torch.nn.Module], weights: dict[int, dict[str, torch.Tensor]], stock: dict[str, torch.Tensor]) -> float:
    return max(float((weights[b][n].detach() - stock[p]).abs().max()) for (b, n), p in hf.param_paths(blocks).items())


def run_blocks(blocks: list[torch.nn.Module], ids: torch.Tensor) -> torch.Tensor:
    x = ids
    for block in blocks:
        x = block(x)
    return x


@pytest.mark.parametrize("family", FAMILIES)
def test_blocks_are_the_stock_model(family: str) -> None:
    """Same weights, same logits as the stock model (sequence longer than the sliding window),
    and the blocks' weights come back under exactly the stock model's state-dict keys."""
    config = tiny(family)
    blocks = hf.causal_lm_blocks(config)
    assert all(p.is_meta for b in blocks for p in b.parameters())  # nothing materialized yet
    stock = hf.stock_model(config)
    assert counted_once(blocks) == stock.num_parameters()
    # materialized in reverse order, each on its own: weights do not depend on who builds what
    for b in reversed(range(len(blocks))):
        materialize(blocks[b], "cpu", seed=3, fallback_path=f"block{b}")
    materialize(hf.StockLM(stock), "cpu", seed=3)
    weights = {b: dict(m.named_parameters()) for b, m in enumerate(blocks)}
    assert diff_to_stock(blocks, weights, stock_params(stock)) == 0.0
    ids = hf.token_batch(VOCAB, LONG, 3, step=0)[0]
    with seeding.unit((0, 1, (0, 0))):
        torch.testing.assert_close(run_blocks(blocks, ids), hf.StockLM(stock)(ids), rtol=1e-5, atol=1e-6)
    named = export.user_state_dict(blocks, {b: m.state_dict() for b, m in enumerate(blocks)})
    want = stock.state_dict()
    assert list(named) == list(want)
    assert all(torch.equal(named[k], want[k]) for k in want)


@pytest.mark.parametrize("family", ["mistral", "gemma2", "phi3"])
def test_sliding_window_is_honoured(family: str) -> None:
    """The window changes the stock model's logits, and the blocks follow it (not a causal mask)."""
    ids = hf.token_batch(VOCAB, LONG, 2, step=0)[0]

    def logits(window: int | None, blocks: bool) -> torch.Tensor:
        config = tiny(family, window if window is not None else 4 * LONG)
        if blocks:
            built = [materialize(b, "cpu", 1, f"block{i}") for i, b in enumerate(hf.causal_lm_blocks(config))]
            return run_blocks([b.eval() for b in built], ids)
        return materialize(hf.StockLM(hf.stock_model(config)), "cpu", 1).eval()(ids)

    with torch.no_grad():
        windowed = logits(4, blocks=False)
        assert float((windowed - logits(None, blocks=False)).abs().max()) > 1e-3
        torch.testing.assert_close(logits(4, blocks=True), windowed, rtol=1e-5, atol=1e-6)


def test_dropout_masks_follow_step_unit_and_block() -> None:
    blocks = [materialize(b, "cpu", 0, f"block{i}") for i, b in enumerate(hf.causal_lm_blocks(GPT2))]
    ids = hf.token_batch(VOCAB, SEQ, 3, step=0)[0]

    def run(step: int, unit: tuple[int, int]) -> torch.Tensor:
        with seeding.unit((0, step, unit)):
            return run_blocks(blocks, ids)

    assert torch.equal(run(1, (0, 0)), run(1, (0, 0)))
    assert not torch.equal(run(1, (0, 0)), run(1, (1, 0)))  # dropout is on (GPT-2's default 0.1)
    assert not torch.equal(run(1, (0, 0)), run(2, (0, 0)))


@pytest.mark.parametrize("family, dropout", [(f, None) for f in FAMILIES] + [("llama", 0.2), ("qwen2", 0.2), ("phi3", 0.2),
                                             ("olmo2", None), ("phi", 0.2)])
def test_block_reference_equals_stock_training(family: str, dropout: float | None) -> None:
    """Summed tied copies + per-block seeds + per-block masks == the stock model trained in one
    process; with dropout too, also Llama's and Qwen2's functional attention dropout (no nn.Dropout)."""
    config = hf.tiny_config(family, layers=2, hidden=16, heads=2, vocab=VOCAB, seq=LONG, window=4, dropout=dropout)
    data = partial(hf.token_batch, VOCAB, LONG, 6)
    plan = straight_plan([0, 4], 3)
    blocks = ReferenceTrainer.for_plan(plan, partial(hf.causal_lm_blocks, config), hf.lm_loss, ADAMW, data, seed=1)
    stock = ReferenceTrainer.for_plan(plan, partial(hf.stock_blocks, config), hf.lm_loss, ADAMW, data, seed=1)
    assert blocks.train(2) == pytest.approx(stock.train(2), rel=1e-5)
    assert diff_to_stock(blocks.blocks, blocks.state_dicts(), stock_params(stock.blocks[0].model)) < 1e-5


def test_tied_llama_has_one_tie() -> None:
    blocks = hf.causal_lm_blocks(LLAMA)
    assert len(tie_table(blocks)) == 1
    assert sum(p.numel() for b in blocks for p in b.parameters()) > counted_once(blocks)  # the tied copy


def test_profile_materializes_one_block_at_a_time() -> None:
    blocks = hf.causal_lm_blocks(GPT2)
    profile = profile_blocks(blocks, DATA(0)[0][:2], "gpt2", 2, warmup=0, repeats=1, device="cpu")
    assert len(profile.blocks) == 4
    assert profile.blocks[-1].activation_bytes == 2 * SEQ * VOCAB * 4
    assert all(p.is_meta for b in blocks for p in b.parameters())  # released again


def test_rotary_blocks_survive_a_meta_probe() -> None:
    """The shape probe runs meta blocks on a meta input; the real forward afterwards still works
    (the shared rotary module used to be moved to meta for good: 'Cannot copy out of meta tensor')."""
    from actors import user_code

    blocks = hf.causal_lm_blocks(LLAMA)
    user_code.probe(blocks, DATA(0)[0])
    built = [materialize(b, "cpu", 0, f"block{i}") for i, b in enumerate(blocks)]
    assert run_blocks(built, DATA(0)[0]).shape == (6, SEQ, VOCAB)


def test_speed_probe_materializes_meta_blocks() -> None:
    from actors.probe import model_seconds

    assert model_seconds(partial(hf.causal_lm_blocks, GPT2), DATA, 2, 2, torch.device("cpu")) > 0


def test_not_a_causal_lm_is_one_line() -> None:
    with pytest.raises(UserError, match="ViTConfig is not the config of a causal language model"):
        hf.causal_lm_blocks(ViTConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32))
    with pytest.raises(UserError, match=r"BertConfig \(model_type 'bert'\) is not a family raypipe cuts automatically.*split_at"):
        hf.causal_lm_blocks(BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                                       is_decoder=True))
    with pytest.raises(UserError, match=r"GraniteConfig \(model_type 'granite'\) is not a family"):
        hf.causal_lm_blocks(hf.tiny_config("granite", layers=1, hidden=16, heads=2, vocab=VOCAB))
    with pytest.raises(UserError, match="needs a transformers config"):
        hf.causal_lm_blocks({"n_layer": 2})
    with pytest.raises(UserError, match="'nosuchfamily' is not a model_type"):
        hf.tiny_config("nosuchfamily")


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2"])
def test_pretrained_folder_loads_block_by_block(family: str, tmp_path: Path) -> None:
    """A random stock model saved sharded with save_pretrained: the blocks built from the folder
    give its logits, and materializing one decoder block reads only that layer's tensors."""
    config = tiny(family)
    model = export.fresh_model(config)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()  # sharded
    one = hf.pretrained_blocks(str(tmp_path))
    materialize(one[1], "cpu", 0, "block1")
    read = getattr(one[1], "_raypipe_init").read
    layer = "transformer.h.0." if family == "gpt2" else "model.layers.0."
    assert read and all(k.startswith(layer) for k in read)
    assert read == {k for k in model.state_dict() if k.startswith(layer)}
    blocks = [materialize(b, "cpu", 7, f"block{i}").eval() for i, b in enumerate(hf.pretrained_blocks(str(tmp_path)))]
    ids = hf.token_batch(VOCAB, LONG, 2, step=0)[0]
    with torch.no_grad():
        torch.testing.assert_close(run_blocks(blocks, ids), model(input_ids=ids).logits, rtol=0, atol=0)
    other = tiny("gpt2" if family != "gpt2" else "llama")  # other names
    with pytest.raises(UserError, match="holds no tensor"):
        materialize(hf.causal_lm_blocks(other, pretrained=str(tmp_path))[1], "cpu", 0, "block1")
    with pytest.raises(UserError, match="holds no model.safetensors"):
        hf.causal_lm_blocks(config, pretrained=str(tmp_path / "nothing"))


@pytest.mark.ray
def test_tied_gpt2_with_dropout_on_four_stages(worker_group: Any) -> None:
    """Tied copies on stages 0 and 3, dropout on: pipelined == stock single-process training."""
    factory = partial(hf.causal_lm_blocks, GPT2)
    plan = straight_plan([0, 1, 2, 3, 4], 3)
    trainer = PipelineTrainer(factory, hf.lm_loss, ADAMW, DATA, 3, plan=plan, workers=worker_group, seed=1)
    result = trainer.fit(2)
    got = trainer.state_dicts()
    stock = ReferenceTrainer.for_plan(plan, partial(hf.stock_blocks, GPT2), hf.lm_loss, ADAMW, DATA, seed=1)
    assert list(result.losses.values()) == pytest.approx(stock.train(2), rel=1e-5)
    blocks = factory()
    assert diff_to_stock(blocks, got, stock_params(stock.blocks[0].model)) < 1e-5
    assert torch.equal(got[0]["wte.weight"], got[3]["lm_head.weight"])  # the copies stayed one weight


@pytest.mark.ray
def test_llama_round_trip_through_elastic_job(worker_group: Any, tmp_path: Path) -> None:
    """Rotary Llama on 4 stage actors through the public API; ``job.state_dict()`` loads into a
    fresh stock model (strict) whose logits equal the stock model trained in one process, and
    ``save_pretrained`` / ``from_pretrained`` keeps them."""
    from transformers import AutoModelForCausalLM

    from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig

    config = tiny("llama")
    data = partial(hf.token_batch, VOCAB, LONG, 6)
    plan = straight_plan([0, 1, 2, 3, 4], 3)
    train = TrainConfig(model_factory=partial(hf.causal_lm_blocks, config), loss_fn=hf.lm_loss, optimizer_factory=ADAMW,
                        data_fn=data, num_microbatches=3, seed=1)
    with ElasticJob(train, ScalingConfig(devices=4, plan=plan), RunConfig(storage=tmp_path / "ckpt", checkpoint_every=0),
                    AdaptConfig(enabled=False), SpotConfig(enabled=False), workers=worker_group) as job:
        job.fit(2)
        weights = job.state_dict()
        assert job.checkpoint_now("final") is not None
    stock = ReferenceTrainer.for_plan(plan, partial(hf.stock_blocks, config), hf.lm_loss, ADAMW, data, seed=1)
    stock.train(2)
    model = stock.blocks[0].model.eval()
    assert list(weights) == list(model.state_dict())
    fresh = export.fresh_model(config)
    fresh.load_state_dict(weights, strict=True)
    ids = data(99)[0]
    with torch.no_grad():
        want = model(input_ids=ids).logits
        torch.testing.assert_close(fresh(input_ids=ids).logits, want, rtol=0, atol=1e-5)
        export.save_pretrained(config, weights, tmp_path / "out")
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=1e-5)
    with pytest.raises(UserError, match="is not an empty folder"):
        export.save_pretrained(config, weights, tmp_path / "out")
    # the same from the stored checkpoint, on the command line
    from orchestrator.cli.commands import main

    config.save_pretrained(tmp_path / "config")
    assert main(["checkpoint", "export", str(tmp_path / "ckpt"), "--to", str(tmp_path / "cli"),
                 "--hf-config", str(tmp_path / "config")]) == 0
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "cli").eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=1e-5)
    assert main(["checkpoint", "export", str(tmp_path / "ckpt"), "--to", str(tmp_path / "raw")]) == 0  # no model: block names
    from safetensors.torch import load_file

    raw = load_file(str(tmp_path / "raw" / "model.safetensors"))
    assert torch.equal(raw["1.layer.mlp.up_proj.weight"], weights["model.layers.0.mlp.up_proj.weight"])
    assert main(["checkpoint", "export", str(tmp_path / "ckpt"), "--to", str(tmp_path / "raw")]) == 2


@pytest.mark.ray
@pytest.mark.parametrize("family", ["gemma2", "olmo2"])
def test_example_prints_its_contract(family: str, tmp_path: Path) -> None:
    """gemma2: tied head, soft-capping, alternating sliding-window layers; olmo2: the generic cut
    (a family the cutter was never told about), as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "hf_causal_lm.py"), "--family", family, "--steps", "2",
                          "--verify", "--storage", str(tmp_path / "ckpt")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    params = re.search(r"^params=(\d+) reference_params=(\d+)$", out.stdout, re.M)
    diff = re.search(r"^max_abs_diff=(\S+)$", out.stdout, re.M)
    exported = re.search(r"^export_max_abs_diff=(\S+)$", out.stdout, re.M)
    assert params and diff and exported, out.stdout
    assert params.group(1) == params.group(2)
    assert float(diff.group(1)) <= 1e-4 and float(exported.group(1)) <= 1e-5


def test_example_unknown_family_is_one_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "hf_causal_lm.py"), "--family", "granite", "--steps", "1"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "GraniteConfig" in out.stderr and "split" in out.stderr


# ---------------------------------------------------------------------------------------- any decoder-only model
GENERIC = ["olmo2", "phi", "gpt_neox", "starcoder2", "olmo3"]  # none registered: the generic cut alone


def granite(**fields: Any) -> Any:
    """A tiny Granite whose scales outside the layers are not 1 (real Granite checkpoints' are not)."""
    kw: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=32, bos_token_id=0,
                              eos_token_id=0, pad_token_id=0, embedding_multiplier=12.0, logits_scaling=8.0,
                              residual_multiplier=0.5, attention_multiplier=0.25)
    return GraniteConfig(**{**kw, **fields})


def scale_embedding(config: Any, embeds: torch.Tensor) -> torch.Tensor:
    return embeds * config.embedding_multiplier


def scale_logits(config: Any, logits: torch.Tensor) -> torch.Tensor:
    return logits / config.logits_scaling


def assert_stock(blocks: list[torch.nn.Module], config: Any) -> None:
    """Materialized like a stage would, the blocks give the stock model's logits (eval) and its names."""
    stock = hf.stock_model(config)
    built = [materialize(b, "cpu", 3, f"block{i}").eval() for i, b in enumerate(blocks)]
    model = materialize(hf.StockLM(stock), "cpu", 3).eval()
    ids = hf.token_batch(VOCAB, LONG, 3, step=0)[0]
    with torch.no_grad():
        torch.testing.assert_close(run_blocks(built, ids), model(ids), rtol=1e-5, atol=1e-6)
    named = export.user_state_dict(blocks, {b: m.state_dict() for b, m in enumerate(built)})
    assert list(named) == list(stock.state_dict())


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The family registry, restored after the test."""
    families = dict(hf.FAMILIES)
    monkeypatch.setattr(hf, "FAMILIES", families)
    return families


@pytest.mark.parametrize("family", GENERIC)
def test_generic_cut_is_the_stock_model(family: str) -> None:
    """Families in no list: the token embedding, the decoder layers, the final norm and the LM head
    of the stock model (Phi's embedding dropout registered after its layers, GPT-NeoX's partial
    rotary and ``embed_out`` head, StarCoder2's sliding window, OLMo3's rotary per layer kind)."""
    config = tiny(family)
    assert config.model_type not in hf.FAMILIES
    assert_stock(hf.causal_lm_blocks(config), config)


def test_the_check_picks_each_stock_models_masks() -> None:
    """A config's sliding_window does not say the model uses one (tiny_config gives every family one):
    the check keeps the mask choice that is exact, and the blocks use it."""
    assert hf.check(tiny("llama")) == "causal"  # LlamaConfig keeps the stray field; Llama ignores it
    assert hf.check(tiny("olmo2")) == "causal"
    assert hf.check(tiny("mistral")) == "sliding"
    assert hf.check(tiny("starcoder2")) == "sliding"
    assert hf.check(tiny("qwen2")) == "layer_types"


def test_scale_outside_the_layers_is_refused_in_one_line(registry: dict[str, Any]) -> None:
    with pytest.raises(UserError) as err:
        hf.causal_lm_blocks(granite())
    line = str(err.value)
    assert "\n" not in line
    assert re.match(r"GraniteConfig \(model_type 'granite'\) is not a family raypipe cuts exactly: the cut blocks' logits "
                    r"differ from the stock model's by [0-9.e+-]+ .*hf\.register_family\('granite'.*split_at$", line), line
    with pytest.raises(UserError, match=r"CohereConfig .* logits differ from the stock model's"):  # logit_scale
        hf.causal_lm_blocks(tiny("cohere"))
    hf.register_family("granite", embedding=scale_embedding)  # half of what its forward does: still refused
    with pytest.raises(UserError, match="GraniteConfig .* differ"):
        hf.causal_lm_blocks(granite())
    # its neutral (1.0) multipliers hide no scale: the probe moves them
    with pytest.raises(UserError, match=r"1\.0-valued fields at 0\.5: .*logits_scaling"):
        hf.causal_lm_blocks(granite(embedding_multiplier=1.0, logits_scaling=1.0))


def test_register_family_makes_granite_exact(registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    family = hf.register_family("granite", embedding=scale_embedding, logits=scale_logits)
    config = granite()
    assert_stock(hf.causal_lm_blocks(config), config)
    assert_stock(hf.causal_lm_blocks(tiny("granite")), tiny("granite"))  # neutral scales too
    # a stage actor's process has no registry: the family travels with the factory (it pickles)
    monkeypatch.setattr(hf, "FAMILIES", {})
    factory = pickle.loads(pickle.dumps(partial(hf.causal_lm_blocks, config, family=family)))
    assert_stock(factory(), config)
    with pytest.raises(UserError, match="GraniteConfig"):
        hf.causal_lm_blocks(config)


def test_the_check_is_small_and_once_per_config() -> None:
    """A real-size config is checked on a small copy (2 layers, narrow, 256 tokens), once per process."""
    config = LlamaConfig()  # 7 B parameters, on the meta device
    small, _ = hf.probe_configs(config)[0]
    assert (small.num_hidden_layers, small.hidden_size, small.vocab_size) == (2, 32, 256)
    assert len(hf.causal_lm_blocks(config)) == 34
    assert (config.to_json_string(), hf.GENERIC) in hf._CHECKED
    gemma3 = hf.probe_configs(hf.tiny_config("gemma3_text", layers=12))[0][0]
    assert gemma3.layer_types == ["sliding_attention"] * 5 + ["full_attention"]  # every layer kind kept
