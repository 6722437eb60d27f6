"""User-code mistakes are reported once, by name, at start where possible and never retried.

Unit tests call :func:`actors.user_code.validate_job` directly (no Ray); one Ray test shows a
``data_fn`` that fails mid-training surfaces as one :class:`UserCodeError` with no restarts even
with ``max_failures=3``.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from actors import user_code
from actors.user_code import UserCodeError, validate_job
from orchestrator.core.errors import UserError
from orchestrator.profiling.models import example_batch, loss_fn, mlp
from orchestrator.core.plan import straight_plan

WIDTHS = (4, 8, 8, 2)
MODEL = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 6, widths=WIDTHS)
LOSS = loss_fn("mlp")
SGD = partial(torch.optim.SGD, lr=0.1)


def raising_data(step: int) -> tuple[Tensor, Tensor]:
    raise RuntimeError(f"no shard for step {step}")


def late_raising_data(step: int) -> tuple[Tensor, Tensor]:
    if step >= 1:
        raise RuntimeError(f"shard {step} missing on disk")
    return DATA(step)


def random_data(step: int) -> tuple[Tensor, Tensor]:
    return torch.randn(6, 4), torch.randn(6, 2)


def vector_loss(out: Tensor, target: Tensor) -> Tensor:
    return (out - target).pow(2).mean(dim=1)


def broken_chain() -> list[nn.Module]:
    return [nn.Linear(4, 8), nn.Linear(7, 2)]


def good_args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"model_factory": MODEL, "loss_fn": LOSS, "optimizer_factory": SGD, "data_fn": DATA, "num_microbatches": 3}
    args.update(over)
    return args


def test_valid_job_passes_and_returns_rows() -> None:
    assert validate_job(**good_args()) == 6


def test_validation_leaves_the_driver_rng_alone() -> None:
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    validate_job(**good_args())
    assert torch.equal(torch.rand(3), want)


@pytest.mark.parametrize(
    ("over", "pattern"),
    [
        ({"data_fn": raising_data}, r"data_fn\(0\) \(.*raising_data\) raised RuntimeError: no shard for step 0"),
        ({"data_fn": random_data}, r"random_data\) is not deterministic"),
        ({"data_fn": lambda step: [1, 2]}, r"must return \(inputs, targets\) tensors"),
        ({"data_fn": lambda step: (torch.zeros(6, 4), torch.zeros(5, 2))}, r"6 input rows but 5 target rows"),
        ({"num_microbatches": 0}, r"num_microbatches=0 must be between 1 and the 6 rows"),
        ({"num_microbatches": 7}, r"num_microbatches=7 must be between 1 and the 6 rows"),
        ({"num_microbatches": True}, r"num_microbatches must be an integer"),
        ({"loss_fn": vector_loss}, r"loss_fn \(.*vector_loss\) must return a scalar tensor, got \(2,\)"),
        ({"model_factory": broken_chain}, r"block 1 \(Linear\) raised RuntimeError: mat1 and mat2 .* on a \(2, 8\) input"),
        ({"model_factory": lambda: []}, r"model factory .* returned no blocks"),
        ({"model_factory": lambda: [nn.Linear(4, 2), "relu"]}, r"returned str as block 1"),
        ({"optimizer_factory": partial(torch.optim.SGD, lr=-1.0)}, r"optimizer factory \(block 0\) \(torch.optim.sgd:SGD\) raised ValueError: Invalid learning rate"),
        ({"optimizer_factory": lambda p: "adam"}, r"returned str, not a torch.optim.Optimizer"),
    ],
)
def test_user_mistakes_are_one_line_naming_the_function(over: dict[str, Any], pattern: str) -> None:
    with pytest.raises(UserError, match=pattern) as info:
        validate_job(**good_args(**over))
    assert "\n" not in str(info.value)


def test_vector_loss_on_many_rows_is_refused() -> None:
    # One probe row makes a per-row loss look scalar; the runtime check sees the real shape.
    with pytest.raises(UserCodeError, match=r"must return a scalar tensor, got \(3,\)"):
        user_code.loss(vector_loss, torch.zeros(3, 2), torch.ones(3, 2))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_checkpoint_dir_is_found_before_training(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(UserError, match=r"checkpoint_dir .*locked/ckpt is not writable"):
            validate_job(**good_args(checkpoint_dir=locked / "ckpt"))
    finally:
        locked.chmod(0o700)


def test_checkpoint_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"is not writable"):
        validate_job(**good_args(checkpoint_dir=tmp_path / "f"))


def test_trainer_refuses_before_any_actor_starts() -> None:
    from orchestrator.train.trainer import PipelineTrainer

    plan = straight_plan([0, 1, 3], 3)
    with pytest.raises(UserCodeError, match=r"raising_data"):
        PipelineTrainer(MODEL, LOSS, SGD, raising_data, 3, plan=plan)


def reshaped_data(step: int) -> tuple[Tensor, Tensor]:
    inputs, targets = DATA(step)
    return (inputs if step == 0 else torch.cat([inputs, inputs], dim=1)), targets


@pytest.mark.parametrize(
    "data_fn, loss, validate, pattern",
    [
        (late_raising_data, LOSS, True, r"data_fn\(1\) \(.*late_raising_data\) raised RuntimeError: shard 1 missing on disk"),
        (reshaped_data, LOSS, True, r"data_fn\(1\) \(.*reshaped_data\) returned rows of shape \(8,\)"),
        (DATA, vector_loss, False, r"loss_fn \(.*vector_loss\) must return a scalar tensor, got \(2,\)"),
    ],
)
def test_user_error_mid_training_is_reported_once_without_restarts(
    worker_group: Any, data_fn: Any, loss: Any, validate: bool, pattern: str
) -> None:
    import ray

    from orchestrator.train.trainer import PipelineTrainer

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    plan = straight_plan([0, 1, 3], 3)
    trainer = PipelineTrainer(MODEL, loss, SGD, data_fn, 3, plan=plan, workers=worker_group, max_failures=3, validate=validate)
    with pytest.raises(UserCodeError, match=pattern):
        trainer.fit(3)
    assert trainer.failures == 0  # not retried: max_failures=3 would have cost three group restarts


def test_a_user_error_is_reported_before_the_peer_errors_it_caused(ray_session: Any) -> None:
    # Why: the failing stage aborts its communicators, so its peers fail too; when the driver gathers late, all are
    # ready and the peers (listed first) would be seen first. The user's mistake must still be what is reported.
    from actors import group_calls

    @ray_session.remote(num_cpus=0.01)
    def peer() -> None:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:11660")  # gloo's words (measured)

    @ray_session.remote(num_cpus=0.01)
    def last_stage() -> None:
        import time

        time.sleep(0.5)  # seen after its peers' errors (the outcome below does not rest on it: any order must pass)
        raise UserCodeError("loss_fn (vector_loss) must return a scalar tensor, got (2,)")

    refs = [peer.remote(), peer.remote(), last_stage.remote()]
    ray_session.wait(refs[:2], num_returns=2, timeout=60)
    got = group_calls.collect(refs, [0, 1, 2], timeout_s=60)
    assert got.died is None and got.pending == ()
    dev, err = got.failure or (None, None)
    assert dev == 2 and isinstance(err, UserCodeError), got.failure


def test_only_a_broken_link_gives_way_to_a_user_error() -> None:
    from actors.group_calls import follows_a_peer
    from actors.transport import CommunicatorsAborted

    assert follows_a_peer(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:11660"))
    assert follows_a_peer(CommunicatorsAborted("device 0: communicators aborted after a failed iteration"))
    assert not follows_a_peer(RuntimeError("CUDA error: an illegal memory access was encountered"))  # its own failure
    assert not follows_a_peer(MemoryError())
