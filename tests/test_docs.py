"""The docs a newcomer follows do not rot: the README stays a front page that links every guide, every relative
link resolves (anchors included), every ``orchestrator SUBCOMMAND`` a shell block shows exists, every import a
Python block shows resolves, and the commands marked ``# docs-check: exit N`` run in-process with that exit code."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
import shlex
from functools import lru_cache
from pathlib import Path

import pytest

from tests.fuzz_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200
MIN_GUIDES = 6
FIRST_PARTY = ("orchestrator", "actors", "cloud")

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CHECK = re.compile(r"^#\s*docs-check:\s*exit\s+(\d+)\s*$")
COMMAND = re.compile(r"(?:^|[\s;&|(`$])(?:\S*/)?orchestrator\s+([A-Za-z][\w-]*)(?:\s+([A-Za-z][\w-]*))?")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def fences(path: Path) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of ``path``."""
    return [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(path.read_text())]


def prose(path: Path) -> str:
    """``path`` without its fenced blocks (a link inside a code block is code, not a link)."""
    return FENCE.sub("", path.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(path), flags=re.M)}


@lru_cache(maxsize=1)
def parser() -> argparse.ArgumentParser:
    from orchestrator.cli.commands import build_parser

    return build_parser([])  # every command, the cloud ones included


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_readme_is_a_front_page_that_links_every_guide() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move reference material into docs/ (at most {MAX_README_LINES})"
    guides = sorted(DOCS.glob("*.md"))
    assert len(guides) >= MIN_GUIDES, f"docs/ holds {len(guides)} guides, expected at least {MIN_GUIDES}"
    linked = {(README.parent / target.split("#", 1)[0]).resolve() for target in LINK.findall(prose(README))
              if not re.match(r"[a-z][\w+.-]*:", target) and not target.startswith("#")}
    unlinked = [g.name for g in guides if g.resolve() not in linked]
    assert not unlinked, f"guides the README does not link: {unlinked}"
    for fence in ("make demo", "make test"):
        assert any(fence in body for lang, body in fences(README) if lang == "bash"), f"README: `{fence}` is one of the two commands"


def test_every_relative_link_points_to_an_existing_file_and_heading() -> None:
    broken = []
    for page in pages():
        for target in LINK.findall(prose(page)):
            if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto: ...
                continue
            file, _, anchor = target.partition("#")
            where = (page.parent / file).resolve() if file else page
            if not where.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor} in {where.name})")
    assert not broken, "\n".join(broken)


def test_every_orchestrator_command_in_a_shell_block_exists() -> None:
    commands = subcommands(parser())
    seen, wrong = 0, []
    for page in pages():
        for lang, body in fences(page):
            if lang not in ("bash", "console", "sh", "shell"):
                continue
            for line in body.splitlines():
                line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
                for m in COMMAND.finditer(line):
                    name, second = m.group(1), m.group(2)
                    seen += 1
                    if name not in commands:
                        wrong.append(f"{page.relative_to(ROOT)}: orchestrator {name}")
                        continue
                    nested = subcommands(commands[name])
                    if nested and second not in nested:
                        wrong.append(f"{page.relative_to(ROOT)}: orchestrator {name} {second} (one of {sorted(nested)})")
    assert seen >= 20, f"only {seen} orchestrator commands found in the docs' shell blocks: is the parser of this test broken?"
    assert not wrong, f"commands the CLI does not have: {wrong}"


def test_the_command_line_reference_names_every_subcommand() -> None:
    cli = (DOCS / "cli.md").read_text()
    missing = [name for name in subcommands(parser()) if f"orchestrator {name}" not in cli]
    assert not missing, f"docs/cli.md does not show: {missing}"


def top_level_names(origin: str) -> set[str]:
    """What a module defines or imports at its top level, read from its source (importing it may cost seconds:
    torch, Ray)."""
    names: set[str] = set()
    for node in ast.parse(Path(origin).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def resolves(module: str, name: str | None) -> bool:
    """``import module`` / ``from module import name`` would work: first-party modules are found and read, not
    imported (only a package's ``__init__``, light by design, is imported for its lazy ``__all__``); third-party
    ones are only found (importing transformers would cost seconds)."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None:
        return False
    if top not in FIRST_PARTY or name is None:
        return True
    if spec.origin and name in top_level_names(spec.origin):
        return True
    if not spec.submodule_search_locations:  # a plain module: what its source defines is all it has
        return False
    return importlib.util.find_spec(f"{module}.{name}") is not None or name in getattr(importlib.import_module(module), "__all__", ())


def test_every_import_in_the_docs_python_blocks_resolves() -> None:
    """What tests/test_public_api.py checks for the README's code, for the guides' code too."""
    wrong, blocks = [], 0
    for page in sorted(DOCS.glob("*.md")):
        for lang, body in fences(page):
            if lang != "python":
                continue
            blocks += 1
            for node in ast.walk(ast.parse(body, filename=str(page))):
                if isinstance(node, ast.Import):
                    wrong += [f"{page.name}: import {a.name}" for a in node.names if not resolves(a.name, None)]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    wrong += [f"{page.name}: from {node.module} import {a.name}" for a in node.names if not resolves(node.module, a.name)]
    assert blocks >= 5
    assert not wrong, wrong


def docs_checks() -> list[tuple[str, list[str], int]]:
    """(where, argv, exit code) of every command right below a ``# docs-check: exit N`` line of a shell block."""
    found = []
    for page in pages():
        for lang, body in fences(page):
            if lang not in ("bash", "console", "sh", "shell"):
                continue
            lines = body.splitlines()
            for i, line in enumerate(lines):
                m = CHECK.match(line.strip())
                if not m:
                    continue
                assert i + 1 < len(lines), f"{page.name}: '# docs-check' with no command below it"
                command, j = lines[i + 1].strip().removeprefix("$ "), i + 1
                while command.endswith("\\"):  # a continued line
                    j += 1
                    command = command[:-1] + " " + lines[j].strip()
                argv = shlex.split(command, comments=True)
                if argv[:3] == ["python", "-m", "orchestrator"] or argv[:3] == [".venv/bin/python", "-m", "orchestrator"]:
                    argv = argv[3:]
                elif argv and argv[0].split("/")[-1] == "orchestrator":
                    argv = argv[1:]
                else:
                    raise AssertionError(f"{page.name}: '# docs-check' above {command!r}, which is not an orchestrator command")
                found.append((f"{page.relative_to(ROOT)}: {command}", argv, int(m.group(1))))
    return found


CHECKS = docs_checks()


def test_the_docs_mark_commands_to_check() -> None:
    assert len(CHECKS) >= 5 and {code for _, _, code in CHECKS} >= {0, 2}


@pytest.mark.parametrize("where,argv,code", CHECKS, ids=[w for w, _, _ in CHECKS])
def test_a_command_the_docs_show_exits_as_they_say(where: str, argv: list[str], code: int) -> None:
    run = run_cli(argv, ROOT)
    assert run.code == code, f"{where}: exit {run.code}, the docs say {code}\n{run.err[-1000:]}"
    assert "Traceback" not in run.err, f"{where}: {run.err[-2000:]}"
    if code == 2:  # the error contract: one line on stderr
        lines = [line for line in run.err.splitlines() if line.strip()]
        assert len(lines) == 1, f"{where}: {len(lines)} lines on stderr: {run.err[-1000:]}"
