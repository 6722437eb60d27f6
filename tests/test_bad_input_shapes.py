"""Property tests per loader on malformed-but-parseable shapes (issue 29, item 1).

Unparseable bytes are the easy part (``tests/test_fuzz_cli.py``); the shapes that broke loaders
were valid JSON of the wrong structure: a list where a record belongs, a record without its fields,
a number where a list belongs, deep nesting, a key twice, a misspelt field. Each test starts from a
file the project itself writes, applies one structural mutation at a random place, and checks:

- the loader returns a value or raises :class:`UserError` with one line — never another exception;
- a key added that the format does not define is refused, naming it ("unknown field");
- a key given twice in one object is refused ("appears twice");
- a format ``version`` nobody wrote is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors import checkpoint as ckpt
from orchestrator.core import cluster as cl
from orchestrator.core.errors import UserError
from orchestrator.core.files import parse_json
from orchestrator.core.plan import Plan, straight_plan
from orchestrator.core.profile import Block, Profile

SHAPES = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2.5, -1.0, 1e308, 0.0]), st.text(max_size=5),
                 st.just([]), st.just({}), st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _profile() -> dict[str, Any]:
    return Profile("m", tuple(Block(f"b{i}", 0.001, 0.002, 1e6, 2e6) for i in range(4)), 2, 1e5).to_dict()


def _plan() -> dict[str, Any]:
    return {**straight_plan([0, 2, 4], 4).to_dict(), "cluster": cl.flat(2, 10.0).to_dict()}


def _cluster() -> dict[str, Any]:
    return cl.flat(3, 10.0).to_dict()


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value (keys of objects, indices of lists), the root included."""
    out = [here]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, here + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            out += _paths(v, here + (i,))
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    _get(value, path[:-1])[path[-1]] = new
    return value


MUTATIONS = ["junk", "delete", "unknown", "wrap_list", "wrap_object", "deep", "duplicate", "version"]


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> tuple[str, str, str]:
    """(mutation, JSON text, where): ``base`` with one structural change at a drawn place."""
    value = json.loads(json.dumps(base))
    kind = draw(st.sampled_from(MUTATIONS))
    objects = [p for p in _paths(value) if isinstance(_get(value, p), dict)]
    if kind in ("unknown", "duplicate", "version", "delete"):
        path = draw(st.sampled_from(objects))
        target = _get(value, path)
        if kind == "unknown":
            name = draw(st.sampled_from(["devcies", "extra", "blokcs", "speeed", "x"]))
            if name in target:
                name += "_"
            target[name] = draw(JUNK)
        elif kind == "delete" and target:
            del target[draw(st.sampled_from(sorted(target)))]
        elif kind == "version":
            target = value  # the file's own version
            target["version"] = draw(st.sampled_from([0, 2, 99, "1", 1.5, None]))
        elif kind == "duplicate" and target:
            key = draw(st.sampled_from(sorted(target)))
            marker = "__dup_marker__"
            target[marker] = target[key]
            text = json.dumps(value).replace(json.dumps(marker), json.dumps(key))
            return kind, text, "/".join(map(str, path + (key,)))
        return kind, json.dumps(value), "/".join(map(str, path))
    path = draw(st.sampled_from(_paths(value)))
    old = _get(value, path)
    if kind == "deep":  # written as text: json.dumps itself would recurse too deeply
        depth = draw(st.sampled_from([50, 3000]))
        nested = "[" * depth + json.dumps(old) + "]" * depth
        marker = "__deep_marker__"
        return kind, json.dumps(_set(value, path, marker)).replace(json.dumps(marker), nested), "/".join(map(str, path))
    new = {"junk": lambda: draw(JUNK), "wrap_list": lambda: [old], "wrap_object": lambda: {"value": old}}[kind]()
    return kind, json.dumps(_set(value, path, new)), "/".join(map(str, path))


def check(load: Any, case: tuple[str, str, str]) -> None:
    kind, text, where = case
    try:
        load(parse_json(text, "x.json", "file"))
    except UserError as exc:
        message = str(exc)
        assert "\n" not in message
        if kind == "duplicate":
            assert "appears twice" in message, (where, message)
        return
    except Exception as exc:  # noqa: BLE001 - the property: nothing but a UserError escapes
        raise AssertionError(f"{kind} at {where}: {type(exc).__name__}: {exc}") from exc
    assert kind not in ("unknown", "duplicate"), f"{kind} at {where} was accepted: {text[:300]}"
    if kind == "version":
        assert json.loads(text).get("version", 1) == 1, f"version {json.loads(text).get('version')!r} accepted"


@SHAPES
@given(case=mutated(_profile()))
def test_profile_loader_on_malformed_shapes(case: tuple[str, str, str]) -> None:
    check(lambda d: Profile.from_dict(d), case)


@SHAPES
@given(case=mutated(_plan()))
def test_plan_loader_on_malformed_shapes(case: tuple[str, str, str]) -> None:
    def load(d: Any) -> None:
        Plan.from_dict(d)
        if isinstance(d, dict) and isinstance(d.get("cluster"), dict):
            cl.from_dict(d["cluster"])

    check(load, case)


@SHAPES
@given(case=mutated(_cluster()))
def test_cluster_loader_on_malformed_shapes(case: tuple[str, str, str]) -> None:
    check(cl.from_dict, case)


@pytest.fixture(scope="module")
def one_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    directory = ckpt.step_dir(str(root), 3)
    entries = [ckpt.write_block(directory, b, torch.nn.Linear(2, 2), None, step=3, run_id="r") for b in range(2)]
    ckpt.write_manifest(directory, 3, 2, entries, {"stages": []}, {"losses": {"1": 0.5}})
    return Path(directory)


@settings(SHAPES, max_examples=100)
@given(data=st.data())
def test_checkpoint_manifest_on_malformed_shapes_resigned(one_checkpoint: Path, data: st.DataObject) -> None:
    """The forger's view: any shape of manifest, with a commit marker re-written to match it. ``verify`` answers
    with the manifest or one CheckpointError line; a manifest that verifies still names only its own blocks."""
    base = json.loads((one_checkpoint / ckpt.MANIFEST).read_bytes())
    kind, text, where = data.draw(mutated(base))
    if kind == "duplicate":
        return  # manifests are parsed by json.loads as written by us; duplicates are the files' concern above
    target = one_checkpoint.parent / f"step_{3:08d}"
    manifest_at, marker_at = target / ckpt.MANIFEST, target / ckpt.COMMIT
    original = manifest_at.read_bytes(), marker_at.read_bytes()
    raw = text.encode()
    try:
        manifest_at.write_bytes(raw)
        marker_at.write_bytes(json.dumps({"format": ckpt.FORMAT, "version": ckpt.VERSION, "step": 3,
                                          "manifest_sha256": hashlib.sha256(raw).hexdigest(), "manifest_bytes": len(raw)}).encode())
        try:
            got = ckpt.verify(str(target))
        except UserError as exc:
            assert "\n" not in str(exc)
        else:
            assert got["step"] == 3 and sorted(e["block"] for e in got["files"]) == list(range(got["num_blocks"]))
    finally:
        manifest_at.write_bytes(original[0])
        marker_at.write_bytes(original[1])
