"""ONNX Runtime's quantized ops (dynamic, QOperator) and the com.microsoft contrib ops on the metal
target (the C++ harness), each checked against ONNX Runtime itself on a one-node model: codes
within one step (exactly equal where the op is an exact integer product), floats within a
relative bound. The ops reach the kernels rewritten into standard ops
(:mod:`mconv.targets.metal.contrib`); DynamicQuantizeLSTM runs as its own kernel. ORT's own
quantized models (a dynamic CRNN, static QDQ and QOperator conv nets) export through the CLI
and pass ``mconv verify`` against the quantized model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.cli.app import app
from mconv.irio import from_proto
from mconv.targets import get_target
from onnx import helper, numpy_helper
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import _ortq  # noqa: E402

MS = "com.microsoft"
REFERENCE_TESTS = Path(__file__).resolve().parents[2] / "engines" / "reference"
RNG = np.random.default_rng(7)
S = np.float32


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def u8(*shape):
    return RNG.integers(0, 256, size=shape).astype(np.uint8)


def i8(*shape):
    return RNG.integers(-127, 128, size=shape).astype(np.int8)


def w7(*shape):
    """Weights of a u8 x s8 product that ORT computes exactly on every CPU (tests/_ortq.py)."""
    return _ortq.w7(RNG, *shape)


def one_node(op, inputs, feeds, attrs=None, *, domain=MS, n_out=1, opset=21):
    """A one-node ONNX model: inputs at the indices in ``feeds`` are graph inputs, the rest
    initializers (as ORT's quantizers write weights, scales and zero points)."""
    names, ins, inits = [], [], []
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        x = np.asarray(x)
        if i in feeds:
            ins.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
        else:
            inits.append(numpy_helper.from_array(x, name))
    present = range(n_out) if isinstance(n_out, int) else n_out  # indices of the outputs asked for
    outs = [onnx.ValueInfoProto(name=f"out{k}") for k in present]
    out_names = [f"out{k}" if k in present else "" for k in range(max(present) + 1)]
    node = helper.make_node(op, names, out_names, domain=domain, name=f"the_{op}", **(attrs or {}))
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    graph = helper.make_graph([node], "g", ins, outs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_ort(model, feeds):
    """ORT's outputs; the model's outputs then carry their types and shapes (as a converter's
    would), so that the target's runner returns them typed."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1  # ORT's quantized LSTM quantizes its state per thread's rows
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    for vi, w in zip(model.graph.output, outs, strict=True):
        vi.CopyFrom(helper.make_tensor_value_info(vi.name, helper.np_dtype_to_tensor_dtype(w.dtype), w.shape))
    return outs


def compare(got, want, *, rtol, codes, op):
    """Codes within ``codes`` steps, floats within ``rtol`` of the output's scale."""
    for w, g in zip(want, got, strict=True):
        g = np.asarray(g)
        assert g.shape == w.shape, f"{op}: shape {g.shape} != {w.shape}"
        if w.dtype.kind == "f":
            scale = float(np.abs(w).max()) or 1.0
            err = float(np.abs(g.astype(np.float64) - w).max()) / scale
            assert err <= rtol, f"{op}: relative error {err:.3g} over {rtol}"
        else:
            assert g.dtype == w.dtype, f"{op}: dtype {g.dtype} != {w.dtype}"
            diff = np.abs(g.astype(np.int64) - w.astype(np.int64)).max(initial=0)
            assert diff <= codes, f"{op}: codes differ by {diff}"


def _qbin():
    return [u8(2, 3, 8), S(0.02), np.uint8(128), u8(3, 8), S(0.03), np.uint8(100), S(0.05), np.uint8(110)]


def _qconv():
    bias = RNG.integers(-500, 500, 6).astype(np.int32)
    w_s = f32(6, lo=0.001, hi=0.01)
    return [
        u8(1, 4, 8, 8),
        S(0.02),
        np.uint8(128),
        w7(6, 4, 3, 3),
        w_s,
        np.zeros(6, np.int8),
        S(0.05),
        np.uint8(120),
        bias,
    ]


def _qgemm(quantized_out):
    c = RNG.integers(-300, 300, 6).astype(np.int32)
    ins = [u8(4, 16), S(0.02), np.uint8(128), w7(6, 16), f32(6, lo=0.002, hi=0.01), np.zeros(6, np.int8), c]
    return ins + ([S(0.1), np.uint8(128)] if quantized_out else [])


def _nbits(K, block, zero):
    N, kb = 12, (K + block - 1) // block
    ins = [
        f32(3, K),
        RNG.integers(0, 256, size=(N, kb, block // 2)).astype(np.uint8),
        f32(N * kb, lo=0.01, hi=0.05),
    ]
    if zero:
        ins.append(RNG.integers(0, 256, size=(N, (kb + 1) // 2)).astype(np.uint8))
    return ins, {"K": K, "N": N, "bits": 4, "block_size": block}


def _gbq(zero):
    V, D, block = 20, 64, 32
    ins = [
        RNG.integers(0, 256, size=(V, D // 2)).astype(np.uint8),
        np.array([[0, 3, 19], [7, 7, 2]], np.int64),
        f32(V, D // block, lo=0.01, hi=0.05),
    ]
    if zero:
        ins.append(RNG.integers(0, 256, size=(V, D // block // 2)).astype(np.uint8))
    return ins, {"block_size": block, "quantize_axis": 1, "bits": 4}


def _attention(mask, causal):
    B, S_, D = 2, 6, 16
    ins = [f32(B, S_, D), f32(D, 3 * D, lo=-0.5, hi=0.5), f32(3 * D)]
    if mask == "raw":
        ins.append(np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32))
    elif mask == "lengths":
        ins.append(np.array([4, 6], np.int32))
    return ins, {"num_heads": 4, **({"unidirectional": 1} if causal else {})}


def _lstm(direction):
    nd, T, B, I, H = (2 if direction == "bidirectional" else 1), 5, 3, 10, 8
    ins = [
        f32(T, B, I),
        w7(nd, I, 4 * H),
        w7(nd, H, 4 * H),
        f32(nd, 8 * H, lo=-0.3, hi=0.3),
        np.array([5, 3, 4], np.int32),
        f32(nd, B, H, lo=-0.5, hi=0.5),
        f32(nd, B, H, lo=-0.5, hi=0.5),
        None,
        f32(nd, lo=0.002, hi=0.01),
        np.zeros(nd, np.int8),
        f32(nd, 4 * H, lo=0.002, hi=0.01),  # per-column scales of R
        np.zeros((nd, 4 * H), np.int8),
    ]
    return ins, {"hidden_size": H, "direction": direction}


def _qsoftmax(dtype):
    if dtype == np.uint8:
        return [u8(2, 3, 4, 8), S(0.06), np.uint8(128), S(1 / 256), np.uint8(0)]
    return [i8(2, 3, 4, 8), S(0.06), np.int8(0), S(1 / 256), np.int8(-128)]


def _cases():
    """(id, op, domain, inputs, fed input indices, attrs, outputs, opset, rtol, codes)."""
    x = np.arange(256, dtype=np.uint8).reshape(16, 16)
    pool = [u8(1, 3, 8, 8), S(0.02), np.uint8(128), S(0.01), np.uint8(120)]
    g = f32(3, 7, 16, lo=-4, hi=4)
    norm = [f32(2, 5, 32), f32(2, 5, 32), f32(32), f32(32), f32(32)]
    c = [
        ("dql", "DynamicQuantizeLinear", "", [f32(4, 33)], {0}, {}, 3, 21, 1e-6, 1),
        ("dql-positive", "DynamicQuantizeLinear", "", [f32(2, 8, lo=0.5, hi=3.0)], {0}, {}, 3, 21, 1e-6, 1),
        (
            "matmul-integer",
            "MatMulInteger",
            "",
            [u8(5, 16), w7(16, 7), np.array(131, np.uint8), np.array(0, np.int8)],
            {0},
            {},
            1,
            21,
            0,
            0,
        ),
        (
            "matmul-integer-zp-fed",
            "MatMulInteger",
            "",
            [u8(5, 16), w7(16, 7), np.array(131, np.uint8)],
            {0, 2},
            {},
            1,
            21,
            0,
            0,
        ),
        (
            "conv-integer",
            "ConvInteger",
            "",
            [u8(1, 3, 9, 9), u8(4, 3, 3, 3), np.array(120, np.uint8), np.array(3, np.uint8)],
            {0},
            {"pads": [1, 1, 1, 1]},
            1,
            21,
            0,
            0,
        ),
        ("qlinear-conv", "QLinearConv", "", _qconv(), {0}, {"pads": [1, 1, 1, 1]}, 1, 21, 0, 1),
        (
            "qlinear-matmul",
            "QLinearMatMul",
            "",
            [u8(3, 16), S(0.03), np.uint8(127), w7(16, 5), S(0.01), np.int8(0), S(0.1), np.uint8(128)],
            {0},
            {},
            1,
            21,
            0,
            1,
        ),
        ("qgemm-q", "QGemm", MS, _qgemm(True), {0}, {"transB": 1, "alpha": 1.0}, 1, 21, 0, 1),
        ("qgemm-f", "QGemm", MS, _qgemm(False), {0}, {"transB": 1, "alpha": 1.0}, 1, 21, 1e-5, 0),
        ("qlinear-add", "QLinearAdd", MS, _qbin(), {0, 3}, {}, 1, 21, 0, 1),
        ("qlinear-mul", "QLinearMul", MS, _qbin(), {0, 3}, {}, 1, 21, 0, 1),
        (
            "qlinear-sigmoid",
            "QLinearSigmoid",
            MS,
            [x, S(0.05), np.uint8(128), S(1 / 256), np.uint8(0)],
            {0},
            {},
            1,
            21,
            0,
            1,
        ),
        (
            "qlinear-leaky",
            "QLinearLeakyRelu",
            MS,
            [x, S(0.05), np.uint8(128), S(0.04), np.uint8(100)],
            {0},
            {"alpha": 0.1},
            1,
            21,
            0,
            1,
        ),
        ("qlinear-gap", "QLinearGlobalAveragePool", MS, pool, {0}, {"channels_last": 0}, 1, 21, 0, 1),
        (
            "qlinear-avgpool",
            "QLinearAveragePool",
            MS,
            pool,
            {0},
            {"kernel_shape": [3, 3], "strides": [2, 2]},
            1,
            21,
            0,
            1,
        ),
        (
            "qlinear-concat",
            "QLinearConcat",
            MS,
            [S(0.05), np.uint8(128), u8(2, 3), S(0.02), np.uint8(120), u8(2, 5), S(0.07), np.uint8(128)],
            {2, 5},
            {"axis": 1},
            1,
            21,
            0,
            1,
        ),
        (
            "fused-conv-relu-sum",
            "FusedConv",
            MS,
            [f32(1, 3, 8, 8), f32(5, 3, 3, 3), f32(5), f32(1, 5, 8, 8)],
            {0, 3},
            {"activation": "Relu", "pads": [1, 1, 1, 1]},
            1,
            21,
            1e-5,
            0,
        ),
        (
            "fused-conv-clip",
            "FusedConv",
            MS,
            [f32(1, 3, 8, 8), f32(5, 3, 3, 3), f32(5)],
            {0},
            {"activation": "Clip", "activation_params": [-0.5, 0.5], "pads": [1, 1, 1, 1]},
            1,
            21,
            1e-5,
            0,
        ),
        (
            "fused-conv-hardsigmoid",
            "FusedConv",
            MS,
            [f32(1, 3, 8, 8), f32(5, 3, 3, 3), f32(5)],
            {0},
            {"activation": "HardSigmoid", "activation_params": [0.2, 0.5]},
            1,
            21,
            1e-5,
            0,
        ),
        ("gelu", "Gelu", MS, [g], {0}, {}, 1, 21, 1e-5, 0),
        ("bias-gelu", "BiasGelu", MS, [g, f32(16)], {0}, {}, 1, 21, 1e-5, 0),
        ("fast-gelu", "FastGelu", MS, [g, f32(16)], {0}, {}, 1, 21, 1e-5, 0),
        ("quick-gelu", "QuickGelu", MS, [g], {0}, {"alpha": 1.702}, 1, 21, 1e-5, 0),
        ("skip-ln", "SkipLayerNormalization", MS, norm, {0, 1}, {"epsilon": 1e-5}, 1, 21, 1e-5, 0),
        ("skip-ln-sum", "SkipLayerNormalization", MS, norm, {0, 1}, {"epsilon": 1e-5}, (0, 3), 21, 1e-5, 0),
        (
            "skip-ln-opset13",
            "SkipLayerNormalization",
            MS,
            norm[:3],
            {0, 1},
            {"epsilon": 1e-5},
            1,
            13,
            1e-5,
            0,
        ),
        (
            "skip-simplified-ln",
            "SkipSimplifiedLayerNormalization",
            MS,
            [norm[0], norm[1], norm[2], norm[4]],
            {0, 1},
            {"epsilon": 1e-6},
            1,
            21,
            1e-5,
            0,
        ),
        (
            "simplified-ln",
            "SimplifiedLayerNormalization",
            "",
            [norm[0], norm[2]],
            {0},
            {"epsilon": 1e-6, "axis": -1},
            1,
            21,
            1e-5,
            0,
        ),
    ]
    for mask in ("none", "raw", "lengths"):
        ins, attrs = _attention(mask, False)
        c.append((f"attention-{mask}", "Attention", MS, ins, {0, 3}, attrs, 1, 21, 1e-4, 0))
    ins, attrs = _attention("raw", True)
    c.append(("attention-causal", "Attention", MS, ins, {0, 3}, attrs, 1, 21, 1e-4, 0))
    for K, block, zero in [(64, 32, False), (80, 32, True)]:
        ins, attrs = _nbits(K, block, zero)
        c.append((f"matmul-nbits-{K}-{zero}", "MatMulNBits", MS, ins, {0}, attrs, 1, 21, 1e-5, 0))
    # QLinearSoftmax as ORT's quantizer writes it (output scale 1/256, zero point at the type's
    # minimum); a model of opset 12 has Softmax coerce to 2-D, so the single-axis case transposes
    softmax_layouts = [(-1, 12, 21), (-1, 13, 21), (1, 12, 21), (1, 13, 21), (1, 13, 12)]
    for dtype in (np.uint8, np.int8):
        for axis, sm_opset, model_opset in softmax_layouts:
            ins = _qsoftmax(dtype)
            attrs = {"axis": axis, "opset": sm_opset}
            cid = f"qlinear-softmax-{np.dtype(dtype).name}-axis{axis}-opset{sm_opset}-model{model_opset}"
            c.append((cid, "QLinearSoftmax", MS, ins, {0}, attrs, 1, model_opset, 0, 1))
    for zero in (False, True):
        ins, attrs = _gbq(zero)
        c.append(
            (f"gather-block-quantized-{zero}", "GatherBlockQuantized", MS, ins, {1}, attrs, 1, 21, 1e-6, 0)
        )
    return c


CASES = _cases()
LSTM_CASES = [("dqlstm-" + d, "DynamicQuantizeLSTM", MS, *_lstm(d)) for d in ("forward", "bidirectional")]


def check_case(target_name, case, tmp_path, precision="fp32"):
    """Export the one-node model to ``target_name`` and compare its outputs with ORT's."""
    cid, op, domain, inputs, feeds, attrs, n_out, opset, rtol, codes = case
    model = one_node(op, inputs, feeds, attrs, domain=domain, n_out=n_out, opset=opset)
    feed = {f"in{i}": np.asarray(inputs[i]) for i in sorted(feeds) if i < len(inputs)}
    want = run_ort(model, feed)
    target = get_target(target_name)
    runner = target.load(target.export(from_proto(model), tmp_path / cid, {"precision": precision}))
    out = runner.run(feed)
    got = [out[f"out{k}"] for k in (range(n_out) if isinstance(n_out, int) else n_out)]
    compare(got, want, rtol=rtol, codes=codes, op=cid)
    return runner


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_node_matches_ort(case, tmp_path):
    check_case("metal", case, tmp_path)


@pytest.mark.parametrize("case", LSTM_CASES, ids=[c[0] for c in LSTM_CASES])
def test_dynamic_quantize_lstm_matches_ort(case, tmp_path):
    """The kernel quantizes X and each step's state as ORT's one-thread kernel does: within the
    reference test's bound (a float LSTM of the dequantized weights is about 1% off ORT)."""
    cid, op, domain, inputs, attrs = case
    feeds = {0}
    check_case("metal", (cid, op, domain, inputs, feeds, attrs, 3, 21, 1e-4, 0), tmp_path, "fp16")


def test_bias_add_is_the_sum(tmp_path):
    """ORT runs BiasAdd on CUDA only: the schema's sum."""
    x, b, skip = f32(2, 4, 16), f32(16), f32(2, 4, 16)
    model = one_node("BiasAdd", [x, b, skip], {0, 2})
    runner = get_target("metal").load_model(from_proto(model), options={"precision": "fp32"})
    got = runner.run({"in0": x, "in2": skip})["out0"]
    np.testing.assert_allclose(got, x + b + skip, rtol=1e-6, atol=1e-6)


def test_fp16_request_runs_integer_products_in_float(tmp_path):
    """An int32 accumulator beyond 2^11 is not exact in half: the plan keeps float storage and
    says why, and the codes still equal ORT's."""
    case = next(c for c in CASES if c[0] == "matmul-integer")
    runner = check_case("metal", case, tmp_path, precision="fp16")
    assert runner.plan.dtype == "float"
    assert any("quantize at run time" in n for n in runner.plan.notes)


# ----------------------------------------------------------------------------- exactness edge


def _wide_matmul_integer(k: int):
    """MatMulInteger with A uint8 (zero point 0) and B all -128: every partial sum is a multiple
    of 32640 and the total reaches ``k * 32640``."""
    a = np.full((2, k), 255, np.uint8)
    a[1, ::3] = 0
    b = np.full((k, 3), -128, np.int8)
    return one_node("MatMulInteger", [a, b, np.array(0, np.uint8), np.array(0, np.int8)], {0}, domain=""), a


def bound_case() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """The MatMulInteger at the exact bound (k = 514: 16,776,960 is within 2^24), its input and
    its exact int32 result. ORT types the model's outputs, and its own result is checked where
    ORT is exact (without VNNI its sums saturate: tests/_ortq.py)."""
    k = 2**24 // (255 * 128)
    model, a = _wide_matmul_integer(k)
    (from_ort,) = run_ort(model, {"in0": a})
    want = _ortq.exact_matmul_integer(a, np.full((k, 3), -128, np.int8))
    if _ortq.ort_u8s8_is_exact():
        np.testing.assert_array_equal(from_ort, want)
    return model, a, want


def test_integer_product_at_the_exact_bound_is_exact(tmp_path):
    k = 2**24 // (255 * 128)
    model, a, want = bound_case()
    got = get_target("metal").load_model(from_proto(model)).run({"in0": a})["out0"]
    assert got.dtype == np.int32 and int(np.abs(want).max()) == k * 255 * 128
    np.testing.assert_array_equal(got, want)


def test_integer_product_over_the_bound_is_refused(tmp_path):
    model, _ = _wide_matmul_integer(2**24 // (255 * 128) + 1)
    path = tmp_path / "wide.onnx"
    onnx.save(model, path)
    out = tmp_path / "bundle"
    r = CliRunner().invoke(app, ["export", str(path), "--target", "metal", "-o", str(out), "-q"])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "the_MatMulInteger" in lines[0] and "2^24" in lines[0], lines[0]
    assert not out.exists()


# ----------------------------------------------------------------------------- ORT's quantized models


def _ort_quantized():
    sys.path.insert(0, str(REFERENCE_TESTS))
    import test_ort_quantized as quantized

    return quantized


MODELS = [("crnn", "dynamic"), ("dwcnn", "qdq"), ("dwcnn", "qop"), ("branchy", "qop")]


def export_and_verify(target_name, kind, mode, tmp_path, ops=None):
    """Quantize with ORT's tools, export through the CLI and ``mconv verify`` the bundle against
    the quantized model (the reference executor, itself checked against ORT)."""
    q = _ort_quantized()
    qpath = q._quantize(kind, mode, tmp_path)
    written = {n.op_type for n in onnx.load(qpath).graph.node}
    if ops:
        assert ops <= written, sorted(written)
    name, x = q._feeds(kind)
    data = tmp_path / "feeds.npz"
    np.savez(data, **{name: x[:8]})
    bundle = tmp_path / "bundle"
    runner = CliRunner()
    r = runner.invoke(
        app, ["export", str(qpath), "--target", target_name, "--batch", "8", "-o", str(bundle), "-q"]
    )
    assert r.exit_code == 0, r.output
    gates = ["--max-rel-l2", "0.02", "--min-cosine", "0.999", "--min-top1", "1.0"]
    r = runner.invoke(app, ["verify", str(qpath), str(bundle), "--data", str(data), *gates, "-q"])
    assert r.exit_code == 0, r.output
    # and against ORT itself, batch by batch
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    (want,) = ort.InferenceSession(str(qpath), so, providers=["CPUExecutionProvider"]).run(
        None, {name: x[:8]}
    )
    got = next(iter(get_target(target_name).load(bundle).run({name: x[:8]}).values()))
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 0.02 * scale, np.abs(got - want).max() / scale
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("kind,mode", MODELS, ids=[f"{k}-{m}" for k, m in MODELS])
def test_ort_quantized_model_exports_and_verifies(kind, mode, tmp_path):
    ops = {
        ("crnn", "dynamic"): {"DynamicQuantizeLSTM", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"},
        ("dwcnn", "qop"): {"QLinearConv", "QGemm"},
        ("branchy", "qop"): {"QLinearConv", "QLinearAdd", "QLinearSigmoid", "QLinearConcat"},
    }.get((kind, mode))
    export_and_verify("metal", kind, mode, tmp_path, ops)
