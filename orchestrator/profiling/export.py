"""Trained weights back under the user's own names.

The runtime keys weights by block (``{block: {name in the block: tensor}}``), names a user cannot
load anywhere. A model factory that cuts a user's model records, on every block, which of the
user's ``model.state_dict()`` keys each block entry is (:func:`record_names`, by tensor identity
at build time, so it holds for any cut: Hugging Face blocks, :func:`~orchestrator.profiling.modules.split_at`,
:func:`~orchestrator.profiling.modules.sequential_blocks`). :func:`user_state_dict` turns the
runtime's weights into the user's state dict with exactly the user's keys, in the user's order;
weights tied in the user's model (several keys, one tensor) come back as one tensor under all its
keys, as ``model.state_dict()`` gives them. Blocks without recorded names (a factory returning its
own list) are named as ``nn.Sequential(*blocks)`` would name them: ``"<block>.<name>"``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from torch import Tensor, nn

from orchestrator.core.errors import UserError

NAMES = "_raypipe_names"  # attribute on each block: its NameMap (the same object on every block)


@dataclass(frozen=True)
class NameMap:
    """The user's state-dict keys, in order, each with the (block, key in the block) that holds it;
    ``config``: the Hugging Face config when the user's model is a ``transformers`` model."""

    keys: tuple[str, ...]
    source: Mapping[str, tuple[int, str]]
    config: Any = None


def record_names(model: nn.Module, blocks: Sequence[nn.Module]) -> NameMap:
    """Record on ``blocks`` where each of ``model.state_dict()``'s entries lives. Call it before
    any tied weight is given per-block copies: identity is what finds a tensor's keys."""
    keys_of: dict[int, list[str]] = {}
    order: list[str] = []
    for key, value in model.state_dict(keep_vars=True).items():
        keys_of.setdefault(id(value), []).append(key)
        order.append(key)
    source: dict[str, tuple[int, str]] = {}
    for b, block in enumerate(blocks):
        for local, value in block.state_dict(keep_vars=True).items():
            for key in keys_of.get(id(value), ()):
                source.setdefault(key, (b, local))
    config = getattr(model, "config", None) if hasattr(model, "save_pretrained") else None
    names = NameMap(tuple(order), source, config)
    for block in blocks:
        setattr(block, NAMES, names)
    return names


def names_of(blocks: Sequence[nn.Module]) -> NameMap:
    """The recorded :class:`NameMap`, or the ``nn.Sequential`` naming of plain blocks."""
    recorded = getattr(blocks[0], NAMES, None) if blocks else None
    if isinstance(recorded, NameMap):
        return recorded
    source = {f"{b}.{local}": (b, local) for b, block in enumerate(blocks) for local in block.state_dict()}
    return NameMap(tuple(source), source)


def user_state_dict(blocks: Sequence[nn.Module], weights: Mapping[int, Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The user's state dict from block-keyed ``weights`` (``PipelineRuntime.state_dicts()`` or a
    checkpoint's): every key of the user's model, tied keys sharing one tensor. A key no block
    holds (a parameter the model's forward never uses, so no cut placed it) is one line naming it."""
    names = names_of(blocks)
    out: dict[str, Tensor] = {}
    taken: dict[tuple[int, str], Tensor] = {}
    for key in names.keys:
        where = names.source.get(key)
        if where is None:
            raise UserError(f"the model's {key!r} is in no block (its forward never uses it, so no stage trained it)")
        b, local = where
        if where not in taken:
            if b not in weights or local not in weights[b]:
                raise UserError(f"the weights hold no {local!r} for block {b} (the model's {key!r}): "
                                "they are not of this model")
            taken[where] = weights[b][local]
        out[key] = taken[where]
    return out


def check_empty_dir(directory: str | os.PathLike[str]) -> Path:
    """An export target: a new or empty folder (never mixed with another model's files)."""
    path = Path(directory)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"export target {os.fspath(path)} is not an empty folder: give a new or empty one")
    return path


def fresh_model(config: Any) -> nn.Module:
    """The stock ``AutoModelForCausalLM`` of ``config`` with real (random) weights, in eval mode."""
    import transformers

    model: nn.Module = transformers.AutoModelForCausalLM.from_config(config)
    return model.eval()


def save_pretrained(config: Any, weights: Mapping[str, Tensor], directory: str | os.PathLike[str]) -> Path:
    """Write ``weights`` (the user's state dict of a Hugging Face model) as a ``save_pretrained``
    folder: loaded into the stock model first with ``strict=True``, so a name that does not match
    is one line naming it and nothing is written."""
    path = check_empty_dir(directory)
    model = fresh_model(config)
    missing, unexpected = _mismatch(model, weights)
    if missing or unexpected:
        what = f"missing {missing[0]!r}" if missing else f"unexpected {unexpected[0]!r}"
        raise UserError(f"the weights do not fit {type(model).__name__}: {what} "
                        f"({len(missing)} missing, {len(unexpected)} unexpected keys)")
    model.load_state_dict(dict(weights), strict=True)
    getattr(model, "save_pretrained")(path)
    return path


def _mismatch(model: nn.Module, weights: Mapping[str, Tensor]) -> tuple[list[str], list[str]]:
    want = model.state_dict()
    missing = [k for k in want if k not in weights]
    unexpected = [k for k in weights if k not in want]
    bad = [k for k in want if k in weights and tuple(weights[k].shape) != tuple(want[k].shape)]
    return missing + bad, unexpected


def checkpoint_weights(location: str | os.PathLike[str], num_blocks: int | None = None) -> tuple[str, int, dict[int, dict[str, Tensor]]]:
    """(checkpoint, step, block-keyed weights) of one stored checkpoint, or of the newest valid one
    under a location holding several; every block file verified against the manifest."""
    from actors import checkpoint as ckpt

    where, manifest, _ = ckpt.check(location)
    if num_blocks is not None:
        ckpt.check_model(manifest, num_blocks, where)
    weights = {int(e["block"]): dict(ckpt.read_block(where, e)["model"]) for e in manifest["files"]}
    return where, int(manifest["step"]), weights


def write_weights(blocks: Sequence[nn.Module] | None, weights: Mapping[int, Mapping[str, Tensor]],
                  directory: str | os.PathLike[str]) -> tuple[Path, int]:
    """The user's state dict of ``weights`` into ``directory`` (new or empty): ``save_pretrained``
    for a Hugging Face model, else ``model.safetensors`` with the user's keys (a tied weight stored
    under each of its keys); ``blocks=None``: ``<block>.<name>`` keys. Returns (folder, tensors written)."""
    path = check_empty_dir(directory)
    if blocks is None:
        state = {f"{b}.{k}": v for b in sorted(weights) for k, v in weights[b].items()}
    else:
        state = user_state_dict(blocks, weights)
        config = names_of(blocks).config
        if config is not None:
            save_pretrained(config, state, path)
            return path, len(state)
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(path / "model.safetensors"))
    return path, len(state)
