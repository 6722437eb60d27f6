"""Weights tied across blocks (input and output embeddings), kept as one copy per block.

A pipeline cannot share one ``nn.Parameter`` between the first and the last stage, so each block
holds its own copy, the way Megatron-LM does: both copies start equal (the non-owner copy is
initialized with the owner's recipe, :func:`actors.materialize.owner_value`), their gradients
are summed before every optimizer step (the gradient the one shared parameter would have had),
and both optimizers then apply the same update, so the copies stay equal and training equals
that of the tied model.

Every parameter copy carries a :class:`Tie` (attribute ``_raypipe_tie``) naming the shared
weight; the owner's copy has ``owner=None``. :func:`tie_table` finds them in a block list; the
reference trainer sums them in-process (:func:`sum_local`), a stage worker with
:class:`TiedGrads`, over a process group of the devices that hold copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from actors.materialize import TIE
from actors.training import Reduce, all_reduce_sum


@dataclass(frozen=True)
class Tie:
    """One copy of the shared weight ``key``; ``owner`` is the (meta) module whose initializer
    makes its value, ``None`` on the owner's own copy."""

    key: str
    attr: str = "weight"
    owner: nn.Module | None = field(default=None, compare=False, repr=False)


def untie(holder: nn.Module, attr: str, owner: nn.Module, owner_attr: str, key: str) -> None:
    """Give ``holder.<attr>`` its own parameter, recorded as a copy of ``owner.<owner_attr>``."""
    shared = getattr(owner, owner_attr)
    setattr(shared, TIE, Tie(key, owner_attr, None))
    copy = nn.Parameter(torch.empty_like(shared, device="meta"), requires_grad=shared.requires_grad)
    setattr(copy, TIE, Tie(key, owner_attr, owner))
    holder.register_parameter(attr, copy)


def tied_params(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters() if hasattr(p, TIE)]


def tie_table(blocks: Sequence[nn.Module]) -> dict[str, list[tuple[int, str]]]:
    """Shared-weight key -> its copies as (block index, parameter name), in block order."""
    table: dict[str, list[tuple[int, str]]] = {}
    for b, block in enumerate(blocks):
        for name, p in tied_params(block):
            table.setdefault(getattr(p, TIE).key, []).append((b, name))
    return {k: v for k, v in table.items() if len(v) > 1}


def counted_once(blocks: Sequence[nn.Module]) -> int:
    """Parameters over all blocks, each shared weight counted once (what the tied model has)."""
    total = 0
    seen: set[str] = set()
    for block in blocks:
        for p in block.parameters():
            tie = getattr(p, TIE, None)
            if tie is not None:
                if tie.key in seen:
                    continue
                seen.add(tie.key)
            total += p.numel()
    return total


def _param(module: nn.Module, name: str) -> nn.Parameter:
    return module.get_parameter(name)


def _grad(p: nn.Parameter) -> Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def sum_local(modules: dict[int, nn.Module], table: dict[str, list[tuple[int, str]]]) -> None:
    """Every copy's gradient becomes the sum over the copies (all held in this process)."""
    for copies in table.values():
        params = [_param(modules[b], n) for b, n in copies]
        total = _grad(params[0]).clone()
        for p in params[1:]:
            total += _grad(p)
        for p in params:
            p.grad = total.clone()


class TiedGrads:
    """A stage worker's part in summing tied gradients: once per iteration, before its first
    optimizer step (every backward of the iteration has run by then; the lowering puts the
    steps last). Replicas of a stage hold equal, already all-reduced gradients, so only the
    first replica of each stage contributes; the others add zeros."""

    def __init__(
        self, table: dict[str, list[tuple[int, str]]], holders: dict[str, list[int]], device: int,
        first_replica_blocks: set[int], modules: dict[int, nn.Module], groups: dict[str, Any],
        reduce: Reduce = all_reduce_sum,
    ) -> None:
        self.device, self.modules, self.groups, self.reduce = device, modules, groups, reduce
        self.local = {k: [(b, n) for b, n in copies if b in modules] for k, copies in table.items()}
        self.local = {k: v for k, v in self.local.items() if v}
        self.contributes = first_replica_blocks
        self.holders = holders
        self.done_step = -1

    @classmethod
    def build(cls, table: dict[str, list[tuple[int, str]]], plan: Any, device: int, rank_of: dict[int, int],
              modules: dict[int, nn.Module], new_group: Callable[[list[int]], Any]) -> "TiedGrads | None":
        """Collective on every rank (groups are created in key order everywhere); ``None`` when
        the model ties nothing. ``table``: :func:`tie_table` of the model's blocks."""
        if not table:
            return None
        stage_of = {b: j for j, s in enumerate(plan.stages) for b in range(s.first, s.last)}
        holders: dict[str, list[int]] = {}
        groups: dict[str, Any] = {}
        for key in sorted(table):
            devs = sorted({d for b, _ in table[key] for d in plan.stages[stage_of[b]].devices})
            holders[key] = devs
            if len(devs) > 1:
                groups[key] = new_group(sorted(rank_of[d] for d in devs))
        first = {b for b in modules if plan.stages[stage_of[b]].devices[0] == device}
        return cls(table, holders, device, first, modules, groups)

    def before_step(self, step: int) -> None:
        if step == self.done_step:
            return
        self.done_step = step
        for key in sorted(self.local):
            params = [_param(self.modules[b], n) for b, n in self.local[key]]
            total: Tensor | None = None
            for (b, _), p in zip(self.local[key], params):
                if b in self.contributes:
                    total = _grad(p).clone() if total is None else total + _grad(p)
            if total is None:
                total = torch.zeros_like(params[0])
            if key in self.groups:
                self.reduce(total, self.groups[key])  # on the parameters' device, like the gradients
            for p in params:
                p.grad = total.clone()
