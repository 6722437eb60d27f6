"""Block-keyed checkpoints: restore under any plan, and never load a torn or foreign one."""

from __future__ import annotations

import os
import threading
import time

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from actors import checkpoint as ckpt
from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.cli.commands import main
from orchestrator.core.errors import UserError
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import ScheduleKind, straight_plan
from orchestrator.train.trainer import PipelineTrainer

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
    result = t.fit(6)  # to step 6: three more after the resumed step 3
    assert sorted(result.losses) == [3, 4, 5]
    reference = ReferenceTrainer.for_plan(THREE, MLP, LOSS, ADAMW, DATA)
    ref_losses = reference.train(6)
    got, want = t.state_dicts(), reference.state_dicts()
    assert allclose(got, want), f"max |diff| {max_difference(got, want):.3g}"
    assert list(result.losses.values()) == pytest.approx(ref_losses[3:], rel=1e-5, abs=1e-6)


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
    data = json.dumps(manifest).encode()
    (incomplete / ckpt.MANIFEST).write_bytes(data)
    with pytest.raises(UserError, match="does not match its commit marker"):
        ckpt.read_manifest(incomplete)
    ckpt.commit(incomplete, 3, data)  # even a re-signed marker does not make it whole
    with pytest.raises(UserError, match="incomplete manifest"):
        ckpt.read_manifest(incomplete)


def test_manifest_records_plan_step_and_checksums(saved: Path) -> None:
    manifest = ckpt.verify(saved)
    assert manifest["step"] == 3 and manifest["num_blocks"] == 5
    assert manifest["plan"]["num_stages"] == 3 and len(manifest["files"]) == 5
    assert all(len(e["sha256"]) == 64 for e in manifest["files"])
    assert manifest["seed"] == 0 and (saved / ckpt.COMMIT).is_file()
    # each worker bound its blocks to the place: the job's run id (unknown here: ""), the step, the block index
    assert manifest["version"] == 3 and manifest["run_id"] == ""
    for e in manifest["files"]:
        header, _ = ckpt.split_header((saved / e["file"]).read_bytes()[:ckpt.MAX_HEADER_BYTES], e["file"])
        assert header == {"block": e["block"], "run_id": "", "step": 3} and e["step"] == 3
    assert main(["checkpoint", "verify", str(saved)]) == 0  # what the runtime writes, the CLI accepts
    assert not list(saved.glob(".*tmp*"))  # no temporary files left behind


@pytest.mark.ray
def test_resume_latest_without_a_valid_checkpoint(worker_group: Any, saved: Path, tmp_path: Path) -> None:
    """Every checkpoint damaged: 'latest' is an error naming the reason, 'latest_or_fresh' starts
    from the seed; either way the skip is recorded for the caller's event log."""
    root = tmp_path / "root"
    damaged = _copy(saved, root / saved.name)
    (damaged / ckpt.COMMIT).unlink()
    t = trainer(worker_group, checkpoint_dir=root, resume="latest")
    with pytest.raises(UserError, match="no valid checkpoint under .*missing commit marker"):
        t.fit(1)
    fresh = trainer(worker_group, checkpoint_dir=root, resume="latest_or_fresh")
    assert sorted(fresh.fit(1).losses) == [0]
    assert [s.location for s in fresh.runtime.skipped_checkpoints] == [str(damaged)]


def test_block_roundtrip_without_ray(tmp_path: Path) -> None:
    torch.manual_seed(0)
    block = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(block.parameters())
    block(torch.randn(4, 3)).sum().backward()
    opt.step()
    entry = ckpt.write_block(tmp_path, 7, block, opt, step=1)
    others = [ckpt.write_block(tmp_path, b, torch.nn.Linear(3, 2), None, step=1) for b in range(7)]
    ckpt.write_manifest(tmp_path, 1, 8, [*others, entry], {"stages": []})
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    ckpt.restore_block(ckpt.read_block(tmp_path, entry), fresh, fresh_opt, "x")
    assert torch.equal(fresh.weight, block.weight)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_deferred_snapshot_copies_buffers_now_and_parameters_before_the_step(tmp_path: Path) -> None:
    """What an asynchronous checkpoint holds: the buffers as they were when it was asked for (a forward changes
    BatchNorm's running statistics in place), the parameters and optimizer state as they were before the next
    optimizer step, which waits for the copy."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(block.parameters(), lr=0.5, momentum=0.9)
    block(torch.randn(8, 4)).sum().backward()
    opt.step()
    want = {k: v.clone() for k, v in block.state_dict().items()}
    want_momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    take = ckpt.deferred_snapshot(3, block, opt)
    block(torch.randn(8, 4)).sum().backward()  # the next iteration's forward and backward run during the copy
    assert not torch.equal(block.state_dict()["1.running_mean"], want["1.running_mean"])
    upload = ckpt.BackgroundWrite(tmp_path, [take])
    assert upload.snapshotted.wait(30)
    opt.step()  # only now may the state change
    (entry,) = upload.result(30)
    got = ckpt.read_block(tmp_path, entry)
    assert got["model"].keys() == want.keys()
    assert all(torch.equal(got["model"][k], want[k]) for k in want)
    assert torch.equal(got["optimizer"]["state"][0]["momentum_buffer"], want_momentum)
    assert not torch.equal(block[0].weight, want["0.weight"])


def test_periodic_snapshots_reuse_the_previous_uploads_host_buffers(tmp_path: Path) -> None:
    """The second asynchronous checkpoint copies into the first one's host tensors (no fresh pages), yet holds the
    state of its own moment; a block whose shapes changed gets new tensors."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(block.parameters(), lr=0.1)

    def train() -> None:
        block(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    train()
    first = ckpt.BackgroundWrite(tmp_path / "a", [ckpt.deferred_snapshot(0, block, opt)])
    (entry_a,) = first.result(30)
    staged = first.staged[0]
    train()
    want = {k: v.clone() for k, v in block.state_dict().items()}
    want_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    second = ckpt.BackgroundWrite(tmp_path / "b", [ckpt.deferred_snapshot(0, block, opt, into=staged)])
    (entry_b,) = second.result(30)
    reused = second.staged[0]
    assert reused["model"]["0.weight"].data_ptr() == staged["model"]["0.weight"].data_ptr()
    assert reused["model"]["1.running_mean"].data_ptr() == staged["model"]["1.running_mean"].data_ptr()
    assert reused["optimizer"]["state"][0]["exp_avg"].data_ptr() == staged["optimizer"]["state"][0]["exp_avg"].data_ptr()
    got = ckpt.read_block(tmp_path / "b", entry_b)
    assert all(torch.equal(got["model"][k], want[k]) for k in want)
    assert torch.equal(got["optimizer"]["state"][0]["exp_avg"], want_avg)
    assert not torch.equal(ckpt.read_block(tmp_path / "a", entry_a)["model"]["0.weight"], want["0.weight"])
    other = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))  # another block in the same slot
    third = ckpt.BackgroundWrite(tmp_path / "c", [ckpt.deferred_snapshot(0, other, None, into=reused)])
    (entry_c,) = third.result(30)
    assert torch.equal(ckpt.read_block(tmp_path / "c", entry_c)["model"]["0.weight"], other[0].weight)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or os.geteuid() != 0, reason="SCHED_IDLE (Linux), raised again only with privilege")
def test_upload_thread_runs_on_idle_cpu_until_someone_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy and upload run under SCHED_IDLE (only CPU time training leaves idle); a step waiting for the copy
    raises the thread to normal priority until the copy exists, a caller of result() until the upload ends."""
    seen: list[str] = []
    copy_may_end, uploading, upload_may_end = threading.Event(), threading.Event(), threading.Event()
    names = {os.SCHED_IDLE: "idle", os.SCHED_OTHER: "normal"}

    def record(until_normal: bool = False) -> None:
        for _ in range(1000 if until_normal else 0):
            if os.sched_getscheduler(threading.get_native_id()) != os.SCHED_IDLE:
                break
            time.sleep(0.01)
        seen.append(names.get(os.sched_getscheduler(threading.get_native_id()), "other"))

    def payload() -> dict:
        record()
        copy_may_end.wait(30)
        record(until_normal=True)  # the step below waits for this copy
        return ckpt.snapshot_block(0, torch.nn.Linear(2, 2), None)

    write = ckpt.write_payload

    def upload_one(directory: str, item: dict, *place: Any) -> dict:
        record()  # lowered again once the copy exists
        uploading.set()
        upload_may_end.wait(30)
        record(until_normal=True)  # result() waits for it
        return write(directory, item, *place)

    monkeypatch.setattr(ckpt, "write_payload", upload_one)
    upload = ckpt.BackgroundWrite(tmp_path, [payload])
    copy_may_end.set()
    assert upload.snapshotted.wait(30) and uploading.wait(30)
    upload_may_end.set()
    upload.result(30)
    assert seen == ["idle", "normal", "idle", "normal"]


def test_a_failing_snapshot_releases_the_step_and_surfaces_in_result(tmp_path: Path) -> None:
    def broken() -> dict:
        raise RuntimeError("copy failed")

    upload = ckpt.BackgroundWrite(tmp_path, [broken])
    assert upload.snapshotted.wait(30)  # a step waiting for it is not blocked for ever
    with pytest.raises(RuntimeError, match="copy failed"):
        upload.result(30)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.ray
def test_background_checkpoint_holds_the_snapshot_not_later_weights(worker_group: Any, tmp_path: Path) -> None:
    """Snapshot at step 2, upload while steps 2-3 train, commit at the end of fit: restores the
    step-2 state bit-exact; before the commit the folder is not a checkpoint."""
    t = trainer(worker_group)  # no checkpoint_dir: fit writes no final checkpoint of its own here
    t.fit(2)
    at_snapshot = t.state_dicts()
    where = t.runtime.save_checkpoint(tmp_path / "step_00000002", background=True)
    assert not (Path(where) / ckpt.COMMIT).exists() and ckpt.latest(tmp_path) is None
    t.fit(4)  # weights change while the workers upload; fit commits the upload before it returns
    later = t.state_dicts()
    assert t.runtime.finish_checkpoint() is None
    assert ckpt.verify(where)["step"] == 2
    other = trainer(worker_group, plan=straight_plan([0, 3, 5], 4), validate=False)
    assert other.restore(where) == 2
    got = other.state_dicts()
    assert all(torch.equal(got[b][k], at_snapshot[b][k]) for b in at_snapshot for k in at_snapshot[b])
    assert not all(torch.equal(later[b][k], at_snapshot[b][k]) for b in at_snapshot for k in at_snapshot[b])


@pytest.mark.ray
def test_async_periodic_checkpoints_equal_synchronous_ones(worker_group: Any, tmp_path: Path) -> None:
    runs = {}
    for mode in ("sync", "async"):
        t = trainer(worker_group, checkpoint_dir=tmp_path / mode, checkpoint_every=2, async_checkpoints=mode == "async")
        runs[mode] = t.fit(4)
    assert [Path(c).name for c in runs["async"].checkpoints] == ["step_00000002", "step_00000004"]
    assert runs["async"].losses == runs["sync"].losses
    for name in ("step_00000002", "step_00000004"):
        want, got = ckpt.verify(tmp_path / "sync" / name), ckpt.verify(tmp_path / "async" / name)
        assert got["step"] == want["step"]
        for a, b in zip(want["files"], got["files"]):
            x, y = ckpt.read_block(tmp_path / "sync" / name, a), ckpt.read_block(tmp_path / "async" / name, b)
            assert all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"])


def test_a_snapshot_sent_to_a_neighbour_arrives_equal_as_a_copy_of_its_own() -> None:
    """The neighbour's copy travels as numpy bytes (:func:`actors.snapshot.to_wire`) and is read back as tensors of
    the reader's own: every dtype (bf16 too), shape and plain value comes back equal, and writable."""
    from actors.snapshot import from_wire, to_wire

    sent = {"w": torch.randn(3, 4).to(torch.bfloat16), "step": torch.tensor(5), "none": torch.empty(0),
            "groups": [{"lr": 0.1, "params": [0, 1]}], "mask": torch.tensor([True, False])}
    got = from_wire(to_wire(sent))
    assert got["w"].dtype == torch.bfloat16 and got["groups"] == sent["groups"]
    assert all(torch.equal(got[k], sent[k]) for k in ("w", "step", "none", "mask"))
    got["w"].zero_()
    assert not torch.equal(got["w"], sent["w"])
