"""The checkpoint manifest: the format's names and the one validator every reader runs.

Split from :mod:`actors.checkpoint` (which reads and writes checkpoints and documents the layout) so that what a
manifest must hold is stated in one short place: every field a reader uses has the right type, the step agrees with
the commit marker and the ``step_N`` folder name, every file entry is a plain name inside the checkpoint with a sha256
and a size, and every block appears exactly once. Anything else is a :class:`CheckpointError` (one line).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, TypeGuard

from actors import storage
from orchestrator.core.errors import UserError

MANIFEST = "manifest.json"
COMMIT = "COMMIT"
FORMAT = "raypipe-checkpoint"
VERSION = 2
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
    if manifest.get("version") != VERSION:
        raise bad(f"version {manifest.get('version')!r}, this reader knows {VERSION}")
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
        names.add(name)
    blocks = sorted(int(e["block"]) for e in files)
    if blocks != list(range(num_blocks)):
        raise CheckpointError(f"checkpoint {where}: incomplete manifest (blocks {blocks} of {num_blocks})")
