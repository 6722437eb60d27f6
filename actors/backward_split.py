"""A backward pass in two halves, for zero-bubble schedules: ``BI`` (input gradient) then ``W``.

``BI`` computes only the gradient of the stage's input, which the previous stage is waiting
for, and keeps what the weight gradients need; ``W`` computes those later (in a bubble) and
accumulates them into ``.grad``. The graph surgery is torch.distributed.pipelining's own
(``_backward.py``: the autograd nodes where weight gradients leave the input's path are found,
the gradients flowing into them are captured during ``BI`` and replayed into the weights during
``W``), so the weight gradients are the same kernels on the same values as in a whole backward,
accumulated in the same order: training stays bit-exact.

Two cases run whole instead, where the split has nothing to split: a stage input that needs no
gradient (the first stage, integer inputs) runs its entire backward at ``W`` (what torch does
for its first stage; nothing waits for its ``BI``), and a stage whose weights are not all reached
through the input's path (a parameter the captured nodes would miss) runs it entirely at ``BI``,
so no gradient is ever lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn
from torch.distributed.pipelining._backward import (
    _get_grad_fn_or_grad_acc,
    construct_reverse_graph,
    get_param_groups,
    stage_backward_weight,
)


@dataclass
class PendingWeights:
    """What ``W`` needs: the captured parameter groups, or a whole backward still to run."""

    param_groups: list[dict[str, Any]] | None = None
    whole: tuple[Tensor, Tensor] | None = None  # (output, its gradient): backward at W

    def run(self, params: Sequence[nn.Parameter], backward: Callable[[Tensor, Tensor], None],
            ready: Callable[[nn.Parameter], None] | None = None) -> None:
        """Accumulate the weight gradients. ``ready(p)``: called as soon as ``p``'s gradient is complete (the
        gradient sync of a replicated stage starts its buckets then, :mod:`actors.grad_sync`); a whole backward
        reports through the parameters' post-accumulate hooks instead."""
        if self.whole is not None:
            out, grad = self.whole
            backward(out, grad)
        elif self.param_groups and ready is None:
            stage_backward_weight(iter(params), self.param_groups)
        elif self.param_groups and ready is not None:  # group by group (torch's loop, one group per call)
            node_of = {_get_grad_fn_or_grad_acc(p): p for p in params}
            last = {n: k for k, group in enumerate(self.param_groups) for n in group["params"]}
            for k, group in enumerate(self.param_groups):
                mine = [node_of[n] for n in group["params"] if n in node_of]
                stage_backward_weight(iter(mine), [group])
                for n in group["params"]:
                    if last[n] == k and n in node_of:
                        ready(node_of[n])
        self.param_groups = self.whole = None


def backward_input(out: Tensor, grad: Tensor, x: Tensor | None, params: Sequence[nn.Parameter],
                   backward: Callable[[Tensor, Tensor], None]) -> tuple[Tensor | None, PendingWeights]:
    """The gradient of ``x`` (None when it needs none) and what ``W`` must still do.

    ``backward(out, grad)`` is the executor's whole backward (accumulating into ``.grad``)."""
    if not out.requires_grad:
        return None, PendingWeights()
    if x is None or not x.requires_grad:
        return None, PendingWeights(whole=(out, grad))
    out_node = _get_grad_fn_or_grad_acc(out)
    x_node = _get_grad_fn_or_grad_acc(x)
    weight_nodes = [n for n in (_get_grad_fn_or_grad_acc(p) for p in params if p.requires_grad) if n is not None]
    reverse = construct_reverse_graph([out_node] if out_node is not None else [])
    reached = [n for n in weight_nodes if n in reverse]
    groups = get_param_groups([x_node] if x_node is not None else [], reached, reverse)
    covered = set().union(*(g["params"] for g in groups)) if groups else set()
    if covered != set(reached) or x_node not in reverse:
        backward(out, grad)  # a weight off the input's path: no split (see the module docstring)
        return (x.grad if x.grad is not None else torch.zeros_like(x)), PendingWeights()
    handles = []
    try:
        for group in groups:
            group["intermediates"] = list(group["intermediates"])
            group["grads"] = [None] * len(group["intermediates"])
            for i, node in enumerate(group["intermediates"]):
                handles.append(node.register_prehook(_capture(group, i)))
        (dx,) = torch.autograd.grad((out,), (x,), (grad,), retain_graph=True, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    return (dx if dx is not None else torch.zeros_like(x)), PendingWeights(param_groups=groups)


def _capture(group: dict[str, Any], index: int) -> Callable[[Any], None]:
    def hook(grad_outputs: Any) -> None:
        group["grads"][index] = grad_outputs

    return hook
