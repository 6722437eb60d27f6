"""Planning on large clusters of identical servers: one pipeline over a share, replicated.

Every literature planner's cost grows with the device count (SPP's and DAPPLE's DPs over device
runs, PipeDream's over levels, the simulator over every device), so a 1024-GPU cluster is out of
their reach. Large clusters are regular, though: identical servers, one intra-server and one
inter-server bandwidth. On such a cluster a good plan is a pipeline over a *share* of ``g``
devices (a few servers, or part of one) copied ``R = n/g`` times as data parallelism — in our plan
model, stage ``j`` of the copy runs on the union of the ``R`` copies' devices, and since every
stage has ``R·t`` replicas laid out copy by copy, each replica exchanges activations only inside
its own copy; the gradient all-reduce spans the copies.

So the search is over replica counts and stage counts, never over device permutations:

* for every ``g`` that is a whole number of servers or divides one server (``g <= MAX_SHARE``),
  the planners run on the first ``g`` devices with the profile scaled to ``1/R`` of each
  micro-batch's rows (compute, activations and stash), and their plans are replicated;
* for every depth ``S`` (any share size, also the whole cluster), the balanced (min-max of
  forward + backward) partition with ``floor(g/S)`` replicas per stage is added (the remainder of
  the share, at most an eighth, stays idle);
* and, where no one-server-per-stage pipeline can span 7/8 of the servers (more servers than blocks,
  or than ``max_stages``), the balanced pipelines with one server per stage on some of the servers, the others
  idle: where deeper pipelines' busiest stages (compute and all-reduce) are equally busy, the
  shallowest (the shortest fill) and the deepest (the least memory and work on the other stages) of
  such a run of depths.

Every candidate is then scored by ``auto``'s bounds and the simulator's group-level mode, whose
cost grows with stages and micro-batches, not devices.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, Stage
from orchestrator.costmodel.group_sim import stage_work
from orchestrator.planners.catalog import baseline
from orchestrator.planners.options import PlannerOptions
from orchestrator.planners.partition import min_max_partition, regular_servers
from orchestrator.core.profile import Profile

MAX_SHARE = 64
"""Largest share a planner runs on (beyond it their cost grows too fast to repeat per share)."""
HEAVY = {"spp": 32, "dapple": 32}
"""Planners whose cost grows fastest run on shares of at most this many devices."""
HEAVY_LARGE = {"spp": 16, "dapple": 16, "autopipe": 16}
"""... and of at most this many on clusters of more than ``LARGE`` devices, where the balanced
structures of every share and depth already number in the hundreds (seconds of seeds saved at 1024)."""
LARGE = 256
INF = float("inf")


FALLBACK_DEVICES = 8
"""Above this many devices, ``pipedream``'s memory fallback (its DP run again under a depth cap for
every in-flight count, a [blocks² × units² × depth²] table each) costs minutes: as a seed of
``auto`` it runs without it, since ``auto`` fits memory itself (recomputation, slicing, other depths)."""


def seed_options(name: str, devices: int, options: PlannerOptions, share: bool = False) -> PlannerOptions:
    """The options a planner runs with as a seed of ``auto`` on ``devices`` devices (a ``share`` of a
    regular cluster, or the whole cluster). DAPPLE widens its beam 8× at most on a whole cluster (at
    32 GPUs, 600/100 Gb/s, 32 GiB, the committed OPT-30B-like profile's best plan is its 8× beam's) and
    not at all on a share, where no plan of a widened beam has won on any profile measured
    (``benchmarks/results/planner_scale.md``) and each share would pay for it (issue 42)."""
    if name == "pipedream" and devices > FALLBACK_DEVICES:
        return replace(options, check_memory=False)
    if name == "dapple":
        return replace(options, dapple_widen=min(options.dapple_widen, 0 if share else 1))
    return options


def shares(n: int, per_server: int) -> list[int]:
    """Share sizes g: whole servers or divisors of one server, dividing n."""
    return [g for g in range(1, n + 1) if n % g == 0 and (g % per_server == 0 or per_server % g == 0)]


def replicate(plan: Plan, order: list[int], g: int, copies: int) -> tuple[Stage, ...]:
    """The stages of ``plan`` (on devices 0..g-1 of the share) on all ``copies`` shares, copy-major."""
    return tuple(
        Stage(s.first, s.last, tuple(order[r * g + d] for r in range(copies) for d in s.devices))
        for s in plan.stages[: plan.num_physical_stages]
    )


def replicated_plans(profile: Profile, cluster: Cluster, options: PlannerOptions, names: list[str], failures: list[str]) -> list[tuple[str, Plan]]:
    """(label, plan) candidates for a regular cluster (see the module docstring)."""
    order = regular_servers(cluster)
    assert order is not None
    n = cluster.size
    per_server = len(next(iter(cluster.nodes().values())))
    M = options.num_microbatches
    L = profile.num_blocks
    weights = np.array([b.forward_s + b.backward_s for b in profile.blocks])
    cap = options.max_stages or n
    out: list[tuple[str, Plan]] = []
    memo: dict[int, list[int]] = {}

    def balanced(S: int) -> list[int]:
        if S not in memo:
            memo[S] = min_max_partition(weights, S)
        return memo[S]

    if options.straight:  # no replication at all: one pipeline on the first servers, the rest idle
        g = min(n, max(per_server, MAX_SHARE // per_server * per_server))
        for S in range(1, min(g, L, cap) + 1):
            cuts = balanced(S)
            out.append((f"hier:1x{S}x1", Plan(tuple(Stage(cuts[i], cuts[i + 1], (order[i],)) for i in range(S)), M)))
        _run_planners(profile, cluster, options, names, failures, order, g, 1, out)
        return out
    for g in shares(n, per_server):
        R = n // g
        for S in range(1, min(g, L, cap) + 1):
            t = g // S  # replicas per stage; the g - S·t devices left over stay idle
            if 8 * (g - S * t) > g:  # at most 1/8 of the share idle
                continue
            cuts = balanced(S)
            base = Plan(tuple(Stage(cuts[i], cuts[i + 1], tuple(range(i * t, (i + 1) * t))) for i in range(S)), M)
            out.append((f"hier:{R}x{S}x{t}", Plan(replicate(base, order, g, R), M)))
        if g <= MAX_SHARE:
            _run_planners(profile, cluster, options, names, failures, order, g, R, out)
    # One pipeline on part of the cluster, whole servers idle, where the cluster has more servers than
    # the model has blocks: more devices are not always faster there (no pipeline is deeper, and copies
    # all-reduce over the slow links between servers), so the plans of fewer servers stay candidates.
    seen = {label for label, _ in out}
    t = per_server
    deepest = min(L, cap, n // t)
    if deepest * t >= n - n // 8:  # the shares above hold the deepest such pipeline, at most an eighth idle
        return out
    server, speeds = tuple(order[:t]), cluster.speeds

    def busiest_at(S: int) -> float:
        """The busiest stage's compute and all-reduce at depth ``S`` (every stage has a server of the same shape)."""
        cuts = balanced(S)
        return max(stage_work(profile, cluster, speeds, a, b, server, M) for a, b in zip(cuts, cuts[1:]))

    busiest = {S: busiest_at(S) for S in range(1, deepest + 1)}
    record = INF  # the least busy stage of any shallower depth
    for S in range(1, deepest + 1):
        first = busiest[S] < record
        last = S == deepest or (busiest[S] <= record and busiest[S + 1] != busiest[S])
        record = min(record, busiest[S])
        if not (first or last):  # inside a run of depths with an equally busy stage: only its ends (every depth
            continue  # of a 100-block model at 1024 GPUs costs 4 s more; see benchmarks/results/planner_scale.md)
        label = f"hier:1x{S}x{t}"
        if label not in seen:
            cuts = balanced(S)
            out.append((label, Plan(tuple(Stage(cuts[i], cuts[i + 1], tuple(order[i * t + d] for d in range(t))) for i in range(S)), M)))
    return out


def _run_planners(profile: Profile, cluster: Cluster, options: PlannerOptions, names: list[str], failures: list[str], order: list[int], g: int, R: int, out: list[tuple[str, Plan]]) -> None:
    """The planners on the first ``g`` devices, each copy computing 1/R of every micro-batch's
    rows (its own view of the model), their plans replicated R times."""
    sub = cluster.subset(order[:g])
    sub_profile = profile.scaled(1.0 / R).with_activation_scale(1.0 / R) if R > 1 else profile
    sub_options = replace(options, max_stages=min(options.max_stages or g, g))
    for name in names:
        if g > (HEAVY_LARGE if cluster.size > LARGE else HEAVY).get(name, MAX_SHARE):
            continue
        try:
            plan = baseline(name).fn(sub_profile, sub, seed_options(name, g, sub_options, share=True))
        except UserError as exc:
            failures.append(f"{name} on {g} devices: {exc}")
            continue
        out.append((f"{name}@{R}x{g}", replace(plan, stages=replicate(plan, order, g, R), algorithm=name)))
