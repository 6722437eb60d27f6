"""Every piece of state has one owner: no class declares attributes that another class sets (a mixin), and no
object sets another object's attributes through a reference it holds (``self.job.alive = ...``).

A class body with a bare annotation (``plan: Plan``, no value) and no constructor of its own that assigns it is a
mixin's promise that some subclass sets ``plan``: one object's state split over several files. Data classes,
protocols, named tuples and typed dicts declare their fields that way on purpose and are left out. A write through a
held reference is the same split from the other side: the owner no longer knows who changes its state; it asks the
owner instead (a method of the owner's). Read from the source, so it holds for every module, imported or not.
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


def writes_through(source: str) -> list[str]:
    """Assignments to an attribute of an object reached through one of ``self``'s (``self.a.b = ...``,
    ``self.a.b += ...``); a write into a container the object owns (``self.rows[k] = ...``) is its own."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute):
                    root: ast.expr = t.value
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    if isinstance(root, ast.Name) and root.id == "self":
                        found.append(f"{node.lineno}: {ast.unparse(t)}")
    return found


def test_no_object_writes_another_objects_state_through_a_reference() -> None:
    found = [f"{path.relative_to(ROOT)}:{hit}" for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for hit in writes_through(path.read_text())]
    assert found == []


def test_the_check_finds_a_write_through_a_back_reference() -> None:
    source = (
        "class Growth:\n    def __init__(self, job): self.job = job\n"
        "    def poll(self):\n        self.job.alive = set()\n        self.job.moves += 1\n"
        "        self.rows[0] = 1\n        self.count = 2\n        self.job.device_joined(3)\n"
    )
    assert writes_through(source) == ["4: self.job.alive", "5: self.job.moves"]
