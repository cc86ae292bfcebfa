"""LiteRT's fully integer LSTM (UNIDIRECTIONAL_SEQUENCE_LSTM, int8 activations and weights, int16
cell state: the "8x8_16" kernel of tensorflow/lite/kernels/lstm_eval.cc), spelled in exact integer
ONNX arithmetic.

The kernel, without layer norm, peepholes or projection (lstm.cc PopulateQuantizedLstmParams8x8_16,
lstm_eval.cc CalculateLstmGateInteger8x8_16 / UpdateLstmCellInteger / CalculateLstmOutputInteger8x8_16):

- each gate's pre-activation is int16 in Q3.12: ``sat16(MBQM(W_x (x - zp_x) + b, s_x))`` then
  ``sat16(that + MBQM(W_h (h - zp_h), s_h))``, where MBQM is MultiplyByQuantizedMultiplier and the
  effective scales are ``w_scale * in_scale / 2**-12`` (float32 arithmetic);
- sigmoid (i, f, o) and tanh (cell gate, Q3.12) are gemmlowp's fixed-point ``logistic`` / ``tanh``
  on int16 (Q0.15 out): every int16 input has one output, so the import builds them as 65,536-entry
  tables (numpy ports of gemmlowp/fixedpoint/fixedpoint.h, vectorised) and the graph Gathers;
- ``c = sat16(RDBP(f * c, 15) + RDBP(i * g, 30 + log2(cell_scale)))`` (RDBP: RoundingDivideByPOT);
- ``h = clamp8(MBQM(o * tanh_{15+log2(cell_scale)}(c), 2**-30 / hidden_scale) + hidden_zp)``.

All of it is int64 in ONNX (products of int16 by int31 multipliers stay below 2**62); a floor
division by a power of two is ``Div(y + 2**62, d) - 2**62 / d`` (ONNX Runtime's integer Div
truncates; the offset makes the dividend non-negative)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from mconv.errors import show

if TYPE_CHECKING:
    from mconv.formats.tflite.reader import TflTensor, _Converter

_I64 = np.int64


# ------------------------------------------------------------------ gemmlowp fixed point (int16)


def _w16(x: np.ndarray) -> np.ndarray:
    """static_cast<int16_t> (two's complement wrap)."""
    return ((x + 32768) & 0xFFFF) - 32768


def _tdiv(y: np.ndarray, d: int) -> np.ndarray:
    """C++ integer division (truncates toward zero)."""
    q = np.abs(y) // d
    return np.where(y < 0, -q, q)


def _srdhm(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    b = np.broadcast_to(np.asarray(b, _I64), np.shape(a))
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    r = _w16(_tdiv(ab + nudge, 1 << 15))
    return np.where((a == b) & (a == -32768), 32767, r)


def _rdbp(x: np.ndarray | int, e: int) -> np.ndarray:
    x = np.asarray(x, _I64)
    mask = (1 << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (remainder > threshold)


def _srmbpot(x: np.ndarray, e: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT<e> on int16."""
    if e == 0:
        return x
    if e < 0:
        return _rdbp(x, -e)
    threshold = (1 << (15 - e)) - 1
    r = _w16(x * (1 << e))
    r = np.where(x > threshold, 32767, r)
    return np.where(x < -threshold, -32768, r)


def _const(raw32: int) -> int:
    """GEMMLOWP_CHECKED_FIXEDPOINT_CONSTANT for int16: the int32 raw value rounding-shifted by 16."""
    return int(_rdbp(np.asarray(raw32, _I64), 16))


def _add(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    return _w16(a + b)


def _sub(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    return _w16(np.asarray(a, _I64) - b)


def _exp_quarter(a: np.ndarray) -> np.ndarray:
    """exp(x) for x in [-1/4, 0), Q0.15."""
    constant_term, one_third = _const(1895147668), _const(715827883)
    x = _add(a, 1 << 12)  # + ConstantPOT<-3>
    x2 = _srdhm(x, x)
    x3 = _srdhm(x2, x)
    x4 = _srdhm(x2, x2)
    x4_over_4 = _srmbpot(x4, -2)
    poly = _srmbpot(_add(_srdhm(_add(x4_over_4, x3), one_third), x2), -1)
    s = np.asarray(constant_term, _I64) + _srdhm(np.full_like(a, constant_term), _add(x, poly))
    return np.clip(s, -32768, 32767)  # AddSaturatingIf16Bit


def _exp_negative(a: np.ndarray, ib: int) -> np.ndarray:
    """exp_on_negative_values for a Q(ib).(15-ib) input; Q0.15 out."""
    frac = 15 - ib
    quarter = 1 << (frac - 2)
    amq = _sub(a & (quarter - 1), quarter)
    result = _exp_quarter(_srmbpot(amq, ib))  # Rescale<0>
    remainder = _sub(amq, a)
    for exponent, mult in ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
                           (2, 39332535), (3, 720401), (4, 242)):  # fmt: skip
        if ib > exponent:
            bit = 1 << (frac + exponent)
            result = np.where((remainder & bit) != 0, _srdhm(result, _const(mult)), result)
    if ib > 5:
        clamp = _const(-(1 << (36 - ib)))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, 32767, result)


def _newton(a: np.ndarray) -> np.ndarray:
    """The Newton-Raphson reciprocal of (1 + a) / 2 in Q2.13 (a in Q0.15)."""
    s = a + 32767
    half_den = _w16(_tdiv(s + np.where(s >= 0, 1, -1), 2))  # RoundingHalfSum(a, One)
    x = _add(np.full_like(a, _const(1515870810)), _srdhm(half_den, _const(-1010580540)))
    for _ in range(3):
        one_minus = _sub(1 << 13, _srdhm(half_den, x))
        x = _add(x, _srmbpot(_srdhm(x, one_minus), 2))  # Rescale<2> of a Q4 product
    return x


def gemmlowp_logistic(raw: np.ndarray, ib: int) -> np.ndarray:
    """gemmlowp::logistic(FixedPoint<int16, ib>::FromRaw(raw)).raw()."""
    a = np.asarray(raw, _I64)
    pos = a > 0
    abs_in = np.where(pos, a, _w16(-a))
    r_pos = _srmbpot(_newton(_exp_negative(_w16(-abs_in), ib)), 1)  # Rescale<0>(ExactMulByPot<-1>)
    r_neg = _sub(32767, r_pos)
    return np.where(a == 0, _const(1 << 30), np.where(pos, r_pos, r_neg))


def gemmlowp_tanh(raw: np.ndarray, ib: int) -> np.ndarray:
    """gemmlowp::tanh(FixedPoint<int16, ib>::FromRaw(raw)).raw()."""
    a = np.asarray(raw, _I64)
    neg = a < 0
    n = np.where(neg, a, _w16(-a))
    t = _srmbpot(_sub(_newton(_exp_negative(n, ib + 1)), 1 << 13), 2)  # Rescale<0>(x - One)
    return np.where(a == 0, 0, np.where(neg, _w16(-t), t))


def table(kind: str, ib: int) -> np.ndarray:
    """The int16 outputs for every int16 input -32768..32767 (index = input + 32768)."""
    raw = np.arange(-32768, 32768, dtype=_I64)
    out = gemmlowp_logistic(raw, ib) if kind == "sigmoid" else gemmlowp_tanh(raw, ib)
    return out.astype(np.int16)


# ------------------------------------------------------------------ TFLite's quantized multipliers


def quantize_multiplier(m: float) -> tuple[int, int]:
    """tflite::QuantizeMultiplier: m = q * 2**(shift - 31), q in [2**30, 2**31)."""
    if m == 0.0:
        return 0, 0
    q, shift = math.frexp(m)
    fixed = int(math.floor(abs(q) * (1 << 31) + 0.5)) * (1 if q >= 0 else -1)  # TfLiteRound
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return fixed, shift


def mbqm(x: np.ndarray, mult: int, shift: int) -> np.ndarray:
    """tflite::MultiplyByQuantizedMultiplier (double rounding), int64 numpy."""
    left, right = max(shift, 0), max(-shift, 0)
    ab = np.asarray(x, _I64) * (1 << left) * mult
    high = (ab + (1 << 30)) >> 31  # SRDHM: trunc((ab + nudge) / 2**31) == floor((ab + 2**30) / 2**31)
    return _rdbp(high, right)


# ------------------------------------------------------------------ the ONNX lowering

_OFF = 1 << 62


class _IntGraph:
    """int64 helpers over a tflite._Converter."""

    def __init__(self, c: _Converter) -> None:
        self.c = c

    def k(self, base: str, v: Any) -> str:
        return self.c.init(f"{self.c.node_base}/{base}", np.asarray(v, _I64))

    def floordiv(self, y: str, d: np.ndarray | int) -> str:
        """floor(y / d) for a power-of-two d (>= 1): Div of y + 2**62, which is non-negative."""
        d = np.asarray(d, _I64)
        q = self.c.one("Div", [self.c.one("Add", [y, self.k("off", _OFF)]), self.k("pot", d)])
        return self.c.one("Sub", [q, self.k("off_q", _OFF // d)])

    def rdbp(self, x: str, e: np.ndarray | int) -> str:
        """gemmlowp::RoundingDivideByPOT: (x + 2**(e-1) - (x < 0)) floor-divided by 2**e; x when e == 0."""
        e = np.asarray(e, _I64)
        if not e.any():
            return x
        half = np.where(e > 0, np.left_shift(1, np.maximum(e - 1, 0)), 0).astype(_I64)
        adj = (e > 0).astype(_I64)
        neg = self.c.one("Cast", [self.c.one("Less", [x, self.k("zero", 0)])], to=7)
        num = self.c.one(
            "Sub",
            [self.c.one("Add", [x, self.k("half", half)]), self.c.one("Mul", [neg, self.k("adj", adj)])],
        )
        return self.floordiv(num, np.left_shift(1, e).astype(_I64))

    def mbqm(self, x: str, mult: np.ndarray, shift: np.ndarray) -> str:
        """tflite::MultiplyByQuantizedMultiplier with per-element multipliers (int64)."""
        left = np.left_shift(1, np.maximum(shift, 0)).astype(_I64) * mult.astype(_I64)
        ab = self.c.one("Mul", [x, self.k("mult", left)])
        high = self.floordiv(self.c.one("Add", [ab, self.k("nudge", 1 << 30)]), 1 << 31)
        return self.rdbp(high, np.maximum(-shift, 0))

    def clip(self, x: str, lo: int, hi: int) -> str:
        return self.c.one("Clip", [x, self.k("lo", lo), self.k("hi", hi)])

    def lut(self, x: str, tab: np.ndarray, name: str) -> str:
        idx = self.c.one("Add", [x, self.k("lut_offset", 32768)])
        t = self.c.init(f"{self.c.node_base}/{name}", tab)
        return self.c.one("Cast", [self.c.one("Gather", [t, idx], axis=0)], to=7)

    def codes(self, v: str, scale: float) -> str:
        """The centred integer codes (q - zero_point) of a dequantized value on its grid."""
        s = self.c.init(f"{self.c.node_base}/scale", np.asarray(scale, np.float32))
        return self.c.one("Cast", [self.c.one("Round", [self.c.one("Div", [v, s])])], to=7)


def _scale(t: TflTensor) -> float:
    return float(np.asarray(t.scale).reshape(-1)[0])


def _zp(t: TflTensor) -> int:
    return int(np.asarray(t.zero_point).reshape(-1)[0])


def _codes(t: TflTensor) -> np.ndarray:
    return np.asarray(t.data).astype(_I64)


def integer_kernel_applies(c: _Converter, ins: list[int], out: int) -> bool:
    """The int8 x int8 -> int16 LSTM without layer norm, peepholes, CIFG or projection, with
    per-tensor symmetric int8 weights, int32 biases, an int8 state and a power-of-two int16 cell;
    the output on the state's grid (the hidden intermediate's scale is taken to be the state's:
    LiteRT's converter writes them equal when there is no projection)."""
    if not c.fake_quant:
        return False
    T = c.T

    def q(i: int, typ: int, const: bool | None = None) -> bool:
        if i < 0:
            return False
        t = T(i)
        if t.type != typ or not t.quantized or np.asarray(t.scale).size != 1:
            return False
        return const is None or (t.data is not None) == const

    gates_w = ins[1:9]
    if not (q(ins[0], 9) and all(q(i, 9, True) for i in gates_w) and all(q(i, 2, True) for i in ins[12:16])):
        return False
    if any(_zp(T(i)) != 0 for i in gates_w):
        return False
    if any(i >= 0 for i in ins[9:12] + ins[16:18] + ins[20:24]):
        return False
    if not (q(ins[18], 9) and q(ins[19], 7) and q(out, 9)):
        return False
    o, h = T(out), T(ins[18])
    if _scale(o) != _scale(h) or _zp(o) != _zp(h):
        return False
    scales = [_scale(T(i)) for i in [ins[0], *gates_w, ins[18], out]]
    if not all(math.isfinite(v) and v > 0 for v in scales):
        return False
    cs = _scale(T(ins[19]))
    e = math.log2(cs) if math.isfinite(cs) and cs > 0 else 0.5
    return e == int(e) and 0 <= 15 + int(e) <= 6 and -30 <= int(e)


def lower(c: _Converter, ins: list[int], x: str, steps: int, out: int, cell_clip: float) -> str:
    """The integer kernel over ``x`` ([T, B, I], dequantized input values); returns [T, B, H]
    dequantized output values (exactly LiteRT's int8 codes times the output scale)."""
    g = _IntGraph(c)
    T = c.T

    def s(i: int) -> float:
        return _scale(T(i))

    def zp(i: int) -> int:
        return _zp(T(i))

    xs, hs, cs = np.float32(s(ins[0])), np.float32(s(ins[18])), s(ins[19])
    cs_log = int(math.log2(cs))
    hidden, n_in = T(ins[1]).shape[0], T(ins[0]).shape[-1]
    for k in range(4):  # shapes the kernel assumes: W_x [H, I], W_h [H, H], b [H]; states [B, H]
        for ti, want in (
            (ins[1 + k], (hidden, n_in)),
            (ins[5 + k], (hidden, hidden)),
            (ins[12 + k], (hidden,)),
        ):
            if tuple(T(ti).shape) != want:
                raise ValueError(
                    f"LSTM tensor '{show(T(ti).name)}' has shape {list(T(ti).shape)}, expected {list(want)}"
                )
    for ti in (ins[18], ins[19], out):
        if not T(ti).shape or T(ti).shape[-1] != hidden:
            raise ValueError(
                f"LSTM tensor '{show(T(ti).name)}' has shape {list(T(ti).shape)}; its last size is not {hidden}"
            )
    wx = np.concatenate([_codes(T(ins[1 + k])) for k in range(4)]).T.copy()  # [I, 4H]
    wr = np.concatenate([_codes(T(ins[5 + k])) for k in range(4)]).T.copy()  # [H, 4H]
    bias = np.concatenate([_codes(T(ins[12 + k])).reshape(-1) for k in range(4)])
    inter = np.float32(2.0**-12)
    mx, sx, mr, sr = [], [], [], []
    for k in range(4):
        a, b = quantize_multiplier(float(np.float32(np.float32(s(ins[1 + k])) * xs) / inter))
        mx.append(a)
        sx.append(b)
        a, b = quantize_multiplier(float(np.float32(np.float32(s(ins[5 + k])) * hs) / inter))
        mr.append(a)
        sr.append(b)

    if any(not -31 <= v <= 30 for v in [*sx, *sr]):
        raise ValueError(
            "an LSTM gate's effective scale (weight scale x input scale / 2**-12) is out of range"
        )

    def per_gate(v: list[int]) -> np.ndarray:
        return np.repeat(np.asarray(v, _I64), hidden)[None]  # [1, 4H]: the rank of a step's gates

    out_t = T(out)
    os_, oz = _scale(out_t), _zp(out_t)
    hm, hsh = quantize_multiplier(float(np.float32(2.0**-15 / float(np.float32(os_)) * 2.0**-15)))
    if not -31 <= hsh <= 30:
        raise ValueError("the LSTM's hidden scale (2**-30 / output scale) is out of range")
    sig, tanh3 = table("sigmoid", 3), table("tanh", 3)
    tanh_c = table("tanh", 15 + cs_log)
    clip_q = 0
    if cell_clip > 0:
        clip_q = int(min(max(round(cell_clip / cs), -32768), 32767))

    xc = g.codes(x, float(xs))  # [T, B, I] centred
    xw = c.one(
        "Add", [c.one("MatMul", [xc, c.init(f"{c.node_base}/input_weights_codes", wx)]), g.k("bias", bias)]
    )
    h = g.codes(c.value(ins[18]), float(hs))  # centred output-state codes
    cell = g.codes(c.value(ins[19]), cs)
    wr_name = c.init(f"{c.node_base}/recurrent_weights_codes", wr)
    split = c.ints("split", [hidden] * 4)
    outs = []
    for t in range(steps):
        xt = c.one("Gather", [xw, c.ints("t", np.int64(t))], axis=0)
        xt = g.clip(g.mbqm(xt, per_gate(mx), per_gate(sx)), -32768, 32767)
        rec = g.mbqm(c.one("MatMul", [h, wr_name]), per_gate(mr), per_gate(sr))
        pre = g.clip(c.one("Add", [xt, rec]), -32768, 32767)
        pi, pf, pc, po = c.emit("Split", [pre, split], 4, axis=1)
        i, f, o = (g.lut(p, sig, "sigmoid_q3_12") for p in (pi, pf, po))
        gg = g.lut(pc, tanh3, "tanh_q3_12")
        cell = c.one("Add", [g.rdbp(c.one("Mul", [f, cell]), 15), g.rdbp(c.one("Mul", [i, gg]), 30 + cs_log)])
        cell = g.clip(cell, -32768, 32767)
        if clip_q > 0:
            cell = g.clip(cell, -clip_q, clip_q)
        th = g.lut(cell, tanh_c, f"tanh_q{15 + cs_log}")
        hq = g.clip(
            c.one(
                "Add",
                [g.mbqm(c.one("Mul", [o, th]), np.asarray(hm, _I64), np.asarray(hsh, _I64)), g.k("zp", oz)],
            ),
            -128,
            127,
        )
        h = c.one("Sub", [hq, g.k("state_zp", zp(ins[18]))])
        y = c.one(
            "Mul",
            [
                c.one("Cast", [c.one("Sub", [hq, g.k("out_zp", oz)])], to=1),
                c.init(f"{c.node_base}/out_scale", np.asarray(os_, np.float32)),
            ],
        )
        outs.append(c.one("Unsqueeze", [y, c.ints("axes", [0])]))
    return outs[0] if len(outs) == 1 else c.one("Concat", outs, axis=0)
