"""``mconv export --input-value NAME=VALUE`` (issue 12 item 4): a runtime scalar input such as
silero-vad's ``sr`` is baked, the If it decides is inlined, and the metal target exports; without
it the refusal names the If, the input and the option. Models are built here with onnx.helper."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.cli.app import app
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("clang++") is None, reason="no C++ compiler for the harness"
)


def sr_model(path, seed: int):
    """y = If(sr == 16000, then: Relu(x) * w16, else: x * w8), x [1, 6], sr int64 []."""
    rng = np.random.default_rng(seed)
    then_g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="then_relu"),
            helper.make_node("Mul", ["r", "w16"], ["t"], name="then_mul"),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 6])],
        [numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "w16")],
    )
    else_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "w8"], ["e"], name="else_mul")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 6])],
        [numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "w8")],
    )
    g = helper.make_graph(
        [
            helper.make_node("Equal", ["sr", "k16"], ["is16"], name="eq"),
            helper.make_node("If", ["is16"], ["y"], name="rate_if", then_branch=then_g, else_branch=else_g),
        ],
        "sr_net",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
        [numpy_helper.from_array(np.array(16000, np.int64), "k16")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(r) -> str:
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    return lines[0]


@needs_cxx
@pytest.mark.parametrize("sr", [16000, 8000])
def test_metal_export_with_input_value_matches_ort(tmp_path, sr):
    from mconv.targets.metal import TARGET

    model = sr_model(tmp_path / "sr.onnx", 1)
    out = tmp_path / "bundle"
    r = invoke(
        "export",
        model,
        "--target",
        "metal",
        "--precision",
        "fp32",
        "-o",
        out,
        "--input-value",
        f"sr={sr}",
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any("rate_if" in n for n in doc["notes"]) and any("'sr' baked to" in n for n in doc["notes"])
    x = np.random.default_rng(2).standard_normal((1, 6)).astype(np.float32)
    runner = TARGET.load(out)
    assert [s.name for s in runner.inputs] == ["x"]
    got = runner.run({"x": x})["y"]
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x, "sr": np.array(sr, np.int64)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@needs_cxx
def test_metal_without_input_value_runs_both_branches_and_selects(tmp_path):
    """Both branches are small: the If decided at run time becomes Where(cond, then, else)
    (a larger one is refused naming its input: tests/targets/metal/test_transformers_metal.py)."""
    from mconv.targets.metal import TARGET

    model = sr_model(tmp_path / "sr.onnx", 3)
    r = invoke("export", model, "--target", "metal", "--precision", "fp32", "-o", tmp_path / "b")
    assert r.exit_code == 0, r.output
    runner = TARGET.load(tmp_path / "b")
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).standard_normal((1, 6)).astype(np.float32)
    for sr in (16000, 8000):
        feeds = {"x": x, "sr": np.array(sr, np.int64)}
        np.testing.assert_allclose(runner.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-6, atol=1e-6)


def test_cpu_export_with_input_value_drops_the_input(tmp_path):
    model = sr_model(tmp_path / "sr.onnx", 4)
    out = tmp_path / "cpu"
    r = invoke("export", model, "-o", out, "--input-value", "sr=16000", "--json")
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == ["x"]


@pytest.mark.parametrize(
    ("arg", "needle"),
    [
        ("rate=16000", "'rate', which is not an input"),
        ("sr=sixteen", "--input-value sr=sixteen: not a int64"),
        ("sr", "bad --input-value 'sr'"),
    ],
)
def test_bad_input_values_are_one_line_exit_2(tmp_path, arg, needle):
    model = sr_model(tmp_path / "sr.onnx", 5)
    before = model.read_bytes()
    r = invoke("export", model, "--target", "metal", "-o", tmp_path / "b", "--input-value", arg)
    assert r.exit_code == 2
    line = one_line(r)
    assert needle in line, line
    assert "sr.onnx" in line or arg == "sr"
    assert model.read_bytes() == before and not (tmp_path / "b").exists()
