"""Checkpoint transfer on local folders (the object-store cases run against real local servers in
tests/test_storage_servers.py), and the cloud price CLI."""

import json
import os
from pathlib import Path

import pytest

from actors import checkpoint as ckpt
from actors import storage
from actors.checkpoint_transfer import TransferError, copy_checkpoint
from cloud.cli import main
from orchestrator.core.errors import UserError
from tests.test_checkpoint_format import edit_manifest, flip_byte, write_checkpoint

SNAP = str(Path(__file__).resolve().parents[2] / "pricing_data")


def test_local_copy_verifies_and_is_atomic(tmp_path):
    src = write_checkpoint(tmp_path / "src", 3)
    report = copy_checkpoint(src, tmp_path / "dst" / "step_00000003")
    dst = tmp_path / "dst" / "step_00000003"
    assert report.step == 3 and report.files == 5 and report.bytes == sum(p.stat().st_size for p in dst.iterdir())
    assert sorted(os.listdir(dst)) == sorted(os.listdir(src))
    assert (dst / ckpt.COMMIT).read_bytes() == (Path(src) / ckpt.COMMIT).read_bytes()
    assert ckpt.verify(dst)["step"] == 3 and os.listdir(tmp_path / "dst") == ["step_00000003"]  # no staging left
    again = copy_checkpoint(src, dst)  # replacing an older copy of the same step
    assert again.step == 3 and os.listdir(tmp_path / "dst") == ["step_00000003"]


def test_hostile_manifest_key_writes_nothing_outside(tmp_path):
    src = write_checkpoint(tmp_path / "src", 3)
    edit_manifest(src, lambda m: m["files"][0].update(file="../../escaped.txt"), resign=True)
    with pytest.raises(UserError, match=r"files\[0\]\.file '\.\./\.\./escaped\.txt' is not a plain file name"):
        copy_checkpoint(src, tmp_path / "out" / "deep" / "step_00000003")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out").exists()


def test_corrupt_source_fails_mid_copy_and_leaves_nothing(tmp_path):
    src = write_checkpoint(tmp_path / "src", 3)
    flip_byte(Path(src) / ckpt.block_file(2))  # the first two blocks copy fine, the third does not
    with pytest.raises(TransferError, match=r"block_00002\.pt: checksum mismatch while copying"):
        copy_checkpoint(src, tmp_path / "dst" / "x")
    assert not (tmp_path / "dst").exists()  # no staging folder, and no destination folder the copy created


def test_uncommitted_source_step_mismatch_and_unknown_scheme(tmp_path):
    src = write_checkpoint(tmp_path / "src", 3)
    with pytest.raises(TransferError, match="folder says step 4 but .* holds step 3"):
        copy_checkpoint(src, tmp_path / "step_00000004")
    (Path(src) / ckpt.COMMIT).unlink()
    with pytest.raises(UserError, match="missing commit marker"):
        copy_checkpoint(src, tmp_path / "x")
    with pytest.raises(UserError, match="no such checkpoint"):
        copy_checkpoint(tmp_path / "nope", tmp_path / "x")
    with pytest.raises(storage.StorageError, match="unsupported storage scheme 'ftp'"):
        copy_checkpoint("ftp://host/x", tmp_path / "x")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_checkpoint_copy_command(tmp_path, capsys):
    from orchestrator.cli.commands import main as orchestrator

    src = write_checkpoint(tmp_path / "src", 2)
    assert orchestrator(["checkpoint", "copy", src, str(tmp_path / "dst" / "step_00000002")]) == 0
    assert capsys.readouterr().out.startswith(f"copied: {src} -> {tmp_path / 'dst' / 'step_00000002'} (step 2, ")
    flip_byte(Path(src) / ckpt.block_file(0))
    assert orchestrator(["checkpoint", "copy", src, str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert "block_00000.pt: checksum mismatch while copying" in err and err.count("\n") == 1
    assert not (tmp_path / "again").exists()


def test_cli_cheapest_json_sorted_and_filtered(capsys):
    assert main(["prices", "cheapest", "--catalog", SNAP, "--gpu", "v100", "--count", "1", "--spot", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    prices = [r["usd_per_hour"] for r in rows]
    assert prices == sorted(prices) and len({r["cloud"] for r in rows}) == 3
    assert all(r["gpu_type"] == "V100" and r["gpu_count"] == 1 and r["spot"] is True for r in rows)
    assert main(["prices", "cheapest", "--catalog", SNAP, "--gpu", "V100", "--count", "4", "--cloud", "aws",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["cloud"], r["instance_type"], r["spot"]) for r in rows} == {("aws", "p3.8xlarge", False)}


@pytest.mark.parametrize("argv,match", [
    (["prices", "cheapest", "--catalog", SNAP, "--gpu", "V10", "--count", "1"], "did you mean 'V100'"),
    (["prices", "cheapest", "--catalog", SNAP, "--gpu", "V100", "--count", "1", "--cloud", "awz"], "unknown cloud 'awz'"),
    (["prices", "show", "--catalog", SNAP, "--instance-type", "p3.2xlage"], "did you mean 'p3.2xlarge'"),
    (["prices", "cheapest", "--catalog", "missing.csv", "--gpu", "V100", "--count", "1"], "no such price file"),
])
def test_cli_errors_are_one_line_exit_2(capsys, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and match in err and err.count("\n") == 1


def test_cli_bad_price_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"SpotPriceHistory": [ broken')
    assert main(["prices", "cheapest", "--catalog", str(bad), "--gpu", "V100", "--count", "1"]) == 2
    assert "not a describe-spot-price-history JSON" in capsys.readouterr().err


def test_cli_cost_sim(traces, capsys):
    code = main(["cost-sim", "--trace", str(traces / "logs"), "--throughputs",
                 str(traces / "notebooks" / "oracle_throughputs.json"), "--model", "A3C", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and rows[0]["policy"] == "baseline" and rows[0]["reduction"] == 1.0
    assert max(r["reduction"] for r in rows) > 1.5
