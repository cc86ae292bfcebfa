"""Signal ops: DFT, STFT, and the window / mel-filter generators.

Rules:

1. The last axis holds (real[, imaginary]); DFT and STFT compute with ``jnp.fft`` in complex64
   (complex128 for float64 under x64) and return (real, imaginary) on a new last axis.
2. DFT's ``dft_length`` and axis (attribute before opset 20, input after) are static; a
   one-sided inverse is ``irfft``. STFT needs its frame step and length static; the window may be
   traced.
3. HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix depend only on static sizes:
   they are evaluated at export time with the reference kernels and embedded.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from mconv.engines.xla.lower import lower


def _int(v) -> int:
    return int(np.asarray(v).reshape(-1)[0])


def _to_complex(x):
    x = jnp.asarray(x)
    if x.dtype not in (jnp.float32, jnp.float64):
        x = x.astype(jnp.float32)
    if x.shape[-1] == 2:
        return x[..., 0] + 1j * x[..., 1]
    return x[..., 0].astype(jnp.complex64 if x.dtype == jnp.float32 else jnp.complex128)


def _from_complex(c, dtype):
    return jnp.stack([c.real, c.imag], axis=-1).astype(dtype)


@lower("DFT", static=(1, 2))
def dft(inputs, attrs, ctx):
    x = jnp.asarray(inputs[0])
    length = inputs[1] if len(inputs) > 1 and inputs[1] is not None and np.size(inputs[1]) else None
    if ctx.opset >= 20:
        axis = _int(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else -2
    else:
        axis = int(attrs.get("axis", 1))
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        raise NotImplementedError("DFT axis cannot be the last (complex) axis")
    c = _to_complex(x)
    inverse = int(attrs.get("inverse", 0)) == 1
    onesided = int(attrs.get("onesided", 0)) == 1
    if inverse and onesided:
        n = _int(length) if length is not None else 2 * (c.shape[axis] - 1)
        return (jnp.fft.irfft(c, n=n, axis=axis)[..., None].astype(x.dtype),)
    n = _int(length) if length is not None else c.shape[axis]
    y = jnp.fft.ifft(c, n=n, axis=axis) if inverse else jnp.fft.fft(c, n=n, axis=axis)
    if onesided:
        y = jnp.take(y, jnp.arange(n // 2 + 1), axis=axis)
    return (_from_complex(y, x.dtype),)


@lower("STFT", static=(1, 3))
def stft(inputs, attrs, ctx):
    signal, step = jnp.asarray(inputs[0]), _int(inputs[1])
    window = inputs[2] if len(inputs) > 2 else None
    flen = inputs[3] if len(inputs) > 3 else None
    if flen is not None:
        n = _int(flen)
    elif window is not None:
        n = window.shape[0]
    else:
        raise NotImplementedError("STFT needs a window or a frame length")
    c = _to_complex(signal)  # [batch, length]
    frames = 1 + (c.shape[1] - n) // step
    idx = np.arange(frames)[:, None] * step + np.arange(n)[None, :]
    framed = c[:, idx]  # [batch, frames, n]
    if window is not None:
        framed = framed * jnp.asarray(window).astype(framed.real.dtype)
    y = jnp.fft.fft(framed, n=n, axis=-1)
    if int(attrs.get("onesided", 1)) == 1:
        y = y[..., : n // 2 + 1]
    return (_from_complex(y, signal.dtype),)


def _static_kernel(op: str, n_inputs: int):
    @lower(op, static=tuple(range(n_inputs)))
    def rule(inputs, attrs, ctx):
        from mconv.engines.reference.executor import run_node

        outs = run_node(op, [np.asarray(x) for x in inputs], attrs, opset=ctx.opset)
        return tuple(np.asarray(o) for o in outs)

    return rule


for _op, _n in (("HannWindow", 1), ("HammingWindow", 1), ("BlackmanWindow", 1), ("MelWeightMatrix", 5)):
    _static_kernel(_op, _n)
