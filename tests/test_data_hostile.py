"""Data files a user passes (``--data D.npz``, ``--input NAME=x.npy``) are read as warily as model
files: sizes checked before allocating, nothing unpickled, one line and exit 2 (issue 11)."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np
from mconv.cli.app import app
from typer.testing import CliRunner

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "digits_mlp.onnx"


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line_exit_2(r, name: str) -> None:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and name in lines[0], lines[0]
    assert "internal error" not in r.output and "Traceback" not in r.output


def test_data_npz_whose_member_claims_a_gigabyte_is_refused_before_inflating(tmp_path):
    # A real deflated member, then its directory entry rewritten to claim 1 GiB inflated.
    bomb = tmp_path / "calib.npz"
    np.savez_compressed(bomb, input=np.zeros((4, 64), np.float32))
    data = bytearray(bomb.read_bytes())
    cd = data.rfind(b"PK\x01\x02")
    struct.pack_into("<L", data, cd + 24, 1 << 30)  # central directory: uncompressed size
    struct.pack_into("<L", data, 22, 1 << 30)  # local header: uncompressed size
    bomb.write_bytes(bytes(data))
    with zipfile.ZipFile(bomb) as zf:
        assert zf.infolist()[0].file_size == 1 << 30
    r = _cli("verify", str(FIXTURE), str(FIXTURE), "--data", str(bomb))
    _one_line_exit_2(r, "calib.npz")


def test_data_npz_holding_a_pickle_is_refused(tmp_path):
    bad = tmp_path / "calib.npz"
    np.savez(bad, input=np.array([{"a": 1}] * 4, dtype=object))
    r = _cli("verify", str(FIXTURE), str(FIXTURE), "--data", str(bad))
    _one_line_exit_2(r, "calib.npz")


def test_input_npy_whose_header_claims_more_than_the_file_holds(tmp_path):
    x = tmp_path / "x.npy"
    rng = np.random.default_rng(0)
    np.save(x, rng.standard_normal((1, 64)).astype(np.float32))
    x.write_bytes(x.read_bytes()[:-8])
    r = _cli("run", str(FIXTURE), "--input", f"input={x}", "-o", str(tmp_path / "y.npz"))
    _one_line_exit_2(r, "x.npy")
    assert not (tmp_path / "y.npz").exists()


def test_input_npy_that_is_read_runs(tmp_path):
    x = tmp_path / "x.npy"
    rng = np.random.default_rng(1)
    np.save(x, rng.standard_normal((2, 64)).astype(np.float32))
    r = _cli("run", str(FIXTURE), "--input", f"input={x}", "-o", str(tmp_path / "y.npz"), "-q")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "y.npz") as z:
        assert z[z.files[0]].shape == (2, 10)


def test_bundle_that_ort_refuses_prints_nothing_on_stdout(tmp_path):
    b = tmp_path / "b"
    assert _cli("export", str(FIXTURE), "--target", "cpu", "-o", str(b), "-q").exit_code == 0
    # An op ORT does not know, with the manifest's sha256 left matching: refused by ORT only.
    import hashlib
    import json

    import onnx

    m = onnx.load(b / "model.onnx")
    m.graph.node[1].op_type = "NoSuchOp"
    (b / "model.onnx").write_bytes(m.SerializeToString())
    man = json.loads((b / "manifest.json").read_text())
    entry = man["files"]["model.onnx"]
    entry["sha256"] = hashlib.sha256((b / "model.onnx").read_bytes()).hexdigest()
    entry["bytes"] = (b / "model.onnx").stat().st_size
    (b / "manifest.json").write_text(json.dumps(man))
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 64), np.float32))
    r = CliRunner().invoke(
        app, ["run", str(b), "--input", f"input={x}", "-o", str(tmp_path / "y.npz"), "--json"]
    )
    assert r.exit_code == 2, r.output
    assert r.stdout.strip() == "" or r.stdout.lstrip().startswith("{"), r.stdout
    assert "EP Error" not in r.stdout
