"""Plan-independent checkpoints: one file per model BLOCK plus a manifest written last.

Why per block and not per stage: a stage is an artefact of one plan, while a block is a fixed
piece of the model. Keying weights *and* optimizer state by block (the runtime gives every block
its own optimizer) lets a checkpoint taken with 3 stages restore onto 2 stages, other boundaries
or other replica counts without any resharding logic.

Layout of ``<root>/step_<NNNNNNNN>/``::

    block_00000.pt ... block_<L-1>.pt   torch.save({block, model, optimizer, shapes})
    manifest.json                       step, plan, seed, sha256 + size of every block file

Atomicity: every file is written under a temporary name, fsynced and renamed; the driver writes
the manifest only after every actor reported its blocks written, and a reader trusts nothing
without a complete manifest whose checksums match. A crash therefore leaves either a complete
checkpoint or a directory without manifest, which :func:`latest` skips and :func:`read_manifest`
rejects with a :class:`UserError` naming what is missing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from orchestrator.errors import UserError

MANIFEST = "manifest.json"
FORMAT = "raypipe-checkpoint"
VERSION = 1


def block_file(block: int) -> str:
    return f"block_{block:05d}.pt"


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Temp name in the same directory, fsync, rename, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_block(directory: Path, block: int, module: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Write one block's weights and optimizer state; return its manifest entry."""
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    payload = {
        "block": block,
        "model": state,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "shapes": {k: list(v.shape) for k, v in state.items()},
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    name = block_file(block)
    write_bytes_atomic(directory / name, data)
    return {"block": block, "file": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "shapes": payload["shapes"]}


def write_manifest(
    directory: Path, step: int, num_blocks: int, entries: Sequence[Mapping[str, Any]], plan: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Written by the driver after every block file is durable; its presence marks completeness."""
    by_block = {int(e["block"]): dict(e) for e in entries}
    missing = sorted(set(range(num_blocks)) - set(by_block))
    if missing:
        raise RuntimeError(f"checkpoint {directory}: no actor wrote block(s) {missing}; not writing the manifest")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "num_blocks": num_blocks,
        "plan": dict(plan),
        "files": [by_block[b] for b in range(num_blocks)],
        "extra": dict(extra or {}),
    }
    write_bytes_atomic(directory / MANIFEST, json.dumps(payload, indent=1).encode())
    return directory / MANIFEST


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a complete checkpoint, or a UserError saying why it is not one."""
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise UserError(f"checkpoint {directory}: no such directory")
    if not path.is_file():
        raise UserError(f"checkpoint {directory}: missing {MANIFEST} (the checkpoint is torn or was never completed)")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"checkpoint file {path}: unreadable manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"checkpoint file {path}: not a raypipe checkpoint manifest")
    try:
        num_blocks = int(data["num_blocks"])
        blocks = [int(e["block"]) for e in data["files"]]
        int(data["step"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"checkpoint file {path}: malformed manifest ({type(exc).__name__}: {exc})") from None
    if sorted(blocks) != list(range(num_blocks)):
        raise UserError(f"checkpoint file {path}: incomplete manifest (blocks {sorted(blocks)} of {num_blocks})")
    return data


def verify(directory: str | os.PathLike[str], manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Check that every listed file exists with its recorded size and sha256."""
    data = dict(manifest) if manifest is not None else read_manifest(directory)
    for entry in data["files"]:
        path = Path(directory) / str(entry["file"])
        _check_bytes(path, _read(path), entry)
    return data


def check_model(manifest: Mapping[str, Any], num_blocks: int, directory: str | os.PathLike[str]) -> None:
    if int(manifest["num_blocks"]) != num_blocks:
        raise UserError(
            f"checkpoint {directory} holds {manifest['num_blocks']} blocks but the model has {num_blocks}: "
            "it was taken from a different model"
        )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"checkpoint file {path}: cannot read ({exc.strerror or exc})") from None


def _check_bytes(path: Path, data: bytes, entry: Mapping[str, Any]) -> None:
    if len(data) != int(entry["bytes"]) or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise UserError(f"checkpoint file {path}: checksum mismatch (corrupted or partially written); refusing to load")


def read_block(directory: str | os.PathLike[str], entry: Mapping[str, Any]) -> dict[str, Any]:
    """Load one block file after verifying its checksum against the manifest entry."""
    path = Path(directory) / str(entry["file"])
    data = _read(path)
    _check_bytes(path, data, entry)
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or int(payload.get("block", -1)) != int(entry["block"]):
        raise UserError(f"checkpoint file {path}: does not hold block {entry['block']}")
    return payload


def restore_block(
    payload: Mapping[str, Any], module: nn.Module, optimizer: torch.optim.Optimizer | None, path: str
) -> None:
    """Load weights and optimizer state, turning shape/key mismatches into one clear UserError."""
    try:
        module.load_state_dict(payload["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])
        raise UserError(f"checkpoint file {path}: block {payload['block']} does not match the model ({detail})") from None
    state = payload.get("optimizer")
    if optimizer is not None and state is not None:
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise UserError(f"checkpoint file {path}: optimizer state of block {payload['block']} does not fit ({exc})") from None


def latest(root: str | os.PathLike[str], check_files: bool = True) -> Path | None:
    """Newest step directory that is a complete checkpoint.

    Torn ones (no manifest) are always skipped; with ``check_files`` every block file's checksum
    is verified too, so a corrupted newest checkpoint falls back to the one before it instead of
    failing the restore.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    candidates = sorted(p for p in base.glob("step_*") if p.is_dir() and (p / MANIFEST).is_file())
    for path in reversed(candidates):
        if not check_files:
            return path
        try:
            verify(path)
        except UserError:
            continue
        return path
    return None
