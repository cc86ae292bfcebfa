"""dynamic-batch: the batch that constants pin is freed in the model itself, checked against ORT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.cli.app import app
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _ort(path: Path, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _per_sample_equal(src: Path, dst: Path, feeds: dict, batch: int = 1) -> None:
    """dst on the whole batch == src (the untouched model, in ORT) on each slice of ``batch``."""
    got = _ort(dst, feeds)
    n = next(iter(feeds.values())).shape[0]
    for i in range(0, n, batch):
        want = _ort(src, {k: v[i : i + batch] for k, v in feeds.items()})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g[i : i + batch], w, rtol=1e-4, atol=1e-5)


def test_light_alexnet_runs_any_batch_and_matches_the_original_per_sample(tmp_path):
    src = LIGHT / "light_bvlc_alexnet.onnx"
    out = tmp_path / "a.onnx"
    r = _cli("optimize", str(src), "--passes", "dynamic-batch", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["passes"][0]["notes"]
    assert "rewrote Reshape 'n15' shape [1, 9216] -> [0, 9216]" in notes
    m = onnx.load(out)
    onnx.checker.check_model(m)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    assert m.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
    _per_sample_equal(src, out, {"data_0": x})
    # the reference executor takes batch 3 now, as ORT does
    r = _cli("run", str(out), "--input-shape", "data_0=3,3,224,224", "--samples", "3", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["outputs"]["prob_1"]["shape"] == [3, 1000]


def _small(path: Path, *, allowzero: bool = False, mix: bool = False) -> Path:
    """x [2,4] -> Reshape [2,2,2] -> Expand to [2,2,2] (+ optional ReduceSum over the batch)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1, 2, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape", allowzero=int(allowzero)),
        helper.make_node("Mul", ["r", "w"], ["m"], name="mul"),
        helper.make_node("Expand", ["m", "e"], ["y"], name="expand"),
    ]
    if mix:
        nodes.append(helper.make_node("ReduceSum", ["y", "ax"], ["z"], name="mix", keepdims=1))
        nodes.append(helper.make_node("Add", ["y", "z"], ["out"], name="add"))
    inits = [
        numpy_helper.from_array(np.array([2, 2, 2], np.int64), "s"),
        numpy_helper.from_array(np.array([2, 2, 2], np.int64), "e"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array([0], np.int64), "ax"),
    ]
    g = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("out" if mix else "y", TensorProto.FLOAT, [2, 2, 2])],
        inits,
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


@pytest.mark.parametrize("allowzero", [False, True])
def test_reshape_and_expand_to_a_pinned_batch_of_two_are_freed(tmp_path, allowzero):
    src = _small(tmp_path / "s.onnx", allowzero=allowzero)
    out = tmp_path / "d.onnx"
    r = _cli("optimize", str(src), "--passes", "dynamic-batch", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["passes"][0]["notes"]
    assert notes[0] == "batch 2 -> N on 1 input(s)"
    assert any("Expand 'expand' shape [2, 2, 2] -> [1, 2, 2]" in n for n in notes)
    x = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32)
    _per_sample_equal(src, out, {"x": x}, batch=2)


def test_a_model_that_mixes_samples_is_refused_with_one_line(tmp_path):
    src = _small(tmp_path / "s.onnx", mix=True)
    r = _cli("optimize", str(src), "--passes", "dynamic-batch", "-o", str(tmp_path / "d.onnx"))
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "dynamic-batch" in lines[0], r.output
    assert not (tmp_path / "d.onnx").exists()


def test_a_model_with_a_symbolic_batch_is_left_as_it_is(tmp_path):
    out = tmp_path / "b.onnx"
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    r = _cli("optimize", str(tmp_path / "m.onnx"), "--passes", "dynamic-batch", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["passes"][0]["modified"] is False
