"""Build a model without memory, then give each stage real weights for its own blocks only.

:func:`empty_init` builds any ``nn.Module`` with its parameters on the meta device (buffers stay
real: they are small and often computed in ``__init__``, like rotary frequencies), so the driver
and every worker can hold the whole model's *structure* for free. :func:`materialize` turns the
meta parameters of one block into real ones on a device and initializes them, submodule by
submodule in post-order (children first, as ``nn.Module.apply`` and Hugging Face's
``post_init`` do), each from a seed keyed by the submodule's path in the whole model
(:func:`actors.seeding.mix`). The weights therefore do not depend on how the model is cut or
which process materializes a block: a single-process reference that materializes the whole
model the same way starts from exactly the same weights. Every block :func:`materialize` sees also
has its dropout seeded per (step, unit, block) unless its factory already did
(:func:`actors.seeding.seed_block`): a stage and the reference draw the same masks by default.

How a submodule is initialized: the ``init`` callable recorded on the block (a Hugging Face
model's ``_init_weights``), else its own ``reset_parameters()`` (what torch layers call in their
constructors). Parameters shared inside one block keep being one parameter and take the value
their owner (first module to hold them) gives them; parameters tied across blocks
(:mod:`actors.tied`) take the value their owner module's recipe gives them.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

from actors import seeding

PATH = "_raypipe_path"  # attribute on each submodule: its path in the whole model (init seeds)
INIT = "_raypipe_init"  # attribute on a block: per-submodule init callable
TIE = "_raypipe_tie"  # attribute on a parameter: its actors.tied.Tie


@contextmanager
def empty_init() -> Iterator[None]:
    """Parameters created inside go to the meta device (the idea of accelerate's
    ``init_empty_weights``): a 7 B-parameter model is built in milliseconds and no memory."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        if param is not None and param.device.type != "meta":
            kind = type(param)
            self._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def name_paths(root: nn.Module, prefix: str = "") -> None:
    """Record every submodule's path in ``root`` (the key of its init seed)."""
    for name, sub in root.named_modules(prefix=prefix):
        setattr(sub, PATH, name)


def set_init(block: nn.Module, init: Callable[[nn.Module], Any] | None) -> None:
    setattr(block, INIT, init)


def on_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def _post_order(module: nn.Module, seen: set[int]) -> Iterator[nn.Module]:
    for child in module.children():
        if id(child) not in seen:
            yield from _post_order(child, seen)
    if id(module) not in seen:
        seen.add(id(module))
        yield module


def _default_init(module: nn.Module) -> None:
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()


def _init_one(sub: nn.Module, fallback: str, seed: int, init: Callable[[nn.Module], Any]) -> None:
    if not any(True for _ in sub.parameters(recurse=False)) and not any(True for _ in sub.buffers(recurse=False)):
        return
    torch.default_generator.manual_seed(seeding.mix("init", seed, getattr(sub, PATH, fallback)))
    with torch.no_grad():
        init(sub)


def materialize(block: nn.Module, device: torch.device | str, seed: int, fallback_path: str = "") -> nn.Module:
    """``block`` (in place) with real, initialized parameters on ``device``; a block without
    meta parameters is only moved. ``fallback_path`` keys submodules that carry no path.

    Initialization runs on the CPU (seeded CPU generator) and the block moves to ``device``
    afterwards: the weights are then the same on every kind of device, and a GPU stage's
    weights equal a CPU reference's."""
    target = torch.device(device)
    seeding.seed_block(block, fallback_path)  # dropout exact by default: masks from (step, unit, block)
    if not on_meta(block):
        return block.to(target)
    device = torch.device("cpu")
    made: dict[int, nn.Parameter] = {}
    for sub in block.modules():
        for name, p in list(sub._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                made[id(p)] = type(p)(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
                if hasattr(p, TIE):  # what actors.tied recorded on the meta parameter
                    setattr(made[id(p)], TIE, getattr(p, TIE))
            sub._parameters[name] = made[id(p)]
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = b.to(device)
    # each submodule uses the init recorded on its nearest enclosing module (else reset_parameters)
    inits: dict[str, Callable[[nn.Module], Any]] = {}
    init_of: dict[int, Callable[[nn.Module], Any]] = {}
    for name, sub in block.named_modules():
        inherited = inits.get(name.rpartition(".")[0], _default_init) if name else _default_init
        inits[name] = init_of[id(sub)] = getattr(sub, INIT, None) or inherited
    with torch.random.fork_rng(devices=[]):
        paths = {id(sub): f"{fallback_path}.{name}".strip(".") for name, sub in block.named_modules()}
        owners: dict[int, nn.Module] = {}
        holders: dict[int, int] = {}
        for sub in block.modules():
            for p in sub.parameters(recurse=False):
                owners.setdefault(id(p), sub)
                holders[id(p)] = holders.get(id(p), 0) + 1
        for sub in _post_order(block, set()):
            _init_one(sub, paths[id(sub)], seed, init_of[id(sub)])
        # a parameter shared inside the block takes its owner's value: the owner runs again, last
        for owner in {id(owners[i]): owners[i] for i, n in holders.items() if n > 1}.values():
            _init_one(owner, paths[id(owner)], seed, init_of[id(owner)])
        for sub in block.modules():
            for p in sub.parameters(recurse=False):
                source = getattr(p, TIE, None)
                if source is not None and source.owner is not None:
                    with torch.no_grad():
                        p.copy_(owner_value(source.owner, source.attr, device, seed, init_of[id(sub)]))
    if target != device:
        block.to(target)  # keeps the tie attributes: Module.to swaps parameter data in place
    return block


def owner_value(owner: nn.Module, attr: str, device: torch.device, seed: int,
                init: Callable[[nn.Module], Any]) -> torch.Tensor:
    """The value ``owner.<attr>`` gets when ``owner`` (a meta module) is materialized: made on a
    throwaway copy, so a stage can initialize a weight tied to a block it does not hold."""
    twin = copy.deepcopy(owner)
    for child in list(twin.children()):  # only the owner's own parameters matter
        child.to("meta")
    twin._parameters = {k: None if p is None else type(p)(torch.empty_like(p, device=device))
                        for k, p in twin._parameters.items()}
    _init_one(twin, getattr(owner, PATH, ""), seed, init)
    return getattr(twin, attr).detach()
