"""Op family: signal processing: window functions, DFT, STFT and the mel filter bank.

Rules
-----
1. Window functions are periodic by default (denominator N) and symmetric with ``periodic=0``
   (denominator N-1).
2. DFT treats the last axis (size 1: real, 2: complex) as the complex parts; the inverse scales
   by 1/n; ``onesided`` keeps the n//2+1 non-negative frequencies.
"""

from __future__ import annotations

import numpy as np
from mconv.engines.reference.ops import register
from mconv.engines.reference.ops.misc import _onnx_dtype


def _window(attrs, size, coeffs: tuple[float, ...]) -> np.ndarray:
    n = int(np.asarray(size).reshape(-1)[0])
    periodic = int(attrs.get("periodic", 1)) == 1
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    w = np.zeros(n, dtype=np.float64)
    for i, c in enumerate(coeffs):
        w += c * np.cos(2.0 * np.pi * i * k / denom) if i else c
    return w.astype(_onnx_dtype(attrs.get("output_datatype", 1)))


@register("HannWindow")
def hann_window(inputs, attrs, ctx):
    return (_window(attrs, inputs[0], (0.5, -0.5)),)


@register("HammingWindow")
def hamming_window(inputs, attrs, ctx):
    alpha = 25.0 / 46.0
    return (_window(attrs, inputs[0], (alpha, -(1.0 - alpha))),)


@register("BlackmanWindow")
def blackman_window(inputs, attrs, ctx):
    return (_window(attrs, inputs[0], (0.42, -0.5, 0.08)),)


def _to_complex(x: np.ndarray) -> np.ndarray:
    ctype = np.complex64 if x.dtype == np.float32 else np.complex128
    if x.shape[-1] == 2:
        return (x[..., 0] + 1j * x[..., 1]).astype(ctype)
    return x[..., 0].astype(ctype)


def _from_complex(c: np.ndarray, dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


@register("DFT")
def dft(inputs, attrs, ctx):
    x = inputs[0]
    length = inputs[1] if len(inputs) > 1 else None
    if ctx.opset >= 20:
        axis = int(np.asarray(inputs[2]).reshape(-1)[0]) if len(inputs) > 2 and inputs[2] is not None else -2
    else:
        axis = int(attrs.get("axis", 1))
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        raise ValueError("DFT axis cannot be the last (complex) axis")
    # numpy's FFT keeps single precision for complex64: the suite's expected values do too.
    c = _to_complex(x if x.dtype in (np.float32, np.float64) else x.astype(np.float32))
    inverse = int(attrs.get("inverse", 0)) == 1
    onesided = int(attrs.get("onesided", 0)) == 1
    if inverse and onesided:  # one-sided spectrum in, real signal out (irfft)
        n = int(np.asarray(length).reshape(-1)[0]) if length is not None else 2 * (c.shape[axis] - 1)
        return (np.fft.irfft(c, n=n, axis=axis)[..., None].astype(x.dtype),)
    n = int(np.asarray(length).reshape(-1)[0]) if length is not None else c.shape[axis]
    y = np.fft.ifft(c, n=n, axis=axis) if inverse else np.fft.fft(c, n=n, axis=axis)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return (_from_complex(y, x.dtype),)


@register("STFT")
def stft(inputs, attrs, ctx):
    signal, step = inputs[0], int(np.asarray(inputs[1]).reshape(-1)[0])
    window = inputs[2] if len(inputs) > 2 else None
    flen = inputs[3] if len(inputs) > 3 else None
    n = int(np.asarray(flen).reshape(-1)[0]) if flen is not None else window.shape[0]
    c = _to_complex(signal.astype(np.float64))  # [batch, length]
    frames = 1 + (c.shape[1] - n) // step
    idx = np.arange(frames)[:, None] * step + np.arange(n)[None, :]
    framed = c[:, idx]  # [batch, frames, n]
    if window is not None:
        framed = framed * window.astype(np.float64)
    y = np.fft.fft(framed, n=n, axis=-1)
    if int(attrs.get("onesided", 1)) == 1:
        y = y[..., : n // 2 + 1]
    return (_from_complex(y, signal.dtype),)


@register("MelWeightMatrix")
def mel_weight_matrix(inputs, attrs, ctx):
    num_mel, dft_len, rate = (int(np.asarray(v).reshape(-1)[0]) for v in inputs[:3])
    lo, hi = (float(np.asarray(v).reshape(-1)[0]) for v in inputs[3:5])
    bins = dft_len // 2 + 1

    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    # The spec spaces the num_mel+2 mel points by (high - low) / (num_mel + 2), so the last
    # point stops one step short of the upper edge.
    step = (hz_to_mel(hi) - hz_to_mel(lo)) / (num_mel + 2)
    mel_points = hz_to_mel(lo) + step * np.arange(num_mel + 2)
    hz_points = 700.0 * (10.0 ** (mel_points / 2595.0) - 1.0)
    fft_bins = np.floor((dft_len + 1) * hz_points / rate).astype(np.int64)
    out = np.zeros((bins, num_mel), dtype=np.float32)
    for m in range(1, num_mel + 1):
        left, center, right = fft_bins[m - 1], fft_bins[m], fft_bins[m + 1]
        if center > left:
            k = np.arange(left, center + 1)
            out[k, m - 1] = (k - left) / (center - left)
        else:
            out[center, m - 1] = 1.0
        if right > center:
            k = np.arange(center, right)
            out[k, m - 1] = (right - k) / (right - center)
    return (out.astype(_onnx_dtype(attrs.get("output_datatype", 1))),)
