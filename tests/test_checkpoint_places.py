"""Checkpoint blocks bound to their place (issue 29, item 2) and copies that never replace or delete
what they did not write (issue 23, item 4).

Every block file starts with a header naming the run id, the step and the block index; the manifest
entry (covered by the commit marker) names the same. A block of another step or run, a symlink, a
FIFO or ``/dev/zero`` inside a checkpoint is refused with one line, even by a forger who re-writes
the manifest's checksum and the commit marker to match. Version-2 checkpoints (no headers) still load.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from actors import checkpoint as ckpt
from actors import storage
from actors.checkpoint_transfer import TransferError, copy_checkpoint
from orchestrator.cli.commands import main
from tests.test_checkpoint_format import BLOCKS, edit_manifest

ROOT = Path(__file__).resolve().parents[1]


def write_run(root: Path | str, step: int, run_id: str = "run-a") -> str:
    """A real (tiny) checkpoint of run ``run_id``, written as the workers do (block headers included)."""
    torch.manual_seed(step)
    directory = ckpt.step_dir(str(root), step)
    entries = [ckpt.write_block(directory, b, torch.nn.Linear(4, 4), None, step=step, run_id=run_id) for b in range(BLOCKS)]
    ckpt.write_manifest(directory, step, BLOCKS, entries, {"stages": []}, {"losses": {"0": 1.0}})
    return directory


def resign_block(directory: str, block: int) -> None:
    """Re-write the manifest's checksum and size of ``block`` to the file now there, and the marker:
    what a forger who knows the format does after swapping a block file."""
    data = (Path(directory) / ckpt.block_file(block)).read_bytes()
    sha = __import__("hashlib").sha256(data).hexdigest()
    edit_manifest(directory, lambda m: m["files"][block].update(sha256=sha, bytes=len(data)), resign=True)


def verify_cli(path: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["checkpoint", "verify", path])
    return code, capsys.readouterr().err


def one_line(err: str) -> bool:
    return err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_every_block_records_its_run_step_and_index(tmp_path: Path) -> None:
    directory = write_run(tmp_path, 5, "r1")
    manifest = ckpt.verify(directory)
    assert manifest["version"] == 3 and manifest["run_id"] == "r1"
    for entry in manifest["files"]:
        head = (Path(directory) / entry["file"]).read_bytes()[:200]
        fields, _ = ckpt.split_header(head, entry["file"])
        assert fields == {"block": entry["block"], "run_id": "r1", "step": 5} == {k: entry[k] for k in ("block", "run_id", "step")}
        assert ckpt.read_block(directory, entry)["block"] == entry["block"]


def test_a_block_of_another_step_is_refused_even_resigned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = write_run(tmp_path, 2), write_run(tmp_path, 3)
    shutil.copyfile(Path(old) / ckpt.block_file(1), Path(new) / ckpt.block_file(1))
    resign_block(new, 1)
    with pytest.raises(ckpt.CheckpointError, match="holds block 1 of step 2 of run 'run-a'.*needs block 1 of step 3"):
        ckpt.verify(new)
    code, err = verify_cli(new, capsys)
    assert code == 2 and one_line(err) and "step 2" in err
    manifest = json.loads((Path(new) / ckpt.MANIFEST).read_bytes())  # a restore refuses it too
    with pytest.raises(ckpt.CheckpointError, match="of step 2"):
        ckpt.read_block(new, manifest["files"][1])
    assert ckpt.find_latest(tmp_path).location == old  # recovery passes over it


def test_a_block_of_another_index_or_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = write_run(tmp_path / "a", 4, "run-a")
    theirs = write_run(tmp_path / "b", 4, "run-b")
    shutil.copyfile(Path(theirs) / ckpt.block_file(0), Path(mine) / ckpt.block_file(0))  # same step and index, other run
    resign_block(mine, 0)
    code, err = verify_cli(mine, capsys)
    assert code == 2 and one_line(err) and "run 'run-b'" in err
    shutil.copyfile(Path(theirs) / ckpt.block_file(2), Path(theirs) / ckpt.block_file(1))  # another index, same run
    resign_block(theirs, 1)
    code, err = verify_cli(theirs, capsys)
    assert code == 2 and one_line(err) and "holds block 2 of step 4" in err


def test_a_manifest_entry_edited_to_match_a_foreign_block_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = write_run(tmp_path, 2), write_run(tmp_path, 3)
    shutil.copyfile(Path(old) / ckpt.block_file(0), Path(new) / ckpt.block_file(0))
    resign_block(new, 0)
    edit_manifest(new, lambda m: m["files"][0].update(step=2), resign=True)  # the entry claims the block's step
    code, err = verify_cli(new, capsys)
    assert code == 2 and one_line(err) and "files[0] records step 2" in err


@pytest.mark.parametrize("kind", ["symlink to an identical block", "symlink to /dev/zero", "fifo block", "fifo manifest",
                                  "fifo marker", "directory block"])
def test_non_regular_files_inside_a_checkpoint_are_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    """Run as a real process under a time limit: a FIFO opened for reading blocks forever, /dev/zero never ends."""
    other = write_run(tmp_path / "other", 6, "run-a")
    bad = write_run(tmp_path / "run", 6, "run-a")
    block = Path(bad) / ckpt.block_file(1)
    target = {"fifo manifest": Path(bad) / ckpt.MANIFEST, "fifo marker": Path(bad) / ckpt.COMMIT}.get(kind, block)
    target.unlink()
    if kind == "symlink to an identical block":  # same run, step and index: only the symlink gives it away
        os.symlink(Path(other) / ckpt.block_file(1), target)
        resign_block(bad, 1)
    elif kind == "symlink to /dev/zero":  # the refusal must come before reading: /dev/zero never ends
        os.symlink("/dev/zero", target)
    elif kind == "directory block":
        target.mkdir()
    else:
        os.mkfifo(target)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "checkpoint", "verify", bad], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc.stderr), proc.stderr
    assert any(w in proc.stderr for w in ("symlink", "FIFO", "directory")), proc.stderr


def test_a_copy_elsewhere_still_verifies_and_restores(tmp_path: Path) -> None:
    src = write_run(tmp_path / "a", 7, "run-x")
    for dest in (tmp_path / "b" / "deep" / "step_00000007", tmp_path / "renamed"):
        report = copy_checkpoint(src, dest)
        manifest = ckpt.verify(dest)
        assert report.step == 7 and manifest["run_id"] == "run-x"
        assert all(ckpt.read_block(str(dest), e)["block"] == e["block"] for e in manifest["files"])
    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "renamed"), moved)  # moved by hand: the place is run/step/index, not the path
    assert ckpt.verify(moved)["step"] == 7


def write_version_2(root: Path, step: int) -> str:
    """A checkpoint exactly as version 2 wrote it (before block headers): torch.save alone, no run id."""
    directory = root / f"step_{step:08d}"
    directory.mkdir(parents=True)
    entries = []
    for b in range(BLOCKS):
        path = directory / ckpt.block_file(b)
        torch.save(ckpt.snapshot_block(b, torch.nn.Linear(4, 4), None), path)
        data = path.read_bytes()
        entries.append({"block": b, "file": path.name, "sha256": __import__("hashlib").sha256(data).hexdigest(),
                        "bytes": len(data), "shapes": {}})
    manifest = {"format": ckpt.FORMAT, "version": 2, "step": step, "num_blocks": BLOCKS, "seed": 0, "plan": {},
                "files": entries, "extra": {}}
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    (directory / ckpt.MANIFEST).write_bytes(data)
    marker = {"format": ckpt.FORMAT, "version": 2, "step": step,
              "manifest_sha256": __import__("hashlib").sha256(data).hexdigest(), "manifest_bytes": len(data)}
    (directory / ckpt.COMMIT).write_bytes(json.dumps(marker, sort_keys=True).encode())
    return str(directory)


def test_version_2_checkpoints_still_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_version_2(tmp_path, 4)
    manifest = ckpt.verify(old)
    assert manifest["version"] == 2
    fresh = torch.nn.Linear(4, 4)
    ckpt.restore_block(ckpt.read_block(old, manifest["files"][0]), fresh, None, "x")
    assert main(["checkpoint", "verify", old]) == 0 and capsys.readouterr().out.startswith(f"ok: {old} (step 4")
    assert ckpt.verify(copy_checkpoint(old, tmp_path / "copy" / "step_00000004").dest)["version"] == 2


def test_a_version_3_block_in_a_version_2_manifest_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A downgrade (the forger drops the places from the manifest and calls it version 2) does not help."""
    old = write_version_2(tmp_path / "old", 4)
    newer = write_run(tmp_path / "new", 3)
    shutil.copyfile(Path(newer) / ckpt.block_file(1), Path(old) / ckpt.block_file(1))
    resign_block(old, 1)
    code, err = verify_cli(old, capsys)
    assert code == 2 and one_line(err) and "version-2 checkpoint" in err


@pytest.mark.parametrize("version", [1, 4, "3", None])
def test_unknown_versions_are_refused(tmp_path: Path, version: Any, capsys: pytest.CaptureFixture[str]) -> None:
    directory = write_run(tmp_path, 1)
    edit_manifest(directory, lambda m: m.update(version=version), resign=True)
    code, err = verify_cli(directory, capsys)
    assert code == 2 and one_line(err) and "this reader knows 2, 3" in err


def test_blocks_of_different_runs_are_never_committed(tmp_path: Path) -> None:
    directory = ckpt.step_dir(str(tmp_path), 1)
    entries = [ckpt.write_block(directory, b, torch.nn.Linear(2, 2), None, step=1, run_id=f"r{b % 2}") for b in range(2)]
    with pytest.raises(ckpt.CheckpointError, match="different runs"):
        ckpt.write_manifest(directory, 1, 2, entries, {})
    unbound = [ckpt.write_block(tmp_path / "scratch", b, torch.nn.Linear(2, 2), None) for b in range(2)]
    with pytest.raises(ckpt.CheckpointError, match="records step None"):  # no step known: written, never committed
        ckpt.write_manifest(tmp_path / "scratch", 1, 2, unbound, {})
    assert not (tmp_path / "scratch" / ckpt.COMMIT).exists()


# ----- copies: never onto the source, never replacing or deleting what was there -----
def snapshot_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_copy_onto_itself_or_inside_itself_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_run(tmp_path, 2)
    before = snapshot_tree(tmp_path)
    for dest in (src, src + "/", os.path.join(src, "inner"), os.path.join(src, "..", "step_00000002")):
        assert main(["checkpoint", "copy", src, dest]) == 2
        err = capsys.readouterr().err
        assert one_line(err) and "itself or inside it" in err, err
    assert snapshot_tree(tmp_path) == before


def test_a_refused_copy_leaves_no_destination_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_run(tmp_path / "src", 2)
    (Path(src) / ckpt.block_file(2)).write_bytes(b"rotten")
    assert main(["checkpoint", "copy", src, str(tmp_path / "new" / "deeper" / "step_00000002")]) == 2
    assert one_line(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()
    assert main(["checkpoint", "copy", str(tmp_path / "src" / "nothing"), str(tmp_path / "out2")]) == 2
    capsys.readouterr()
    assert not (tmp_path / "out2").exists()


def test_a_local_folder_of_other_files_is_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_run(tmp_path / "src", 2)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["checkpoint", "copy", src, str(mine)]) == 2
    assert one_line(capsys.readouterr().err)
    assert snapshot_tree(mine) == {"notes.txt": b"keep me"}
    other_step = write_run(tmp_path / "dst", 5)  # a checkpoint of another step is not "an older copy" either
    before = snapshot_tree(Path(other_step))
    shutil.copytree(other_step, tmp_path / "dst" / "y")
    with pytest.raises(TransferError, match="neither empty nor a checkpoint of step 2"):
        copy_checkpoint(src, tmp_path / "dst" / "y")
    assert snapshot_tree(tmp_path / "dst" / "y") == before


def test_a_symlinked_step_folder_is_passed_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``step_N`` inside a run that links to another run's checkpoint is not this run's checkpoint."""
    mine = write_run(tmp_path / "mine", 2, "")
    other = write_run(tmp_path / "other", 9, "")  # run ids unknown on both sides: only the link gives it away
    os.symlink(other, tmp_path / "mine" / "step_00000009")
    found = ckpt.find_latest(tmp_path / "mine")
    assert found.location == mine and "is a symlink" in found.skipped[0].reason
    assert main(["checkpoint", "verify", str(tmp_path / "mine")]) == 0
    assert "skipped 1 damaged newer" in capsys.readouterr().out


def test_a_committed_checkpoint_of_another_run_is_never_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_run(tmp_path / "src", 2, run_id="run-a")
    theirs = write_run(tmp_path / "dst", 2, run_id="run-b")  # the same step of another run
    before = snapshot_tree(Path(theirs))
    assert main(["checkpoint", "copy", src, theirs]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "of run 'run-b', not run 'run-a'" in err, err
    assert snapshot_tree(Path(theirs)) == before
    again = write_run(tmp_path / "again", 2, run_id="run-a")  # the same run's same step: an identical copy is fine
    assert main(["checkpoint", "copy", src, again]) == 0 and "copied" in capsys.readouterr().out


def _file_size_limit(limit: int) -> None:
    """In the child: the kernel refuses writes past ``limit`` bytes per file (EFBIG, as a full quota does);
    SIGXFSZ ignored so the write fails instead of killing the process."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_no_room_is_one_line_naming_the_path_and_bytes_never_a_half_written_copy_nor_a_death(tmp_path: Path) -> None:
    src = ckpt.step_dir(str(tmp_path / "src"), 3)
    entries = [ckpt.write_block(src, b, torch.nn.Linear(64, 64 * (b + 1)), None, step=3, run_id="run-a") for b in range(BLOCKS)]
    ckpt.write_manifest(src, 3, BLOCKS, entries, {"stages": []}, {"losses": {"0": 1.0}})
    limit = max(e["bytes"] for e in entries) - 1  # the largest block does not fit
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dest = tmp_path / "dst" / "step_00000003"
    copy = subprocess.run([sys.executable, "-m", "orchestrator", "checkpoint", "copy", src, str(dest)], env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=lambda: _file_size_limit(limit))
    assert copy.returncode == 2 and one_line(copy.stderr), copy.stderr
    assert "File too large" in copy.stderr and "needs" in copy.stderr and "step_00000003" in copy.stderr
    assert not (tmp_path / "dst").exists()  # nothing half-written
    # a stage worker's checkpoint write: the store's failure (the job's exit 74), not a worker's death
    code = ("import sys, torch\nfrom actors import checkpoint as ckpt, storage\n"
            "try:\n    ckpt.write_block(sys.argv[1], 0, torch.nn.Linear(64, 256), None, step=1, run_id='r')\n"
            "except storage.StorageFull as e:\n    print(e)\n"
            "try:\n    ckpt.write_payload(sys.argv[1], ckpt.snapshot_block(0, torch.nn.Linear(64, 256), None), 1, 'r', retry_s=60)\n"
            "except storage.StorageFailed as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run" / "step_00000001")], env=env, capture_output=True,
                         text=True, timeout=120, preexec_fn=lambda: _file_size_limit(limit)).stdout.splitlines()
    assert len(out) == 2 and all("block_00000.pt" in line and "File too large (needs 66560 bytes" in line for line in out), out
    assert out[1].startswith("StorageFailed ")  # at once: no room is not an outage to wait out
    assert not list((tmp_path / "run").rglob("*.pt"))
