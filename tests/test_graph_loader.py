"""graph.txt parsing: units, DAG linearization cut rules, malformed input, and the shared data."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from orchestrator.errors import UserError
from orchestrator.graph_loader import parse_graph_txt
from orchestrator.profile import load_profile

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "profiles"
IMG = 3 * 224 * 224 * 4


def node(nid: str, op: str, f: float = 1.0, b: float = 2.0, a: float | str = 100.0, p: float = 10.0) -> str:
    return (
        f"{nid} -- {op} -- forward_compute_time={f}, backward_compute_time={b}, "
        f"activation_size={a}, parameter_size={p}"
    )


def graph(nodes: list[str], edges: list[tuple[str, str]]) -> str:
    return "\n".join(nodes + [f"\t{s} -- {d}" for s, d in edges]) + "\n"


# ---------------------------------------------------------------- hand-written graphs
def test_chain_units_input_and_microbatch() -> None:
    text = graph(
        [node("n0", "Input", f=500.0, b=0.0, a=4 * IMG, p=0.0), node("n1", "Conv2d(3, 8)", f=2.0, b=4.0, a=64.0),
         node("n2", "ReLU", f=1.0, b=1.0, a=64.0, p=0.0), node("n3", "Linear(8, 2)", f=3.0, b=5.0, a="[8; 4]")],
        [("n0", "n1"), ("n1", "n2"), ("n2", "n3")],
    )
    prof = parse_graph_txt(text, name="tiny")
    assert prof.num_blocks == 3  # Input folds into the first real layer
    assert prof.microbatch_size == 4 and prof.input_bytes == 4 * IMG
    first, _, last = prof.blocks
    assert first.forward_s == pytest.approx(0.002) and first.backward_s == pytest.approx(0.004)
    assert first.stash_bytes == 4 * IMG + 64.0  # the image is saved for the conv's backward
    assert last.activation_bytes == 12.0  # list sizes are summed
    assert prof.total_compute_s == pytest.approx((2 + 4 + 1 + 1 + 3 + 5) / 1000)
    assert prof.total_param_bytes == 20.0


def test_lines_in_any_order_give_the_same_chain() -> None:
    nodes = [node(f"node{i}", f"L{i}", f=i + 1.0) for i in range(8)]
    edges = [(f"node{i}", f"node{i + 1}") for i in range(7)]
    reference = parse_graph_txt(graph(nodes, edges), name="t")
    rng = random.Random(0)
    rng.shuffle(nodes)
    rng.shuffle(edges)
    assert parse_graph_txt(graph(nodes, edges), name="t") == reference
    assert [b.name for b in reference.blocks] == [f"node{i}:L{i}" for i in range(8)]


def test_residual_block_is_only_cut_at_its_ends() -> None:
    text = graph(
        [node("a", "Conv"), node("b", "Conv"), node("c", "BN"), node("add", "Add", 0, 0, 300.0, 0), node("d", "ReLU", a=7.0)],
        [("a", "b"), ("b", "c"), ("c", "add"), ("a", "add"), ("add", "d")],
    )
    prof = parse_graph_txt(text, name="t")
    assert [b.name.split(":")[0] for b in prof.blocks] == ["a", "b", "d"]
    assert prof.blocks[1].activation_bytes == 300.0  # the Add's output is what crosses
    assert prof.blocks[1].stash_bytes == 100.0 + 100.0 + 300.0
    assert prof.blocks[1].param_bytes == 20.0


def test_branch_that_rejoins_only_at_the_end_cannot_be_cut_inside() -> None:
    names = ["p", "q", "a", "b", "c", "x", "y", "z"]
    edges = [("p", "q"), ("q", "a"), ("a", "b"), ("b", "c"), ("c", "z"), ("a", "x"), ("x", "y"), ("y", "z")]
    prof = parse_graph_txt(graph([node(n, n.upper()) for n in names], edges), name="t")
    assert prof.num_blocks == 4
    assert [b.name for b in prof.blocks[:3]] == ["p:P", "q:Q", "a:A"]
    assert prof.blocks[3].forward_s == pytest.approx(5 * 0.001)  # b, c, x, y, z together


def test_gradient_free_side_input_does_not_block_cuts_but_its_bytes_cross() -> None:
    nodes = [node("node1", "input_ids", b=0, a=8.0, p=0), node("node2", "mask", b=0, a=50.0, p=0),
             node("node3", "embeddings", f=2.0, b=0, a=100.0, p=1000.0), node("node4", "reshape", 0, 0, 100.0, 0)]
    nodes += [node(f"node{5 + i}", f"layer_{i}") for i in range(3)]
    edges = [("node1", "node2"), ("node1", "node3"), ("node3", "node4"), ("node4", "node5"), ("node5", "node6"),
             ("node6", "node7")] + [("node2", f"node{5 + i}") for i in range(3)]
    prof = parse_graph_txt(graph(nodes, edges), name="bert-ish")
    # input_ids and mask fold into the embedding block, the zero-cost reshape into layer_0.
    assert [b.name for b in prof.blocks] == ["node3:embeddings+2", "node5:layer_0+1", "node6:layer_1", "node7:layer_2"]
    assert [b.activation_bytes for b in prof.blocks] == [150.0, 150.0, 150.0, 100.0]


def test_mask_with_gradient_upstream_does_block_cuts() -> None:
    nodes = [node("n1", "a"), node("n2", "ctx"), node("n3", "l0"), node("n4", "l1"), node("n5", "l2")]
    edges = [("n1", "n2"), ("n1", "n3"), ("n3", "n4"), ("n4", "n5"), ("n2", "n4"), ("n2", "n5")]
    # ctx needs a gradient back from every layer, so no single tensor separates the layers.
    assert [b.name for b in parse_graph_txt(graph(nodes, edges), name="t").blocks] == ["n1:a", "n2:ctx+3"]


def test_quirks_space_edges_stage_ids_and_pbs() -> None:
    text = (
        node("node1", "Input", 9.0, 0, 40.0, 0) + " -- stage_id=0\n"
        + node("node2", "layer") + " -- stage_id=1\n"
        + node("node3", "head") + "\n"
        + "  node1 -- node2\n \tnode2 -- node3\n"
    )
    prof = parse_graph_txt(text, name="x", source="dir/bert-24-pbs-6.txt")
    assert prof.microbatch_size == 6 and prof.num_blocks == 2 and prof.input_bytes == 40.0
    assert prof.blocks[0].forward_s == pytest.approx(0.001)  # Input's 9 ms of data loading dropped


def test_all_zero_graph_is_one_block() -> None:
    text = graph([node(str(i), f"t{i}", 0, 0, 0, 0) for i in range(4)], [("0", "1"), ("2", "3"), ("1", "3")])
    assert parse_graph_txt(text, name="t").num_blocks == 1


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (node("n1", "x", f="abc") + "\n", 1, "not a number"),  # type: ignore[arg-type]
        (node("n1", "x", a="[1; x]") + "\n", 1, "not a number"),
        (node("n1", "x", f=-1.0) + "\n", 1, ">= 0"),
        (node("n1", "x", f="nan") + "\n", 1, ">= 0"),  # type: ignore[arg-type]
        (node("n1", "x") + ", flops=3\n", 1, "unknown field"),
        ("n1 -- x -- forward_compute_time=1, backward_compute_time=1, activation_size=1\n", 1, "missing field"),
        (node("n1", "x") + "\n" + node("n1", "y") + "\n", 2, "defined twice"),
        (node("n1", "x") + "\n\tn1 -- n9\n", 2, "undefined node 'n9'"),
        (node("n1", "x") + "\n" + node("n2", "y") + "\n\tn1 -- n2\n\tn2 -- n1\n", 3, "cycle"),
        (node("n1", "x") + "\nwhat is this\n", 2, "expected"),
    ],
)
def test_malformed_input_names_file_and_line(text: str, line: int, problem: str) -> None:
    with pytest.raises(UserError, match=rf"^bad\.txt:{line}: .*{re.escape(problem)}"):
        parse_graph_txt(text, name="bad", source="bad.txt")


def test_empty_graph_is_an_error() -> None:
    with pytest.raises(UserError, match=r"^empty\.txt: no nodes"):
        parse_graph_txt("\n\n", name="e", source="empty.txt")


# ---------------------------------------------------------------- the shared third-party profiles
def shared_files() -> list[Path]:
    if not PROFILES.is_dir():
        return []
    return sorted(p for p in PROFILES.rglob("*.txt") if p.name != "LICENSE.txt")


def file_sums(text: str) -> tuple[float, float, int]:
    """(fwd+bwd ms excluding Input nodes, param bytes, nodes with backward work or params)."""
    compute = params = 0.0
    real = 0
    for line in text.splitlines():
        parts = line.strip().split(" -- ")
        if len(parts) < 3:
            continue
        stats = dict(kv.strip().split("=", 1) for kv in parts[2].split(","))
        f, b, p = (float(stats[k]) for k in ("forward_compute_time", "backward_compute_time", "parameter_size"))
        compute += b + (0.0 if re.fullmatch(r"Input\d*", parts[1]) else f)
        params += p
        real += b > 0 or p > 0
    return compute, params, real


@pytest.mark.parametrize("path", shared_files() or [None], ids=lambda p: str(p.relative_to(PROFILES)) if p else "absent")
def test_shared_profile_totals(path: Path | None) -> None:
    if path is None:
        pytest.skip("../shared/profiles not present")
    text = path.read_text()
    prof = load_profile(path)
    compute_ms, params, _ = file_sums(text)
    assert prof.num_blocks >= 1
    assert prof.total_compute_s == pytest.approx(compute_ms / 1000.0, rel=1e-9, abs=1e-12)
    assert prof.total_param_bytes == pytest.approx(params, rel=1e-9)


CHAINS = ["pipedream/profiler/image_classification/profiles/vgg16/graph.txt", "dapple/profiling_results/vgg16.txt",
          "pipedream/profiler/image_classification/profiles/alexnet/graph.txt",
          "dapple/profiling_results/vgg-19-pbs-32.txt", "dapple/profiling_results/bert-24-pbs-6.txt",
          "dapple/profiling_results/bert-48-pbs-2.txt", "dapple/profiling_results/xlnet-24-pbs-1.txt"]


@pytest.mark.parametrize("rel", CHAINS)
def test_chain_models_give_one_block_per_real_layer(rel: str) -> None:
    path = PROFILES / rel
    if not path.is_file():
        pytest.skip(f"{rel} not present")
    *_, real = file_sums(path.read_text())
    assert load_profile(path).num_blocks == real


def test_bert24_is_embedding_24_layers_and_pooler() -> None:
    path = PROFILES / "dapple/profiling_results/bert-24-pbs-6.txt"
    if not path.is_file():
        pytest.skip("bert-24 not present")
    prof = load_profile(path)
    ops = [b.name.split(":")[1].split("+")[0] for b in prof.blocks]
    assert ops == ["embeddings"] + [f"layer_{i}" for i in range(24)] + ["pooler"]
    assert prof.microbatch_size == 6
    # Between layers the hidden state crosses together with the attention mask.
    assert prof.blocks[3].activation_bytes == 12976128 + 3538944


def test_dag_models_keep_many_cut_points_and_parse_fast() -> None:
    resnet = PROFILES / "pipedream/profiler/image_classification/profiles/resnet50/graph.txt"
    nasnet = PROFILES / "pipedream/profiler/image_classification/profiles/nasnetalarge/graph.txt"
    if not (resnet.is_file() and nasnet.is_file()):
        pytest.skip("shared profiles not present")
    prof = load_profile(resnet)
    assert prof.num_blocks > 10 and prof.microbatch_size == 128
    text = nasnet.read_text()
    start = time.perf_counter()
    parse_graph_txt(text, name="nasnetalarge", source=str(nasnet))
    assert time.perf_counter() - start < 1.0
