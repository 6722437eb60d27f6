"""``examples/elastic_gpt.py`` run unmodified but for its data: a data function that raises ``ValueError("bad shard")`` at
step 3 — a user's bug in their data, for the supervisor's tests with the real driver and the real job.

    python tests/bad_shard_driver.py --steps 8 ...   (every flag of examples/elastic_gpt.py)
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from torch import Tensor

from orchestrator.profiling import models

original = models.example_batch


def bad_shard(name: str, batch_size: int, seed: int, **model_kwargs: Any) -> tuple[Tensor, Tensor]:
    if seed == 3:
        raise ValueError("bad shard")
    return original(name, batch_size, seed, **model_kwargs)


if __name__ == "__main__":
    models.example_batch = bad_shard  # type: ignore[assignment]  # what the example imports from here on
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "elastic_gpt.py"), run_name="__main__")
