"""The literature and baseline planners, by name: the explicit table ``auto`` combines.

Each planner module exposes its :class:`~orchestrator.planners.options.PlannerSpec` as ``SPEC``;
this table lists them (no registration by import side effect). The full registry, with ``auto``
itself, is :data:`orchestrator.planners.base.REGISTRY`.
"""

from __future__ import annotations

from orchestrator.planners import autopipe, dapple, even, params, pipedream, spp, twobw
from orchestrator.planners.options import PlannerSpec, find

BASELINES: dict[str, PlannerSpec] = {spec.name: spec for spec in (even.SPEC, params.SPEC, pipedream.SPEC, spp.SPEC, dapple.SPEC, autopipe.SPEC, twobw.SPEC)}


def baseline(name: str) -> PlannerSpec:
    """The planner ``name`` of :data:`BASELINES` (aliases accepted)."""
    return find(BASELINES, name)
