"""Where a job runs: the local Ray instance, an existing cluster, or a new cloud cluster.

A new cloud cluster is described by a Ray cluster-launcher YAML generated from the placement the
cloud policy chose (cloud, region, zone, instance type, spot). The YAML is validated against the
schema Ray itself ships (``ray/autoscaler/ray-schema.json``) plus the checks Ray cannot make
(GPU counts, spot flags, zone inside region), so a bad placement fails here and not ten minutes
into ``ray up``. Starting real clusters is a thin subprocess call to ``ray up`` / ``ray down``;
everything before it is testable offline. A KubeRay ``RayCluster`` manifest is offered for users
who run Ray on Kubernetes.

The user's own cloud settings (GCP project, Azure subscription and resource group, the network to
place nodes in) come from the spec, else a cloud config mapping (``--cloud-config FILE``: ``gcp:
{project_id, network, subnetwork}``, ``aws: {subnet_id, security_group_ids}``, ``azure:
{subscription_id, resource_group}``), else the usual environment (``GOOGLE_CLOUD_PROJECT``,
``CLOUDSDK_CORE_PROJECT``, ``AZURE_SUBSCRIPTION_ID``); a missing one is one line naming where to
set it, and a placeholder such as ``my-project`` is refused. The head's dashboard (the Job API)
listens on the head's 127.0.0.1 only: it is reached through an SSH tunnel (``ray dashboard``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cloud.errors import CloudError
from cloud.records import instance_gpus
from orchestrator.core.errors import UserError

Cloud = Literal["aws", "gcp", "azure"]

GCP_ACCELERATOR = {"V100": "nvidia-tesla-v100", "K80": "nvidia-tesla-k80", "P100": "nvidia-tesla-p100",
                   "T4": "nvidia-tesla-t4", "A100": "nvidia-tesla-a100", "L4": "nvidia-l4", "H100": "nvidia-h100-80gb"}
# Accelerator-optimized GCP machine types come with their GPUs; others (n1) attach them.
GCP_GPU_MACHINE_FAMILIES = ("a2-", "a3-", "g2-")
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
_PLACEHOLDER_RE = re.compile(r"^(my|your|example|sample|test)[-_]?(project|subscription|sub|project[-_]id)$|^<.*>$|^x+$",
                             re.IGNORECASE)
GCP_PROJECT_ENV = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT")
AZURE_SUBSCRIPTION_ENV = ("AZURE_SUBSCRIPTION_ID", "ARM_SUBSCRIPTION_ID")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A cloud cluster for one pipeline job: ``num_nodes`` GPU nodes of one instance type."""

    cloud: Cloud
    region: str
    instance_type: str
    num_nodes: int = 1
    zone: str | None = None
    spot: bool = True
    cluster_name: str = "raypipe"
    gpu_type: str | None = None
    gpus_per_node: int | None = None
    project_id: str | None = None  # GCP
    resource_group: str = "raypipe"  # Azure
    subscription_id: str | None = None  # Azure (default: the Azure CLI's current subscription)
    subnet_id: str | None = None  # AWS: the subnet to launch in
    security_group_ids: tuple[str, ...] = ()  # AWS
    network: str | None = None  # GCP: VPC network (name or self link)
    subnetwork: str | None = None  # GCP
    head_instance_type: str | None = None
    setup_commands: tuple[str, ...] = ("pip install -U 'ray[default]' raypipe",)
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cloud not in ("aws", "gcp", "azure"):
            raise UserError(f"unknown cloud {self.cloud!r}; choose aws, gcp or azure")
        if self.num_nodes < 1:
            raise UserError("a cluster needs at least one node")
        if not _NAME_RE.match(self.cluster_name):
            raise UserError(f"cluster name {self.cluster_name!r} must be lower-case letters, digits and '-' (max 40)")
        for what, value in (("project id", self.project_id), ("subscription id", self.subscription_id)):
            if value is not None and _PLACEHOLDER_RE.match(value.strip()):
                raise UserError(f"{what} {value!r} is a placeholder; give your own (--cloud-config or the cloud's environment)")
        if self.zone and self.cloud != "azure" and not self.zone.startswith(self.region):
            raise UserError(f"zone {self.zone} is not in region {self.region}")
        gpu, count = self.gpu_type, self.gpus_per_node
        if not gpu or not count:
            # One instance table for the whole product (cloud.records); GCP's n1 hosts carry
            # attached GPUs, so they need gpu_type/gpus_per_node given explicitly.
            try:
                known_gpu, known_count = instance_gpus(self.cloud, self.instance_type)
            except CloudError as exc:
                raise UserError(f"{exc}; or give gpu_type and gpus_per_node") from None
            gpu, count = gpu or known_gpu, count or known_count
        if self.cloud == "gcp" and not self.instance_type.startswith(GCP_GPU_MACHINE_FAMILIES) and gpu not in GCP_ACCELERATOR:
            raise UserError(f"no GCP accelerator for GPU {gpu!r} (known: {', '.join(GCP_ACCELERATOR)})")
        object.__setattr__(self, "gpu_type", gpu)
        object.__setattr__(self, "gpus_per_node", int(count))

    @property
    def total_gpus(self) -> int:
        return int(self.gpus_per_node or 0) * self.num_nodes


def _node_config(spec: ClusterSpec, worker: bool) -> dict[str, Any]:
    itype = spec.instance_type if worker else (spec.head_instance_type or spec.instance_type)
    spot = spec.spot and worker
    if spec.cloud == "aws":
        cfg: dict[str, Any] = {
            "InstanceType": itype,
            "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 200}}],
        }
        if spot:
            cfg["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {"InstanceInterruptionBehavior": "terminate"}}
        if spec.zone:
            cfg["Placement"] = {"AvailabilityZone": spec.zone}
        if spec.subnet_id:
            cfg["SubnetIds"] = [spec.subnet_id]
        if spec.security_group_ids:
            cfg["SecurityGroupIds"] = list(spec.security_group_ids)
        return cfg
    if spec.cloud == "gcp":
        cfg = {
            "machineType": itype,
            "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                       "initializeParams": {"diskSizeGb": 200, "sourceImage": "projects/deeplearning-platform-release/global/images/family/common-cu121"}}],
            "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": False},
            "metadata": {"items": [{"key": "install-nvidia-driver", "value": "True"}]},
        }
        if not itype.startswith(GCP_GPU_MACHINE_FAMILIES):
            cfg["guestAccelerators"] = [{"acceleratorType": GCP_ACCELERATOR[str(spec.gpu_type)], "acceleratorCount": spec.gpus_per_node}]
        if spot:
            cfg["scheduling"].update({"provisioningModel": "SPOT", "preemptible": True, "instanceTerminationAction": "STOP"})
        if spec.network or spec.subnetwork:
            nic: dict[str, Any] = {"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}
            if spec.network:
                nic["network"] = spec.network
            if spec.subnetwork:
                nic["subnetwork"] = spec.subnetwork
            cfg["networkInterfaces"] = [nic]
        return cfg
    params: dict[str, Any] = {
        "vmSize": itype, "imagePublisher": "microsoft-dsvm", "imageOffer": "ubuntu-hpc",
        "imageSku": "2204", "imageVersion": "latest",
    }
    if spot:
        params.update({"priority": "Spot", "billingProfile": {"maxPrice": -1}})
    return {"azure_arm_parameters": params}


def cluster_config(spec: ClusterSpec) -> dict[str, Any]:
    """The Ray cluster-launcher config (as a dict) for ``spec``."""
    provider: dict[str, Any] = {"type": spec.cloud}
    if spec.cloud == "aws":
        provider.update({"region": spec.region, "cache_stopped_nodes": False})
        if spec.zone:
            provider["availability_zone"] = spec.zone
    elif spec.cloud == "gcp":
        if not spec.project_id:
            raise UserError("a GCP cluster needs a project id (gcp.project_id in --cloud-config, or GOOGLE_CLOUD_PROJECT)")
        provider.update({"region": spec.region, "availability_zone": spec.zone or f"{spec.region}-a", "project_id": spec.project_id})
    else:
        provider.update({"location": spec.region, "resource_group": spec.resource_group, "cache_stopped_nodes": False})
        if spec.subscription_id:
            provider["subscription_id"] = spec.subscription_id
        if spec.zone:
            provider["availability_zone"] = spec.zone
    gpu_resources = {"GPU": spec.gpus_per_node, f"accelerator_type:{spec.gpu_type}": 1}
    workers = spec.num_nodes - 1
    config: dict[str, Any] = {
        "cluster_name": spec.cluster_name,
        "max_workers": workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 10,
        "provider": provider,
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            "head": {"resources": dict(gpu_resources), "node_config": _node_config(spec, worker=spec.num_nodes == 1)},
            "gpu_worker": {"min_workers": workers, "max_workers": workers, "resources": dict(gpu_resources),
                           "node_config": _node_config(spec, worker=True)},
        },
        "head_node_type": "head",
        "file_mounts": {},
        "setup_commands": list(spec.setup_commands),
        # the dashboard (Job API) on the head's loopback only: the supervisor comes through an SSH tunnel
        "head_start_ray_commands": ["ray stop", "ulimit -n 65536; ray start --head --port=6379 --autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=127.0.0.1"],
        "worker_start_ray_commands": ["ray stop", "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379"],
    }
    return config


def spec_for_offer(offer: Any, cluster_name: str, cloud_config: dict[str, Any] | None = None,
                   environ: dict[str, str] | None = None) -> ClusterSpec:
    """The :class:`ClusterSpec` of a :class:`cloud.records.Offer`, with the user's project,
    subscription and network from ``cloud_config`` (per cloud), else the usual environment."""
    env = os.environ if environ is None else environ
    own = dict((cloud_config or {}).get(offer.cloud) or {})
    extra: dict[str, Any] = {}
    if offer.cloud == "gcp":
        project = own.get("project_id") or next((env[k] for k in GCP_PROJECT_ENV if env.get(k)), None)
        if not project:
            raise UserError(f"{offer.label()}: no GCP project (gcp.project_id in --cloud-config, or GOOGLE_CLOUD_PROJECT)")
        extra.update(project_id=str(project), network=own.get("network"), subnetwork=own.get("subnetwork"))
    elif offer.cloud == "azure":
        subscription = own.get("subscription_id") or next((env[k] for k in AZURE_SUBSCRIPTION_ENV if env.get(k)), None)
        extra.update(subscription_id=subscription, resource_group=str(own.get("resource_group") or "raypipe"))
    elif offer.cloud == "aws":
        groups = own.get("security_group_ids") or ()
        extra.update(subnet_id=own.get("subnet_id"), security_group_ids=tuple(str(g) for g in groups))
    return ClusterSpec(cloud=offer.cloud, region=offer.region, zone=offer.zone or None, instance_type=offer.instance_type,
                       spot=bool(offer.spot), gpu_type=offer.gpu_type, gpus_per_node=int(offer.gpu_count),
                       cluster_name=cluster_name, **extra)


def ray_schema() -> dict[str, Any]:
    import ray.autoscaler

    path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    return dict(json.loads(path.read_text()))


def validate_config(config: dict[str, Any]) -> None:
    """Ray's own JSON schema, then the GPU/spot consistency Ray does not check."""
    import jsonschema

    try:
        jsonschema.validate(config, ray_schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise UserError(f"cluster config invalid at {where}: {exc.message}") from None
    types = config["available_node_types"]
    if config["head_node_type"] not in types:
        raise UserError(f"head_node_type {config['head_node_type']!r} is not among available_node_types")
    for name, node in types.items():
        gpus = node.get("resources", {}).get("GPU", 0)
        if gpus < 1:
            raise UserError(f"node type {name!r} declares no GPU resource")


def write_cluster_yaml(spec: ClusterSpec, path: str | Path) -> Path:
    """Generate, validate and atomically write the YAML for ``spec``."""
    config = cluster_config(spec)
    validate_config(config)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    os.replace(tmp, out)
    return out


def kuberay_manifest(spec: ClusterSpec, image: str = "rayproject/ray-ml:latest-gpu") -> dict[str, Any]:
    """A KubeRay ``RayCluster`` with one GPU worker group matching ``spec``."""
    gpu_limits = {"nvidia.com/gpu": spec.gpus_per_node}
    container = {"name": "ray", "image": image, "resources": {"limits": dict(gpu_limits), "requests": dict(gpu_limits)}}
    node_selector = {"cloud.google.com/gke-spot": "true"} if spec.spot and spec.cloud == "gcp" else {}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": spec.cluster_name, "labels": dict(spec.labels)},
        "spec": {
            "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"},
                              "template": {"spec": {"containers": [dict(container, name="ray-head")]}}},
            "workerGroupSpecs": [{
                "groupName": "gpu", "replicas": spec.num_nodes - 1, "minReplicas": 0, "maxReplicas": spec.num_nodes,
                "rayStartParams": {},
                "template": {"spec": {"containers": [container], "nodeSelector": node_selector}},
            }],
        },
    }


@dataclass(frozen=True)
class LaunchTarget:
    """Where to run: ``local`` (embedded Ray), ``address`` (existing cluster) or ``cloud``."""

    kind: Literal["local", "address", "cloud"] = "local"
    address: str | None = None
    spec: ClusterSpec | None = None

    def ray_address(self) -> str | None:
        if self.kind == "local":
            return None
        if self.kind == "address":
            return self.address or "auto"
        return "auto"  # the driver runs on the new cluster's head after `ray up`


def ray_up(config_path: Path, dry_run: bool = False) -> list[str]:
    """Start the cluster with the Ray CLI (``ray up -y``); returns the command run."""
    return _ray_cli(["up", "-y", "--no-config-cache", str(config_path)], dry_run)


def ray_down(config_path: Path, dry_run: bool = False) -> list[str]:
    return _ray_cli(["down", "-y", str(config_path)], dry_run)


def _ray_cli(args: list[str], dry_run: bool) -> list[str]:
    # The venv's own `ray` first: the driver may run from a venv that is not on PATH.
    beside = Path(sys.executable).parent / "ray"
    exe = str(beside) if beside.exists() else shutil.which("ray")
    if exe is None:
        raise UserError("the `ray` command is not on PATH; install ray[default] to launch clusters")
    cmd = [exe, *args]
    if not dry_run:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"`ray {args[0]}` failed ({proc.returncode}): {tail[0]}")
    return cmd
