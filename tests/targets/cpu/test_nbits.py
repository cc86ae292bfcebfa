"""cpu target, option matmul_nbits: blockwise int4 DequantizeLinear + MatMul as ORT's MatMulNBits
(targets/cpu/nbits.py)."""

from __future__ import annotations

import json
import os

import mconv.api as api
import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.cli.app import app
from mconv.targets import get_target
from mconv.targets.cpu.nbits import pack_weight, rewrite
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _mlp(path, k: int, hidden: int, seed: int, batch=(2, 7)) -> str:
    """x[*batch, k] -> MatMul(W1) -> Gelu-ish (Tanh) -> MatMul(W2) -> y[*batch, k]."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((k, hidden)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((hidden, k)) * 0.05).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
            helper.make_node("Tanh", ["h"], ["a"], name="act"),
            helper.make_node("MatMul", ["a", "W2"], ["y"], name="fc2"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*batch, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*batch, k])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return str(path)


def _ort_plain(path: str, feeds: dict) -> np.ndarray:
    """ORT on the DequantizeLinear model with graph optimizations off: it would otherwise fuse
    DQ + MatMul itself, with int8 activations (its qdq_matmulnbits_accuracy_level default)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def _bundle_bytes(d) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def _unpack(packed: np.ndarray) -> np.ndarray:
    """Inverse of the nibble packing: low 4 bits first."""
    lo, hi = packed & 0x0F, packed >> 4
    return np.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("with_zero", [True, False])
def test_pack_weight_layout_decodes_to_the_same_weight(signed, with_zero):
    rng = np.random.default_rng(10 + 2 * signed + with_zero)
    k, n, block = 100, 6, 32  # ragged: 4 blocks, the last of 4 values
    nb = -(-k // block)
    lo, hi = (-8, 8) if signed else (0, 16)
    dt = ml_dtypes.int4 if signed else ml_dtypes.uint4
    codes = rng.integers(lo, hi, (k, n)).astype(np.int8).astype(dt)
    zero = rng.integers(lo, hi, (nb, n)).astype(np.int8).astype(dt) if with_zero else None
    scale = rng.uniform(0.01, 0.1, (nb, n)).astype(np.float32)
    packed, scales, zps = pack_weight(codes, scale, zero, block)
    assert packed.dtype == np.uint8 and packed.shape == (n, nb, block // 2)
    assert scales.shape == (n, nb)
    z_orig = zero.astype(np.int16) if with_zero else np.zeros((nb, n), np.int16)
    z = z_orig + (8 if signed else 0)  # unsigned codes: int4 shifts by 8
    if not signed or with_zero:
        assert zps is not None and zps.shape == (n, (nb + 1) // 2)
        z_got = _unpack(zps)[:, :nb].astype(np.int16)
    else:
        assert zps is None  # every zero point 8: the op's default
        z_got = np.full((n, nb), 8, np.int16)
    assert np.array_equal(z_got, z.T)
    q = _unpack(packed).reshape(n, nb * block)[:, :k].astype(np.float32)  # [N, K]
    got = (q - np.repeat(z_got, block, axis=1)[:, :k]) * np.repeat(scales, block, axis=1)[:, :k]
    want = (codes.astype(np.float32) - np.repeat(z_orig, block, axis=0)[:k]) * np.repeat(
        scale, block, axis=0
    )[:k]
    np.testing.assert_array_equal(got, want.T)


@pytest.mark.parametrize(
    "spec",
    [
        "blockwise(bits=4,block=32)",
        "blockwise(bits=4,block=64,sym=false)",
        "blockwise(bits=4,block=128,sym=false,method=hqq,iters=3)",
    ],
)
def test_matmul_nbits_bundle_matches_dequantize_linear(tmp_path, spec):
    src = _mlp(tmp_path / "m.onnx", 200, 384, seed=len(spec))  # K=200: ragged for every block size
    q = tmp_path / "q.onnx"
    api.optimize(src, passes=spec, output=q)
    out = tmp_path / "nbits"
    api.export(q, "cpu", out, matmul_nbits=True)
    proto = onnx.load(str(out / "model.onnx"))
    ops = [n.op_type for n in proto.graph.node]
    assert ops == ["MatMulNBits", "Tanh", "MatMulNBits"]
    assert {(o.domain, o.version) for o in proto.opset_import} >= {("com.microsoft", 1)}
    block = int(spec.split("block=")[1].split(",")[0].rstrip(")"))
    fc1 = proto.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in fc1.attribute}
    assert attrs == {"K": 200, "N": 384, "bits": 4, "block_size": block, "accuracy_level": 0}
    runner = get_target("cpu").load(out)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 7, 200)).astype(np.float32)
    got = runner.run({"x": x})["y"]
    want = _ort_plain(str(q), {"x": x})
    assert _cosine(got, want) >= 0.99999
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    # the packed bundle: about 4.x bits per weight, against the dense DQ model's int4 tensors
    dq = tmp_path / "dq"
    api.export(q, "cpu", dq, dense=True)
    weights = 2 * 200 * 384
    nbits_bytes, dq_bytes = _bundle_bytes(out), _bundle_bytes(dq)
    assert nbits_bytes * 8 / weights < 5.5
    assert nbits_bytes < 1.1 * dq_bytes


def _dq_model(
    tmp_path, codes, scale, zero, block, *, extra_output=False, consumer="MatMul"
) -> onnx.ModelProto:
    k, n = codes.shape
    inits = [numpy_helper.from_array(codes, "Wq"), numpy_helper.from_array(scale, "Ws")]
    dq_in = ["Wq", "Ws"]
    if zero is not None:
        inits.append(numpy_helper.from_array(zero, "Wz"))
        dq_in.append("Wz")
    nodes = [helper.make_node("DequantizeLinear", dq_in, ["W"], axis=0, block_size=block)]
    if consumer == "MatMul":
        nodes.append(helper.make_node("MatMul", ["x", "W"], ["y"]))
        y_shape = [3, n]
    else:
        nodes.append(helper.make_node("Transpose", ["W"], ["y"], perm=[1, 0]))
        y_shape = [n, k]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [k, n]))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _split(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list]:
    weights = [(t.name, numpy_helper.to_array(t)) for t in model.graph.initializer]
    del model.graph.initializer[:]
    return model, weights


@pytest.mark.parametrize("kind", ["uint4-no-zero", "int4-zero", "uint4-zero"])
def test_rewrite_zero_point_conventions_run_in_ort(tmp_path, kind):
    """uint4 without zero points means zero 0 (MatMulNBits' default is 8: written explicitly);
    an int4 zero point shifts by 8 with the codes."""
    rng = np.random.default_rng({"uint4-no-zero": 1, "int4-zero": 2, "uint4-zero": 3}[kind])
    k, n, block = 64, 16, 16
    nb = k // block
    signed = kind.startswith("int4")
    lo, hi = (-8, 8) if signed else (0, 16)
    dt = ml_dtypes.int4 if signed else ml_dtypes.uint4
    codes = rng.integers(lo, hi, (k, n)).astype(np.int8).astype(dt)
    zero = None if kind == "uint4-no-zero" else rng.integers(lo, hi, (nb, n)).astype(np.int8).astype(dt)
    scale = rng.uniform(0.01, 0.1, (nb, n)).astype(np.float32)
    model = _dq_model(tmp_path, codes, scale, zero, block)
    onnx.save(model, str(tmp_path / "dq.onnx"))
    x = rng.standard_normal((3, k)).astype(np.float32)
    want = _ort_plain(str(tmp_path / "dq.onnx"), {"x": x})
    proto, weights = _split(model)
    weights, count = rewrite(proto, weights)
    assert count == 1 and [n.op_type for n in proto.graph.node] == ["MatMulNBits"]
    assert len(proto.graph.node[0].input) == 4  # zero points present in all three conventions
    assert {name for name, _ in weights} == {
        "Wq.nbits",
        "Ws.nbits",
        ("Wz" if zero is not None else "Wq_zero") + ".nbits",
    }
    proto.graph.initializer.extend(numpy_helper.from_array(a, name) for name, a in weights)
    onnx.checker.check_model(proto)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("case", ["graph-output", "not-matmul", "block-8", "axis-1"])
def test_rewrite_leaves_other_patterns_alone(tmp_path, case):
    rng = np.random.default_rng(5)
    k, n = 64, 16
    block = 8 if case == "block-8" else 16
    codes = rng.integers(-8, 8, (k, n)).astype(np.int8).astype(ml_dtypes.int4)
    scale = rng.uniform(0.01, 0.1, (k // block, n)).astype(np.float32)
    model = _dq_model(
        tmp_path,
        codes,
        scale,
        None,
        block,
        extra_output=case == "graph-output",
        consumer="Transpose" if case == "not-matmul" else "MatMul",
    )
    if case == "axis-1":
        model.graph.node[0].attribute[0].i = 1
    before = model.SerializeToString()
    proto, weights = _split(model)
    snapshot = proto.SerializeToString()
    new, count = rewrite(proto, weights)
    assert count == 0 and new is weights
    assert proto.SerializeToString() == snapshot
    assert before  # the model was built


def test_cli_export_matmul_nbits_then_run_and_verify(tmp_path):
    src = _mlp(tmp_path / "m.onnx", 128, 256, seed=3, batch=(4,))
    q = tmp_path / "q.onnx"
    api.optimize(src, passes="blockwise(bits=4,block=32)", output=q)
    cli = CliRunner()
    out = tmp_path / "b"
    r = cli.invoke(app, ["export", str(q), "--target", "cpu", "--matmul-nbits", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["target"] == "cpu"
    assert json.loads((out / "manifest.json").read_text())["options"]["matmul_nbits"] is True
    assert [n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node].count("MatMulNBits") == 2
    rng = np.random.default_rng(11)
    np.save(tmp_path / "x.npy", rng.standard_normal((4, 128)).astype(np.float32))
    r = cli.invoke(
        app, ["run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npz")]
    )
    assert r.exit_code == 0, r.output
    y = np.load(tmp_path / "y.npz")["y"]
    want = _ort_plain(str(q), {"x": np.load(tmp_path / "x.npy")})
    assert _cosine(y, want) >= 0.99999
    assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max()  # cosine misses a scale error
    gates = ["--min-cosine", "0.9999", "--max-rel-l2", "1e-3"]
    r = cli.invoke(app, ["verify", str(q), str(out), "--samples", "8", *gates, "--json"])
    assert r.exit_code == 0, r.output


def test_int4_weights_without_nbits_stay_in_model_onnx(tmp_path):
    """weights.mcw has no int4 dtype: the DQ bundle keeps its codes in model.onnx (ONNX packs them)
    and runs; before, the export wrote a container its reader refused (exit 3)."""
    src = _mlp(tmp_path / "m.onnx", 128, 256, seed=4)
    q = tmp_path / "q.onnx"
    api.optimize(src, passes="blockwise(bits=4,block=32,sym=false)", output=q)
    out = tmp_path / "dq"
    api.export(q, "cpu", out)
    proto = onnx.load(str(out / "model.onnx"))
    stored = {t.name: t.data_type for t in proto.graph.initializer}
    assert stored == {n: TensorProto.UINT4 for n in ("W1_q", "W1_zero", "W2_q", "W2_zero")}
    assert "DequantizeLinear" in [n.op_type for n in proto.graph.node]
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 7, 128)).astype(np.float32)
    got = get_target("cpu").load(out).run({"x": x})["y"]
    so = ort.SessionOptions()
    sess = ort.InferenceSession(str(q), sess_options=so, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
