"""The Parcae profiles committed under benchmarks/profiles/parcae load as profiles, per micro-batch of Parcae's runs."""

from __future__ import annotations

import pytest

from benchmarks.parcae_profiles import BATCHES, load_parcae_profile, parcae_profile_path
from orchestrator.core.errors import UserError


@pytest.mark.parametrize("model", [m for m in BATCHES if parcae_profile_path(m).exists()])
def test_each_file_loads_as_its_models_profile(model: str) -> None:
    profile = load_parcae_profile(model)
    assert profile.microbatch_size == BATCHES[model][0]
    assert profile.total_compute_s > 0 and profile.total_param_bytes > 0
    assert "Parcae" in profile.source or "profiled" in profile.source


def test_gpt_files_are_there_and_an_unknown_model_is_refused() -> None:
    for model in ("gpt-1.5b", "gpt-6.7b"):
        assert parcae_profile_path(model).exists()
    with pytest.raises(UserError, match="unknown Parcae model"):
        load_parcae_profile("gpt-175b")
