"""Reading and writing the project's JSON files with the two guarantees every command relies on.

Reading: an unreadable or malformed file is a :class:`UserError` naming the file and the problem
(one line, no traceback). Writing: a temporary name, fsync, then rename, so a crash never leaves
half a file where a complete one is expected.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """Parse ``path``; ``what`` names the file's role in errors ("profile", "plan", "cluster")."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except OSError as exc:
        raise UserError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} {p}: invalid JSON ({exc.msg} at line {exc.lineno})") from None


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON under a temporary name and rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
