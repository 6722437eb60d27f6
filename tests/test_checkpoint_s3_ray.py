"""End to end: Ray stage workers write their own blocks straight to s3:// (the local moto server),
the driver commits; the checkpoint restores bit-exact under another plan and
``orchestrator checkpoint verify s3://BUCKET/PREFIX`` exits 0.

The training runs in a child process with its own Ray instance, because Ray workers take their
environment (here ``AWS_ENDPOINT_URL`` and the test credentials) from the process that starts Ray,
and the session's shared Ray instance was started without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors import checkpoint as ckpt
from actors import storage, waits
from orchestrator.cli.commands import main
from tests.servers import s3_bucket, s3_endpoint  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
from functools import partial
import ray, torch
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import straight_plan
from orchestrator.train.trainer import PipelineTrainer

root = sys.argv[1]
ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
widths = (8, 16, 16, 16, 4)
kw = dict(model_factory=partial(mlp, widths), loss_fn=loss_fn("mlp"),
          optimizer_factory=partial(torch.optim.AdamW, lr=0.01), data_fn=partial(example_batch, "mlp", 8, widths=widths),
          num_microbatches=4, checkpoint_dir=root, progress=False)
first = PipelineTrainer(plan=straight_plan([0, 1, 3, 4], 4), checkpoint_every=2, **kw)
result = first.fit(4)
before = first.state_dicts()
first.shutdown()
second = PipelineTrainer(plan=straight_plan([0, 2, 4], 4), **kw)   # other stages, other cuts
step = second.restore("latest")
after = second.state_dicts()
second.shutdown()
same = all(torch.equal(before[b][k], after[b][k]) for b in before for k in before[b])
print(json.dumps({"checkpoints": result.checkpoints, "step": step, "same": same}))
"""


@pytest.mark.ray
def test_workers_write_blocks_to_s3_and_restore_under_another_plan(s3_bucket: str, s3_endpoint: str) -> None:
    root = f"{s3_bucket}/run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, root], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=waits.stretched(240))  # a guard, not a measurement: longer on a loaded machine
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["checkpoints"] == [f"{root}/step_00000002", f"{root}/step_00000004"]
    assert got["step"] == 4 and got["same"] is True
    assert storage.listdir(f"{root}/step_00000004") == sorted(
        [ckpt.COMMIT, ckpt.MANIFEST, *[ckpt.block_file(b) for b in range(4)]])
    assert main(["checkpoint", "verify", root]) == 0
