"""The int8 UNIDIRECTIONAL_SEQUENCE_LSTM imported as LiteRT's integer kernel (issue 12 item 5):
the imported model's int8 outputs equal LiteRT's code for code, on a built multi-step LSTM with
non-zero states and on the real dtln noise-suppression model with speech-like frames."""

from __future__ import annotations

import json
from pathlib import Path

import ai_edge_litert.interpreter as litert  # the test extra installs it: absent is a failure
import mconv.api as api
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.formats.tflite import lstm_int as L

from .tflite_builder import TflBuilder

DTLN = Path(__file__).resolve().parents[2] / "shared/models/tflite/dtln_noise_suppression.tflite"
if not DTLN.exists():
    DTLN = Path("/work/shared/models/tflite/dtln_noise_suppression.tflite")


def _litert(data: bytes, feeds: list[np.ndarray]) -> np.ndarray:
    it = litert.Interpreter(model_content=data)  # a fresh interpreter: LiteRT updates the states in place
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], v)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _import(tmp_path: Path, data: bytes) -> ort.InferenceSession:
    src, out = tmp_path / "m.tflite", tmp_path / "m.onnx"
    src.write_bytes(data)
    api.convert(src, out)
    return ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def _int8_lstm(
    rng: np.random.Generator, T: int, B: int, I: int, H: int, cell_clip: float, bad_recurrent: bool = False
) -> bytes:
    b = TflBuilder()
    xs, xz, hs, hz, cs = 0.05, 3, 0.008, -5, 2.0**-11
    x = b.tensor("x", [B, T, I], np.int8, scale=[xs], zero_point=[xz])
    ins = [x]
    wscale = rng.uniform(0.01, 0.04, 8)
    for g in range(8):
        n = I if g < 4 else H + (1 if bad_recurrent and g == 6 else 0)
        w = rng.integers(-127, 128, (H, n)).astype(np.int8)
        ins.append(b.const(f"w{g}", w, scale=[wscale[g]], zero_point=[0]))
    ins += [-1, -1, -1]  # no peepholes
    for g in range(4):
        bias = rng.integers(-3000, 3000, H).astype(np.int32)
        ins.append(b.const(f"b{g}", bias, scale=[wscale[g] * xs], zero_point=[0]))
    ins += [-1, -1]  # no projection
    # LiteRT refuses variable tensors with data: the states start at real zero (the zero point),
    # so the recurrent matmul and the forget path are exercised from the second step on.
    ins.append(b.tensor("h0", [B, H], np.int8, scale=[hs], zero_point=[hz], variable=True))
    ins.append(b.tensor("c0", [B, H], np.int16, scale=[cs], zero_point=[0], variable=True))
    ins += [-1, -1, -1, -1]
    y = b.tensor("y", [B, T, H], np.int8, scale=[hs], zero_point=[hz])
    inter = [b.tensor(f"intermediate{k}", [0]) for k in range(4)]
    inter.append(b.tensor("effective_hidden_scale_intermediate", [0], np.int8, scale=[hs], zero_point=[hz]))
    b.op(
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        ins,
        [y],
        "UnidirectionalSequenceLSTMOptions",
        FusedActivationFunction=4,
        CellClip=cell_clip,
        ProjClip=0.0,
        TimeMajor=False,
    )
    b.ops[-1]["intermediates"] = inter
    return b.build([x], [y])


@pytest.mark.parametrize("cell_clip", [0.0, 1.5])
def test_built_int8_lstm_equals_litert_code_for_code(tmp_path, cell_clip):
    rng = np.random.default_rng(12)
    data = _int8_lstm(rng, T=6, B=2, I=5, H=7, cell_clip=cell_clip)
    sess = _import(tmp_path, data)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    assert "LSTM" not in ops and "Gather" in ops  # the integer kernel, not a float LSTM
    worst = 0
    for _ in range(4):
        x = rng.integers(-128, 128, (2, 6, 5)).astype(np.int8)
        ref = _litert(data, [x]).astype(np.int64)
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0].astype(np.int64)
        assert got.shape == ref.shape
        worst = max(worst, int(np.abs(got - ref).max()))
    assert worst == 0


def _speech_frames(rng: np.random.Generator, n: int) -> np.ndarray:
    """STFT magnitudes (512-point Hann, hop 128) of a vowel-like signal: harmonics of a gliding
    120-180 Hz pitch under two formants, a little noise."""
    sr, secs = 16000, 0.5
    t = np.arange(int(sr * secs)) / sr
    f0 = 120 + 60 * t / secs
    phase = 2 * np.pi * np.cumsum(f0) / sr
    sig = np.zeros_like(t)
    for k in range(1, 40):
        f = k * f0
        amp = np.exp(-(((f - 700) / 150) ** 2)) + 0.6 * np.exp(-(((f - 1200) / 200) ** 2)) + 0.02
        sig += amp * np.sin(k * phase)
    sig = 0.3 * sig / np.abs(sig).max() + 0.003 * rng.standard_normal(t.size)
    win = np.hanning(512)
    starts = np.linspace(0, t.size - 512, n).astype(int)
    return np.stack([np.abs(np.fft.rfft(sig[s : s + 512] * win)) for s in starts]).astype(np.float32)


@pytest.mark.skipif(not DTLN.exists(), reason="the dtln model is not in shared/")
def test_dtln_int8_equals_litert_on_speech_frames(tmp_path):
    rng = np.random.default_rng(5)
    data = DTLN.read_bytes()
    sess = _import(tmp_path, data)
    it = litert.Interpreter(model_content=data)
    s, z = it.get_input_details()[0]["quantization"]
    worst = 0
    for frame in _speech_frames(rng, 12):
        q = np.clip(np.round(frame[None, None] / s) + z, -128, 127).astype(np.int8)
        ref = _litert(data, [q]).astype(np.int64)
        got = sess.run(None, {sess.get_inputs()[0].name: q})[0].astype(np.int64)
        worst = max(worst, int(np.abs(got - ref).max()))
    assert worst == 0  # was 2 codes with the float LSTM (target: within 1)


def test_gemmlowp_tables_follow_the_functions():
    raw = np.arange(-32768, 32768)
    sig = L.table("sigmoid", 3).astype(np.float64) / 32768
    assert np.abs(sig - 1 / (1 + np.exp(-raw / 4096))).max() < 3e-4
    assert L.table("sigmoid", 3)[32768] == 16384  # logistic(0) is the constant one half
    for ib in (0, 3, 4, 6):
        th = L.table("tanh", ib).astype(np.float64) / 32768
        assert np.abs(th - np.tanh(raw / 2.0 ** (15 - ib))).max() < 1e-3, ib
        assert L.table("tanh", ib)[32768] == 0
    # the kernel's multiplier arithmetic: 0.75 = (3 * 2**29) / 2**31; SaturatingRoundingDoublingHighMul
    # rounds a tie up (+1.5 -> 2, -1.5 -> -1); RoundingDivideByPOT rounds a tie away from zero
    assert L.quantize_multiplier(0.75) == (3 << 29, 0)
    assert L.mbqm(np.array([3, -3, 1000]), *L.quantize_multiplier(0.5)).tolist() == [2, -1, 500]
    # 0.25 is 2**30 with a right shift of 1: two roundings (1.25 -> 2.5 -> 3 -> 1.5 -> 2), as in
    # MultiplyByQuantizedMultiplier without TFLITE_SINGLE_ROUNDING
    assert L.quantize_multiplier(0.25) == (1 << 30, -1)
    assert L.mbqm(np.array([3, -3, 5, -5]), *L.quantize_multiplier(0.25)).tolist() == [1, -1, 2, -1]


def test_built_int8_lstm_exports_to_xla_in_64_bit_mode(tmp_path):
    rng = np.random.default_rng(13)
    data = _int8_lstm(rng, T=3, B=1, I=4, H=5, cell_clip=0.0)
    _import(tmp_path, data)
    api.export(tmp_path / "m.onnx", "xla", tmp_path / "bundle")
    # int64 fixed-point arithmetic: in 32-bit mode the products by the multipliers wrap
    assert json.loads((tmp_path / "bundle" / "xla.json").read_text())["x64"] is True
    x = rng.integers(-128, 128, (1, 3, 4)).astype(np.int8)
    res = api.run(tmp_path / "bundle", {"x": x})
    got = np.asarray(next(iter(res.outputs.values())) if isinstance(res.outputs, dict) else res.outputs[0])
    assert np.array_equal(got.astype(np.int64), _litert(data, [x]).astype(np.int64))


def test_int8_lstm_with_a_misshapen_recurrent_weight_is_one_line_exit_2(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    rng = np.random.default_rng(14)
    src = tmp_path / "bad_lstm.tflite"
    src.write_bytes(_int8_lstm(rng, T=2, B=1, I=3, H=4, cell_clip=0.0, bad_recurrent=True))
    res = CliRunner().invoke(app, ["import", str(src), "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bad_lstm.tflite" in lines[0] and "w6" in lines[0], res.output
    assert "Traceback" not in res.output
