"""The checkpoint format without Ray: commit marker last, and every tampering refused everywhere
(explicit read, ``latest()``, ``orchestrator checkpoint verify``) with one line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from actors import checkpoint as ckpt
from actors import storage
from orchestrator.cli.commands import main
from orchestrator.core.errors import UserError

BLOCKS = 3


def write_checkpoint(root: Path | str, step: int, seed: int = 0) -> str:
    """A real (tiny) checkpoint: three Linear blocks with Adam state, written as the runtime does."""
    torch.manual_seed(step)
    directory = ckpt.step_dir(str(root), step)
    entries = []
    for b in range(BLOCKS):
        block = torch.nn.Linear(4, 4)
        opt = torch.optim.Adam(block.parameters())
        block(torch.randn(2, 4)).sum().backward()
        opt.step()
        entries.append(ckpt.write_block(directory, b, block, opt))
    ckpt.write_manifest(directory, step, BLOCKS, entries, {"stages": []}, {"losses": {"0": 1.0}}, seed=seed)
    return directory


def edit_manifest(directory: str, change: Callable[[dict[str, Any]], None], resign: bool) -> None:
    """Edit the manifest; with ``resign`` also rewrite the commit marker (a forger who knows the format)."""
    path = Path(directory) / ckpt.MANIFEST
    manifest = json.loads(path.read_bytes())
    change(manifest)
    data = json.dumps(manifest).encode()
    path.write_bytes(data)
    if resign:
        ckpt.commit(directory, int(manifest["step"]) if isinstance(manifest.get("step"), int) else 0, data)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_written_last_marker_covers_the_manifest(tmp_path: Path) -> None:
    directory = write_checkpoint(tmp_path, 4, seed=7)
    manifest = ckpt.verify(directory)
    assert manifest["step"] == 4 and manifest["seed"] == 7 and manifest["num_blocks"] == BLOCKS
    marker = json.loads((Path(directory) / ckpt.COMMIT).read_bytes())
    assert marker["step"] == 4 and marker["manifest_bytes"] == (Path(directory) / ckpt.MANIFEST).stat().st_size
    assert sorted(os.listdir(directory)) == [ckpt.COMMIT, *[ckpt.block_file(b) for b in range(BLOCKS)], ckpt.MANIFEST]
    entry = manifest["files"][1]
    fresh, opt = torch.nn.Linear(4, 4), None
    ckpt.restore_block(ckpt.read_block(directory, entry), fresh, opt, "x")
    assert fresh.weight.shape == (4, 4)


TAMPERING: list[tuple[str, Callable[[str], None], str]] = [
    ("flipped byte in a block", lambda d: flip_byte(Path(d) / ckpt.block_file(1)), r"block_00001\.pt: checksum mismatch"),
    ("edited step", lambda d: edit_manifest(d, lambda m: m.update(step=100), resign=False), "does not match its commit marker"),
    ("edited step, re-signed", lambda d: edit_manifest(d, lambda m: m.update(step=100), resign=True),
     "holds step 100 but its folder says step 3"),
    ("edited loss", lambda d: edit_manifest(d, lambda m: m["extra"].update(losses={"0": 0.0}), resign=False),
     "does not match its commit marker"),
    ("path with ..", lambda d: edit_manifest(d, lambda m: m["files"][0].update(file="../step_00000002/block_00000.pt"),
                                             resign=True), r"malformed manifest \(files\[0\]\.file"),
    ("absolute path", lambda d: edit_manifest(d, lambda m: m["files"][0].update(file="/etc/passwd"), resign=True),
     "not a plain file name"),
    ("bad bytes", lambda d: edit_manifest(d, lambda m: m["files"][2].update(bytes="many"), resign=True),
     r"files\[2\]\.bytes 'many'"),
    ("missing sha256", lambda d: edit_manifest(d, lambda m: m["files"][2].pop("sha256"), resign=True),
     r"files\[2\]\.sha256 None"),
    ("loss not a number", lambda d: edit_manifest(d, lambda m: m["extra"].update(losses={"0": "low"}), resign=True),
     "extra.losses must map step numbers to finite numbers"),
    ("step is a string", lambda d: edit_manifest(d, lambda m: m.update(step="3"), resign=True), "step '3'"),
    ("missing commit marker", lambda d: (Path(d) / ckpt.COMMIT).unlink(), "missing commit marker COMMIT"),
    ("garbage commit marker", lambda d: (Path(d) / ckpt.COMMIT).write_bytes(b"\xff\x00"), "COMMIT: not valid JSON"),
    ("missing block", lambda d: (Path(d) / ckpt.block_file(2)).unlink(), r"block_00002\.pt: cannot read"),
]


@pytest.mark.parametrize("what,tamper,reason", TAMPERING, ids=[t[0] for t in TAMPERING])
def test_tampering_is_refused_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str,
                                         tamper: Callable[[str], None], reason: str) -> None:
    good = write_checkpoint(tmp_path, 2)
    bad = write_checkpoint(tmp_path, 3)
    tamper(bad)
    with pytest.raises(ckpt.CheckpointError, match=reason):
        ckpt.verify(bad)
    found = ckpt.find_latest(tmp_path)  # the damaged newest is skipped, with its reason recorded
    assert found.location == good and found.step == 2
    assert [s.location for s in found.skipped] == [bad] and "\n" not in found.skipped[0].reason
    assert ckpt.latest(tmp_path) == tmp_path / "step_00000002"  # a Path for a Path root
    assert main(["checkpoint", "verify", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0  # the location: the newest valid one, named
    out = capsys.readouterr().out
    assert out.startswith(f"ok: {good} (step 2") and "skipped 1 damaged newer" in out and out.count("\n") == 1


def test_verify_cli_on_an_intact_checkpoint_and_on_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = write_checkpoint(tmp_path, 5)
    assert main(["checkpoint", "verify", directory]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {directory} (step 5, 3 blocks")
    assert main(["checkpoint", "verify", str(tmp_path / "empty")]) == 2
    assert "no checkpoint here" in capsys.readouterr().err
    assert main(["checkpoint", "verify", "ftp://host/x"]) == 2
    assert "unsupported storage scheme 'ftp'" in capsys.readouterr().err


def test_all_damaged_means_no_latest_and_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for step in (1, 2):
        (Path(write_checkpoint(tmp_path, step)) / ckpt.COMMIT).unlink()
    found = ckpt.find_latest(tmp_path)
    assert found.location is None and len(found.skipped) == 2
    assert main(["checkpoint", "verify", str(tmp_path)]) == 2
    assert "no valid checkpoint (2 damaged; newest: " in capsys.readouterr().err


def test_a_writer_cannot_commit_what_a_reader_refuses(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no actor wrote block"):
        ckpt.write_manifest(str(tmp_path / "step_00000001"), 1, 2, [], {})
    entry = {"block": 0, "file": "../x.pt", "sha256": "0" * 64, "bytes": 1}
    with pytest.raises(UserError, match="not a plain file name"):
        ckpt.write_manifest(str(tmp_path / "step_00000001"), 1, 1, [entry], {})
    assert not (tmp_path / "step_00000001" / ckpt.COMMIT).exists()


def test_local_writes_never_replace_a_non_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(storage.StorageError, match="is a symlink; refusing"):
        storage.write_bytes(str(link), b"new")
    (tmp_path / "adir").mkdir()
    with pytest.raises(storage.StorageError, match="is a directory; refusing"):
        storage.write_bytes(str(tmp_path / "adir"), b"new")
    assert target.read_text() == "keep" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "link", "victim"]  # no temp files left


def test_storage_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(storage.StorageError, match="unsupported storage scheme 'hdfs' \\(use a local path, file://"):
        storage.filesystem("hdfs://x/y")
    with pytest.raises(storage.StorageError, match="no such file or object"):
        storage.read_bytes(str(tmp_path / "nope"))
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(storage.StorageError, match="set AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_NAME"):
        storage.exists("az://container/ckpt")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    with pytest.raises(storage.StorageError, match="no Google credentials: set GOOGLE_APPLICATION_CREDENTIALS"):
        storage.exists("gs://bucket/ckpt")
    for bad in ("../x", "a/../b", "/abs", "", ".", "a\\b", "c:/x"):
        with pytest.raises(storage.StorageError, match="not a plain relative name"):
            storage.join(str(tmp_path), bad)


def test_background_write_uploads_the_snapshot_even_if_weights_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    block = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(block.parameters(), lr=0.5)
    snapshot = ckpt.snapshot_block(0, block, opt)
    want = {k: v.clone() for k, v in block.state_dict().items()}
    gate = threading.Event()
    original = ckpt.write_payload

    def held(directory: Any, payload: Any, *place: Any) -> Any:
        assert gate.wait(10)
        return original(directory, payload, *place)

    monkeypatch.setattr(ckpt, "write_payload", held)
    upload = ckpt.BackgroundWrite(str(tmp_path), [snapshot])
    block(torch.randn(3, 4)).sum().backward()
    opt.step()  # the live weights move on while the upload has not even started
    assert not upload.done()
    gate.set()
    entries = upload.result(timeout_s=10)
    payload = ckpt.read_block(str(tmp_path), entries[0])
    assert all(torch.equal(payload["model"][k], want[k]) for k in want)
    assert not torch.equal(block.weight, want["weight"])

