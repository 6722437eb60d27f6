"""Multi-node scenarios on one machine (``ray.cluster_utils.Cluster``: several raylets), run by
tests/test_multinode.py in a subprocess, since one process can join only one Ray cluster and the
rest of the suite shares a local instance. Prints one JSON line of findings for the test to check.

    python -m tests.multinode placement   # 3 nodes (1, 2, 2 CPUs): cluster CLI, placement, node loss and gain
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)


def start_cluster() -> Any:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
    cluster.wait_for_nodes()
    return cluster, workers


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

    from actors.placement import NodeWatcher
    from actors.reference import ReferenceTrainer, max_difference
    from orchestrator.controller.controller import Controller, ControllerConfig
    from orchestrator.live import RayPipeline
    from orchestrator.models import example_batch, loss_fn, mlp
    from orchestrator.plan import straight_plan
    from orchestrator.trainer import PipelineTrainer

    out: dict[str, Any] = {"nodes": [n.node_id for n in [cluster.head_node, *workers]]}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = subprocess.run([sys.executable, "-m", "orchestrator", "cluster", "--json", "--address", cluster.address],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    out["cli_rc"], out["cli_stderr"] = cli.returncode, cli.stderr[-2000:]
    out["cli"] = json.loads(cli.stdout.strip().splitlines()[-1]) if cli.returncode == 0 else None

    ray.init(address=cluster.address, log_to_driver=False)
    model, data, sgd = partial(mlp, WIDTHS), partial(example_batch, "mlp", 10, widths=WIDTHS), partial(torch.optim.SGD, lr=0.1)
    plan = straight_plan([0, 2, 4, 5, 6, 8], 5)
    trainer = PipelineTrainer(model, loss_fn("mlp"), sgd, data, 5, plan=plan, checkpoint_dir=tmp / "ckpt",
                              checkpoint_every=1, pg_timeout_s=15, progress=False)
    pipe = RayPipeline(trainer, timeout_s=120)
    controller = Controller(pipe, pipe.profile, ControllerConfig(straight=True))
    records = [controller.step() for _ in range(2)]
    out["devices"] = trainer.devices()
    out["state_api"] = {str(pid): node for pid, node in stage_actor_nodes().items()}
    out["worker_pids"] = {str(d): s["pid"] for d, s in zip(plan.devices, trainer.group.identities)}
    out["slot_nodes"] = [slot.node_id for slot in trainer.group.slots]
    watcher = NodeWatcher("cpu")
    doomed = workers[1].node_id
    cluster.remove_node(workers[1])
    for _ in range(4):
        records.append(controller.step())
    lost, _ = watcher.poll()
    out["lost_slots"] = [s.node_id for s in lost]
    out["doomed"] = doomed
    out["final_plan_devices"] = list(pipe.current_plan().devices)
    out["completed"] = [r.completed for r in records]
    out["actions"] = [r.action for r in records]
    out["iteration"] = pipe.iteration
    reference = ReferenceTrainer.for_plan(plan, model, loss_fn("mlp"), sgd, data)
    reference.train(pipe.iteration)
    out["max_abs_diff"] = max_difference(trainer.state_dicts(), reference.state_dicts())
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    _, gained = watcher.poll()
    out["gained_slots"] = len(gained)
    trainer.shutdown()
    return out


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = {"placement": placement}[sys.argv[1]](Path(tmp))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
