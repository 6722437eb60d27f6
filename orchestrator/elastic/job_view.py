"""What the job's parts may read and change of a running :class:`~orchestrator.elastic.job_loop.ElasticJob`.

The parts the job delegates to — the spot/migration glue (:mod:`job_spot`) and live
growth (:mod:`growth`) — are handed the job itself; this protocol is the one statement of what they use, so they
need not import the loop (which imports them: no import cycle) and the rest of the loop's state stays its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.adapt.controller import Controller
    from orchestrator.adapt.handle import MoveReport
    from orchestrator.core.cluster import Cluster
    from orchestrator.core.plan import Plan
    from orchestrator.core.profile import Profile
    from orchestrator.elastic.price_view import PriceView
    from orchestrator.elastic.job_config import AdaptConfig, RunConfig, ScalingConfig, SpotConfig, TrainConfig
    from orchestrator.train.runtime import PipelineRuntime


class Placed(Protocol):
    placed: int  # device ids below this have (had) a stage worker


class JobView(Protocol):
    """The running job, as its parts see it (``ElasticJob`` satisfies it)."""

    train: TrainConfig
    scaling: ScalingConfig
    run: RunConfig
    adapt: AdaptConfig
    spot: SpotConfig
    cluster: Cluster
    profile: Profile
    runtime: PipelineRuntime
    controller: Controller | None
    clock: Callable[[], float]
    alive: set[int]  # devices whose workers train
    iteration_s: list[float]  # recent iteration times
    restarts: int
    target_steps: int  # the step the running fit ends at

    @property
    def growth(self) -> Placed: ...

    @property
    def checkpoint_s(self) -> float: ...  # how long a synchronous checkpoint took last time

    def emit(self, event: str, **fields: Any) -> None: ...

    def switch_live(self, plan: Plan, members: set[int] | None = None) -> MoveReport: ...

    def slot_map(self) -> dict[int, int]: ...

    def price_view(self) -> "PriceView": ...  # built once by the job

    def checkpoint_now(self, why: str) -> str | None: ...

    def restart_on(self, plan: Plan, source: str | Path | None, devices: tuple[int, ...]) -> None: ...

    def commit_pending(self) -> None: ...

    def device_joined(self, device: int) -> None: ...

    def request_migration(self, reason: str, target: str, detail: str, commit: bool = True) -> None: ...
