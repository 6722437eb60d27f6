"""Read a profile file: our JSON, or PipeDream/DAPPLE ``graph.txt`` per-node profiles cut into a chain :class:`Profile`.

The planners only understand a chain of blocks, but these files describe a DAG (residual
branches, Inception/NASNet cells, LSTM state outputs, transformer attention masks). Any prefix of
a topological order is downward closed -- nothing before it reads anything after it -- so a
pipeline boundary may fall after any position of such an order; what crosses it is every tensor
produced before it and read after it (PipeDream's antichain cut: several tensors, each counted
once however many later nodes read it). The profile is that order cut into one block per node with
training work, each boundary placed where the fewest bytes cross among the positions between two
such nodes; a block's ``activation_bytes`` is the total crossing its boundary, which is all that
the planners, the simulator and the controller read. This is what lets a 4-worker GNMT plan reach
PipeDream's own optimum (its cuts are crossed by the LSTM state, the attention context and the
residual at once), where cutting only where one tensor crosses could not.

The order keeps gradient-free side inputs (attention masks, one-hot segment ids, dropout masks in
the DAPPLE transformer files) first and otherwise follows the nodes' numbering, which is the
model's program order in these files. The data-loader ``Input`` nodes never count as crossing:
every stage can read the batch itself. The chain is not thinned: a planner that cannot afford its
length plans on a coarsened copy (:mod:`orchestrator.core.coarsen`), the others see every cut.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import networkx as nx
import numpy as np

from orchestrator.core.coarsen import thin
from orchestrator.core.errors import UserError
from orchestrator.core.files import parse_json, read_text
from orchestrator.core.profile import Block, Profile

_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_INPUT_OP = re.compile(r"Input\d*$")
_PBS = re.compile(r"pbs-(\d+)")
_TRAILING_INT = re.compile(r"(\d+)$")
#: Bytes of one 3xHxW fp32 image (224: most CNNs, 299: Inception); PipeDream's image profiles
#: record the batch size only through the Input activation.
_IMAGE_BYTES = (3 * 224 * 224 * 4, 3 * 299 * 299 * 4)


def _number(text: str, where: str, key: str) -> float:
    """One finite, non-negative float, or a ``[a; b; c]`` list summed (multi-output nodes)."""
    text = text.strip()
    parts = text[1:-1].split(";") if text.startswith("[") and text.endswith("]") else [text]
    total = 0.0
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise UserError(f"{where}: {key} is not a number: {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise UserError(f"{where}: {key} must be finite and >= 0, got {text!r}")
        total += value
    return total


def _parse_stats(text: str, where: str) -> list[float]:
    values: dict[str, float] = {}
    for item in text.split(","):
        key, eq, raw = item.strip().partition("=")
        if not eq or key not in _FIELDS:
            raise UserError(f"{where}: unknown field {item.strip()!r} (expected {', '.join(_FIELDS)})")
        if key in values:
            raise UserError(f"{where}: duplicate field {key!r}")
        values[key] = _number(raw, where, key)
    missing = [k for k in _FIELDS if k not in values]
    if missing:
        raise UserError(f"{where}: missing field(s) {', '.join(missing)}")
    return [values[k] for k in _FIELDS]


@dataclass(frozen=True)
class Graph:
    """The parsed file: per node id, op text and ``[fwd ms, bwd ms, activation B, param B]``."""

    ids: list[str]
    ops: list[str]
    data: np.ndarray
    is_input: np.ndarray
    graph: nx.DiGraph


def parse_graph_txt(text: str, name: str, source: str = "", max_blocks: int | None = None) -> Profile:
    """Parse a graph.txt profile (times in ms per profiled batch) into a chain profile in seconds.

    The profiled batch becomes one micro-batch; its size comes from ``pbs-K`` in ``source``
    (DAPPLE names), else from the Input node's activation as a whole number of 224x224 (or
    299x299) RGB fp32 images, else 1. Malformed input raises UserError("<source>:<line>: ...").
    ``max_blocks`` (default: none) caps the chain's length (:func:`~orchestrator.core.coarsen.thin`).
    """
    return chain_profile(read_graph(text, source or name or "<graph>"), name, source, max_blocks)


def chain_profile(g: Graph, name: str, source: str = "", max_blocks: int | None = None, chain: Sequence[str] | None = None) -> Profile:
    """The graph as a chain profile, in the loader's order or in ``chain`` (node ids, a topological
    order of every node: :func:`node_order` checks it). Another order is another set of prefixes,
    so other pipeline cuts: :mod:`orchestrator.planners.pipedream_graph` picks one for PipeDream's DP."""
    order, ends, crossing = _chain(g, max_blocks, None if chain is None else node_order(g, chain))
    data = g.data
    ordered = data[np.asarray(order)]
    starts = [0] + [e + 1 for e in ends[:-1]]
    works = np.add.reduceat(ordered, np.asarray(starts), axis=0)
    n = len(order)
    blocks: list[Block] = []
    for start, end, work in zip(starts, ends, works):
        members = order[start : end + 1]
        main = members[int(np.argmax(data[members, 0] + data[members, 1]))]  # name by heaviest node
        label = f"{g.ids[main]}:{g.ops[main].split('(')[0][:40]}"
        if end > start:
            label += f"+{end - start}"
        # The last block sends the model's output; every other one what crosses its boundary.
        out = float(data[order[-1], 2]) if end == n - 1 else float(crossing[end])
        blocks.append(
            Block(
                name=label,
                forward_s=float(work[0]) / 1000.0,
                backward_s=float(work[1]) / 1000.0,
                activation_bytes=out,
                param_bytes=float(work[3]),
                stash_bytes=float(work[2]),
            )
        )
    input_bytes = float(data[g.is_input, 2].sum())
    return Profile(
        name=name,
        blocks=tuple(blocks),
        microbatch_size=_microbatch_size(source, input_bytes),
        input_bytes=input_bytes,
        source=source,
    )


def block_nodes(text: str, source: str = "", max_blocks: int | None = None, chain: Sequence[str] | None = None) -> list[tuple[str, ...]]:
    """The node ids of each block of :func:`parse_graph_txt`'s chain (or of ``chain``'s), in order.

    Maps a plan's block ranges back to the graph's nodes (what PipeDream writes as ``stage_id``).
    """
    g = read_graph(text, source or "<graph>")
    order, ends, _ = _chain(g, max_blocks, None if chain is None else node_order(g, chain))
    starts = [0] + [e + 1 for e in ends[:-1]]
    return [tuple(g.ids[v] for v in order[a : b + 1]) for a, b in zip(starts, ends)]


def node_order(g: Graph, chain: Sequence[str]) -> list[int]:
    """``chain``'s node ids as indices, checked: every node once, each after all it reads."""
    index = {v: i for i, v in enumerate(g.ids)}
    unknown = [v for v in chain if v not in index]
    if unknown:
        raise UserError(f"chain names node {unknown[0]!r}, which the graph does not have")
    order = [index[v] for v in chain]
    if len(set(order)) != len(order) or len(order) != len(g.ids):
        raise UserError(f"chain must name each of the graph's {len(g.ids)} nodes once, got {len(order)} names ({len(set(order))} distinct)")
    pos = np.empty(len(order), dtype=np.int64)
    pos[np.asarray(order)] = np.arange(len(order))
    for u, v in g.graph.edges():
        if pos[u] > pos[v]:
            raise UserError(f"chain puts node {g.ids[v]!r} before {g.ids[u]!r}, which it reads")
    return order


def read_graph(text: str, origin: str) -> Graph:
    ids: list[str] = []
    ops: list[str] = []
    stats: list[list[float]] = []
    index: dict[str, int] = {}
    edges: list[tuple[str, str, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        where = f"{origin}:{lineno}"
        parts = [p.strip() for p in line.split(" -- ")]
        if parts and parts[-1].startswith("stage_id="):
            parts.pop()  # optimizer output annotation; the plan is ours to make
        if len(parts) == 2:
            edges.append((parts[0], parts[1], lineno))
        elif len(parts) >= 3:
            node_id = parts[0]
            if not node_id:
                raise UserError(f"{where}: empty node id")
            if node_id in index:
                raise UserError(f"{where}: node {node_id!r} defined twice")
            index[node_id] = len(ids)
            ids.append(node_id)
            ops.append(" -- ".join(parts[1:-1]))
            stats.append(_parse_stats(parts[-1], where))
        else:
            raise UserError(f"{where}: expected 'id -- op -- stats' or 'src -- dst', got {line[:60]!r}")
    if not ids:
        raise UserError(f"{origin}: no nodes in graph")
    for src, dst, lineno in edges:
        for end in (src, dst):
            if end not in index:
                raise UserError(f"{origin}:{lineno}: edge refers to undefined node {end!r}")


    n = len(ids)
    data = np.array(stats, dtype=np.float64)  # columns: fwd ms, bwd ms, activation B, param B
    is_input = np.array([bool(_INPUT_OP.match(op)) for op in ops])
    data[is_input, 0] = 0.0  # data-loading time, not model compute

    graph: nx.DiGraph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    edge_line: dict[tuple[int, int], int] = {}
    for src, dst, lineno in edges:
        key = (index[src], index[dst])
        edge_line.setdefault(key, lineno)
        graph.add_edge(*key)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        first = min(edge_line[(int(u), int(v))] for u, v in cycle)
        path = " -> ".join(ids[int(u)] for u, _ in cycle) + f" -> {ids[int(cycle[0][0])]}"
        raise UserError(f"{origin}:{first}: edges form a cycle ({path})")
    return Graph(ids, ops, data, is_input, graph)


def _microbatch_size(source: str, input_bytes: float) -> int:
    match = _PBS.search(source)
    if match and int(match.group(1)) >= 1:
        return int(match.group(1))
    for per_image in _IMAGE_BYTES:
        images = input_bytes / per_image
        if images >= 1 and abs(images - round(images)) < 1e-9:
            return int(round(images))
    return 1


def default_order(g: Graph) -> list[int]:
    """A topological order with gradient-free side nodes first, then by the ids' numbering.

    Side inputs first keeps them out of the trunk's run of nodes; numbering keeps each branch
    of a cell together, as the model's program runs it, so the cuts inside a branch carry that
    branch's tensor plus the cell's inputs rather than half-finished work of several branches.
    """
    graph, backward_ms, ids = g.graph, g.data[:, 1], g.ids
    side = np.zeros(len(ids), dtype=bool)
    for v in nx.topological_sort(graph):
        side[v] = backward_ms[v] == 0 and all(side[u] for u in graph.predecessors(v))

    def key(v: int) -> tuple[int, int, int]:
        m = _TRAILING_INT.search(ids[v])
        return (0 if side[v] else 1, int(m.group(1)) if m else 1 << 62, v)

    return list(nx.lexicographical_topological_sort(graph, key=key))


def _chain(g: Graph, max_blocks: int | None, order: list[int] | None = None) -> tuple[list[int], list[int], np.ndarray]:
    """(order, last position of each block, bytes crossing a cut after each position), in
    :func:`default_order` unless ``order`` is given.

    One block per node with backward work or parameters. Between two such nodes lie only nodes
    without either (``__getitem__``, ``Add``, ``Concat``, reshapes), so every position between
    them splits the training work alike; the boundary goes where the fewest bytes cross (after a
    multi-output LSTM's getitems rather than before them), the earliest on ties.
    """
    if max_blocks is not None and max_blocks < 1:
        raise UserError(f"max_blocks must be >= 1, got {max_blocks}")
    order = default_order(g) if order is None else order
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order)] = np.arange(n)
    edge_arr = np.array(list(g.graph.edges()), dtype=np.int64).reshape(-1, 2)
    last_use = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_use, edge_arr[:, 0], pos[edge_arr[:, 1]])
    # crossing[k]: bytes of every tensor produced at or before position k and read after it.
    diff = np.zeros(n + 1, dtype=np.float64)
    live = np.flatnonzero(~g.is_input & (last_use > pos))
    np.add.at(diff, pos[live], g.data[live, 2])
    np.add.at(diff, last_use[live], -g.data[live, 2])
    crossing = np.cumsum(diff)[:n]

    ordered = g.data[np.asarray(order)]
    useful = np.flatnonzero((ordered[:, 1] > 0) | (ordered[:, 3] > 0))
    ends: list[int] = []
    for a, b in zip(useful[:-1], useful[1:]):
        window = crossing[a:b]
        ends.append(int(a + np.flatnonzero(window <= window.min())[0]))
    if max_blocks is not None:
        ends = thin(ends, crossing, np.cumsum(ordered[:, 0] + ordered[:, 1]), max_blocks)
    return order, ends + [n - 1], crossing


def load_profile(path: str | os.PathLike[str], chain: Sequence[str] | None = None) -> Profile:
    """Load a profile from our JSON or a PipeDream/DAPPLE ``graph.txt``, by content; ``chain``: a
    graph's node ids in the order to chain them (a plan made on another order names it)."""
    return load_source(path, chain)[0]


def load_source(path: str | os.PathLike[str], chain: Sequence[str] | None = None) -> tuple[Profile, Graph | None]:
    """:func:`load_profile`, and the graph a graph.txt profile was chained from (None for our JSON),
    for a caller that may chain it in another order (``orchestrator plan`` with ``pipedream``)."""
    p = Path(path)
    text = read_text(p, "profile")
    if text.lstrip().startswith("{"):
        if chain is not None:
            raise UserError(f"profile {p} is a chain already: only a graph.txt profile can be chained in another order")
        return Profile.from_dict(parse_json(text, p, "profile"), origin=f"profile {p}"), None
    g = read_graph(text, str(p))
    return chain_profile(g, graph_name(p), str(p), chain=chain), g


def graph_name(path: str | os.PathLike[str]) -> str:
    """A graph.txt profile's name: its folder's (PipeDream's layout), else the file's stem."""
    p = Path(path)
    return p.parent.name if p.name == "graph.txt" else p.stem
