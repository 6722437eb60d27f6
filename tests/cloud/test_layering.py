"""``cloud/`` stands alone: importing every module of it loads nothing of orchestrator or actors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cloud_imports_neither_orchestrator_nor_actors():
    names = sorted(f"cloud.{p.stem}" for p in (ROOT / "cloud").glob("*.py") if p.stem != "__init__")
    assert "cloud.aws" in names and "cloud.preemption" in names
    code = ("import importlib, json, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('orchestrator', 'actors'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_no_source_line_imports_them():
    for path in (ROOT / "cloud").glob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            assert not stripped.startswith(("import orchestrator", "from orchestrator", "import actors", "from actors")), \
                f"{path.name}: {stripped}"
