"""Quantized, integer, comparison and shape-arithmetic ops on the metal target (issue 12 item 4):
QuantizeLinear/DequantizeLinear (TFLite int8 models import as Q/DQ pairs), Cast, comparisons,
logic and Where, integer tensors held as floats (magika's one-hot), deep Shape chains folded
before planning (Swin-T's windows) and sums of squares kept in float. Each graph is built here
with onnx.helper and run through the C++ harness against ONNX Runtime (integer outputs: equal
codes), at fp32 and fp16 storage; refusals are one line naming the node and the reason."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from mconv.errors import UnsupportedError
from mconv.targets.metal import TARGET
from mconv.targets.metal.plan import build_plan, prepare
from metal_models import assert_fp16_close, needs_cxx, run_ort
from onnx import TensorProto, helper, numpy_helper

pytestmark = needs_cxx
PRECISIONS = ["fp32", "fp16"]
n = helper.make_node


def model_of(nodes, inputs, outputs, weights=None, opset=17) -> ir.Model:
    """inputs/outputs: (name, TensorProto type, shape); weights: name -> array."""
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info(name, t, s) for name, t, s in inputs],
        [helper.make_tensor_value_info(name, t, s) for name, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (weights or {}).items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8
    return ir.serde.deserialize_model(proto)


def run_metal(model, feeds, tmp_path, precision):
    runner = TARGET.load(TARGET.export(model, tmp_path / f"b_{precision}", {"precision": precision}))
    return runner.run(feeds)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantize_dequantize_per_tensor_and_per_axis_give_ort_codes(tmp_path, precision):
    rng = np.random.default_rng(3)
    # multiples of 1/8 are exact in half storage too; with scale 0.25 many quotients are ties
    # (k + 0.5), which round half to even; large values saturate
    x = (rng.integers(-400, 400, (1, 3, 4, 5)) / 8).astype(np.float32)
    x[0, 0, 0, :3] = [0.125, 0.375, -0.125]  # quotients 0.5, 1.5, -0.5: ties
    w = {
        "s": np.float32(0.25),
        "z8": np.int8(3),
        "zu8": np.uint8(128),
        "sc": np.array([0.25, 0.5, 0.125], np.float32),
        "zc": np.array([-2, 0, 5], np.int8),
    }
    nodes = [
        n("QuantizeLinear", ["x", "s", "z8"], ["q8"]),
        n("DequantizeLinear", ["q8", "s", "z8"], ["dq8"]),
        n("QuantizeLinear", ["x", "s", "zu8"], ["qu8"]),
        n("DequantizeLinear", ["qu8", "s", "zu8"], ["dqu8"]),
        n("QuantizeLinear", ["x", "sc", "zc"], ["qc"], axis=1),
        n("DequantizeLinear", ["qc", "sc", "zc"], ["dqc"], axis=1),
    ]
    shape = [1, 3, 4, 5]
    model = model_of(
        nodes,
        [("x", TensorProto.FLOAT, shape)],
        [
            ("q8", TensorProto.INT8, shape),
            ("dq8", TensorProto.FLOAT, shape),
            ("qu8", TensorProto.UINT8, shape),
            ("dqu8", TensorProto.FLOAT, shape),
            ("qc", TensorProto.INT8, shape),
            ("dqc", TensorProto.FLOAT, shape),
        ],
        w,
    )
    got = run_metal(model, {"x": x}, tmp_path, precision)
    want = run_ort(model, {"x": x})
    assert np.abs(want["q8"].astype(int)).max() == 128 or want["q8"].max() == 127  # saturation is hit
    for name in ("q8", "qu8", "qc"):
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for name in ("dq8", "dqu8", "dqc"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_an_int8_model_in_and_out_matches_ort_codes(tmp_path, precision):
    # TFLite's int8 layout: int8 input -> Cast -> (q - zp) * s -> Gemm -> Relu -> Q -> DQ -> Q -> int8
    rng = np.random.default_rng(5)
    w = {
        "s_in": np.float32(0.05),
        "z_in": np.float32(-3),
        "wq": rng.integers(-127, 128, (6, 8)).astype(np.int8),
        "ws": np.float32(0.01),
        "wz": np.int8(0),
        "b": rng.standard_normal(6).astype(np.float32),
        "s_h": np.float32(0.02),
        "z_h": np.uint8(0),
        "s_out": np.float32(0.03),
        "z_out": np.int8(-10),
    }
    nodes = [
        n("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        n("Sub", ["xf", "z_in"], ["xc"]),
        n("Mul", ["xc", "s_in"], ["xd"]),
        n("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
        n("Gemm", ["xd", "wd", "b"], ["h"], transB=1),
        n("Relu", ["h"], ["hr"]),
        n("QuantizeLinear", ["hr", "s_h", "z_h"], ["hq"]),
        n("DequantizeLinear", ["hq", "s_h", "z_h"], ["hd"]),
        n("QuantizeLinear", ["hd", "s_out", "z_out"], ["y"]),
    ]
    model = model_of(nodes, [("x", TensorProto.INT8, [2, 8])], [("y", TensorProto.INT8, [2, 6])], w)
    x = rng.integers(-128, 128, (2, 8)).astype(np.int8)
    got = run_metal(model, {"x": x}, tmp_path, precision)["y"]
    want = run_ort(model, {"x": x})["y"]
    assert got.dtype == np.int8
    # fp16 storage rounds the Gemm's output before quantizing: at most one code off
    tol = 0 if precision == "fp32" else 1
    assert np.abs(got.astype(int) - want.astype(int)).max() <= tol


@pytest.mark.parametrize("precision", PRECISIONS)
def test_comparisons_logic_and_where_match_ort(tmp_path, precision):
    rng = np.random.default_rng(7)
    a = rng.integers(-3, 4, (2, 3, 4)).astype(np.float32)  # small integers: many ties
    b = rng.integers(-3, 4, (3, 1)).astype(np.float32)
    nodes = [
        n("Equal", ["a", "b"], ["eq"]),
        n("Less", ["a", "b"], ["lt"]),
        n("Greater", ["a", "b"], ["gt"]),
        n("LessOrEqual", ["a", "b"], ["le"]),
        n("GreaterOrEqual", ["a", "b"], ["ge"]),
        n("And", ["lt", "ge"], ["and_"]),
        n("Or", ["eq", "gt"], ["or_"]),
        n("Xor", ["le", "ge"], ["xor"]),
        n("Not", ["eq"], ["not_"]),
        n("Where", ["gt", "a", "b"], ["where"]),  # three broadcast operands
        n("Div", ["a", "b"], ["q"]),
        n("Equal", ["b", "zero"], ["b0"]),
        n("Where", ["b0", "zero", "q"], ["div_no_nan"]),  # basic-pitch's div_no_nan
    ]
    bools = ["eq", "lt", "gt", "le", "ge", "and_", "or_", "xor", "not_"]
    outs = [(k, TensorProto.BOOL, [2, 3, 4]) for k in bools]
    outs += [("where", TensorProto.FLOAT, [2, 3, 4]), ("div_no_nan", TensorProto.FLOAT, [2, 3, 4])]
    model = model_of(
        nodes,
        [("a", TensorProto.FLOAT, [2, 3, 4]), ("b", TensorProto.FLOAT, [3, 1])],
        outs,
        {"zero": np.float32(0)},
    )
    feeds = {"a": a, "b": b}
    got = run_metal(model, feeds, tmp_path, precision)
    want = run_ort(model, feeds)
    assert want["eq"].any() and not want["eq"].all()
    for k in bools:
        assert got[k].dtype == np.bool_, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    np.testing.assert_array_equal(got["where"], want["where"])
    assert np.isfinite(got["div_no_nan"]).all()
    if precision == "fp32":
        np.testing.assert_allclose(got["div_no_nan"], want["div_no_nan"], rtol=1e-6)
    else:
        assert_fp16_close(want["div_no_nan"], got["div_no_nan"])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_casts_round_toward_zero_wrap_and_keep_values_as_ort(tmp_path, precision):
    f = np.array([[-2.75, -1.5, -0.5, 0.0, 0.5, 1.5, 2.75, 100.25]], np.float32)
    i = np.array([[-200, -129, -1, 0, 1, 127, 200, 1000]], np.int32)
    nodes = [
        n("Cast", ["f"], ["f_i8"], to=TensorProto.INT8),
        n("Cast", ["f"], ["f_u8"], to=TensorProto.UINT8),
        n("Abs", ["f"], ["fa"]),
        n("Cast", ["fa"], ["fa_u8"], to=TensorProto.UINT8),
        n("Cast", ["f"], ["f_i32"], to=TensorProto.INT32),
        n("Cast", ["f"], ["f_b"], to=TensorProto.BOOL),
        n("Cast", ["i"], ["i_i8"], to=TensorProto.INT8),  # wraps: 200 -> -56
        n("Cast", ["i"], ["i_u8"], to=TensorProto.UINT8),  # -1 -> 255
        n("Cast", ["i"], ["i_i64"], to=TensorProto.INT64),
        n("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
        n("Cast", ["i_i8"], ["i8_u8"], to=TensorProto.UINT8),
        n("Cast", ["i_i8"], ["i8_i16"], to=TensorProto.INT16),
        n("Cast", ["f_b"], ["b_f"], to=TensorProto.FLOAT),
        n("CastLike", ["f", "i"], ["like_i32"]),
    ]
    s = [1, 8]
    T = TensorProto
    outs = [
        ("f_i8", T.INT8, s),
        ("fa_u8", T.UINT8, s),
        ("f_i32", T.INT32, s),
        ("f_b", T.BOOL, s),
        ("i_i8", T.INT8, s),
        ("i_u8", T.UINT8, s),
        ("i_i64", T.INT64, s),
        ("i_f", T.FLOAT, s),
        ("i8_u8", T.UINT8, s),
        ("i8_i16", T.INT16, s),
        ("b_f", T.FLOAT, s),
        ("like_i32", T.INT32, s),
    ]
    model = model_of(nodes, [("f", T.FLOAT, s), ("i", T.INT32, s)], outs)
    feeds = {"f": f, "i": i}
    if precision == "fp16":  # 1000 is beyond half's exact integers; every other value is exact
        feeds = {"f": f, "i": np.where(np.abs(i) > 2048, 7, i).astype(np.int32)}
    got = run_metal(model, feeds, tmp_path, precision)
    want = run_ort(model, feeds)
    for k, _, _ in outs:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    np.testing.assert_array_equal(got["i_i8"][0, :3], [56, 127, -1])


def test_float_to_int_out_of_range_saturates(tmp_path):
    # ONNX leaves an out-of-range float -> int cast undefined; the metal kernels saturate
    f = np.array([[-1000.5, -129.0, 300.0, 7.9]], np.float32)
    model = model_of(
        [n("Cast", ["f"], ["y"], to=TensorProto.INT8)],
        [("f", TensorProto.FLOAT, [1, 4])],
        [("y", TensorProto.INT8, [1, 4])],
    )
    got = run_metal(model, {"f": f}, tmp_path, "fp32")["y"]
    np.testing.assert_array_equal(got, np.array([[-128, -128, 127, 7]], np.int8))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_one_hot_from_int32_indices_as_magika_writes_it(tmp_path, precision):
    rng = np.random.default_rng(9)
    depth = 257
    w = {
        "shape": np.array([1, 6, depth], np.int64),
        "iota": np.arange(depth, dtype=np.int32).reshape(1, 1, depth),
        "axes": np.array([2], np.int64),
        "emb": rng.standard_normal((depth, 4)).astype(np.float32),
    }
    nodes = [
        n("Unsqueeze", ["tokens", "axes"], ["t3"]),
        n("Expand", ["t3", "shape"], ["tx"]),  # int32 values
        n("Equal", ["tx", "iota"], ["hot"]),
        n("Cast", ["hot"], ["hotf"], to=TensorProto.FLOAT),
        n("MatMul", ["hotf", "emb"], ["y"]),
    ]
    model = model_of(nodes, [("tokens", TensorProto.INT32, [1, 6])], [("y", TensorProto.FLOAT, [1, 6, 4])], w)
    feeds = {"tokens": np.array([[0, 5, 255, 256, 17, 5]], np.int32)}
    got = run_metal(model, feeds, tmp_path, precision)["y"]
    want = run_ort(model, feeds)["y"]
    if precision == "fp32":
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        assert_fp16_close(want, got)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_shape_chain_deeper_than_eight_rounds_folds_before_planning(tmp_path, precision):
    # each Reshape's target comes from the Shape of the previous Reshape's output, as Swin-T's
    # window partitions do: one round of shape inference makes one more Reshape static
    rng = np.random.default_rng(13)
    nodes, prev = [], "x"
    depth = 12
    for k in range(depth):
        # Range is beyond shape inference's data propagation: only fold computes it, a round each
        nodes += [
            n("Shape", [prev], [f"s{k}"]),
            n("Gather", [f"s{k}", "i0"], [f"d0_{k}"], axis=0),
            n("Range", ["zero", f"d0_{k}", "step"], [f"range{k}"]),
            n("Shape", [f"range{k}"], [f"len{k}"]),
            n("Gather", [f"s{k}", "i1"], [f"d1_{k}"], axis=0),
        ]
        if k % 2 == 0:
            nodes += [
                n("Div", [f"len{k}", "two"], [f"h{k}"]),
                n("Mul", [f"d1_{k}", "two"], [f"w{k}"]),
                n("Concat", [f"h{k}", f"w{k}"], [f"sh{k}"], axis=0),
            ]
        else:
            nodes.append(n("Concat", [f"len{k}", f"d1_{k}"], [f"sh{k}"], axis=0))
        nodes += [n("Reshape", [prev, f"sh{k}"], [f"r{k}"]), n("Add", [f"r{k}", "one"], [f"a{k}"])]
        prev = f"a{k}"
    w = {
        "i0": np.array(0, np.int64),
        "i1": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "zero": np.array(0, np.int64),
        "step": np.array(1, np.int64),
        "one": np.float32(0.5),
    }
    # symbolic dims in the model: only the input is static, so every shape is computed
    model = model_of(nodes, [("x", TensorProto.FLOAT, [64, 2])], [(prev, TensorProto.FLOAT, None)], w)
    prepared = prepare(model)
    assert {node.op_type for node in prepared.graph} <= {"Add", "Reshape"}
    x = rng.standard_normal((64, 2)).astype(np.float32)
    got = run_metal(model, {"x": x}, tmp_path, precision)[prev]
    want = run_ort(model, {"x": x})[prev]
    assert got.shape == want.shape == (1, 128)
    if precision == "fp32":
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        assert_fp16_close(want, got)


def test_a_sum_of_squares_is_one_kernel_and_keeps_small_values_in_half(tmp_path):
    # ReduceSum(x * x) becomes ReduceSumSquare(x): squares of 1e-4 underflow half storage
    rng = np.random.default_rng(17)
    x = (rng.uniform(0.5, 1.5, (1, 64, 8)) * 1e-4).astype(np.float32)
    nodes = [
        n("Mul", ["x", "x"], ["sq"]),
        n("ReduceSum", ["sq", "axes"], ["s"], keepdims=0),
        n("Sqrt", ["s"], ["y"]),
    ]
    model = model_of(
        nodes,
        [("x", TensorProto.FLOAT, [1, 64, 8])],
        [("y", TensorProto.FLOAT, [1, 8])],
        {"axes": np.array([1], np.int64)},
        opset=15,  # ReduceSumSquare's axes are an attribute before opset 18
    )
    plan = build_plan(prepare(model), {"precision": "fp16"})
    assert [layer.op for layer in plan.layers] == ["ReduceSumSquare+sqrt"]
    got = run_metal(model, {"x": x}, tmp_path, "fp16")["y"]
    want = run_ort(model, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-3)


def _refusal(model) -> str:
    with pytest.raises(UnsupportedError) as info:
        build_plan(prepare(model), {"precision": "fp16"})
    return str(info.value)


def test_integer_ops_that_floats_do_not_compute_exactly_are_refused_with_the_reason():
    model = model_of(
        [n("Div", ["i", "k"], ["y"])],
        [("i", TensorProto.INT64, [1, 4])],
        [("y", TensorProto.INT64, [1, 4])],
        {"k": np.array([3], np.int64)},
    )
    text = _refusal(model)
    assert "Div" in text and "int64 values" in text and "not exact" in text


def test_integer_weights_beyond_halfs_exact_range_are_refused_with_the_fix():
    model = model_of(
        [n("Add", ["i", "k"], ["y"])],
        [("i", TensorProto.INT32, [1, 4])],
        [("y", TensorProto.INT32, [1, 4])],
        {"k": np.array([1, 2, 3, 5000], np.int32)},
    )
    text = _refusal(model)
    assert "5000" in text and "--precision fp32" in text
    build_plan(prepare(model), {"precision": "fp32"})  # exact in float storage


def test_wide_quantizers_plan_in_float_and_dynamic_ones_are_refused_with_the_reason():
    T = TensorProto
    wide = model_of(
        [n("QuantizeLinear", ["x", "s", "z"], ["q"]), n("DequantizeLinear", ["q", "s", "z"], ["y"])],
        [("x", T.FLOAT, [1, 4])],
        [("y", T.FLOAT, [1, 4])],
        {"s": np.float32(0.1), "z": np.int16(0)},
    )
    # int16 codes are not exact in half: a graph quantizing computed values plans in float (rule 6)
    plan = build_plan(prepare(wide), {"precision": "fp16"})
    assert plan.dtype == "float" and "QuantizeLinear" in plan.notes[0]
    dynamic = model_of(
        [n("QuantizeLinear", ["x", "s"], ["q"]), n("DequantizeLinear", ["q", "s"], ["y"])],
        [("x", T.FLOAT, [1, 4]), ("s", T.FLOAT, [])],
        [("y", T.FLOAT, [1, 4])],
    )
    assert "scale or zero point not constant" in _refusal(dynamic)


def test_the_cli_refuses_an_integer_division_in_one_line_naming_the_file(tmp_path):
    import onnx
    from mconv.cli.app import app
    from typer.testing import CliRunner

    model = model_of(
        [n("Div", ["i", "k"], ["y"])],
        [("i", TensorProto.INT64, [1, 4])],
        [("y", TensorProto.INT64, [1, 4])],
        {"k": np.array([3], np.int64)},
    )
    path = tmp_path / "intdiv.onnx"
    onnx.save(ir.serde.serialize_model(model), path)
    result = CliRunner().invoke(app, ["export", str(path), "--target", "metal", "-o", str(tmp_path / "b")])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "not exact" in lines[0]


def test_a_scalar_scale_after_a_reduction_fuses_so_a_mean_of_squares_fits_half(tmp_path):
    # magika's decomposed LayerNorm: sum(x^2) reaches 4.6e5 (beyond half's 65504); its mean does not
    rng = np.random.default_rng(19)
    x = rng.uniform(20, 40, (1, 512)).astype(np.float32)
    nodes = [
        n("Mul", ["x", "x"], ["sq"]),
        n("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
        n("Mul", ["s", "inv_n"], ["mean"]),
        n("Add", ["mean", "eps"], ["m"]),
        n("Sqrt", ["m"], ["y"]),
    ]
    model = model_of(
        nodes,
        [("x", TensorProto.FLOAT, [1, 512])],
        [("y", TensorProto.FLOAT, [1, 1])],
        {"axes": np.array([1], np.int64), "inv_n": np.float32(1 / 512), "eps": np.float32(1e-6)},
    )
    plan = build_plan(prepare(model), {"precision": "fp16"})
    assert [layer.op for layer in plan.layers] == ["ReduceSumSquare+mul+add+sqrt"]
    got = run_metal(model, {"x": x}, tmp_path, "fp16")["y"]
    want = run_ort(model, {"x": x})["y"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-3)


def test_quantize_after_a_reshape_fuses_into_the_producer_and_quantizes_its_float_result(tmp_path):
    # TFLite's Gemm -> Reshape -> QuantizeLinear -> DequantizeLinear: one kernel quantizes the
    # float accumulator, not a half-rounded copy of it (integers here: the sums are exact)
    rng = np.random.default_rng(23)
    w = {
        "w": rng.integers(-4, 5, (16, 8)).astype(np.float32),
        "shape": np.array([1, 2, 8], np.int64),
        "s": np.float32(0.37),
        "z": np.int8(-5),
    }
    nodes = [
        n("Gemm", ["x", "w"], ["h"], transB=1),
        n("Reshape", ["h", "shape"], ["r"]),
        n("QuantizeLinear", ["r", "s", "z"], ["q"]),
        n("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    model = model_of(nodes, [("x", TensorProto.FLOAT, [1, 8])], [("y", TensorProto.FLOAT, [1, 2, 8])], w)
    plan = build_plan(prepare(model), {"precision": "fp16"})
    assert [layer.op for layer in plan.layers] == ["Gemm+quantize+dequantize"]
    x = rng.integers(-6, 7, (1, 8)).astype(np.float32)
    got = run_metal(model, {"x": x}, tmp_path, "fp32")["y"]
    want = run_ort(model, {"x": x})["y"]
    np.testing.assert_array_equal(got, want)
    codes = np.rint(run_metal(model, {"x": x}, tmp_path / "h", "fp16")["y"] / 0.37)
    np.testing.assert_array_equal(codes, np.rint(want / np.float32(0.37)))
