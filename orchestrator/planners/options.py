"""What a planner is: a pure function of (profile, cluster, options), and its typed options.

Every planner module exposes one :class:`PlannerSpec` named ``SPEC``; the registry that names
them is an explicit table (:mod:`orchestrator.planners.catalog` for the planners ``auto``
combines, :data:`orchestrator.planners.base.REGISTRY` for all of them), never filled by import
side effects.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Mapping

from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.terms import DEFAULT_STATE_FACTOR
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind
from orchestrator.core.profile import Profile
from orchestrator.costmodel.simulator import SimOptions


@dataclass(frozen=True, kw_only=True)
class PlannerOptions:
    num_microbatches: int
    """Micro-batches per iteration (the gradient-accumulation count)."""
    schedule: ScheduleKind | None = None
    """Schedule the plan must run (CLI ``--schedule``); None lets the planner choose (``auto``
    searches all of them, ZB-H1 included, the others use their own, 1F1B by default)."""
    straight: bool = False
    """Forbid stage replication: one device per stage (PipeDream's straight pipeline)."""
    max_stages: int | None = None
    """Upper bound on the pipeline depth (None: up to the device count)."""
    state_factor: float = DEFAULT_STATE_FACTOR
    """Bytes of memory per parameter byte (weights, gradients, optimizer state)."""
    check_memory: bool = True
    """Reject plans whose simulated peak memory exceeds a device's memory."""
    interleave: bool = False
    """Re-cut every planner's plan into virtual chunks when that is faster (CLI ``--interleave``;
    :func:`orchestrator.planners.interleaving.best_interleaving`)."""
    dapple_beam: int | None = None
    """States per level DAPPLE's DP expands (None: its default; 0: all of them)."""
    dapple_widen: int = 2
    """Wider passes DAPPLE may run before it refuses for memory (its beam 8×, then every state): fewer
    as a seed of ``auto``, which fits memory by other means too (issue 42: they cost 5× and 25× the first)."""
    auto_planners: tuple[str, ...] | None = None
    """The planners ``auto`` seeds its search with (None: all of them)."""

    def __post_init__(self) -> None:
        if self.num_microbatches < 1:
            raise UserError("the micro-batch count must be >= 1")
        if self.max_stages is not None and self.max_stages < 1:
            raise UserError("max_stages must be >= 1")
        if self.dapple_beam is not None and self.dapple_beam < 0:
            raise UserError("dapple_beam must be >= 0")
        if self.dapple_widen < 0:
            raise UserError("dapple_widen must be >= 0")

    @property
    def kind(self) -> ScheduleKind:
        """The schedule a planner without a choice of its own builds its plans for."""
        return ScheduleKind.ONE_F_ONE_B if self.schedule in (None, ScheduleKind.INTERLEAVED) else self.schedule

    @property
    def sim_options(self) -> SimOptions:
        return SimOptions(state_factor=self.state_factor)


PlannerFn = Callable[[Profile, Cluster, PlannerOptions], Plan]
ObjectiveFn = Callable[[Plan, Profile, Cluster, PlannerOptions], float]


@dataclass(frozen=True)
class PlannerSpec:
    name: str
    fn: PlannerFn
    description: str
    objective: ObjectiveFn | None = None
    aliases: tuple[str, ...] = ()
    max_blocks: int = 256
    """The longest chain the planner is handed: a longer profile is planned coarsened to this many blocks
    (:func:`orchestrator.core.coarsen.coarse_groups`) and the plan mapped back, so planning time stays bounded
    on 1000-node graphs. A planner whose cost grows slowly with the chain's length sets it higher."""




def find(table: Mapping[str, PlannerSpec], name: str) -> PlannerSpec:
    """The planner called ``name`` (or one of its aliases) in ``table``; a user error with a
    "did you mean" otherwise."""
    key = name.lower()
    for spec in table.values():
        if key == spec.name or key in spec.aliases:
            return spec
    names = sorted(table)
    hint = difflib.get_close_matches(key, names, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    raise UserError(f"unknown algorithm {name!r}{suggestion} (available: {', '.join(names)})")
