"""``even``: equal block counts per stage, one device per stage (GPipe's default split).

The baseline a user gets from torch.distributed.pipelining's ``split_spec`` by hand: as many
stages as devices (or blocks), blocks dealt out evenly, no replication.
"""

from __future__ import annotations

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Plan, straight_plan
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.planners.partition import devices_by_speed_order
from orchestrator.core.profile import Profile


def num_stages(profile: Profile, cluster: Cluster, options: PlannerOptions) -> int:
    return min(cluster.size, profile.num_blocks, options.max_stages or cluster.size)


def plan_even(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    k = num_stages(profile, cluster, options)
    n = profile.num_blocks
    cuts = [round(i * n / k) for i in range(k + 1)]
    order = devices_by_speed_order(cluster)
    return straight_plan(cuts, options.num_microbatches, options.kind, [(order[i],) for i in range(k)], "even")


SPEC = PlannerSpec("even", plan_even, "equal block counts per stage, one device each (GPipe-style)")
