"""The checkpoint manifest: the format's names and the one validator every reader runs.

Split from :mod:`actors.checkpoint` (which reads and writes checkpoints and documents the layout) so that what a
manifest must hold is stated in one short place: every field a reader uses has the right type, the step agrees with
the commit marker and the ``step_N`` folder name, every file entry is a plain name inside the checkpoint with a sha256
and a size, and every block appears exactly once. Anything else is a :class:`CheckpointError` (one line).

Versions: 3 (current) binds every block to its place: each block file starts with a header line recording the run
id, the step and the block index (:func:`block_header`), and each manifest entry repeats the run id and step, so a
block of another step or another run is refused even when the manifest's checksum and the commit marker were
re-written to match it. Version 2 (written before; no header, no ``run_id``) still loads, with only its checksums
checked; a version-2 checkpoint holding a block with a header is refused (it was forged from a newer one).
"""

from __future__ import annotations

import math
import os
import re
import json
from typing import Any, Mapping, TypeGuard

from actors import storage
from orchestrator.core.errors import UserError

MANIFEST = "manifest.json"
COMMIT = "COMMIT"
FORMAT = "raypipe-checkpoint"
VERSION = 3
VERSIONS = (2, 3)  # every version this reader loads; 2: blocks carry no header
BLOCK_MAGIC = b"raypipe-block "
MAX_HEADER_BYTES = 4096
MAX_MANIFEST_BYTES = 64 << 20
_STEP_DIR = re.compile(r"step_(\d{8,})")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class CheckpointError(UserError):
    """A checkpoint that must not be loaded: torn, tampered, malformed or foreign."""


def dir_step(location: str | os.PathLike[str]) -> int | None:
    """The step a ``step_N`` folder name promises, None for any other name."""
    match = _STEP_DIR.fullmatch(storage.basename(location))
    return int(match.group(1)) if match else None


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_manifest(manifest: Any, where: str, marker_step: int) -> None:
    """Every field a reader uses, checked; the step agrees with the marker and the folder name."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {where}: malformed manifest ({why})")

    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {where}: not a raypipe checkpoint manifest")
    version = manifest.get("version")
    if not is_int(version) or version not in VERSIONS:
        raise bad(f"version {version!r}, this reader knows {', '.join(map(str, VERSIONS))}")
    step, num_blocks, files = manifest.get("step"), manifest.get("num_blocks"), manifest.get("files")
    if not is_int(step) or step < 0:
        raise bad(f"step {step!r} is not a non-negative integer")
    if step != marker_step:
        raise CheckpointError(f"checkpoint {where}: manifest step {step} differs from the commit marker's {marker_step}")
    named = dir_step(where)
    if named is not None and named != step:
        raise CheckpointError(f"checkpoint {where}: holds step {step} but its folder says step {named}")
    if not is_int(num_blocks) or num_blocks < 1:
        raise bad(f"num_blocks {num_blocks!r} is not a positive integer")
    if not isinstance(manifest.get("plan"), dict) or not isinstance(manifest.get("extra"), dict):
        raise bad("plan and extra must be objects")
    if manifest.get("seed") is not None and not is_int(manifest.get("seed")):
        raise bad(f"seed {manifest.get('seed')!r} is not an integer")
    losses = manifest["extra"].get("losses", {})
    if not isinstance(losses, dict) or not all(
            isinstance(k, str) and k.isdigit() and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for k, v in losses.items()):
        raise bad("extra.losses must map step numbers to finite numbers")
    run_id = manifest.get("run_id")
    if version >= 3 and not isinstance(run_id, str):
        raise bad(f"run_id {run_id!r} is not a string")
    if not isinstance(files, list):
        raise bad("files is not a list")
    names: set[str] = set()
    for i, entry in enumerate(files):
        if not isinstance(entry, dict):
            raise bad(f"files[{i}] is not an object")
        block, name, sha, size = entry.get("block"), entry.get("file"), entry.get("sha256"), entry.get("bytes")
        if not is_int(block) or not 0 <= block < num_blocks:
            raise bad(f"files[{i}].block {block!r} is not a block index below {num_blocks}")
        if not isinstance(name, str) or "/" in name or name in (MANIFEST, COMMIT):
            raise bad(f"files[{i}].file {name!r} is not a plain file name inside the checkpoint")
        try:
            storage.check_relative(name)
        except UserError:
            raise bad(f"files[{i}].file {name!r} is not a plain file name inside the checkpoint") from None
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise bad(f"files[{i}].sha256 {sha!r} is not a sha256 hex digest")
        if not is_int(size) or size < 0:
            raise bad(f"files[{i}].bytes {size!r} is not a non-negative integer")
        if name in names:
            raise bad(f"files[{i}].file {name!r} is listed twice")
        if version >= 3 and (entry.get("step") != step or not is_int(entry.get("step")) or entry.get("run_id") != run_id):
            raise bad(f"files[{i}] records step {entry.get('step')!r} of run {entry.get('run_id')!r}, "
                      f"not step {step} of run {run_id!r}")
        if version < 3 and ("step" in entry or "run_id" in entry):
            raise bad(f"files[{i}] records a step or run id, which version {version} never wrote")
        names.add(name)
    blocks = sorted(int(e["block"]) for e in files)
    if blocks != list(range(num_blocks)):
        raise CheckpointError(f"checkpoint {where}: incomplete manifest (blocks {blocks} of {num_blocks})")


def block_header(run_id: str, step: int | None, block: int) -> bytes:
    """The first line of a version-3 block file: where the block belongs (its place)."""
    fields = json.dumps({"block": block, "run_id": run_id, "step": step}, sort_keys=True, ensure_ascii=True)
    return BLOCK_MAGIC + fields.encode() + b"\n"


def split_header(data: bytes, location: str) -> tuple[dict[str, Any] | None, int]:
    """(the header's fields, where the payload starts); (None, 0) for a block without a header (version 2)."""
    if not data.startswith(BLOCK_MAGIC):
        return None, 0
    end = data.find(b"\n", 0, MAX_HEADER_BYTES)
    if end < 0:
        raise CheckpointError(f"checkpoint file {location}: block header not terminated within {MAX_HEADER_BYTES} bytes")
    try:
        fields = json.loads(data[len(BLOCK_MAGIC):end])
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint file {location}: malformed block header") from None
    if not isinstance(fields, dict):
        raise CheckpointError(f"checkpoint file {location}: malformed block header")
    return fields, end + 1


def check_place(header: Mapping[str, Any] | None, entry: Mapping[str, Any], location: str) -> None:
    """The block's own header agrees with the manifest entry: same block index, step and run.

    A version-3 entry (it records ``step``) needs a header; a version-2 one must not have one."""
    if "step" not in entry:
        if header is not None:
            raise CheckpointError(f"checkpoint file {location}: a block with a header in a version-2 checkpoint (forged)")
        return
    if header is None:
        raise CheckpointError(f"checkpoint file {location}: no block header (not a block of this checkpoint)")
    got = (header.get("run_id"), header.get("step"), header.get("block"))
    want = (entry.get("run_id"), entry.get("step"), entry.get("block"))
    if got != want:
        raise CheckpointError(
            f"checkpoint file {location}: holds block {got[2]!r} of step {got[1]!r} of run {got[0]!r}, "
            f"but this checkpoint needs block {want[2]} of step {want[1]} of run {want[0]!r}; refusing to load it")
