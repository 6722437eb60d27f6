import base64
import hashlib
import io
import json

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from pathlib import Path

from cloud.cli import main
from cloud.transfer import MANIFEST, TransferError, copy_checkpoint

SNAP = str(Path(__file__).resolve().parents[2] / "pricing_data")


def make_ckpt(root):
    (root / "shard").mkdir(parents=True)
    (root / "model.pt").write_bytes(b"weights" * 100)
    (root / "shard" / "opt.pt").write_bytes(b"\x00\x01" * 50)
    return root


def test_local_copy_verifies_and_is_atomic(tmp_path):
    src = make_ckpt(tmp_path / "src")
    manifest = copy_checkpoint(str(src), str(tmp_path / "dst"))
    assert set(manifest) == {"model.pt", "shard/opt.pt"}
    assert (tmp_path / "dst" / "shard" / "opt.pt").read_bytes() == b"\x00\x01" * 50
    assert json.loads((tmp_path / "dst" / MANIFEST).read_text()) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]  # no staging left behind


def test_download_with_corrupt_file_fails_and_leaves_nothing(tmp_path):
    src = make_ckpt(tmp_path / "src")
    copy_checkpoint(str(src), str(tmp_path / "mid"))
    (tmp_path / "mid" / "model.pt").write_bytes(b"tampered")
    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    files = {p.relative_to(tmp_path / "mid").as_posix(): p.read_bytes() for p in (tmp_path / "mid").rglob("*") if p.is_file()}
    with Stubber(s3) as stub:
        for key in (MANIFEST, "model.pt", "shard/opt.pt"):
            body = files[key]
            stub.add_response("get_object", {"Body": StreamingBody(io.BytesIO(body), len(body)), "ContentLength": len(body)},
                              {"Bucket": "b", "Key": f"ck/{key}"})
        with pytest.raises(TransferError, match="model.pt differs"):
            copy_checkpoint("s3://b/ck", str(tmp_path / "out"), src_client=s3)
    assert not (tmp_path / "out").exists()


def test_s3_upload_sends_sha256_and_manifest_last(tmp_path):
    src = make_ckpt(tmp_path / "src")
    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    with Stubber(s3) as stub:
        for key in ("model.pt", "shard/opt.pt"):
            digest = base64.b64encode(hashlib.sha256((src / key).read_bytes()).digest()).decode()
            stub.add_response("put_object", {"ETag": '"x"'}, {"Bucket": "b", "Key": f"run/{key}", "Body": ANY,
                                                            "ChecksumAlgorithm": "SHA256", "ChecksumSHA256": digest})
        stub.add_response("put_object", {"ETag": '"m"'}, {"Bucket": "b", "Key": f"run/{MANIFEST}", "Body": ANY,
                                                        "ChecksumAlgorithm": "SHA256", "ChecksumSHA256": ANY})
        copy_checkpoint(str(src), "s3://b/run", dst_client=s3)
        stub.assert_no_pending_responses()


def test_unknown_scheme_and_missing_folder(tmp_path):
    with pytest.raises(TransferError, match="does not exist"):
        copy_checkpoint(str(tmp_path / "nope"), str(tmp_path / "x"))
    with pytest.raises(Exception, match="unsupported scheme 'ftp'"):
        copy_checkpoint("ftp://host/x", str(tmp_path / "x"))


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
