"""raypipe: plan, simulate and run pipeline-parallel training on Ray, and keep it fast and cheap while it runs.

The public API is the short list in ``__all__``; everything else is reached through its layer's package
(``orchestrator.core``, ``schedule``, ``costmodel``, ``planners``, ``profiling``, ``train``, ``adapt``, ``elastic``,
``cli``; the runtime is :mod:`actors`, the cloud layer :mod:`cloud`). Every name is imported on first use, so
``import orchestrator`` costs nothing and planning or simulating through it loads neither torch nor Ray.

The one entry point for training is :class:`ElasticJob` (configured by :class:`TrainConfig`,
:class:`ScalingConfig`, :class:`RunConfig`, :class:`AdaptConfig` and :class:`SpotConfig`); :class:`PipelineTrainer`
is the same loop for a fixed plan with the policies off; both run on :class:`PipelineRuntime`, the runtime's primitives.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it (imported on first use)
_API = {
    # core data
    "UserError": "orchestrator.core.errors",
    "Block": "orchestrator.core.profile", "Profile": "orchestrator.core.profile",
    "load_profile": "orchestrator.core.profile_loader",
    "Cluster": "orchestrator.core.cluster", "load_cluster": "orchestrator.core.cluster",
    "flat": "orchestrator.core.cluster", "two_level": "orchestrator.core.cluster",
    "Plan": "orchestrator.core.plan", "Stage": "orchestrator.core.plan", "ScheduleKind": "orchestrator.core.plan",
    # planning and timing
    "PlannerOptions": "orchestrator.planners.options", "run_planner": "orchestrator.planners.base",
    "simulate": "orchestrator.costmodel.simulator",
    # models as blocks (torch)
    "profile_blocks": "orchestrator.profiling.profiler", "sequential_blocks": "orchestrator.profiling.modules",
    "split_at": "orchestrator.profiling.modules",
    # training (torch, Ray)
    "PipelineTrainer": "orchestrator.train.trainer", "PipelineRuntime": "orchestrator.train.runtime",
    "ElasticJob": "orchestrator.elastic.job_loop", "JobResult": "orchestrator.elastic.job_loop",
    "TrainConfig": "orchestrator.elastic.job_config", "ScalingConfig": "orchestrator.elastic.job_config",
    "RunConfig": "orchestrator.elastic.job_config", "AdaptConfig": "orchestrator.elastic.job_config",
    "SpotConfig": "orchestrator.elastic.job_config", "InjectedNotice": "orchestrator.elastic.job_config",
    "JobFailed": "orchestrator.elastic.signals", "JobStopped": "orchestrator.elastic.signals",
    "MigrationRequested": "orchestrator.elastic.signals",
    "Callback": "orchestrator.train.callbacks", "Checkpoint": "orchestrator.train.callbacks",
    "Stop": "orchestrator.train.callbacks", "StepInfo": "orchestrator.train.callbacks",
    "StartInfo": "orchestrator.train.callbacks",
    "add_job_arguments": "orchestrator.cli.driver_args", "job_configs": "orchestrator.cli.driver_args",
    "TokenFile": "orchestrator.data", "from_dataset": "orchestrator.data",  # data_fns: token files, map-style datasets
    # training options (torch): what TrainConfig.training and the factories' wrappers take
    "TrainingOptions": "actors.training", "LossScale": "actors.training", "decay_groups": "actors.training",
    "autocast_blocks": "actors.training", "ReferenceTrainer": "actors.reference",
    # plans and rehearsals as data
    "straight_plan": "orchestrator.core.plan",
    "FaultSchedule": "orchestrator.adapt.faults", "Slowdown": "orchestrator.adapt.faults", "Throttle": "orchestrator.adapt.faults",
    "Kill": "orchestrator.adapt.faults", "Join": "orchestrator.adapt.faults",
}

__all__ = sorted(_API)

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time each name is imported by __getattr__
    from orchestrator.core.cluster import Cluster, flat, load_cluster, two_level
    from orchestrator.core.errors import UserError
    from actors.reference import ReferenceTrainer
    from actors.training import LossScale, TrainingOptions, autocast_blocks, decay_groups
    from orchestrator.adapt.faults import FaultSchedule, Join, Kill, Slowdown, Throttle
    from orchestrator.core.plan import Plan, ScheduleKind, Stage, straight_plan
    from orchestrator.cli.driver_args import add_job_arguments, job_configs
    from orchestrator.data import TokenFile, from_dataset
    from orchestrator.elastic.signals import JobFailed, JobStopped, MigrationRequested
    from orchestrator.train.callbacks import Callback, Checkpoint, StartInfo, StepInfo, Stop
    from orchestrator.core.profile import Block, Profile
    from orchestrator.core.profile_loader import load_profile
    from orchestrator.costmodel.simulator import simulate
    from orchestrator.elastic.job_config import AdaptConfig, InjectedNotice, RunConfig, ScalingConfig, SpotConfig, TrainConfig
    from orchestrator.elastic.job_loop import ElasticJob, JobResult
    from orchestrator.planners.base import run_planner
    from orchestrator.planners.options import PlannerOptions
    from orchestrator.profiling.modules import sequential_blocks, split_at
    from orchestrator.profiling.profiler import profile_blocks
    from orchestrator.train.trainer import PipelineTrainer
    from orchestrator.train.runtime import PipelineRuntime


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
