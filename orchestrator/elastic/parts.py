"""The concrete parts the job manager is assembled from: sessions, launchers, a pricing policy.

- :class:`TrainerSession` — one training attempt: a :class:`PipelineTrainer` on a plan chosen for
  the devices the placement actually has, resumed from a block-keyed checkpoint.
- :func:`local_launcher` — the embedded/local Ray target: a "migration" restarts the actors with a
  different device count (capped by what the machine offers, to rehearse partial capacity).
- :func:`cloud_launcher` — writes and validates the Ray cluster-launcher YAML for the chosen offer
  and calls ``ray up`` (dry-run by default: starting clouds is not testable here).
- :func:`simulated_throughputs` — samples/s of *this* model on each (GPU type, count), from the
  profile, the planner and the simulator, so cost policies rank offers for the job at hand.
- :func:`snapshot_policy` — the cloud module's migration planner over a price table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, cast

import pandas as pd
import torch
from torch import Tensor, nn

from cloud.migration import MigrationCosts, Migrate, KeepOffer, plan_migration
from cloud.records import normalize_gpu
from cloud.throughput import ThroughputTable
from orchestrator.core.cluster import Cluster, flat
from orchestrator.core.errors import UserError
from orchestrator.elastic.manager import Placement
from orchestrator.elastic.launch import Cloud, ClusterSpec, LaunchTarget, ray_up, write_cluster_yaml
from orchestrator.core.plan import Plan
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.core.profile import Profile

# Training speed relative to a V100 (fp32/mixed, typical transformer training; public benchmark
# ratios, rounded). Used only where no measured profile for that GPU exists.
GPU_RELATIVE_SPEED = {"K80": 0.22, "P100": 0.6, "T4": 0.45, "V100": 1.0, "A10G": 0.85, "L4": 0.75,
                      "A100": 2.2, "A100-80GB": 2.4, "H100": 4.0}


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to (re)build the training job anywhere; all picklable for Ray."""

    model_factory: Callable[[], list[nn.Module]]
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    optimizer_factory: Callable[[Any], torch.optim.Optimizer]
    data_fn: Callable[[int], tuple[Tensor, Tensor]]
    num_microbatches: int
    seed: int = 0


def plan_for(profile: Profile, cluster: Cluster, num_microbatches: int, planner: str = "pipedream", straight: bool = True) -> Plan:
    """The plan for the devices a placement actually got (straight: one stage per device)."""
    options = PlannerOptions(num_microbatches=num_microbatches, straight=straight, check_memory=False)
    return run_planner(planner, profile, cluster, options).plan


class TrainerSession:
    """A :class:`~orchestrator.elastic.manager.Session` over a real :class:`PipelineTrainer` on local Ray."""

    def __init__(self, model: ModelSpec, plan: Plan, resume: Path | None, workers: Any = None, start: bool = True, **trainer_kw: Any) -> None:
        from orchestrator.train.trainer import PipelineTrainer

        self.trainer = PipelineTrainer(
            model.model_factory, model.loss_fn, model.optimizer_factory, model.data_fn, model.num_microbatches,
            plan=plan, seed=model.seed, resume=resume, workers=workers, progress=False, **trainer_kw,
        )
        self.bubble_fraction = 0.0
        # Read once: the job manager asks after every step, and data_fn builds a whole batch.
        self.samples_per_step = int(model.data_fn(0)[0].shape[0])
        if start and not self.trainer.started:
            self.trainer.start()

    @property
    def plan(self) -> Plan:
        return self.trainer.plan

    def devices(self) -> list[dict[str, Any]]:
        """``[{"device", "node_id", ...}]``: the node each plan device's actor runs on."""
        return self.trainer.devices()

    @property
    def step(self) -> int:
        return self.trainer.step

    def train(self, steps: int) -> list[float]:
        result = self.trainer.fit(steps)
        if result.metrics:
            fractions = result.metrics[-1].bubble_fraction
            self.bubble_fraction = sum(fractions.values()) / max(1, len(fractions))
        return result.losses


    def checkpoint(self, directory: Path) -> Path:
        return self.trainer.save_checkpoint(directory)

    def close(self) -> None:
        self.trainer.shutdown()


def local_launcher(capacity: int | Callable[[Placement], int], intra_gbps: float = 100.0) -> Callable[[Placement], Placement]:
    """Bring up ``placement`` on the local Ray instance with at most ``capacity`` devices."""

    def launch(placement: Placement) -> Placement:
        cap = capacity(placement) if callable(capacity) else capacity
        got = max(1, min(placement.devices, cap))
        return replace(placement, target=LaunchTarget("local"), devices=got, cluster=flat(got, intra_gbps))

    return launch


def cloud_launcher(out_dir: Path, project_id: str | None = None, dry_run: bool = True) -> Callable[[Placement], Placement]:
    """Write + validate the cluster YAML for the placement's offer and ``ray up`` it."""

    def launch(placement: Placement) -> Placement:
        offer = placement.offer
        if offer is None:
            raise UserError("a cloud placement needs an offer (cloud, region, instance type)")
        spec = ClusterSpec(cloud=cast(Cloud, offer.cloud), region=offer.region, zone=offer.zone or None, instance_type=offer.instance_type,
                           spot=offer.spot, gpu_type=offer.gpu_type, gpus_per_node=offer.gpu_count, project_id=project_id)
        path = write_cluster_yaml(spec, out_dir / f"{offer.cloud}-{offer.region}-{offer.instance_type}.yaml")
        ray_up(path, dry_run=dry_run)
        return replace(placement, target=LaunchTarget("cloud", spec=spec), devices=spec.total_gpus)

    return launch


def simulated_throughputs(
    profile: Profile, gpus: Iterable[tuple[str, int]], num_microbatches: int, model: str = "job",
    intra_gbps: float = 100.0, planner: str = "pipedream",
) -> ThroughputTable:
    """Samples/s of ``profile``'s model on each (GPU type, count): planned and simulated, not guessed."""
    table: dict[tuple[str, str, int], float] = {}
    samples = profile.microbatch_size * num_microbatches
    for gpu, count in set(gpus):
        speed = GPU_RELATIVE_SPEED.get(normalize_gpu(gpu))
        if speed is None or count < 1:
            continue
        cluster = flat(count, intra_gbps, speeds=[speed] * count)
        result = run_planner(planner, profile, cluster, PlannerOptions(num_microbatches=num_microbatches, check_memory=False))
        table[(model, gpu, count)] = samples / result.iteration_time_s
    return ThroughputTable(table)


def snapshot_policy(
    offers: pd.DataFrame, throughputs: ThroughputTable, model: str, total_samples: float, samples_per_step: float,
    costs: MigrationCosts = MigrationCosts(), exclude_preempted: bool = True,
) -> Callable[[Placement, bool, int], KeepOffer | Migrate]:
    """The cloud migration planner over ``offers``; a preempted offer is removed from the candidates."""

    def decide(placement: Placement, preempted: bool, step: int) -> KeepOffer | Migrate:
        remaining = max(0.0, total_samples - step * samples_per_step)
        current = placement.offer
        if current is None:
            return KeepOffer("not on a priced offer")
        table = offers
        if preempted and exclude_preempted:
            same = (offers.cloud == current.cloud) & (offers.region == current.region) & (offers.zone == current.zone) \
                & (offers.instance_type == current.instance_type) & (offers.spot == current.spot)
            table = offers[~same]
        return plan_migration(current, table, throughputs, model, remaining, costs)

    return decide
