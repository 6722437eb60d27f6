"""The configuration of one elastic job, in the spirit of Ray Train: a few frozen dataclasses.

``TrainConfig`` says what to train, ``ScalingConfig`` on what, ``RunConfig`` where state goes and
how much failure is tolerated, ``AdaptConfig`` whether the controller re-plans live, and
``SpotConfig`` how preemptions and prices are handled. Each part can be switched off on its own;
:class:`~orchestrator.elastic.job_loop.ElasticJob` runs them together in one loop. Bad values are one
line (:class:`~orchestrator.core.errors.UserError`) at construction, before any actor starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from actors import storage
from actors.training import TrainingOptions
from actors.storage_env import PROTOCOLS, SUPPORTED
from orchestrator.core import limits
from orchestrator.core.cluster import Cluster
from orchestrator.adapt.controller import ControllerConfig
from orchestrator.adapt.faults import FaultSchedule
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan

MAX_RUNTIME_MICROBATCHES = 4096  # the runtime's message-tag space (orchestrator.core.limits)

@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What to train: picklable factories every stage actor rebuilds identically."""

    model_factory: Callable[[], list[nn.Module]]
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    optimizer_factory: Callable[[Any], torch.optim.Optimizer]
    data_fn: Callable[[int], tuple[Tensor, Tensor]]
    """``data_fn(step) -> (inputs, targets)``, deterministic in ``step`` (exact restarts need it)."""
    num_microbatches: int = 8
    seed: int = 0
    training: TrainingOptions = TrainingOptions()
    """Clipping by the global norm, LR schedules (one per block optimizer), fp16 loss scaling —
    the same options :class:`~orchestrator.train.runtime.PipelineRuntime` takes. Weight-decay groups
    and mixed precision wrap the factories (``decay_groups(AdamW, 0.1)``, ``autocast_blocks(factory,
    torch.bfloat16)``); recomputation is a plan stage's ``recompute`` (planners turn it on for
    devices over memory)."""
    eval_data_fn: Callable[[int], tuple[Tensor, Tensor]] | None = None
    """Evaluation batches: ``eval_data_fn(i)`` for ``i`` in ``0 .. eval_steps - 1`` (the same batches every time),
    read on the workers of the first and the last stage like ``data_fn``."""
    eval_every: int = 0
    """Evaluate every N steps (0: never): a forward-only pass over the current plan, no gradient, dropout off,
    nothing changed; its mean loss is an ``eval`` event (a callback's ``on_event``) and ``orchestrator status``'s
    ``eval_loss``."""
    eval_steps: int = 1
    """Batches per evaluation."""

    def __post_init__(self) -> None:
        for name in ("model_factory", "loss_fn", "optimizer_factory", "data_fn"):
            limits.function(getattr(self, name), "TrainConfig", name)
        if self.eval_data_fn is not None:
            limits.function(self.eval_data_fn, "TrainConfig", "eval_data_fn")
        limits.count(self.eval_every, "TrainConfig", "eval_every", minimum=0, maximum=10**9)
        limits.count(self.eval_steps, "TrainConfig", "eval_steps", minimum=1, maximum=10**6)
        if self.eval_every and self.eval_data_fn is None:
            raise UserError("TrainConfig: eval_every needs an eval_data_fn")
        limits.count(self.num_microbatches, "TrainConfig", "num_microbatches", maximum=MAX_RUNTIME_MICROBATCHES)
        limits.count(self.seed, "TrainConfig", "seed", minimum=0, maximum=2**63 - 1)
        limits.instance(self.training, TrainingOptions, "TrainConfig", "training")


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """On what: ``devices`` stage actors (device ``d`` = Ray slot ``d``), one plan over them."""

    devices: int = 4
    planner: str = "pipedream"
    plan: Plan | None = None
    """A fixed starting plan instead of ``planner``'s."""
    cluster: Cluster | None = None
    """The nominal cluster the plan, the controller and evacuation reason about (memory per
    device included; ``capacity`` devices); default: equal devices at 10 Gb/s."""
    use_gpu: bool | None = None
    max_devices: int | None = None
    """Live growth: the job takes up to this many devices as capacity joins (a new Ray node with
    the job's kind of device, or a rehearsed :class:`~orchestrator.adapt.faults.Join` in
    ``AdaptConfig.faults``): each gets a stage actor, and blocks by live two-worker moves when
    the controller's arbiter says it pays (:mod:`orchestrator.elastic.growth`). ``None``: growth off."""
    node_poll_s: float = 2.0
    """With growth on, how often the loop reads Ray's node table for nodes that joined."""
    straight: bool = False
    """Plans without replicated stages (one device per stage) only. Off: the planner replicates a stage
    (data parallelism inside it) where that is faster, as the fastest plans at tens of devices do
    (``benchmarks/spot_goodput.py``: 10-17% shorter iterations at 16-32 V100s)."""

    @property
    def capacity(self) -> int:
        """Devices the job may ever have: device ids are ``0 .. capacity - 1``, never reused."""
        return self.max_devices or self.devices

    def __post_init__(self) -> None:
        where = "ScalingConfig"
        limits.devices(limits.count(self.devices, where, "devices"), f"{where}.devices")
        if self.max_devices is not None:
            limits.devices(limits.count(self.max_devices, where, "max_devices"), f"{where}.max_devices")
        limits.text(self.planner, where, "planner")
        limits.flag(self.straight, where, "straight")
        from orchestrator.planners.base import get_planner

        try:
            get_planner(self.planner)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
        limits.instance(self.plan, Plan, where, "plan", optional=True)
        limits.instance(self.cluster, Cluster, where, "cluster", optional=True)
        if self.use_gpu is not None:
            limits.flag(self.use_gpu, where, "use_gpu")
        limits.number(self.node_poll_s, where, "node_poll_s", maximum=3600.0)
        if self.max_devices is not None and self.max_devices < self.devices:
            raise UserError(f"ScalingConfig: max_devices={self.max_devices} is below devices={self.devices}")
        if self.node_poll_s < 0:
            raise UserError("ScalingConfig.node_poll_s must be >= 0")
        if self.cluster is not None and self.cluster.size != self.capacity:
            raise UserError(f"ScalingConfig: cluster has {self.cluster.size} devices but "
                            + (f"max_devices={self.max_devices}" if self.max_devices else f"devices={self.devices}"))
        if self.plan is not None and max(self.plan.devices) >= self.devices:
            raise UserError(f"ScalingConfig: the plan uses device {max(self.plan.devices)} but devices={self.devices}")


def _env(name: str) -> str | None:
    """A setting the supervisor (:mod:`orchestrator.supervise`) hands a driver it started, so that an
    unmodified driver script runs as one segment of the supervisor's run."""
    value = os.environ.get(name)
    return value if value else None


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where state goes and how much failure is tolerated. The storage location *is* the run
    (:mod:`orchestrator.elastic.run_record`): a job on a location that holds checkpoints of the same
    model resumes from the newest committed one; one of another model is refused."""

    storage: str | Path = field(default_factory=lambda: _env("RAYPIPE_STORAGE") or "checkpoints")
    """A local folder or an ``s3://``, ``gs://``, ``az://`` URI (fsspec; credentials and endpoints
    from each cloud's usual environment variables). Default: ``$RAYPIPE_STORAGE``, else ``checkpoints``."""
    events: str | Path | None = None
    """A local JSONL copy of this job's events (default: ``events.jsonl`` beside a local storage
    folder). Every job also writes its own segment under ``STORAGE/events/``; ``orchestrator events
    STORAGE`` prints the merged log of the whole run."""
    checkpoint_every: int | str = 10
    """Steps between periodic checkpoints (0: only the final one). ``"auto"``: as often as pays, from what the
    job measures: Young's interval between a checkpoint's stall and the time between the deaths seen so far
    (:func:`~orchestrator.adapt.policies.checkpoint_interval`): rarely while nothing fails, every step or two on
    spot capacity that is reclaimed every few minutes (``benchmarks/spot_goodput.py``)."""
    async_checkpoints: bool = True
    """Snapshot to host memory and upload while training continues (commit at the next boundary)."""
    max_failures: int = 3
    """Worker deaths without notice the job survives; one more ends it (:class:`JobFailed`)."""
    pipelined: bool = True
    """Submit iteration k+1 before gathering k when no decision is pending."""
    name: str = "elastic"
    resume: str = field(default_factory=lambda: _env("RAYPIPE_RESUME") or "auto")
    """``auto``: continue the run at the newest committed checkpoint when there is one; ``never``:
    start from the seed (refused when the location already holds checkpoints of this run: use
    another location); ``require``: refuse to start without one. Default ``$RAYPIPE_RESUME``."""
    run_id: str | None = field(default_factory=lambda: _env("RAYPIPE_RUN_ID"))
    """The run's id (default: the location's, or a new one); a location of another run is refused."""
    cluster: str | None = field(default_factory=lambda: _env("RAYPIPE_CLUSTER"))
    """The cluster id its supervisor gave this job (``None``: not supervised). A supervised job asks
    its supervisor to migrate (it commits, records the request and stops) instead of restarting in place."""
    snapshot_every: int = 0
    """In-memory snapshots every N steps between stored checkpoints (0: off): each worker writes its
    blocks' state into Ray's object store and a neighbour (on another node where there is one) keeps it,
    so a death without notice loses at most the steps since the last snapshot (the last complete one: each is
    copied while the next step runs, its optimizer step waiting for the copy, and taken by the neighbour beside
    training). The object store needs room for two generations of each worker's state."""
    recover_in_place: bool = True
    """A death without notice: the survivors keep their processes and roll back from host copies
    (off, or when impossible: every worker restarts from the newest checkpoint)."""
    progress: bool = True
    """A progress line on stdout every 10 steps (:class:`~orchestrator.train.callbacks.Progress`)."""
    hang_timeout_s: float | None = None
    """A worker whose step runs past this is hung: its process is ended and it is recovered like a dead one.
    ``None``: 10 x the recent median step, at least 30 s (a loaded machine never trips it)."""
    storage_retry_s: float = 180.0
    """A checkpoint the storage does not take (unreachable) is written again with backoff for this long; then the job
    ends with one line and exit 74 (``EXIT_STORAGE``: infrastructure, a supervisor relaunches), as it does at once on a
    full disk. Writes that are only hints (progress, events) never end the job."""
    callbacks: tuple[Any, ...] = ()
    """The user's callbacks and trackers (:mod:`orchestrator.train.callbacks`, :mod:`orchestrator.sinks`), called
    before those given to the job itself (as in Ray Train's ``RunConfig(callbacks=...)``)."""

    def __post_init__(self) -> None:
        where = "RunConfig"
        location = limits.path_text(self.storage, where, "storage")
        if self.events is not None:
            limits.path_text(self.events, where, "events")
        if self.checkpoint_every != "auto":
            limits.count(self.checkpoint_every, where, "checkpoint_every (a number of steps or 'auto')", minimum=0, maximum=10**9)
        limits.count(self.max_failures, where, "max_failures", minimum=0, maximum=10**6)
        limits.count(self.snapshot_every, where, "snapshot_every", minimum=0, maximum=10**9)
        limits.flag(self.async_checkpoints, where, "async_checkpoints")
        limits.flag(self.pipelined, where, "pipelined")
        limits.flag(self.recover_in_place, where, "recover_in_place")
        limits.flag(self.progress, where, "progress")
        if self.hang_timeout_s is not None:
            limits.number(self.hang_timeout_s, where, "hang_timeout_s", positive=True, maximum=86400.0)
        limits.number(self.storage_retry_s, where, "storage_retry_s", maximum=86400.0)
        from orchestrator.train.callbacks import Callback

        if not isinstance(self.callbacks, tuple) or not all(isinstance(c, Callback) for c in self.callbacks):
            raise UserError(f"{where}: callbacks must be a tuple of orchestrator.Callback objects")
        if not limits.text(self.name, where, "name").strip():
            raise UserError(f"{where}: name must not be empty")
        if self.resume not in ("auto", "never", "require", "force"):
            raise UserError(f"{where}: resume={self.resume!r} is not one of auto, never, require, force")
        for field_name in ("run_id", "cluster"):
            value = getattr(self, field_name)
            if value is not None and not limits.text(value, where, field_name).strip():
                raise UserError(f"{where}: {field_name} must not be empty")
        scheme = storage.scheme(location)
        if scheme and scheme not in PROTOCOLS:
            raise UserError(f"RunConfig: unknown storage scheme {scheme!r} in {self.storage} (use {SUPPORTED})")
        if scheme and PROTOCOLS[scheme] != "file" and not location.split("://", 1)[1].split("/", 1)[0]:
            raise UserError(f"{where}: storage {location!r} names no bucket or container (e.g. {scheme}://bucket/run)")

    @property
    def supervised(self) -> bool:
        return self.cluster is not None

    def events_path(self) -> Path | None:
        if self.events is not None:
            return Path(self.events)
        if storage.is_local(self.storage):
            return Path(storage.local_path(self.storage)).parent / "events.jsonl"
        return None


@dataclass(frozen=True, kw_only=True)
class AdaptConfig:
    """The adaptive controller: observe speeds and links, move blocks live when it pays."""

    enabled: bool = True
    controller: ControllerConfig = ControllerConfig(straight=True)
    faults: FaultSchedule = FaultSchedule()
    """Rehearsal only: slowdowns/throttles (CPU workers) and kills injected at given iterations;
    applied even with ``enabled=False`` (the controller off, the faults still on)."""

    def __post_init__(self) -> None:
        limits.flag(self.enabled, "AdaptConfig", "enabled")
        limits.instance(self.controller, ControllerConfig, "AdaptConfig", "controller")
        limits.instance(self.faults, FaultSchedule, "AdaptConfig", "faults")


@dataclass(frozen=True)
class InjectedNotice:
    """Rehearsal: after step ``at_step``, ``devices`` get a notice with ``seconds`` left (empty:
    every device the job has then, as when the whole placement is reclaimed)."""

    at_step: int
    seconds: float = 120.0
    devices: tuple[int, ...] | None = None
    """``None``: the device of the middle stage at that moment (one that holds blocks)."""

    def __post_init__(self) -> None:
        where = "InjectedNotice"
        limits.count(self.at_step, where, "at_step", minimum=0, maximum=10**12)
        limits.number(self.seconds, where, "seconds", positive=True, maximum=86400.0 * 365)
        if self.devices is not None:
            if not isinstance(self.devices, tuple):
                raise UserError(f"{where}: devices must be a tuple of device ids or None, got {limits._show(self.devices)}")
            for d in self.devices:
                limits.count(d, where, "device", minimum=0, maximum=limits.MAX_DEVICES - 1)


def _price_events(text: str | None) -> tuple[tuple[int, float], ...]:
    """``STEP:FACTOR[,STEP:FACTOR]`` (the supervisor's ``--price-change-at`` rehearsal)."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        step, _, factor = part.partition(":")
        try:
            out.append((int(step), float(factor)))
        except ValueError:
            raise UserError(f"RAYPIPE_PRICE_EVENTS: {part!r} is not STEP:FACTOR") from None
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class SpotConfig:
    """Preemptions and prices: live evacuation when it fits, else checkpoint → migration → restore."""

    enabled: bool = True
    evacuate_live: bool = True
    """Off: every notice is handled by checkpoint → migration → restore (the baseline)."""
    margin_s: float = 5.0
    """Evacuation (or the checkpoint) must be predicted to finish this long before the deadline."""
    notices: tuple[InjectedNotice, ...] = ()
    watch: str | None = None
    """``aws``/``gcp``/``azure``: a watcher of that cloud's metadata service on every node of the
    job (and the driver's), polled between iterations (:mod:`orchestrator.elastic.notice_watchers`)."""
    ray_drain_poll_s: float = 5.0
    """Read the node watchers and Ray's drain requests (:mod:`orchestrator.elastic.drain`) this often,
    between iterations; 0: never."""
    catalog: str | None = field(default_factory=lambda: _env("RAYPIPE_PRICES"))
    """Price file or folder for migration decisions (default: the bundled snapshot)."""
    offer: Any = field(default_factory=lambda: _env("RAYPIPE_OFFER"))
    """The :class:`cloud.records.Offer` the job runs on (default: the catalog's cheapest spot offer
    with as many GPUs as the job has devices); migrations are priced against it."""
    migration_check_every: int = 0
    """Ask the migration planner for a cheaper place every N steps (0: only on preemption and
    replayed price changes)."""
    price_events: tuple[tuple[int, float], ...] = field(default_factory=lambda: _price_events(_env("RAYPIPE_PRICE_EVENTS")))
    """Rehearsal: (step, factor) — after that step the current offer's price is multiplied by
    ``factor`` in the planner's view, as a replayed price change."""

    horizon_scale: float = 1e4
    """Samples still to train per sample of this run, for pricing a move (a rehearsal is a short
    slice of a long job: moving pays only over the job's whole remaining length)."""
    checkpoint_gb: float = 0.05
    """Checkpoint size for the migration planner's transfer cost."""
    max_price_age_s: float | None = 24 * 3600.0
    """A migration resting on prices older than this is not taken automatically (event
    ``migration_skipped`` with the prices' age; ``orchestrator prices refresh`` renews them);
    ``None``: no limit. Rehearsals (``price_events``) stamp their price file when the job starts."""

    def __post_init__(self) -> None:
        where = "SpotConfig"
        for name in ("enabled", "evacuate_live"):
            limits.flag(getattr(self, name), where, name)
        limits.number(self.margin_s, where, "margin_s", maximum=86400.0)
        limits.number(self.ray_drain_poll_s, where, "ray_drain_poll_s", maximum=3600.0)
        limits.count(self.migration_check_every, where, "migration_check_every", minimum=0, maximum=10**9)
        limits.number(self.horizon_scale, where, "horizon_scale", positive=True, maximum=1e12)
        limits.number(self.checkpoint_gb, where, "checkpoint_gb", maximum=1e6)
        if not isinstance(self.notices, tuple) or not all(isinstance(n, InjectedNotice) for n in self.notices):
            raise UserError(f"{where}: notices must be a tuple of InjectedNotice, got {limits._show(self.notices)}")
        if self.watch is not None:
            _check_watch(self.watch)
        if self.catalog is not None:
            limits.path_text(self.catalog, where, "catalog")
        if self.max_price_age_s is not None:
            limits.number(self.max_price_age_s, where, "max_price_age_s", positive=True, maximum=10 * 365 * 86400.0)
        if self.offer is not None and not isinstance(self.offer, str) and not hasattr(self.offer, "label"):
            raise UserError(f"{where}: offer must be a cloud.records.Offer or its label, got {limits._show(self.offer)}")
        if not isinstance(self.price_events, tuple):
            raise UserError(f"{where}: price_events must be a tuple of (step, factor), got {limits._show(self.price_events)}")
        for event in self.price_events:
            if not isinstance(event, tuple) or len(event) != 2:
                raise UserError(f"{where}: each price event must be (step, factor), got {limits._show(event)}")
            limits.count(event[0], where, "price event step", minimum=0, maximum=10**12)
            limits.number(event[1], where, "price event factor", positive=True, maximum=1e6)
        if self.notices and not self.enabled:
            raise UserError("SpotConfig: injected notices need enabled=True")


def _check_watch(name: object) -> None:
    """A cloud whose preemption watcher exists (aliases accepted), with a "did you mean" otherwise."""
    from cloud.errors import CloudError
    from cloud.preemption import WATCHERS
    from cloud.records import canonical_cloud

    limits.text(name, "SpotConfig", "watch")
    try:
        cloud = canonical_cloud(str(name))
    except CloudError:
        cloud = None
    if cloud not in WATCHERS:
        raise UserError(f"SpotConfig: unknown watch {name!r}{limits.suggest(str(name), WATCHERS)}")
