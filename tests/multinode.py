"""Multi-node scenarios on one machine (``ray.cluster_utils.Cluster``: several raylets), run by
tests/test_multinode.py in a subprocess, since one process can join only one Ray cluster and the
rest of the suite shares a local instance. Prints one JSON line of findings for the test to check.

    python -m tests.multinode placement   # 3 nodes (1, 2, 2 CPUs): cluster CLI, placement, node loss and gain
    python -m tests.multinode growth      # 2 nodes, then a third added under a running elastic job
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)


def start_cluster() -> Any:
    from ray.cluster_utils import Cluster

    from actors.ray_session import LOCAL_SYSTEM_CONFIG

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                    "_system_config": LOCAL_SYSTEM_CONFIG})
    # custom resources stand in for GPU types: Ray reports accelerators as accelerator_type:<name>
    workers = [cluster.add_node(num_cpus=2, resources={f"accelerator_type:{kind}": 1}) for kind in ("A100", "V100")]
    cluster.wait_for_nodes()
    return cluster, workers


def actor_table(alive_only: bool = False) -> dict[int, str]:
    """pid -> node id of StageWorkers (dead ones too unless ``alive_only``), from Ray's GCS actor table."""
    import ray._private.state as state

    return {int(a["Pid"]): a["Address"]["NodeID"] for a in state.actors().values()
            if a.get("ActorClassName") == "StageWorker" and (a.get("State") == "ALIVE" or not alive_only)}


def stage_actor_nodes() -> dict[int, str]:
    """pid -> node id of every alive StageWorker, as Ray's GCS actor table reports it (the state
    API's HTTP server needs the dashboard, which these test nodes do without)."""
    import ray._private.state as state

    return {int(a["Pid"]): a["Address"]["NodeID"] for a in state.actors().values()
            if a.get("ActorClassName") == "StageWorker" and a.get("State") == "ALIVE"}


def placement(tmp: Path) -> dict[str, Any]:
    import ray

    cluster, workers = start_cluster()
    try:
        return _placement(cluster, workers, tmp)
    finally:
        ray.shutdown()
        cluster.shutdown()
        current = Path("/tmp/ray/ray_current_cluster")  # never leave later ray.init() calls pointing here
        if current.exists() and current.read_text().strip() == cluster.address:
            current.unlink()


def _placement(cluster: Any, workers: list[Any], tmp: Path) -> dict[str, Any]:
    import ray

    from actors.placement import NodeTable
    from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig
    from orchestrator.adapt.controller import ControllerConfig
    from orchestrator.profiling.models import example_batch, loss_fn, mlp
    from orchestrator.core.plan import straight_plan

    out: dict[str, Any] = {"nodes": [n.node_id for n in [cluster.head_node, *workers]]}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = subprocess.run([sys.executable, "-m", "orchestrator", "cluster", "--json", "--address", cluster.address],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    out["cli_rc"], out["cli_stderr"] = cli.returncode, cli.stderr[-2000:]
    out["cli"] = json.loads(cli.stdout.strip().splitlines()[-1]) if cli.returncode == 0 else None

    example = subprocess.run([sys.executable, "examples/elastic_gpt.py", "--steps", "2", "--out", str(tmp / "elastic")],
                             capture_output=True, text=True, timeout=600, env=dict(env, RAY_ADDRESS=cluster.address), cwd=ROOT)
    out["example_rc"], out["example_stderr"] = example.returncode, example.stderr[-3000:]
    events_file = tmp / "elastic" / "events.jsonl"
    out["example_events"] = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
    ray.init(address=cluster.address, log_to_driver=False)
    out["example_actor_nodes"] = {str(pid): node for pid, node in actor_table().items()}
    model, data, sgd = partial(mlp, WIDTHS), partial(example_batch, "mlp", 10, widths=WIDTHS), partial(torch.optim.SGD, lr=0.1)
    plan = straight_plan([0, 2, 4, 5, 6, 8], 5)
    train = TrainConfig(model_factory=model, loss_fn=loss_fn("mlp"), optimizer_factory=sgd, data_fn=data, num_microbatches=5)
    job = ElasticJob(train, ScalingConfig(devices=5, plan=plan), RunConfig(storage=str(tmp / "ckpt"), events=tmp / "events.jsonl",
                                                                           checkpoint_every=1),
                     AdaptConfig(controller=ControllerConfig(straight=True)), SpotConfig(enabled=False))
    try:
        job.fit(2)
        runtime = job.runtime
        assert runtime.group is not None
        out["devices"] = [asdict(d) for d in runtime.devices()]
        out["state_api"] = {str(pid): node for pid, node in stage_actor_nodes().items()}
        out["worker_pids"] = {str(d): s["pid"] for d, s in zip(plan.devices, runtime.group.identities)}
        out["slot_nodes"] = [slot.node_id for slot in runtime.group.processes.slots]
        watcher = NodeTable("cpu")
        doomed = workers[1].node_id
        keeper, want = _neighbour_copy(doomed, workers[0].node_id)
        cluster.remove_node(workers[1])
        out["events"] = job.fit(6).events  # to step 6
        out["neighbour_copy_exact"] = bool(torch.equal(ray.get(keeper.read.remote()), want))
        lost, _ = watcher.poll()
        out["lost_slots"] = [s.node_id for s in lost]
        out["doomed"] = doomed
        out["final_plan_devices"] = list(runtime.plan.devices)
        out["iteration"] = runtime.step
        out["max_abs_diff"] = job.max_abs_diff()
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        _, gained = watcher.poll()
        out["gained_slots"] = len(gained)
    finally:
        job.close()
    return out


def _neighbour_copy(owner_node: str, keeper_node: str) -> tuple[Any, torch.Tensor]:
    """An in-memory snapshot taken on ``owner_node`` (:class:`actors.host_copies.HostCopies`: an object of the store,
    owned by the process that put it) and kept by a neighbour on ``keeper_node``, as a job's workers do; returns the
    keeper and the state the snapshot holds. The caller removes the owner's node: the keeper must still read it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self) -> None:
            from actors.host_copies import HostCopies

            self.copies, self.block = HostCopies(), torch.nn.Linear(256, 256)  # 256 KiB: in the store, not inlined

        def snapshot(self) -> tuple[dict[int, Any], torch.Tensor]:
            self.copies.take(1, {0: self.block}, {}).snapshotted.wait()
            return self.copies.own_objects(1), self.block.weight.detach().clone()

        def keep(self, refs: dict[int, Any]) -> None:
            self.copies.keep_peer(1, dict(zip(refs, ray.get(list(refs.values())))))

        def read(self) -> torch.Tensor:
            held = self.copies.get(1, 0)
            assert held is not None, "the keeper holds no copy"
            return held["model"]["weight"]

    owner, keeper = (Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()  # type: ignore[attr-defined]
                     for n in (owner_node, keeper_node))
    refs, want = ray.get(owner.snapshot.remote())
    ray.get(keeper.keep.remote(refs))
    return keeper, want


def growth(tmp: Path) -> dict[str, Any]:
    """An elastic job on two devices (the head's CPU and one worker node's); a node added between
    two ``fit`` calls is capacity: device 2 gets a stage actor on that node and blocks by live
    moves (the rehearsal of tests/test_growth.py: the first two devices slowed, the new one not)."""
    import ray
    from ray.cluster_utils import Cluster

    from actors.ray_session import LOCAL_SYSTEM_CONFIG
    from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig
    from orchestrator.adapt.controller import ControllerConfig
    from orchestrator.adapt.faults import FaultSchedule, Slowdown
    from orchestrator.adapt.policies import ArbiterConfig
    from orchestrator.core.plan import straight_plan
    from tests.test_growth import TRAIN, wait_until_up

    # The decision made certain: this scenario is about a joined node getting blocks live on a real multi-node
    # cluster, not about the arbiter's thresholds (tested on their own in test_controller_*.py). With the gain
    # floors off and a vanishing margin, any predicted gain moves; the two old devices slowed 10x (in CPU
    # seconds, so load does not change it) make a third stage's gain positive however loaded the machine is.
    # With the 5x slowdown and a tenth-of-cost margin of test_growth.py, a loaded machine measured "stay" here.
    adapt = ControllerConfig(straight=True, warmup_iterations=3,
                             arbiter=ArbiterConfig(noise_z=0.0, margin=1e-6, min_relative_gain=0.0))
    slow = (Slowdown(0, 10.0, 0), Slowdown(1, 10.0, 0))

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                    "_system_config": LOCAL_SYSTEM_CONFIG})
    nodes = [cluster.head_node, cluster.add_node(num_cpus=1)]
    cluster.wait_for_nodes()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        job = ElasticJob(TRAIN, ScalingConfig(devices=2, max_devices=3, plan=straight_plan([0, 4, 8], 8), node_poll_s=0.1),
                         RunConfig(storage=str(tmp / "ckpt"), events=tmp / "events.jsonl", checkpoint_every=0),
                         AdaptConfig(controller=adapt, faults=FaultSchedule(slow)), SpotConfig(enabled=False))
        try:
            job.fit(6)
            nodes.append(cluster.add_node(num_cpus=1))
            cluster.wait_for_nodes()
            time.sleep(0.2)  # past node_poll_s: the next poll reads the node table
            wait_until_up(job, 2)  # what the loop does between iterations, until the new worker is up
            events = job.fit(30).events  # to step 30: 24 more
            return {"nodes": [n.node_id for n in nodes], "events": events, "devices": [asdict(d) for d in job.runtime.devices()],
                    "actor_nodes": {str(pid): node for pid, node in stage_actor_nodes().items()},
                    "plan_devices": list(job.runtime.plan.devices), "step": job.runtime.step, "restarts": job.restarts,
                    "max_abs_diff": job.max_abs_diff()}
        finally:
            job.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip() == cluster.address:
            current.unlink()


def jobs(tmp: Path) -> dict[str, Any]:
    """``ray job submit --working-dir . -- python examples/elastic_gpt.py`` against a head node
    with the dashboard (the jobs server), then Ray's actor table for where the stage actors ran."""
    import ray
    from ray.cluster_utils import Cluster

    from actors.ray_session import LOCAL_SYSTEM_CONFIG

    # One head node: raylets started on one machine share the session folder, and each would
    # unpack the job's working directory into the same place while the others import from it.
    port = _free_port()
    address = f"http://127.0.0.1:{port}"
    # Every service on its own free port: the job agent's default (52365) may still be held by a
    # process from an earlier scenario, and then no job can be submitted.
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port,
        "dashboard_agent_listen_port": _free_port(), "runtime_env_agent_port": _free_port(),
        "metrics_agent_port": _free_port(), "_system_config": LOCAL_SYSTEM_CONFIG})
    workers: list[Any] = []
    cluster.wait_for_nodes()
    try:
        out_dir = tmp / "job-out"
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        command = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--no-wait", "--address", address,
                   "--working-dir", str(ROOT), "--", sys.executable, "examples/elastic_gpt.py", "--steps", "2",
                   "--checkpoint-every", "1", "--out", str(out_dir)]
        for _ in range(24):  # the head's job agent comes up some seconds after the dashboard answers
            submit = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
            if "No available agent" not in submit.stdout + submit.stderr:
                break
            time.sleep(5)
        found = re.search(r"raysubmit_\w+", submit.stdout + submit.stderr)
        status, logs = "NOT SUBMITTED", ""
        if submit.returncode == 0 and found:  # our own deadline, so a stuck job is reported, not waited on
            from ray.job_submission import JobStatus, JobSubmissionClient

            client = JobSubmissionClient(address)
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                status = str(client.get_job_status(found.group(0)))
                if client.get_job_status(found.group(0)) in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                    break
                time.sleep(2)
            logs = client.get_job_logs(found.group(0))
        events = [json.loads(line) for line in (out_dir / "events.jsonl").read_text().splitlines()] if (out_dir / "events.jsonl").exists() else []
        ray.init(address=cluster.address, log_to_driver=False)
        import ray._private.state as state

        actors = {int(a["Pid"]): a["Address"]["NodeID"] for a in state.actors().values() if a.get("ActorClassName") == "StageWorker"}
        return {"rc": submit.returncode, "status": status, "logs": logs[-3000:], "stdout": submit.stdout[-3000:],
                "stderr": submit.stderr[-3000:], "events": events,
                "actor_nodes": {str(pid): node for pid, node in actors.items()},
                "nodes": [n.node_id for n in [cluster.head_node, *workers]]}
    finally:
        ray.shutdown()
        cluster.shutdown()
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip() == cluster.address:
            current.unlink()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = {"placement": placement, "jobs": jobs, "growth": growth}[sys.argv[1]](Path(tmp))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
