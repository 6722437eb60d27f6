"""Any nn.Module as pipeline blocks: nn.Sequential children, or a module cut at split points by
module path, with several tensors (tuples, dicts) crossing a boundary in both directions."""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from actors import seeding
from actors.materialize import empty_init, materialize
from actors.reference import ReferenceTrainer, allclose, max_difference
from orchestrator.core.errors import UserError
from orchestrator.profiling.export import user_state_dict
from orchestrator.profiling.modules import Packed, sequential_blocks, split_at
from orchestrator.core.plan import straight_plan
from orchestrator.profiling.profiler import profile_blocks
from orchestrator.train.trainer import PipelineTrainer


class Gated(nn.Module):
    """Takes and returns (hidden, gate): two tensors cross every boundary after it."""

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(p)  # seeded per (step, unit, block): pipelined == single-process

    def forward(self, h: Tensor, gate: Tensor) -> tuple[Tensor, Tensor]:
        return self.drop(torch.tanh(self.lin(h))) * gate, gate * 0.5 + 0.25


class Net(nn.Module):
    """A gate computed from a parameter (its gradient must cross back over boundaries), a skip
    connection from the input to the head, and a dict inside."""

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.inp, self.gate = nn.Linear(6, 6), nn.Linear(6, 6)
        self.layers = nn.ModuleList([Gated(p) for _ in range(4)])
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        state = {"h": self.inp(x), "g": torch.sigmoid(self.gate(x))}
        for layer in self.layers:
            state["h"], state["g"] = layer(state["h"], state["g"])
        return self.head(state["h"] + x)


def net_blocks(points: tuple[str, ...] = ("layers.1", "layers.3", "head"), meta: bool = False, p: float = 0.2) -> list[nn.Module]:
    torch.manual_seed(0)
    if meta:
        with empty_init():
            model = Net(p)
    else:
        model = Net(p)
    return split_at(model, list(points), torch.zeros(2, 6))


def data(step: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)


SGD = partial(torch.optim.SGD, lr=0.1)


def test_split_points_equal_the_whole_model() -> None:
    blocks = net_blocks()
    assert len(blocks) == 4 and isinstance(blocks[1], Packed)
    torch.manual_seed(0)
    whole = Net().eval()  # dropout off: the whole model draws from one stream, the blocks per block
    x = data(0)[0]
    y = x
    for b in blocks:
        y = b.eval()(y)
    assert torch.equal(y, whole(x))
    y.square().sum().backward()
    whole(x).square().sum().backward()
    got = {n: p.grad for n, p in blocks[0].named_parameters()}
    torch.testing.assert_close(got["inner.sub.gate.weight"], whole.gate.weight.grad, rtol=1e-6, atol=1e-7)  # back over 3 packed boundaries


def test_profile_counts_every_tensor_crossing() -> None:
    profile = profile_blocks(net_blocks(), data(0)[0], "net", 8, warmup=0, repeats=1, device="cpu")
    # after block 0: the input (skip connection), hidden and gate: 3 x 6 floats per row
    assert profile.blocks[0].activation_bytes == 8 * 18 * 4
    assert profile.blocks[-1].activation_bytes == 8 * 3 * 4


def test_dropout_in_split_blocks_is_seeded_per_unit() -> None:
    from actors import seeding

    blocks = net_blocks()
    x = data(0)[0]

    def run(step: int, unit: tuple[int, int]) -> Tensor:
        seeding.enter_unit(0, step, unit)
        try:
            y = x
            for b in blocks:
                y = b(y)
            return y
        finally:
            seeding.leave_unit()

    assert torch.equal(run(1, (0, 0)), run(1, (0, 0)))
    assert not torch.equal(run(1, (0, 0)), run(1, (1, 0)))


def test_sequential_children_are_blocks() -> None:
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert [type(b) for b in sequential_blocks(seq)] == [nn.Linear, nn.ReLU, nn.Linear]
    with pytest.raises(UserError, match="needs an nn.Sequential, got Linear"):
        sequential_blocks(nn.Linear(2, 2))  # type: ignore[arg-type]


class Pair(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x, x * 2


class Sum(nn.Module):
    def forward(self, pair: tuple[Tensor, Tensor]) -> Tensor:
        return pair[0] + pair[1]


def test_sequential_tuple_boundaries_are_packed() -> None:
    blocks = sequential_blocks(nn.Sequential(nn.Linear(4, 4), Pair(), Sum()), torch.zeros(2, 4))
    assert isinstance(blocks[1], Packed) and isinstance(blocks[2], Packed)
    x = torch.randn(3, 4)
    assert torch.equal(blocks[2](blocks[1](blocks[0](x))), 3 * blocks[0](x))


class Unbatched(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x, torch.ones(5)


class Named(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, str]:
        return x, "tag"


def test_bad_split_input_is_one_line() -> None:
    with pytest.raises(UserError, match=r"split point 'layers\.9' names no submodule of Net"):
        split_at(Net(), ["layers.9"], torch.zeros(2, 6))
    with pytest.raises(UserError, match=r"did you mean layers\.1"):
        split_at(Net(), ["1"], torch.zeros(2, 6))
    with pytest.raises(UserError, match="give split points in execution order"):
        split_at(Net(), ["layers.3", "layers.1"], torch.zeros(2, 6))
    with pytest.raises(UserError, match=r"output of block 0 \(Unbatched\).*shape \(5,\) cannot cross"):
        sequential_blocks(nn.Sequential(Unbatched(), Sum()), torch.zeros(2, 4))
    with pytest.raises(UserError, match="a value of type str cannot cross a stage boundary"):
        sequential_blocks(nn.Sequential(Named(), nn.Identity()), torch.zeros(2, 4))


def test_meta_built_module_materializes_like_a_real_build() -> None:
    """Built on the meta device, materialized per block: the weights are a function of the seed
    and each submodule's path only (the reference trainer materializes as a stage worker does)."""
    a = ReferenceTrainer(partial(net_blocks, meta=True), nn.functional.mse_loss, SGD, data, 2, seed=5)
    assert all(not p.is_meta for b in a.blocks for p in b.parameters())
    b = ReferenceTrainer(partial(net_blocks, meta=True), nn.functional.mse_loss, SGD, data, 2, seed=5)
    assert allclose(a.state_dicts(), b.state_dicts(), rtol=0, atol=0)
    c = ReferenceTrainer(partial(net_blocks, meta=True), nn.functional.mse_loss, SGD, data, 2, seed=6)
    assert not allclose(a.state_dicts(), c.state_dicts())  # the seed matters


@pytest.mark.ray
@pytest.mark.parametrize("meta", [False, True], ids=["real", "meta"])
def test_multi_tensor_boundaries_train_exactly(worker_group: Any, ray_session: Any, meta: bool) -> None:
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    factory = partial(net_blocks, meta=meta)
    plan = straight_plan([0, 1, 2, 3, 4], 4)
    trainer = PipelineTrainer(factory, nn.functional.mse_loss, SGD, data, 4, plan=plan, workers=worker_group, seed=2)
    trainer.fit(2)
    reference = ReferenceTrainer.for_plan(plan, factory, nn.functional.mse_loss, SGD, data, seed=2)
    reference.train(2)
    got, want = trainer.state_dicts(), reference.state_dicts()
    assert allclose(got, want), max_difference(got, want)


def weights_of(blocks: list[nn.Module]) -> dict[int, dict[str, Tensor]]:
    return {b: m.state_dict() for b, m in enumerate(blocks)}


def test_split_blocks_give_back_the_models_names() -> None:
    """The runtime's block-keyed weights come back under ``model.state_dict()``'s keys, in order
    (the old names were the cut's, e.g. ``inner.sub.layers_1_lin.weight``)."""
    torch.manual_seed(0)
    model = Net()
    blocks = split_at(model, ["layers.1", "layers.3", "head"], torch.zeros(2, 6))
    named = user_state_dict(blocks, weights_of(blocks))
    assert list(named) == list(model.state_dict())
    assert all(torch.equal(named[k], v) for k, v in model.state_dict().items())
    fresh = Net()
    fresh.load_state_dict(named, strict=True)


def test_sequential_names_buffers_and_unseeded_dropout() -> None:
    """Module paths (``"3.running_mean"`` included) and dropout seeded per unit without a sample."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.BatchNorm1d(8), nn.Linear(8, 2))
    blocks = sequential_blocks(model)
    assert list(user_state_dict(blocks, weights_of(blocks))) == list(model.state_dict())
    x = torch.randn(16, 8)

    def drop(step: int, unit: tuple[int, int]) -> Tensor:
        with seeding.unit((0, step, unit)):
            return blocks[2](x)

    assert torch.equal(drop(1, (0, 0)), drop(1, (0, 0)))
    assert not torch.equal(drop(1, (0, 0)), drop(1, (1, 0)))


class Noisy(nn.Module):
    """Randomness that is no nn.Dropout: a draw in the forward."""

    def forward(self, x: Tensor) -> Tensor:
        return x + torch.rand_like(x)


def test_any_block_list_gets_its_randomness_seeded() -> None:
    """A factory's own list (no helper): materialize seeds every block's draws by (step, unit,
    block), so a stage and the reference draw the same; blocks are named as nn.Sequential(*blocks)."""
    blocks = [materialize(b, "cpu", 0, f"block{i}") for i, b in enumerate([nn.Linear(4, 8), nn.Dropout(0.5), Noisy()])]
    x = torch.randn(16, 4)

    def run(step: int) -> Tensor:
        with seeding.unit((0, step, (0, 0))):
            return blocks[2](blocks[1](blocks[0](x)))

    first = run(3)
    torch.rand(5)  # whatever else the process draws in between
    assert torch.equal(run(3), first)
    assert not torch.equal(run(4), first)
    assert list(user_state_dict(blocks, weights_of(blocks))) == ["0.weight", "0.bias"]


def test_weights_that_do_not_fit_are_one_line() -> None:
    blocks = net_blocks()
    weights = weights_of(blocks)
    del weights[2][next(iter(weights[2]))]
    with pytest.raises(UserError, match=r"the weights hold no .* for block 2 \(the model's 'layers\.3\.lin\.weight'\)"):
        user_state_dict(blocks, weights)


def one_process(model: nn.Module, steps: int, microbatches: int) -> None:
    """The user's whole model trained in one process with gradient accumulation (no blocks)."""
    from actors.transport import unit_range

    opt = SGD(model.parameters())
    for step in range(steps):
        x, t = data(step)
        for mb in range(microbatches):
            lo, hi = unit_range(8, microbatches, mb, 0)
            (nn.functional.mse_loss(model(x[lo:hi]), t[lo:hi]) * ((hi - lo) / 8)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.ray
def test_elastic_job_returns_the_users_state_dict(worker_group: Any, ray_session: Any, tmp_path: Any) -> None:
    """The contract: a split_at model trained by ElasticJob returns ``model.state_dict()``'s keys,
    each value within 1e-5 of the same model trained in one process."""
    from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig

    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    factory = partial(net_blocks, p=0.0)  # dropout off: the whole model in one process draws from one stream
    plan = straight_plan([0, 1, 2, 3, 4], 4)
    train = TrainConfig(model_factory=factory, loss_fn=nn.functional.mse_loss, optimizer_factory=SGD, data_fn=data,
                        num_microbatches=4, seed=2)
    with ElasticJob(train, ScalingConfig(devices=4, plan=plan), RunConfig(storage=tmp_path / "ckpt", checkpoint_every=0),
                    AdaptConfig(enabled=False), SpotConfig(enabled=False), workers=worker_group) as job:
        job.fit(3)
        got = job.state_dict()
        assert job.checkpoint_now("final") is not None
    torch.manual_seed(0)
    model = Net(0.0)
    one_process(model, 3, 4)
    want = model.state_dict()
    assert list(got) == list(want)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5
    # the stored checkpoint, exported on the command line with the model's factory
    from safetensors.torch import load_file

    from orchestrator.cli.commands import main

    assert main(["checkpoint", "export", str(tmp_path / "ckpt"), "--to", str(tmp_path / "out"),
                 "--factory", f"{__file__}:net_blocks"]) == 0
    stored = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(stored) == set(want)  # safetensors keeps keys sorted
    assert all(torch.equal(stored[k], got[k]) for k in want)
