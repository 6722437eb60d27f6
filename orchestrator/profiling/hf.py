"""Hugging Face causal language models as pipeline blocks: embedding, one block per decoder
layer, head — built from a config on the meta device, nothing downloaded.

:func:`causal_lm_blocks` is a model factory (``partial(causal_lm_blocks, config)``): every stage
worker calls it, gets the whole model's structure for free (:func:`actors.materialize.empty_init`)
and materializes only its own blocks with the model's own initializer (``_init_weights``), each
submodule seeded by its path — or, with ``pretrained=DIR``, with the tensors of a
``save_pretrained`` folder, each stage reading only its own blocks' tensors
(:mod:`orchestrator.profiling.pretrained`). Tied input/output embeddings become one copy per block
(:mod:`actors.tied`); dropout draws its masks from a seed per (step, micro-batch, block)
(:mod:`actors.seeding`). :func:`stock_model` builds the unmodified ``*ForCausalLM`` the same way
(same weights, same dropout seeds): single-process training of "the same model" is training it.

Each block takes and returns one batch-first tensor: token ids, then hidden states, then
logits. What the stock model computes once and hands to every layer is recomputed inside each
decoder block from the sequence length, as the stock model does for an unpadded batch: the
position ids, the rotary (cos, sin) from a rotary module each block owns (buffers only, not in
the state dict), and the attention mask of the layer's kind (causal, or sliding-window where the
config asks for it, per layer for families that alternate) from ``transformers``' own mask
functions. So no extra tensor crosses a stage boundary and nothing is shared between stages.

Only the families in :data:`FAMILIES` are cut: for each, what the stock model's forward does
between its layers is known (and tested against it). Any other family is one line naming the
class and pointing at split points, never a silently different model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call

from actors import seeding, tied
from actors.materialize import INIT, empty_init, name_paths, set_init
from orchestrator.core.errors import UserError
from orchestrator.profiling.export import record_names


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:  # pragma: no cover - a dependency of the package
        raise UserError("Hugging Face models need the 'transformers' package (pip install transformers)") from None
    return transformers


@dataclass(frozen=True)
class Family:
    """What the stock ``*ForCausalLM`` forward does around its decoder layers.

    ``masks``: ``"self"`` (the layer masks itself, GPT-2), ``"causal"``, ``"sliding"`` (a
    sliding window when ``config.sliding_window`` is set, else causal: Mistral, Phi-3) or
    ``"layer_types"`` (``config.layer_types[i]`` picks causal or sliding per layer: Qwen2,
    Gemma2). ``softcap``: the head applies ``config.final_logit_softcapping`` (Gemma2)."""

    masks: str
    softcap: bool = False


FAMILIES: dict[str, Family] = {
    "gpt2": Family("self"),
    "llama": Family("causal"),
    "mistral": Family("sliding"),
    "qwen2": Family("layer_types"),
    "qwen3": Family("layer_types"),
    "gemma2": Family("layer_types", softcap=True),
    "phi3": Family("sliding"),
}


class GPT2Embedding(nn.Module):
    """Token + position embedding and embedding dropout: ids (B, T) -> hidden (B, T, D)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[-1], device=ids.device).unsqueeze(0)
        return self.drop(self.wte(ids) + self.wpe(positions))


class TokenEmbedding(nn.Module):
    """Llama-style token embedding (Gemma's scales inside its own module): ids (B, T) -> hidden."""

    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed

    def forward(self, ids: Tensor) -> Tensor:
        return self.embed_tokens(ids)


def _mask_function(config: Any, family: Family, index: int) -> Callable[..., Any] | None:
    """The ``transformers.masking_utils`` function the stock model uses for layer ``index``."""
    if family.masks == "self":
        return None
    from transformers import masking_utils

    kind = "full_attention"
    if family.masks == "sliding" and getattr(config, "sliding_window", None) is not None:
        kind = "sliding_attention"
    elif family.masks == "layer_types":
        kind = config.layer_types[index]
    if kind == "full_attention":
        return masking_utils.create_causal_mask
    if kind == "sliding_attention":
        return masking_utils.create_sliding_window_causal_mask
    raise UserError(f"{type(config).__name__}.layer_types[{index}] is {kind!r}: a stage boundary carries only "
                    "'full_attention' and 'sliding_attention' layers (cut this model with split points)")


class DecoderLayer(nn.Module):
    """One decoder layer: hidden -> hidden. Rotary families compute (cos, sin) here from their
    own rotary module (a submodule: each stage owns one, on its device), and the layer's
    attention mask from the sequence length with the stock model's own mask function."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None, config: Any, masks: Callable[..., Any] | None) -> None:
        super().__init__()
        self.layer = layer
        self.rotary = rotary
        self._config, self._masks = config, masks

    def forward(self, hidden: Tensor) -> Tensor:
        if self.rotary is None and self._masks is None:
            return self.layer(hidden)
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = None
        if self._masks is not None and hidden.device.type != "meta":  # a shape probe needs no mask
            mask = self._masks(config=self._config, inputs_embeds=hidden, attention_mask=None, cache=None,
                               position_ids=positions)
        cos_sin = None
        if self.rotary is not None:
            buffers = {k: b.to(hidden.device) for k, b in self.rotary.named_buffers()}  # a meta probe: moved for the call only
            cos_sin = functional_call(self.rotary, buffers, (hidden, positions))
        return self.layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)


class HFHead(nn.Module):
    """Final norm and the projection to the vocabulary (soft-capped where the family does it):
    hidden -> logits (B, T, vocab)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear, softcap: float | None = None) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head
        self.softcap = softcap

    def forward(self, hidden: Tensor) -> Tensor:
        logits = self.lm_head(self.norm(hidden))
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def family_of(config: Any) -> Family:
    """The :class:`Family` of ``config``; any other family is one line naming it."""
    transformers = _transformers()
    if not isinstance(config, transformers.PretrainedConfig):
        raise UserError(f"a Hugging Face model needs a transformers config, got {type(config).__name__}")
    family = FAMILIES.get(getattr(config, "model_type", ""))
    if family is None:
        raise _unsupported(type(config).__name__, str(config.model_type))
    return family


def _unsupported(config_class: str, model_type: str) -> UserError:
    return UserError(f"{config_class} (model_type {model_type!r}) is not a family raypipe cuts automatically "
                     f"({', '.join(FAMILIES)}): build the model and cut it with "
                     "orchestrator.profiling.modules.split_at(model, split_points, sample)")


def stock_model(config: Any, dtype: torch.dtype | None = None, pretrained: str | None = None) -> nn.Module:
    """The unmodified ``AutoModelForCausalLM`` of ``config`` on the meta device, with paths
    recorded for initialization (or for loading ``pretrained``'s tensors) and dropout seeded
    per (step, unit, block) — the blocks of :func:`causal_lm_blocks` draw the same masks."""
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
    set_init(model, _initializer(model, pretrained))
    if family_of_model(model) is not None:
        embed, _, layers, _, _ = _parts(model)
        # every layer, not only those holding nn.Dropout: attention dropout is functional (sdpa's dropout_p)
        for module in ([embed[-1]] if len(embed) == 3 else []) + list(layers):
            seeding.seed_forward(module, getattr(module, "_raypipe_path"))
    return model


def _initializer(model: nn.Module, pretrained: str | None) -> Callable[[nn.Module], Any]:
    init: Callable[[nn.Module], Any] = getattr(model, "_init_weights")
    if pretrained is None:
        return init
    from orchestrator.profiling.pretrained import loader

    return loader(pretrained, model, init)


def family_of_model(model: nn.Module) -> Family | None:
    return FAMILIES.get(getattr(getattr(model, "config", None), "model_type", ""))


def _parts(model: nn.Module) -> tuple[list[Any], Any, Any, Any, Any]:
    """(embedding modules, rotary, decoder layers, final norm, lm_head) of a supported model."""
    config: Any = getattr(model, "config", None)
    family_of(config)
    base: Any = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = getattr(model, "lm_head", None)
    if head is not None and base is not None and hasattr(base, "wte") and hasattr(base, "h"):  # GPT-2
        known = {"wte", "wpe", "drop", "h", "ln_f"}
        parts: tuple[list[Any], Any, Any, Any, Any] = ([base.wte, base.wpe, base.drop], None, base.h, base.ln_f, head)
    elif head is not None and base is not None and all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm")):
        known = {"embed_tokens", "layers", "norm", "rotary_emb"}
        parts = ([base.embed_tokens], getattr(base, "rotary_emb", None), base.layers, base.norm, head)
    else:
        raise UserError(f"{type(model).__name__}: its modules are not laid out as raypipe expects for "
                        f"{config.model_type!r} (cut it with split points)")
    extra = sorted(set(dict(base.named_children())) - known)
    if extra:  # a module the cut would drop: refuse rather than train another model
        raise UserError(f"{type(model).__name__}: its base model has module(s) {', '.join(extra)} that the cut does not "
                        "place (cut it with split points)")
    return parts


def causal_lm_blocks(config: Any, dtype: torch.dtype | None = None, pretrained: str | None = None) -> list[nn.Module]:
    """Embedding, one block per decoder layer, head; parameters on the meta device (``dtype``:
    the weights' dtype, e.g. ``torch.bfloat16``; default the config's). ``pretrained``: a local
    ``save_pretrained`` folder whose tensors replace the initializer (each block reads its own).

    The blocks carry the stock model's state-dict names
    (:func:`orchestrator.profiling.export.user_state_dict` gives trained weights back under them)."""
    model = stock_model(config, dtype, pretrained)  # first: a config of no causal LM is its own line
    family = family_of(config)
    embed, rotary, layers, norm, lm_head = _parts(model)
    first: nn.Module = GPT2Embedding(*embed) if len(embed) == 3 else TokenEmbedding(embed[0])
    decoders = [DecoderLayer(layer, copy.deepcopy(rotary) if rotary is not None else None, config,
                             _mask_function(config, family, i)) for i, layer in enumerate(layers)]
    softcap = getattr(config, "final_logit_softcapping", None) if family.softcap else None
    blocks = [first, *decoders, HFHead(norm, lm_head, softcap)]
    record_names(model, blocks)  # before untying: the head's copy keeps the shared weight's names
    if lm_head.weight is embed[0].weight:  # tied input/output embeddings: one copy per block
        tied.untie(lm_head, "weight", embed[0], "weight", f"{getattr(embed[0], '_raypipe_path')}.weight")
    init = getattr(model, INIT)
    for b, block in enumerate(blocks):
        setattr(block, "_raypipe_path", f"block{b}")  # wrappers hold no parameters of their own
        set_init(block, init)
    return blocks


def pretrained_blocks(directory: str, dtype: torch.dtype | None = None) -> list[nn.Module]:
    """:func:`causal_lm_blocks` of a local ``save_pretrained`` folder: its config, its weights
    (a model factory: ``partial(pretrained_blocks, DIR)``; each stage reads its own blocks' tensors)."""
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise UserError(f"{directory}: no Hugging Face config to load ({' '.join(str(exc).split())[:160]})") from None
    return causal_lm_blocks(config, dtype, pretrained=directory)


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


def stock_blocks(config: Any, dtype: torch.dtype | None = None, pretrained: str | None = None) -> list[nn.Module]:
    """``[StockLM(stock_model(config))]``: a model factory for :class:`actors.reference.ReferenceTrainer`
    that trains the unmodified model (one shared embedding parameter) in one process."""
    model = stock_model(config, dtype, pretrained)
    block = StockLM(model)
    set_init(block, getattr(model, INIT))
    return [block]


def config_from(name: str, kwargs: str | None = None) -> Any:
    """A config from the command line: a folder holding ``config.json`` or a ``model_type``
    (``llama``, ``mistral``, ...), with ``kwargs`` a JSON object of config fields."""
    import json
    from pathlib import Path

    transformers = _transformers()
    fields: Any = {}
    if kwargs:
        try:
            fields = json.loads(kwargs)
        except ValueError as exc:
            raise UserError(f"--hf-kwargs is not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise UserError(f"--hf-kwargs must be a JSON object of config fields, got {type(fields).__name__}")
    if (Path(name) / "config.json").is_file():  # a folder first: a model_type is also a plausible folder name
        try:
            return transformers.AutoConfig.from_pretrained(name, **fields)
        except (OSError, ValueError) as exc:
            raise UserError(f"--hf-config {name}: no Hugging Face config here ({' '.join(str(exc).split())[:160]})") from None
    if name not in transformers.CONFIG_MAPPING and Path(name).is_dir():
        raise UserError(f"--hf-config {name}: the folder holds no config.json (save_pretrained writes one)")
    try:
        return transformers.AutoConfig.for_model(name, **fields)
    except (ValueError, KeyError):
        raise UserError(f"--hf-config {name!r} is neither a folder holding config.json nor a model_type of transformers") from None
    except TypeError as exc:
        raise UserError(f"--hf-kwargs do not fit {name!r}: {exc}") from None


def tiny_config(family: str, layers: int = 4, hidden: int = 32, heads: int = 4, vocab: int = 128, seq: int = 16,
                window: int | None = None, dropout: float | None = None) -> Any:
    """A tiny config of any ``model_type`` in ``transformers`` (random init, nothing downloaded);
    ``window``: the sliding window where the family has one."""
    transformers = _transformers()
    kw: dict[str, Any] = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                              num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), vocab_size=vocab,
                              max_position_embeddings=max(seq, 32), head_dim=hidden // heads, bos_token_id=0,
                              eos_token_id=0, pad_token_id=0)
    if window is not None:
        kw["sliding_window"] = window
    if dropout is not None:
        kw.update(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, attention_dropout=dropout)
    config_class = transformers.CONFIG_MAPPING[family] if family in transformers.CONFIG_MAPPING else None
    if config_class is None:
        raise UserError(f"--family {family!r} is not a model_type of transformers")
    if family not in FAMILIES:  # before building: a config of another family may refuse these fields
        raise _unsupported(config_class.__name__, family)
    return transformers.AutoConfig.for_model(family, **kw)
