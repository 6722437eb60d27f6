"""Read PipeDream/DAPPLE ``graph.txt`` per-node profiles into a chain :class:`Profile`.

The planners only understand a chain of blocks, but these files describe a DAG (residual
branches, Inception/NASNet cells, LSTM state outputs, transformer attention masks). A pipeline
stage boundary is only sound where the model can be split in two with *one* tensor flowing
across (the PipeDream antichain of size 1), so we topologically order the nodes, find the
positions where that holds, and merge everything between two such cuts into one block.

One pragmatic extension: tensors that never receive a gradient (every node up to and including
their producer has zero backward time -- attention masks, one-hot segment ids, dropout masks in
the DAPPLE transformer files) are forwarded to each later stage but do not forbid a cut;
otherwise a BERT whose mask feeds all 24 layers could never be pipelined at all. Their bytes are
added to the bytes crossing each cut they span. The data-loader ``Input`` nodes are exempt from
that byte count because every stage can read the batch itself.

Blocks with neither backward time nor parameters (reshapes, masks, the zeroed ``Input``) carry
no training work worth a boundary of their own, so they are folded into the following block.
"""

from __future__ import annotations

import math
import re

import networkx as nx
import numpy as np

from orchestrator.errors import UserError
from orchestrator.profile import Block, Profile

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


def parse_graph_txt(text: str, name: str, source: str = "") -> Profile:
    """Parse a graph.txt profile (times in ms per profiled batch) into a chain profile in seconds.

    The profiled batch becomes one micro-batch; its size comes from ``pbs-K`` in ``source``
    (DAPPLE names), else from the Input node's activation as a whole number of 224x224 (or
    299x299) RGB fp32 images, else 1. Malformed input raises UserError("<source>:<line>: ...").
    """
    origin = source or name or "<graph>"
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
    input_bytes = float(data[is_input, 2].sum())
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

    order, side = _order(graph, data[:, 1], ids)
    blocks = _linearize(graph, order, side, is_input, data, ids, ops)
    return Profile(
        name=name,
        blocks=tuple(blocks),
        microbatch_size=_microbatch_size(source, input_bytes),
        input_bytes=input_bytes,
        source=source,
    )


def _microbatch_size(source: str, input_bytes: float) -> int:
    match = _PBS.search(source)
    if match and int(match.group(1)) >= 1:
        return int(match.group(1))
    for per_image in _IMAGE_BYTES:
        images = input_bytes / per_image
        if images >= 1 and abs(images - round(images)) < 1e-9:
            return int(round(images))
    return 1


def _order(graph: nx.DiGraph, backward_ms: np.ndarray, ids: list[str]) -> tuple[list[int], np.ndarray]:
    """A topological order that keeps gradient-free side nodes early, plus the side-node mask.

    True cut vertices sit at the same position in every topological order, so the order only
    matters for nodes unrelated to the trunk; placing side inputs first keeps them from landing
    between two trunk nodes, where they would block a cut.
    """
    side = np.zeros(len(ids), dtype=bool)
    for v in nx.topological_sort(graph):
        side[v] = backward_ms[v] == 0 and all(side[u] for u in graph.predecessors(v))

    def key(v: int) -> tuple[int, int, int]:
        m = _TRAILING_INT.search(ids[v])
        return (0 if side[v] else 1, int(m.group(1)) if m else 1 << 62, v)

    return list(nx.lexicographical_topological_sort(graph, key=key)), side


def _linearize(
    graph: nx.DiGraph,
    order: list[int],
    side: np.ndarray,
    is_input: np.ndarray,
    data: np.ndarray,
    ids: list[str],
    ops: list[str],
) -> list[Block]:
    """Cut the ordered nodes at every legal position and sum each piece into a Block."""
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order)] = np.arange(n)
    edge_arr = np.array(list(graph.edges()), dtype=np.int64).reshape(-1, 2)
    src_pos, dst_pos = pos[edge_arr[:, 0]], pos[edge_arr[:, 1]]

    # A cut after position k is blocked by a gradient-carrying edge u->w with pos(u) < k < pos(w).
    hard = ~side[edge_arr[:, 0]]
    blocked = np.zeros(n + 1, dtype=np.int64)
    np.add.at(blocked, src_pos[hard] + 1, 1)
    np.add.at(blocked, dst_pos[hard], -1)
    blocked = np.cumsum(blocked)[:n]
    # Bytes of gradient-free side tensors still needed downstream of each cut.
    extra = np.zeros(n + 1, dtype=np.float64)
    last_use = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_use, edge_arr[:, 0], dst_pos)
    for v in np.flatnonzero(side & ~is_input & (last_use >= 0)):
        lo, hi = pos[v] + 1, last_use[v]
        if hi > lo:
            extra[lo] += data[v, 2]
            extra[hi] -= data[v, 2]
    extra = np.cumsum(extra)[:n]

    ends = np.flatnonzero(blocked[: n - 1] <= 0).tolist() + [n - 1]
    ordered = data[np.asarray(order)]
    # Sum each piece directly (reduceat), not as prefix-sum differences, so an all-zero piece
    # stays exactly zero and block values are as clean as the file's.
    pieces = np.add.reduceat(ordered, np.asarray([0] + [e + 1 for e in ends[:-1]]), axis=0)
    # Fold pieces without backward work or parameters into their successor (the last one into
    # its predecessor): a boundary there would only add a stage hop, never balance compute.
    useful = (pieces[:, 1] > 0) | (pieces[:, 3] > 0)
    kept = [end for end, ok in zip(ends[:-1], useful[:-1]) if ok] + [n - 1]
    if len(kept) > 1 and not useful[-1]:
        kept.pop(-2)
    starts = [0] + [e + 1 for e in kept[:-1]]
    works = np.add.reduceat(ordered, np.asarray(starts), axis=0)

    blocks: list[Block] = []
    for start, end, work in zip(starts, kept, works):
        members = order[start : end + 1]
        last_node = members[-1]
        # The cut node's output crosses if something after it reads it (or it is the model output).
        sends = float(end == n - 1 or last_use[last_node] > end)
        main = members[int(np.argmax(data[members, 0] + data[members, 1]))]  # name by heaviest node
        label = f"{ids[main]}:{ops[main].split('(')[0][:40]}"
        if end > start:
            label += f"+{end - start}"
        blocks.append(
            Block(
                name=label,
                forward_s=float(work[0]) / 1000.0,
                backward_s=float(work[1]) / 1000.0,
                activation_bytes=float(data[last_node, 2] * sends + extra[end]),
                param_bytes=float(work[3]),
                stash_bytes=float(work[2]),
            )
        )
    return blocks
