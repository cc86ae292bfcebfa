"""blockwise pass: int4/int8 blockwise RTN, HQQ-style refinement, GPTQ (passes/blockwise.py)."""

from __future__ import annotations

import mconv.passes as P
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.edit.weights import snr_db
from mconv.engines.reference.executor import Executor
from mconv.errors import InputError
from mconv.passes.blockwise import dequantize, quantize_gptq, quantize_hqq, quantize_rtn
from onnx import TensorProto, helper


def _matmul_model(w: np.ndarray, opset: int = 17, extra: str | None = None) -> ir.Model:
    k, n = w.shape
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    if extra:
        nodes.append(helper.make_node(extra, ["y"], ["z"], axes=[1]))
    out = "z" if extra else "y"
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4, n] if not extra else [4, 1])],
        [onnx.numpy_helper.from_array(w, "W")],
    )
    return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [32, 64, 128])
@pytest.mark.parametrize("sym", [True, False])
def test_rtn_codes_in_range_and_error_bounded(bits, block, sym):
    rng = np.random.default_rng(bits * 1000 + block + sym)
    w = rng.standard_normal((16, 300)).astype(np.float32)  # 300: a ragged last block
    q = quantize_rtn(w, bits, block, sym)
    assert q.scale.shape == (16, -(-300 // block))
    if sym:
        assert q.q.min() >= -(1 << (bits - 1)) and q.q.max() <= (1 << (bits - 1)) - 1
    else:
        assert q.q.min() >= 0 and q.q.max() <= (1 << bits) - 1
    # scales are float16-exact
    assert np.array_equal(q.scale.astype(np.float16).astype(np.float32), q.scale)
    d = q.dequantize()
    step = np.repeat(np.abs(q.scale), block, axis=1)[:, :300]
    # rounding to nearest: a code inside the range is within half a step of its value (float32
    # arithmetic aside); only a code clipped at an edge of the range, where the float16 scale or the
    # integer zero point shifts the grid, may be further, and then by less than a whole step
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if sym else (0, (1 << bits) - 1)
    codes = q.q.reshape(16, -1)[:, :300]
    inside = (codes > lo) & (codes < hi)
    err = np.abs(d - w)
    assert inside.mean() > 0.9
    assert np.all(err[inside] <= step[inside] * (0.5 + 1e-5) + 1e-7)
    assert np.all(err <= step * 1.0 + 1e-6)
    assert snr_db(w, d) > (15 if bits == 4 else 38)


def test_hqq_never_worse_than_rtn_per_block():
    rng = np.random.default_rng(1)
    w = (rng.standard_t(4, size=(64, 256)) * 0.02).astype(np.float32)
    for sym in (True, False):
        r, h = quantize_rtn(w, 4, 32, sym), quantize_hqq(w, 4, 32, sym)
        er = ((r.dequantize() - w) ** 2).reshape(64, 8, 32).sum(-1)
        eh = ((h.dequantize() - w) ** 2).reshape(64, 8, 32).sum(-1)
        assert np.all(eh <= er + 1e-12)
        assert eh.sum() < er.sum()


def test_gptq_beats_rtn_on_output_error():
    rng = np.random.default_rng(2)
    k = 256
    w = rng.standard_normal((64, k)).astype(np.float32)
    x = (rng.standard_normal((2048, k)) @ (np.eye(k) + 0.3 * rng.standard_normal((k, k)))).astype(np.float32)
    h = 2 * x.T.astype(np.float64) @ x / x.shape[0]

    def out_err(q):
        return float(((x @ (q.dequantize() - w).T) ** 2).sum())

    for sym in (True, False):
        assert out_err(quantize_gptq(w, h, 4, 32, sym)) < 0.8 * out_err(quantize_rtn(w, 4, 32, sym))


def test_dequantize_matches_blocks():
    rng = np.random.default_rng(3)
    q = rng.integers(0, 16, size=(3, 70)).astype(np.uint8)
    s = rng.random((3, 3)).astype(np.float32)
    z = rng.integers(0, 16, size=(3, 3)).astype(np.uint8)
    d = dequantize(q, s, z, 32)
    i, j = 2, 65
    assert d[i, j] == pytest.approx((float(q[i, j]) - z[i, 2]) * s[i, 2])


@pytest.mark.parametrize(
    "spec",
    [
        "blockwise(bits=4,block=32)",
        "blockwise(bits=4,block=64,sym=false,method=hqq)",
        "blockwise(bits=8,block=128)",
    ],
)
def test_pass_writes_dequantize_linear_block_size_that_ort_and_reference_run(spec, tmp_path):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((256, 48)).astype(np.float32)
    model = _matmul_model(w)
    model, reports = P.run_pipeline(model, P.parse_spec(spec), P.PassContext())
    row = reports[0].tensors[0]
    assert row["name"] == "W" and row["snr_db"] > 15 and row["bits_per_weight"] > row["bits"]
    node = next(n for n in model.graph if n.op_type == "DequantizeLinear")
    assert node.attributes["block_size"].value in (32, 64, 128)
    assert model.opset_imports[""] == 21
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    so = ort.SessionOptions()
    # ORT fuses DQ+MatMul into MatMulNBits and, by default, quantizes activations to int8 there
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    y_ort = ort.InferenceSession(proto.SerializeToString(), so).run(None, {"x": x})[0]
    y_ref = Executor(model).run({"x": x})["y"]
    np.testing.assert_allclose(y_ref, y_ort, rtol=1e-4, atol=1e-4)
    assert snr_db(x @ w, y_ref) > 15


def test_gptq_pass_needs_data_and_uses_it():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((128, 32)).astype(np.float32)
    with pytest.raises(InputError, match="--data"):
        P.run_pipeline(_matmul_model(w), P.parse_spec("blockwise(method=gptq)"), P.PassContext())
    data = {"x": rng.standard_normal((4, 128)).astype(np.float32)}
    _, reports = P.run_pipeline(
        _matmul_model(w), P.parse_spec("blockwise(method=gptq)"), P.PassContext(data=data)
    )
    assert "output_snr_db" in reports[0].tensors[0]


def test_refuses_opset_raise_that_changes_an_op():
    rng = np.random.default_rng(6)
    model = _matmul_model(rng.standard_normal((64, 32)).astype(np.float32), opset=13, extra="ReduceMean")
    with pytest.raises(InputError, match="ReduceMean"):
        P.run_pipeline(model, P.parse_spec("blockwise"), P.PassContext())


def test_bad_options_are_input_errors():
    rng = np.random.default_rng(7)
    for spec in ("blockwise(bits=3)", "blockwise(block=48)", "blockwise(method=magic)"):
        with pytest.raises(InputError):
            P.run_pipeline(
                _matmul_model(rng.standard_normal((64, 32)).astype(np.float32)),
                P.parse_spec(spec),
                P.PassContext(),
            )


def test_an_opset_18_graph_whose_later_ops_only_widen_types_is_raised_to_21():
    """What torch's dynamo exporter writes for a transformer (opset 18): Reshape, Transpose and
    Equal change at 19/21 only by new element types, Cast by ``saturate`` (float8 only): the pass
    raises the opset and the model means the same (checker, ORT against the reference)."""
    from mconv.passes.blockwise import _same_meaning

    assert _same_meaning("Reshape", 18, 21) and _same_meaning("Transpose", 18, 21)
    assert _same_meaning("Equal", 18, 21) and _same_meaning("Cast", 18, 21)
    assert not _same_meaning("ReduceMean", 13, 21)  # axes moved from an attribute to an input
    rng = np.random.default_rng(8)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"]),
        helper.make_node("Reshape", ["y", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Cast", ["t"], ["ti"], to=TensorProto.INT32),
        helper.make_node("Equal", ["ti", "zero"], ["eq"]),
        helper.make_node("Where", ["eq", "t", "t2"], ["z"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8, 4])],
        [
            onnx.numpy_helper.from_array(w, "W"),
            onnx.numpy_helper.from_array(np.array([4, 4, 8], np.int64), "shape"),
            onnx.numpy_helper.from_array(np.array(0, np.int32), "zero"),
            onnx.numpy_helper.from_array(np.full((4, 8, 4), 7.0, np.float32), "t2"),
        ],
    )
    model = ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    model, _ = P.run_pipeline(model, P.parse_spec("blockwise(bits=4, block=32)"), P.PassContext())
    assert model.opset_imports[""] == 21
    assert any(n.op_type == "DequantizeLinear" for n in model.graph)
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    y_ort = ort.InferenceSession(proto.SerializeToString(), so).run(None, {"x": x})[0]
    y_ref = Executor(model).run({"x": x})["z"]
    np.testing.assert_allclose(y_ref, y_ort, rtol=1e-4, atol=1e-4)
    assert (y_ref == 7.0).any() and (y_ref != 7.0).any()  # both branches of the Where taken
