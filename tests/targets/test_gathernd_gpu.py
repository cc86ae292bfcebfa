"""GatherND (issue 42 items 4/11: the attention-mask path of dynamo-exported BERT and Llama) on
the metal and webgpu targets: one-node models with batch_dims 0 and 1, constant and run-time
indices, negative indices, checked against ONNX Runtime; out-of-range run-time indices give
zeros; run-time indices over an axis beyond half's exact integers force float storage."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.irio import from_proto
from mconv.targets import get_target
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parents[1]))
import onnxruntime as ort
from _gates import assert_close  # noqa: E402
from _system import needs_webgpu_adapter  # noqa: E402

TARGETS = [
    pytest.param(
        "metal",
        marks=pytest.mark.skipif(
            shutil.which("g++") is None and shutil.which("clang++") is None, reason="no C++ compiler"
        ),
    ),
    pytest.param("webgpu", marks=needs_webgpu_adapter),
]
PRECISIONS = ["fp32", "fp16"]

# (data shape, indices, batch_dims): negative components in each
CASES = {
    "bd0_pairs": ((4, 5, 3), [[1, 2], [-1, 0], [3, -5], [0, 4]], 0),
    "bd0_rows": ((4, 5, 3), [[[2], [-4]], [[3], [-1]]], 0),
    "bd0_full": ((4, 5, 3), [[0, 1, 2], [-1, -1, -3]], 0),
    "bd1_rows": ((2, 4, 3), [[[1], [-1], [0]], [[3], [-2], [2]]], 1),
    "bd1_pairs": ((2, 4, 3), [[[1, -1]], [[-4, 2]]], 1),
}


def _model(runtime: bool, shapes: dict | None = None):
    """One GatherND node per case over one float input; indices are initializers, or int64
    inputs when ``runtime``."""
    nodes, inputs, outputs, inits = [], [], [], []
    for name, (xs, idx, bd) in (shapes or CASES).items():
        idx = np.asarray(idx, np.int64)
        inputs.append(helper.make_tensor_value_info(f"x_{name}", TensorProto.FLOAT, list(xs)))
        if runtime:
            inputs.append(helper.make_tensor_value_info(f"i_{name}", TensorProto.INT64, list(idx.shape)))
        else:
            inits.append(numpy_helper.from_array(idx, f"i_{name}"))
        nodes.append(helper.make_node("GatherND", [f"x_{name}", f"i_{name}"], [name], batch_dims=bd))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "gathernd", inputs, outputs, inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    return proto


def _feeds(runtime: bool, cases: dict | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(42)
    feeds = {}
    for name, (xs, idx, _) in (cases or CASES).items():
        # values half holds exactly, so fp16 storage moves them unchanged
        feeds[f"x_{name}"] = rng.standard_normal(xs).astype(np.float16).astype(np.float32)
        if runtime:
            feeds[f"i_{name}"] = np.asarray(idx, np.int64)
    return feeds


def _run(target: str, proto, feeds, tmp_path, precision: str):
    t = get_target(target)
    bundle = t.export(from_proto(proto), tmp_path / f"{target}_{precision}", {"precision": precision})
    plan = json.loads((bundle.root / f"{target}_plan.json").read_text())
    assert any(layer["op"] == "GatherND" for layer in plan["layers"]), plan["layers"]
    return t.load(bundle).run(feeds), plan


def _ort(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize("target", TARGETS)
def test_gathernd_matches_ort(target, runtime, precision, tmp_path):
    proto = _model(runtime)
    feeds = _feeds(runtime)
    got, _ = _run(target, proto, feeds, tmp_path, precision)
    want = _ort(proto, feeds)
    assert set(got) == set(want)
    for name, ref in want.items():
        assert_close(ref, got[name], precision, what=f"{target} {name}")
        np.testing.assert_array_equal(got[name], ref, err_msg=f"{target} {name}")  # data movement: exact


@pytest.mark.parametrize("target", TARGETS)
def test_gathernd_out_of_range_gives_zeros(target, tmp_path):
    """ORT refuses such indices; the kernels give zeros, never a read outside the data."""
    cases = {
        "bd0": ((4, 5, 3), [[1, 2], [4, 0], [0, -6], [-4, -5]], 0),
        "bd1": ((2, 4, 3), [[[1], [4]], [[-5], [-4]]], 1),
    }
    for runtime in (False, True):
        proto = _model(runtime, cases)
        feeds = _feeds(runtime, cases)
        got, _ = _run(target, proto, feeds, tmp_path / str(runtime), "fp32")
        x0, x1 = feeds["x_bd0"], feeds["x_bd1"]
        np.testing.assert_array_equal(got["bd0"][0], x0[1, 2])
        np.testing.assert_array_equal(got["bd0"][1:3], 0)
        np.testing.assert_array_equal(got["bd0"][3], x0[0, 0])
        np.testing.assert_array_equal(got["bd1"][0, 0], x1[0, 1])
        np.testing.assert_array_equal(got["bd1"][0, 1], 0)
        np.testing.assert_array_equal(got["bd1"][1, 0], 0)
        np.testing.assert_array_equal(got["bd1"][1, 1], x1[1, 0])


@pytest.mark.parametrize("target", TARGETS)
def test_runtime_gathernd_beyond_half_forces_float_storage(target, tmp_path):
    n = 3000
    cases = {"y": ((1, n, 2), [[[2999], [2049], [-1], [2047], [-2951]]], 1)}
    proto = _model(True, cases)
    feeds = _feeds(True, cases)
    got, plan = _run(target, proto, feeds, tmp_path, "fp16")
    assert plan["dtype"] == "float"
    assert any("GatherND" in note or "Gather node" in note for note in plan.get("notes", []))
    np.testing.assert_array_equal(got["y"], _ort(proto, feeds)["y"])
    # constant indices need no float storage
    _, plan = _run(target, _model(False, cases), _feeds(False, cases), tmp_path / "c", "fp16")
    assert plan["dtype"] == "half"
