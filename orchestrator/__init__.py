"""raypipe orchestrator: profiles, cluster model, plans, schedule IR, simulator, planners, CLI.

The one entry point for training is :class:`ElasticJob` (configured by :class:`TrainConfig`,
:class:`ScalingConfig`, :class:`RunConfig`, :class:`AdaptConfig` and :class:`SpotConfig`);
it is imported lazily so that ``import orchestrator`` stays free of torch and Ray.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import UserError
from orchestrator.profile import Block, Profile, load_profile

_JOB = {"ElasticJob": "orchestrator.job_loop", "JobResult": "orchestrator.job_loop", "TrainConfig": "orchestrator.job_config",
        "ScalingConfig": "orchestrator.job_config", "RunConfig": "orchestrator.job_config", "AdaptConfig": "orchestrator.job_config",
        "SpotConfig": "orchestrator.job_config", "InjectedNotice": "orchestrator.job_config"}


def __getattr__(name: str) -> Any:
    if name in _JOB:
        import importlib

        return getattr(importlib.import_module(_JOB[name]), name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")


__all__ = ["AdaptConfig", "Block", "ElasticJob", "InjectedNotice", "JobResult", "Profile", "RunConfig", "ScalingConfig",
           "SpotConfig", "TrainConfig", "UserError", "load_profile"]
