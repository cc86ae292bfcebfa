"""Quantized and integer graphs on the webgpu target: QuantizeLinear/DequantizeLinear (per tensor
and per axis, int8 and uint8), a DQ -> Conv -> Q sandwich as TFLite int8 models import, integer
graph inputs and outputs, Casts to integer types (round toward zero, saturate, wrap), each run
on a real WebGPU device (lavapipe in CI) against the reference executor, whose Q/DQ follows the
ONNX spec. The data are dyadic (scales are powers of two, codes small), so every product and sum
is exact in f32 in any order: integer outputs must be equal, code for code, and the quotients
that land exactly on k + 0.5 must round half to even. Refusals are one line naming the value.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.errors import UnsupportedError
from mconv.irio import from_proto
from mconv.targets import get_target
from mconv.targets.webgpu.plan import build_plan, prepare
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from test_webgpu import needs_adapter  # noqa: E402

T = TensorProto
n = helper.make_node


def model_of(nodes, inputs, outputs, weights=None, opset=17):
    """inputs/outputs: (name, TensorProto type, shape); weights: name -> array."""
    graph = helper.make_graph(
        nodes,
        "quantized",
        [helper.make_tensor_value_info(name, t, s) for name, t, s in inputs],
        [helper.make_tensor_value_info(name, t, s) for name, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (weights or {}).items()],
    )
    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def run_both(model_fn, feeds, tmp_path, precision="fp32"):
    """(webgpu outputs, reference outputs, the runner)."""
    target = get_target("webgpu")
    runner = target.load(target.export(model_fn(), tmp_path / f"b_{precision}", {"precision": precision}))
    got = runner.run(feeds)
    want = get_target("reference").load_model(model_fn()).run(feeds)
    return got, want, runner


def assert_codes_equal(got, want, names):
    for name in names:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def qdq_zoo():
    w = {
        "s": np.float32(0.25),
        "z8": np.int8(3),
        "zu8": np.uint8(128),
        "sc": np.array([0.25, 0.5, 0.125], np.float32),
        "zc": np.array([-2, 0, 5], np.int8),
        "zcu": np.array([0, 128, 250], np.uint8),
    }
    nodes = [
        n("QuantizeLinear", ["x", "s", "z8"], ["q8"], name="q8"),
        n("DequantizeLinear", ["q8", "s", "z8"], ["dq8"], name="dq8"),
        n("QuantizeLinear", ["x", "s", "zu8"], ["qu8"], name="qu8"),
        n("DequantizeLinear", ["qu8", "s", "zu8"], ["dqu8"], name="dqu8"),
        n("QuantizeLinear", ["x", "sc", "zc"], ["qc"], name="qc", axis=1),
        n("DequantizeLinear", ["qc", "sc", "zc"], ["dqc"], name="dqc", axis=1),
        n("QuantizeLinear", ["x", "sc", "zcu"], ["qcu"], name="qcu", axis=-3),
        n("DequantizeLinear", ["qcu", "sc", "zcu"], ["dqcu"], name="dqcu", axis=-3),
    ]
    shape = [1, 3, 4, 5]
    outs = [("q8", T.INT8), ("dq8", T.FLOAT), ("qu8", T.UINT8), ("dqu8", T.FLOAT)]
    outs += [("qc", T.INT8), ("dqc", T.FLOAT), ("qcu", T.UINT8), ("dqcu", T.FLOAT)]
    return model_of(nodes, [("x", T.FLOAT, shape)], [(k, t, shape) for k, t in outs], w)


def _qdq_input():
    rng = np.random.default_rng(3)
    # multiples of 1/8: with scale 0.25 (and 0.5, 0.125 per channel) many quotients are ties
    # k + 0.5, which round half to even; the large ones saturate
    x = (rng.integers(-400, 400, (1, 3, 4, 5)) / 8).astype(np.float32)
    x[0, 0, 0, :5] = [0.125, 0.375, -0.125, -0.375, 0.625]  # quotients 0.5, 1.5, -0.5, -1.5, 2.5
    return x


@needs_adapter
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_quantize_dequantize_per_tensor_and_per_axis_equal_the_reference(tmp_path, precision):
    x = _qdq_input()
    got, want, runner = run_both(qdq_zoo, {"x": x}, tmp_path, precision)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {layer.op for layer in runner.plan.layers}
    assert runner.plan.dtype == "float"  # fp16 asked: computed values quantized, f32 storage (rule 5)
    assert_codes_equal(got, want, ["q8", "qu8", "qc", "qcu"])
    # half to even, before the zero point: 0.5 -> 0, 1.5 -> 2, -0.5 -> 0, -1.5 -> -2, 2.5 -> 2
    np.testing.assert_array_equal(got["q8"][0, 0, 0, :5], np.array([0, 2, 0, -2, 2]) + 3)
    np.testing.assert_array_equal(got["qu8"][0, 0, 0, :5], np.array([0, 2, 0, -2, 2]) + 128)
    assert got["q8"].min() == -128 and got["q8"].max() == 127  # saturation is hit both ways
    assert got["qu8"].min() == 0 and got["qcu"].max() == 255
    for name in ("dq8", "dqu8", "dqc", "dqcu"):  # multiples of 1/8 below 2^11: exact in half too
        assert got[name].dtype == np.float32, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def sandwich(with_c2: bool = False):
    """TFLite's int8 layout: int8 input -> DQ -> Conv (int8 per-channel weights, int32 bias, both
    DQ'd) -> Relu -> Q -> DQ -> Conv (per-tensor weights) -> Q -> int8 output; and the other
    import of an int8 input, Cast -> (x - zp) * s."""
    rng = np.random.default_rng(7)
    w = {
        "s_in": np.float32(0.125),
        "z_in": np.int8(-3),
        "w1": rng.integers(-8, 9, (4, 2, 3, 3)).astype(np.int8),
        "w1s": np.array([0.25, 0.125, 0.5, 0.0625], np.float32),
        "w1z": np.zeros(4, np.int8),
        "b1": rng.integers(-200, 200, 4).astype(np.int32),
        "b1s": np.array([0.25, 0.125, 0.5, 0.0625], np.float32) * np.float32(0.125),
        "b1z": np.zeros(4, np.int32),
        "s_h": np.float32(0.5),
        "z_h": np.uint8(10),
        "w2": rng.integers(-8, 9, (3, 4, 1, 1)).astype(np.int8),
        "w2s": np.float32(0.25),
        "w2z": np.int8(0),
        "s_out": np.float32(2.0),
        "z_out": np.int8(-5),
        "zf": np.float32(-3.0),
    }
    nodes = [
        n("DequantizeLinear", ["x", "s_in", "z_in"], ["xd"], name="dq_in"),
        n("DequantizeLinear", ["w1", "w1s", "w1z"], ["w1d"], name="dq_w1", axis=0),
        n("DequantizeLinear", ["b1", "b1s", "b1z"], ["b1d"], name="dq_b1", axis=0),
        n("Conv", ["xd", "w1d", "b1d"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("QuantizeLinear", ["r1", "s_h", "z_h"], ["h"], name="q_h"),
        n("DequantizeLinear", ["h", "s_h", "z_h"], ["hd"], name="dq_h"),
        n("DequantizeLinear", ["w2", "w2s", "w2z"], ["w2d"], name="dq_w2"),
        n("Conv", ["hd", "w2d"], ["c2"], name="conv2"),
        n("QuantizeLinear", ["c2", "s_out", "z_out"], ["y"], name="q_out"),
        n("Cast", ["x"], ["xf"], name="cast_in", to=T.FLOAT),
        n("Sub", ["xf", "zf"], ["xc"], name="sub_zp"),
        n("Mul", ["xc", "s_in"], ["xs"], name="mul_s"),
        n("QuantizeLinear", ["xs", "s_h", "z_out"], ["x_again"], name="q_again"),
    ]
    shape = [1, 2, 6, 7]
    outs = [("y", T.INT8, [1, 3, 6, 7]), ("h", T.UINT8, [1, 4, 6, 7]), ("x_again", T.INT8, shape)]
    if with_c2:  # the float before the last QuantizeLinear (for the reference only)
        outs.append(("c2", T.FLOAT, [1, 3, 6, 7]))
    return model_of(nodes, [("x", T.INT8, shape)], outs, w)


@needs_adapter
def test_a_dq_conv_q_sandwich_with_an_int8_input_and_output_equals_the_reference(tmp_path):
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (1, 2, 6, 7)).astype(np.int8)
    got, want, runner = run_both(sandwich, {"x": x}, tmp_path)
    ops = [layer.op for layer in runner.plan.layers]
    assert "Conv+relu+quantize" in ops and "Conv+quantize" in ops  # fused, one kernel each
    assert_codes_equal(got, want, ["y", "h", "x_again"])
    assert got["y"].dtype == np.int8 and got["h"].dtype == np.uint8
    # the data are dyadic, so quotients land on k + 0.5 exactly: ties are met and go to even
    c2 = get_target("reference").load_model(sandwich(with_c2=True)).run({"x": x})["c2"]
    ties = (c2 / 2.0) % 1 == 0.5
    assert ties.any()
    np.testing.assert_array_equal(got["y"][ties], np.clip(np.rint(c2[ties] / 2.0) - 5, -128, 127))
    assert (got["h"] == 255).any() and (got["h"] == 10).any()  # saturated, and Relu's zeros


def casts():
    nodes = [
        n("Cast", ["f"], ["f_i8"], name="f_i8", to=T.INT8),
        n("Cast", ["f"], ["f_u8"], name="f_u8", to=T.UINT8),
        n("Cast", ["f"], ["f_i32"], name="f_i32", to=T.INT32),
        n("Cast", ["i"], ["i_i8"], name="i_i8", to=T.INT8),  # wraps: 200 -> -56
        n("Cast", ["i"], ["i_u8"], name="i_u8", to=T.UINT8),  # -1 -> 255
        n("Cast", ["i_i8"], ["i8_f"], name="i8_f", to=T.FLOAT),
        n("Add", ["i", "k"], ["i_k"], name="add_k"),
        n("Greater", ["f", "zero"], ["pos"], name="gt"),
    ]
    s = [1, 8]
    outs = [("f_i8", T.INT8), ("f_u8", T.UINT8), ("f_i32", T.INT32), ("i_i8", T.INT8)]
    outs += [("i_u8", T.UINT8), ("i8_f", T.FLOAT), ("i_k", T.INT32), ("pos", T.BOOL)]
    weights = {"k": np.arange(8, dtype=np.int32) - 4, "zero": np.float32(0)}
    return model_of(nodes, [("f", T.FLOAT, s), ("i", T.INT32, s)], [(k, t, s) for k, t in outs], weights)


@needs_adapter
def test_casts_to_integers_round_toward_zero_wrap_and_saturate(tmp_path):
    f = np.array([[-2.75, -1.5, -0.5, 0.0, 0.5, 1.5, 2.75, 100.25]], np.float32)
    i = np.array([[-200, -129, -1, 0, 1, 127, 200, 1000]], np.int32)
    got, want, _ = run_both(casts, {"f": f, "i": i}, tmp_path)
    assert_codes_equal(got, want, ["f_i8", "f_i32", "i_i8", "i_u8", "i_k", "pos"])
    np.testing.assert_array_equal(got["i8_f"], want["i8_f"])
    np.testing.assert_array_equal(got["i_i8"][0], [56, 127, -1, 0, 1, 127, -56, -24])
    ok = f >= 0  # float -> uint8 of a negative value is undefined in ONNX (numpy wraps)
    np.testing.assert_array_equal(got["f_u8"][ok], want["f_u8"][ok])
    assert got["pos"].dtype == np.bool_
    # out of range is undefined in ONNX too: the kernels saturate, as the Metal target's do
    wide = {"f": np.array([[-1000.5, -129.0, 300.0, 7.9, -7.9, 127.9, -128.9, 1e9]], np.float32), "i": i}
    got = get_target("webgpu").load(get_target("webgpu").export(casts(), tmp_path / "wide", {})).run(wide)
    np.testing.assert_array_equal(got["f_i8"][0], np.array([-128, -128, 127, 7, -7, 127, -128, 127], np.int8))
    np.testing.assert_array_equal(got["f_u8"][0], np.array([0, 0, 255, 7, 0, 127, 0, 255], np.uint8))


def _refusal(model, precision="fp32") -> str:
    with pytest.raises(UnsupportedError) as info:
        get_target("webgpu").export(model, "/nonexistent/never-written", {"precision": precision})
    line = info.value.line()
    assert "\n" not in line
    return line


def test_an_integer_beyond_the_exact_range_is_refused_in_one_line_naming_the_value():
    def adding(big: int):
        return model_of(
            [n("Add", ["i", "k"], ["y"], name="add")],
            [("i", T.INT32, [1, 4])],
            [("y", T.INT32, [1, 4])],
            {"k": np.array([1, 2, 3, big], np.int32)},
        )

    line = _refusal(adding(2**24 + 1))
    assert f"k (integer constant holds {2**24 + 1})" in line and f"exactly up to {2**24}" in line
    line = _refusal(adding(5000), "fp16")
    assert "k (integer constant holds 5000)" in line and "--precision fp32" in line
    build_plan(prepare(adding(5000)), {"precision": "fp32"})  # exact in f32 storage


def test_integer_ops_that_floats_do_not_compute_exactly_are_refused_with_the_reason():
    div = model_of(
        [n("Div", ["i", "k"], ["y"], name="int_div")],
        [("i", T.INT32, [1, 4])],
        [("y", T.INT32, [1, 4])],
        {"k": np.array([3], np.int32)},
    )
    line = _refusal(div)
    assert "int_div" in line and "int32 values" in line and "not exact" in line
    wide = model_of(
        [
            n("QuantizeLinear", ["x", "s", "z"], ["q"], name="q16"),
            n("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        [("x", T.FLOAT, [1, 4])],
        [("y", T.FLOAT, [1, 4])],
        {"s": np.float32(0.1), "z": np.int16(0)},
    )
    # int16 codes are not exact in f16: a graph quantizing computed values plans in f32 (rule 5)
    plan = build_plan(prepare(wide), {"precision": "fp16"})
    assert plan.dtype == "float" and "QuantizeLinear" in plan.notes[0]
    dynamic = model_of(
        [n("QuantizeLinear", ["x", "s"], ["q"], name="qdyn"), n("DequantizeLinear", ["q", "s"], ["y"])],
        [("x", T.FLOAT, [1, 4]), ("s", T.FLOAT, [])],
        [("y", T.FLOAT, [1, 4])],
    )
    assert "scale or zero point not constant" in _refusal(dynamic)


def _astronaut_int8(model) -> np.ndarray:
    """The corpus's input for person_detect (bench/zoo.py's ``gray96``): scikit-image's astronaut
    in gray at 96 x 96, scaled to [-1, 1], then to the int8 codes of the model's input, whose
    import dequantizes them as (Cast(x) - zp) * s."""
    from PIL import Image
    from skimage import data

    gray = Image.fromarray(data.astronaut().mean(-1).astype(np.uint8)).resize((96, 96), Image.BILINEAR)
    real = np.asarray(gray, np.float32) / 127.5 - 1.0
    nodes = {nd.op_type: nd for nd in model.graph}
    zp = float(nodes["Sub"].inputs[1].const_value.numpy())
    s = float(nodes["Mul"].inputs[1].const_value.numpy())
    return np.clip(np.round(real / s + zp), -128, 127).astype(np.int8).reshape(1, 96, 96, 1)


@needs_adapter
def test_person_detect_at_fp16_stores_float_and_keeps_the_spec_codes(tmp_path, shared):
    """The real int8 person detector asked for at fp16: half storage lands its single output 2
    codes off the spec's (the dequantized activations and weights are not exact in half), so the
    plan stores f32 (rule 5), says so in the manifest and on the command line, and the codes are
    within one of ONNX Runtime's with graph optimizations off (the spec's Q/DQ; its fused int8
    kernels requantize in integers and are no oracle)."""
    import json

    import onnxruntime as ort
    from mconv import api
    from mconv.cli.app import app
    from typer.testing import CliRunner

    source = shared / "models" / "tflite" / "person_detect.tflite"
    model = api.load(source)
    x = _astronaut_int8(model)
    result = CliRunner().invoke(
        app, ["export", str(source), "--target", "webgpu", "--precision", "fp16", "-o", str(tmp_path / "b")]
    )
    assert result.exit_code == 0, result.output
    assert "float32 storage, not float16: 32 QuantizeLinear node(s)" in result.output
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["options"]["precision"] == "fp16" and "QuantizeLinear" in manifest["notes"][0]
    runner = get_target("webgpu").load(tmp_path / "b")
    assert runner.plan.dtype == "float"
    got = next(iter(runner.run({"input": x}).values()))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    api.save(model, tmp_path / "pd.onnx")
    want = ort.InferenceSession(str(tmp_path / "pd.onnx"), opts).run(None, {"input": x})[0]
    assert got.dtype == want.dtype == np.int8
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, (got, want)


def test_a_float_graph_at_fp16_stays_half_with_no_notes():
    relu = model_of(
        [n("Relu", ["x"], ["y"], name="relu")], [("x", T.FLOAT, [1, 4])], [("y", T.FLOAT, [1, 4])]
    )
    plan = build_plan(prepare(relu), {"precision": "fp16"})
    assert plan.dtype == "half" and plan.notes == [] and "notes" not in plan.as_dict()
    weights_only = model_of(  # a DequantizeLinear of constants folds: nothing computed is quantized
        [
            n("DequantizeLinear", ["w", "s"], ["wd"], name="dq_w"),
            n("MatMul", ["x", "wd"], ["y"], name="mm"),
        ],
        [("x", T.FLOAT, [1, 4])],
        [("y", T.FLOAT, [1, 2])],
        {"w": np.ones((4, 2), np.int8), "s": np.float32(0.5)},
    )
    assert build_plan(prepare(weights_only), {"precision": "fp16"}).dtype == "half"
