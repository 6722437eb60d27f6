"""Checkpoints and transfers against real object-store servers started here (tests/servers.py):
moto's S3 server, Azurite (Azure Blob) and the GCS emulator. Nothing is mocked."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from actors import checkpoint as ckpt
from actors import storage
from actors.checkpoint_transfer import TransferError, copy_checkpoint
from orchestrator.cli.commands import main
from orchestrator.core.errors import UserError
from tests.servers import az_container, azurite_connection, free_port, gcs_bucket, gcs_endpoint, s3_bucket, s3_client, s3_endpoint  # noqa: F401
from tests.test_checkpoint_format import BLOCKS, write_checkpoint

BACKENDS = ["s3", "az", "gs"]


@pytest.fixture(params=BACKENDS)
def remote(request: pytest.FixtureRequest) -> str:
    fixture = {"s3": "s3_bucket", "az": "az_container", "gs": "gcs_bucket"}[request.param]
    return str(request.getfixturevalue(fixture))


def put(location: str, data: bytes) -> None:
    """Overwrite an object behind the format's back (what an attacker or bit rot would do)."""
    storage.write_bytes(location, data)


def test_write_verify_restore_and_tampering(remote: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = f"{remote}/run"
    good = write_checkpoint(root, 2)
    bad = write_checkpoint(root, 3)
    assert storage.listdir(good) == sorted([ckpt.COMMIT, *[ckpt.block_file(b) for b in range(BLOCKS)], ckpt.MANIFEST])
    manifest = ckpt.verify(bad)
    assert manifest["step"] == 3
    fresh = torch.nn.Linear(4, 4)
    ckpt.restore_block(ckpt.read_block(bad, manifest["files"][0]), fresh, None, "x")
    assert main(["checkpoint", "verify", root]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {bad} (step 3, 3 blocks")
    block = storage.join(bad, ckpt.block_file(1))  # one flipped byte in the newest
    data = bytearray(storage.read_bytes(block))
    data[len(data) // 2] ^= 0x01
    put(block, bytes(data))
    assert main(["checkpoint", "verify", bad]) == 2
    assert "block_00001.pt: checksum mismatch" in capsys.readouterr().err
    found = ckpt.find_latest(root)
    assert found.location == good and [s.location for s in found.skipped] == [bad]
    assert "checksum mismatch" in found.skipped[0].reason
    assert main(["checkpoint", "verify", root]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {good} (step 2")


def test_transfer_local_to_remote_and_back(remote: str, tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "local", 4)
    up = copy_checkpoint(src, f"{remote}/copies/step_00000004")
    assert up.step == 4 and ckpt.verify(up.dest)["step"] == 4
    down = copy_checkpoint(up.dest, tmp_path / "back" / "step_00000004")
    for name in os.listdir(src):
        assert (Path(down.dest) / name).read_bytes() == (Path(src) / name).read_bytes()
    assert os.listdir(tmp_path / "back") == ["step_00000004"]


def test_multipart_upload_and_download_are_streamed(s3_bucket: str, s3_endpoint: str, tmp_path: Path) -> None:
    """An 11 MiB block with 5 MiB parts (S3's minimum): three parts up, chunked reads down."""
    src = str(ckpt.step_dir(tmp_path / "local", 1))
    big = torch.nn.Linear(1600, 1900)  # 11.6 MiB of float32 weights
    entries = [ckpt.write_block(src, 0, big, None)]
    ckpt.write_manifest(src, 1, 1, entries, {})
    dest = f"{s3_bucket}/run/step_00000001"
    report = copy_checkpoint(src, dest, block_size=5 << 20, chunk=1 << 20)
    assert report.bytes > 11 << 20
    bucket = s3_bucket.removeprefix("s3://")
    head = s3_client(s3_endpoint).head_object(Bucket=bucket, Key="run/step_00000001/" + ckpt.block_file(0))
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object of three parts
    reads: list[int] = []
    original = storage.read_chunks

    def counting(location: Any, chunk: int = storage.CHUNK) -> Any:
        for data in original(location, chunk):
            reads.append(len(data))
            yield data

    storage.read_chunks = counting  # type: ignore[assignment]
    try:
        copy_checkpoint(dest, tmp_path / "back" / "step_00000001", chunk=1 << 20, verify_after=False)
    finally:
        storage.read_chunks = original  # type: ignore[assignment]
    assert max(reads) <= 1 << 20 and sum(reads) >= 11 << 20  # never more than a chunk at a time
    assert ckpt.verify(tmp_path / "back" / "step_00000001")["step"] == 1


def test_interrupted_download_leaves_nothing(s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remote_ckpt = write_checkpoint(f"{s3_bucket}/run", 5)
    original = storage.read_chunks
    calls = {"n": 0}

    def dying(location: Any, chunk: int = storage.CHUNK) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # the third object: the connection drops mid-way
            raise ConnectionResetError("connection reset by peer")
        yield from original(location, chunk)

    monkeypatch.setattr(storage, "read_chunks", dying)
    with pytest.raises(ConnectionResetError):
        copy_checkpoint(remote_ckpt, tmp_path / "dst" / "step_00000005")
    assert not (tmp_path / "dst").exists()  # no staging folder, no partial checkpoint, no folder the copy created
    monkeypatch.setattr(storage, "read_chunks", original)
    block = storage.join(remote_ckpt, ckpt.block_file(2))  # a corrupted object is caught while streaming
    put(block, storage.read_bytes(block)[:-10])
    with pytest.raises(TransferError, match="block_00002.pt: checksum mismatch while copying"):
        copy_checkpoint(remote_ckpt, tmp_path / "dst" / "step_00000005")
    assert not (tmp_path / "dst").exists()


def test_interrupted_upload_is_never_a_checkpoint(s3_bucket: str, tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "local", 6)
    (Path(src) / ckpt.block_file(1)).write_bytes(b"rotten")
    dest = f"{s3_bucket}/run/step_00000006"
    with pytest.raises(TransferError, match="checksum mismatch while copying"):
        copy_checkpoint(src, dest)
    assert not storage.exists(storage.join(dest, ckpt.COMMIT)) and storage.listdir(dest) == []


def test_hostile_key_in_a_remote_manifest(s3_bucket: str, tmp_path: Path) -> None:
    from tests.test_checkpoint_format import edit_manifest

    local = write_checkpoint(tmp_path / "src", 3)
    edit_manifest(local, lambda m: m["files"][0].update(file="../../escaped.txt"), resign=True)
    remote_ckpt = f"{s3_bucket}/run/step_00000003"
    for name in os.listdir(local):
        put(storage.join(remote_ckpt, name), (Path(local) / name).read_bytes())
    with pytest.raises(UserError, match=r"'\.\./\.\./escaped\.txt' is not a plain file name"):
        copy_checkpoint(remote_ckpt, tmp_path / "out" / "a" / "step_00000003")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.txt").exists()


def test_missing_object_unreachable_endpoint_and_missing_credentials(
        s3_bucket: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(storage.StorageError, match="no such file or object"):
        storage.read_bytes(f"{s3_bucket}/nothing/here")
    assert main(["checkpoint", "verify", f"{s3_bucket}/nothing"]) == 2
    assert "no checkpoint here" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    assert main(["checkpoint", "verify", f"{s3_bucket}/run"]) == 2
    err = capsys.readouterr().err
    assert "storage endpoint unreachable (http://127.0.0.1:" in err and err.count("\n") == 1
    assert time.monotonic() - t0 < 60
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    assert main(["checkpoint", "verify", "s3://somebucket/run"]) == 2
    err = capsys.readouterr().err
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in err and err.count("\n") == 1
    assert "testing" not in err


# ----- issue 23 item 4: a copy never deletes or replaces what it did not write -----
def bucket_objects(endpoint: str, bucket: str) -> dict[str, bytes]:
    """Every object in the bucket with its bytes, read with boto3 directly (not through our storage layer)."""
    client = s3_client(endpoint)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def seed_unrelated(endpoint: str, bucket: str) -> None:
    """Objects above, beside and under the destination prefixes the tests copy to."""
    client = s3_client(endpoint)
    for key in ("top.txt", "runs/keep.bin", "runs/step_00000006/../x", "runs/step_00000006-other/block_00000.pt",
                "runs/step_00000006/notes.txt", "other/step_00000006/COMMIT"):
        client.put_object(Bucket=bucket, Key=key, Body=f"unrelated {key}".encode())


@pytest.mark.parametrize("dest", ["", "/runs", "/runs/step_00000006"])
def test_a_failed_copy_removes_only_what_it_created(s3_bucket: str, s3_endpoint: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str], dest: str) -> None:
    """``orchestrator checkpoint copy SRC s3://BUCKET[/prefix]`` with a damaged block of SRC: exit 2, one line, every
    object already in the bucket still there, byte for byte (the old cleanup, ``fs.rm(dest, recursive=True)``,
    deleted them and then the bucket)."""
    bucket = s3_bucket.removeprefix("s3://")
    seed_unrelated(s3_endpoint, bucket)
    src = write_checkpoint(tmp_path / "local", 6)
    (Path(src) / ckpt.block_file(BLOCKS - 1)).write_bytes(b"rotten")  # the earlier blocks are uploaded first
    before = bucket_objects(s3_endpoint, bucket)
    assert main(["checkpoint", "copy", src, s3_bucket + dest]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "checksum mismatch" in err
    assert bucket_objects(s3_endpoint, bucket) == before


def test_a_copy_never_replaces_objects_already_there(s3_bucket: str, s3_endpoint: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bucket = s3_bucket.removeprefix("s3://")
    src = write_checkpoint(tmp_path / "a", 6)
    other = write_checkpoint(tmp_path / "b", 7)
    dest = f"{s3_bucket}/runs/step_00000006"
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key="runs/step_00000006/manifest.json", Body=b"somebody's")
    before = bucket_objects(s3_endpoint, bucket)
    assert main(["checkpoint", "copy", src, dest]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds manifest.json" in err
    assert bucket_objects(s3_endpoint, bucket) == before
    fresh = f"{s3_bucket}/runs/fresh"
    assert copy_checkpoint(src, fresh).step == 6
    again = copy_checkpoint(src, fresh)  # the same checkpoint, byte for byte: nothing to do, verified
    assert again.step == 6 and ckpt.verify(fresh)["step"] == 6
    with pytest.raises(TransferError, match="already holds"):  # another checkpoint onto it: refused, untouched
        copy_checkpoint(other, fresh)
    assert ckpt.verify(fresh)["step"] == 6
    assert main(["checkpoint", "copy", fresh, fresh + "/"]) == 2 and "itself" in capsys.readouterr().err


def test_an_interrupted_remote_copy_removes_its_objects_one_by_one(s3_bucket: str, s3_endpoint: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3_bucket.removeprefix("s3://")
    seed_unrelated(s3_endpoint, bucket)
    src = write_checkpoint(tmp_path / "local", 6)
    before = bucket_objects(s3_endpoint, bucket)
    original = storage.write_bytes

    def interrupted(location: Any, data: bytes) -> None:
        if str(location).endswith(ckpt.COMMIT):
            raise KeyboardInterrupt  # Ctrl-C just before the marker: every block and the manifest are there
        original(location, data)

    monkeypatch.setattr(storage, "write_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        copy_checkpoint(src, f"{s3_bucket}/runs")
    assert bucket_objects(s3_endpoint, bucket) == before
