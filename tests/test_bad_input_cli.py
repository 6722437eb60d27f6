"""Each reproducer of issue 13 (outputs, decoding, bounds, validation) as a regression test.

Most run the CLI in-process (fast); the ones about real processes (a pipe closed by ``head``, a
device node, file permissions under a umask) run ``python -m orchestrator`` as a subprocess.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.core.errors import UserError
from orchestrator.core.profile import Block, Profile
from tests.fuzz_helpers import check_contract, run_cli, snapshot, write_good_profile

PLAN = ["plan", "--profile", "good.json", "--gpus", "4", "--inter-gbps", "10", "--microbatches", "8"]


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    write_good_profile(tmp_path / "good.json")
    return tmp_path


def refused(argv: list[str], root: Path, message: str) -> str:
    """Run ``argv``; it must exit 2 with one line containing ``message`` and write nothing."""
    before = snapshot(root)
    run = run_cli(argv, root)
    check_contract(run, before, snapshot(root), argv)
    assert run.code == 2, run.out
    assert message in run.err, run.err
    return run.err


def profile_with(root: Path, **fields: object) -> list[str]:
    block = {"name": "b", "forward_s": 0.001, "backward_s": 0.002, "activation_bytes": 1e6, "param_bytes": 1e6}
    top: dict[str, object] = {"format": "raypipe-profile", "blocks": [dict(block), dict(block, name="c")]}
    for key, value in fields.items():
        if key.startswith("block_"):
            top["blocks"][0][key[6:]] = value  # type: ignore[index]
        else:
            top[key] = value
    (root / "p.json").write_text(json.dumps(top))
    return ["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "4"]


# ----- 1, 2: output paths -----
@pytest.mark.parametrize(
    "flag, target, message",
    [
        ("--out", "good.json/x.json", "good.json is not a directory"),
        ("--out", "adir", "is a directory"),
        ("--out", "/proc/x.json", "cannot write plan /proc/x.json"),
        ("--png", "/proc/g.png", "cannot write figure /proc/g.png"),
        ("--out", "link.json", "is a symbolic link"),
        ("--trace", "fifo", "is a FIFO"),
        ("--out", "", "is not a file name"),
    ],
)
def test_bad_output_paths_are_refused_before_work(work: Path, flag: str, target: str, message: str) -> None:
    (work / "adir").mkdir()
    (work / "link.json").symlink_to(work / "good.json")
    os.mkfifo(work / "fifo")
    refused(PLAN + [flag, target], work, message)
    assert (work / "link.json").is_symlink()


def test_same_file_twice_is_refused(work: Path) -> None:
    refused(PLAN + ["--out", "a.json", "--trace", "./a.json"], work, "are the same file")


def test_several_outputs_are_all_or_none(work: Path) -> None:
    refused(PLAN + ["--out", "a.json", "--png", "/proc/g.png"], work, "/proc/g.png")
    assert not (work / "a.json").exists()
    run = run_cli(PLAN + ["--out", "a.json", "--png", "bad/dir/g.png", "--trace", "t.json"], work)
    assert run.code == 0
    assert (work / "bad/dir/g.png").read_bytes()[:4] == b"\x89PNG" and (work / "a.json").exists() and (work / "t.json").exists()
    assert not [p for p in work.rglob(".*") if p.name.endswith(".tmp")]


def test_a_failing_render_leaves_nothing(tmp_path: Path) -> None:
    from orchestrator.core.files import Output, json_output, write_outputs

    def boom(handle: object) -> None:
        raise RuntimeError("render failed")

    with pytest.raises(RuntimeError):
        write_outputs([json_output(tmp_path / "a.json", {"x": 1}), Output(tmp_path / "b.png", "figure", boom)])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_device_node_is_not_replaced(work: Path) -> None:
    os.mknod(work / "mynull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    refused(PLAN + ["--trace", "mynull"], work, "is a device")
    assert stat.S_ISCHR(os.lstat(work / "mynull").st_mode)


def _subprocess(argv: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *argv], cwd=cwd, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload, no-any-return]


def test_outputs_get_the_usual_permissions(work: Path) -> None:
    proc = subprocess.run(f"umask 022 && {sys.executable} -m orchestrator {' '.join(PLAN)} --out m.json --png m.png",
                          shell=True, cwd=work, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(work / "m.json").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(work / "m.png").st_mode) == 0o644


def test_closed_pipe_is_not_a_traceback(work: Path) -> None:
    proc = subprocess.run(f"{sys.executable} -m orchestrator {' '.join(PLAN)} | head -1", shell=True, cwd=work,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("algorithm")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


# ----- 3: decoding -----
@pytest.mark.parametrize("which", ["profile", "plan", "cluster"])
def test_non_utf8_inputs_name_the_file(work: Path, which: str) -> None:
    (work / "some.bin").write_bytes(b"{\x80\x81\xfe binary")
    argv = {
        "profile": ["plan", "--profile", "some.bin", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"],
        "plan": ["simulate", "--profile", "good.json", "--plan", "some.bin", "--gpus", "2", "--inter-gbps", "1"],
        "cluster": ["plan", "--profile", "good.json", "--cluster", "some.bin", "--microbatches", "2"],
    }[which]
    refused(argv, work, f"{which} some.bin: not UTF-8 text")


def test_endless_input_is_capped(work: Path) -> None:
    refused(["plan", "--profile", "/dev/zero", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"], work, "is a device")
    big = work / "big.json"
    with open(big, "wb") as handle:  # a regular file beyond the cap: refused after reading the cap, not all of it
        handle.truncate(257 * 2**20)
    refused(["plan", "--profile", str(big), "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"], work, "larger than the")


# ----- 4: bounds -----
@pytest.mark.parametrize(
    "argv, message",
    [
        (PLAN[:-1] + ["1000000000"], "above the limit 65536"),
        (["plan", "--profile", "good.json", "--gpus", "100000", "--inter-gbps", "10", "--microbatches", "8"], "the limit is 1024 devices"),
        (["plan", "--profile", "good.json", "--gpus", "4", "--inter-gbps", "nan", "--microbatches", "8"], "must be finite"),
        (["plan", "--profile", "good.json", "--gpus", "4", "--inter-gbps", "10", "--microbatches", "8", "--memory-gib", "inf"], "must be finite"),
        (["cost-sim", "--trace", "x", "--throughputs", "y", "--days", "1e9"], "above the limit"),
        (["cost-sim", "--trace", "x", "--throughputs", "y", "--days", "nan"], "--days must be a finite number"),
        (["profile", "--model", "mlp", "--microbatch-size", "100000000", "--out", "p.json"], "above the limit"),
        (["profile", "--factory", "x:y", "--input-shape", "100000,100000", "--out", "p.json"], "GiB float32 input; the limit is 1 GiB"),
    ],
)
def test_sizes_beyond_the_machine_are_refused_with_the_estimate(work: Path, argv: list[str], message: str) -> None:
    refused(argv, work, message)


def test_simulating_a_trillion_microbatches_is_refused(work: Path) -> None:
    plan = {"stages": [{"blocks": [0, 3], "devices": [0]}, {"blocks": [3, 6], "devices": [1]}], "num_microbatches": 1e12}
    (work / "plan.json").write_text(json.dumps(plan))
    refused(["simulate", "--profile", "good.json", "--plan", "plan.json", "--gpus", "2", "--inter-gbps", "1"], work, "above the limit")


def test_simulator_estimates_events_before_lowering() -> None:
    from orchestrator.core import cluster as cl
    from orchestrator.core.plan import straight_plan
    from orchestrator.costmodel.simulator import simulate

    prof = Profile("p", tuple(Block(f"b{i}", 0.001, 0.002, 1.0, 1.0) for i in range(64)))
    plan = straight_plan(list(range(0, 65)), 60000)
    with pytest.raises(UserError, match=r"about 1\.5\d*e\+07 events .* the limit is 2,000,000 events"):
        simulate(plan, prof, cl.flat(64, 10))


# ----- 5: validation -----
@pytest.mark.parametrize(
    "fields, message",
    [
        ({"block_forward_s": 0, "block_backward_s": 0, "blocks_zero": True}, "zero forward and backward time"),
        ({"block_forward_s": 1e308}, "block 'b': forward_s is 1e+308, above the limit"),
        ({"input_bytes": -5}, "input_bytes must be >= 0"),
        ({"block_param_bytes": True}, "block 'b': param_bytes must be a number, got True"),
        ({"microbatch_size": 2.7}, "microbatch_size must be an integer, got 2.7"),
        ({"block_name": 7}, "name must be a string"),
        ({"block_extra": 1}, "block 0: unknown field 'extra'"),
    ],
)
def test_profile_fields_are_validated_by_name(work: Path, fields: dict[str, object], message: str) -> None:
    if fields.pop("blocks_zero", False):
        block = {"name": "z", "forward_s": 0, "backward_s": 0, "activation_bytes": 0, "param_bytes": 0}
        (work / "p.json").write_text(json.dumps({"format": "raypipe-profile", "blocks": [block, dict(block, name="y")]}))
        argv = ["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "4"]
    else:
        argv = profile_with(work, **fields)
    refused(argv, work, message)


def test_nan_in_json_is_refused_at_read(work: Path) -> None:
    (work / "p.json").write_text('{"format": "raypipe-profile", "blocks": [{"name": "b", "forward_s": 1, "backward_s": 1, '
                                 '"activation_bytes": 1, "param_bytes": 1, "stash_bytes": NaN}]}')
    refused(["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"], work, "NaN is not a number JSON allows")


def test_nan_stash_bytes_is_refused_in_python() -> None:
    with pytest.raises(UserError, match="block 'b': stash_bytes must be finite"):
        Block("b", 1.0, 1.0, 1.0, 1.0, float("nan"))


@pytest.mark.parametrize(
    "cluster, message",
    [
        ({"devices": [1, 2, 3, 4]}, "device 0 must be an object"),
        ({"devices": [{"speed": True}], "bandwidth_gbps": [[0]]}, "device 0: speed must be a number, got True"),
        ({"devices": [{}, {"memory_bytes": -1}], "bandwidth_gbps": [[0, 1], [1, 0]]}, "device 1: memory_bytes must be > 0"),
        ({"devices": [{}, {}], "bandwidth_gbps": [[0, "10"], [10, 0]]}, "link 0->1: bandwidth_gbps must be a number"),
        ({"devices": [{}, {}], "bandwidth_gbps": [[0, 1]]}, "must be a 2x2 list of lists"),
        ({"servers": 2.5, "inter_gbps": 1}, "servers must be an integer, got 2.5"),
        ({"servers": 1000, "gpus_per_server": 1000, "inter_gbps": 1}, "the limit is 1024 devices"),
    ],
)
def test_cluster_fields_are_validated_by_name(work: Path, cluster: object, message: str) -> None:
    (work / "c.json").write_text(json.dumps(cluster))
    refused(["plan", "--profile", "good.json", "--cluster", "c.json", "--microbatches", "2"], work, message)


@pytest.mark.parametrize(
    "stages, message",
    [
        ([{"blocks": [0, 2], "devices": [0]}, {"blocks": [2, 2.9], "devices": [1]}], "stage 1: last block must be an integer, got 2.9"),
        ([{"blocks": [0, 2], "devices": [0, 1]}, {"blocks": [2, 6], "devices": [1]}], "device 1 is in two stages with different device groups"),
        ([{"blocks": [0, 2], "devices": [0]}, {"blocks": [2, 4], "devices": [1]}, {"blocks": [4, 6], "devices": [0]}],
         "a device group may hold several stages only in the interleaved pattern"),
        ([{"blocks": [0, 6], "devices": [True]}], "stage 0: device must be an integer, got True"),
    ],
)
def test_plan_messages_say_what_is_wrong(work: Path, stages: list[object], message: str) -> None:
    (work / "plan.json").write_text(json.dumps({"stages": stages, "num_microbatches": 4}))
    refused(["simulate", "--profile", "good.json", "--plan", "plan.json", "--gpus", "4", "--inter-gbps", "1"], work, message)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["profile", "--factory", "x:y", "--input-shape", "4,x", "--out", "p.json"], "--input-shape '4,x' must be comma-separated positive integers"),
        (["profile", "--microbatch-size", "-1", "--out", "p.json"], "--microbatch-size: value must be >= 1"),
        (["plan", "--profile", "good.json", "--gpus", "4", "--servers", "0", "--inter-gbps", "1", "--microbatches", "2"], "--servers must be >= 1"),
    ],
)
def test_profile_and_cluster_flags(work: Path, argv: list[str], message: str) -> None:
    refused(argv, work, message)


def test_factory_whose_shapes_do_not_chain_is_one_line(work: Path) -> None:
    (work / "mymodel.py").write_text(
        "import torch.nn as nn\n\ndef blocks():\n    return [nn.Linear(4, 8), nn.ReLU(), nn.Linear(7, 2)]\n"
    )
    refused(["profile", "--factory", "mymodel.py:blocks", "--input-shape", "4", "--microbatch-size", "2", "--out", "p.json"], work,
            "block 2 (Linear) raised RuntimeError: mat1 and mat2 shapes cannot be multiplied")


@pytest.mark.parametrize("cache, message", [("link.csv", "is not a regular file"), ("adir", "is not a regular file"), ("good.json/x.csv", "price cache")])
def test_price_cache_is_checked_before_any_cloud_is_asked(work: Path, cache: str, message: str) -> None:
    (work / "adir").mkdir()
    (work / "link.csv").symlink_to(work / "good.json")
    refused(["prices", "refresh", "--cloud", "aws", "--cache", cache], work, message)


def test_checkpoint_copy_of_junk_writes_nothing(work: Path) -> None:
    (work / "src" / "step_00000001").mkdir(parents=True)
    (work / "src" / "step_00000001" / "manifest.json").write_bytes(b"\xff\xfe junk")
    refused(["checkpoint", "copy", "src/step_00000001", "dst/step_00000001"], work, "")
    assert not (work / "dst").exists()


@pytest.fixture()
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody may write into: its mode for a user, a read-only bind mount for root (who ignores modes)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)
        return
    mounted = subprocess.run(f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} {folder}", shell=True,
                             capture_output=True)
    if mounted.returncode != 0:
        subprocess.run(["umount", str(folder)], capture_output=True)
        pytest.skip("root without the right to mount: no folder is read-only for this process")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_out_on_a_read_only_folder_is_one_line_and_nothing_reaches_the_storage(read_only: Path, tmp_path: Path) -> None:
    import argparse

    from orchestrator.cli.driver_args import add_job_arguments, job_configs

    root = Path(__file__).resolve().parents[1]
    driver = ["examples/elastic_gpt.py", "--steps", "3"]
    parser = argparse.ArgumentParser()
    add_job_arguments(parser)  # every driver's flags: the driver refuses before its job touches the storage
    with pytest.raises(UserError, match=rf"--out {read_only / 'out'}: .*(Read-only file system|ermission)"):
        job_configs(parser.parse_args([*driver[1:], "--storage", str(tmp_path / "store"), "--out", str(read_only / "out")]))
    argv = ["-m", "orchestrator", "run", "--provider", "local", "--storage", str(tmp_path / "store"), "--out",
            str(read_only / "out"), "--", *driver]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--out {read_only / 'out'}" in proc.stderr and ("Read-only file system" in proc.stderr or "ermission" in proc.stderr)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"])
def test_price_commands_with_standard_output_that_cannot_be_written_say_one_line(tmp_path: Path, redirect: str) -> None:
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(f"{sys.executable} -m orchestrator prices cheapest --gpu V100 --count 1 --json {redirect}", shell=True,
                          cwd=tmp_path, capture_output=False, stderr=subprocess.PIPE, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(root), "HOME": str(tmp_path)})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert "cannot write to standard output" in errors[0]
    assert list(tmp_path.iterdir()) == []
