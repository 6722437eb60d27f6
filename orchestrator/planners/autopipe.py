"""``autopipe``: AutoPipe (Liu et al., 2022, "AutoPipe: A Fast Pipeline Parallelism Approach with
Balanced Partitioning and Micro-batch Slicing"), straight 1F1B pipeline, one device per stage.

1. **Balanced partition (their Algorithm 1).** An exact dynamic program for the partition of the
   block chain into ``p`` contiguous stages minimizing the slowest stage's ``F + B``::

       D(k, i) = min_{j < i} max( D(k−1, j), (F + B)(j..i) ),   D(1, i) = (F + B)(0..i)

   vectorized over ``j`` per (k, i) row. Blocks may be sub-layers (a transformer layer profiled as
   an attention block and an FFN block, see :func:`split_transformer_layers`); the finer grain is
   what lets AutoPipe balance better than whole layers.

2. **Critical path and master stage.** The partition is replayed with the list scheduler of
   the simulator's group-level mode (:func:`orchestrator.costmodel.group_sim.simulate_groups`, the simulator's cost model, including transfers); walking back
   from the last operation along "what made it start" gives the critical path; the *master stage*
   is the stage contributing most compute time to it.

3. **Heuristic (their rules 1–3).** Repeatedly try, in order: (1) move the master stage's first
   block to the previous stage (the master stage moves forward, which shortens the warm-up the
   critical path waits through); (2) when the master stage is the first stage, move its last block
   to the next stage; (3) move the last stage's first block to the stage before it (later stages
   finish in the cool-down phase, so lightening them removes cool-down bubbles). A move is kept
   only if the replayed iteration time drops; stop when none helps (or after ``2·L`` moves).

4. **Micro-batch slicing (their Algorithm 2).** The first ``s`` micro-batches are split into two
   halves that flow as separate units, so the pipeline fills with half-size work and the start-up
   bubble shrinks; ``s`` is chosen by replaying candidate values (0, 1, 2, 4, …, p−1 — a
   logarithmic scan instead of every value, to keep planning fast). This appears in the plan as
   ``Plan.sliced_microbatches`` and from there in the schedule IR and the simulator.

Choice left open by the paper: a device per stage in node order (AutoPipe targets homogeneous
GPUs, no replication). The depth ``p`` is the device count (capped by blocks and ``max_stages``) and
its halvings p/2, p/4, …, 1; each is partitioned, refined and sliced, and the fastest replay that
fits memory wins (a user with 32 GPUs and a model with huge activations does not want 32 stages).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, straight_plan
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.planners.partition import devices_by_speed_order
from orchestrator.costmodel.group_sim import simulate_groups
from orchestrator.planners.scoring import estimate, plan_fits_memory
from orchestrator.schedule.ir import Kind
from orchestrator.core.profile import Block, Profile

INF = np.inf


def balanced_partition(weights: Sequence[float], p: int) -> tuple[list[int], float]:
    """Algorithm 1: cut points of exactly ``p`` non-empty stages minimizing the largest stage sum."""
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    p = max(1, min(p, n))
    pre = np.concatenate([[0.0], np.cumsum(w)])
    seg = pre[None, :] - pre[:, None]  # seg[j, i] = sum(j..i)
    seg = np.where(np.arange(n + 1)[None, :] > np.arange(n + 1)[:, None], seg, INF)
    D = np.full((p + 1, n + 1), INF)
    arg = np.zeros((p + 1, n + 1), dtype=np.int64)
    D[1] = seg[0]
    D[1, 0] = INF
    for k in range(2, p + 1):
        cand = np.maximum(D[k - 1][:, None], seg)  # [j, i]
        arg[k] = np.argmin(cand, axis=0)
        D[k] = cand[arg[k], np.arange(n + 1)]
    cuts = [n]
    i = n
    for k in range(p, 1, -1):
        i = int(arg[k, i])
        cuts.append(i)
    cuts.append(0)
    return cuts[::-1], float(D[p, n])


def critical_stage_times(plan: Plan, profile: Profile, cluster: Cluster) -> tuple[float, list[float]]:
    """Iteration time and compute seconds each stage contributes to the critical path (walked back
    from the compute action that ends last: to the sender when an input's arrival bounded an
    action's start, else to the stage's previous action)."""
    res = simulate_groups(plan, profile, cluster, trace=True)
    events = res.trace
    per = [0.0] * len(plan.stages)
    where = {(a.stage, a.kind, a.microbatch, a.part): (g, i) for g, evs in enumerate(events) for i, (a, _, _, _) in enumerate(evs)}
    g, i = max(((g, i) for g, evs in enumerate(events) for i in range(len(evs))), key=lambda gi: events[gi[0]][gi[1]][2])
    while True:
        a, start, end, waited = events[g][i]
        per[a.stage] += end - start
        if waited:  # a forward waits for the previous stage's forward, a backward for the next one's
            sender = a.stage - 1 if a.kind is Kind.FORWARD else a.stage + 1
            g, i = where[(sender, a.kind, a.microbatch, a.part)]
        elif i == 0:
            break
        else:
            i -= 1
    return res.iteration_s, per


def _score(cuts: list[int], devices: list[int], M: int, sliced: int, profile: Profile, cluster: Cluster, options: PlannerOptions) -> tuple[float, Plan] | None:
    plan = straight_plan(cuts, M, ScheduleKind.ONE_F_ONE_B, [(d,) for d in devices[: len(cuts) - 1]], "autopipe")
    if sliced:
        plan = Plan(plan.stages, M, ScheduleKind.ONE_F_ONE_B, sliced, "autopipe")
    if not plan_fits_memory(plan, profile, cluster, options):
        return None
    return estimate(plan, profile, cluster), plan


def refine(cuts: list[int], devices: list[int], profile: Profile, cluster: Cluster, options: PlannerOptions) -> tuple[list[int], float]:
    """Rules 1–3 on the critical path; returns the improved cuts and their time."""
    M = options.num_microbatches
    S = len(cuts) - 1
    scored = _score(cuts, devices, M, 0, profile, cluster, options)
    current = scored[0] if scored else INF
    for _ in range(2 * profile.num_blocks):
        if S < 2:
            break
        plan = straight_plan(cuts, M, ScheduleKind.ONE_F_ONE_B, [(d,) for d in devices[:S]])
        _, per = critical_stage_times(plan, profile, cluster)
        master = int(np.argmax(per))
        moves = []
        if master > 0:
            moves.append((master, +1))  # rule 1: first block of master -> previous stage
        else:
            moves.append((1, -1))  # rule 2: last block of the first stage -> next stage
        moves.append((S - 1, +1))  # rule 3: lighten the last stage (cool-down bubbles)
        improved = False
        for boundary, delta in moves:
            new = list(cuts)
            new[boundary] += delta
            if not all(new[k] < new[k + 1] for k in range(S)):
                continue
            got = _score(new, devices, M, 0, profile, cluster, options)
            if got is not None and got[0] < current - 1e-12:
                cuts, current, improved = new, got[0], True
                break
        if not improved:
            break
    return cuts, current


def slice_candidates(p: int, M: int) -> list[int]:
    out = {0, min(p - 1, M)}
    k = 1
    while k < min(p, M + 1):
        out.add(k)
        k *= 2
    return sorted(x for x in out if 0 <= x <= M)


def plan_autopipe(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    M = options.num_microbatches
    devices = devices_by_speed_order(cluster)
    weights = [b.forward_s + b.backward_s for b in profile.blocks]
    p_max = min(cluster.size, profile.num_blocks, options.max_stages or cluster.size)
    best: tuple[float, Plan] | None = None
    depths = sorted({p_max} | {max(1, p_max >> k) for k in range(1, p_max.bit_length())}, reverse=True)
    for p in depths:
        cuts, _ = balanced_partition(weights, p)
        cuts, t = refine(cuts, devices, profile, cluster, options)
        if not np.isfinite(t):
            continue
        for s in slice_candidates(p, M):
            got = _score(cuts, devices, M, s, profile, cluster, options)
            if got is not None and (best is None or got[0] < best[0] - 1e-12):
                best = got
    if best is None:
        raise UserError("autopipe: no straight pipeline fits device memory (try more devices or fewer micro-batches)")
    out = Plan(best[1].stages, M, ScheduleKind.ONE_F_ONE_B, best[1].sliced_microbatches, "autopipe", objective_s=best[0])

    return out


def split_transformer_layers(profile: Profile, attention_share: float = 1.0 / 3.0) -> Profile:
    """Each block as an attention block and an FFN block (AutoPipe's sub-layer granularity).

    For a standard transformer layer (FFN width 4·d) the attention half holds 4d² of the 12d²
    weights and about a third of the FLOPs, hence the default share. Both halves output a tensor
    of the layer's output size; stash is split like compute.
    """
    a = attention_share
    blocks: list[Block] = []
    for b in profile.blocks:
        blocks.append(Block(b.name + ".attn", b.forward_s * a, b.backward_s * a, b.activation_bytes, b.param_bytes * a, b.stash_bytes * a))
        blocks.append(Block(b.name + ".ffn", b.forward_s * (1 - a), b.backward_s * (1 - a), b.activation_bytes, b.param_bytes * (1 - a), b.stash_bytes * (1 - a)))
    return Profile(profile.name + "-sublayer", tuple(blocks), profile.microbatch_size, profile.input_bytes, profile.source)


def max_stage_compute(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> float:
    return max(profile.compute_time(s.first, s.last) for s in plan.stages)


SPEC = PlannerSpec("autopipe", plan_autopipe, "AutoPipe (Liu et al. 2022): balanced DP, critical-path heuristic, micro-batch slicing")
