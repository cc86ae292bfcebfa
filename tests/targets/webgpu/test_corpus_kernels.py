"""webgpu kernels the corpus's image models needed (issue 17 item 5, bench/zoo.py's webgpu stage),
each against the reference executor on a real WebGPU device (lavapipe in CI).

- comparisons, Not/And/Or/Xor and Where: a TFLite model with dynamic-range quantized
  convolutions (fer-emotion) imports as Equal(range, 0) + Where(., 1, scale) per layer; bool
  values are held as 0/1 in float buffers (the Metal plan's rule for integers and bool).
- Cast between floats and bool (a mask as Cast(Greater(x, 0)), float16 rounding and back); casts
  to integer types and bool graph outputs: test_quantized.py.
- DepthToSpace (DCR and CRD), SpaceToDepth, Tile: MediaPipe's face and pose detectors upsample
  with DepthToSpace.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.errors import UnsupportedError
from mconv.targets import get_target
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from test_webgpu import _check, make_model, needs_adapter  # noqa: E402


def logic_zoo() -> object:
    """Every comparison, Not, And, Or, Xor, Where with broadcast operands; exact ties included
    (the inputs are rounded to halves, so Equal and the <=, >= forms meet equal values)."""
    w = {
        "zero": np.array(0.0, np.float32),
        "one": np.array(1.0, np.float32),
        "row": np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 1.5], np.float32),
    }
    nodes = [
        helper.make_node("Sub", ["x", "y"], ["d"], name="sub"),
        helper.make_node("Equal", ["d", "zero"], ["eq"], name="eq"),
        helper.make_node("Where", ["eq", "one", "d"], ["safe"], name="where_scale"),
        helper.make_node("Div", ["x", "safe"], ["q"], name="div"),
        helper.make_node("Less", ["x", "row"], ["lt"], name="lt"),
        helper.make_node("Greater", ["x", "y"], ["gt"], name="gt"),
        helper.make_node("LessOrEqual", ["y", "row"], ["le"], name="le"),
        helper.make_node("GreaterOrEqual", ["x", "row"], ["ge"], name="ge"),
        helper.make_node("Not", ["lt"], ["nlt"], name="not"),
        helper.make_node("And", ["nlt", "gt"], ["a1"], name="and"),
        helper.make_node("Or", ["a1", "le"], ["o1"], name="or"),
        helper.make_node("Xor", ["o1", "ge"], ["x1"], name="xor"),
        helper.make_node("Where", ["x1", "x", "row"], ["sel"], name="where_pick"),
        helper.make_node("Add", ["sel", "q"], ["out"], name="add"),
    ]
    return make_model(nodes, [("x", [2, 3, 4, 6]), ("y", [2, 1, 4, 6])], ["out"], w, name="logic")


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.round(rng.uniform(-2, 2, (2, 3, 4, 6)) * 2) / 2
    y = np.round(rng.uniform(-2, 2, (2, 1, 4, 6)) * 2) / 2
    return {"x": x.astype(np.float32), "y": y.astype(np.float32)}


@needs_adapter
def test_comparisons_logic_and_where_match_the_reference(tmp_path):
    feeds = _feeds(3)
    d = feeds["x"] - feeds["y"]
    assert (d == 0).any() and (d != 0).any()  # both of Where's branches are taken
    runner, figures = _check(logic_zoo(), tmp_path, feeds)
    ops = {layer.op for layer in runner.plan.layers}
    assert {"Equal", "Where", "Less", "Not", "And", "Or", "Xor", "GreaterOrEqual"} <= ops
    assert figures["out"] >= 0.9999
    _check(logic_zoo(), tmp_path, _feeds(4), precision="fp16", min_cos=0.999)


@needs_adapter
def test_a_bool_graph_output_comes_back_as_bool(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Greater", ["x", "x0"], ["gt"], name="cmp")],
        "boolout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("gt", TensorProto.BOOL, [1, 4])],
        [numpy_helper.from_array(np.zeros((1, 4), np.float32), "x0")],
    )
    from mconv.irio import from_proto

    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    target = get_target("webgpu")
    got = target.load(target.export(model, tmp_path / "b", {})).run(
        {"x": np.array([[-1, 0, 2, 0.5]], np.float32)}
    )
    assert got["gt"].dtype == np.bool_
    np.testing.assert_array_equal(got["gt"], [[False, False, True, True]])


def shape_zoo(seed: int) -> object:
    rng = np.random.default_rng(seed)
    w = {
        "k": (0.3 * rng.standard_normal((8, 8, 1, 1))).astype(np.float32),
        "reps": np.array([1, 2, 3, 1], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["c"], name="conv"),
        helper.make_node("DepthToSpace", ["c"], ["dcr"], name="d2s_dcr", blocksize=2, mode="DCR"),
        helper.make_node("DepthToSpace", ["x"], ["crd"], name="d2s_crd", blocksize=2, mode="CRD"),
        helper.make_node("SpaceToDepth", ["dcr"], ["s2d"], name="s2d", blocksize=2),
        helper.make_node("Tile", ["crd", "reps"], ["tile"], name="tile"),
        helper.make_node("Add", ["s2d", "x"], ["back"], name="add"),
    ]
    return make_model(nodes, [("x", [1, 8, 3, 5])], ["dcr", "crd", "back", "tile"], w, name="shapes")


@needs_adapter
def test_depth_to_space_space_to_depth_and_tile_match_the_reference(tmp_path):
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((1, 8, 3, 5)).astype(np.float32)}
    runner, figures = _check(shape_zoo(0), tmp_path, feeds)
    assert {"DepthToSpace", "SpaceToDepth", "Tile"} <= {layer.op for layer in runner.plan.layers}
    got = runner.run(feeds)
    ref = get_target("reference").load_model(shape_zoo(0)).run(feeds)
    for name in ("crd", "tile"):  # copies of the input: exact
        np.testing.assert_array_equal(got[name], ref[name])


def cast_zoo() -> object:
    w = {"zero": np.array(0.0, np.float32), "big": np.array(1000.0, np.float32)}
    F, H, B = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BOOL
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["pos"], name="gt"),
        helper.make_node("Cast", ["pos"], ["mask"], name="mask", to=F),
        helper.make_node("Mul", ["x", "mask"], ["relu"], name="mul"),
        helper.make_node("Mul", ["x", "big"], ["wide"], name="widen"),
        helper.make_node("Cast", ["wide"], ["half"], name="to_half", to=H),
        helper.make_node("Cast", ["x"], ["nz"], name="to_bool", to=B),
        helper.make_node("Where", ["nz", "relu", "big"], ["picked"], name="where"),
        helper.make_node("CastLike", ["picked", "zero"], ["same"], name="castlike"),
    ]
    graph = helper.make_graph(
        nodes,
        "casts",
        [helper.make_tensor_value_info("x", F, [2, 3, 8])],
        [
            helper.make_tensor_value_info("half", H, [2, 3, 8]),
            helper.make_tensor_value_info("same", F, [2, 3, 8]),
        ],
        [numpy_helper.from_array(a, k) for k, a in w.items()],
    )
    from mconv.irio import from_proto

    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@needs_adapter
def test_casts_between_floats_and_bool_match_the_reference(tmp_path):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    x[0, 0, :3] = 0.0  # Cast to bool meets zeros
    runner, _ = _check(cast_zoo(), tmp_path, {"x": x})
    assert {"Cast", "CastLike", "Greater", "Where"} <= {layer.op for layer in runner.plan.layers}
    got = runner.run({"x": x})
    ref = get_target("reference").load_model(cast_zoo()).run({"x": x})
    wide = x * np.float32(1000.0)
    assert ref["half"].dtype == np.float16 and (ref["half"].astype(np.float32) != wide).any()  # it rounds
    np.testing.assert_array_equal(got["half"], ref["half"].astype(np.float32))  # to nearest even, as numpy
    np.testing.assert_array_equal(got["same"], ref["same"])


def test_a_cast_to_a_type_the_kernels_do_not_hold_is_refused_by_name(tmp_path):
    model = make_model(
        [
            helper.make_node("Cast", ["x"], ["i"], name="to_fp8", to=TensorProto.FLOAT8E4M3FN),
            helper.make_node("Cast", ["i"], ["y"], name="back", to=TensorProto.FLOAT),
        ],
        [("x", [1, 4])],
        ["y"],
        {},
    )
    with pytest.raises(UnsupportedError) as exc:
        get_target("webgpu").export(model, tmp_path / "b", {})
    assert "to_fp8" in str(exc.value) and "float8e4m3fn" in str(exc.value)
