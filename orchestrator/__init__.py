"""raypipe orchestrator: profiles, cluster model, plans, schedule IR, simulator, planners, CLI.

The one entry point for training is :class:`ElasticJob` (configured by :class:`TrainConfig`,
:class:`ScalingConfig`, :class:`RunConfig`, :class:`AdaptConfig` and :class:`SpotConfig`);
it is imported lazily so that ``import orchestrator`` stays free of torch and Ray.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.errors import UserError
from orchestrator.core.profile import Block, Profile
from orchestrator.core.profile_loader import load_profile

_JOB = {"ElasticJob": "orchestrator.elastic.job_loop", "JobResult": "orchestrator.elastic.job_loop", "TrainConfig": "orchestrator.elastic.job_config",
        "ScalingConfig": "orchestrator.elastic.job_config", "RunConfig": "orchestrator.elastic.job_config", "AdaptConfig": "orchestrator.elastic.job_config",
        "SpotConfig": "orchestrator.elastic.job_config", "InjectedNotice": "orchestrator.elastic.job_config"}


def __getattr__(name: str) -> Any:
    if name in _JOB:
        import importlib

        return getattr(importlib.import_module(_JOB[name]), name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")


__all__ = ["AdaptConfig", "Block", "ElasticJob", "InjectedNotice", "JobResult", "Profile", "RunConfig", "ScalingConfig",
           "SpotConfig", "TrainConfig", "UserError", "load_profile"]
