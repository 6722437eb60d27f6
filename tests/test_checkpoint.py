"""Block-keyed checkpoints: restore under any plan, and never load a torn or foreign one."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from actors import checkpoint as ckpt
from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.errors import UserError
from orchestrator.models import example_batch, loss_fn, mlp
from orchestrator.plan import ScheduleKind, straight_plan
from orchestrator.trainer import PipelineTrainer

WIDTHS = (8, 16, 16, 16, 16, 4)  # 5 blocks
MLP = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 10, widths=WIDTHS)
ADAMW = partial(torch.optim.AdamW, lr=0.01, weight_decay=0.01)
LOSS = loss_fn("mlp")
THREE = straight_plan([0, 1, 3, 5], 4)


def trainer(group: Any, plan: Any = THREE, model: Any = MLP, **kw: Any) -> PipelineTrainer:
    return PipelineTrainer(model, LOSS, ADAMW, DATA, plan.num_microbatches, plan=plan, workers=group, **kw)


@pytest.fixture(scope="module")
def saved(worker_group: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 steps on 3 stages, then a checkpoint; shared by the tests below (they only read it)."""
    t = trainer(worker_group, checkpoint_dir=tmp_path_factory.mktemp("ckpt"))
    t.fit(3)
    return t.save_checkpoint()


@pytest.mark.ray
def test_restore_under_another_plan_is_exact(worker_group: Any, saved: Path) -> None:
    other = straight_plan([0, 3, 5], 4, ScheduleKind.GPIPE, devices=[(0, 1), (2,)])  # 2 stages, new cut, replicas
    t = trainer(worker_group, plan=other, resume=saved)
    result = t.fit(3)
    assert result.steps == [3, 4, 5]
    reference = ReferenceTrainer.for_plan(THREE, MLP, LOSS, ADAMW, DATA)
    ref_losses = reference.train(6)
    got, want = t.state_dicts(), reference.state_dicts()
    assert allclose(got, want), f"max |diff| {max_difference(got, want):.3g}"
    assert result.losses == pytest.approx(ref_losses[3:], rel=1e-5, abs=1e-6)


@pytest.mark.ray
def test_corrupted_block_file_is_refused(worker_group: Any, saved: Path, tmp_path: Path) -> None:
    copy = _copy(saved, tmp_path / "bad")
    path = copy / ckpt.block_file(2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"block_00002\.pt: checksum mismatch"):
        trainer(worker_group, resume=copy).fit(1)


@pytest.mark.ray
def test_model_mismatch_is_a_clear_error(worker_group: Any, saved: Path) -> None:
    wider = partial(mlp, (8, 16, 32, 16, 16, 4))  # same block count, other shapes
    with pytest.raises(UserError, match=r"block_0000[12]\.pt: block [12] does not match the model"):
        trainer(worker_group, model=wider, resume=saved).fit(1)
    deeper = partial(mlp, (8, 16, 16, 16, 16, 16, 4))
    plan = straight_plan([0, 3, 6], 2)
    with pytest.raises(UserError, match="holds 5 blocks but the model has 6"):
        trainer(worker_group, plan=plan, model=deeper, resume=saved).fit(1)


def test_missing_manifest_and_missing_file_are_detected(saved: Path, tmp_path: Path) -> None:
    torn = _copy(saved, tmp_path / "torn")
    (torn / ckpt.MANIFEST).unlink()
    with pytest.raises(UserError, match="missing manifest.json"):
        ckpt.read_manifest(torn)
    assert ckpt.latest(tmp_path) is None  # a torn checkpoint is never picked as "latest"
    gone = _copy(saved, tmp_path / "gone")
    (gone / ckpt.block_file(4)).unlink()
    with pytest.raises(UserError, match=r"block_00004\.pt: cannot read"):
        ckpt.verify(gone)
    incomplete = _copy(saved, tmp_path / "incomplete")
    manifest = json.loads((incomplete / ckpt.MANIFEST).read_text())
    manifest["files"] = manifest["files"][:-1]
    (incomplete / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="incomplete manifest"):
        ckpt.read_manifest(incomplete)


def test_manifest_records_plan_step_and_checksums(saved: Path) -> None:
    manifest = ckpt.verify(saved)
    assert manifest["step"] == 3 and manifest["num_blocks"] == 5
    assert manifest["plan"]["num_stages"] == 3 and len(manifest["files"]) == 5
    assert all(len(e["sha256"]) == 64 for e in manifest["files"])
    assert not list(saved.glob(".*tmp*"))  # no temporary files left behind


def test_block_roundtrip_without_ray(tmp_path: Path) -> None:
    torch.manual_seed(0)
    block = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(block.parameters())
    block(torch.randn(4, 3)).sum().backward()
    opt.step()
    entry = ckpt.write_block(tmp_path, 7, block, opt)
    ckpt.write_manifest(tmp_path, 1, 8, [{**entry, "block": b} if b != 7 else entry for b in range(8)], {"stages": []})
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    ckpt.restore_block(ckpt.read_block(tmp_path, entry), fresh, fresh_opt, "x")
    assert torch.equal(fresh.weight, block.weight)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst
