"""The real profiler on the built-in models (CPU, small), plus the model registry and factories."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch import nn

from orchestrator.core.errors import UserError
from orchestrator.profiling.models import EXAMPLE_MODELS, example_batch, load_factory, loss_fn, mlp, tiny_transformer
from orchestrator.core.profile_loader import load_profile
from orchestrator.profiling.profiler import profile_blocks, profile_example, profile_factory

FAST: dict[str, Any] = {"warmup": 1, "repeats": 3, "device": "cpu"}


def chain(blocks: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for block in blocks:
        x = block(x)
        outs.append(x)
    return outs


@pytest.mark.parametrize("name", ["tiny_transformer", "mlp"])
def test_profile_matches_model_and_round_trips(name: str, tmp_path: Path) -> None:
    prof = profile_example(name, microbatch_size=4, **FAST)
    torch.manual_seed(0)
    blocks = EXAMPLE_MODELS[name]()
    inputs, targets = example_batch(name, 4, seed=0)
    outs = chain(blocks, inputs)
    assert prof.num_blocks == len(blocks) and prof.microbatch_size == 4
    assert prof.input_bytes == inputs.numel() * inputs.element_size()
    for block, out, measured in zip(blocks, outs, prof.blocks):
        assert measured.forward_s > 0 and measured.backward_s > 0
        assert measured.param_bytes == sum(p.numel() * 4 for p in block.parameters())
        assert measured.activation_bytes == out.numel() * out.element_size()
        assert measured.stash_bytes > 0
    assert torch.isfinite(loss_fn(name)(outs[-1], targets))
    prof.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == prof


def test_stash_counts_saved_activations_not_parameters() -> None:
    block = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    prof = profile_blocks([block], torch.randn(8, 16), "one", 8, **FAST)
    # Linear saves its input (8x16 floats); ReLU saves its output (8x16). The weight is excluded.
    assert prof.blocks[0].stash_bytes == 2 * 8 * 16 * 4


def test_sub_layer_variant_has_two_blocks_per_layer_and_same_function() -> None:
    torch.manual_seed(3)
    whole = tiny_transformer(n_layers=3)
    torch.manual_seed(3)
    split = tiny_transformer(n_layers=3, sub_layer_blocks=True)
    assert len(whole) == 3 + 2 and len(split) == 2 * 3 + 2
    tokens, _ = example_batch("tiny_transformer", 2, seed=1)
    assert torch.equal(chain(whole, tokens)[-1], chain(split, tokens)[-1])
    prof = profile_example("tiny_transformer_sublayer", 2, model_kwargs={"n_layers": 3}, **FAST)
    assert prof.num_blocks == 8


def test_models_are_deterministic_given_seed() -> None:
    def params() -> list[torch.Tensor]:
        torch.manual_seed(7)
        return [p.detach().clone() for b in mlp() for p in b.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(params(), params()))
    assert all(torch.equal(a, b) for a, b in zip(example_batch("mlp", 3, 5), example_batch("mlp", 3, 5)))
    with pytest.raises(UserError, match="unknown example model"):
        example_batch("nope", 1, 0)


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def good():
                return [nn.Linear(4, 8), nn.Linear(8, 2)]

            def seq():
                return nn.Sequential(nn.Linear(4, 4), nn.ReLU())

            def bad():
                return nn.Linear(4, 4)

            def mixed():
                return [nn.Linear(4, 4), "oops"]

            NOT_CALLABLE = 3

            def example_input(batch_size):
                return torch.ones(batch_size, 4)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_models"
    sys.modules.pop("my_models", None)


def test_load_factory_resolves_and_checks(user_module: str, tmp_path: Path) -> None:
    assert len(load_factory(f"{user_module}:good")()) == 2
    assert len(load_factory(f"{user_module}:seq")()) == 2
    assert len(load_factory(f"{tmp_path / 'my_models.py'}:good")()) == 2
    for attr in ("bad", "mixed"):
        with pytest.raises(UserError, match="must return a non-empty list of torch.nn.Module"):
            load_factory(f"{user_module}:{attr}")()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "must look like 'module:function'"),
        ("surely_missing_module_xyz:f", "cannot import"),
        ("my_models:absent", "has no attribute 'absent'"),
        ("my_models:NOT_CALLABLE", "is not callable"),
        ("/nonexistent/m.py:f", "no such file"),
    ],
)
def test_load_factory_errors_are_one_line(user_module: str, spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as info:
        load_factory(spec)
    assert "\n" not in str(info.value)


def test_profile_factory_input_sources(user_module: str) -> None:
    by_shape = profile_factory(f"{user_module}:good", 3, input_shape=[4], **FAST)
    assert by_shape.input_bytes == 3 * 4 * 4 and by_shape.name == "good"
    by_convention = profile_factory(f"{user_module}:good", 5, **FAST)
    assert by_convention.input_bytes == 5 * 4 * 4
    assert by_convention.blocks[-1].activation_bytes == 5 * 2 * 4
    with pytest.raises(UserError, match="dtype"):
        profile_factory(f"{user_module}:good", 3, input_shape=[4], dtype="int8", **FAST)


def test_profile_factory_without_any_input_source_says_how(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text("from torch import nn\n\ndef build():\n    return [nn.Linear(2, 2)]\n")
    with pytest.raises(UserError, match="pass --input-shape"):
        profile_factory(f"{path}:build", 2, **FAST)


def test_backward_split_is_measured() -> None:
    """weight_s is the weight half's share of the backward: all of it for token ids (nothing
    else to differentiate), none for a block without parameters, in between for a Linear."""
    from orchestrator.profiling.profiler import profile_blocks

    torch.manual_seed(0)
    emb, lin, act = torch.nn.Embedding(50, 64), torch.nn.Linear(64, 64), torch.nn.ReLU()
    prof = profile_blocks([emb, lin, act], torch.randint(0, 50, (16, 8)), "split", 16, warmup=1, repeats=3, device="cpu")
    e, l, a = prof.blocks
    assert e.weight_s == e.backward_s
    assert 0.0 < l.weight_s < l.backward_s
    assert a.weight_s == 0.0


def test_first_block_is_timed_without_an_input_gradient() -> None:
    """The first block's input is the data batch, for which the runtime computes no gradient: its backward is all
    weight gradient, as it runs; a later block with the same shapes also computes its input's gradient."""
    from orchestrator.profiling.profiler import profile_blocks

    torch.manual_seed(0)
    first, second = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
    prof = profile_blocks([first, second], torch.randn(32, 64), "two", 32, warmup=1, repeats=3, device="cpu")
    a, b = prof.blocks
    assert a.weight_s == a.backward_s
    assert 0.0 < b.weight_s < b.backward_s


TOKENS = "from torch import nn\n\ndef blocks():\n    return [nn.Embedding(50, 8), nn.Linear(8, 8), nn.Linear(8, 50)]\n"
LLAMA_KWARGS = ('{"num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, '
                '"num_key_value_heads": 1, "vocab_size": 64}')


def test_cli_profiles_a_token_model_beside_the_user(tmp_path: Path) -> None:
    """``orchestrator profile --factory mymodel:blocks`` run where mymodel.py is (the console
    script's path starts at its own folder, not the current one), with token-id inputs."""
    import os
    import subprocess

    script = Path(sys.executable).parent / "orchestrator"
    if not script.is_file():
        pytest.skip("no orchestrator console script in this environment")
    (tmp_path / "mymodel.py").write_text(TOKENS)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [str(script), "profile", "--factory", "mymodel:blocks", "--input-shape", "12", "--input-dtype", "long",
            "--vocab", "50", "--microbatch-size", "2", "--repeats", "1", "--out", "p.json"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    profile = load_profile(tmp_path / "p.json")
    assert profile.num_blocks == 3 and profile.input_bytes == 2 * 12 * 8  # int64 token ids
    assert profile.blocks[-1].activation_bytes == 2 * 12 * 50 * 4


def test_cli_profiles_an_hf_config_by_name(tmp_path: Path) -> None:
    from orchestrator.cli.commands import main

    out = tmp_path / "llama.json"
    assert main(["profile", "--hf-config", "llama", "--hf-kwargs", LLAMA_KWARGS, "--input-shape", "8",
                 "--microbatch-size", "2", "--repeats", "1", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile.num_blocks == 4 and profile.input_bytes == 2 * 8 * 8
    assert profile.blocks[-1].activation_bytes == 2 * 8 * 64 * 4


@pytest.mark.parametrize("argv, message", [
    (["--factory", "m:b", "--input-shape", "4", "--input-dtype", "long"], "--input-dtype long needs --vocab N"),
    (["--factory", "m:b", "--input-shape", "4", "--vocab", "9"], "--vocab goes with an integer --input-dtype"),
    (["--hf-config", "llama", "--hf-kwargs", "{nope"], "--hf-kwargs is not JSON"),
    (["--hf-config", "llama", "--hf-kwargs", "[1]"], "--hf-kwargs must be a JSON object"),
    (["--hf-config", "nosuch"], "--hf-config 'nosuch' is neither a folder holding config.json nor a model_type"),
    (["--hf-config", "granite"], r"GraniteConfig \(model_type 'granite'\) is not a family raypipe cuts"),
    (["--hf-kwargs", "{}"], "--hf-kwargs goes with --hf-config"),
    (["--hf-config", "{tmp}"], "the folder holds no config.json"),
])
def test_cli_profile_bad_model_input_is_one_line(argv: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from orchestrator.cli.commands import main

    (tmp_path / "m.py").write_text(TOKENS.replace("blocks", "b"))
    sys.path.insert(0, str(tmp_path))
    try:
        argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
        assert main(["profile", *argv, "--repeats", "1", "--out", str(tmp_path / "p.json")]) == 2
    finally:
        sys.path.remove(str(tmp_path))
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "p.json").exists()
