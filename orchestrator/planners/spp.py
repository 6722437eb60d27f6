"""``spp``: Luo et al., "Efficient Pipeline Planning for Expedited Distributed DNN Training" (INFOCOM'22).

SPP plans a synchronous (flushing) pipeline on an *arbitrary* bandwidth matrix in three steps, and
repeats them for every stage count ``S = 1..V``, keeping the plan with the smallest makespan:

1. **RDO — recursive device ordering.** The device graph (edge weight = bandwidth, symmetrized as the
   slower direction) is split by a global minimum cut (Stoer–Wagner, ``networkx.stoer_wagner``); each
   side is ordered recursively and the two orders are concatenated. Devices that are well connected
   end up adjacent, so "a stage is a contiguous run of the order" keeps replicas and neighbouring
   stages on fast links. A set whose internal links are all equal needs no cut (every order is as
   good) and is kept in id order — this only skips work.

2. **PRM — partition, replicate, map.** A dynamic program over the device order. With per-micro-batch
   costs on a stage of blocks ``[l, l')`` on the order segment ``[a, a+r)``::

       c(l, l', a, r) = (F + B)(l..l') / (r · min speed of the segment)
       A(l, l', a, r) = 2(r−1)/r · params(l..l') / ring bandwidth of the segment      (ring all-reduce)
       e(l', a, r, r') = act(l') / (max(r, r') · B_min(segment, next segment))         (p2p per unit)

   the load of a stage over one iteration is ``M·c + A`` and of each boundary link ``M·e``; both are
   lower bounds on any schedule of that plan. PRM minimizes the largest load,

       W(l, ξ, r, i) = min_{l', r'} max( W(l', ξ', r', i−1), M·e, M·c + A ),

   the paper's W(l, ξ, r, i) (layers, devices of the order used, replication of the boundary stage,
   stage count). We run it from the back of the model (``l`` = first block of the suffix, ``a`` =
   first device of the suffix) so that the number of stages after a stage — which fixes how many
   micro-batches its 1F1B schedule keeps in flight, hence its memory — is known inside the DP.
   Stages that do not fit device memory (``params·state_factor + in_flight·stash/r``) are excluded.
   ``r`` is a DP dimension because the boundary cost needs both neighbours' replica counts.

3. **PE — list-ordering execution.** Each stage has an order queue ``U_s`` of its forward and backward
   units; every unit runs as soon as it is ready and first in its queue; transfers queue on their link
   in send order; each stage all-reduces after its last backward. We evaluate the 1F1B queue (the
   memory-bounded order our runtime executes) and the GPipe queue (all forwards, then backwards, the
   order the paper's ``(2 + (4V−4)/M)`` bound is proved for) and keep the faster that fits memory.
   That execution is exactly the simulator's group-level mode on the generators' orders
   (:func:`orchestrator.costmodel.group_sim.simulate_groups`), so PE *is* that mode; the bounds that prune
   candidates before it runs are in :mod:`orchestrator.planners.scoring`.

Bound (tested on small instances against exhaustive enumeration): for the GPipe queue each of the
two phases takes at most the largest load plus one unit on each of the ``2V−2`` resources of the
fill path, so ``makespan ≤ (2 + (4V−4)/M) · W_PRM``, and ``W_PRM ≤ (1+Φ) · OPT`` where Φ is the price
of restricting stages to runs of the RDO order (Φ = 0 when the order does not matter, e.g. on a
flat cluster). Deviation: the paper's all-to-all boundary estimate is replaced by the conservative
``max(r, r')`` split over the slowest cross link, and PE is the simulator's group mode, so the plan
SPP picks is the one the simulator scores (exactly, when a stage's replicas are alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.costmodel.terms import all_reduce_time, compute_time, static_bytes, transfer_time
from orchestrator.costmodel.terms import group_all_reduce
from orchestrator.costmodel.group_sim import simulate_groups
from orchestrator.planners.partition import regular_servers
from orchestrator.planners.scoring import PipelineCosts, compute_costs, pe_lower_bound, plan_costs, plan_fits_memory, unit_fractions
from orchestrator.core.profile import Profile

INF = np.inf


# ----------------------------------------------------------------------------------------------
# RDO
# ----------------------------------------------------------------------------------------------
def device_order(cluster: Cluster) -> list[int]:
    """Recursive Stoer–Wagner min-cut ordering of the devices (RDO). It depends on the bandwidth
    matrix only, so it is cached per matrix (re-planning the same cluster skips the min cuts).
    On identical servers (:func:`regular_servers`) every min cut separates whole servers, so the
    min cuts give the servers' devices server by server in some order of the servers; every such
    order costs the same (the servers are interchangeable), so it is given without the min cuts
    (which cost seconds at 64 devices)."""
    regular = regular_servers(cluster)
    if regular is not None:
        return regular
    bw = np.array(cluster.bandwidth, dtype=np.float64)
    return list(_device_order_cached(bw.shape[0], bw.tobytes()))


@lru_cache(maxsize=32)
def _device_order_cached(n: int, raw: bytes) -> tuple[int, ...]:
    return tuple(_device_order(np.frombuffer(raw, dtype=np.float64).reshape(n, n).copy()))


def _device_order(bw: np.ndarray) -> list[int]:
    import networkx as nx  # only for the min cuts: importing the planners stays cheap

    n = bw.shape[0]
    np.fill_diagonal(bw, 0.0)
    sym = np.minimum(bw, bw.T)
    scale = float(sym.max()) or 1.0
    sym = sym / scale

    def order(nodes: list[int]) -> list[int]:
        if len(nodes) <= 2:
            return sorted(nodes)
        sub = sym[np.ix_(nodes, nodes)]
        off = sub[~np.eye(len(nodes), dtype=bool)]
        if np.all(off == off[0]) and off[0] > 0:
            return sorted(nodes)
        g = nx.Graph()
        g.add_nodes_from(nodes)
        for x in range(len(nodes)):
            for y in range(x + 1, len(nodes)):
                if sub[x, y] > 0:
                    g.add_edge(nodes[x], nodes[y], weight=float(sub[x, y]))
        if not nx.is_connected(g):
            comps = sorted((sorted(c) for c in nx.connected_components(g)), key=lambda c: c[0])
            return [d for c in comps for d in order(c)]
        _, (part_a, part_b) = nx.stoer_wagner(g)
        first, second = sorted((sorted(part_a), sorted(part_b)), key=lambda c: c[0])
        return order(first) + order(second)

    return order(list(range(n)))


# ----------------------------------------------------------------------------------------------
# PRM
# ----------------------------------------------------------------------------------------------
@dataclass
class PRMTables:
    """Everything PRM needs about contiguous runs of the device order (index [a, r-1])."""

    order: list[int]
    smin: np.ndarray  # [V, V] slowest speed of run [a, a+r)
    mem: np.ndarray  # [V, V] smallest memory
    ring: np.ndarray  # [V, V] ring bandwidth in order
    pair: np.ndarray  # [V, V, V] slowest link between [a, a+r) and [a+r, a+r+r')
    valid: np.ndarray  # [V, V] a + r <= V
    latency: float = 0.0


def prm_tables(cluster: Cluster, order: list[int]) -> PRMTables:
    V = len(order)
    directed = cluster.effective[np.ix_(order, order)]
    eff = np.minimum(directed, directed.T)
    speeds = cluster.speeds[order]
    mems = cluster.memories[order]
    smin = np.full((V, V), np.nan)
    mem = np.full((V, V), np.nan)
    ring = np.full((V, V), np.nan)
    valid = np.zeros((V, V), dtype=bool)
    consec = np.array([directed[k, k + 1] for k in range(V - 1)] + [INF])
    for a in range(V):
        rs = np.arange(1, V - a + 1)
        valid[a, : V - a] = True
        smin[a, : V - a] = np.minimum.accumulate(speeds[a:])
        mem[a, : V - a] = np.minimum.accumulate(mems[a:])
        chain = np.minimum.accumulate(np.concatenate([[INF], consec[a : V - 1]]))[: len(rs)]
        wrap = directed[a + rs - 1, a]
        ring[a, : V - a] = np.where(rs > 1, np.minimum(chain, wrap), INF)
    pair = np.full((V, V, V), np.nan)
    for b in range(1, V):
        x = eff[:b, b:]
        rows = np.minimum.accumulate(x[::-1], axis=0)[::-1]  # rows a..b-1
        both = np.minimum.accumulate(rows, axis=1)  # cols b..c-1
        for a in range(b):
            pair[a, b - a - 1, : V - b] = both[a]
    return PRMTables(order, smin, mem, ring, pair, valid, cluster.latency_s)


@dataclass
class PRMResult:
    """``W[S-1][l, a, r-1]``: best largest load of an S-stage plan of blocks ``[l, L)`` whose first
    stage is run ``[a, a+r)``. Back-pointers are recomputed along the one path that is unwound.

    The cost tables only hold the ``V(V+1)/2`` runs that exist (``a + r <= V``), in "pair" layout:
    run ``p`` is ``[pa[p], pa[p] + pr[p])`` and ``pidx[a, r-1]`` is its index (−1 if none); pairs are
    sorted by their end ``a + r``, so the runs that leave room for ``k`` more devices are a prefix."""

    W: list[np.ndarray]
    load: np.ndarray  # [L, L+1, P] stage load of [l, l') on run p (inf where impossible)
    kmax: np.ndarray  # [L, L+1, P] largest in-flight count that fits memory
    comm: np.ndarray  # [L+1, P', V] boundary load at cut l' between run p (ending before V) and the next r' devices
    M: int
    pidx: np.ndarray | None = None  # [V, V] run (a, r-1) -> pair index


@lru_cache(maxsize=64)
def _run_pairs(V: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(pa, pr, pidx, nxt) of the runs ``[a, a+r)`` of a V-device order, sorted by ``a + r`` then
    ``a``; ``nxt[p, r'-1]`` is the pair index of the run of ``r'`` devices right after run ``p``, or
    the sentinel ``P`` when it does not fit (rows only for runs ending before ``V``)."""
    pa = np.array([a for e in range(1, V + 1) for a in range(e)], dtype=np.intp)
    pr = np.array([e - a for e in range(1, V + 1) for a in range(e)], dtype=np.intp)
    P = len(pa)
    pidx = np.full((V, V), -1, dtype=np.intp)
    pidx[pa, pr - 1] = np.arange(P)
    ends = (pa + pr)[: P - V]  # runs ending before V
    rp = np.arange(1, V + 1)[None, :]
    fits = ends[:, None] + rp <= V
    nxt = np.where(fits, pidx[np.minimum(ends, V - 1)[:, None], rp - 1], P)
    for arr in (pa, pr, pidx, nxt):
        arr.flags.writeable = False
    return pa, pr, pidx, nxt


_L_CHUNK = 12  # first-block chunk of PRM's relaxation
_E_CHUNKS = 4  # run-end blocks of PRM's boundary minimization


def prm(profile: Profile, tables: PRMTables, M: int, state_factor: float, max_stages: int, check_memory: bool = True) -> PRMResult:
    """The PRM dynamic program, vectorized over (l, l', run) per stage count.

    Only runs that exist are stored (pair layout, see :class:`PRMResult`), and at stage count j only
    the runs that leave ``j−1`` devices for the stages after them are relaxed; every value is the
    same floating-point min/max of the same costs as the dense [l, l', a, r] formulation."""
    L, V = profile.num_blocks, len(tables.order)
    pa, pr, pidx, nxt = _run_pairs(V)
    P = len(pa)
    fb = profile.prefix("forward_s") + profile.prefix("backward_s")
    pp = profile.prefix("param_bytes")
    st = profile.prefix("stash_bytes")
    acts = np.array([profile.boundary_bytes(k) for k in range(L + 1)])
    li = np.arange(L)[:, None]
    lj = np.arange(L + 1)[None, :]
    ok = lj > li  # [L, L+1] stage [l, l')
    comp = np.where(ok, fb[lj] - fb[li], INF)
    par = np.where(ok, pp[lj] - pp[li], 0.0)
    sta = np.where(ok, st[lj] - st[li], 0.0)
    rr = np.arange(1, V + 1, dtype=np.float64)
    rp = pr.astype(np.float64)
    smin = tables.smin[pa, pr - 1]
    ring = tables.ring[pa, pr - 1]
    # The big [L, L+1, P] tables are built in place (same operations, operands and rounding as
    # M·c + A, the memory limit and the boundary load written out; commuted operands only).
    with np.errstate(invalid="ignore", divide="ignore"):
        load = compute_time(comp[:, :, None], smin[None, None, :], rp[None, None, :])  # per unit
        load *= M
        ar = all_reduce_time(rp[None, None, :], par[:, :, None], ring[None, None, :])
        np.nan_to_num(ar, copy=False, nan=0.0)
        load += ar  # [L, L+1, P]
        del ar
        np.copyto(load, INF, where=~(tables.valid[pa, pr - 1][None, None, :] & ok[:, :, None]))
        if check_memory:
            spare = tables.mem[pa, pr - 1][None, None, :] - static_bytes(par[:, :, None], state_factor)
            kmax = spare * rp[None, None, :]
            kmax /= np.where(sta > 0, sta, 1.0)[:, :, None]
            np.copyto(kmax, INF, where=~(sta > 0)[:, :, None])
            np.copyto(kmax, -INF, where=spare < 0)
            del spare
            np.nan_to_num(kmax, copy=False, nan=-INF, posinf=INF)
        else:
            kmax = np.full(load.shape, INF)
        Pn = P - V  # runs that end before V (have a next stage)
        rmax = np.maximum(rp[:Pn, None], rr[None, :])  # [P', r']
        pair = tables.pair[pa[:Pn], pr[:Pn] - 1, :]  # [P', r']
        # the paper's boundary estimate: the activation split max(r, r') ways over the slowest cross link
        comm = transfer_time(acts[:, None, None], 1.0 / (rmax * pair)[None], tables.latency)  # [L+1, P', V(r')]
        comm *= M
        np.nan_to_num(comm, copy=False, nan=INF)

    def dense(wp: np.ndarray) -> np.ndarray:
        out = np.full((L, V, V), INF)
        out[:, pa, pr - 1] = wp
        return out

    wp = np.where(kmax[:, L] >= 1, load[:, L], INF)  # one stage: [l, L) on run p
    W: list[np.ndarray] = [dense(wp)]
    prev = np.concatenate([wp, np.full((L, 1), INF)], axis=1)  # sentinel column P
    stage_masked = np.where(kmax[:, :L] >= 1, load[:, :L], INF)
    # stage counts j at which some stage stops fitting: its in-flight limit is in [j−1, j) (the mask
    # only changes there)
    jmax = min(max_stages, L, V)
    kk = kmax[:, :L]
    crossing = {int(x) + 1 for x in np.unique(np.floor(kk[(kk >= 1) & (kk < jmax)]))}
    for j in range(2, jmax + 1):
        K = V - j + 1  # the first stage's run ends at <= K: the j−1 stages after it need j−1 devices
        npj = K * (K + 1) // 2
        nl = L - j + 1  # a suffix of j stages needs j blocks; the next cut l' is in [1, nl]
        # h[l', p] = min_{r'} max(W_{j-1}[l', a+r, r'], comm[l', p, r']); a run ending at e leaves
        # room for r' <= K + 1 − e (W_{j-1} is inf beyond), so runs are taken in blocks of ends.
        h = np.empty((nl, npj))
        step = -(-K // _E_CHUNKS)
        for e0 in range(1, K + 1, step):
            e1 = min(e0 + step, K + 1)
            p0, p1, R = e0 * (e0 - 1) // 2, e1 * (e1 - 1) // 2, K + 1 - e0
            g = prev[1 : nl + 1][:, nxt[p0:p1, :R]]  # [nl(l'), p1-p0, R(r')] = W_{j-1}[l', a+r, r']
            h[:, p0:p1] = np.min(np.maximum(g, comm[1 : nl + 1, p0:p1, :R]), axis=2)
        if j <= M and j in crossing:  # later stage counts use sub-blocks only
            np.copyto(stage_masked[:nl, : nl + 1, :npj], INF, where=kmax[:nl, : nl + 1, :npj] < j)
        wp = np.full((L, P + 1), INF)
        # stage [l, l') is empty (inf) for l' <= l: blocks of first blocks l skip those cuts
        for lo in range(0, nl, _L_CHUNK):
            hi = min(lo + _L_CHUNK, nl)
            wp[lo:hi, :npj] = np.min(np.maximum(stage_masked[lo:hi, lo + 1 : nl + 1, :npj], h[None, lo:]), axis=1)
        W.append(dense(wp[:, :P]))
        prev = wp
        if not np.isfinite(wp).any():
            break
    return PRMResult(W, load, kmax, comm, M, pidx)


def prm_stages(res: PRMResult, tables: PRMTables, S: int, a: int, r: int) -> list[Stage]:
    """Unwind an S-stage solution whose first stage is run [a, a+r) (r >= 1)."""
    V = len(tables.order)
    L = res.load.shape[0]
    assert res.pidx is not None
    pidx = res.pidx
    stages = []
    l = 0
    for j in range(S, 1, -1):
        prev = res.W[j - 2]
        p = int(pidx[a, r - 1])
        # best r' for every cut l': max(W_{j-1}[l', a+r, r'], comm[l', a, r, r'])
        if a + r < V:
            h_all = np.maximum(prev[:, a + r, :], res.comm[:L, p, :])
        else:
            h_all = np.full((L, V), INF)
        h = h_all.min(axis=1)
        stage = np.where(res.kmax[l, :L, p] >= min(j, res.M), res.load[l, :L, p], INF)
        nl = int(np.argmin(np.maximum(stage, h)))
        nr = int(np.argmin(h_all[nl])) + 1
        stages.append(Stage(l, nl, tuple(tables.order[a : a + r])))
        l, a, r = nl, a + r, nr
    stages.append(Stage(l, L, tuple(tables.order[a : a + r])))
    return stages


def _best_schedule(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions, costs: PipelineCosts | None = None, bar: float | None = None) -> tuple[float, Plan] | None:
    best: tuple[float, Plan] | None = None
    asked = options.schedule
    kinds = [asked] if asked in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE) else [ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE]
    fr = unit_fractions(plan.num_microbatches, plan.sliced_microbatches)
    for kind in kinds:
        cand = Plan(plan.stages, plan.num_microbatches, kind, algorithm=plan.algorithm)
        if not plan_fits_memory(cand, profile, cluster, options):
            continue
        if costs is None:  # the costs do not depend on the queue: compute them once for both
            costs = plan_costs(cand, profile, cluster)
        if best is not None and pe_lower_bound(costs, fr) >= best[0] - 1e-12:
            continue  # cannot be faster than the other queue
        if bar is not None and pe_lower_bound(costs, fr) >= bar:
            continue  # cannot beat the incumbent plan
        t = simulate_groups(cand, profile, cluster).iteration_s  # PE: the simulator's group mode
        if best is None or t < best[0] - 1e-12:
            best = (t, cand)
    return best



def plan_spp(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    order = device_order(cluster)
    tables = prm_tables(cluster, order)
    if options.straight:
        tables.valid[:, 1:] = False  # every stage on a run of length one
    M = options.num_microbatches
    max_stages = min(options.max_stages or cluster.size, cluster.size, profile.num_blocks)
    res = prm(profile, tables, M, options.state_factor, max_stages, options.check_memory)
    candidates: list[tuple[float, int, int, int]] = []
    for S in range(1, len(res.W) + 1):
        w0 = res.W[S - 1][0]  # [V(a), V(r)]
        if not np.isfinite(w0).any():
            continue
        a, ri = np.unravel_index(int(np.argmin(w0)), w0.shape)
        candidates.append((float(w0[a, ri]), S, int(a), int(ri) + 1))
    candidates.sort()
    best: tuple[float, Plan] | None = None
    for _, S, a0, r0 in candidates:
        plan = Plan(tuple(prm_stages(res, tables, S, int(a0), int(r0))), M, ScheduleKind.ONE_F_ONE_B, algorithm="spp")
        # PE's makespan is at least the largest stage load: skip plans that cannot win.
        if best is not None:
            load_bound, partial = compute_costs(plan, profile, cluster)
            if load_bound >= best[0]:
                continue
            if pe_lower_bound(partial, unit_fractions(M, plan.sliced_microbatches)) >= best[0]:
                continue  # neither queue can beat the incumbent (so neither would be kept)
        scored = _best_schedule(plan, profile, cluster, options, bar=None if best is None else best[0])
        if scored is not None and (best is None or scored[0] < best[0] - 1e-12):
            best = scored
    if best is None:
        raise UserError("spp: no partition of the model fits device memory (try more devices, fewer micro-batches or --max-stages)")
    makespan, plan = best
    out = Plan(plan.stages, M, plan.schedule, algorithm="spp", objective_s=makespan)

    return out


def prm_objective(plan: Plan, profile: Profile, cluster: Cluster, M: int) -> float:
    """PRM's largest load of any straight plan whose stages are runs of some order (for tests)."""
    worst = 0.0
    for j, s in enumerate(plan.stages):
        r = s.replicas
        slow = float(min(cluster.speeds[list(s.devices)]))
        load = M * compute_time(profile.compute_time(s.first, s.last), slow, r) + group_all_reduce(cluster, s.devices, profile.param_bytes(s.first, s.last))
        worst = max(worst, load)
        if j + 1 < len(plan.stages):
            nxt = plan.stages[j + 1]
            bw = min(min(cluster.link(x, y), cluster.link(y, x)) for x in s.devices for y in nxt.devices)
            worst = max(worst, M * transfer_time(profile.boundary_bytes(s.last), 1.0 / (max(r, nxt.replicas) * bw), cluster.latency_s))
    return worst


SPEC = PlannerSpec("spp", plan_spp, "SPP (INFOCOM'22): RDO min-cut order, PRM DP with replication, PE list scheduling")
