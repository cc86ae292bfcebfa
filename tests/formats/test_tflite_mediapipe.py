"""MediaPipe's custom TFLite ops (mediapipe/util/tflite/operations/*.cc), which LiteRT cannot run.

Oracle for Convolution2DTransposeBias: the file rewritten so that the custom op becomes LiteRT's
builtin TRANSPOSE_CONV with its bias input (same filter, bias, stride, and the output shape that
MediaPipe's Prepare computes), run by LiteRT; the rewrite itself is checked against torch's
conv_transpose2d (an independent implementation) with the C++ file's padding rule applied here.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ai_edge_litert.interpreter as litert  # noqa: E402
import onnxruntime as ort  # noqa: E402
from ai_edge_litert import schema_py_generated as schema  # noqa: E402
from mconv.errors import InputError  # noqa: E402
from mconv.formats.tflite import load_tflite_bytes  # noqa: E402
from mconv.irio import to_proto  # noqa: E402
from mconv.targets.reference.executor import Executor  # noqa: E402
from tflite_builder import TflBuilder  # noqa: E402

F32 = np.float32
MP_WHEEL = ("mediapipe", "0.10.14")
SELFIE = {
    "selfie_segmentation": "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
    "selfie_segmentation_landscape": "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd",
}


def _fetch_mp(member: str, sha: str) -> Path:
    from _wheels import WheelUnavailable, fetch_member

    try:
        return fetch_member(*MP_WHEEL, member, sha)
    except WheelUnavailable as exc:
        pytest.skip(f"PyPI cannot be reached: {exc}")


def _litert(data: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    it = litert.Interpreter(model_content=data)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def _imported(data: bytes, feeds: list[np.ndarray], path: str = "mp.tflite"):
    """Outputs of mconv's import on ONNX Runtime and on the reference executor."""
    model = load_tflite_bytes(data, path)
    proto = to_proto(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    named = {i.name: x for i, x in zip(sess.get_inputs(), feeds, strict=True)}
    got_ort = sess.run(None, named)
    ref = Executor(model).run(named)
    return got_ort, [np.asarray(v) for v in ref.values()]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ------------------------------------------------------------------------------ the rewrite


def rewrite_transpose_conv_bias(data: bytes) -> bytes:
    """Every Convolution2DTransposeBias of ``data`` as a builtin TRANSPOSE_CONV (version 3, which
    takes the bias as its 4th input): inputs (output_shape, filter, x, bias), TransposeConvOptions
    with the custom options' padding (TfLitePadding 1 = SAME -> schema SAME 0, else VALID 1) and
    strides. LiteRT's SAME padding for a given output shape is (in-1)*s + k - out in all, half
    before: with MediaPipe's output shape that is MediaPipe's own padding."""
    m = schema.ModelT.InitFromPackedBuf(data, 0)
    custom = {k for k, oc in enumerate(m.operatorCodes) if oc.customCode == b"Convolution2DTransposeBias"}
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.TRANSPOSE_CONV
    code.version = 3
    m.operatorCodes.append(code)
    tc = len(m.operatorCodes) - 1
    g = m.subgraphs[0]
    for op in g.operators:
        if op.opcodeIndex not in custom:
            continue
        padding, sw, sh = struct.unpack("<3i", bytes(bytearray(op.customOptions[:12])))
        x, w, b = op.inputs
        buf = schema.BufferT()
        buf.data = np.asarray(g.tensors[op.outputs[0]].shape, "<i4").view(np.uint8)
        m.buffers.append(buf)
        t = schema.TensorT()
        t.shape, t.type, t.buffer = [4], schema.TensorType.INT32, len(m.buffers) - 1
        t.name = b"output_shape_%d" % len(g.tensors)
        g.tensors.append(t)
        opts = schema.TransposeConvOptionsT()
        opts.padding = schema.Padding.SAME if padding == 1 else schema.Padding.VALID
        opts.strideW, opts.strideH = sw, sh
        op.opcodeIndex, op.inputs = tc, [len(g.tensors) - 1, w, x, b]
        op.builtinOptionsType = schema.BuiltinOptions.TransposeConvOptions
        op.builtinOptions = opts
        op.customOptions = None
    fb = flatbuffers.Builder(len(data) + 1024)
    fb.Finish(m.Pack(fb), file_identifier=b"TFL3")
    return bytes(fb.Output())


def _tconv_model(xs, cout: int, k: tuple[int, int], s: tuple[int, int], padding: int, seed: int):
    """One Convolution2DTransposeBias (the C++ file's output shape) and its arrays."""
    rng = np.random.default_rng(seed)
    n, h, w_, cin = xs
    kh, kw = k
    sh, sw = s
    th = max(0, kh - (h - 1) % sh - 1) if padding == 1 else 0
    tw = max(0, kw - (w_ - 1) % sw - 1) if padding == 1 else 0
    out = [n, sh * (h - 1) + kh - th, sw * (w_ - 1) + kw - tw, cout]
    w = rng.normal(0, 0.5, (cout, kh, kw, cin)).astype(F32)
    bias = rng.normal(0, 1, cout).astype(F32)
    b = TflBuilder()
    x = b.tensor("x", xs)
    wi, bi = b.const("filter", w), b.const("bias", bias)
    y = b.tensor("y", out)
    b.op("CUSTOM:Convolution2DTransposeBias", [x, wi, bi], [y], custom=struct.pack("<3i", padding, sw, sh))
    return b.build([x], [y]), w, bias, (th, tw), rng.normal(0, 1, xs).astype(F32)


CASES = [
    ((1, 4, 4, 3), 2, (2, 2), (2, 2), 1),  # the selfie models' shape of op
    ((1, 5, 4, 3), 4, (3, 3), (2, 2), 1),  # SAME: 2 rows padded (1 + 1), 1 column (0 before, 1 after)
    ((2, 3, 5, 2), 3, (4, 3), (3, 2), 1),
    ((1, 3, 3, 2), 2, (3, 2), (2, 1), 2),  # VALID
    ((1, 3, 3, 2), 2, (3, 3), (1, 1), 0),  # unknown padding: no padding, as the kernel does
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rewrite_to_builtin_transpose_conv_matches_torch(case):
    torch = pytest.importorskip("torch")
    xs, cout, k, s, padding = CASES[case]
    data, w, bias, (th, tw), x = _tconv_model(xs, cout, k, s, padding, seed=10 + case)
    got = _litert(rewrite_transpose_conv_bias(data), [x])[0]
    full = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x.transpose(0, 3, 1, 2)).double(),
        torch.from_numpy(w.transpose(3, 0, 1, 2)).double(),  # [Cin, Cout, KH, KW]
        torch.from_numpy(bias).double(),
        stride=s,
    ).numpy()
    oh, ow = got.shape[1], got.shape[2]
    want = full[:, :, th // 2 : th // 2 + oh, tw // 2 : tw // 2 + ow].transpose(0, 2, 3, 1)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_transpose_conv_bias_matches_litert_on_the_rewrite(case):
    xs, cout, k, s, padding = CASES[case]
    data, _w, _b, _pads, x = _tconv_model(xs, cout, k, s, padding, seed=20 + case)
    want = _litert(rewrite_transpose_conv_bias(data), [x])[0]
    got_ort, got_ref = _imported(data, [x])
    assert got_ort[0].shape == want.shape == got_ref[0].shape
    np.testing.assert_allclose(got_ort[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_ref[0], want, rtol=1e-5, atol=1e-5)


def _expose(data: bytes, code: bytes) -> bytes:
    """``data`` with the outputs of every ``code`` custom op added to the graph's outputs (the
    selfie models end in a sigmoid that saturates: the logits before it are what to compare)."""
    m = schema.ModelT.InitFromPackedBuf(data, 0)
    g = m.subgraphs[0]
    for op in g.operators:
        if m.operatorCodes[op.opcodeIndex].customCode == code:
            g.outputs = list(g.outputs) + [k for k in op.outputs if k not in list(g.outputs)]
    fb = flatbuffers.Builder(len(data) + 1024)
    fb.Finish(m.Pack(fb), file_identifier=b"TFL3")
    return bytes(fb.Output())


def _person(h: int, w: int) -> np.ndarray:
    """A photo of a person, RGB in [0, 1]: scikit-image's astronaut where scikit-image is installed
    (the corpus's picture), else a drawn head and shoulders in front of a wall and a window (which
    the segmenter does not take for a person, but its logits still vary over the frame)."""
    from PIL import Image, ImageDraw

    try:
        from skimage import data as samples
    except ImportError:
        samples = None
    if samples is not None:
        photo = Image.fromarray(samples.astronaut()).resize((w, h), Image.BILINEAR)
        return np.asarray(photo, dtype=F32)[None] / 255.0
    img = Image.new("RGB", (w, h), (180, 170, 150))
    d = ImageDraw.Draw(img)
    d.rectangle([int(0.05 * w), int(0.1 * h), int(0.3 * w), int(0.5 * h)], fill=(120, 170, 230))
    d.polygon([(0.25 * w, h), (0.32 * w, 0.68 * h), (0.68 * w, 0.68 * h), (0.75 * w, h)], fill=(40, 60, 120))
    d.rectangle([int(0.45 * w), int(0.55 * h), int(0.55 * w), int(0.7 * h)], fill=(220, 180, 150))
    d.ellipse([int(0.38 * w), int(0.18 * h), int(0.62 * w), int(0.6 * h)], fill=(225, 185, 155))
    d.chord([int(0.37 * w), int(0.14 * h), int(0.63 * w), int(0.4 * h)], 180, 360, fill=(60, 40, 25))
    return np.asarray(img, dtype=F32)[None] / 255.0


@pytest.mark.parametrize("name", sorted(SELFIE))
def test_selfie_segmentation_matches_litert_on_the_rewrite(name):
    """The real MediaPipe selfie segmenters (their last op but one is the custom transpose conv):
    the logits it makes and the mask after the sigmoid."""
    path = _fetch_mp(f"mediapipe/modules/selfie_segmentation/{name}.tflite", SELFIE[name])
    data = _expose(path.read_bytes(), b"Convolution2DTransposeBias")
    rewritten = rewrite_transpose_conv_bias(data)
    shape = litert.Interpreter(model_content=rewritten).get_input_details()[0]["shape"]
    feeds = [_person(int(shape[1]), int(shape[2]))]
    want = _litert(rewritten, feeds)
    got_ort, got_ref = _imported(data, feeds, str(path))
    assert len(want) == 2
    mask, logits = want
    assert logits.std() > 1.0 and mask.shape == logits.shape
    for e, g, r in zip(want, got_ort, got_ref, strict=True):
        assert g.shape == e.shape
        assert _cosine(g, e) >= 0.99999 and _cosine(r, e) >= 0.99999
        np.testing.assert_allclose(g, e, rtol=0, atol=2e-4 * max(1.0, float(np.abs(e).max())))


# ------------------------------------------------------------------------------ bad options


@pytest.mark.parametrize(
    "custom, what",
    [
        (b"\x01\x00\x00\x00\x02\x00", "needs 12 bytes"),
        (struct.pack("<3i", 1, 0, 2), "stride"),
        (struct.pack("<3i", 7, 2, 2), "padding 7"),
    ],
)
def test_transpose_conv_bias_bad_options_exit_2(tmp_path, custom, what):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    rng = np.random.default_rng(40)
    b = TflBuilder()
    x = b.tensor("x", [1, 4, 4, 3])
    wi = b.const("filter", rng.normal(size=(2, 2, 2, 3)).astype(F32))
    bi = b.const("bias", np.zeros(2, F32))
    y = b.tensor("y", [1, 8, 8, 2])
    b.op("CUSTOM:Convolution2DTransposeBias", [x, wi, bi], [y], custom=custom)
    src = tmp_path / "bad.tflite"
    src.write_bytes(b.build([x], [y]))
    with pytest.raises(InputError) as err:
        load_tflite_bytes(src.read_bytes(), str(src))
    assert what in str(err.value) and "bad.tflite" in err.value.line()
    res = CliRunner().invoke(app, ["import", str(src), "-o", str(tmp_path / "out.onnx")])
    assert res.exit_code == 2, res.output
    assert "bad.tflite" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out.onnx").exists()


def test_transpose_conv_bias_output_shape_that_disagrees_with_the_kernel_exit_2(tmp_path):
    rng = np.random.default_rng(41)
    b = TflBuilder()
    x = b.tensor("x", [1, 4, 4, 3])
    wi = b.const("filter", rng.normal(size=(2, 2, 2, 3)).astype(F32))
    bi = b.const("bias", np.zeros(2, F32))
    y = b.tensor("y", [1, 9, 8, 2])  # the kernel makes [1, 8, 8, 2]
    b.op("CUSTOM:Convolution2DTransposeBias", [x, wi, bi], [y], custom=struct.pack("<3i", 1, 2, 2))
    src = tmp_path / "shape.tflite"
    src.write_bytes(b.build([x], [y]))
    with pytest.raises(InputError) as err:
        load_tflite_bytes(src.read_bytes(), str(src))
    assert "the kernel computes [1, 8, 8, 2]" in str(err.value) and "shape.tflite" in err.value.line()
