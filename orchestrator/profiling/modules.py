"""Any ``nn.Module`` as a chain of pipeline blocks: an ``nn.Sequential``, or a module cut at
split points named by module path (the idea of ``torch.distributed.pipelining``'s split points).

A cut module is traced with ``torch.fx`` and split with ``torch.fx.passes.split_module`` before
the first operation of each named submodule. Stages are a chain, so each block passes on
everything later blocks still need (a skip connection from block 0 to block 3 travels through
blocks 1 and 2): several tensors, tuples or dicts may cross a boundary, in both directions.

The runtime moves one batch-first tensor per boundary, so a boundary that carries anything else
is *packed*: the pytree leaves are flattened per row and concatenated into one tensor of a common
dtype (float32, or float64 when an integer tensor crosses, both exact for what they carry), and
the next block unpacks it. Packing is made of differentiable views and copies, so gradients flow
back to every floating tensor, and the bytes the profiler, simulator and planners count for a
boundary are those of all the tensors crossing it. Layouts come from one probe of the model on a
sample (on the meta device: no memory), so they are fixed per boundary, like the runtime's
buffers.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx
from torch import Tensor, nn
from torch.fx.passes.split_module import split_module
from torch.utils import _pytree as pytree

from actors import seeding
from actors.materialize import name_paths
from orchestrator.core.errors import UserError
from orchestrator.profiling.export import record_names


@dataclass(frozen=True)
class PackedLayout:
    """How a boundary value is packed: its pytree structure, each leaf's trailing shape and dtype."""

    spec: Any
    leaves: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    packed: torch.dtype

    @property
    def single(self) -> bool:
        """One plain tensor: crosses as it is."""
        return self.spec is None


def layout_of(value: Any, rows: int, where: str) -> PackedLayout:
    """The layout of a value crossing ``where``; a non-tensor leaf or one without the batch
    dimension cannot cross and is one line naming the boundary and the type."""
    if isinstance(value, Tensor):
        _check_rows(value, rows, where)
        return PackedLayout(None, ((tuple(value.shape[1:]), value.dtype),), value.dtype)
    leaves, spec = pytree.tree_flatten(value)
    for leaf in leaves:
        if not isinstance(leaf, Tensor):
            raise UserError(f"{where}: a value of type {type(leaf).__name__} cannot cross a stage boundary "
                            "(only batch-first tensors, in tuples, lists or dicts, can)")
        _check_rows(leaf, rows, where)
    exact_int = any(not (t.is_floating_point() or t.dtype == torch.bool) for t in leaves)
    return PackedLayout(spec, tuple((tuple(t.shape[1:]), t.dtype) for t in leaves), torch.float64 if exact_int else torch.float32)


def _check_rows(t: Tensor, rows: int, where: str) -> None:
    if t.dim() == 0 or int(t.shape[0]) != rows:
        raise UserError(f"{where}: a tensor of shape {tuple(t.shape)} cannot cross a stage boundary: "
                        f"its first dimension must be the batch ({rows} rows in the probe)")


def pack(value: Any, layout: PackedLayout) -> Tensor:
    if layout.single:
        return value
    leaves = pytree.tree_leaves(value)
    return torch.cat([t.reshape(t.shape[0], -1).to(layout.packed) for t in leaves], dim=1)


def unpack(x: Tensor, layout: PackedLayout) -> Any:
    if layout.single:
        return x
    sizes = [int(torch.Size(shape).numel()) for shape, _ in layout.leaves]
    parts = torch.split(x, sizes, dim=1)
    leaves = [p.reshape(x.shape[0], *shape).to(dtype) for p, (shape, dtype) in zip(parts, layout.leaves)]
    return pytree.tree_unflatten(leaves, layout.spec)


class Packed(nn.Module):
    """A block whose input and output boundaries may carry several tensors (see module docstring)."""

    def __init__(self, inner: nn.Module, into: PackedLayout, out: PackedLayout) -> None:
        super().__init__()
        self.inner, self.into, self.out = inner, into, out

    def forward(self, x: Tensor) -> Tensor:
        return pack(self.inner(unpack(x, self.into)), self.out)


def sequential_blocks(model: nn.Sequential, sample: Tensor | None = None) -> list[nn.Module]:
    """The children of ``model`` as blocks; with a ``sample`` input (one micro-batch), children
    that hand tuples or dicts to the next one are wrapped so those boundaries are packed.

    Dropout is seeded per (step, unit, block) with or without a sample, and the blocks carry
    ``model``'s state-dict names (:mod:`orchestrator.profiling.export`)."""
    if not isinstance(model, nn.Sequential):
        raise UserError(f"sequential_blocks needs an nn.Sequential, got {type(model).__name__}")
    blocks = list(model.children())
    if not blocks:
        raise UserError("the nn.Sequential has no children to use as blocks")
    if sample is None:
        for i, b in enumerate(blocks):
            seeding.seed_block(b, f"block{i}")
    else:
        blocks = chain(blocks, sample)
    record_names(model, blocks)
    return blocks


def chain(blocks: Sequence[nn.Module], sample: Tensor) -> list[nn.Module]:
    """``blocks`` with packed boundaries wherever a block returns more than one tensor."""
    rows = int(sample.shape[0])
    layouts = [layout_of(sample, rows, "the model input")]
    lazy = any(p.is_meta for b in blocks for p in b.parameters())  # built on the meta device: probe there
    x: Any = sample.to("meta") if lazy else sample
    with torch.no_grad():
        for i, block in enumerate(blocks):
            x = block(x)
            layouts.append(layout_of(x, rows, f"the output of block {i} ({type(block).__name__})"))
    if not layouts[-1].single:
        raise UserError(f"the last block ({type(blocks[-1]).__name__}) must return one tensor for the loss, "
                        f"got {type(x).__name__}")
    out = [b if layouts[i].single and layouts[i + 1].single else Packed(b, layouts[i], layouts[i + 1])
           for i, b in enumerate(blocks)]
    for i, b in enumerate(out):  # random draws from (step, unit, block), the same in one process
        seeding.seed_block(b, f"block{i}")
    return out


class _Step(nn.Module):
    """One piece of a traced module: takes the values alive before it, returns those alive after."""

    def __init__(self, sub: nn.Module, into: tuple[str, ...], args: tuple[str, ...], results: tuple[tuple[str, int | None], ...],
                 out: tuple[str, ...]) -> None:
        super().__init__()
        self.sub, self.into, self.args, self.results, self.out = sub, into, args, results, out

    def forward(self, live: Any) -> Any:
        env = dict(zip(self.into, live if len(self.into) > 1 else (live,))) if self.into else {}
        result = self.sub(*(env[a] for a in self.args))
        for name, index in self.results:
            env[name] = result if index is None else result[index]
        values = tuple(env[n] for n in self.out)
        return values if len(values) > 1 else values[0]


def split_at(model: nn.Module, split_points: Sequence[str], sample: Tensor) -> list[nn.Module]:
    """Cut ``model`` before each named submodule (paths as in ``named_modules()``, in execution
    order); ``sample`` is one micro-batch of the model's single input (shapes only)."""
    names = dict(model.named_modules())
    for point in split_points:
        if not point or point not in names:
            close = [n for n in names if n and n.split(".")[-1] == point.split(".")[-1]][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UserError(f"split point {point!r} names no submodule of {type(model).__name__}{hint}")
    try:
        traced = torch.fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - fx refuses data-dependent control flow etc.
        raise UserError(f"{type(model).__name__} cannot be traced by torch.fx to cut it at split points: "
                        f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UserError(f"{type(model).__name__}.forward takes {len(placeholders)} inputs; a pipeline feeds it one tensor")
    name_paths(model)  # init seeds by path (actors/materialize.py), whatever the cut
    part = _partition(traced, list(split_points))
    top = split_module(traced, model, lambda node: part[node.name])
    blocks = chain(_steps(top), sample)
    record_names(model, blocks)  # trained weights come back under the model's own names
    return blocks


def _belongs(node: torch.fx.Node, point: str) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    paths = list(stack.keys()) + ([str(node.target)] if node.op in ("call_module", "get_attr") else [])
    return any(p == point or p.startswith(point + ".") for p in paths)


def _partition(traced: torch.fx.GraphModule, points: list[str]) -> dict[str, int]:
    part: dict[str, int] = {}
    current = 0
    for node in traced.graph.nodes:
        if node.op in ("placeholder", "output"):
            part[node.name] = 0 if node.op == "placeholder" else current
            continue
        while current < len(points) and _belongs(node, points[current]):
            current += 1
        for k in range(current + 1, len(points)):
            if _belongs(node, points[k]):
                raise UserError(f"split point {points[k]!r} runs before {points[current] if current < len(points) else points[-1]!r}: "
                                "give split points in execution order")
        part[node.name] = current
    missing = points[current:]
    if missing:
        raise UserError(f"split point {missing[0]!r} is never called in {type(traced).__name__}.forward")
    return part


def _steps(top: torch.fx.GraphModule) -> list[nn.Module]:
    """The split graph as a chain of :class:`_Step` blocks passing every value still needed."""
    nodes = list(top.graph.nodes)
    calls = [n for n in nodes if n.op == "call_module"]
    output = next(n for n in nodes if n.op == "output")
    produced_by: dict[str, int] = {n.name: -1 for n in nodes if n.op == "placeholder"}
    results: list[list[tuple[str, int | None]]] = [[] for _ in calls]
    for i, call in enumerate(calls):
        getitems = [u for u in call.users if u.op == "call_function" and u.target is operator.getitem]
        if getitems and len(getitems) == len(call.users):
            for g in getitems:
                results[i].append((g.name, int(g.args[1])))
                produced_by[g.name] = i
        else:
            results[i].append((call.name, None))
            produced_by[call.name] = i
    used_by: dict[str, int] = {}
    for i, call in enumerate(calls):
        for a in call.args:
            used_by[a.name] = max(used_by.get(a.name, -1), i)
    final = output.args[0]
    if not isinstance(final, torch.fx.Node):
        raise UserError("the model must return one tensor for the loss")
    used_by[final.name] = len(calls)
    order = list(produced_by)  # placeholders first, then in production order
    steps: list[nn.Module] = []
    for i, call in enumerate(calls):
        into = tuple(n for n in order if produced_by[n] < i and used_by.get(n, -1) >= i)
        out = tuple(n for n in order if produced_by[n] <= i and used_by.get(n, -1) > i)
        steps.append(_Step(getattr(top, str(call.target)), into, tuple(a.name for a in call.args), tuple(results[i]), out))
    return steps
