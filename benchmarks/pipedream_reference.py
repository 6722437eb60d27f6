"""Pure-Python transcription of PipeDream's optimizer (the reference), MIT, msr-fiddle/pipedream.

Two uses, both only from ``benchmarks/planners.py``:

* :func:`solve` runs ``optimizer/optimizer_graph_hierarchical.py``'s ``compute_partitioning``
  (the same loops over i, j, m, k, m' on Python lists) on our chain profile, where the
  predecessors of state j are all states before it: it times our vectorized planner against the
  published DP on the same input.
* :func:`solve_graph` runs the published optimizer on a ``graph.txt`` itself: ``main``'s
  preprocessing (Input sources zeroed and removed, ``__getitem__`` sinks removed), ``graph/graph.py``'s
  antichain DAG (augmented antichains, next antichains, breadth-first from the first source), the
  per-state sums over all predecessors and the same DP over antichain-DAG predecessors. This is
  the value our loader's chain is compared with ("published optimizer" in planners.md). The
  number of antichain states explodes on Inception/NASNet cells (221 564 for Inception-v3), so
  the caller runs it under a timeout.

Settings as the published optimizer runs: no memory constraint, ``use_fewer_machines``, and
transfers counted (the original counts them when an activation compression ratio is given; we
pass 1.0); ``straight`` is ``--straight_pipeline``.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from orchestrator.core.profile import Profile

STRAIGHT = False
USE_FEWER_MACHINES = True
ACTIVATION_COMPRESSION_RATIO = 1.0


def compute_partitioning(compute_times: list[list[Any]], parameter_sizes: list[list[Any]], output_activation_sizes: list[float],
                         num_machines: int, num_machines_within_machine: int, bandwidth: float, final_level: bool = True,
                         straight: bool = STRAIGHT, all_predecessor_ids: list[list[int]] | None = None) -> list[Any]:
    """``all_predecessor_ids[j]``: the states that may end the stage before one ending at j (None: a chain)."""
    preds = all_predecessor_ids if all_predecessor_ids is not None else [list(range(j)) for j in range(len(compute_times[0]))]
    A: list[Any] = []
    for i in range(len(compute_times)):
        row_A = []
        for j in range(len(compute_times[0])):
            row_A.append([(None, None, None) for _ in range(num_machines)])
        A.append(row_A)
    for i in range(len(compute_times)):
        for j in range(i, len(compute_times[0])):
            cum_compute_time = compute_times[i][j]
            cum_parameter_size = parameter_sizes[i][j]
            max_m = 1 if straight else num_machines
            for m in range(max_m):
                if cum_compute_time is None:
                    A[i][j][m] = (None, None, None)
                    continue
                dp_time = (4 * m * cum_parameter_size) / (bandwidth * (m + 1))
                dp_time /= num_machines_within_machine
                A[i][j][m] = (sum([cum_compute_time, dp_time]) / (m + 1), None, (m + 1))
    max_i = len(compute_times) if not final_level else 1
    for i in range(max_i):
        for m in range(1, num_machines):
            for j in range(i + 1, len(compute_times[0])):
                (min_pipeline_time, optimal_split, optimal_num_machines) = A[i][j][m]
                if USE_FEWER_MACHINES and m > 0 and (min_pipeline_time is None or (A[i][j][m - 1][0] is not None and A[i][j][m - 1][0] < min_pipeline_time)):
                    (min_pipeline_time, optimal_split, optimal_num_machines) = A[i][j][m - 1]
                for k in preds[j]:
                    if i > 0 and k in preds[i - 1]:
                        continue
                    max_m_prime = 2 if straight else (m + 1)
                    for m_prime in range(1, max_m_prime):
                        input_transfer_time = (2.0 * output_activation_sizes[k]) / (bandwidth * m_prime)
                        output_transfer_time = None
                        if j < len(output_activation_sizes) - 1:
                            output_transfer_time = (2.0 * output_activation_sizes[j]) / (bandwidth * m_prime)
                        last_stage_time = compute_times[k + 1][j]
                        if last_stage_time is None:
                            continue
                        last_stage_parameter_size = parameter_sizes[k + 1][j]
                        last_stage_time = sum([last_stage_time, ((4 * (m_prime - 1) * last_stage_parameter_size) / (bandwidth * m_prime))])
                        last_stage_time /= m_prime
                        if A[i][k][m - m_prime][0] is None:
                            continue
                        pipeline_time = max(A[i][k][m - m_prime][0], last_stage_time)
                        input_transfer_time /= ACTIVATION_COMPRESSION_RATIO
                        pipeline_time = max(pipeline_time, input_transfer_time)
                        if output_transfer_time is not None:
                            output_transfer_time /= ACTIVATION_COMPRESSION_RATIO
                            pipeline_time = max(pipeline_time, output_transfer_time)
                        if min_pipeline_time is None or min_pipeline_time > pipeline_time:
                            optimal_split = (k, m - m_prime)
                            optimal_num_machines = m_prime
                            min_pipeline_time = pipeline_time
                A[i][j][m] = (min_pipeline_time, optimal_split, optimal_num_machines)
    return A


def tables(profile: Profile) -> tuple[list[list[Any]], list[list[Any]], list[float]]:
    """The optimizer's (L+1) x L range tables built from the chain's cumulative sums."""
    L = profile.num_blocks
    cum_c = [profile.compute_time(0, j + 1) for j in range(L)]
    cum_p = [profile.param_bytes(0, j + 1) for j in range(L)]
    ct: list[list[Any]] = []
    pt: list[list[Any]] = []
    for i in range(L + 1):
        if i == 0:
            ct.append(list(cum_c))
            pt.append(list(cum_p))
        else:
            ct.append([cum_c[j] - cum_c[i - 1] if j > i - 1 else None for j in range(L)])
            pt.append([cum_p[j] - cum_p[i - 1] if j > i - 1 else None for j in range(L)])
    return ct, pt, [float(a) for a in profile.activations]


def solve(profile: Profile, levels: list[tuple[int, float]]) -> float:
    """Run the hierarchical optimizer; ``levels`` = [(machines, bandwidth bytes/s), ...] inner first.
    Returns the optimum pipeline time (the bottleneck) at the top level."""
    ct, pt, acts = tables(profile)
    within = 1
    A: list[Any] = []
    for n, (machines, bw) in enumerate(levels):
        A = compute_partitioning(ct, pt, acts, machines, within, bw, final_level=(n == len(levels) - 1))
        within = machines
        for i in range(len(ct)):
            for j in range(len(ct[0])):
                ct[i][j] = A[i][j][-1][0]
    return float(A[0][profile.num_blocks - 1][-1][0])


# ----------------------------------------------------------------------------- the graph itself
class _Node:
    def __init__(self, node_id: str, desc: str, fwd: float, bwd: float, act: float, params: float) -> None:
        self.node_id, self.node_desc = node_id, desc
        self.forward_compute_time, self.backward_compute_time = fwd, bwd
        self.activation_size, self.parameter_size = act, params


class _Graph:
    """graph/graph.py's Graph, reduced to what the optimizer calls (same data structures)."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.edges: dict[str, list[_Node]] = {}
        self.in_edges: dict[str, list[_Node]] = {}
        self._predecessors: dict[str, set[_Node]] = {}
        self._successors: dict[str, set[_Node]] = {}
        self._augmented: dict[tuple[str, ...], list[str]] = {}
        self._deaugmented: dict[tuple[str, ...], list[str]] = {}
        self._next: dict[tuple[str, ...], list[list[str]]] = {}

    @staticmethod
    def from_str(text: str) -> "_Graph":
        gr = _Graph()
        for line in text.strip().split("\n"):
            if not line.startswith("\t"):
                tok = line.strip().split(" -- ")
                stats = dict(kv.split("=", 1) for kv in tok[2].split(", "))
                act = stats["activation_size"]
                size = sum(float(x) for x in act.strip("[]").split("; ")) if "[" in act else float(act)
                gr.nodes[tok[0]] = _Node(tok[0], tok[1], float(stats["forward_compute_time"]),
                                         float(stats["backward_compute_time"]), size, float(stats["parameter_size"]))
            else:
                src, dst = (t.strip() for t in line.strip().split(" -- "))
                gr.add_edge(gr.nodes[src], gr.nodes[dst])
        return gr

    def add_edge(self, a: _Node, b: _Node) -> None:
        self.in_edges.setdefault(b.node_id, []).append(a)
        self.edges.setdefault(a.node_id, []).append(b)

    def sources(self) -> list[_Node]:
        return [n for i, n in self.nodes.items() if i not in self.in_edges or not self.in_edges[i]]

    def sinks(self) -> list[_Node]:
        return [n for i, n in self.nodes.items() if i not in self.edges or not self.edges[i]]

    def remove_node(self, node: _Node) -> None:
        del self.nodes[node.node_id]
        for out in self.edges.pop(node.node_id, []):
            self.in_edges[out.node_id].remove(node)
        for inn in self.in_edges.pop(node.node_id, []):
            self.edges[inn.node_id].remove(node)

    def predecessors(self, node: str) -> set[_Node]:
        if node in self._predecessors:
            return self._predecessors[node]
        preds: set[_Node] = set()
        if node not in self.in_edges:
            return preds
        for inn in self.in_edges[node]:
            preds.add(inn)
            preds.update(self.predecessors(inn.node_id))
        self._predecessors[node] = preds
        return preds

    def successors(self, node: str) -> set[_Node]:
        if node in self._successors:
            return self._successors[node]
        succ: set[_Node] = set()
        if node not in self.edges:
            return succ
        for out in self.edges[node]:
            succ.add(out)
            succ.update(self.successors(out.node_id))
        self._successors[node] = succ
        return succ

    def all_predecessors(self, antichain: list[str]) -> set[_Node]:
        out: set[_Node] = set()
        for a in antichain:
            out.update(self.predecessors(a))
            out.add(self.nodes[a])
        return out

    def augment_antichain(self, antichain: list[str]) -> list[str]:
        key = tuple(sorted(antichain))
        if key in self._augmented:
            return self._augmented[key]
        extra: set[str] = set()
        for a in antichain:
            preds = self.predecessors(a)
            for p in preds:
                for out in self.edges[p.node_id]:
                    if out not in preds and out.node_id != a:
                        extra.add(p.node_id)
        self._augmented[key] = list(extra) + antichain
        return self._augmented[key]

    def deaugment_augmented_antichain(self, augmented: list[str]) -> list[str]:
        key = tuple(sorted(augmented))
        if key in self._deaugmented:
            return self._deaugmented[key]
        remove: set[str] = set()
        for a in augmented:
            succ = self.successors(a)
            for b in augmented:
                if self.nodes[b] in succ:
                    remove.add(a)
        antichain: list[str] = []
        for a in augmented:
            if a not in remove and a not in antichain:
                antichain.append(a)
        self._deaugmented[key] = antichain
        return antichain

    def next_antichains(self, antichain: list[str]) -> list[list[str]]:
        key = tuple(sorted(antichain))
        if key in self._next:
            return self._next[key]
        out: list[list[str]] = []
        chain_set = set(antichain)
        augmented = self.augment_antichain(antichain)
        aug_set = set(augmented)
        for a in augmented:
            for nxt in self.edges.get(a, []):
                if nxt.node_id in chain_set:
                    continue
                if not any(s.node_id in aug_set for s in self.successors(nxt.node_id)):
                    out.append(self.deaugment_augmented_antichain([x if x != a else nxt.node_id for x in augmented]))
        self._next[key] = out
        return out


def solve_graph(path: str | Path, levels: list[tuple[int, float]], straight: bool = False) -> tuple[float, int]:
    """The published optimizer on a graph.txt: (pipeline time in s at the top level, antichain states).

    ``levels`` = [(machines, bandwidth bytes/s), ...] inner first, as ``-n`` and ``-b``.
    """
    gr = _Graph.from_str(Path(path).read_text())
    for src in gr.sources():
        if src.node_desc.startswith("Input"):
            gr.remove_node(src)
    for sink in gr.sinks():
        if sink.node_desc.startswith("__getitem__"):
            gr.remove_node(sink)
    # antichain_dag(): breadth-first from the first source over next antichains.
    start = [gr.sources()[0].node_id]
    keys: dict[tuple[str, ...], int] = {tuple(sorted(start)): 0}
    chains: list[list[str]] = [gr.augment_antichain(start)]
    dag_edges: list[set[int]] = [set()]  # predecessors in the antichain DAG
    queue = deque([start])
    done: set[tuple[str, ...]] = set()
    while queue:
        antichain = queue.popleft()
        key = tuple(sorted(antichain))
        if key in done:
            continue
        done.add(key)
        for nxt in gr.next_antichains(antichain):
            nkey = tuple(sorted(nxt))
            if nkey not in keys:
                keys[nkey] = len(chains)
                chains.append(gr.augment_antichain(nxt))
                dag_edges.append(set())
            dag_edges[keys[nkey]].add(keys[key])
            queue.append(nxt)
    # A topological order of the antichain DAG and each state's ancestors.
    n = len(chains)
    indeg = [len(p) for p in dag_edges]
    children: list[list[int]] = [[] for _ in range(n)]
    for v, ps in enumerate(dag_edges):
        for u in ps:
            children[u].append(v)
    order = [v for v in range(n) if indeg[v] == 0]
    for v in order:
        for c in children[v]:
            indeg[c] -= 1
            if indeg[c] == 0:
                order.append(c)
    index = {v: i for i, v in enumerate(order)}
    ancestors: list[set[int]] = [set() for _ in range(n)]
    for v in order:
        for u in dag_edges[v]:
            ancestors[v] |= ancestors[u] | {u}
    all_predecessor_ids = [sorted(index[u] for u in ancestors[v]) for v in order]
    out_act, comp, params = [], [], []
    for v in order:
        out_act.append(sum(gr.nodes[a].activation_size for a in chains[v]))
        preds = gr.all_predecessors(chains[v])
        comp.append(sum((p.forward_compute_time + p.backward_compute_time) / 1000.0 for p in preds))
        params.append(sum(p.parameter_size for p in preds))
    ct: list[list[Any]] = []
    pt: list[list[Any]] = []
    for i in range(n + 1):
        if i == 0:
            ct.append(list(comp))
            pt.append(list(params))
        else:
            ct.append([comp[j] - comp[i - 1] if j > i - 1 else None for j in range(n)])
            pt.append([params[j] - params[i - 1] if j > i - 1 else None for j in range(n)])
    within = 1
    A: list[Any] = []
    for lvl, (machines, bw) in enumerate(levels):
        A = compute_partitioning(ct, pt, out_act, machines, within, bw, final_level=(lvl == len(levels) - 1),
                                 straight=straight, all_predecessor_ids=all_predecessor_ids)
        within = machines
        for i in range(len(ct)):
            for j in range(len(ct[0])):
                ct[i][j] = A[i][j][-1][0]
    return float(A[0][n - 1][-1][0]), n
