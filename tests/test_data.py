"""orchestrator.data: token-file and dataset data functions (no Ray).

A ``data_fn`` must be deterministic in ``step`` (the first and last stages call it separately and a
resumed run must see the same batches), picklable without its memory map, and every bad input is one
line on the driver before any worker starts.
"""

from __future__ import annotations

import os
import pickle
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from orchestrator.core.errors import UserError
from orchestrator.data import MAX_BATCH_TOKENS, DatasetBatches, TokenFile, from_dataset


def _raw(path: Path, tokens: Any, dtype: str = "<u2") -> Path:
    np.asarray(tokens).astype(dtype).tofile(path)
    return path


def _one_line_error(fn: Callable[[], Any], *words: str) -> str:
    with pytest.raises(UserError) as info:
        fn()
    text = str(info.value)
    assert "\n" not in text and text, text
    for word in words:
        assert word in text, text
    return text


@pytest.fixture
def arange_file(tmp_path: Path) -> Path:
    return _raw(tmp_path / "train.bin", np.arange(1000))


# ----------------------------------------------------------------------------------------------- TokenFile

def test_windows_are_next_token_pairs_inside_the_file(arange_file: Path) -> None:
    data = TokenFile(arange_file, seq_len=8, rows=16)
    assert data.tokens == 1000
    for step in range(20):
        inputs, targets = data(step)
        assert inputs.shape == targets.shape == (16, 8)
        assert inputs.dtype == targets.dtype == torch.int64
        assert inputs.is_contiguous() and targets.is_contiguous()
        # the file is 0..999, so each row is its start + 0..7 and the targets are the next tokens
        starts = data.starts(step)
        assert torch.equal(inputs, torch.from_numpy(starts)[:, None] + torch.arange(8))
        assert torch.equal(targets, inputs + 1)
        assert starts.min() >= 0 and starts.max() + 8 <= 999  # the window of 9 tokens fits


def test_a_file_of_exactly_one_window_always_gives_that_window(tmp_path: Path) -> None:
    data = TokenFile(_raw(tmp_path / "t.bin", [5, 6, 7, 8]), seq_len=3, rows=4)
    inputs, targets = data(7)
    assert inputs.tolist() == [[5, 6, 7]] * 4 and targets.tolist() == [[6, 7, 8]] * 4


def test_batches_depend_on_seed_and_step_only(arange_file: Path) -> None:
    data = TokenFile(arange_file, seq_len=8, rows=16, seed=3)
    first = data(5)
    for other in (data, pickle.loads(pickle.dumps(data)), TokenFile(str(arange_file), seq_len=8, rows=16, seed=3)):
        again = other(5)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(data(5)[0], data(6)[0])
    assert not torch.equal(data(5)[0], TokenFile(arange_file, seq_len=8, rows=16, seed=4)(5)[0])
    assert data(np.int64(5))[0].equal(first[0])  # type: ignore[arg-type]  # a NumPy step is the same step


def test_the_draw_is_pinned_so_a_resumed_run_sees_the_same_batches(arange_file: Path) -> None:
    # PCG64's raw stream is stable across NumPy versions; a change here changes every run's batches
    assert TokenFile(arange_file, seq_len=8, rows=4).starts(0).tolist() == [831, 289, 216, 253]


def test_the_memory_map_is_not_pickled(arange_file: Path) -> None:
    data = TokenFile(arange_file, seq_len=8, rows=4)
    data(0)  # opened and cached in this process
    blob = pickle.dumps(data)
    assert len(blob) < 1000
    assert pickle.loads(blob) == data


@pytest.mark.parametrize("dtype,np_dtype", [("uint16", "<u2"), ("uint32", "<u4"), ("int32", "<i4"), ("int64", "<i8"), ("uint8", "u1")])
def test_raw_files_of_each_dtype(tmp_path: Path, dtype: str, np_dtype: str) -> None:
    ids = np.arange(200) % 250
    data = TokenFile(_raw(tmp_path / "t.bin", ids, np_dtype), seq_len=4, rows=3, dtype=dtype)
    assert data.tokens == 200
    inputs, targets = data(1)
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    assert torch.equal(inputs, torch.from_numpy(ids[data.starts(1)[:, None] + np.arange(4)]).long())


def test_numpy_dtype_objects_name_the_same_dtype(tmp_path: Path) -> None:
    path = _raw(tmp_path / "t.bin", np.arange(100), "<u4")
    assert TokenFile(path, seq_len=4, rows=2, dtype=np.uint32)(0)[0].equal(TokenFile(path, seq_len=4, rows=2, dtype="uint32")(0)[0])  # type: ignore[arg-type]


def test_npy_files_take_their_dtype_from_the_header(tmp_path: Path) -> None:
    ids = np.arange(70_000, 71_000, dtype=np.uint32)  # beyond uint16: read as uint16 it would be garbage
    np.save(tmp_path / "t.npy", ids)
    data = TokenFile(tmp_path / "t.npy", seq_len=6, rows=5)
    inputs, targets = data(2)
    assert int(inputs.min()) >= 70_000 and torch.equal(targets, inputs + 1)
    assert TokenFile(tmp_path / "t.npy", seq_len=6, rows=5, dtype="uint32")(2)[0].equal(inputs)
    _one_line_error(lambda: TokenFile(tmp_path / "t.npy", seq_len=6, rows=5, dtype="uint16"), "uint32", "leave dtype out")


def test_npy_big_endian_and_multidimensional_arrays_read_as_a_flat_stream(tmp_path: Path) -> None:
    np.save(tmp_path / "be.npy", np.arange(300, dtype=">i4"))
    np.save(tmp_path / "2d.npy", np.arange(300, dtype=np.uint16).reshape(30, 10))
    for name in ("be.npy", "2d.npy"):
        data = TokenFile(tmp_path / name, seq_len=12, rows=4)
        inputs, targets = data(0)
        assert data.tokens == 300
        assert torch.equal(inputs, torch.from_numpy(data.starts(0))[:, None] + torch.arange(12))
        assert torch.equal(targets, inputs + 1)


def test_a_npy_file_under_another_name_is_still_read_by_its_header(tmp_path: Path) -> None:
    with open(tmp_path / "t.bin", "wb") as f:
        np.save(f, np.arange(100, dtype=np.int32))
    data = TokenFile(tmp_path / "t.bin", seq_len=4, rows=2)
    assert data.tokens == 100 and torch.equal(data(0)[1], data(0)[0] + 1)


def _fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "fifo.bin"
    os.mkfifo(path)
    return path


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail, instead of blocking the suite, if something opens a FIFO for reading."""
    def hung(*_: Any) -> None:
        raise AssertionError("blocked: a FIFO was opened")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_bad_files_are_one_line_errors(tmp_path: Path, no_hang: None) -> None:
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    (tmp_path / "short.bin").write_bytes(np.arange(4, dtype="<u2").tobytes())
    (tmp_path / "fake.npy").write_bytes(np.arange(4, dtype="<u2").tobytes())
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': ...")
    np.save(tmp_path / "float.npy", np.zeros(100, dtype=np.float32))
    np.save(tmp_path / "u64.npy", np.zeros(100, dtype=np.uint64))
    np.save(tmp_path / "object.npy", np.array([1, "a"] * 50, dtype=object), allow_pickle=True)
    np.save(tmp_path / "cut.npy", np.arange(100, dtype=np.uint16))
    with open(tmp_path / "cut.npy", "r+b") as f:
        f.truncate(os.path.getsize(tmp_path / "cut.npy") - 10)
    cases: list[tuple[Any, tuple[str, ...]]] = [
        (tmp_path / "missing.bin", ("no such file",)),
        (tmp_path, ("is a directory",)),
        (_fifo(tmp_path), ("not a regular file",)),
        (tmp_path / "empty.bin", ("is empty",)),
        (tmp_path / "odd.bin", ("3 bytes", "uint16")),
        (tmp_path / "short.bin", ("4 tokens", "seq_len + 1 = 9")),
        (tmp_path / "fake.npy", ("no NumPy header",)),
        (tmp_path / "bad.npy", ("not a valid .npy file",)),
        (tmp_path / "float.npy", ("float32", "not integer")),
        (tmp_path / "u64.npy", ("uint64", "supported")),
        (tmp_path / "object.npy", ("object",)),
        (tmp_path / "cut.npy", ("truncated",)),
    ]
    for path, words in cases:
        _one_line_error(lambda: TokenFile(path, seq_len=8, rows=2), *words)


def test_bad_arguments_are_one_line_errors(arange_file: Path) -> None:
    cases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        ({"seq_len": 0}, ("seq_len", ">= 1")),
        ({"rows": 0}, ("rows", ">= 1")),
        ({"rows": 2.5}, ("rows", "integer")),
        ({"rows": True}, ("rows", "integer")),
        ({"seq_len": "8"}, ("seq_len", "integer")),
        ({"rows": 2**20, "seq_len": 2**10}, ("rows * seq_len", str(MAX_BATCH_TOKENS))),
        ({"rows": 2**40}, ("rows", "above the limit")),
        ({"dtype": "uint61"}, ("unknown dtype", "uint16")),
        ({"dtype": "uint64"}, ("not a token id type", "int64")),
        ({"path": "s3://bucket/train.bin"}, ("URI", "local path")),
        ({"dtype": 3.5}, ("dtype",)),
        ({"seed": -1}, ("seed", ">= 0")),
        ({"path": ""}, ("path",)),
        ({"path": None}, ("path",)),
    ]
    for change, words in cases:
        kwargs: dict[str, Any] = {"path": arange_file, "seq_len": 8, "rows": 2, **change}
        _one_line_error(lambda: TokenFile(**kwargs), *words)
    data = TokenFile(arange_file, seq_len=8, rows=2)
    for step in (-1, True, 1.5, "3"):
        _one_line_error(lambda: data(step), "step")  # type: ignore[arg-type]


def test_a_changed_or_missing_file_on_the_worker_is_a_one_line_error(tmp_path: Path) -> None:
    path = _raw(tmp_path / "t.bin", np.arange(100))
    data = TokenFile(path, seq_len=4, rows=2)
    _raw(path, np.arange(90))  # another copy than the driver checked: the batches would not match
    _one_line_error(lambda: data(0), "180 bytes on this node", "200")
    path.unlink()
    _one_line_error(lambda: data(0), "no such file", "on this node")


def test_a_negative_token_id_is_a_one_line_error(tmp_path: Path) -> None:
    data = TokenFile(_raw(tmp_path / "t.bin", [-3] * 20, "<i4"), seq_len=4, rows=2, dtype="int32")
    _one_line_error(lambda: data(0), "negative token id -3")


def test_a_token_file_passes_the_jobs_own_checks(tmp_path: Path) -> None:
    from actors.user_code import validate_job
    from orchestrator.elastic.job_config import TrainConfig
    from orchestrator.profiling.models import loss_fn, tiny_transformer

    path = _raw(tmp_path / "train.bin", np.random.default_rng(0).integers(0, 64, 5000))
    data = TokenFile(path, seq_len=16, rows=8)

    def model() -> list[torch.nn.Module]:
        return tiny_transformer(vocab=64, seq_len=16)

    def optimizer(params: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1)

    rows = validate_job(model, loss_fn("tiny_transformer"), optimizer, data, num_microbatches=4, checkpoint_dir=tmp_path / "ckpt")
    assert rows == 8
    TrainConfig(model_factory=model, loss_fn=loss_fn("tiny_transformer"), optimizer_factory=optimizer, data_fn=data)


# ---------------------------------------------------------------------------------------------- datasets

def _epochs(data: DatasetBatches, steps: int) -> list[list[int]]:
    seen = [int(x) for step in range(steps) for x in data(step)[0].tolist()]
    n = len(data.dataset)
    return [seen[k:k + n] for k in range(0, len(seen), n)]


def test_each_epoch_visits_every_sample_once_and_epochs_are_shuffled_differently() -> None:
    pairs = [(i, 10 * i) for i in range(10)]
    data = from_dataset(pairs, rows=3, seed=1)
    epochs = _epochs(data, 10)  # 30 positions: three epochs, batches straddling them
    assert len(epochs) == 3
    for epoch in epochs:
        assert sorted(epoch) == list(range(10))
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != list(range(10))
    inputs, targets = data(4)
    assert torch.equal(targets, 10 * inputs)


def test_without_shuffle_the_order_is_the_datasets() -> None:
    data = from_dataset([(i, i) for i in range(7)], rows=3, shuffle=False)
    assert _epochs(data, 7) == [list(range(7))] * 3


def test_rows_beyond_the_dataset_wrap_epochs() -> None:
    data = from_dataset([(i, i) for i in range(3)], rows=7, seed=2)
    seen = data(0)[0].tolist() + data(1)[0].tolist() + data(2)[0].tolist()  # 21 positions, 7 epochs
    for k in range(7):
        assert sorted(seen[3 * k:3 * k + 3]) == [0, 1, 2]


def test_dataset_batches_are_deterministic_across_a_pickle_round_trip() -> None:
    data = from_dataset([(float(i), i) for i in range(50)], rows=8, seed=5)
    first = data(9)
    copy = pickle.loads(pickle.dumps(data))
    assert "_orders" not in copy.__dict__  # the cached permutations stay in the process that drew them
    fresh = from_dataset([(float(i), i) for i in range(50)], rows=8, seed=5)
    for other in (data, copy, fresh):
        assert torch.equal(other(9)[0], first[0]) and torch.equal(other(9)[1], first[1])
    assert data.indices(0) == [int(i) for i in np.argsort(
        np.random.PCG64(np.random.SeedSequence((5, 0))).random_raw(50), kind="stable")[:8]]


def test_a_tensor_dataset_batch_has_the_right_shapes() -> None:
    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(20, 5, generator=gen), torch.randint(0, 3, (20,), generator=gen))
    inputs, targets = from_dataset(dataset, rows=4)(3)
    assert inputs.shape == (4, 5) and inputs.dtype == torch.float32
    assert targets.shape == (4,) and targets.dtype == torch.int64


def test_dict_samples_need_a_collate_fn() -> None:
    samples = [{"input_ids": torch.arange(i, i + 9)} for i in range(12)]
    _one_line_error(lambda: from_dataset(samples, rows=2), "dicts", "input_ids", "collate_fn")

    def collate(batch: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.stack([s["input_ids"] for s in batch])
        return ids[:, :-1], ids[:, 1:]

    inputs, targets = from_dataset(samples, rows=2, collate_fn=collate)(0)
    assert inputs.shape == targets.shape == (2, 8) and torch.equal(targets, inputs + 1)


class _Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


def test_bad_datasets_are_one_line_errors(tmp_path: Path) -> None:
    pairs = [(i, i) for i in range(4)]
    cases: list[tuple[Callable[[], Any], tuple[str, ...]]] = [
        (lambda: from_dataset([], rows=2), ("empty",)),
        (lambda: from_dataset(iter(pairs), rows=2), ("not a map-style dataset",)),
        (lambda: from_dataset(_Stream(), rows=2), ("not a map-style dataset",)),
        (lambda: from_dataset(42, rows=2), ("not a map-style dataset",)),
        (lambda: from_dataset(str(tmp_path / "train.bin"), rows=2), ("TokenFile",)),
        (lambda: from_dataset(pairs, rows=0), ("rows", ">= 1")),
        (lambda: from_dataset(pairs, rows=2.5), ("rows", "integer")),  # type: ignore[arg-type]
        (lambda: from_dataset(pairs, rows=2, shuffle=1), ("shuffle",)),  # type: ignore[arg-type]
        (lambda: from_dataset(pairs, rows=2, seed=-1), ("seed",)),
        (lambda: from_dataset(pairs, rows=2, collate_fn="stack"), ("collate_fn",)),  # type: ignore[arg-type]
        (lambda: from_dataset([(1, 2, 3)] * 4, rows=2), ("tuples of 3", "collate_fn")),
        (lambda: from_dataset([1, 2, 3], rows=2), ("int", "collate_fn")),
        (lambda: from_dataset(pairs, rows=2, collate_fn=lambda s: torch.zeros(2))(0), ("Tensor", "collate_fn")),
        (lambda: from_dataset(pairs, rows=2)(-1), ("step",)),
    ]
    for fn, words in cases:
        _one_line_error(fn, *words)


def test_a_dataset_passes_the_jobs_own_checks() -> None:
    from actors.user_code import validate_job
    from orchestrator.profiling.models import mlp

    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(40, 4, generator=gen), torch.randn(40, 2, generator=gen))
    rows = validate_job(lambda: mlp((4, 8, 2)), torch.nn.functional.mse_loss, lambda p: torch.optim.SGD(p, lr=0.1),
                        from_dataset(dataset, rows=8, seed=3), num_microbatches=2)
    assert rows == 8
