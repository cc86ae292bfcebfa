"""Recurrent ops: LSTM, GRU and RNN as ``lax.scan`` over time, one scan per direction.

Rules:

1. Gate orders are ONNX's: LSTM i, o, f, c; GRU z, r, h. Defaults: sigmoid for gates, tanh
   for the cell/hidden; ``activations`` may name Sigmoid, Tanh, Relu, HardSigmoid, LeakyRelu,
   Softsign, Softplus, Elu, Affine, ThresholdedRelu, ScaledTanh (with ``activation_alpha/beta``).
2. ``clip`` clamps the gate pre-activations; LSTM peepholes (P) and ``input_forget`` are applied.
3. GRU ``linear_before_reset=1`` applies the reset gate after the recurrent product.
4. ``layout=1`` means batch-major X/Y; bidirectional runs the reverse scan on the reversed
   sequence and flips its outputs back.
5. ``sequence_lens`` is honoured only when it is absent or static and equal to the sequence
   length everywhere; anything else is refused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import is_static, lower

_P = lax.Precision.HIGHEST


def _activation(name: str, alpha, beta):
    name = name.lower()
    table = {
        "sigmoid": jax.nn.sigmoid,
        "tanh": jnp.tanh,
        "relu": jax.nn.relu,
        "softsign": lambda x: x / (1 + jnp.abs(x)),
        "softplus": jax.nn.softplus,
        "hardsigmoid": lambda x: jnp.clip(
            (0.2 if alpha is None else alpha) * x + (0.5 if beta is None else beta), 0, 1
        ),
        "leakyrelu": lambda x: jnp.where(x >= 0, x, (0.01 if alpha is None else alpha) * x),
        "elu": lambda x: jnp.where(x > 0, x, (1.0 if alpha is None else alpha) * jnp.expm1(x)),
        "affine": lambda x: (1.0 if alpha is None else alpha) * x + (0.0 if beta is None else beta),
        "thresholdedrelu": lambda x: jnp.where(x > (1.0 if alpha is None else alpha), x, 0),
        "scaledtanh": lambda x: (
            (1.0 if alpha is None else alpha) * jnp.tanh((1.0 if beta is None else beta) * x)
        ),
    }
    if name not in table:
        raise NotImplementedError(f"recurrent activation '{name}' is not lowered")
    return table[name]


def _activations(attrs, defaults: list[str], dirs: int):
    names = attrs.get("activations") or defaults * dirs
    alphas = list(attrs.get("activation_alpha", []))
    betas = list(attrs.get("activation_beta", []))
    acts = []
    for i, n in enumerate(names):
        acts.append(
            _activation(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
        )
    k = len(defaults)
    return [acts[d * k : (d + 1) * k] for d in range(dirs)]


def _prepare(inputs, attrs, ctx, gates: int):
    x, w, r = inputs[0], inputs[1], inputs[2]
    b = inputs[3] if len(inputs) > 3 else None
    seq_lens = inputs[4] if len(inputs) > 4 else None
    h0 = inputs[5] if len(inputs) > 5 else None
    layout = attrs.get("layout", 0)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
    seq, batch = x.shape[0], x.shape[1]
    if seq_lens is not None:
        if not is_static(seq_lens) or not np.all(np.asarray(seq_lens) == seq):
            raise NotImplementedError("sequence_lens other than the full length is not lowered")
    dirs = w.shape[0]
    hidden = int(attrs.get("hidden_size", r.shape[-1]))
    if b is None:
        b = jnp.zeros((dirs, 2 * gates * hidden), x.dtype)
    if h0 is None:
        h0 = jnp.zeros((dirs, batch, hidden), x.dtype)
    return x, w, r, b, h0, seq, batch, dirs, hidden, layout


def _finish(ys, hs, cs, layout, num_outputs):
    y = jnp.stack(ys, axis=1)  # (seq, dirs, batch, H)
    yh = jnp.stack(hs, axis=0)
    outs = [y, yh]
    if cs is not None:
        outs.append(jnp.stack(cs, axis=0))
    if layout:
        outs = [jnp.transpose(y, (2, 0, 1, 3)), jnp.swapaxes(yh, 0, 1)] + (
            [jnp.swapaxes(outs[2], 0, 1)] if cs is not None else []
        )
    return tuple(outs[:num_outputs])


def _directions(attrs, dirs):
    direction = attrs.get("direction", "forward")
    return ["forward", "reverse"] if direction == "bidirectional" else [direction] * dirs


def _clip(v, clip):
    return v if clip is None else jnp.clip(v, -clip, clip)


@lower("LSTM")
def lstm(inputs, attrs, ctx):
    x, w, r, b, h0, seq, batch, dirs, hid, layout = _prepare(inputs, attrs, ctx, 4)
    c0 = inputs[6] if len(inputs) > 6 and inputs[6] is not None else jnp.zeros((dirs, batch, hid), x.dtype)
    p = inputs[7] if len(inputs) > 7 and inputs[7] is not None else jnp.zeros((dirs, 3 * hid), x.dtype)
    acts = _activations(attrs, ["Sigmoid", "Tanh", "Tanh"], dirs)
    clip = attrs.get("clip")
    couple = attrs.get("input_forget", 0)
    ys, hs, cs = [], [], []
    for d, direction in enumerate(_directions(attrs, dirs)):
        f, g, h_act = acts[d]
        xw = jnp.einsum("sbi,gi->sbg", x, w[d], precision=_P) + b[d, : 4 * hid] + b[d, 4 * hid :]
        pi, po, pf = p[d, :hid], p[d, hid : 2 * hid], p[d, 2 * hid :]
        rd = r[d]

        def step(carry, xt, rd=rd, pi=pi, po=po, pf=pf, f=f, g=g, h_act=h_act):
            h, c = carry
            z = xt + jnp.matmul(h, rd.T, precision=_P)
            zi, zo, zf, zc = jnp.split(z, 4, axis=-1)
            i = f(_clip(zi + pi * c, clip))
            ft = f(_clip(zf + pf * c, clip))
            if couple:
                ft = 1 - i
            ct = g(_clip(zc, clip))
            c_new = ft * c + i * ct
            o = f(_clip(zo + po * c_new, clip))
            h_new = o * h_act(c_new)
            return (h_new, c_new), h_new

        seq_in = jnp.flip(xw, 0) if direction == "reverse" else xw
        (h_last, c_last), y = lax.scan(step, (h0[d], c0[d]), seq_in)
        ys.append(jnp.flip(y, 0) if direction == "reverse" else y)
        hs.append(h_last)
        cs.append(c_last)
    return _finish(ys, hs, cs, layout, ctx.num_outputs)


@lower("GRU")
def gru(inputs, attrs, ctx):
    x, w, r, b, h0, seq, batch, dirs, hid, layout = _prepare(inputs, attrs, ctx, 3)
    acts = _activations(attrs, ["Sigmoid", "Tanh"], dirs)
    clip = attrs.get("clip")
    lbr = attrs.get("linear_before_reset", 0)
    ys, hs = [], []
    for d, direction in enumerate(_directions(attrs, dirs)):
        f, g = acts[d]
        wb, rb = b[d, : 3 * hid], b[d, 3 * hid :]
        xw = jnp.einsum("sbi,gi->sbg", x, w[d], precision=_P) + wb
        rd = r[d]

        def step(h, xt, rd=rd, rb=rb, f=f, g=g):
            xz, xr, xh = jnp.split(xt, 3, axis=-1)
            rz, rr, rh = jnp.split(rd, 3, axis=0)
            bz, br, bh = jnp.split(rb, 3)
            z = f(_clip(xz + jnp.matmul(h, rz.T, precision=_P) + bz, clip))
            rt = f(_clip(xr + jnp.matmul(h, rr.T, precision=_P) + br, clip))
            if lbr:
                ht = g(_clip(xh + rt * (jnp.matmul(h, rh.T, precision=_P) + bh), clip))
            else:
                ht = g(_clip(xh + jnp.matmul(rt * h, rh.T, precision=_P) + bh, clip))
            h_new = (1 - z) * ht + z * h
            return h_new, h_new

        seq_in = jnp.flip(xw, 0) if direction == "reverse" else xw
        h_last, y = lax.scan(step, h0[d], seq_in)
        ys.append(jnp.flip(y, 0) if direction == "reverse" else y)
        hs.append(h_last)
    return _finish(ys, hs, None, layout, ctx.num_outputs)


@lower("RNN")
def rnn(inputs, attrs, ctx):
    x, w, r, b, h0, seq, batch, dirs, hid, layout = _prepare(inputs, attrs, ctx, 1)
    acts = _activations(attrs, ["Tanh"], dirs)
    clip = attrs.get("clip")
    ys, hs = [], []
    for d, direction in enumerate(_directions(attrs, dirs)):
        (f,) = acts[d]
        xw = jnp.einsum("sbi,gi->sbg", x, w[d], precision=_P) + b[d, :hid] + b[d, hid:]
        rd = r[d]

        def step(h, xt, rd=rd, f=f):
            h_new = f(_clip(xt + jnp.matmul(h, rd.T, precision=_P), clip))
            return h_new, h_new

        seq_in = jnp.flip(xw, 0) if direction == "reverse" else xw
        h_last, y = lax.scan(step, h0[d], seq_in)
        ys.append(jnp.flip(y, 0) if direction == "reverse" else y)
        hs.append(h_last)
    return _finish(ys, hs, None, layout, ctx.num_outputs)
