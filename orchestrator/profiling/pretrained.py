"""Pretrained weights in: a local ``save_pretrained`` folder (safetensors, sharded or not) as the
initializer of a model built on the meta device.

:func:`loader` returns the per-submodule initializer that :func:`actors.materialize.materialize`
calls for each submodule of a block it materializes: it runs the model's own ``_init_weights``
(non-persistent buffers such as rotary frequencies are computed, not stored) and then copies
every parameter and persistent buffer of that submodule from the folder, found by the
submodule's path in the whole model. A stage materializes only its own blocks, so it opens only
the shards holding them and reads only their tensors (safetensors reads a tensor by its offset).
A weight tied to another (``lm_head.weight`` to the input embedding) that the folder stores once
is read under the key it is tied to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from actors.materialize import PATH
from orchestrator.core.errors import UserError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def weight_files(directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Tensor key -> the safetensors file holding it, from the index of a sharded folder or the
    header of a single file (no tensor is read)."""
    root = Path(directory)
    if (root / INDEX).is_file():
        try:
            weight_map = json.loads((root / INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{root / INDEX} is not a safetensors index (no 'weight_map')") from None
        return {str(k): root / str(v) for k, v in weight_map.items()}
    if (root / SINGLE).is_file():
        from safetensors import safe_open

        with safe_open(str(root / SINGLE), framework="pt") as f:
            return {k: root / SINGLE for k in f.keys()}
    raise UserError(f"{os.fspath(root)} holds no {SINGLE} or {INDEX}: give a save_pretrained folder (safetensors)")


class Loader:
    """The initializer of :func:`loader`; ``read`` names every tensor it has read (tests check that
    a stage reads only its own blocks')."""

    def __init__(self, directory: str | os.PathLike[str], tied: dict[str, str], init: Callable[[nn.Module], Any]) -> None:
        self.directory = os.fspath(directory)
        self.files = weight_files(directory)
        self.tied, self.init = tied, init
        self.read: set[str] = set()
        self._open: dict[Path, Any] = {}

    def __call__(self, module: nn.Module) -> None:
        self.init(module)  # buffers that are computed (rotary frequencies, scales), not stored
        path = getattr(module, PATH, "")
        skip: set[str] = getattr(module, "_non_persistent_buffers_set", set())
        tensors = list(module.named_parameters(recurse=False)) + [
            (n, b) for n, b in module.named_buffers(recurse=False) if n not in skip]
        for name, target in tensors:
            key = f"{path}.{name}" if path else name
            value = self._tensor(key)
            if tuple(value.shape) != tuple(target.shape):
                raise UserError(f"{self.directory}: {key} has shape {tuple(value.shape)} but the model's is "
                                f"{tuple(target.shape)} (a checkpoint of another config?)")
            with torch.no_grad():
                target.copy_(value)

    def _tensor(self, key: str) -> torch.Tensor:
        stored = key if key in self.files else self.tied.get(key, key)
        if stored not in self.files:
            raise UserError(f"{self.directory} holds no tensor {key!r} (a checkpoint of another model?)")
        file = self.files[stored]
        if file not in self._open:
            from safetensors import safe_open

            self._open[file] = safe_open(str(file), framework="pt")
        self.read.add(stored)
        tensor: torch.Tensor = self._open[file].get_tensor(stored)
        return tensor


def loader(directory: str | os.PathLike[str], model: nn.Module, init: Callable[[nn.Module], Any]) -> Loader:
    """The initializer that loads ``model``'s tensors from ``directory`` (see the module docstring)."""
    tied = getattr(model, "_tied_weights_keys", None)
    return Loader(directory, dict(tied) if isinstance(tied, dict) else {}, init)
