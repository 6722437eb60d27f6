"""Parcae's models as profiles: ``load_parcae_profile("gpt-1.5b")`` for a trace's model name.

The files and how they were made: ``benchmarks/profiles/parcae/README.md``. Model names are those of the trace folders
in ``../shared/parcae_traces`` (plus ``gpt-1.5b-mbs2``, Parcae's gbs 256 / micro-batch 2 run of the same model).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.errors import UserError
from orchestrator.core.profile import Profile
from orchestrator.core.profile_loader import load_profile

PROFILES = Path(__file__).resolve().parent / "profiles" / "parcae"
CALIBRATED = PROFILES / "calibrated"

# model -> (micro-batch size, global batch size) of Parcae's runs (the liveput_res file names)
BATCHES: dict[str, tuple[int, int]] = {
    "gpt-1.5b": (1, 128),
    "gpt-1.5b-mbs2": (2, 256),
    "gpt-6.7b": (1, 64),
    "bert": (8, 1024),
    "resnet152": (32, 2048),
    "vgg19": (32, 2048),
}


def parcae_profile_path(model: str, calibrated: bool = False) -> Path:
    if model not in BATCHES:
        raise UserError(f"unknown Parcae model {model!r} (choose from {', '.join(BATCHES)})")
    return (CALIBRATED if calibrated else PROFILES) / f"{model}.json"


def load_parcae_profile(model: str, calibrated: bool = False) -> Profile:
    """The V100 profile of one of Parcae's models, per micro-batch of ``BATCHES[model][0]`` samples; ``calibrated``:
    its compute times scaled so that our simulator gives the iteration times Parcae measured (README.md)."""
    return load_profile(parcae_profile_path(model, calibrated))


def microbatches(model: str) -> int:
    """Micro-batches of one iteration (global batch / micro-batch)."""
    mbs, gbs = BATCHES[model]
    return gbs // mbs
