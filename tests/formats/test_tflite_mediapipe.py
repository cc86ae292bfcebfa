"""MediaPipe's custom TFLite ops (mediapipe/util/tflite/operations/*.cc), which LiteRT's builtin
kernels lack (its XNNPACK delegate runs Convolution2DTransposeBias, and is checked too).

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
from mconv.engines.reference.executor import Executor  # noqa: E402
from mconv.errors import InputError  # noqa: E402
from mconv.formats.tflite.reader import load_tflite_bytes  # noqa: E402
from mconv.irio import to_proto  # noqa: E402
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
    if padding != 0:  # LiteRT's XNNPACK delegate runs the custom op itself (not padding 0)
        direct = _litert(data, [x])[0]
        np.testing.assert_allclose(got_ort[0], direct, rtol=1e-5, atol=1e-5)


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
    direct = _litert(data, feeds)  # the unmodified file on LiteRT's XNNPACK delegate
    for d, e in zip(direct, want, strict=True):
        assert _cosine(d, e) >= 0.99999
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


# ------------------------------------------------------------------------------ face mesh attention ops
# LiteRT has none of these kernels. Oracles: torch's grid_sample (an independent bilinear sampler)
# with the C++ file's coordinate rules applied here, and geometric invariants.


def _flex(d: dict) -> bytes:
    from flatbuffers import flexbuffers

    return bytes(flexbuffers.Dumps(d))


def _run(data: bytes, feeds: dict[str, np.ndarray], path: str = "mp.tflite") -> tuple[list, list]:
    model = load_tflite_bytes(data, path)
    proto = to_proto(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    ref = [np.asarray(v) for v in Executor(model).run(feeds).values()]
    return got, ref


def _bilinear_model(h: int, w: int, ch: int, oh: int, ow: int) -> bytes:
    b = TflBuilder()
    x, m = b.tensor("x", [1, h, w, ch]), b.tensor("m", [1, 4, 4])
    y = b.tensor("y", [1, oh, ow, ch])
    opts = _flex({"output_height": oh, "output_width": ow})
    b.op("CUSTOM:TransformTensorBilinear", [x, m], [y], custom=opts)
    return b.build([x, m], [y])


def _affine(angle: float, scale: tuple[float, float], shift: tuple[float, float]) -> np.ndarray:
    m = np.eye(4, dtype=F32)
    ca, sa = np.cos(angle), np.sin(angle)
    m[0, :2] = [ca * scale[0], -sa * scale[1]]
    m[1, :2] = [sa * scale[0], ca * scale[1]]
    m[0, 3], m[1, 3] = shift
    return m[None].astype(F32)


def test_transform_tensor_bilinear_identity_gives_the_input_back():
    rng = np.random.default_rng(80)
    x = rng.normal(size=(1, 6, 7, 3)).astype(F32)
    got, ref = _run(_bilinear_model(6, 7, 3, 6, 7), {"x": x, "m": np.eye(4, dtype=F32)[None]})
    np.testing.assert_allclose(got[0], x, atol=1e-6)
    np.testing.assert_allclose(ref[0], x, atol=1e-6)


@pytest.mark.parametrize("seed", [81, 82, 83])
def test_transform_tensor_bilinear_matches_torch_grid_sample(seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    h, w, ch, oh, ow = 9, 11, 3, 7, 8
    x = rng.normal(size=(1, h, w, ch)).astype(F32)
    m = _affine(
        rng.uniform(-1, 1),
        (rng.uniform(0.8, 1.6), rng.uniform(0.8, 1.6)),
        (rng.uniform(-2, 4), rng.uniform(-2, 4)),
    )
    got, ref = _run(_bilinear_model(h, w, ch, oh, ow), {"x": x, "m": m})
    # The C++ file's rules: output pixel (i, j) reads input point T * (j, i, 0, 1) after the
    # align-corners correction T -> S (T A) (A adds 0.5, S subtracts it); a point outside the
    # pixel centres' box [0, W-1] x [0, H-1] gives 0.
    a = np.eye(4)
    a[:2, 3] = 0.5
    s = np.eye(4)
    s[:2, 3] = -0.5
    t = s @ m[0].astype(np.float64) @ a
    jj, ii = np.meshgrid(np.arange(ow), np.arange(oh))
    tx, ty = t[0, 0] * jj + t[0, 1] * ii + t[0, 3], t[1, 0] * jj + t[1, 1] * ii + t[1, 3]
    inside = (tx >= 0) & (tx <= w - 1) & (ty >= 0) & (ty <= h - 1)
    assert 0 < inside.sum() < inside.size  # some points in, some out
    grid = np.stack([2 * tx / (w - 1) - 1, 2 * ty / (h - 1) - 1], -1)[None]
    want = torch.nn.functional.grid_sample(
        torch.from_numpy(x.transpose(0, 3, 1, 2)).double(),
        torch.from_numpy(grid),
        mode="bilinear",
        padding_mode="zeros",
        align_corners=True,
    ).numpy()
    want = (want * inside[None, None]).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(got[0], want, atol=1e-5)
    np.testing.assert_allclose(ref[0], want, atol=1e-5)


@pytest.mark.parametrize("dims", [2, 3])
def test_transform_landmarks_applies_the_matrix_rows(dims):
    rng = np.random.default_rng(84 + dims)
    b = TflBuilder()
    x, m = b.tensor("x", [1, 6, dims]), b.tensor("m", [1, 4, 4])
    y = b.tensor("y", [1, 6, dims])
    b.op("CUSTOM:TransformLandmarks", [x, m], [y])
    data = b.build([x, m], [y])
    pts = rng.normal(0, 10, (1, 6, dims)).astype(F32)
    got, ref = _run(data, {"x": pts, "m": np.eye(4, dtype=F32)[None]})
    np.testing.assert_allclose(got[0], pts, atol=1e-6)  # identity: the landmarks back
    angle, k, shift = 0.7, 2.5, (3.0 + 1.0j)
    m44 = _affine(angle, (k, k), (shift.real, shift.imag))
    got, ref = _run(data, {"x": pts, "m": m44})
    z = (pts[0, :, 0] + 1j * pts[0, :, 1]) * k * np.exp(1j * angle) + shift  # a similarity in C
    for g in (got[0], ref[0]):
        np.testing.assert_allclose(g[0, :, 0], z.real, atol=1e-4)
        np.testing.assert_allclose(g[0, :, 1], z.imag, atol=1e-4)
        if dims == 3:
            np.testing.assert_array_equal(g[0, :, 2], pts[0, :, 2])  # z is kept


def _l2tm_model(n: int, opts: dict) -> bytes:
    b = TflBuilder()
    x, y = b.tensor("x", [1, n, 3]), b.tensor("y", [1, 4, 4])
    b.op("CUSTOM:Landmarks2TransformMatrix", [x], [y], custom=_flex(opts))
    return b.build([x], [y])


@pytest.mark.parametrize("phi", [0.0, 0.4, -2.5])
def test_landmarks_to_transform_matrix_maps_the_crop_onto_the_rotated_box(phi):
    """Landmarks on a rectangle (centre C, size W x H) turned by phi, the rotation pair along its
    width: the matrix maps the output crop (ow x oh) onto that rectangle scaled by (scale_x,
    scale_y) about C: its centre to C, its axes along the rectangle's, each output pixel
    scale * W / ow long."""
    rng = np.random.default_rng(90)
    cen, size = np.array([40.0, -12.0]), np.array([30.0, 18.0])
    u = np.array([[-0.5, -0.5], [0.5, -0.5], [0.5, 0.5], [-0.5, 0.5], [-0.5, 0.0], [0.5, 0.0], [0.1, 0.2]])
    rot = np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]])
    pts = (u * size) @ rot.T + cen
    lm = np.concatenate([pts, rng.normal(size=(7, 1))], 1)[None].astype(F32)
    ow, oh, sx, sy = 16, 12, 1.5, 1.25
    opts = {
        "left_rotation_idx": 4,
        "right_rotation_idx": 5,
        "subset_idxs": [0, 1, 2, 3, 6],  # odd: the kernel pairs the last with itself
        "target_rotation_radians": 0.0,
        "output_width": ow,
        "output_height": oh,
        "scale_x": sx,
        "scale_y": sy,
    }
    got, ref = _run(_l2tm_model(7, opts), {"x": lm})
    for g in (got[0], ref[0]):
        m = g[0].astype(np.float64)
        np.testing.assert_allclose(m[2:], np.eye(4)[2:], atol=1e-7)
        np.testing.assert_allclose(m[:2, 2], 0.0, atol=1e-7)
        np.testing.assert_allclose(
            m[:2, :2], rot @ np.diag([sx * size[0] / ow, sy * size[1] / oh]), atol=1e-4
        )
        np.testing.assert_allclose(m[:2, :2] @ [ow / 2, oh / 2] + m[:2, 3], cen, atol=1e-3)


def test_landmarks_to_transform_matrix_target_rotation_and_a_zero_pair():
    """With the rotation pair on one point (atan2(0, 0) = 0) the box is turned by the target alone."""
    pts = np.array([[0, 0, 0], [10, 0, 0], [10, 20, 0], [0, 20, 0], [5, 5, 0]], F32)[None]
    target = 0.5
    opts = {
        "left_rotation_idx": 4,
        "right_rotation_idx": 4,
        "subset_idxs": [0, 1, 2, 3],
        "target_rotation_radians": target,
        "output_width": 8,
        "output_height": 8,
        "scale_x": 1.0,
        "scale_y": 1.0,
    }
    got, _ = _run(_l2tm_model(5, opts), {"x": pts})
    m = got[0][0].astype(np.float64)
    # rot(-target) scaled: the first column is a unit vector at angle -target times a scale
    col = m[:2, 0] / np.linalg.norm(m[:2, 0])
    np.testing.assert_allclose(col, [np.cos(-target), np.sin(-target)], atol=1e-6)


@pytest.mark.parametrize(
    "custom, what",
    [
        (b"\x00\x01\x02", "FlexBuffers"),
        (None, "indices outside"),
    ],
)
def test_mediapipe_v2_ops_bad_options_exit_2(tmp_path, custom, what):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    if custom is None:
        custom = _flex(
            {
                "left_rotation_idx": 0,
                "right_rotation_idx": 900,
                "subset_idxs": [0, 1],
                "target_rotation_radians": 0.0,
                "output_width": 8,
                "output_height": 8,
                "scale_x": 1.0,
                "scale_y": 1.0,
            }
        )
    b = TflBuilder()
    x, y = b.tensor("x", [1, 5, 3]), b.tensor("y", [1, 4, 4])
    b.op("CUSTOM:Landmarks2TransformMatrix", [x], [y], custom=custom)
    src = tmp_path / "l2tm.tflite"
    src.write_bytes(b.build([x], [y]))
    with pytest.raises(InputError) as err:
        load_tflite_bytes(src.read_bytes(), str(src))
    assert what in str(err.value) and "l2tm.tflite" in err.value.line()
    out = tmp_path / "out.onnx"
    res = CliRunner().invoke(app, ["import", str(src), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "l2tm.tflite" in res.output and "Traceback" not in res.output and not out.exists()


def _mediapipe_python() -> Path:
    """A venv (in the wheel cache, made once per test interpreter) with mediapipe==0.10.14 installed
    from the cached wheel without dependencies; its Python runs tests/formats/mediapipe_oracle.py,
    which loads only the C++ framework bindings.

    Its other packages (numpy, protobuf) are the test interpreter's own: a ``.pth`` file names this
    interpreter's site-packages. ``--system-site-packages`` would not do: from inside a virtual
    environment it gives the base interpreter's packages, which need not hold protobuf."""
    import glob
    import hashlib
    import os
    import shutil
    import site
    import subprocess
    import sysconfig

    from _wheels import cache_dir

    ours = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    ours = list(dict.fromkeys(p for p in ours if os.path.isdir(p)))
    key = hashlib.sha256("\n".join([sys.prefix, *ours]).encode()).hexdigest()[:12]
    venv = cache_dir() / f"mediapipe-0.10.14-venv-{key}"
    py = venv / "bin" / "python"
    if py.is_file():
        return py
    wheels = glob.glob(str(cache_dir() / "wheels" / "mediapipe-0.10.14-*.whl"))
    if not wheels:
        pytest.skip("the mediapipe 0.10.14 wheel for this platform is not in the cache")
    tmp = venv.with_name(f"{venv.name}.{os.getpid()}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    purelib = subprocess.run(
        [str(tmp / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the wheel goes in first (pip of this interpreter, targeting the new venv), then the .pth line
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            purelib,
            wheels[0],
        ],
        check=True,
        timeout=300,
    )
    Path(purelib, "mconv_test_parent.pth").write_text("".join(f"{p}\n" for p in ours))
    try:
        tmp.rename(venv)
    except OSError:  # another worker made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return py


def test_face_landmark_with_attention_matches_mediapipe(tmp_path):
    """The real model's 7 outputs against MediaPipe's own InferenceCalculator with MediaPipe's
    custom op resolver (the C++ kernels of the three ops), on the same picture."""
    import subprocess

    path = _fetch_mp(
        "mediapipe/modules/face_landmark/face_landmark_with_attention.tflite",
        "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4",
    )
    py = _mediapipe_python()
    img = np.round(_person(192, 192)[0] * 255).astype(np.uint8)
    work = tmp_path
    np.save(work / "img.npy", img)
    script = Path(__file__).resolve().parent / "mediapipe_oracle.py"
    res = subprocess.run(
        [str(py), str(script), str(work / "img.npy"), str(work / "out.npz"), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    data = path.read_bytes()
    model = load_tflite_bytes(data, str(path))
    got, ref = _run(data, {model.graph.inputs[0].name: img[None].astype(F32) / 255.0}, str(path))
    with np.load(work / "out.npz") as z:
        want = [z[f"out_{k}"] for k in range(7)]
    for g, r, w in zip(got, ref, want, strict=True):
        scale = max(1.0, float(np.abs(w).max()))
        assert _cosine(g.ravel(), w) >= 0.99999 and _cosine(r.ravel(), w) >= 0.99999
        np.testing.assert_allclose(g.ravel(), w, atol=1e-5 * scale)


def test_face_landmark_with_attention_imports_and_runs():
    """The real model (3 Landmarks2TransformMatrix, 3 TransformTensorBilinear, 5
    TransformLandmarks): imported, valid in ONNX Runtime, and the reference executor agrees."""
    path = _fetch_mp(
        "mediapipe/modules/face_landmark/face_landmark_with_attention.tflite",
        "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4",
    )
    model = load_tflite_bytes(path.read_bytes(), str(path))
    kinds = {n.op_type for n in model.graph}
    assert "GridSample" in kinds
    img = _person(192, 192)
    got, ref = _run(path.read_bytes(), {model.graph.inputs[0].name: img}, str(path))
    for g, r in zip(got, ref, strict=True):
        assert np.all(np.isfinite(g)) and _cosine(g, r) >= 0.99999
