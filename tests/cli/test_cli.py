"""End-to-end CLI behaviour: commands, JSON keys, exit codes, bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper


def mconv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def small_cnn(path: Path, *, op: str = "Relu", batch="N") -> Path:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32) * 0.5
    b = rng.standard_normal(4).astype(np.float32) * 0.1
    fc = rng.standard_normal((3, 4 * 6 * 6)).astype(np.float32) * 0.1
    fcb = np.zeros(3, np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node(op, ["c"], ["r"], name="act1"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (fc, "fc"), (fcb, "fcb"))],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_python_dash_m_and_version():
    r = mconv("--version")
    assert r.returncode == 0 and r.stdout.startswith("mconv ")


def test_inspect_json_has_stable_keys(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    r = mconv("inspect", str(m), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["params"] == 4 * 9 + 4 + 3 * 144 + 3
    assert doc["bytes"] == 4 * doc["params"]
    assert doc["ops"] == {"Conv": 1, "Relu": 1, "Flatten": 1, "Gemm": 1}
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["N", 1, 6, 6]}]
    assert doc["outputs"][0]["name"] == "y"


def test_import_optimize_export_run_verify_chain(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    r = mconv("import", str(m), "-o", str(tmp_path / "imp.onnx"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["output"] == str(tmp_path / "imp.onnx")

    r = mconv(
        "optimize",
        str(tmp_path / "imp.onnx"),
        "--passes",
        "fold,dce,fp16",
        "-o",
        str(tmp_path / "opt.onnx"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"output", "bytes_before", "bytes_after", "passes"} <= set(doc)
    assert [p["name"] for p in doc["passes"]] == ["fold", "dce", "fp16"]

    r = mconv("export", str(tmp_path / "opt.onnx"), "--target", "cpu", "-o", str(tmp_path / "b1"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["bytes_after"] > 0
    r = mconv("export", str(tmp_path / "opt.onnx"), "--target", "cpu", "-o", str(tmp_path / "b2"))
    assert r.returncode == 0, r.stderr
    files1 = sorted(p.name for p in (tmp_path / "b1").iterdir())
    assert files1 == sorted(p.name for p in (tmp_path / "b2").iterdir())
    for name in files1:  # byte-identical re-run
        assert digest(tmp_path / "b1" / name) == digest(tmp_path / "b2" / name), name

    x = np.random.default_rng(1).standard_normal((2, 1, 6, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for target_args in ([str(tmp_path / "b1")], [str(m)], [str(m), "--target", "cpu"]):
        out = tmp_path / "out.npz"
        r = mconv("run", *target_args, "--input", f"x={tmp_path / 'x.npy'}", "-o", str(out))
        assert r.returncode == 0, r.stderr
        want = ort.InferenceSession(str(m)).run(None, {"x": x})[0]
        got = np.load(out)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)  # fp16 weights in the bundle

    gates = ["--min-cosine", "0.999", "--max-rel-l2", "1e-2"]  # fp16 weights
    r = mconv("verify", str(m), str(tmp_path / "b1"), "--samples", "3", "--json", *gates)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["passed"] is True
    metrics = ("max_abs", "max_rel", "mean_abs", "cosine", "rel_l2", "snr_db")
    for key in (*metrics, "top1_agreement", "top5_agreement"):
        assert key in doc["outputs"]["y"]


def test_verify_failed_gate_exits_1_and_localizes(tmp_path):
    ref = small_cnn(tmp_path / "ref.onnx", op="Relu")
    cand = small_cnn(tmp_path / "cand.onnx", op="Sigmoid")
    r = mconv("verify", str(ref), str(cand), "--atol", "1e-4", "--localize", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["passed"] is False
    assert doc["localized"]["node"] == "act1"


def test_verify_with_data_reports_accuracy(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    x = np.random.default_rng(2).standard_normal((8, 1, 6, 6)).astype(np.float32)
    labels = ort.InferenceSession(str(m)).run(None, {"x": x})[0].argmax(1)
    np.savez(tmp_path / "d.npz", x=x, labels=labels)
    r = mconv("verify", str(m), str(m), "--data", str(tmp_path / "d.npz"), "--json")
    assert r.returncode == 0, r.stderr
    y = json.loads(r.stdout)["outputs"]["y"]
    assert y["accuracy_reference"] == 1.0 and y["accuracy_candidate"] == 1.0


def test_symbolic_non_batch_dim_asks_for_input_shape(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    model = onnx.load(m)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    onnx.save(model, m)
    r = mconv("verify", str(m), str(m))
    assert_one_line_error(r, "--input-shape")
    r = mconv("verify", str(m), str(m), "--input-shape", "x=2,1,6,6", "--json")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("content", [b"", b"\x08\x07\x12\x04junk", None])
def test_bad_onnx_is_one_line_exit_2_and_writes_nothing(tmp_path, content):
    src = tmp_path / "bad.onnx"
    if content is None:  # truncated real model
        good = small_cnn(tmp_path / "good.onnx").read_bytes()
        content = good[: len(good) // 2]
    src.write_bytes(content)
    before = digest(src)
    for args in (
        ["import", str(src), "-o", str(tmp_path / "o.onnx")],
        ["optimize", str(src), "--passes", "dce", "-o", str(tmp_path / "o.onnx")],
        ["export", str(src), "-o", str(tmp_path / "bundle")],
        ["inspect", str(src)],
    ):
        r = mconv(*args)
        assert_one_line_error(r, "bad.onnx")
    assert digest(src) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["bad.onnx"] + (["good.onnx"] if (tmp_path / "good.onnx").exists() else [])
    )


def test_directory_and_missing_file(tmp_path):
    assert_one_line_error(mconv("inspect", str(tmp_path)), str(tmp_path))
    assert_one_line_error(
        mconv("import", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "o.onnx")), "not found"
    )


def test_unknown_op_is_named(tmp_path):
    g = helper.make_graph(
        [helper.make_node("FrobnicateX", ["x"], ["y"], name="mystery", domain="com.example")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    onnx.save(m, tmp_path / "u.onnx")
    r = mconv("run", str(tmp_path / "u.onnx"), "--input", "x=whatever.npy")
    assert_one_line_error(r, "mystery", "FrobnicateX")


def test_tampered_or_incomplete_bundle_is_refused(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    assert mconv("export", str(m), "-o", str(tmp_path / "b")).returncode == 0
    w = tmp_path / "b" / "weights.mcw"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    assert_one_line_error(mconv("verify", str(m), str(tmp_path / "b")), "weights.mcw")
    w.unlink()
    assert_one_line_error(mconv("inspect", str(tmp_path / "b")), "weights.mcw")


def test_npz_that_does_not_match_inputs(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    np.savez(tmp_path / "wrong_name.npz", a=np.zeros((1, 1, 6, 6), np.float32), b=np.zeros(2))
    assert_one_line_error(mconv("verify", str(m), str(m), "--data", str(tmp_path / "wrong_name.npz")), "x")
    np.savez(tmp_path / "wrong_shape.npz", x=np.zeros((1, 1, 5, 5), np.float32))
    assert_one_line_error(
        mconv("verify", str(m), str(m), "--data", str(tmp_path / "wrong_shape.npz")), "wrong_shape.npz"
    )


def test_usage_errors_exit_2(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    r = mconv("optimize", str(m), "-o", str(tmp_path / "o.onnx"))  # neither --passes nor --recipe
    assert_one_line_error(r, "--passes")
    r = mconv("optimize", str(m), "--passes", "no-such-pass", "-o", str(tmp_path / "o.onnx"))
    assert_one_line_error(r, "no-such-pass")
    assert not (tmp_path / "o.onnx").exists()


def test_demo_runs_and_reports(tmp_path):
    r = mconv("demo", "--workdir", str(tmp_path / "demo"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["passed"] is True
    assert doc["accuracy_candidate"] >= 0.9
    assert doc["bytes_after"] < doc["bytes_before"]


def test_optimize_predicts_the_byte_account_that_export_then_stores(tmp_path):
    m = small_cnn(tmp_path / "m.onnx")
    r = mconv(
        "optimize",
        str(m),
        "--passes",
        "prune(sparsity=0.5),cluster(bits=4)",
        "-o",
        str(tmp_path / "o.onnx"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    predicted = json.loads(r.stdout)["account"]
    r = mconv("export", str(tmp_path / "o.onnx"), "-o", str(tmp_path / "b"), "--json")
    assert r.returncode == 0, r.stderr
    stored = json.loads(r.stdout)["account"]
    assert {x["name"]: x["bytes"] for x in predicted["layers"]} == {
        x["name"]: x["bytes"] for x in stored["layers"]
    }
    assert predicted["total"]["bytes"] == stored["total"]["bytes"]


def test_optimize_distils_with_cosine_schedule_and_margin_from_the_cli(tmp_path):
    """prune then finetune on unlabeled data: distillation from the unpruned model, with the
    cosine schedule and the top-1 margin hinge set in the spec; masks stay exact zeros."""
    m = small_cnn(tmp_path / "m.onnx")
    x = np.random.default_rng(5).standard_normal((64, 1, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    spec = "prune(sparsity=0.6),finetune(epochs=3,lr=0.01,holdout=0.0,schedule='cosine',margin=0.3)"
    out = tmp_path / "ft.onnx"
    r = mconv(
        "optimize", str(m), "--passes", spec, "--data", str(tmp_path / "d.npz"), "-o", str(out), "--json"
    )
    assert r.returncode == 0, r.stderr
    finetune = json.loads(r.stdout)["passes"][1]
    assert finetune["name"] == "finetune"
    assert any("loss kl" in note for note in finetune["notes"]), finetune["notes"]
    assert max(t["max_change"] for t in finetune["tensors"]) > 0
    pruned = {i.name: numpy_helper.to_array(i) for i in onnx.load(out).graph.initializer}
    for name in ("w", "fc"):
        assert np.count_nonzero(pruned[name] == 0) == round(0.6 * pruned[name].size), name
    before = ort.InferenceSession(str(m)).run(None, {"x": x})[0].argmax(1)
    after = ort.InferenceSession(str(out)).run(None, {"x": x})[0].argmax(1)
    assert np.mean(before == after) >= 0.9

    for bad, needle in (("margin=-1", "margin"), ("schedule='linear'", "schedule")):
        r = mconv(
            "optimize",
            str(m),
            "--passes",
            f"finetune({bad})",
            "--data",
            str(tmp_path / "d.npz"),
            "-o",
            str(out),
        )
        assert_one_line_error(r, needle)
