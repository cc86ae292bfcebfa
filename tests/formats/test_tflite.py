"""TFLite importer against the ai-edge-litert interpreter (the oracle), through ONNX Runtime and the
reference executor: small fixtures written here without TensorFlow, and every shared .tflite file."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ai_edge_litert.interpreter as litert
import onnxruntime as ort
from mconv.engines.reference.executor import Executor  # noqa: E402
from mconv.errors import UnsupportedError  # noqa: E402
from mconv.formats import detect, import_model  # noqa: E402
from mconv.formats.tflite.reader import load_tflite_bytes, tf_same_pads  # noqa: E402
from mconv.irio import to_proto  # noqa: E402
from tflite_builder import TflBuilder  # noqa: E402

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _fresh_rng():
    """Each test draws from its own generator, seeded the same, whatever ran before it."""
    global RNG
    RNG = np.random.default_rng(0)
    yield


def _litert(model: bytes | Path, feeds: list[np.ndarray]) -> list[np.ndarray]:
    kw = {"model_content": model} if isinstance(model, bytes) else {"model_path": str(model)}
    it = litert.Interpreter(**kw)
    it.allocate_tensors()
    it.reset_all_variables()  # the imported graph is stateless: compare with fresh variables
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def _both(model, feeds: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Outputs of the imported model on ONNX Runtime and on the reference executor."""
    proto = to_proto(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    named = {i.name: x for i, x in zip(sess.get_inputs(), feeds, strict=True)}
    got_ort = sess.run(None, named)
    ref = Executor(model).run(named)
    return got_ort, [np.asarray(v) for v in ref.values()]


def _check_float(data: bytes, feeds: list[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5):
    model = load_tflite_bytes(data, "fixture.tflite")
    expected = _litert(data, feeds)
    got_ort, got_ref = _both(model, feeds)
    for e, g, r in zip(expected, got_ort, got_ref, strict=True):
        assert g.shape == e.shape and r.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
        np.testing.assert_allclose(r, e, rtol=rtol, atol=atol)
    return model


def _f32(*shape) -> np.ndarray:
    return RNG.normal(0, 1, shape).astype(np.float32)


# ------------------------------------------------------------------------------ fixtures


def test_tf_same_padding_matches_tensorflow_formula():
    # TF: out = ceil(in/s); total = max((out-1)*s + k - in, 0); the smaller half goes first.
    assert tf_same_pads(5, 3, 2) == (1, 1)
    assert tf_same_pads(6, 3, 2) == (0, 1)
    assert tf_same_pads(7, 1, 1) == (0, 0)
    assert tf_same_pads(4, 3, 1, dilation=2) == (2, 2)


@pytest.mark.parametrize("padding", [0, 1])
def test_conv_depthwise_pools_match_litert_nhwc(padding):
    b = TflBuilder()
    x = b.tensor("x", [1, 7, 6, 3])
    w1 = b.const("conv/w", _f32(4, 3, 3, 3))
    b1 = b.const("conv/b", _f32(4))
    # output shapes as TF computes them (SAME: ceil(in/s); VALID: ceil((in-k+1)/s))
    y1 = b.tensor("conv", [1, 4, 3, 4] if padding == 0 else [1, 3, 2, 4])
    b.op(
        "CONV_2D",
        [x, w1, b1],
        [y1],
        "Conv2DOptions",
        Padding=padding,
        StrideW=2,
        StrideH=2,
        FusedActivationFunction=3,
        DilationWFactor=1,
        DilationHFactor=1,
    )
    h, w = b.tensors[y1]["shape"][1:3]
    wd = b.const("dw/w", _f32(1, 3, 3, 8))  # depth multiplier 2
    bd = b.const("dw/b", _f32(8))
    y2 = b.tensor("dw", [1, h, w, 8])
    b.op(
        "DEPTHWISE_CONV_2D",
        [y1, wd, bd],
        [y2],
        "DepthwiseConv2DOptions",
        Padding=0,
        StrideW=1,
        StrideH=1,
        DepthMultiplier=2,
        FusedActivationFunction=1,
        DilationWFactor=1,
        DilationHFactor=1,
    )
    h2, w2 = b.tensors[y2]["shape"][1:3]
    y3 = b.tensor("avg", [1, h2, w2, 8])
    b.op(
        "AVERAGE_POOL_2D",
        [y2],
        [y3],
        "Pool2DOptions",
        Padding=0,
        StrideW=1,
        StrideH=1,
        FilterWidth=2,
        FilterHeight=3,
    )
    y4 = b.tensor("max", [1, h2, w2, 8])
    b.op(
        "MAX_POOL_2D",
        [y2],
        [y4],
        "Pool2DOptions",
        Padding=0,
        StrideW=1,
        StrideH=1,
        FilterWidth=3,
        FilterHeight=2,
    )
    y5 = b.tensor("sum", [1, h2, w2, 8])
    b.op("ADD", [y3, y4], [y5], "AddOptions", FusedActivationFunction=0)
    data = b.build([x], [y5, y1])
    model = _check_float(data, [_f32(1, 7, 6, 3)])
    # Rule 3: the conv -> depthwise chain runs in NCHW without a transpose pair in between.
    ops = [n.op_type for n in model.graph]
    assert ops.count("Transpose") <= 4


def test_dilated_conv_and_transpose_conv_match_litert():
    b = TflBuilder()
    x = b.tensor("x", [1, 6, 6, 2])
    y1 = b.tensor("dil", [1, 6, 6, 3])
    b.op(
        "CONV_2D",
        [x, b.const("w", _f32(3, 3, 3, 2)), b.const("b", _f32(3))],
        [y1],
        "Conv2DOptions",
        Padding=0,
        StrideW=1,
        StrideH=1,
        DilationWFactor=2,
        DilationHFactor=2,
        FusedActivationFunction=0,
    )
    y2 = b.tensor("up", [1, 12, 11, 4])
    b.op(
        "TRANSPOSE_CONV",
        [b.const("oshape", np.array([1, 12, 11, 4], np.int32)), b.const("tw", _f32(4, 3, 3, 3)), y1],
        [y2],
        "TransposeConvOptions",
        Padding=0,
        StrideW=2,
        StrideH=2,
    )
    _check_float(b.build([x], [y2]), [_f32(1, 6, 6, 2)], rtol=1e-4, atol=1e-4)


def test_fully_connected_keep_num_dims_softmax_beta_and_activations_match_litert():
    b = TflBuilder()
    x = b.tensor("x", [2, 3, 5])
    fc = b.tensor("fc", [2, 3, 4])
    b.op(
        "FULLY_CONNECTED",
        [x, b.const("w", _f32(4, 5)), b.const("b", _f32(4))],
        [fc],
        "FullyConnectedOptions",
        KeepNumDims=True,
        FusedActivationFunction=2,
    )
    fc2 = b.tensor("fc2", [6, 4])
    b.op(
        "FULLY_CONNECTED",
        [fc, b.const("w2", _f32(4, 4)), -1],
        [fc2],
        "FullyConnectedOptions",
        KeepNumDims=False,
        FusedActivationFunction=3,
    )
    sm = b.tensor("sm", [6, 4])
    b.op("SOFTMAX", [fc2], [sm], "SoftmaxOptions", Beta=2.5)
    outs = []
    for code in ("LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1"):
        t = b.tensor(code.lower(), [6, 4])
        b.op(code, [fc2], [t])
        outs.append(t)
    z = b.tensor("mulsub", [6, 4])
    m = b.tensor("mul", [6, 4])
    b.op("MUL", [outs[0], b.const("k", _f32(4))], [m], "MulOptions", FusedActivationFunction=1)
    b.op("SUB", [m, outs[1]], [z], "SubOptions", FusedActivationFunction=3)
    data = b.build([x], [sm, *outs, z])
    _check_float(data, [3 * _f32(2, 3, 5)])


def test_shape_ops_reshape_concat_pad_mean_transpose_match_litert():
    b = TflBuilder()
    x = b.tensor("x", [1, 4, 3, 2])
    r = b.tensor("r", [1, 12, 2])
    b.op("RESHAPE", [x, b.const("shape", np.array([1, 12, 2], np.int32))], [r], "ReshapeOptions")
    c = b.tensor("cat", [1, 12, 4])
    b.op("CONCATENATION", [r, r], [c], "ConcatenationOptions", Axis=-1, FusedActivationFunction=0)
    p = b.tensor("pad", [1, 14, 5])
    b.op("PAD", [c, b.const("pads", np.array([[0, 0], [1, 1], [0, 1]], np.int32))], [p], "PadOptions")
    mn = b.tensor("mean", [1, 1, 5])
    b.op("MEAN", [p, b.const("axes", np.array([1], np.int32))], [mn], "ReducerOptions", KeepDims=True)
    tr = b.tensor("tr", [5, 14, 1])
    b.op("TRANSPOSE", [p, b.const("perm", np.array([2, 1, 0], np.int32))], [tr], "TransposeOptions")
    _check_float(b.build([x], [mn, tr]), [_f32(1, 4, 3, 2)])


def test_quantize_dequantize_pair_rounds_like_litert():
    b = TflBuilder()
    x = b.tensor("x", [1, 16])
    q = b.tensor("q", [1, 16], np.int8, scale=[0.05], zero_point=[3])
    b.op("QUANTIZE", [x], [q])
    d = b.tensor("d", [1, 16])
    b.op("DEQUANTIZE", [q], [d])
    data = b.build([x], [d])
    feeds = [np.linspace(-5, 5, 16, dtype=np.float32)[None]]
    expected = _litert(data, feeds)[0]
    for mode, tol in (("fake-quant", 1e-6), ("float", 0.05 / 2 + 1e-6)):
        model = load_tflite_bytes(data, "q.tflite", {"activations": mode})
        got_ort, got_ref = _both(model, feeds)
        np.testing.assert_allclose(got_ort[0], expected, atol=tol)
        np.testing.assert_allclose(got_ref[0], expected, atol=tol)


def _lstm_model(cell_clip: float, peephole: bool, time_major: bool = False) -> bytes:
    b = TflBuilder()
    T, B, I, H = 5, 2, 3, 4
    x = b.tensor("x", [T, B, I] if time_major else [B, T, I])
    ins = [x]
    ins += [b.const(f"wx{g}", 0.5 * _f32(H, I)) for g in "ifco"]
    ins += [b.const(f"wr{g}", 0.5 * _f32(H, H)) for g in "ifco"]
    ins += [b.const(f"p{g}", 0.3 * _f32(H)) if peephole else -1 for g in "ifo"]
    ins += [b.const(f"b{g}", _f32(H)) for g in "ifco"]
    ins += [-1, -1]
    ins += [b.tensor("h0", [B, H], variable=True), b.tensor("c0", [B, H], variable=True)]
    ins += [-1, -1, -1, -1]
    y = b.tensor("y", [T, B, H] if time_major else [B, T, H])
    b.op(
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        ins,
        [y],
        "UnidirectionalSequenceLSTMOptions",
        FusedActivationFunction=4,
        CellClip=cell_clip,
        ProjClip=0.0,
        TimeMajor=time_major,
    )
    return b.build([x], [y])


@pytest.mark.parametrize(
    "cell_clip,peephole,time_major", [(0.0, False, False), (0.0, True, True), (0.4, True, False)]
)
def test_lstm_matches_litert_as_onnx_lstm_or_unrolled_with_cell_clip(cell_clip, peephole, time_major):
    data = _lstm_model(cell_clip, peephole, time_major)
    model = _check_float(data, [2 * _f32(5, 2, 3) if time_major else 2 * _f32(2, 5, 3)])
    ops = {n.op_type for n in model.graph}
    # Rule 6: a plain LSTM maps to ONNX LSTM; a cell clip has no ONNX attribute, so it is unrolled.
    assert ("LSTM" in ops) == (cell_clip == 0.0)


def test_int8_per_channel_conv_is_dequantized_and_within_one_step_of_litert():
    b = TflBuilder()
    x = b.tensor("x", [1, 5, 5, 2], np.int8, scale=[0.02], zero_point=[-3])
    wq = RNG.integers(-127, 128, (3, 3, 3, 2)).astype(np.int8)
    wscale = np.array([0.01, 0.02, 0.005], np.float32)
    w = b.const("w", wq, scale=wscale, zero_point=[0, 0, 0], quantized_dimension=0)
    bias = b.const(
        "b", RNG.integers(-500, 500, 3).astype(np.int32), scale=wscale * 0.02, zero_point=[0, 0, 0]
    )
    y = b.tensor("y", [1, 5, 5, 3], np.int8, scale=[0.03], zero_point=[5])
    b.op(
        "CONV_2D",
        [x, w, bias],
        [y],
        "Conv2DOptions",
        Padding=0,
        StrideW=1,
        StrideH=1,
        FusedActivationFunction=1,
        DilationWFactor=1,
        DilationHFactor=1,
    )
    data = b.build([x], [y])
    feeds = [RNG.integers(-128, 128, (1, 5, 5, 2)).astype(np.int8)]
    expected = _litert(data, feeds)[0].astype(int)
    for mode in ("float", "fake-quant"):
        model = load_tflite_bytes(data, "q.tflite", {"activations": mode})
        got_ort, got_ref = _both(model, feeds)
        assert got_ort[0].dtype == np.int8  # io keeps TFLite's dtypes
        assert np.abs(got_ort[0].astype(int) - expected).max() <= 1
        assert np.abs(got_ref[0].astype(int) - expected).max() <= 1
    model = load_tflite_bytes(data, "q.tflite", {"io": "float"})
    got_ort, _ = _both(model, [((feeds[0].astype(np.float32) + 3) * 0.02).astype(np.float32)])
    # Float activations are not clamped to the int8 range: compare where litert did not saturate.
    inside = expected < 127
    assert inside.sum() > 20
    assert np.abs(got_ort[0] - (expected - 5) * 0.03)[inside].max() <= 0.03 + 1e-6


def test_unsupported_ops_are_all_named_in_one_error():
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    y = b.tensor("hashed", [1, 4])
    b.op("LSH_PROJECTION", [x], [y])
    z = b.tensor("svdf", [1, 4])
    b.op("SVDF", [y], [z])
    with pytest.raises(UnsupportedError) as err:
        load_tflite_bytes(b.build([x], [z]), "u.tflite")
    assert [n for n, _ in err.value.items] == ["hashed", "svdf"]
    assert "LSH_PROJECTION" in str(err.value) and "SVDF" in str(err.value)


# ------------------------------------------------------------------------------ shared models

# Tolerances per file. Float models: rtol 1e-4 / atol 1e-5. Quantized models: in output codes
# (steps of the output scale), (reference executor, ONNX Runtime): the imported graph rounds every
# activation with Q/DQ pairs, litert computes in integers. Measured on the reference executor:
# 0 codes for the two int8 CNN/MLP files and for dtln (its int8 LSTM is LiteRT's integer kernel).
# ONNX Runtime fuses the pairs into its u8s8 kernels, whose int16 sums saturate: person_detect
# drifts up to 5 codes there, so ORT is held to a looser bound (it is not the oracle).
SHARED = {
    "hello_world_float.tflite": None,
    "trained_lstm.tflite": None,
    "hello_world_int8.tflite": (1, 1),
    "person_detect.tflite": (1, 6),
    "dtln_noise_suppression.tflite": (0, 0),
}


def _oracle_bytes(path: Path) -> bytes:
    """The file as litert accepts it. person_detect's 1-D biases carry quantized_dimension 3
    (copied from their filters); litert 2.x refuses that, tflite-micro and mconv read the scales
    along dimension 0. Setting the field to 0 gives litert the same model."""
    import tflite

    buf = bytearray(path.read_bytes())
    g = tflite.Model.GetRootAsModel(buf, 0).Subgraphs(0)
    for i in range(g.TensorsLength()):
        t = g.Tensors(i)
        q = t.Quantization()
        if q is not None and t.ShapeLength() == 1 and q.ScaleLength() > 1 and q.QuantizedDimension() != 0:
            struct.pack_into("<i", buf, q._tab.Pos + q._tab.Offset(16), 0)
    return bytes(buf)


def _shared_feeds(data: bytes, seed: int) -> list[np.ndarray]:
    it = litert.Interpreter(model_content=data)
    rng = np.random.default_rng(seed)
    feeds = []
    for d in it.get_input_details():
        if d["dtype"] == np.float32:
            feeds.append(rng.uniform(-1, 1, d["shape"]).astype(np.float32))
        else:
            info = np.iinfo(d["dtype"])
            feeds.append(rng.integers(info.min, info.max + 1, d["shape"]).astype(d["dtype"]))
    return feeds


@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_tflite_model_matches_litert(shared, name):
    path = shared / "models" / "tflite" / name
    assert detect(path).name == "tflite"
    model = import_model([path])
    assert model.metadata_props["mconv.source_format"] == "tflite"
    data = _oracle_bytes(path)
    steps = SHARED[name]
    for seed in range(3):
        feeds = _shared_feeds(data, seed)
        expected = _litert(data, feeds)
        got_ort, got_ref = _both(model, feeds)
        for e, g, r in zip(expected, got_ort, got_ref, strict=True):
            assert g.dtype == e.dtype and g.shape == e.shape
            if steps is None:
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(r, e, rtol=1e-4, atol=1e-5)
            else:
                assert np.abs(r.astype(int) - e.astype(int)).max() <= steps[0]
                assert np.abs(g.astype(int) - e.astype(int)).max() <= steps[1]


def test_person_detect_bias_with_quantized_dimension_3_imports(shared):
    path = shared / "models" / "tflite" / "person_detect.tflite"
    model = import_model([path])
    names = list(model.graph.initializers)  # the weights keep their TFLite names
    assert any("Conv2d_0" in n for n in names)
