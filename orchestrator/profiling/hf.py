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

Any decoder-only model is cut by its generic structure (:func:`parts`): the base model's modules
before its list of decoder layers (the token embedding, ``get_input_embeddings()``; a position
embedding, a norm, the embedding dropout), one block per layer, the modules after the layers (the
final norm) and the LM head (``get_output_embeddings()``). Each block takes and returns one
batch-first tensor: token ids, then hidden states, then logits. What the stock model computes once
and hands to every layer is recomputed inside each decoder block from the sequence length, as the
stock model does for an unpadded batch: the position ids, the rotary (cos, sin) from a rotary
module each block owns (buffers only, not in the state dict), and the attention mask of the
layer's kind (causal, sliding-window, or per layer from ``config.layer_types``) from
``transformers``' own mask functions. So no extra tensor crosses a stage boundary and nothing is
shared between stages. What a stock forward does outside its modules (Gemma2's soft-capped logits,
Granite's embedding and logit scales) is a :class:`Family`, registered by ``model_type``
(:func:`register_family`).

Exact or refused: :func:`check` runs the cut blocks and the stock model (same weights) on a probe
batch, once per process per config, and refuses the model with one line saying where they differ
— never a silently different model. So does a model without that structure, pointing at split points.
"""

from __future__ import annotations

import copy
import inspect
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
    """What a stock ``*ForCausalLM`` forward does that its modules do not: ``embedding(config,
    embeds)`` is applied to the token embedding's output (Granite's ``embedding_multiplier``),
    ``logits(config, logits)`` to the LM head's (Gemma2's soft-capping, Granite's ``logits_scaling``).
    A family with neither is the generic cut."""

    embedding: Callable[[Any, Tensor], Tensor] | None = None
    logits: Callable[[Any, Tensor], Tensor] | None = None


GENERIC = Family()

FAMILIES: dict[str, Family] = {}
"""``model_type`` -> its registered :class:`Family` (this process's registry)."""


def register_family(model_type: str, embedding: Callable[[Any, Tensor], Tensor] | None = None,
                    logits: Callable[[Any, Tensor], Tensor] | None = None) -> Family:
    """Tell the cutter what ``model_type``'s stock forward does outside its modules, e.g. Granite::

        hf.register_family("granite", embedding=lambda c, x: x * c.embedding_multiplier,
                           logits=lambda c, x: x / c.logits_scaling)

    The blocks are still checked against the stock model (:func:`check`). The registry is this
    process's: stage actors build their blocks in their own, so give the family to the factory,
    ``partial(hf.causal_lm_blocks, config, family=f)`` with ``f`` what this returns (it travels
    with the factory: module-level functions pickle anywhere), or register it in a module that
    the factory's import runs."""
    family = Family(embedding, logits)
    FAMILIES[model_type] = family
    return family


def softcap_logits(config: Any, logits: Tensor) -> Tensor:
    """``config.final_logit_softcapping`` (Gemma2, Gemma3): ``tanh(logits / cap) * cap``."""
    cap = config.final_logit_softcapping
    return logits if cap is None else torch.tanh(logits / cap) * cap


register_family("gemma2", logits=softcap_logits)
register_family("gemma3_text", logits=softcap_logits)


class HFEmbedding(nn.Module):
    """ids (B, T) -> hidden (B, T, D): the token embedding (then the family's ``embedding``), then
    the base model's other modules before its layers, in order: a position embedding (an
    ``nn.Embedding``) added at positions 0..T-1, a norm or a dropout applied."""

    def __init__(self, modules: list[tuple[str, nn.Module]], config: Any, family: Family) -> None:
        super().__init__()
        for name, module in modules:
            self.add_module(name, module)
        self._order = [name for name, _ in modules]
        self._config, self._scale = config, family.embedding

    def forward(self, ids: Tensor) -> Tensor:
        first, *rest = self._order
        hidden = getattr(self, first)(ids)
        if self._scale is not None:
            hidden = self._scale(self._config, hidden)
        for name in rest:
            module = getattr(self, name)
            if isinstance(module, nn.Embedding):
                hidden = hidden + module(torch.arange(ids.shape[-1], device=ids.device).unsqueeze(0))
            else:
                hidden = module(hidden)
        return hidden


MASKS = ("layer_types", "sliding", "causal")
"""How a stock model picks each layer's attention mask: ``config.layer_types[i]``; sliding-window
for every layer (``config.sliding_window``: Mistral, Phi-3); causal for every layer."""


def mask_choices(config: Any) -> list[str]:
    """The :data:`MASKS` ``config`` allows, most specific first; :func:`check` keeps the first exact one."""
    out = ["layer_types"] if isinstance(getattr(config, "layer_types", None), (list, tuple)) else []
    return out + (["sliding"] if getattr(config, "sliding_window", None) is not None else []) + ["causal"]


def _layer_kind(config: Any, masks: str, index: int) -> str:
    if masks == "layer_types":
        kind = str(config.layer_types[index])
        if kind not in ("full_attention", "sliding_attention"):
            raise UserError(f"{type(config).__name__}.layer_types[{index}] is {kind!r}: a stage boundary carries only "
                            "'full_attention' and 'sliding_attention' layers (cut this model with split points)")
        return kind
    return "sliding_attention" if masks == "sliding" else "full_attention"


class DecoderLayer(nn.Module):
    """One decoder layer: hidden -> hidden. What the stock model hands every layer is recomputed
    here, for the arguments the layer takes: the position ids, the attention mask of the layer's
    kind from the sequence length with ``transformers``' own mask function, and (cos, sin) from the
    block's own rotary module (a submodule: each stage owns one, on its device)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None, config: Any, kind: str) -> None:
        super().__init__()
        from transformers import masking_utils

        self.layer = layer
        self.rotary = rotary
        self._config, self._kind = config, kind
        self._masks = (masking_utils.create_sliding_window_causal_mask if kind == "sliding_attention"
                       else masking_utils.create_causal_mask)
        params = inspect.signature(layer.forward).parameters
        anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._takes = {k for k in ("attention_mask", "position_ids") if anything or k in params}
        typed = rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters
        self._rotary_kw = {"layer_type": kind} if typed else {}  # Gemma3, OLMo3: (cos, sin) per layer kind

    def forward(self, hidden: Tensor) -> Tensor:
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        kwargs: dict[str, Any] = {}
        if "position_ids" in self._takes:
            kwargs["position_ids"] = positions
        if "attention_mask" in self._takes and hidden.device.type != "meta":  # a shape probe needs no mask
            kwargs["attention_mask"] = self._masks(config=self._config, inputs_embeds=hidden, attention_mask=None,
                                                   cache=None, position_ids=positions)
        if self.rotary is not None:
            buffers = {k: b.to(hidden.device) for k, b in self.rotary.named_buffers()}  # a meta probe: moved for the call only
            kwargs["position_embeddings"] = functional_call(self.rotary, buffers, (hidden, positions), self._rotary_kw)
        out = self.layer(hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out


class HFHead(nn.Module):
    """hidden -> logits (B, T, vocab): the base model's modules after its layers (the final norm),
    the LM head, then the family's ``logits``."""

    def __init__(self, modules: list[tuple[str, nn.Module]], config: Any, family: Family) -> None:
        super().__init__()
        for name, module in modules:
            self.add_module(name, module)
        self._order = [name for name, _ in modules]
        self._config, self._scale = config, family.logits

    def forward(self, hidden: Tensor) -> Tensor:
        for name in self._order:
            hidden = getattr(self, name)(hidden)
        return hidden if self._scale is None else self._scale(self._config, hidden)


def _is_config(config: Any) -> bool:
    return isinstance(config, _transformers().PretrainedConfig)


def _refused(config: Any, why: str) -> UserError:
    return UserError(f"{type(config).__name__} (model_type {getattr(config, 'model_type', '')!r}) is not a family "
                     f"raypipe cuts automatically ({why}): build the model and cut it with "
                     "orchestrator.profiling.modules.split_at(model, split_points, sample)")


@dataclass
class Parts:
    """The generic structure of a stock causal LM, each module with its name: the base model's
    children before its decoder layers (the token embedding first, an embedding dropout
    registered after the layers last), its rotary module, its layers, its children after them
    (the final norm) with the LM head last."""

    embedding: list[tuple[str, nn.Module]]
    rotary: nn.Module | None
    layers: nn.ModuleList
    head: list[tuple[str, nn.Module]]


def parts(model: nn.Module) -> Parts:
    """:class:`Parts` of ``model``, or one line saying what it lacks."""
    config: Any = getattr(model, "config", None)
    base: Any = getattr(model, "base_model", None)
    if base is None or base is model:
        raise _refused(config, "no base model under the LM head")
    children = list(base.named_children())
    lists = [i for i, (_, m) in enumerate(children) if isinstance(m, nn.ModuleList)]
    if len(lists) != 1:
        raise _refused(config, f"{len(lists)} lists of layers in {type(base).__name__}, not one")
    at = lists[0]
    layers = children[at][1]
    assert isinstance(layers, nn.ModuleList)
    count = getattr(config, "num_hidden_layers", None)
    if isinstance(count, int) and len(layers) != count:
        raise _refused(config, f"{type(base).__name__}.{children[at][0]} has {len(layers)} layers, not num_hidden_layers={count}")
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()  # type: ignore[operator]
    if not any(m is embed for _, m in children[:at]):
        raise _refused(config, f"its input embedding is not a module of {type(base).__name__} before its layers")
    head_name = next((n for n, m in model.named_children() if m is lm_head), None) if lm_head is not None else None
    if head_name is None:
        raise _refused(config, f"no output embedding (LM head) beside {type(base).__name__}")
    rotary = [m for _, m in children if "rotary" in type(m).__name__.lower()]
    if len(rotary) > 1:
        raise _refused(config, f"{len(rotary)} rotary embeddings in {type(base).__name__}")
    late = [c for c in children[at + 1:] if isinstance(c[1], nn.Dropout)]
    if any("emb" not in n for n, _ in late):  # where a dropout after the layers acts, the structure does not say
        raise _refused(config, f"a dropout registered after its layers ({', '.join(n for n, _ in late)})")
    first = next(c for c in children if c[1] is embed)
    before = [first] + [c for c in children[:at] if c[1] is not embed and c[1] not in rotary] + late
    after = [c for c in children[at + 1:] if c[1] not in rotary and not isinstance(c[1], nn.Dropout)]
    others = [n for n, m in model.named_children() if m is not base and m is not lm_head and any(True for _ in m.parameters())]
    if others or head_name in {n for n, _ in after}:
        raise _refused(config, f"module(s) {', '.join(others or [head_name])} beside its base model and LM head")
    return Parts(before, rotary[0] if rotary else None, layers, after + [(head_name, lm_head)])


def _cut(model: nn.Module, config: Any, family: Family, masks: str) -> list[nn.Module]:
    """Embedding, one :class:`DecoderLayer` per layer, head: the blocks hold ``model``'s own modules."""
    got = parts(model)
    decoders = [DecoderLayer(layer, copy.deepcopy(got.rotary), config, _layer_kind(config, masks, i))
                for i, layer in enumerate(got.layers)]
    return [HFEmbedding(got.embedding, config, family), *decoders, HFHead(got.head, config, family)]


def family_for(config: Any, family: Family | None = None) -> Family:
    """``family``, else the registered one of ``config.model_type``, else the generic cut."""
    return family if family is not None else FAMILIES.get(getattr(config, "model_type", ""), GENERIC)


# ---------------------------------------------------------------------------------------------- the check
PROBE_ROWS, PROBE_SEQ, PROBE_WINDOW, PROBE_VOCAB = 2, 12, 4, 256
TOLERANCE = 1e-5
"""The largest difference allowed between the cut blocks' and the stock model's logits on the
probe (float32), relative to the largest logit (at least 1e-3)."""

_CHECKED: dict[tuple[str, Family], tuple[str, str | None]] = {}


def check(config: Any, family: Family | None = None) -> str:
    """The :data:`MASKS` choice whose cut of ``config`` gives the stock model's logits on a probe
    batch, or one :class:`UserError` line saying where the closest cut differs.

    The probe is a small copy of the model (:func:`probe_configs`: the layers that show every
    layer kind, narrow widths, the sliding window shorter than the probe's 12 tokens) built for
    real with its own initializer in float32; blocks and stock model share its weights and run in
    eval mode, then in training mode from one seed (dropout drawn in the same order, or not
    placed right). Once per process per (config, family): 30-200 ms on a CPU core, real sizes
    included (the probe's widths do not grow with the model's)."""
    family = family_for(config, family)
    key = (config.to_json_string(), family)
    if key not in _CHECKED:
        _CHECKED[key] = _probe(config, family)
    masks, why = _CHECKED[key]
    if why is not None:
        raise UserError(why)
    return masks


def _layers_to_keep(fields: dict[str, Any], count: int) -> int:
    """The shortest prefix of layers (at least 2) holding every value of each per-layer list."""
    keep = min(2, count)
    for value in fields.values():
        if isinstance(value, list) and len(value) == count:
            seen: list[Any] = []
            for i, v in enumerate(value):
                if v not in seen:
                    seen.append(v)
                    keep = max(keep, i + 1)
    return keep


NEUTRAL, PROBE_VALUE = 1.0, 0.5
"""A float field of exactly 1.0 (a neutral multiplier: Granite's ``logits_scaling``) is 0.5 in the
first probes, so a scale the cut misses shows even where the config makes it a no-op."""


def probe_configs(config: Any) -> list[tuple[Any, str]]:
    """(small copy of ``config``, what it moved) for :func:`check`, most telling first: fewer
    layers, narrow widths and a smaller vocabulary, neutral multipliers moved (:data:`NEUTRAL`);
    the same without moving them; fewer layers only; then ``config`` itself (a copy its class
    refuses is left out)."""
    fields = config.to_dict()
    aliases = getattr(config, "attribute_map", {})  # GPT-2's n_layer, n_embd, n_head

    def get(key: str) -> Any:
        return fields.get(aliases.get(key, key))

    fewer: dict[str, Any] = {}
    count = get("num_hidden_layers")
    if isinstance(count, int):
        keep = _layers_to_keep(fields, count)
        if keep < count:
            fewer[aliases.get("num_hidden_layers", "num_hidden_layers")] = keep
            fewer.update({k: v[:keep] for k, v in fields.items() if isinstance(v, list) and len(v) == count})
    window = get("sliding_window")
    if isinstance(window, int) and not isinstance(window, bool) and window > PROBE_WINDOW:
        fewer[aliases.get("sliding_window", "sliding_window")] = PROBE_WINDOW  # shorter than the probe: a wrong mask shows
    narrow = dict(fewer)
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    kv = get("num_key_value_heads") or heads
    if isinstance(hidden, int) and isinstance(heads, int) and isinstance(kv, int) and hidden > 128 and heads % kv == 0:
        kv_small = min(kv, 2)
        heads_small = kv_small * min(heads // kv, 2)
        widths = {"hidden_size": 16 * heads_small, "num_attention_heads": heads_small, "num_key_value_heads": kv_small,
                  "head_dim": 16, "intermediate_size": 64, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 32}
        narrow.update({aliases.get(k, k): v for k, v in widths.items() if get(k) is not None})
    vocab = get("vocab_size")
    if isinstance(vocab, int) and vocab > PROBE_VOCAB:  # token ids beyond it (bos, eos, pad) become 1
        narrow[aliases.get("vocab_size", "vocab_size")] = PROBE_VOCAB
        narrow.update({k: 1 for k, v in fields.items() if k.endswith("_token_id") and isinstance(v, int) and v >= PROBE_VOCAB})
    neutral = [k for k, v in fields.items() if type(v) is float and v == NEUTRAL]
    note = f" (its 1.0-valued fields at {PROBE_VALUE}: {', '.join(neutral[:4])}{', ...' if len(neutral) > 4 else ''})"
    out: list[tuple[Any, str]] = []
    variants: list[dict[str, Any]] = []
    for changes, what in (({**narrow, **dict.fromkeys(neutral, PROBE_VALUE)}, note if neutral else ""), (narrow, ""),
                          (fewer, "")):
        if changes and changes not in variants:
            variants.append(changes)
            try:
                out.append((type(config).from_dict({**fields, **changes}), what))
            except Exception:  # noqa: BLE001 - a copy this config class refuses: the next one
                pass
    return out + [(config, "")]


def _probe(config: Any, family: Family) -> tuple[str, str | None]:
    """(the first exact mask choice, None), or (the closest one, the line saying how it differs)."""
    transformers = _transformers()
    name = f"{type(config).__name__} (model_type {getattr(config, 'model_type', '')!r})"
    split = "cut it with orchestrator.profiling.modules.split_at"
    failure = ""
    for small, moved in probe_configs(config):  # the first whose stock model runs the probe
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(small).float()
            seq = min(PROBE_SEQ, getattr(small, "max_position_embeddings", None) or PROBE_SEQ)
            ids = torch.randint(0, model.get_input_embeddings().num_embeddings, (PROBE_ROWS, seq),
                                generator=torch.Generator().manual_seed(0))
            wants = {training: _run(model.train(training), ids, None) for training in (False, True)}
            if all(bool(w.isfinite().all()) for w in wants.values()):
                break
            failure = failure or "logits that are not finite"
        except Exception as exc:  # noqa: BLE001 - the next, larger probe
            failure = failure or f"{type(exc).__name__}: {_short(exc)}"
    else:
        return "causal", f"{name}: the stock model fails on a probe batch ({failure}; {split})"
    closest: tuple[float, str] | None = None
    for masks in mask_choices(small):
        try:
            blocks = _cut(model, small, family, masks)
        except UserError as exc:
            return masks, str(exc)
        for training in (False, True):
            model.train(training)
            want = wants[training]
            try:
                got = _run(model, ids, blocks)
            except Exception as exc:  # noqa: BLE001 - a layer that needs what the cut does not give it
                miss = (float("inf"), f"{name} is not a family raypipe cuts exactly: the cut blocks fail on a probe "
                                      f"batch ({type(exc).__name__}: {_short(exc)}; {split})")
                closest = miss if closest is None else min(closest, miss)
                break
            scale = float(want.abs().max())
            diff = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
            if not diff <= TOLERANCE * max(scale, 1e-3):
                where = ("in training mode (dropout placed differently?)" if training else "(a scale outside the layers? "
                         f"register what its forward does with hf.register_family({config.model_type!r}, embedding=..., "
                         "logits=...))")
                miss = (diff, f"{name} is not a family raypipe cuts exactly: the cut blocks' logits differ from the "
                              f"stock model's by {diff:.3g} (of logits up to {scale:.3g}) on a probe batch{moved} {where}; "
                              f"or {split}")
                closest = miss if closest is None else min(closest, miss)
                break
        else:
            return masks, None
    assert closest is not None
    return "causal", closest[1]


def _run(model: nn.Module, ids: Tensor, blocks: list[nn.Module] | None) -> Tensor:
    """The stock model's logits (``blocks`` None) or the blocks', from one seed, without gradients."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        if blocks is None:
            out: Tensor = model(input_ids=ids, use_cache=False).logits
            return out
        for block in blocks:
            ids = block(ids)
        return ids


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160]


def stock_model(config: Any, dtype: torch.dtype | None = None, pretrained: str | None = None) -> nn.Module:
    """The unmodified ``AutoModelForCausalLM`` of ``config`` on the meta device, with paths
    recorded for initialization (or for loading ``pretrained``'s tensors) and dropout seeded
    per (step, unit, block) — the blocks of :func:`causal_lm_blocks` draw the same masks."""
    transformers = _transformers()
    if not _is_config(config):
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
    try:
        got = parts(model)
    except UserError:  # not cut automatically: nothing to seed per block
        return model
    # every layer, not only those holding nn.Dropout: attention dropout is functional (sdpa's dropout_p)
    for module in [m for _, m in got.embedding if isinstance(m, nn.Dropout)] + list(got.layers):
        seeding.seed_forward(module, getattr(module, "_raypipe_path"))
    return model


def _initializer(model: nn.Module, pretrained: str | None) -> Callable[[nn.Module], Any]:
    init: Callable[[nn.Module], Any] = getattr(model, "_init_weights")
    if pretrained is None:
        return init
    from orchestrator.profiling.pretrained import loader

    return loader(pretrained, model, init)


def causal_lm_blocks(config: Any, dtype: torch.dtype | None = None, pretrained: str | None = None,
                     family: Family | None = None) -> list[nn.Module]:
    """Embedding, one block per decoder layer, head; parameters on the meta device (``dtype``:
    the weights' dtype, e.g. ``torch.bfloat16``; default the config's). ``pretrained``: a local
    ``save_pretrained`` folder whose tensors replace the initializer (each block reads its own).
    ``family``: what the stock forward does outside its modules (default: the :class:`Family`
    registered for ``config.model_type``, else nothing). Refused, one line, unless :func:`check`
    finds the cut exact.

    The blocks carry the stock model's state-dict names
    (:func:`orchestrator.profiling.export.user_state_dict` gives trained weights back under them)."""
    model = stock_model(config, dtype, pretrained)  # first: a config of no causal LM is its own line
    family = family_for(config, family)
    parts(model)  # a model without the structure: its own line, before any probe
    blocks = _cut(model, config, family, check(config, family))
    names = record_names(model, blocks)  # before untying: the head's copy keeps the shared weight's names
    lost = [k for k in names.keys if k not in names.source]
    if lost:
        raise _refused(config, f"its {lost[0]!r} is in no block")
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()  # type: ignore[operator]
    if lm_head.weight is embed.weight:  # tied input/output embeddings: one copy per block
        tied.untie(lm_head, "weight", embed, "weight", f"{getattr(embed, '_raypipe_path')}.weight")
    init = getattr(model, INIT)
    for b, block in enumerate(blocks):
        setattr(block, "_raypipe_path", f"block{b}")  # wrappers hold no parameters of their own
        set_init(block, init)
    return blocks


def pretrained_blocks(directory: str, dtype: torch.dtype | None = None, family: Family | None = None) -> list[nn.Module]:
    """:func:`causal_lm_blocks` of a local ``save_pretrained`` folder: its config, its weights
    (a model factory: ``partial(pretrained_blocks, DIR)``; each stage reads its own blocks' tensors)."""
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise UserError(f"{directory}: no Hugging Face config to load ({' '.join(str(exc).split())[:160]})") from None
    return causal_lm_blocks(config, dtype, pretrained=directory, family=family)


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
    ``window``: the sliding window where the family has one. Fields a config class does not
    take as given (a derived property) are left to it."""
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
    try:
        return transformers.AutoConfig.for_model(family, **kw)
    except (AttributeError, TypeError, ValueError):  # e.g. a head_dim the class derives: leave such fields out
        kw = {k: v for k, v in kw.items() if not isinstance(getattr(config_class, k, None), property)}
    try:
        return transformers.AutoConfig.for_model(family, **kw)
    except (AttributeError, TypeError, ValueError) as exc:
        raise UserError(f"--family {family!r}: no tiny config of it ({type(exc).__name__}: {_short(exc)})") from None
