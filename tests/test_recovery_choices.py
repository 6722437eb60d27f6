"""The choices of a recovery in place, without Ray: which step to resume, where each block comes from, which
neighbour keeps whose copy (the host copies themselves live in Ray's object store: tests/test_recovery_in_place.py)."""

from __future__ import annotations

import pytest

from orchestrator.core.plan import straight_plan
from orchestrator.train.recovery import STORAGE, block_sources, restorable_step, ring_neighbours, source_of

PLAN = straight_plan([0, 3, 6, 8], 4, devices=[[0], [2], [3]])  # device 1 died


def test_the_newest_step_every_block_of_which_is_somewhere_is_chosen() -> None:
    # step 5: device 1's blocks (2-3) were in nobody's copy (its neighbour died with it); step 4 is complete
    copies = {0: {4: [0, 1], 5: [0, 1]}, 2: {4: [2, 3, 4, 5], 5: [4, 5]}, 3: {4: [6, 7, 0, 1], 5: [6, 7, 0, 1]}}
    assert restorable_step(copies, 8, stored_step=2) == 4
    assert restorable_step(copies, 8, stored_step=6) == 6  # a newer committed checkpoint wins
    assert restorable_step({0: {3: [0]}}, 8, stored_step=None) is None  # nothing complete: the seed


def test_each_block_comes_from_its_own_device_then_a_peer_then_storage() -> None:
    copies = {0: {4: [0, 1, 2]}, 2: {4: [3, 4, 5]}, 3: {4: [6, 7]}}
    sources = block_sources(4, PLAN, copies, stored_step=None)
    assert sources == {0: {0: 0, 1: 0, 2: 0}, 2: {3: 2, 4: 2, 5: 2}, 3: {6: 3, 7: 3}}
    assert source_of(sources) == "snapshot"
    moved = block_sources(4, straight_plan([0, 2, 6, 8], 4, devices=[[0], [2], [3]]), copies, None)
    assert moved[2][2] == 0 and source_of(moved) == "peer"
    stored = block_sources(2, PLAN, {0: {2: [0, 1]}}, stored_step=2)
    assert stored[0] == {0: 0, 1: 0, 2: STORAGE} and source_of(stored) == "storage"
    with pytest.raises(ValueError, match="block 2 at step 4"):
        block_sources(4, PLAN, {0: {4: [0, 1]}}, stored_step=2)


def test_snapshots_go_round_a_ring() -> None:
    assert ring_neighbours([3, 0, 2]) == {0: 2, 2: 3, 3: 0}
    assert ring_neighbours([1]) == {}
    # a node takes all its devices: each copy goes to the next device on another node
    assert ring_neighbours([0, 1, 2, 3], {0: "a", 1: "b", 2: "b", 3: "c"}) == {0: 1, 1: 3, 2: 3, 3: 0}
