"""Cluster-launcher YAML generation, validated by Ray's own schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.core.errors import UserError
from orchestrator.supervise.launch import ClusterSpec, LaunchTarget, cluster_config, kuberay_manifest, ray_up, validate_config, write_cluster_yaml


@pytest.mark.parametrize(
    "spec",
    [
        ClusterSpec(cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="p3.8xlarge", num_nodes=2),
        ClusterSpec(cloud="gcp", region="us-central1", zone="us-central1-b", instance_type="n1-standard-8", gpu_type="V100", gpus_per_node=1, project_id="p", num_nodes=3),
        ClusterSpec(cloud="azure", region="eastus", instance_type="Standard_NC24s_v3", spot=False),
    ],
    ids=lambda s: s.cloud,
)
def test_generated_yaml_passes_ray_schema_and_round_trips(spec: ClusterSpec, tmp_path: Path) -> None:
    path = write_cluster_yaml(spec, tmp_path / "cluster.yaml")
    config = yaml.safe_load(path.read_text())
    validate_config(config)
    worker = config["available_node_types"]["gpu_worker"]
    assert worker["resources"]["GPU"] == spec.gpus_per_node
    assert worker["min_workers"] == spec.num_nodes - 1
    text = path.read_text()
    if spec.cloud == "aws":
        assert worker["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
        assert worker["node_config"]["Placement"]["AvailabilityZone"] == "us-east-1a"
    if spec.cloud == "gcp":
        sched = worker["node_config"]["scheduling"]
        assert sched["provisioningModel"] == "SPOT" and sched["onHostMaintenance"] == "TERMINATE"
        assert worker["node_config"]["guestAccelerators"][0]["acceleratorType"] == "nvidia-tesla-v100"
    if spec.cloud == "azure":
        assert "priority" not in text  # on-demand


def test_schema_violations_and_bad_specs_are_user_errors() -> None:
    config = cluster_config(ClusterSpec(cloud="aws", region="us-east-1", instance_type="p3.2xlarge"))
    config["max_workers"] = "many"
    with pytest.raises(UserError, match="max_workers"):
        validate_config(config)
    with pytest.raises(UserError, match="unknown cloud"):
        ClusterSpec(cloud="ibm", region="x", instance_type="p3.2xlarge")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="not in region"):
        ClusterSpec(cloud="aws", region="us-east-1", zone="eu-west-1a", instance_type="p3.2xlarge")
    with pytest.raises(UserError, match="unknown aws instance type 'm5.large'"):
        ClusterSpec(cloud="aws", region="us-east-1", instance_type="m5.large")
    with pytest.raises(UserError, match="project id"):
        cluster_config(ClusterSpec(cloud="gcp", region="us-central1", instance_type="a2-highgpu-1g"))


def test_kuberay_manifest_and_targets(tmp_path: Path) -> None:
    spec = ClusterSpec(cloud="gcp", region="us-central1", instance_type="a2-highgpu-8g", num_nodes=2, project_id="p")
    manifest = kuberay_manifest(spec)
    group = manifest["spec"]["workerGroupSpecs"][0]
    assert manifest["kind"] == "RayCluster" and group["replicas"] == 1
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert LaunchTarget().ray_address() is None
    assert LaunchTarget("address", "ray://head:10001").ray_address() == "ray://head:10001"
    cmd = ray_up(tmp_path / "c.yaml", dry_run=True)
    assert cmd[1:3] == ["up", "-y"]


def test_offers_become_specs_with_the_users_own_project_subscription_and_network(tmp_path: Path) -> None:
    from cloud.records import Offer
    from orchestrator.supervise.launch import spec_for_offer

    gcp = Offer("gcp", "us-central1", "us-central1-b", "n1-standard-16", "V100", 4, True, 2.9)
    with pytest.raises(UserError, match="no GCP project"):
        spec_for_offer(gcp, "raypipe-x", {}, environ={})
    spec = spec_for_offer(gcp, "raypipe-x", {"gcp": {"network": "train-vpc", "subnetwork": "train-sub"}},
                          environ={"CLOUDSDK_CORE_PROJECT": "acme-ml-7"})
    config = yaml.safe_load(write_cluster_yaml(spec, tmp_path / "g.yaml").read_text())
    validate_config(config)
    assert config["provider"]["project_id"] == "acme-ml-7"
    nic = config["available_node_types"]["gpu_worker"]["node_config"]["networkInterfaces"][0]
    assert nic["network"] == "train-vpc" and nic["subnetwork"] == "train-sub"
    assert spec_for_offer(gcp, "raypipe-x", {"gcp": {"project_id": "from-file"}}, environ={"GOOGLE_CLOUD_PROJECT": "env"}).project_id == "from-file"
    azure = Offer("azure", "eastus", "", "Standard_NC24s_v3", "V100", 4, True, 3.0)
    config = cluster_config(spec_for_offer(azure, "raypipe-x", {}, environ={"AZURE_SUBSCRIPTION_ID": "0f0e-sub"}))
    validate_config(config)
    assert config["provider"]["subscription_id"] == "0f0e-sub"
    aws = Offer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, True, 3.67)
    node = cluster_config(spec_for_offer(aws, "raypipe-x", {"aws": {"subnet_id": "subnet-1"}}, environ={}))["available_node_types"]["head"]["node_config"]
    assert node["SubnetIds"] == ["subnet-1"]


@pytest.mark.parametrize("value", ["my-project", "your_project", "<project>", "example-project", "MY-SUBSCRIPTION"])
def test_placeholders_are_refused(value: str) -> None:
    with pytest.raises(UserError, match="placeholder"):
        ClusterSpec(cloud="gcp", region="us-central1", instance_type="a2-highgpu-1g", project_id=value)
    with pytest.raises(UserError, match="placeholder"):
        ClusterSpec(cloud="azure", region="eastus", instance_type="Standard_NC24s_v3", subscription_id=value)


def test_the_heads_job_api_is_not_opened_to_the_internet() -> None:
    config = cluster_config(ClusterSpec(cloud="aws", region="us-east-1", instance_type="p3.8xlarge"))
    assert not any("0.0.0.0" in c for c in config["head_start_ray_commands"])
    assert any("--dashboard-host=127.0.0.1" in c for c in config["head_start_ray_commands"])
