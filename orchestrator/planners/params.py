"""``params``: balance parameter bytes across stages (DeepSpeed's ``partition_method="parameters"``).

DeepSpeed's PipelineModule balances the number of trainable parameters per stage; that evens out
weight memory and optimizer work but ignores compute time and activations, which is exactly the
baseline we want to beat. The split is the exact min-max contiguous partition of parameter bytes.
"""

from __future__ import annotations

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Plan, straight_plan
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.planners.even import num_stages
from orchestrator.planners.partition import devices_by_speed_order, min_max_partition
from orchestrator.core.profile import Profile


def plan_params(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    k = num_stages(profile, cluster, options)
    weights = [b.param_bytes for b in profile.blocks]
    cuts = min_max_partition(weights, k)  # type: ignore[arg-type]
    order = devices_by_speed_order(cluster)
    return straight_plan(cuts, options.num_microbatches, options.kind, [(order[i],) for i in range(k)], "params")


def max_stage_params(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> float:
    """The objective ``params`` minimizes: the largest stage's parameter bytes."""
    return max(profile.param_bytes(s.first, s.last) for s in plan.stages)


SPEC = PlannerSpec("params", plan_params, "equal parameter bytes per stage (DeepSpeed-style)", max_stage_params, ("parameters", "deepspeed"))
