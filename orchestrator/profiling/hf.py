"""Hugging Face causal language models as pipeline blocks: embedding, one block per decoder
layer, head — built from a config on the meta device, nothing downloaded.

:func:`causal_lm_blocks` is a model factory (``partial(causal_lm_blocks, config)``): every stage
worker calls it, gets the whole model's structure for free (:func:`actors.materialize.empty_init`)
and materializes only its own blocks with the model's own initializer (``_init_weights``), each
submodule seeded by its path. Tied input/output embeddings become one copy per block
(:mod:`actors.tied`); dropout draws its masks from a seed per (step, micro-batch, block)
(:mod:`actors.seeding`). :func:`stock_model` builds the unmodified ``*ForCausalLM`` the same way
(same weights, same dropout seeds), which is what single-process training of "the same model"
means in ``examples/hf_gpt2.py --verify``.

Each block takes and returns one batch-first tensor: token ids, then hidden states, then
logits. Position ids and the causal mask are recomputed inside each block from the sequence
length (as the stock model does for an unpadded batch), so no extra tensor crosses a stage
boundary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from actors import seeding, tied
from actors.materialize import empty_init, name_paths, set_init
from orchestrator.core.errors import UserError


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:  # pragma: no cover - a dependency of the package
        raise UserError("Hugging Face models need the 'transformers' package (pip install transformers)") from None
    return transformers


class GPT2Embedding(nn.Module):
    """Token + position embedding and embedding dropout: ids (B, T) -> hidden (B, T, D)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[-1], device=ids.device).unsqueeze(0)
        return self.drop(self.wte(ids) + self.wpe(positions))


class TokenEmbedding(nn.Module):
    """Llama-style token embedding: ids (B, T) -> hidden (B, T, D)."""

    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed

    def forward(self, ids: Tensor) -> Tensor:
        return self.embed_tokens(ids)


class DecoderLayer(nn.Module):
    """One decoder layer: hidden -> hidden, causal. Rotary models recompute their (cos, sin)
    from the positions here (the rotary module has buffers only, shared by the layers)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.layer = layer
        self._rotary = [rotary]  # a list: not a submodule, so not in this block's state_dict

    def forward(self, hidden: Tensor) -> Tensor:
        rotary = self._rotary[0]
        if rotary is None:
            return self.layer(hidden)
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        rotary.to(hidden.device)
        cos_sin = rotary(hidden, positions)
        return self.layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)


class HFHead(nn.Module):
    """Final norm and the projection to the vocabulary: hidden -> logits (B, T, vocab)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, hidden: Tensor) -> Tensor:
        return self.lm_head(self.norm(hidden))


def stock_model(config: Any, dtype: torch.dtype | None = None) -> nn.Module:
    """The unmodified ``AutoModelForCausalLM`` of ``config`` on the meta device, with paths
    recorded for initialization and dropout seeded per (step, unit, block) — the blocks of
    :func:`causal_lm_blocks` draw the same masks."""
    transformers = _transformers()
    if not isinstance(config, transformers.PretrainedConfig):
        raise UserError(f"a Hugging Face model needs a transformers config, got {type(config).__name__}")
    with empty_init():
        try:
            model = transformers.AutoModelForCausalLM.from_config(config)
        except ValueError:
            raise UserError(f"{type(config).__name__} is not the config of a causal language model "
                            "(AutoModelForCausalLM has no class for it)") from None
    if dtype is not None:  # e.g. bf16 weights: converted on the meta device, so free
        model.to(dtype)
    name_paths(model)
    set_init(model, getattr(model, "_init_weights"))
    embed, _, layers, _, _ = _parts(model)
    for module in ([embed[-1]] if len(embed) == 3 else []) + list(layers):
        if seeding.has_randomness(module):
            seeding.seed_forward(module, getattr(module, "_raypipe_path"))
    return model


def _parts(model: nn.Module) -> tuple[list[Any], Any, Any, Any, Any]:
    """(embedding modules, rotary, decoder layers, final norm, lm_head) of a supported model."""
    base: Any = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = getattr(model, "lm_head", None)
    if head is None:
        base = None  # no separate output projection: not a layout we know how to cut
    if base is not None and hasattr(base, "wte") and hasattr(base, "h"):  # GPT-2 family
        return [base.wte, base.wpe, base.drop], None, base.h, base.ln_f, head
    if base is not None and hasattr(base, "embed_tokens") and hasattr(base, "layers") and hasattr(base, "norm"):
        return [base.embed_tokens], getattr(base, "rotary_emb", None), base.layers, base.norm, head  # Llama family
    raise UserError(f"{type(model).__name__}: only GPT-2 and Llama-style causal LMs are cut automatically "
                    "(use split points by module path for other models)")


def causal_lm_blocks(config: Any, dtype: torch.dtype | None = None) -> list[nn.Module]:
    """Embedding, one block per decoder layer, head; parameters on the meta device (``dtype``:
    the weights' dtype, e.g. ``torch.bfloat16``; default the config's)."""
    model = stock_model(config, dtype)
    embed, rotary, layers, norm, lm_head = _parts(model)
    first: nn.Module = GPT2Embedding(*embed) if len(embed) == 3 else TokenEmbedding(embed[0])
    blocks = [first, *(DecoderLayer(layer, rotary) for layer in layers), HFHead(norm, lm_head)]
    if lm_head.weight is embed[0].weight:  # tied input/output embeddings: one copy per block
        tied.untie(lm_head, "weight", embed[0], "weight", f"{getattr(embed[0], '_raypipe_path')}.weight")
    for b, block in enumerate(blocks):
        setattr(block, "_raypipe_path", f"block{b}")  # wrappers hold no parameters of their own
        set_init(block, getattr(model, "_init_weights"))
    return blocks


def param_paths(blocks: list[nn.Module]) -> dict[tuple[int, str], str]:
    """(block, parameter name in the block) -> the parameter's path in the whole model."""
    out: dict[tuple[int, str], str] = {}
    for b, block in enumerate(blocks):
        for mod_name, sub in block.named_modules():
            for attr, _ in sub.named_parameters(recurse=False):
                name = f"{mod_name}.{attr}" if mod_name else attr
                out[(b, name)] = f"{getattr(sub, '_raypipe_path', mod_name)}.{attr}"
    return out


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Next-token cross-entropy (targets are the inputs shifted by one)."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def token_batch(vocab: int, seq_len: int, rows: int, step: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """(inputs, targets) of random token sequences, reproducible from (seed, step)."""
    gen = torch.Generator().manual_seed(seeding.mix("data", seed, step) % (1 << 62))
    tokens = torch.randint(0, vocab, (rows, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class StockLM(nn.Module):
    """The whole stock model as one block: ids -> logits (single-process reference training)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> Tensor:
        return self.model(input_ids=ids, use_cache=False).logits


def stock_blocks(config: Any) -> list[nn.Module]:
    """``[StockLM(stock_model(config))]``: a model factory for :class:`actors.reference.ReferenceTrainer`
    that trains the unmodified model (one shared embedding parameter) in one process."""
    model = stock_model(config)
    block = StockLM(model)
    set_init(block, getattr(model, "_init_weights"))
    return [block]
