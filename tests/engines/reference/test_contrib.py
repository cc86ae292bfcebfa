"""com.microsoft contrib ops and ORT's quantized ops on the reference, each checked against ONNX
Runtime itself on one-node models (integer outputs exact unless the op's docstring names a tie
rule, float outputs to a tight relative tolerance)."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.engines.reference.ops import OpContext, lookup
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import _ortq  # noqa: E402

MS = "com.microsoft"
RNG = np.random.default_rng(42)


def _run_ort(op, inputs, attrs, n_out, domain, opset):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(names, inputs, strict=True)
        if n
    ]
    outs = [onnx.ValueInfoProto(name=f"out{k}") for k in range(n_out)]
    node = helper.make_node(op, names, [o.name for o in outs], domain=domain, **attrs)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=opsets, ir_version=10)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1  # ORT's quantized LSTM quantizes its state per thread's rows
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {n: x for n, x in zip(names, inputs, strict=True) if n})


def check(op, inputs, attrs=None, *, domain=MS, n_out=1, opset=21, rtol=1e-5, atol=1e-6, codes=0):
    """ORT and the reference agree: floats within ``rtol``/``atol`` (relative to the output's
    scale), integers exactly (or within ``codes`` quantization steps)."""
    attrs = attrs or {}
    want = _run_ort(op, inputs, attrs, n_out, domain, opset)
    opdef = lookup(op, domain)
    assert opdef is not None, f"{domain}::{op} not registered"
    got = opdef.forward(list(inputs), dict(attrs), OpContext(opset=opset, num_outputs=n_out))
    assert len(got) >= n_out
    for w, g in zip(want, got, strict=False):
        g = np.asarray(g)
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"{op}: shape {g.shape} != {w.shape}"
        if w.dtype.kind == "f":
            scale = float(np.abs(w).max()) or 1.0
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale, err_msg=op)
        else:
            diff = np.abs(g.astype(np.int64) - w.astype(np.int64))
            assert diff.max(initial=0) <= codes, f"{op}: integer outputs differ by {diff.max()}"


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def u8(*shape):
    return RNG.integers(0, 256, size=shape).astype(np.uint8)


def i8(*shape):
    return RNG.integers(-127, 128, size=shape).astype(np.int8)


def w7(*shape):
    """Weights of a u8 x s8 product that ORT computes exactly on every CPU (tests/_ortq.py)."""
    return _ortq.w7(RNG, *shape)


S = np.float32


# ----------------------------------------------------------------------------- default domain


def test_dynamic_quantize_linear_matches_ort():
    for x in (f32(4, 33), f32(2, 8, lo=0.5, hi=3.0), f32(3, 5, lo=-4.0, hi=-1.0)):
        check("DynamicQuantizeLinear", [x], domain="", n_out=3)


def test_matmul_and_conv_integer_match_ort():
    check("MatMulInteger", [u8(5, 16), w7(16, 7), np.array(131, np.uint8), np.array(0, np.int8)], domain="")
    check(
        "ConvInteger",
        [u8(1, 3, 9, 9), u8(4, 3, 3, 3), np.array(120, np.uint8), np.array(3, np.uint8)],
        {"pads": [1, 1, 1, 1]},
        domain="",
    )


def test_qlinear_conv_and_matmul_match_ort():
    x, w = u8(1, 4, 8, 8), w7(6, 4, 3, 3)
    bias = RNG.integers(-500, 500, 6).astype(np.int32)
    ins = [
        x,
        S(0.02),
        np.uint8(128),
        w,
        f32(6, lo=0.001, hi=0.01),
        np.zeros(6, np.int8),
        S(0.05),
        np.uint8(120),
        bias,
    ]
    check("QLinearConv", [np.asarray(v) for v in ins], {"pads": [1, 1, 1, 1]}, domain="")
    ins = [u8(3, 16), S(0.03), np.uint8(127), w7(16, 5), S(0.01), np.int8(0), S(0.1), np.uint8(128)]
    check("QLinearMatMul", [np.asarray(v) for v in ins], domain="")


# ----------------------------------------------------------------------------- dynamic (com.microsoft)


def test_dynamic_quantize_matmul_matches_ort():
    a, b = f32(2, 5, 24), w7(24, 12)
    check("DynamicQuantizeMatMul", [a, b, S(0.01).reshape(1), np.zeros(1, np.int8), f32(12)], rtol=1e-5)
    check("DynamicQuantizeMatMul", [a, b, f32(12, lo=0.001, hi=0.02), np.zeros(12, np.int8)], rtol=1e-5)


def test_matmul_integer_to_float_matches_ort():
    ins = [
        u8(4, 16),
        w7(16, 6),
        S(0.02),
        f32(6, lo=0.001, hi=0.01),
        np.uint8(120),
        np.zeros(6, np.int8),
        f32(6),
    ]
    check("MatMulIntegerToFloat", [np.asarray(v) for v in ins])


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_dynamic_quantize_lstm_matches_ort(direction):
    nd, T, B, I, H = (2 if direction == "bidirectional" else 1), 5, 3, 10, 8
    W, R = w7(nd, I, 4 * H), w7(nd, H, 4 * H)
    ins = [
        f32(T, B, I),
        W,
        R,
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
    check(
        "DynamicQuantizeLSTM", ins, {"hidden_size": H, "direction": direction}, n_out=3, rtol=1e-4, atol=1e-5
    )


# ----------------------------------------------------------------------------- QOperator


def _qbin(op):
    a, b = u8(2, 3, 8), u8(3, 8)
    return [a, S(0.02), np.uint8(128), b, S(0.03), np.uint8(100), S(0.05), np.uint8(110)]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_matches_ort(op):
    check(op, [np.asarray(v) for v in _qbin(op)])


def test_qlinear_unary_match_ort():
    x = np.arange(256, dtype=np.uint8).reshape(16, 16)
    ins = [x, S(0.05), np.uint8(128), S(1 / 256), np.uint8(0)]
    check("QLinearSigmoid", [np.asarray(v) for v in ins], codes=1)
    ins = [x, S(0.05), np.uint8(128), S(0.04), np.uint8(100)]
    check("QLinearLeakyRelu", [np.asarray(v) for v in ins], {"alpha": 0.1})


def _qsoftmax(dtype):
    """QLinearSoftmax as ORT's quantizer writes it: output scale 1/256, zero point at the
    type's minimum; a wide input scale so rows hold both ties and underflowing codes."""
    if dtype == np.uint8:
        return [u8(2, 3, 4, 8), S(0.06), np.uint8(128), S(1 / 256), np.uint8(0)]
    return [i8(2, 3, 4, 8), S(0.06), np.int8(0), S(1 / 256), np.int8(-128)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("opset", [12, 13])
def test_qlinear_softmax_matches_ort(dtype, axis, opset):
    ins = [np.asarray(v) for v in _qsoftmax(dtype)]
    check("QLinearSoftmax", ins, {"axis": axis, "opset": opset}, codes=1)


def test_qlinear_pools_match_ort():
    x = u8(1, 3, 8, 8)
    ins = [x, S(0.02), np.uint8(128), S(0.01), np.uint8(120)]
    check("QLinearGlobalAveragePool", [np.asarray(v) for v in ins], {"channels_last": 0}, codes=1)
    check(
        "QLinearAveragePool",
        [np.asarray(v) for v in ins],
        {"kernel_shape": [3, 3], "strides": [2, 2]},
        codes=1,
    )


def test_qlinear_concat_matches_ort():
    ins = [S(0.05), np.uint8(128), u8(2, 3), S(0.02), np.uint8(120), u8(2, 5), S(0.07), np.uint8(128)]
    check("QLinearConcat", [np.asarray(v) for v in ins], {"axis": 1})


@pytest.mark.parametrize("quantized_out", [True, False])
def test_qgemm_matches_ort(quantized_out):
    a, b = u8(4, 16), w7(6, 16)
    c = RNG.integers(-300, 300, 6).astype(np.int32)
    ins = [a, S(0.02), np.uint8(128), b, f32(6, lo=0.002, hi=0.01), np.zeros(6, np.int8), c]
    if quantized_out:
        ins += [S(0.1), np.uint8(128)]
    check("QGemm", [np.asarray(v) for v in ins], {"transB": 1, "alpha": 1.0})


# ----------------------------------------------------------------------------- float contrib ops


def test_gelu_family_matches_ort():
    x, b = f32(3, 7, 16, lo=-4, hi=4), f32(16)
    check("Gelu", [x])
    check("BiasGelu", [x, b])
    check("FastGelu", [x, b])
    check("FastGelu", [x])
    check("QuickGelu", [x], {"alpha": 1.702})


def test_bias_add_is_the_sum():
    """ORT has BiasAdd on CUDA only: its schema's sum, in float32."""
    x, b, skip = f32(2, 4, 16), f32(16), f32(2, 4, 16)
    (got,) = lookup("BiasAdd", MS).forward([x, b, skip], {}, OpContext())
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x + b + skip, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "act,params",
    [
        ("Relu", []),
        ("Tanh", []),
        ("Sigmoid", []),
        ("LeakyRelu", [0.2]),
        ("Clip", [-0.5, 0.5]),
        ("HardSigmoid", [0.2, 0.5]),
    ],
)
def test_fused_conv_matches_ort(act, params):
    attrs = {"activation": act, "pads": [1, 1, 1, 1]}
    if params:
        attrs["activation_params"] = params
    check("FusedConv", [f32(1, 3, 8, 8), f32(5, 3, 3, 3), f32(5)], attrs)


def test_fused_conv_with_sum_matches_ort():
    check(
        "FusedConv",
        [f32(1, 3, 8, 8), f32(5, 3, 3, 3), f32(5), f32(1, 5, 8, 8)],
        {"activation": "Relu", "pads": [1, 1, 1, 1]},
    )


def test_skip_layer_norms_match_ort():
    x, skip, g, b, bias = f32(2, 5, 32), f32(2, 5, 32), f32(32), f32(32), f32(32)
    check("SkipLayerNormalization", [x, skip, g, b, bias], {"epsilon": 1e-5}, n_out=4)
    check("SkipLayerNormalization", [x, skip, g], {"epsilon": 1e-5})
    check("SkipSimplifiedLayerNormalization", [x, skip, g, bias], {"epsilon": 1e-6}, n_out=4)
    check("SimplifiedLayerNormalization", [x, g], {"epsilon": 1e-6, "axis": -1}, domain="", n_out=2, opset=21)


@pytest.mark.parametrize("mask", ["none", "raw", "lengths"])
def test_attention_matches_ort(mask):
    B, S_, D, n = 2, 6, 16, 4
    ins = [f32(B, S_, D), f32(D, 3 * D, lo=-0.5, hi=0.5), f32(3 * D)]
    if mask == "raw":
        ins.append(np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32))
    elif mask == "lengths":
        ins.append(np.array([4, 6], np.int32))
    check("Attention", ins, {"num_heads": n}, rtol=1e-4)
    check("Attention", ins, {"num_heads": n, "unidirectional": 1}, rtol=1e-4)


def test_multi_head_attention_matches_ort():
    B, S_, L, D, n = 2, 5, 7, 16, 4
    q, k, v = f32(B, S_, D), f32(B, L, D), f32(B, L, D)
    check("MultiHeadAttention", [q, k, v], {"num_heads": n}, rtol=1e-4)
    check("MultiHeadAttention", [q, k, v, f32(3 * D)], {"num_heads": n}, rtol=1e-4)
    kpm = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)
    check("MultiHeadAttention", [q, k, v, None, kpm], {"num_heads": n}, rtol=1e-4)


# ----------------------------------------------------------------------------- n-bit weights


@pytest.mark.parametrize("K,block,zero", [(64, 32, False), (80, 32, True), (128, 16, True)])
def test_matmul_nbits_matches_ort(K, block, zero):
    N, bits = 12, 4
    kb = (K + block - 1) // block
    b = RNG.integers(0, 256, size=(N, kb, block // 2)).astype(np.uint8)
    scales = f32(N * kb, lo=0.01, hi=0.05)
    ins = [f32(3, K), b, scales]
    if zero:
        ins.append(RNG.integers(0, 256, size=(N, (kb + 1) // 2)).astype(np.uint8))
    check("MatMulNBits", ins, {"K": K, "N": N, "bits": bits, "block_size": block}, rtol=1e-5)


def test_matmul_nbits_8bit_matches_ort():
    K, N, block = 64, 8, 32
    b = RNG.integers(0, 256, size=(N, 2, block)).astype(np.uint8)
    check(
        "MatMulNBits",
        [f32(2, K), b, f32(N * 2, lo=0.001, hi=0.01)],
        {"K": K, "N": N, "bits": 8, "block_size": block},
    )


def test_gather_block_quantized_matches_ort():
    V, D, block = 20, 64, 32
    data = RNG.integers(0, 256, size=(V, D // 2)).astype(np.uint8)
    scales = f32(V, D // block, lo=0.01, hi=0.05)
    idx = np.array([[0, 3, 19], [7, 7, 2]], np.int64)
    check("GatherBlockQuantized", [data, idx, scales], {"block_size": block, "quantize_axis": 1, "bits": 4})
    zp = RNG.integers(0, 256, size=(V, D // block // 2)).astype(np.uint8)
    check(
        "GatherBlockQuantized", [data, idx, scales, zp], {"block_size": block, "quantize_axis": 1, "bits": 4}
    )


@pytest.mark.parametrize("kind", ["int4", "uint4"])
def test_gather_block_quantized_int4_matches_ort(kind):
    """int4 and uint4 codes (no numpy feed for ORT: the table is an initializer, as exports store
    it); both default to a zero point of 0 where packed uint8 codes default to 2^(bits-1)."""
    V, D, block = 20, 64, 32
    if kind == "int4":
        q4 = RNG.integers(-8, 8, size=(V, D)).astype(ml_dtypes.int4)
    else:
        q4 = RNG.integers(0, 16, size=(V, D)).astype(ml_dtypes.uint4)
    scales = f32(V, D // block, lo=0.01, hi=0.05)
    idx = np.array([[0, 3, 19], [7, 7, 2]], np.int64)
    attrs = {"block_size": block, "quantize_axis": 1}
    node = helper.make_node("GatherBlockQuantized", ["data", "idx", "scales"], ["out"], domain=MS, **attrs)
    proto = onnx.TensorProto.INT4 if kind == "int4" else onnx.TensorProto.UINT4
    table = helper.make_tensor("data", proto, [V, D], q4.astype(np.int8).ravel().tolist())
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, idx.shape),
            helper.make_tensor_value_info("scales", onnx.TensorProto.FLOAT, scales.shape),
        ],
        [onnx.ValueInfoProto(name="out")],
        initializer=[table],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)], ir_version=10
    )
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"idx": idx, "scales": scales}
    )
    (got,) = lookup("GatherBlockQuantized", MS).forward([q4, idx, scales], attrs, OpContext())
    np.testing.assert_allclose(got, want, rtol=1e-6)
