"""The spot-goodput replay on an excerpt of Parcae's traces (vendored, MIT): the job's policies, restarts, Parcae's
recorded shapes and the bound, all timed by the same simulator. The full table is ``benchmarks/spot_goodput.py``'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import spot_goodput as sg

EXCERPT = Path(__file__).parent / "data" / "parcae" / "gpt-1.5b" / "trace_hh_55_65.txt"


@pytest.fixture(scope="module")
def world() -> sg.World:
    return sg.load_world("gpt-1.5b", 32, sg.Costs())


def test_policies_on_a_parcae_excerpt(world: sg.World) -> None:
    trace = sg.parcae_trace(EXCERPT)
    assert trace.nodes == 32 and [len(m) for m in trace.minutes][7:] == [32, 29, 29, 26, 26, 25]
    got = {t.label: t for t, _ in sg.replay_all(world, trace)}
    assert set(got) == {"raypipe-notice", "raypipe", "restart", "parcae-liveput", "parcae-oracle-liveput",
                        "parcae-throughput", "oracle"}
    bound = got["oracle"].samples
    for name, tally in got.items():
        assert 0 < tally.samples <= bound * (1 + 1e-9), name
    # three removals: with two minutes' notice the job moves off the doomed nodes live and loses nothing; without,
    # it recovers in place back to its newest checkpoint (taken as often as pays); restarts lose what their
    # five-minute checkpoints missed and stand still for a restart each time
    assert got["raypipe-notice"].lost_samples == 0
    assert 0 < got["raypipe"].lost_samples < got["restart"].lost_samples
    assert got["restart"].stall_s > 3 * world.costs.restart_s > got["raypipe"].stall_s
    assert got["raypipe-notice"].samples > got["raypipe"].samples > got["restart"].samples


def test_availability_traces_with_gaps_and_bad_files(tmp_path: Path, world: sg.World, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "avail.json"
    good.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [32, 32, 0, 29, 32]}))
    trace = sg.availability_trace(good)
    assert [e.kind for e in trace.events] == ["add", "remove", "add", "add"]
    got = {t.label: t for t, _ in sg.replay_all(world, trace)}
    assert "parcae-liveput" not in got  # no recorded shapes in such a trace
    assert 2 not in got["oracle"].ran  # nothing runs while no node is up
    assert all(0 < t.samples <= got["oracle"].samples * (1 + 1e-9) for t in got.values())
    for bad, words in ((json.dumps({"metadata": {"gap_seconds": 60}, "data": [3, -1]}), "data[1] = -1"),
                       (json.dumps({"metadata": {}, "data": [3]}), "gap_seconds"),
                       ("not json", "not a readable JSON file")):
        path = tmp_path / "bad.json"
        path.write_text(bad)
        assert sg.main(["--availability", str(path), "--json"]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1
