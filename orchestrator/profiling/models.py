"""Built-in example models, expressed the way the pipeline runtime needs them: a list of blocks.

A pipeline stage runs a contiguous slice of blocks and passes exactly one tensor to the next
stage, so every block here takes ONE tensor and returns ONE tensor. The models are small enough
to profile and train on a CPU in seconds (demo, tests) and deterministic given
``torch.manual_seed`` (no dropout) so that pipelined training can be checked bit-for-bit
against plain sequential training.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from orchestrator.core.errors import UserError

BlockFactory = Callable[..., list[nn.Module]]


class Embedding(nn.Module):
    """Token + learned position embedding: int tokens (B, T) -> hidden states (B, T, D)."""

    def __init__(self, vocab: int, d_model: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with its own residual and post-LayerNorm."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise UserError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.norm(x + self.out(attn.transpose(1, 2).reshape(b, t, d)))


class FeedForward(nn.Module):
    """Position-wise MLP with its own residual and post-LayerNorm."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x + self.down(F.gelu(self.up(x))))


class LMHead(nn.Module):
    """Final LayerNorm and projection to vocabulary logits (B, T, vocab)."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.norm(x))


def tiny_transformer(
    vocab: int = 64, d_model: int = 32, n_layers: int = 4, n_heads: int = 4, seq_len: int = 16,
    sub_layer_blocks: bool = False,
) -> list[nn.Module]:
    """Decoder-only LM: embedding, ``n_layers`` layers, LM head.

    With ``sub_layer_blocks`` each layer is two blocks (attention, FFN) so planners that balance
    below layer granularity (AutoPipe-style) have something to work with.
    """
    blocks: list[nn.Module] = [Embedding(vocab, d_model, seq_len)]
    for _ in range(n_layers):
        attn, ffn = SelfAttention(d_model, n_heads), FeedForward(d_model, 4 * d_model)
        blocks += [attn, ffn] if sub_layer_blocks else [nn.Sequential(attn, ffn)]
    blocks.append(LMHead(d_model, vocab))
    return blocks


def mlp(widths: tuple[int, ...] = (32, 64, 64, 64, 32, 8)) -> list[nn.Module]:
    """One Linear(+Tanh, except the last) block per layer: the simplest chain to pipeline."""
    if len(widths) < 2:
        raise UserError("mlp needs at least two widths (input and output)")
    blocks: list[nn.Module] = []
    for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:])):
        last = i == len(widths) - 2
        blocks.append(nn.Linear(w_in, w_out) if last else nn.Sequential(nn.Linear(w_in, w_out), nn.Tanh()))
    return blocks


def _sub_layer_transformer(**kw: Any) -> list[nn.Module]:
    return tiny_transformer(**{**kw, "sub_layer_blocks": True})


EXAMPLE_MODELS: dict[str, BlockFactory] = {
    "tiny_transformer": tiny_transformer,
    "tiny_transformer_sublayer": _sub_layer_transformer,
    "mlp": mlp,
}


def _check_name(name: str) -> None:
    if name not in EXAMPLE_MODELS:
        raise UserError(f"unknown example model {name!r} (choose from {', '.join(sorted(EXAMPLE_MODELS))})")


def example_batch(name: str, batch_size: int, seed: int, **model_kwargs: Any) -> tuple[Tensor, Tensor]:
    """(inputs, targets) for an example model, reproducible from ``seed`` alone.

    Pass the same keyword arguments that built the model (vocab, seq_len, widths) so shapes match.
    The transformer's target is the next token of a random sequence; the MLP regresses a fixed
    random smooth function so training has signal.
    """
    _check_name(name)
    gen = torch.Generator().manual_seed(seed)
    if name.startswith("tiny_transformer"):
        vocab = int(model_kwargs.get("vocab", 64))
        seq_len = int(model_kwargs.get("seq_len", 16))
        tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    widths = tuple(model_kwargs.get("widths", (32, 64, 64, 64, 32, 8)))
    x = torch.randn(batch_size, widths[0], generator=gen)
    proj = torch.randn(widths[0], widths[-1], generator=torch.Generator().manual_seed(12345))
    return x, torch.sin(x @ proj / widths[0] ** 0.5)


def loss_fn(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The training loss matching :func:`example_batch` (mean over the micro-batch)."""
    _check_name(name)
    if name.startswith("tiny_transformer"):
        return lambda logits, targets: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return F.mse_loss


def resolve_spec(spec: str) -> tuple[Any, Any]:
    """(module, attribute) for ``"package.module:factory"`` or ``"path/to/file.py:factory"``."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"model factory {spec!r} must look like 'module:function' or 'file.py:function'")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise UserError(f"model factory {spec!r}: no such file {path}")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            if mod_spec is None or mod_spec.loader is None:
                raise UserError(f"model factory {spec!r}: cannot import {path}")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules.setdefault(path.stem, module)
            mod_spec.loader.exec_module(module)
        else:
            _cwd_on_path()
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"model factory {spec!r}: cannot import {module_name!r} ({exc})") from None
    if not hasattr(module, attr):
        raise UserError(f"model factory {spec!r}: module {module_name!r} has no attribute {attr!r}")
    return module, getattr(module, attr)


def _cwd_on_path() -> None:
    """Put the current directory on ``sys.path`` as ``python -c`` and ``python -m`` do: a console
    script's path starts at its own folder instead, so ``--factory mymodel:build`` beside the
    user would not import."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def load_factory(spec: str) -> BlockFactory:
    """Resolve a user's ``"module:factory"`` to a callable that returns a checked list of blocks.

    The check happens when the factory is called: a wrong return type would otherwise surface
    much later as an obscure failure inside a remote stage actor.
    """
    _, factory = resolve_spec(spec)
    if not callable(factory):
        raise UserError(f"model factory {spec!r} is not callable")

    def build(*args: Any, **kwargs: Any) -> list[nn.Module]:
        result = factory(*args, **kwargs)
        if isinstance(result, nn.Sequential):
            result = list(result)
        if (
            not isinstance(result, (list, tuple))
            or not result
            or not all(isinstance(b, nn.Module) for b in result)
        ):
            raise UserError(
                f"model factory {spec!r} must return a non-empty list of torch.nn.Module blocks, "
                f"got {type(result).__name__}"
            )
        return list(result)

    return build
