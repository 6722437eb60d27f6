"""The choices of a recovery in place, without Ray: which step to resume, where each block comes from, and the
host copies a worker keeps (two generations, buffers reused, checkpoint copies never written into)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from actors.host_copies import HostCopies
from actors.snapshot import to_wire
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


def test_host_copies_keep_two_generations_and_reuse_the_oldest_buffers() -> None:
    torch.manual_seed(0)
    block = nn.Linear(4, 4)
    opt = torch.optim.SGD(block.parameters(), lr=0.1, momentum=0.9)
    block(torch.ones(2, 4)).sum().backward()
    opt.step()
    copies = HostCopies()

    def take(step: int) -> Any:  # a snapshot is copied in the background; settled, it joins the inventory
        copies.take(step, {0: block}, {0: opt})
        copies.settle()
        return copies.get(step, 0)

    first = take(1)
    take(2)
    with torch.no_grad():
        block.weight.add_(1.0)
    third = take(3)
    assert copies.inventory() == {2: [0], 3: [0]}
    assert third["model"]["weight"] is first["model"]["weight"]  # step 1's buffer, overwritten for step 3
    assert torch.equal(third["model"]["weight"], block.weight.detach())
    assert not torch.equal(copies.get(2, 0)["model"]["weight"], block.weight.detach())  # step 2 kept as it was
    assert copies.nbytes() == 2 * (16 + 4 + 16 + 4) * 4  # weights and momentum, two generations
    copies.drop_after(2)
    assert copies.inventory() == {2: [0]}


def test_a_checkpoint_copy_is_never_written_into_and_is_forgotten_before_its_buffers_are_reused() -> None:
    block = nn.Linear(2, 2)
    copies = HostCopies()
    staged = {0: {"block": 0, "model": {k: v.clone() for k, v in block.state_dict().items()}, "optimizer": None}}
    copies.keep_checkpoint(4, staged)
    copies.take(5, {0: block}, {})
    copies.take(6, {0: block}, {})  # evicts step 4, whose buffers are the checkpoint's: not reused
    copies.settle()
    assert copies.get(6, 0)["model"]["weight"] is not staged[0]["model"]["weight"]
    copies.keep_checkpoint(8, staged)
    copies.forget(staged)
    assert 8 not in copies.inventory()
    copies.keep_peer(9, {1: to_wire(staged[0])})  # as a neighbour sends it
    kept = copies.get(9, 1)["model"]["weight"]
    assert kept is not staged[0]["model"]["weight"] and torch.equal(kept, staged[0]["model"]["weight"])  # copied here
