"""Bugs the corpus found (bench/zoo.py), each pinned on a small model built here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def mconv(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _paddle_style_cls(path: Path) -> Path:
    """rapidocr's cls model (Paddle2ONNX) declares its batch as dim_value -1, which ONNX Runtime
    reads as unknown: a conv classifier with input [-1, 3, ?, ?] like it."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    fc = rng.standard_normal((4, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 2])
    g = helper.make_graph(
        nodes, "cls", [x], [y], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")]
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_negative_dim_value_exports_a_bundle_that_loads(tmp_path):
    """Found on rapidocr-cls-v2: `export --target cpu` wrote a manifest with shape -1 that its own
    loader refused (exit 2 on `mconv run BUNDLE`)."""
    src = _paddle_style_cls(tmp_path / "cls.onnx")
    x = np.random.default_rng(6).standard_normal((2, 3, 8, 12)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for model in (src, tmp_path / "imp.onnx"):
        if model.name == "imp.onnx":
            r = mconv("import", str(src), "-o", str(model), "--json")
            assert r.returncode == 0, r.stderr
            dims = onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim
            assert not (dims[0].HasField("dim_value") and dims[0].dim_value < 0), dims[0]
        bundle = tmp_path / f"b-{model.stem}"
        r = mconv("export", str(model), "--target", "cpu", "-o", str(bundle), "--json")
        assert r.returncode == 0, r.stderr
        shape = json.loads((bundle / "manifest.json").read_text())["inputs"][0]["shape"]
        assert shape[0] is None or isinstance(shape[0], str), shape
        r = mconv(
            "run", str(bundle), "--data", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"), "--json"
        )
        assert r.returncode == 0, r.stderr
        got = np.load(tmp_path / "out.npz")["y"]
        np.testing.assert_allclose(
            got, want, rtol=1e-2, atol=1e-3
        )  # the bundle stores fp16 where exact enough


def test_question_mark_dims_are_not_one_symbol(tmp_path):
    """Found on rapidocr-cls-v2 (input [-1, 3, '?', '?'], run by ORT at 48x192): `export --target
    xla --input-shape x=1,3,48,192` was refused, "symbol '?' two sizes: 48 and 192"."""
    src = _paddle_style_cls(tmp_path / "cls.onnx")
    m = onnx.load(str(src))
    for d in m.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.dim_param = "?"
    onnx.save(m, str(src))
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 12)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = mconv(
        "run",
        str(src),
        "--input-shape",
        "x=1,3,8,12",
        "--data",
        str(tmp_path / "in.npz"),
        "-o",
        str(tmp_path / "o.npz"),
    )
    assert r.returncode == 0, r.stderr
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], want, rtol=1e-5, atol=1e-6)
    # a real symbol shared by two dims still takes one size
    for d in m.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.dim_param = "s"
    onnx.save(m, str(src))
    r = mconv("run", str(src), "--input-shape", "x=1,3,8,12")
    assert r.returncode == 2 and "two sizes" in r.stderr and str(src) in r.stderr, r.stderr
