"""The Parcae profiles committed under benchmarks/profiles/parcae load as profiles, per micro-batch of Parcae's runs."""

from __future__ import annotations

import pytest

from benchmarks.parcae_profiles import BATCHES, load_parcae_profile, parcae_profile_path
from orchestrator.core.errors import UserError

FILES = [(m, c) for m in BATCHES for c in (False, True) if parcae_profile_path(m, c).exists()]


@pytest.mark.parametrize(("model", "calibrated"), FILES)
def test_each_file_loads_as_its_models_profile(model: str, calibrated: bool) -> None:
    profile = load_parcae_profile(model, calibrated)
    assert profile.microbatch_size == BATCHES[model][0]
    assert profile.total_compute_s > 0 and profile.total_param_bytes > 0
    assert "Parcae" in profile.source


def test_every_model_has_its_file_and_an_unknown_model_is_refused() -> None:
    assert [m for m in BATCHES if not parcae_profile_path(m).exists()] == []
    with pytest.raises(UserError, match="unknown Parcae model"):
        load_parcae_profile("gpt-175b")
