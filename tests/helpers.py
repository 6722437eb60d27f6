"""Small hand-made profiles and clusters shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from orchestrator.core.profile import Block, Profile

_ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the checkout, or beside its parent (a git worktree under <project>/wt/<name>)
SHARED = next((p for p in (_ROOT.parent / "shared", _ROOT.parents[1] / "shared") if p.exists()), _ROOT.parent / "shared")


def uniform_profile(num_blocks: int, fwd: float = 1.0, bwd: float = 2.0, act: float = 0.0, params: float = 1.0) -> Profile:
    return Profile("uniform", tuple(Block(f"b{i}", fwd, bwd, act, params) for i in range(num_blocks)))


def random_profile(num_blocks: int, seed: int, act_scale: float = 5e8) -> Profile:
    rng = np.random.default_rng(seed)
    return Profile(
        f"random{seed}",
        tuple(
            Block(f"b{i}", float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.2, 2.0)), float(rng.uniform(1e6, act_scale)), float(rng.uniform(1e6, 2e8)))
            for i in range(num_blocks)
        ),
        input_bytes=1e6,
    )
