"""ONNX Runtime's quantized ops and com.microsoft contrib ops on the xla target: each op on a
one-node model against the reference executor (integer codes exactly, unless the reference's own
test allows one code against ORT for a float32 tie) and against ORT; then the models ORT's
quantization tools write (dynamic CRNN with DynamicQuantizeLSTM, static QDQ and QOperator conv
nets), exported with ``mconv export --target xla`` and checked with ``mconv verify``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax  # noqa: F401  (the test extra installs it)
import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.cli.app import app
from mconv.engines.reference.executor import Executor
from mconv.engines.reference.ops import OpContext
from mconv.engines.reference.ops import lookup as ref_lookup
from mconv.errors import UnsupportedError
from mconv.irio import load_onnx
from mconv.targets.xla import load_model
from onnx import helper, numpy_helper
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import _ortq  # noqa: E402

MS = "com.microsoft"
HERE = Path(__file__).resolve().parent
RNG = np.random.default_rng(7)
S = np.float32


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ort_quantized():
    return _load("_ref_ort_quantized", HERE.parent / "reference" / "test_ort_quantized.py")


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def u8(*shape):
    return RNG.integers(0, 256, size=shape).astype(np.uint8)


def i8(*shape):
    return RNG.integers(-127, 128, size=shape).astype(np.int8)


def w7(*shape):
    """Weights of a u8 x s8 product that ORT computes exactly on every CPU (tests/_ortq.py);
    :func:`test_full_range_weights_against_the_reference` keeps 8 bits."""
    return _ortq.w7(RNG, *shape)


def _model(op, inputs, attrs, n_out, domain, opset, inits):
    """A one-node model; inputs whose index is in ``inits`` are initializers (as exports store
    weights, scales and zero points), the others graph inputs."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    graph_inputs, initializers, feeds = [], [], {}
    for i, (n, x) in enumerate(zip(names, inputs, strict=True)):
        if not n:
            continue
        if i in inits:
            initializers.append(numpy_helper.from_array(np.asarray(x), n))
        else:
            dtype = helper.np_dtype_to_tensor_dtype(x.dtype)
            graph_inputs.append(helper.make_tensor_value_info(n, dtype, x.shape))
            feeds[n] = x
    outs = [onnx.ValueInfoProto(name=f"out{k}") for k in range(n_out)]
    node = helper.make_node(op, names, [o.name for o in outs], domain=domain, **attrs)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    graph = helper.make_graph([node], "g", graph_inputs, outs, initializer=initializers)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10), feeds


def _ort(proto, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1  # ORT's quantized LSTM quantizes its state per thread's rows
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def _xla(proto, feeds):
    runner = load_model(ir.serde.deserialize_model(proto))
    got = runner.run(feeds)
    return [np.asarray(got[n]) for n in runner.outputs]


def _agree(got, want, op, what, rtol, atol, codes):
    assert got.dtype == want.dtype, f"{op} vs {what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{op} vs {what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f":
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=f"{op} vs {what}")
    else:
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64)).max(initial=0)
        assert diff <= codes, f"{op} vs {what}: codes differ by {diff}"


def check(
    op,
    inputs,
    attrs=None,
    *,
    domain=MS,
    n_out=1,
    opset=21,
    inits=(),
    rtol=1e-5,
    atol=1e-6,
    codes=0,
    ref_codes=0,
    with_ort=True,
):
    """xla agrees with the reference (codes within ``ref_codes``) and with ORT (within ``codes``,
    the reference test's allowance); floats within ``rtol``/``atol`` of the output's scale."""
    attrs = attrs or {}
    inputs = [None if x is None else np.asarray(x) for x in inputs]
    proto, feeds = _model(op, inputs, attrs, n_out, domain, opset, set(inits))
    got = _xla(proto, feeds)
    ref = ref_lookup(op, domain)
    assert ref is not None
    want_ref = ref.forward(list(inputs), dict(attrs), OpContext(opset=opset, num_outputs=n_out))
    assert len(got) == n_out
    for g, w in zip(got, want_ref, strict=False):
        _agree(g, np.asarray(w), op, "reference", rtol, atol, ref_codes)
    if with_ort:
        for g, w in zip(got, _ort(proto, feeds), strict=True):
            _agree(g, w, op, "ORT", rtol, atol, codes)


# ----------------------------------------------------------------------------- default domain


def test_dynamic_quantize_linear():
    for x in (f32(4, 33), f32(2, 8, lo=0.5, hi=3.0), f32(3, 5, lo=-4.0, hi=-1.0)):
        check("DynamicQuantizeLinear", [x], domain="", n_out=3)


def test_matmul_and_conv_integer():
    check(
        "MatMulInteger",
        [u8(5, 16), w7(16, 7), np.array(131, np.uint8), np.array(0, np.int8)],
        domain="",
        inits=(1, 2, 3),
    )
    check(
        "ConvInteger",
        [u8(1, 3, 9, 9), u8(4, 3, 3, 3), np.array(120, np.uint8), np.array(3, np.uint8)],
        {"pads": [1, 1, 1, 1]},
        domain="",
        inits=(1, 3),
    )


def test_qlinear_conv_and_matmul():
    bias = RNG.integers(-500, 500, 6).astype(np.int32)
    ins = [u8(1, 4, 8, 8), S(0.02), np.uint8(128), w7(6, 4, 3, 3), f32(6, lo=0.001, hi=0.01)]
    ins += [np.zeros(6, np.int8), S(0.05), np.uint8(120), bias]
    check("QLinearConv", ins, {"pads": [1, 1, 1, 1]}, domain="", inits=range(1, 9), ref_codes=1)
    ins = [u8(3, 16), S(0.03), np.uint8(127), w7(16, 5), S(0.01), np.int8(0), S(0.1), np.uint8(128)]
    check("QLinearMatMul", ins, domain="", inits=range(1, 8), ref_codes=1)


def test_full_range_weights_against_the_reference():
    """8-bit weights (-127..127) where ORT on a CPU without VNNI cannot be the judge (:func:`w7`):
    xla against the reference executor alone, codes equal."""
    check("MatMulInteger", [u8(5, 16), i8(16, 7), np.array(131, np.uint8), np.array(0, np.int8)], domain="",
          inits=(1, 2, 3), with_ort=False)  # fmt: skip
    ins = [u8(3, 16), S(0.03), np.uint8(127), i8(16, 5), S(0.01), np.int8(0), S(0.1), np.uint8(128)]
    check("QLinearMatMul", ins, domain="", inits=range(1, 8), ref_codes=1, with_ort=False)
    c = RNG.integers(-300, 300, 6).astype(np.int32)
    ins = [u8(4, 16), S(0.02), np.uint8(128), i8(6, 16), f32(6, lo=0.002, hi=0.01), np.zeros(6, np.int8), c]
    check("QGemm", ins, {"transB": 1, "alpha": 1.0}, inits=range(1, len(ins)), with_ort=False)


# ----------------------------------------------------------------------------- dynamic (com.microsoft)


def test_dynamic_quantize_matmul():
    a, b = f32(2, 5, 24), w7(24, 12)
    check("DynamicQuantizeMatMul", [a, b, S(0.01).reshape(1), np.zeros(1, np.int8), f32(12)], inits=(1, 2, 3))
    check("DynamicQuantizeMatMul", [a, b, f32(12, lo=0.001, hi=0.02), np.zeros(12, np.int8)], inits=(1, 2, 3))


def test_matmul_integer_to_float():
    ins = [u8(4, 16), w7(16, 6), S(0.02), f32(6, lo=0.001, hi=0.01), np.uint8(120), np.zeros(6, np.int8)]
    check("MatMulIntegerToFloat", [*ins, f32(6)], inits=(1, 3, 5, 6))
    check("MatMulIntegerToFloat", ins)  # every input traced


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_dynamic_quantize_lstm(direction):
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
    attrs = {"hidden_size": H, "direction": direction}
    check("DynamicQuantizeLSTM", ins, attrs, n_out=3, inits=(1, 2, 3, 8, 9, 10, 11), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- QOperator


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(op):
    ins = [u8(2, 3, 8), S(0.02), np.uint8(128), u8(3, 8), S(0.03), np.uint8(100), S(0.05), np.uint8(110)]
    # codes=1 vs ORT: ORT multiplies by the ratios of the scales, the reference (and xla) divide
    check(op, ins, inits=(1, 2, 4, 5, 6, 7), codes=1)


@pytest.mark.parametrize("traced", [False, True])
def test_qlinear_tables(traced):
    """Scales as initializers: the reference's own table, codes equal; scales fed at run time:
    the table in jax (a float32 sigmoid one code off the reference's on a tie)."""
    inits = () if traced else (1, 2, 3, 4)
    x = np.arange(256, dtype=np.uint8).reshape(16, 16)
    sig = [x, S(0.05), np.uint8(128), S(1 / 256), np.uint8(0)]
    check("QLinearSigmoid", sig, inits=inits, codes=1, ref_codes=1 if traced else 0)
    leaky = [x, S(0.05), np.uint8(128), S(0.04), np.uint8(100)]
    check("QLinearLeakyRelu", leaky, {"alpha": 0.1}, inits=inits)
    xs = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    check("QLinearSoftsign", [xs, S(0.05), np.int8(0), S(1 / 127), np.int8(0)], inits=inits, with_ort=False)


def test_qlinear_pools():
    ins = [u8(1, 3, 8, 8), S(0.02), np.uint8(128), S(0.01), np.uint8(120)]
    check("QLinearGlobalAveragePool", ins, {"channels_last": 0}, inits=(1, 2, 3, 4), codes=1, ref_codes=1)
    pool = {"kernel_shape": [3, 3], "strides": [2, 2]}
    check("QLinearAveragePool", ins, pool, inits=(1, 2, 3, 4), codes=1, ref_codes=1)
    last = [u8(1, 8, 8, 3), *ins[1:]]
    check("QLinearGlobalAveragePool", last, {"channels_last": 1}, inits=(1, 2, 3, 4), codes=1, ref_codes=1)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("opset", [12, 13])
def test_qlinear_softmax(dtype, axis, opset):
    """ORT's quantizer's parameters (output scale 1/256, zero point at the type's minimum);
    float32 exponentials here, float64 in the reference: one code apart at most, on ties."""
    if dtype == np.uint8:
        ins = [u8(2, 3, 4, 8), S(0.06), np.uint8(128), S(1 / 256), np.uint8(0)]
    else:
        ins = [i8(2, 3, 4, 8), S(0.06), np.int8(0), S(1 / 256), np.int8(-128)]
    attrs = {"axis": axis, "opset": opset}
    check("QLinearSoftmax", ins, attrs, inits=(1, 2, 3, 4), codes=1, ref_codes=1)


def test_qlinear_concat():
    ins = [S(0.05), np.uint8(128), u8(2, 3), S(0.02), np.uint8(120), u8(2, 5), S(0.07), np.uint8(128)]
    check("QLinearConcat", ins, {"axis": 1}, inits=(0, 1, 3, 4, 6, 7))


@pytest.mark.parametrize("quantized_out", [True, False])
def test_qgemm(quantized_out):
    c = RNG.integers(-300, 300, 6).astype(np.int32)
    ins = [u8(4, 16), S(0.02), np.uint8(128), w7(6, 16), f32(6, lo=0.002, hi=0.01), np.zeros(6, np.int8), c]
    if quantized_out:
        ins += [S(0.1), np.uint8(128)]
    check("QGemm", ins, {"transB": 1, "alpha": 1.0}, inits=range(1, len(ins)))


# ----------------------------------------------------------------------------- float contrib ops


def test_gelu_family():
    x, b = f32(3, 7, 16, lo=-4, hi=4), f32(16)
    check("Gelu", [x])
    check("BiasGelu", [x, b], inits=(1,))
    check("FastGelu", [x, b], inits=(1,))
    check("FastGelu", [x])
    check("QuickGelu", [x], {"alpha": 1.702})


def test_bias_add():
    """ORT runs BiasAdd on CUDA only: the reference alone."""
    check("BiasAdd", [f32(2, 4, 16), f32(16), f32(2, 4, 16)], inits=(1,), with_ort=False)


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
def test_fused_conv(act, params):
    attrs = {"activation": act, "pads": [1, 1, 1, 1], **({"activation_params": params} if params else {})}
    check("FusedConv", [f32(1, 3, 8, 8), f32(5, 3, 3, 3), f32(5)], attrs, inits=(1, 2))


def test_fused_conv_with_sum():
    ins = [f32(1, 3, 8, 8), f32(5, 3, 3, 3), f32(5), f32(1, 5, 8, 8)]
    check("FusedConv", ins, {"activation": "Relu", "pads": [1, 1, 1, 1]}, inits=(1, 2))


def test_skip_and_simplified_layer_norms():
    x, skip, g, b, bias = f32(2, 5, 32), f32(2, 5, 32), f32(32), f32(32), f32(32)
    check(
        "SkipLayerNormalization",
        [x, skip, g, b, bias],
        {"epsilon": 1e-5},
        n_out=4,
        inits=(2, 3, 4),
        rtol=1e-4,
    )
    check("SkipLayerNormalization", [x, skip, g], {"epsilon": 1e-5}, inits=(2,), rtol=1e-4)
    ins = [x, skip, g, bias]
    check("SkipSimplifiedLayerNormalization", ins, {"epsilon": 1e-6}, n_out=4, inits=(2, 3), rtol=1e-4)
    attrs = {"epsilon": 1e-6, "axis": -1}
    check("SimplifiedLayerNormalization", [x, g], attrs, domain="", n_out=2, inits=(1,), rtol=1e-4)


@pytest.mark.parametrize("mask", ["none", "raw", "lengths"])
def test_attention(mask):
    B, S_, D, n = 2, 6, 16, 4
    ins = [f32(B, S_, D), f32(D, 3 * D, lo=-0.5, hi=0.5), f32(3 * D)]
    if mask == "raw":
        ins.append(np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32))
    elif mask == "lengths":
        ins.append(np.array([4, 6], np.int32))
    check("Attention", ins, {"num_heads": n}, inits=(1, 2), rtol=1e-4)
    check("Attention", ins, {"num_heads": n, "unidirectional": 1}, inits=(1, 2), rtol=1e-4)


def test_multi_head_attention():
    B, S_, L, D, n = 2, 5, 7, 16, 4
    q, k, v = f32(B, S_, D), f32(B, L, D), f32(B, L, D)
    check("MultiHeadAttention", [q, k, v], {"num_heads": n}, rtol=1e-4)
    check("MultiHeadAttention", [q, k, v, f32(3 * D)], {"num_heads": n}, inits=(3,), rtol=1e-4)
    kpm = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)
    check("MultiHeadAttention", [q, k, v, None, kpm], {"num_heads": n}, rtol=1e-4)


def test_attention_variants_outside_the_subset_are_refused_by_name():
    B, S_, D = 2, 6, 16
    ins = [f32(B, S_, D), f32(D, 3 * D), f32(3 * D), np.ones((B, 1, S_, S_), np.int32)]
    proto, _ = _model("Attention", ins, {"num_heads": 4}, 1, MS, 21, {1, 2})
    with pytest.raises(UnsupportedError, match="mask_index"):
        _xla(proto, {"in0": ins[0], "in3": ins[3]})


# ----------------------------------------------------------------------------- n-bit weights


@pytest.mark.parametrize("K,block,zero", [(64, 32, False), (80, 32, True), (128, 16, True)])
def test_matmul_nbits(K, block, zero):
    N, bits = 12, 4
    kb = (K + block - 1) // block
    ins = [
        f32(3, K),
        RNG.integers(0, 256, size=(N, kb, block // 2)).astype(np.uint8),
        f32(N * kb, lo=0.01, hi=0.05),
    ]
    if zero:
        ins.append(RNG.integers(0, 256, size=(N, (kb + 1) // 2)).astype(np.uint8))
    check("MatMulNBits", ins, {"K": K, "N": N, "bits": bits, "block_size": block}, inits=range(1, len(ins)))


def test_matmul_nbits_8bit():
    K, N, block = 64, 8, 32
    b = RNG.integers(0, 256, size=(N, 2, block)).astype(np.uint8)
    attrs = {"K": K, "N": N, "bits": 8, "block_size": block}
    check("MatMulNBits", [f32(2, K), b, f32(N * 2, lo=0.001, hi=0.01)], attrs, inits=(1, 2))


def test_gather_block_quantized():
    V, D, block = 20, 64, 32
    data = RNG.integers(0, 256, size=(V, D // 2)).astype(np.uint8)
    scales = f32(V, D // block, lo=0.01, hi=0.05)
    idx = np.array([[0, 3, 19], [7, -1, 2]], np.int64)
    attrs = {"block_size": block, "quantize_axis": 1, "bits": 4}
    check("GatherBlockQuantized", [data, idx, scales], attrs, inits=(0, 2))
    zp = RNG.integers(0, 256, size=(V, D // block // 2)).astype(np.uint8)
    check("GatherBlockQuantized", [data, idx, scales, zp], attrs, inits=(0, 2, 3))


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_gather_block_quantized_4bit_tables(dtype):
    """int4/uint4 tables (initializers, as exports store them) reach the rule widened to 8 bits;
    their zero point defaults to 0 in ORT (the reference takes 8 for uint4: ORT is the oracle)."""
    V, D, block = 20, 64, 32
    lo, hi = (-8, 8) if dtype == ml_dtypes.int4 else (0, 16)
    q4 = RNG.integers(lo, hi, size=(V, D)).astype(dtype)
    scales = f32(V, D // block, lo=0.01, hi=0.05)
    idx = np.array([[0, 3, 19], [7, 7, 2]], np.int64)
    attrs = {"block_size": block, "quantize_axis": 1}
    kind = onnx.TensorProto.INT4 if dtype == ml_dtypes.int4 else onnx.TensorProto.UINT4
    table = helper.make_tensor("data", kind, [V, D], q4.astype(np.int8).ravel().tolist())
    node = helper.make_node("GatherBlockQuantized", ["data", "idx", "scales"], ["out"], domain=MS, **attrs)
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
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    proto = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    feeds = {"idx": idx, "scales": scales}
    (got,) = _xla(proto, feeds)
    ref = ref_lookup("GatherBlockQuantized", MS)
    assert ref is not None
    if dtype == ml_dtypes.int4:
        (want,) = ref.forward([q4, idx, scales], attrs, OpContext())
        np.testing.assert_allclose(got, want, rtol=1e-6)
    (want_ort,) = _ort(proto, feeds)
    np.testing.assert_allclose(got, want_ort, rtol=1e-6)


# ----------------------------------------------------------------------------- ORT's quantized models


MODEL_CASES = _ort_quantized().CASES  # (kind, mode, ops the quantizer must write), the reference's


@pytest.mark.parametrize("kind,mode,ops", MODEL_CASES, ids=[f"{k}-{m}" for k, m, _ in MODEL_CASES])
def test_ort_quantized_model_exports_to_xla_and_verifies(kind, mode, ops, tmp_path):
    oq = _ort_quantized()
    qpath = oq._quantize(kind, mode, tmp_path)
    written = {n.op_type for n in onnx.load(qpath).graph.node}
    assert ops <= written, f"quantizer wrote {sorted(written)}"
    name, x = oq._feeds(kind)
    x = x[:32]
    runner = load_model(load_onnx(qpath))
    got = np.asarray(next(iter(runner.run({name: x}).values())))
    ref = next(iter(Executor(load_onnx(qpath)).run({name: x}).values()))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    (want,) = ort.InferenceSession(str(qpath), so, providers=["CPUExecutionProvider"]).run(None, {name: x})
    scale = float(np.abs(ref).max())
    assert got.shape == ref.shape and got.dtype == ref.dtype
    close = np.isclose(got, ref, rtol=1e-4, atol=1e-5 * scale)
    if mode == "dynamic":  # integer products scaled in float: equal up to summation order
        assert close.all(), np.abs(got - ref).max()
    else:
        # Requantized after every op: a float op between two QDQ pairs (float32 here, float64 in
        # the reference) lands a value within rounding of a tie one code apart, and it travels;
        # the share depends on the model's values (branchy-qdq: 35 of 40 with 7-bit weights), so
        # the bound is the reference test's against ORT, and no output is more than a few codes off.
        assert close.mean() >= 0.75, close.mean()
        assert np.abs(got - ref).max() <= 0.02 * scale, np.abs(got - ref).max() / scale
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.97

    data = tmp_path / "feeds.npz"
    np.savez(data, **{name: x})
    bundle = tmp_path / "bundle"
    cli = CliRunner()
    r = cli.invoke(app, ["export", str(qpath), "--target", "xla", "-o", str(bundle), "-q"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["verify", str(qpath), str(bundle), "--data", str(data), "-q"])
    assert r.exit_code == 0, r.output


def test_export_of_a_refused_variant_is_one_error_line_and_no_bundle(tmp_path):
    """An Attention with a past state (outside the lowered subset) named in one line, exit 2;
    the output is not created and the model is untouched."""
    B, S_, D = 1, 4, 8
    ins = [f32(B, S_, D), f32(D, 3 * D), f32(3 * D), None, f32(2, B, 2, 3, D // 2)]
    proto, _ = _model("Attention", ins, {"num_heads": 2}, 1, MS, 21, {1, 2})
    path = tmp_path / "attn_past.onnx"
    onnx.save(proto, path)
    before = path.read_bytes()
    bundle = tmp_path / "bundle"
    r = CliRunner().invoke(app, ["export", str(path), "--target", "xla", "-o", str(bundle), "-q"])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "past" in lines[0] and "Attention" in lines[0]
    assert not bundle.exists()
    assert path.read_bytes() == before
