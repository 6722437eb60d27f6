"""Shared fixtures: ONE local Ray instance per test session, started only if a test asks for it.

Starting Ray costs seconds and every Ray actor process another second or two on a small CI box,
so the instance (and, for runtime tests, one pool of stage workers that each test re-partitions
for its plan) lives for the whole session instead of per test.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

LONGEST_FIRST = ("test_supervisor.py", "test_multinode.py", "test_supervisor_job.py", "test_planner_oracle.py", "test_elastic_contract.py",
                 "test_soak.py", "test_runtime.py", "test_runtime_dispatch.py", "test_recovery_in_place.py", "test_hf_models.py",
                 "test_provision.py", "test_checkpoint_s3_ray.py", "test_gpu_check.py", "test_controller_noise.py")
"""Test files by their measured serial seconds (175 down to 26 s), longest first. ``make test`` hands whole files to
two workers in collection order; a long file collected last (alphabetically: the supervisor's) left one worker
running it alone for minutes at the end."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray with a few logical CPUs; actors request fractions of one, so 2 cores suffice."""
    ray = pytest.importorskip("ray")
    from actors.ray_session import LOCAL_SYSTEM_CONFIG

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                 _system_config=LOCAL_SYSTEM_CONFIG)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def worker_group(ray_session: Any) -> Iterator[Any]:
    """Five stage workers shared by every runtime test (plans use up to five devices)."""
    from actors.group import WorkerGroup

    group = WorkerGroup(5, use_gpu=False)
    yield group
    group.shutdown()


@pytest.fixture
def world_of_one() -> Iterator[None]:
    """A gloo process group of one in this process (for code that calls collectives), torn down after the test."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
