"""Cluster builders and validation; Plan validation and JSON round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.core.cluster import GBPS, Cluster, Device, flat, from_dict, heterogeneous_servers, two_level
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, Stage, interleave, straight_plan


def test_two_level_bandwidths() -> None:
    c = two_level(2, 4, 100, 10)
    assert c.size == 8 and len(c.nodes()) == 2
    assert c.link(0, 3) == 100 * GBPS and c.link(0, 4) == 10 * GBPS
    assert c.ring_bandwidth([0, 1, 4]) == 10 * GBPS


def test_missing_links_route_over_widest_path() -> None:
    bw = np.array([[0, 8, 0], [8, 0, 2], [0, 2, 0]], dtype=float) * GBPS
    c = Cluster(tuple(Device(i, f"n{i}") for i in range(3)), bw)
    assert c.link(0, 2) == 2 * GBPS


def test_disconnected_and_negative_rejected() -> None:
    devs = tuple(Device(i, f"n{i}") for i in range(3))
    with pytest.raises(UserError, match="not connected"):
        Cluster(devs, np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=float))
    with pytest.raises(UserError, match="non-negative"):
        Cluster(devs, np.array([[0, -1, 1], [1, 0, 1], [1, 1, 0]], dtype=float))
    with pytest.raises(UserError, match="positive"):
        flat(4, 0)


def test_cluster_json_round_trip_and_heterogeneous() -> None:
    c = heterogeneous_servers([2, 3], [100, 200], 30)
    again = from_dict(json.loads(json.dumps(c.to_dict())))
    assert np.array_equal(again.effective, c.effective)
    assert c.link(2, 4) == 200 * GBPS and c.link(0, 2) == 30 * GBPS
    assert from_dict({"servers": 2, "gpus_per_server": 2, "intra_gbps": 50, "inter_gbps": 5}).size == 4
    with pytest.raises(UserError, match="device 0: speed must be a number"):
        from_dict({"devices": [{"speed": "fast"}], "bandwidth_gbps": [[0]]})


def test_plan_validation_errors() -> None:
    with pytest.raises(UserError, match="contiguous"):
        Plan((Stage(0, 2, (0,)), Stage(3, 4, (1,))), 2)
    with pytest.raises(UserError, match="two stages"):
        Plan((Stage(0, 2, (0,)), Stage(2, 4, (0, 1))), 2)
    with pytest.raises(UserError, match="empty"):
        Stage(2, 2, (0,))
    with pytest.raises(UserError, match="interleaved schedule"):
        Plan((Stage(0, 1, (0,)), Stage(1, 2, (1,)), Stage(2, 3, (0,)), Stage(3, 4, (1,))), 2)


def test_plan_round_trip_and_interleave_view() -> None:
    base = straight_plan([0, 2, 4, 6, 8], 8, devices=[(0, 1), (2,), (3,), (4, 5)])
    inter = interleave(base, 2)
    assert inter.virtual_chunks == 2 and inter.num_physical_stages == 4 and len(inter.stages) == 8
    assert inter.stages_of_device(0) == [0, 4]
    for plan in (base, inter, Plan(base.stages, 8, sliced_microbatches=3)):
        assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert ScheduleKind.parse("PTD-P") is ScheduleKind.INTERLEAVED
