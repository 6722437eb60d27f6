"""The public API covers what the README shows: every name the README's code imports, and every class of the
packages the README names in prose, is importable from ``orchestrator`` or from the layer package that defines it."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import orchestrator

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_import_in_the_readmes_code_works() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks  # the check sees the README's code
    imports = [node for block in blocks for node in ast.walk(ast.parse(block)) if isinstance(node, ast.ImportFrom)]
    assert imports
    for node in imports:
        module = importlib.import_module(str(node.module))
        for alias in node.names:
            assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                f"README: from {node.module} import {alias.name}"


def test_every_public_class_the_readme_names_is_importable_from_orchestrator_or_its_layer() -> None:
    named = set(re.findall(r"`([A-Z][A-Za-z0-9]+)[`(.\[]", README))
    defined: dict[str, str] = {}
    for top in ("orchestrator", "actors", "cloud"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    defined.setdefault(node.name, ".".join(path.relative_to(ROOT).with_suffix("").parts))
    checked = sorted(named & set(defined))
    assert "ElasticJob" in checked and "PipelineTrainer" in checked and "PipelineRuntime" in checked
    missing = []
    for name in checked:
        layer = ".".join(defined[name].split(".")[:2])  # orchestrator.adapt, actors.placement, cloud.store ...
        if name not in orchestrator.__all__ and not hasattr(importlib.import_module(layer), name):
            missing.append(f"{name} ({defined[name]})")
    assert not missing, missing
