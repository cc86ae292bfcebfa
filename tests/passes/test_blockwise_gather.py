"""blockwise rule 6: embedding tables (a Gather's ``[vocab, dim]`` initializer) are quantized too,
as DequantizeLinear(block_size) + Gather, unless ``op_types`` leaves Gather out."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from mconv.cli.app import app
from mconv.engines.reference.executor import Executor
from mconv.passes.blockwise import quantize_rtn
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

VOCAB, DIM, HIDDEN = 512, 64, 128
IDS = np.array([[0, 5, 17, 511, 100, 3, 3, 42]], np.int64)


def _tiny_llama(path: Path, *, tied: bool = False, gather_axis: int | None = None) -> dict[str, np.ndarray]:
    """Gather from a ``[512, 64]`` token table, a residual MLP, logits. ``tied``: the logits are a
    Gemm(transB=1) on the token table itself. Outputs the embedded rows and the logits."""
    rng = np.random.default_rng(0)
    w = {
        "embed": (rng.standard_normal((VOCAB, DIM)) * 0.05).astype(np.float32),
        "up": (rng.standard_normal((DIM, HIDDEN)) * 0.1).astype(np.float32),
        "down": (rng.standard_normal((HIDDEN, DIM)) * 0.1).astype(np.float32),
    }
    gather = helper.make_node("Gather", ["embed", "ids"], ["h0"], name="embed_tokens")
    if gather_axis is not None:
        gather.attribute.append(helper.make_attribute("axis", gather_axis))
    nodes = [
        gather,
        helper.make_node("MatMul", ["h0", "up"], ["a"], name="up_proj"),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "down"], ["m"], name="down_proj"),
        helper.make_node("Add", ["h0", "m"], ["h1"]),
        helper.make_node("Reshape", ["h1", "flat"], ["h2"]),
    ]
    if tied:
        nodes.append(helper.make_node("Gemm", ["h2", "embed"], ["logits"], name="lm_head", transB=1))
    else:
        w["lm_head"] = (rng.standard_normal((DIM, VOCAB)) * 0.1).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["h2", "lm_head"], ["logits"], name="lm_head"))
    inits = [numpy_helper.from_array(a, n) for n, a in w.items()]
    inits.append(numpy_helper.from_array(np.array([-1, DIM], np.int64), "flat"))
    rows = [1, 8, DIM] if gather_axis is None else [VOCAB, 1, 8]
    g = helper.make_graph(
        nodes,
        "tiny_llama",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, rows),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [8, VOCAB]),
        ],
        inits,
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w


def _optimize(src: Path, out: Path, spec: str) -> None:
    r = CliRunner().invoke(app, ["optimize", str(src), "-o", str(out), "--passes", spec, "--json"])
    assert r.exit_code == 0, r.output


def _initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def _weight_bytes(path: Path) -> int:
    total = 0
    for t in onnx.load(str(path)).graph.initializer:
        a = numpy_helper.to_array(t)
        bits = 4 if a.dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)) else 8 * a.itemsize
        total += (a.size * bits + 7) // 8
    return total


def _assert_rounded(x: np.ndarray, approx: np.ndarray, codes: np.ndarray, step: np.ndarray) -> None:
    """Round to nearest (blockwise rule 1): a code inside [-8, 7] is within half a step of its
    value; one clipped at an edge (the block's largest magnitude sets code -8, so +7 may clip)
    within a whole step."""
    err = np.abs(approx - x)
    inside = (codes > -8) & (codes < 7)
    assert inside.mean() > 0.8
    assert np.all(err[inside] <= step[inside] * (0.5 + 1e-5) + 1e-7)
    assert np.all(err <= step * (1 + 1e-5) + 1e-7)


def _ort(path: Path) -> list[np.ndarray]:
    # no graph optimization: ORT's DequantizeLinear + MatMul fusion would quantize activations
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"ids": IDS})


def test_the_token_table_is_quantized_and_within_the_rounding_bound(tmp_path):
    src, out = tmp_path / "llama.onnx", tmp_path / "q.onnx"
    w = _tiny_llama(src)
    _optimize(src, out, "blockwise(bits=4,block=32)")

    inits = _initializers(out)
    floats = {n: a.size for n, a in inits.items() if a.dtype.kind == "f"}
    assert "embed" not in inits and inits["embed_q"].dtype == np.dtype(ml_dtypes.int4)
    assert inits["embed_scale"].shape == (VOCAB, DIM // 32)  # each token's row has its own scales
    assert max(floats.values()) <= VOCAB * DIM // 32  # only scales stay float
    assert _weight_bytes(src) / _weight_bytes(out) > 6.0  # int4 + float32 scales per 32: 6.4x

    model = onnx.load(str(out))
    dq = next(n for n in model.graph.node if n.output[0] == "embed")
    assert dq.op_type == "DequantizeLinear" and model.opset_import[0].version == 21
    assert {a.name: a.i for a in dq.attribute} == {"axis": 1, "block_size": 32}

    # each looked-up row is its codes times its block's scale, within half a step of the float row
    h0_ref = Executor(ir.load(out)).run({"ids": IDS})["h0"]
    scale = np.repeat(inits["embed_scale"], 32, axis=1)[IDS[0]]
    codes = inits["embed_q"].astype(np.float32)[IDS[0]]
    np.testing.assert_array_equal(h0_ref[0], codes * scale)
    _assert_rounded(w["embed"][IDS[0]], h0_ref[0], codes, np.abs(scale))
    assert not np.array_equal(h0_ref[0], w["embed"][IDS[0]])

    # ONNX Runtime computes the same quantized model as the reference
    h0_ort, logits_ort = _ort(out)
    logits_ref = Executor(ir.load(out)).run({"ids": IDS})["logits"]
    np.testing.assert_array_equal(h0_ort, h0_ref)
    np.testing.assert_allclose(logits_ort, logits_ref, rtol=1e-5, atol=1e-6)
    # and stays close to the float model
    logits_float = _ort(src)[1]
    cos = float((logits_float * logits_ort).sum() / np.linalg.norm(logits_float) / np.linalg.norm(logits_ort))
    assert cos > 0.97


def test_op_types_without_gather_leaves_the_table_float(tmp_path):
    src, out = tmp_path / "llama.onnx", tmp_path / "q.onnx"
    w = _tiny_llama(src)
    _optimize(src, out, "blockwise(bits=4,block=32,op_types=['MatMul','Gemm'])")
    inits = _initializers(out)
    np.testing.assert_array_equal(inits["embed"], w["embed"])
    assert "embed_q" not in inits and "up_q" in inits and "lm_head_q" in inits
    np.testing.assert_array_equal(_ort(out)[0], _ort(src)[0])  # the lookups are exact


def test_gather_alone_and_a_per_op_type_override(tmp_path):
    src = tmp_path / "llama.onnx"
    _tiny_llama(src)
    _optimize(src, tmp_path / "g.onnx", "blockwise(op_types=['Gather'])")
    inits = _initializers(tmp_path / "g.onnx")
    assert "embed_q" in inits and {"up", "down", "lm_head"} <= set(inits)
    _optimize(src, tmp_path / "s.onnx", "blockwise(op_type={'Gather': {'skip': True}})")
    inits = _initializers(tmp_path / "s.onnx")
    assert "embed" in inits and "up_q" in inits
    _optimize(src, tmp_path / "8.onnx", "blockwise(op_type={'Gather': {'bits': 8}})")
    inits = _initializers(tmp_path / "8.onnx")
    assert inits["embed_q"].dtype == np.int8 and inits["up_q"].dtype == np.dtype(ml_dtypes.int4)


def test_a_table_tied_to_the_output_layer_is_quantized_once(tmp_path):
    src, out = tmp_path / "tied.onnx", tmp_path / "q.onnx"
    _tiny_llama(src, tied=True)
    _optimize(src, out, "blockwise(bits=4,block=32)")
    model = onnx.load(str(out))
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "embed_q"]
    assert len(dqs) == 1 and dqs[0].output[0] == "embed"
    users = sorted(n.op_type for n in model.graph.node if "embed" in n.input)
    assert users == ["Gather", "Gemm"]
    assert sum(t.name.startswith("embed") for t in model.graph.initializer) == 2  # codes, scales
    h0_ort, logits_ort = _ort(out)
    ref = Executor(ir.load(out)).run({"ids": IDS})
    np.testing.assert_allclose(logits_ort, ref["logits"], rtol=1e-5, atol=1e-6)


def test_gather_along_another_axis_is_not_a_table(tmp_path):
    src, out = tmp_path / "axis1.onnx", tmp_path / "q.onnx"
    w = _tiny_llama(src, gather_axis=1)
    onnx.save(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Gather", ["embed", "ids"], ["h0"], axis=1)],
                "g",
                [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [VOCAB, 1, 8])],
                [numpy_helper.from_array(w["embed"], "embed")],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        ),
        src,
    )
    _optimize(src, out, "blockwise(bits=4,block=32)")
    np.testing.assert_array_equal(_initializers(out)["embed"], w["embed"])


def test_gptq_rounds_a_table_to_nearest(tmp_path):
    src, out = tmp_path / "llama.onnx", tmp_path / "q.onnx"
    _tiny_llama(src)
    data = tmp_path / "d.npz"
    np.savez(data, ids=IDS)
    spec = "blockwise(method='gptq')"
    r = CliRunner().invoke(
        app, ["optimize", str(src), "-o", str(out), "--passes", spec, "--data", str(data), "--json"]
    )
    assert r.exit_code == 0, r.output
    rows = {t["name"]: t for t in json.loads(r.stdout)["passes"][0]["tensors"]}
    assert rows["embed"]["method"] == "rtn" and rows["up"]["method"] == "gptq"
    _optimize(src, tmp_path / "rtn.onnx", "blockwise(method='rtn')")
    np.testing.assert_array_equal(
        _initializers(out)["embed_q"], _initializers(tmp_path / "rtn.onnx")["embed_q"]
    )


def test_a_streamed_checkpoint_quantizes_its_embedding_like_any_matrix(tmp_path):
    from mconv.drivers.weights_stream import dequantized
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    t = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, DIM)).astype(np.float32),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((HIDDEN, DIM)).astype(np.float32),
        "model.norm.weight": np.ones(DIM, np.float32),
    }
    save_file(t, str(tmp_path / "w.safetensors"))
    _optimize(tmp_path / "w.safetensors", tmp_path / "o.safetensors", "blockwise(bits=4,block=32)")
    got = load_file(str(tmp_path / "o.safetensors"))
    assert got["model.embed_tokens.weight.qweight"].shape == (VOCAB, DIM // 2)
    assert got["model.embed_tokens.weight.scales"].shape == (VOCAB, DIM // 32)
    assert "model.embed_tokens.weight" not in got
    d = dequantized(tmp_path / "o.safetensors")["model.embed_tokens.weight"]
    np.testing.assert_array_equal(d, quantize_rtn(t["model.embed_tokens.weight"], 4, 32).dequantize())


def test_a_float16_model_keeps_float16(tmp_path):
    """DequantizeLinear's output has its scale's type: a float16 table and weight get float16
    scales, so the Gather and the MatMul still read float16."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((VOCAB, DIM)) * 0.05).astype(np.float16)
    w = (rng.standard_normal((DIM, DIM)) * 0.1).astype(np.float16)
    g = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"]), helper.make_node("MatMul", ["h", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8, DIM])],
        [numpy_helper.from_array(table, "E"), numpy_helper.from_array(w, "W")],
    )
    src, out = tmp_path / "h.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    _optimize(src, out, "blockwise(bits=4,block=32)")
    inits = _initializers(out)
    assert inits["E_scale"].dtype == np.float16 and inits["W_scale"].dtype == np.float16
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"]).run(None, {"ids": IDS})[0]
    ref = Executor(ir.load(out)).run({"ids": IDS})["y"]
    assert got.dtype == ref.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2e-3, atol=2e-3)
