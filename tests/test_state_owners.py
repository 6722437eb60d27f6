"""Every piece of state has one owner: no class declares attributes that another class sets (a mixin).

A class body with a bare annotation (``plan: Plan``, no value) and no constructor of its own that assigns it is a
mixin's promise that some subclass sets ``plan``: one object's state split over several files. Data classes,
protocols, named tuples and typed dicts declare their fields that way on purpose and are left out. Read from the
source, so it holds for every module, imported or not.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "orchestrator", "cloud")
DECLARATIVE = {"Protocol", "NamedTuple", "TypedDict"}


def _is_declarative(cls: ast.ClassDef) -> bool:
    bases = {ast.unparse(b).split(".")[-1] for b in cls.bases}
    decorated = {ast.unparse(d).split("(")[0].split(".")[-1] for d in cls.decorator_list}
    return bool(bases & DECLARATIVE) or "dataclass" in decorated


def _assigned_in_init(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            for node in ast.walk(item):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
                for t in targets:
                    for leaf in ast.walk(t):
                        if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                            names.add(leaf.attr)
    return names


def mixin_attributes() -> list[str]:
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
                if _is_declarative(cls):
                    continue
                own = _assigned_in_init(cls)
                for item in cls.body:
                    if isinstance(item, ast.AnnAssign) and item.value is None and isinstance(item.target, ast.Name) \
                            and item.target.id not in own:
                        found.append(f"{path.relative_to(ROOT)}: {cls.name}.{item.target.id}")
    return found


def test_no_class_declares_state_that_another_class_sets() -> None:
    assert mixin_attributes() == []


def test_the_check_finds_a_mixin(tmp_path: Path) -> None:
    """The detector itself: a mixin's bare annotation is found, a data class's field and an assigned one are not."""
    source = (
        "from dataclasses import dataclass\n"
        "class Mixin:\n    plan: int\n    def rows(self): return self.plan\n"
        "class Owner:\n    plan: int\n    def __init__(self): self.plan = 1\n"
        "@dataclass(frozen=True)\nclass Data:\n    plan: int\n"
    )
    classes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]
    flagged = [c.name for c in classes if not _is_declarative(c) and any(
        isinstance(i, ast.AnnAssign) and i.value is None and isinstance(i.target, ast.Name) and i.target.id not in _assigned_in_init(c)
        for i in c.body)]
    assert flagged == ["Mixin"]
