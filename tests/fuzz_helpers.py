"""Running the CLI in-process for fuzzing: exit code, stdout, stderr, and what it wrote.

In-process (``orchestrator.cli.commands(argv)`` with redirected streams) keeps a fuzz example in the
milliseconds; an exception escaping ``main`` is re-raised so the test shows it (it would be a
traceback for a user). ``snapshot`` records every file under a folder (name, kind, size, mtime),
so "nothing written on exit 2" is checked by comparing two snapshots.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from orchestrator.core.profile import Block, Profile


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def run_cli(argv: Sequence[str], cwd: Path) -> Run:
    """``orchestrator argv`` in-process in ``cwd``; argparse's ``SystemExit`` (``--help``) is an exit code."""
    from orchestrator.cli.commands import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        os.chdir(old)
    return Run(int(code), out.getvalue(), err.getvalue())


def snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under ``root``: relative path -> (kind, size, mtime_ns); links are not followed."""
    seen: dict[str, tuple[str, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
            seen[str(p.relative_to(root))] = (kind, st.st_size if kind == "file" else 0, st.st_mtime_ns if kind == "file" else 0)
    return seen


def check_contract(run: Run, before: dict[str, tuple[str, int, int]], after: dict[str, tuple[str, int, int]], argv: Sequence[str]) -> None:
    """Exit 0 or 2; no traceback; on exit 2 exactly one line on stderr and nothing written."""
    assert run.code in (0, 2), f"{list(argv)} exited {run.code}: {run.err[-500:]}"
    assert "Traceback" not in run.err, f"{list(argv)}: {run.err[-2000:]}"
    if run.code == 2:
        lines = [line for line in run.err.splitlines() if line.strip()]
        assert len(lines) == 1, f"{list(argv)}: {len(lines)} lines on stderr: {run.err[-1000:]}"
        assert before == after, f"{list(argv)} exited 2 but changed files: {sorted(set(after.items()) ^ set(before.items()))}"


def write_good_profile(path: Path, blocks: int = 6) -> Path:
    """A small valid profile (uniform-ish blocks) without running torch."""
    prof = Profile("fuzz", tuple(Block(f"b{i}", 0.001 * (1 + i % 3), 0.002, 1e6, 4e6) for i in range(blocks)), 4, 1e5)
    path.write_text(json.dumps(prof.to_dict()))
    return path
