"""Op family: recurrent layers (RNN, GRU, LSTM) with backpropagation through time.

Rules (ONNX notation: ``X`` [seq, batch, input] for ``layout=0``, [batch, seq, input] for 1):

1. Gate order in W, R, B: RNN ``i``; GRU ``z, r, h``; LSTM ``i, o, f, c`` (peepholes P: ``i, o, f``).
   B is ``[Wb, Rb]``. Missing B, initial_h, initial_c, P mean zeros.
2. ``direction`` forward, reverse or bidirectional (two stacked directions in W, R, B, states).
   The reverse direction reads each sequence backwards within its own ``sequence_lens``.
3. ``sequence_lens``: past its length a sequence's Y is 0 and its state stays frozen, so Y_h/Y_c
   are the states after the last valid step.
4. ``activations`` (case-insensitive: Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu,
   ScaledTanh, HardSigmoid, Elu, Softsign, Softplus) per direction, with ``activation_alpha`` and
   ``activation_beta`` consumed in order by the functions that take them (as ONNX Runtime does).
   ``clip`` clamps every gate's pre-activation to [-clip, clip] before its activation.
5. LSTM ``input_forget=1`` couples the forget gate to ``1 - i``. GRU ``linear_before_reset=1``
   applies the reset gate after the recurrent matmul: ``r * (H R_h^T + Rb_h)``.
6. The VJP backpropagates through time for every attribute combination above: each activation
   carries its derivative, a clipped gate passes no gradient, masked steps pass the state's
   gradient straight through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mconv.errors import InputError

from . import register, register_vjp, wide
from ._special import special

# --------------------------------------------------------------------------- activations


@dataclass
class Activation:
    """One RNN activation function with its derivative (both as functions of the pre-activation)."""

    name: str
    f: Callable[[np.ndarray], np.ndarray]
    df: Callable[[np.ndarray], np.ndarray]


def _activation(name: str, alpha: float | None, beta: float | None) -> Activation:
    key = name.lower()
    sig = special.expit
    if key == "tanh":
        return Activation(name, np.tanh, lambda x: 1 - np.tanh(x) ** 2)
    if key == "sigmoid":
        return Activation(name, sig, lambda x: sig(x) * (1 - sig(x)))
    if key == "relu":
        return Activation(name, lambda x: np.maximum(x, 0), lambda x: (x > 0).astype(x.dtype))
    if key == "affine":
        a, b = alpha if alpha is not None else 1.0, beta if beta is not None else 0.0
        return Activation(name, lambda x: a * x + b, lambda x: np.full_like(x, a))
    if key == "leakyrelu":
        a = alpha if alpha is not None else 0.01
        return Activation(
            name, lambda x: np.where(x >= 0, x, a * x), lambda x: np.where(x >= 0, 1.0, a).astype(x.dtype)
        )
    if key == "thresholdedrelu":
        a = alpha if alpha is not None else 1.0
        return Activation(
            name, lambda x: np.where(x > a, x, 0).astype(x.dtype), lambda x: (x > a).astype(x.dtype)
        )
    if key == "scaledtanh":
        a, b = alpha if alpha is not None else 1.0, beta if beta is not None else 1.0
        return Activation(name, lambda x: a * np.tanh(b * x), lambda x: a * b * (1 - np.tanh(b * x) ** 2))
    if key == "hardsigmoid":
        a, b = alpha if alpha is not None else 0.2, beta if beta is not None else 0.5
        return Activation(
            name,
            lambda x: np.clip(a * x + b, 0, 1),
            lambda x: np.where((a * x + b > 0) & (a * x + b < 1), a, 0.0).astype(x.dtype),
        )
    if key == "elu":
        a = alpha if alpha is not None else 1.0
        return Activation(
            name,
            lambda x: np.where(x > 0, x, a * np.expm1(np.minimum(x, 0))),
            lambda x: np.where(x > 0, 1.0, a * np.exp(np.minimum(x, 0))).astype(x.dtype),
        )
    if key == "softsign":
        return Activation(name, lambda x: x / (1 + np.abs(x)), lambda x: 1 / (1 + np.abs(x)) ** 2)
    if key == "softplus":
        return Activation(name, lambda x: np.logaddexp(0, x), sig)
    raise InputError(
        f"unknown recurrent activation {name!r}",
        where="activations",
        hint="use Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign or Softplus",
    )


_NEEDS_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
_NEEDS_BETA = {"affine", "scaledtanh", "hardsigmoid"}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _activations(op: str, attrs: dict, num_dir: int) -> list[list[Activation]]:
    per = len(_DEFAULT_ACTS[op])
    names = list(attrs.get("activations", _DEFAULT_ACTS[op] * num_dir))
    if len(names) == per and num_dir == 2:
        names = names * 2
    alphas = list(attrs.get("activation_alpha", []))
    betas = list(attrs.get("activation_beta", []))
    acts = []
    for name in names:
        a = alphas.pop(0) if name.lower() in _NEEDS_ALPHA and alphas else None
        b = betas.pop(0) if name.lower() in _NEEDS_BETA and betas else None
        acts.append(_activation(name, a, b))
    return [acts[d * per : (d + 1) * per] for d in range(num_dir)]


# --------------------------------------------------------------------------- common plumbing


@dataclass
class _Setup:
    op: str
    x: np.ndarray  # [T, B, I] (layout 0)
    W: np.ndarray
    R: np.ndarray
    B: np.ndarray
    lens: np.ndarray  # [B] int
    h0: np.ndarray  # [nd, B, H]
    c0: np.ndarray | None
    P: np.ndarray | None
    H: int
    num_dir: int
    directions: list[bool]  # reverse flag per stacked direction
    acts: list[list[Activation]]
    clip: float | None
    layout: int
    input_forget: bool
    lbr: bool
    # The products X W^T and H R^T of direction d ("W" or "R"), with a mask of the batch rows
    # still running at the previous step (None for X W^T and the first step); None: float
    # matmuls. Quantized cells (com.microsoft DynamicQuantizeLSTM) quantize activations here.
    matmul: Callable[[np.ndarray, int, str, np.ndarray | None], np.ndarray] | None = None

    def lstm_state(self) -> tuple[np.ndarray, np.ndarray]:
        """``(c0, P)``, which :func:`_setup` fills for LSTM."""
        assert self.c0 is not None and self.P is not None, self.op
        return self.c0, self.P


def _opt(inputs: list, i: int):
    return inputs[i] if len(inputs) > i and inputs[i] is not None and np.size(inputs[i]) else None


_INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _check_shape(op: str, k: int, a: np.ndarray, want: tuple, layout_note: str = "") -> None:
    """Input ``k`` must have shape ``want`` (ints, or None for any size): as ONNX Runtime checks."""
    if a.ndim != len(want) or any(w is not None and s != w for s, w in zip(a.shape, want)):
        dims = ", ".join("?" if w is None else str(w) for w in want)
        raise InputError(
            f"{op} input {k} ({_INPUT_NAMES[k]}) has shape {list(a.shape)}, expected [{dims}]{layout_note}",
            where=op,
            hint="the tensor feeding it has the wrong shape (an upstream Reshape/Unsqueeze, or the feeds)",
        )


def _setup(op: str, inputs: list, attrs: dict) -> _Setup:
    x, W, R = inputs[0], inputs[1], inputs[2]
    layout = attrs.get("layout", 0)
    note = " (layout=1: [batch, seq, input])" if layout else " ([seq, batch, input])"
    _check_shape(op, 0, x, (None, None, None), note)
    direction = attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise InputError(
            f"{op}: unknown direction {direction!r}", where=op, hint="forward, reverse or bidirectional"
        )
    num_dir = 2 if direction == "bidirectional" else 1
    G = _GATES[op]
    _check_shape(op, 2, R, (num_dir, None, None))
    H = int(attrs.get("hidden_size", R.shape[-1]))
    _check_shape(op, 1, W, (num_dir, G * H, x.shape[-1]))
    _check_shape(op, 2, R, (num_dir, G * H, H))
    # Everything is computed in float64 for narrow floats, rounded once at the outputs
    # (ops/__init__: Exactness); ONNX Runtime's float16 cells compute in float32.
    dt = wide(x.dtype)
    x, W, R = x.astype(dt, copy=False), W.astype(dt, copy=False), R.astype(dt, copy=False)
    if layout:
        x = np.swapaxes(x, 0, 1)
    T, batch = x.shape[0], x.shape[1]
    st = (batch, num_dir, H) if layout else (num_dir, batch, H)
    st_note = " (layout=1: [batch, num_directions, hidden])" if layout else ""
    B = _opt(inputs, 3)
    if B is not None:
        _check_shape(op, 3, B, (num_dir, 2 * G * H))
    B = np.zeros((num_dir, 2 * G * H), dtype=dt) if B is None else B.astype(dt, copy=False)
    lens = _opt(inputs, 4)
    if lens is not None:
        _check_shape(op, 4, np.asarray(lens), (batch,))
        lens = np.asarray(lens).astype(np.int64)
        if lens.min() < 0 or lens.max() > T:
            raise InputError(
                f"{op} sequence_lens {lens.tolist()[:8]} outside [0, {T}] (the sequence length)",
                where=op,
                hint="each batch entry's length must be at most the sequence axis of X",
            )
    else:
        lens = np.full(batch, T, dtype=np.int64)

    def state(k: int):
        a = _opt(inputs, k)
        if a is None:
            return np.zeros((num_dir, batch, H), dtype=dt)
        _check_shape(op, k, a, st, st_note)
        a = a.astype(dt, copy=False)
        return np.swapaxes(a, 0, 1) if layout else a

    h0 = state(5)
    c0 = P = None
    if op == "LSTM":
        c0 = state(6)
        P = _opt(inputs, 7)
        if P is not None:
            _check_shape(op, 7, P, (num_dir, 3 * H))
        P = np.zeros((num_dir, 3 * H), dtype=dt) if P is None else P.astype(dt, copy=False)
    return _Setup(
        op=op,
        x=x,
        W=W,
        R=R,
        B=B,
        lens=lens,
        h0=h0,
        c0=c0,
        P=P,
        H=H,
        num_dir=num_dir,
        directions=[False, True] if num_dir == 2 else [direction == "reverse"],
        acts=_activations(op, attrs, num_dir),
        clip=attrs.get("clip"),
        layout=layout,
        input_forget=bool(attrs.get("input_forget", 0)),
        lbr=bool(attrs.get("linear_before_reset", 0)),
    )


def _reverse_within(a: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Reverse [T, B, ...] along time, each batch entry within its own length (an involution)."""
    T = a.shape[0]
    t = np.arange(T)[:, None]
    src = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # [T, B]
    return a[src, np.arange(a.shape[1])[None, :]]


def _clip(p: np.ndarray, clip: float | None) -> tuple[np.ndarray, np.ndarray | float]:
    if clip is None:
        return p, 1.0
    return np.clip(p, -clip, clip), (np.abs(p) <= clip).astype(p.dtype)


# --------------------------------------------------------------------------- one direction, forward


def _run_direction(s: _Setup, d: int, reverse: bool, keep: bool):
    """Run direction ``d``; return (Y [T,B,H], h_T, c_T, tape) where tape feeds the backward sweep."""
    x = _reverse_within(s.x, s.lens) if reverse else s.x
    W, R, H = s.W[d], s.R[d], s.H
    G = _GATES[s.op]
    Wb, Rb = s.B[d, : G * H], s.B[d, G * H :]
    acts = s.acts[d]
    T, batch = x.shape[0], x.shape[1]
    xw = (x @ W.T if s.matmul is None else s.matmul(x, d, "W", None)) + Wb  # [T, B, G*H]
    h = s.h0[d]
    c = s.lstm_state()[0][d] if s.op == "LSTM" else None
    Y = np.zeros((T, batch, H), dtype=x.dtype)
    tape = []
    rec: tuple  # what the backward sweep needs of step t, per op
    cmf: np.ndarray | float
    for t in range(T):
        m = (t < s.lens)[:, None].astype(x.dtype)
        if s.op == "RNN":
            p, cm = _clip(xw[t] + h @ R.T + Rb, s.clip)
            hn = acts[0].f(p)
            rec = (h, p, cm)
            cn = None
        elif s.op == "GRU":
            f, g = acts
            hR = h @ R.T  # [B, 3H]
            pz, cmz = _clip(xw[t, :, :H] + hR[:, :H] + Rb[:H], s.clip)
            pr, cmr = _clip(xw[t, :, H : 2 * H] + hR[:, H : 2 * H] + Rb[H : 2 * H], s.clip)
            z, r = f.f(pz), f.f(pr)
            Rh, Rbh = R[2 * H :], Rb[2 * H :]
            if s.lbr:
                u = hR[:, 2 * H :] + Rbh
                ph = xw[t, :, 2 * H :] + r * u
            else:
                u = None
                ph = xw[t, :, 2 * H :] + (r * h) @ Rh.T + Rbh
            ph, cmh = _clip(ph, s.clip)
            hc = g.f(ph)
            hn = (1 - z) * hc + z * h
            rec = (h, pz, pr, ph, cmz, cmr, cmh, z, r, hc, u)
            cn = None
        else:  # LSTM
            f, g, hact = acts
            P = s.lstm_state()[1][d]
            pre = (
                xw[t]
                + (h @ R.T if s.matmul is None else s.matmul(h, d, "R", s.lens >= t if t else None))
                + Rb
            )
            pi, cmi = _clip(pre[:, :H] + P[:H] * c, s.clip)
            i = f.f(pi)
            if s.input_forget:
                pf, cmf = pre[:, 2 * H : 3 * H], 0.0
                fg = 1 - i
            else:
                pf, cmf = _clip(pre[:, 2 * H : 3 * H] + P[2 * H :] * c, s.clip)
                fg = f.f(pf)
            pc, cmc = _clip(pre[:, 3 * H :], s.clip)
            ct = g.f(pc)
            cn = fg * c + i * ct
            po, cmo = _clip(pre[:, H : 2 * H] + P[H : 2 * H] * cn, s.clip)
            o = f.f(po)
            hn = o * hact.f(cn)
            rec = (h, c, pi, pf, pc, po, cmi, cmf, cmc, cmo, i, fg, ct, o, cn)
        Y[t] = m * hn
        h = m * hn + (1 - m) * h
        if cn is not None:
            c = m * cn + (1 - m) * c
        if keep:
            tape.append((m, rec))
    if reverse:
        Y = _reverse_within(Y, s.lens)
    return Y, h, c, (x, xw, tape)


def _forward(op: str, inputs: list, attrs: dict, keep: bool = False, matmul=None):
    s = _setup(op, inputs, attrs)
    s.matmul = matmul
    runs = [_run_direction(s, d, rev, keep) for d, rev in enumerate(s.directions)]
    Y = np.stack([r[0] for r in runs], axis=1)  # [T, nd, B, H]
    Yh = np.stack([r[1] for r in runs])
    Yc = np.stack([r[2] for r in runs]) if op == "LSTM" else None
    if s.layout:
        Y = np.transpose(Y, (2, 0, 1, 3))
        Yh = np.swapaxes(Yh, 0, 1)
        Yc = np.swapaxes(Yc, 0, 1) if Yc is not None else None
    dt = inputs[0].dtype
    outs = (Y.astype(dt), Yh.astype(dt)) + ((Yc.astype(dt),) if Yc is not None else ())  # LSTM
    return outs, s, runs


# --------------------------------------------------------------------------- one direction, backward


def _backprop_direction(s: _Setup, d: int, reverse: bool, run, gY, gh, gc):
    """BPTT of direction ``d``. ``gY`` [T,B,H] in original time order. Returns input gradients."""
    x, xw, tape = run[3]
    W, R, H = s.W[d], s.R[d], s.H
    G = _GATES[s.op]
    Rb = s.B[d, G * H :]
    acts = s.acts[d]
    if reverse:
        gY = _reverse_within(gY, s.lens)
    dxw = np.zeros_like(xw)
    dR = np.zeros_like(R)
    dRb = np.zeros_like(Rb)
    dP = np.zeros(3 * H, dtype=x.dtype) if s.op == "LSTM" else None
    dh = gh.copy()
    dc = gc.copy() if s.op == "LSTM" else None
    for t in range(len(tape) - 1, -1, -1):
        m, rec = tape[t]
        dH = m * (gY[t] + dh)
        dh_prev = (1 - m) * dh
        if s.op == "RNN":
            h, p, cm = rec
            dp = dH * acts[0].df(p) * cm
            dpre = dp
            dh_prev = dh_prev + dp @ R
        elif s.op == "GRU":
            f, g = acts
            h, pz, pr, ph, cmz, cmr, cmh, z, r, hc, u = rec
            dz = dH * (h - hc)
            dph = dH * (1 - z) * g.df(ph) * cmh
            dh_prev = dh_prev + dH * z
            Rh = R[2 * H :]
            if s.lbr:
                dr = dph * u
                du = dph * r
                dR[2 * H :] += du.T @ h
                dRb[2 * H :] += du.sum(0)
                dh_prev = dh_prev + du @ Rh
            else:
                drh = dph @ Rh
                dR[2 * H :] += dph.T @ (r * h)
                dRb[2 * H :] += dph.sum(0)
                dr = drh * h
                dh_prev = dh_prev + drh * r
            dpz = dz * f.df(pz) * cmz
            dpr = dr * f.df(pr) * cmr
            dzr = np.concatenate([dpz, dpr], axis=1)
            dR[: 2 * H] += dzr.T @ h
            dRb[: 2 * H] += dzr.sum(0)
            dh_prev = dh_prev + dzr @ R[: 2 * H]
            dpre = np.concatenate([dzr, dph], axis=1)
        else:  # LSTM
            f, g, hact = acts
            P = s.lstm_state()[1][d]
            assert dP is not None and dc is not None  # made above for LSTM
            h, c, pi, pf, pc, po, cmi, cmf, cmc, cmo, i, fg, ct, o, cn = rec
            dC = m * dc + dH * o * hact.df(cn)
            dc_prev = (1 - m) * dc
            dpo = dH * hact.f(cn) * f.df(po) * cmo
            dC = dC + dpo * P[H : 2 * H]
            di = dC * ct
            dfg = dC * c
            dpc = dC * i * g.df(pc) * cmc
            dc_prev = dc_prev + dC * fg
            if s.input_forget:
                di = di - dfg
                dpf = np.zeros_like(dfg)
            else:
                dpf = dfg * f.df(pf) * cmf
            dpi = di * f.df(pi) * cmi
            dc_prev = dc_prev + dpi * P[:H] + dpf * P[2 * H :]
            dP[:H] += (dpi * c).sum(0)
            dP[H : 2 * H] += (dpo * cn).sum(0)
            dP[2 * H :] += (dpf * c).sum(0)
            dpre = np.concatenate([dpi, dpo, dpf, dpc], axis=1)
            dRb += dpre.sum(0)
            dR += dpre.T @ h
            dh_prev = dh_prev + dpre @ R
            dc = dc_prev
        if s.op == "RNN":
            dR += dpre.T @ h
            dRb += dpre.sum(0)
        dxw[t] = dpre
        dh = dh_prev
    dW = np.einsum("tbg,tbi->gi", dxw, x)
    dWb = dxw.sum(axis=(0, 1))
    dx = dxw @ W
    if reverse:
        dx = _reverse_within(dx, s.lens)
    return dx, dW, dR, np.concatenate([dWb, dRb]), dh, dc, dP


def _vjp(op: str, inputs: list, attrs: dict, grads) -> list:
    _, s, runs = _forward(op, inputs, attrs, keep=True)
    dt = s.x.dtype
    T, batch = s.x.shape[0], s.x.shape[1]
    nd, H = s.num_dir, s.H

    def _g(k: int, shape_layout0: tuple) -> np.ndarray:
        g = grads[k] if len(grads) > k else None
        if g is None:
            return np.zeros(shape_layout0, dtype=dt)
        g = np.asarray(g, dtype=dt)
        if s.layout:
            g = np.transpose(g, (1, 2, 0, 3)) if g.ndim == 4 else np.swapaxes(g, 0, 1)
        return g

    gY = _g(0, (T, nd, batch, H))
    gYh = _g(1, (nd, batch, H))
    gYc = _g(2, (nd, batch, H)) if op == "LSTM" else None
    dx = np.zeros_like(s.x)
    dW, dR, dB, dh0 = np.zeros_like(s.W), np.zeros_like(s.R), np.zeros_like(s.B), np.zeros_like(s.h0)
    dc0 = np.zeros_like(s.c0) if op == "LSTM" else None
    dPs = np.zeros_like(s.P) if op == "LSTM" else None
    for d, rev in enumerate(s.directions):
        r = _backprop_direction(s, d, rev, runs[d], gY[:, d], gYh[d], gYc[d] if gYc is not None else None)
        dx += r[0]
        dW[d], dR[d], dB[d], dh0[d] = r[1], r[2], r[3], r[4]
        if dc0 is not None and dPs is not None:  # LSTM
            dc0[d], dPs[d] = r[5], r[6]
    if s.layout:
        dx = np.swapaxes(dx, 0, 1)
        dh0 = np.swapaxes(dh0, 0, 1)
        dc0 = np.swapaxes(dc0, 0, 1) if dc0 is not None else None
    result = [dx, dW, dR, dB, None, dh0]
    if op == "LSTM":
        result += [dc0, dPs]
    result = result[: len(inputs)]
    # Omitted optional inputs get no gradient.
    return [
        None if (inputs[k] is None or g is None) else g.astype(inputs[k].dtype) for k, g in enumerate(result)
    ]


def _make(op: str):
    def forward(inputs, attrs, ctx):
        return _forward(op, inputs, attrs)[0]

    def vjp(inputs, attrs, outputs, grads, ctx):
        return _vjp(op, inputs, attrs, grads)

    register(op)(forward)
    register_vjp(op)(vjp)


for _op in ("RNN", "GRU", "LSTM"):
    _make(_op)
