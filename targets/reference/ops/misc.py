"""Op family: everything outside the other families: constants and identities, dropout, random
ops, quantization, bitwise ops, signal windows and DFT, small linear algebra, and a documented
fallback to ``onnx.reference`` for the non-numerical long tail.

Rules
-----
1. Quantization (QuantizeLinear/DequantizeLinear): the scale (and zero point) is per tensor
   (scalar), per axis (1-D along ``axis``) or per block (``block_size`` > 0: each scale covers
   ``block_size`` consecutive elements along ``axis``). Integer targets round ``x / scale`` half
   to even, then add the zero point, and saturate to the type's range; float8 targets saturate to the largest finite value when
   ``saturate=1``. The output type is the zero point's, else ``output_dtype``, else uint8.
2. Dropout is the identity at inference (``training_mode`` false or ratio 0) with an all-true
   mask; in training mode it draws a mask from the context's generator and scales by 1/(1-ratio).
3. Random ops use ``seed`` when given (numpy's legacy MT19937 stream for that seed, the one
   ``np.random.seed`` gives), else the executor's generator.
4. Window functions are periodic by default (denominator N) and symmetric with
   ``periodic=0`` (denominator N-1).
5. DFT treats the last axis (size 1: real, 2: complex) as the complex parts; the inverse
   scales by 1/n; ``onesided`` keeps the n//2+1 non-negative frequencies.
6. GridSample, RoiAlign, NonMaxSuppression and TensorScatter follow the ONNX spec where it is
   explicit and ONNX Runtime's conventions where it is not (each docstring says which).
7. ``FALLBACK_OPS`` run through ``onnx.reference`` kernels (see its comment for why each);
   everything else here is our own numpy.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
from mconv.targets.reference.ops import lookup, register, register_vjp

# ----------------------------------------------------------------------------- constants


@register("Constant")
def constant(inputs, attrs, ctx):
    if "value" in attrs:
        return (np.asarray(attrs["value"]),)
    if "value_float" in attrs:
        return (np.array(attrs["value_float"], dtype=np.float32),)
    if "value_floats" in attrs:
        return (np.array(attrs["value_floats"], dtype=np.float32),)
    if "value_int" in attrs:
        return (np.array(attrs["value_int"], dtype=np.int64),)
    if "value_ints" in attrs:
        return (np.array(attrs["value_ints"], dtype=np.int64),)
    if "value_string" in attrs:
        return (np.array(attrs["value_string"], dtype=object),)
    if "value_strings" in attrs:
        return (np.array(attrs["value_strings"], dtype=object),)
    if "sparse_value" in attrs:
        return (_sparse_to_dense(attrs["sparse_value"]),)
    raise ValueError("Constant has no value attribute")


def _sparse_to_dense(sparse) -> np.ndarray:
    """A SparseTensorProto (COO, linear or per-dimension indices) as a dense array."""
    proto = sparse if isinstance(sparse, onnx.SparseTensorProto) else None
    if proto is None:
        raise ValueError("sparse_value is not a SparseTensorProto")
    values = onnx.numpy_helper.to_array(proto.values)
    indices = onnx.numpy_helper.to_array(proto.indices)
    dense = np.zeros(tuple(proto.dims), dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


@register("Identity")
def identity(inputs, attrs, ctx):
    return (inputs[0],)


@register_vjp("Identity")
def identity_vjp(inputs, attrs, outputs, grads, ctx):
    return [grads[0]]


@register("EyeLike")
def eye_like(inputs, attrs, ctx):
    x = inputs[0]
    dtype = _onnx_dtype(attrs["dtype"]) if "dtype" in attrs else x.dtype
    return (np.eye(x.shape[0], x.shape[1], k=int(attrs.get("k", 0)), dtype=dtype),)


def _onnx_dtype(code: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(code)))


# ----------------------------------------------------------------------------- dropout, random


@register("Dropout")
def dropout(inputs, attrs, ctx):
    x = inputs[0]
    ratio = float(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else float(attrs.get("ratio", 0.5))
    training = bool(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else False
    if not training or ratio == 0.0:
        return x, np.ones(x.shape, dtype=bool)
    mask = _rng(attrs, ctx).uniform(0.0, 1.0, size=x.shape) >= ratio
    return (x * mask / (1.0 - ratio)).astype(x.dtype), mask


@register_vjp("Dropout")
def dropout_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    ratio = float(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else float(attrs.get("ratio", 0.5))
    training = bool(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else False
    g = grads[0]
    if g is None:
        return [None] * len(inputs)
    if training and ratio != 0.0:
        g = (g * outputs[1] / (1.0 - ratio)).astype(x.dtype)
    return [g] + [None] * (len(inputs) - 1)


def _rng(attrs, ctx) -> np.random.Generator | np.random.RandomState:
    # A seeded op draws from numpy's legacy MT19937 stream: the same numbers as
    # ``np.random.seed(seed)`` followed by the same draw, which is what ONNX's test data uses.
    return np.random.RandomState(int(attrs["seed"])) if "seed" in attrs else ctx.rng


def _random_dtype(attrs, like=None) -> np.dtype:
    if "dtype" in attrs:
        return _onnx_dtype(attrs["dtype"])
    return like.dtype if like is not None else np.dtype(np.float32)


@register("RandomUniform", "RandomUniformLike")
def random_uniform(inputs, attrs, ctx):
    like = inputs[0] if inputs else None
    shape = like.shape if like is not None else tuple(attrs["shape"])
    low, high = float(attrs.get("low", 0.0)), float(attrs.get("high", 1.0))
    return (_rng(attrs, ctx).uniform(low, high, size=shape).astype(_random_dtype(attrs, like)),)


@register("RandomNormal", "RandomNormalLike")
def random_normal(inputs, attrs, ctx):
    like = inputs[0] if inputs else None
    shape = like.shape if like is not None else tuple(attrs["shape"])
    mean, scale = float(attrs.get("mean", 0.0)), float(attrs.get("scale", 1.0))
    return (_rng(attrs, ctx).normal(mean, scale, size=shape).astype(_random_dtype(attrs, like)),)


@register("Bernoulli")
def bernoulli(inputs, attrs, ctx):
    p = inputs[0]
    draw = _rng(attrs, ctx).uniform(size=p.shape)
    return ((draw < p).astype(_random_dtype(attrs, p)),)


# ----------------------------------------------------------------------------- quantization


def _is_float8(dtype: np.dtype) -> bool:
    return dtype.name.startswith(("float8", "float4"))


def _broadcast_param(p: np.ndarray, x: np.ndarray, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point laid out to broadcast against ``x`` (per tensor, axis or block)."""
    if p.ndim == 0 or p.size == 1 and block_size == 0:
        return p.reshape(())
    axis = axis % x.ndim
    if block_size > 0:
        p = np.repeat(p, block_size, axis=axis)
        return np.take(p, np.arange(x.shape[axis]), axis=axis)
    shape = [1] * x.ndim
    shape[axis] = p.size
    return p.reshape(shape)


def _quantize_to(v: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    if _is_float8(dtype):
        if saturate:
            finfo = ml_dtypes.finfo(dtype)
            big = float(finfo.max)
            v = np.where(np.isinf(v), np.sign(v) * big, v)
            v = np.clip(v, -big, big)
        return v.astype(dtype)
    try:
        info = ml_dtypes.iinfo(dtype)
    except ValueError:
        info = np.iinfo(dtype)
    return np.clip(np.rint(v), info.min, info.max).astype(dtype)


@register("QuantizeLinear")
def quantize_linear(inputs, attrs, ctx):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    if zp is not None:
        out_dtype = zp.dtype
    elif attrs.get("output_dtype"):
        out_dtype = _onnx_dtype(attrs["output_dtype"])
    else:
        out_dtype = np.dtype(np.uint8)
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    s = _broadcast_param(scale, x, axis, block).astype(np.float32)
    v = x.astype(np.float32) / s
    if not _is_float8(np.dtype(out_dtype)):
        # saturate(round(x / scale) + zero_point): the rounding comes BEFORE the zero point (a
        # quotient of exactly k + 0.5 rounds to even first; adding the zero point first moves the tie).
        v = np.rint(v).astype(np.float64)
    if zp is not None:
        v = v + _broadcast_param(zp, x, axis, block).astype(v.dtype)
    return (_quantize_to(v, np.dtype(out_dtype), bool(attrs.get("saturate", 1))),)


@register("DequantizeLinear")
def dequantize_linear(inputs, attrs, ctx):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    v = x.astype(np.float32)
    if zp is not None:
        v = v - _broadcast_param(zp, x, axis, block).astype(np.float32)
    out_dtype = _onnx_dtype(attrs["output_dtype"]) if attrs.get("output_dtype") else scale.dtype
    return ((v * _broadcast_param(scale, x, axis, block).astype(np.float32)).astype(out_dtype),)


@register_vjp("DequantizeLinear")
def dequantize_linear_vjp(inputs, attrs, outputs, grads, ctx):
    return [None] * len(inputs)  # integer input: no gradient flows through the codes


@register("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs, attrs, ctx):
    x = inputs[0].astype(np.float32)
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((hi - lo) / 255.0) if hi != lo else np.float32(1.0)
    zp = np.clip(np.rint(0.0 - lo / scale), 0, 255).astype(np.uint8)
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)


def _int_minus(x, zp):
    x = x.astype(np.int32)
    return x if zp is None else x - zp.astype(np.int32)


@register("MatMulInteger")
def matmul_integer(inputs, attrs, ctx):
    a, b = inputs[0], inputs[1]
    a_zp = inputs[2] if len(inputs) > 2 else None
    b_zp = inputs[3] if len(inputs) > 3 else None
    if a_zp is not None and a_zp.ndim == 1 and a_zp.size > 1:  # per-row zero point of A
        a_zp = a_zp.reshape(-1, 1)
    return (np.matmul(_int_minus(a, a_zp), _int_minus(b, b_zp)).astype(np.int32),)


def _conv_forward(x, w, attrs, ctx):
    conv = lookup("Conv")
    if conv is None:
        raise NotImplementedError("Conv kernel is not registered")
    return conv.forward([x, w, None], attrs, ctx)[0]


@register("ConvInteger")
def conv_integer(inputs, attrs, ctx):
    x, w = inputs[0], inputs[1]
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    if w_zp is not None and w_zp.size > 1:
        w_zp = w_zp.reshape(-1, *([1] * (w.ndim - 1)))
    xf = _int_minus(x, x_zp).astype(np.float64)
    wf = _int_minus(w, w_zp).astype(np.float64)
    return (np.rint(_conv_forward(xf, wf, attrs, ctx)).astype(np.int32),)


@register("QLinearMatMul")
def qlinear_matmul(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs
    af = (a.astype(np.float64) - a_zp.astype(np.float64)) * a_s.astype(np.float64)
    bf = (
        b.astype(np.float64) - b_zp.astype(np.float64).reshape(-1)[None, :]
        if b_zp.size > 1
        else b.astype(np.float64) - b_zp.astype(np.float64)
    ) * (b_s.astype(np.float64).reshape(-1)[None, :] if b_s.size > 1 else b_s.astype(np.float64))
    y = np.matmul(af, bf) / y_s.astype(np.float64) + y_zp.astype(np.float64)
    return (_quantize_to(y, y_zp.dtype, True),)


@register("QLinearConv")
def qlinear_conv(inputs, attrs, ctx):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    per_oc = (-1,) + (1,) * (w.ndim - 1)
    xf = x.astype(np.float64) - x_zp.astype(np.float64)
    wf = w.astype(np.float64) - (w_zp.astype(np.float64).reshape(per_oc) if w_zp.size > 1 else w_zp)
    acc = _conv_forward(xf, wf, attrs, ctx)  # integer-valued accumulator
    if bias is not None:
        acc = acc + bias.astype(np.float64).reshape(1, -1, *([1] * (x.ndim - 2)))
    ws = w_s.astype(np.float64).reshape(1, -1, *([1] * (x.ndim - 2))) if w_s.size > 1 else w_s
    y = acc * (x_s.astype(np.float64) * ws) / y_s.astype(np.float64) + y_zp.astype(np.float64)
    return (_quantize_to(y, y_zp.dtype, True),)


# ----------------------------------------------------------------------------- bitwise


@register("BitwiseAnd")
def bitwise_and(inputs, attrs, ctx):
    return (np.bitwise_and(inputs[0], inputs[1]),)


@register("BitwiseOr")
def bitwise_or(inputs, attrs, ctx):
    return (np.bitwise_or(inputs[0], inputs[1]),)


@register("BitwiseXor")
def bitwise_xor(inputs, attrs, ctx):
    return (np.bitwise_xor(inputs[0], inputs[1]),)


@register("BitwiseNot")
def bitwise_not(inputs, attrs, ctx):
    return (np.bitwise_not(inputs[0]),)


@register("BitShift")
def bit_shift(inputs, attrs, ctx):
    x, y = inputs[0], inputs[1].astype(inputs[0].dtype)
    if attrs["direction"] == "LEFT":
        return (np.left_shift(x, y).astype(x.dtype),)
    return (np.right_shift(x, y).astype(x.dtype),)


@register("BitCast")
def bit_cast(inputs, attrs, ctx):
    x = inputs[0]
    to = _onnx_dtype(attrs["to"])
    if to.itemsize == x.dtype.itemsize:
        return (x.view(to),)
    # Different widths: the last axis is regrouped (same bytes, little-endian order).
    y = np.ascontiguousarray(x).view(to)
    return (y.reshape(*x.shape[:-1], -1) if x.ndim else y,)


# ----------------------------------------------------------------------------- linear algebra


@register("Det")
def det(inputs, attrs, ctx):
    x = inputs[0]
    return (np.linalg.det(x).astype(x.dtype),)


@register_vjp("Det")
def det_vjp(inputs, attrs, outputs, grads, ctx):
    # d det(A) = det(A) tr(A^-1 dA)  =>  grad_A = g * det(A) * A^-T
    x, g = inputs[0], grads[0]
    inv_t = np.swapaxes(np.linalg.inv(x), -1, -2)
    return [
        (np.asarray(g)[..., None, None] * np.asarray(outputs[0])[..., None, None] * inv_t).astype(x.dtype)
    ]


# ----------------------------------------------------------------------------- signal


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


# ----------------------------------------------------------------------------- sampling, caches


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates about the borders until they fall inside ``[lo, hi]``."""
    span = hi - lo
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, x - hi)
    n = np.trunc(dx / span) if span > 0 else np.zeros_like(dx)
    r = dx - n * span
    even = n % 2 == 0
    return np.where(below, np.where(even, lo + r, hi - r), np.where(above, np.where(even, hi - r, lo + r), x))


def _cubic_coeffs(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75  # the cubic convolution constant PyTorch and ONNX use
    return [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]


@register("GridSample")
def grid_sample(inputs, attrs, ctx):
    """N-d grid sampling. The grid's last axis lists coordinates innermost-first (x, y, ...),
    normalized to [-1, 1]; ``align_corners`` maps -1/1 to the centres (1) or the outer edges (0)
    of the corner pixels. Padding: zeros, border (clamp) or reflection."""
    x, grid = inputs[0], inputs[1]
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(
        attrs.get("mode", "linear"), attrs.get("mode", "linear")
    )
    padding = attrs.get("padding_mode", "zeros")
    align = int(attrs.get("align_corners", 0)) == 1
    n_batch, channels = x.shape[:2]
    dims = x.shape[2:]
    g = grid.astype(np.float64)[..., ::-1]  # now in X's dimension order
    out_shape = grid.shape[1:-1]
    lo = [0.0 if align else -0.5 for _ in dims]
    hi = [d - 1.0 if align else d - 0.5 for d in dims]
    coords = []
    for i, d in enumerate(dims):
        c = (g[..., i] + 1) / 2.0 * (d - 1) if align else ((g[..., i] + 1) * d - 1) / 2.0
        if mode == "nearest":
            c = np.rint(c)
        if padding == "border":
            c = np.where((c < lo[i]) | (c > hi[i]), np.clip(c, 0, d - 1), c)
        elif padding == "reflection":
            c = _reflect(c, lo[i], hi[i])
        coords.append(c)
    batch_idx = np.arange(n_batch).reshape((n_batch,) + (1,) * len(out_shape))

    def gather(idx: list[np.ndarray]) -> np.ndarray:
        valid = np.ones(idx[0].shape, dtype=bool)
        fixed = []
        for i, (k, d) in enumerate(zip(idx, dims)):
            if padding == "zeros":
                valid &= (k >= 0) & (k < d)
                k = np.clip(k, 0, d - 1)
            elif padding == "border":
                k = np.clip(k, 0, d - 1)
            else:
                k = np.clip(np.trunc(_reflect(k.astype(np.float64), lo[i], hi[i])).astype(np.int64), 0, d - 1)
            fixed.append(k)
        vals = np.moveaxis(x, 1, -1)[(batch_idx, *fixed)]  # (N, *out, C)
        return np.where(valid[..., None], vals, 0)

    if mode == "nearest":
        y = gather([c.astype(np.int64) for c in coords])
    else:
        base = [np.floor(c).astype(np.int64) for c in coords]
        frac = [c - b for c, b in zip(coords, base)]
        if mode == "linear":
            offsets, weights = (0, 1), [[1 - f, f] for f in frac]
        else:
            offsets, weights = (-1, 0, 1, 2), [_cubic_coeffs(f) for f in frac]
        y = 0.0
        for combo in np.ndindex(*([len(offsets)] * len(dims))):
            w = np.ones(coords[0].shape)
            for i, k in enumerate(combo):
                w = w * weights[i][k]
            y = y + w[..., None] * gather([b + offsets[k] for b, k in zip(base, combo)])
    y = np.moveaxis(np.asarray(y), -1, 1)
    return (y.reshape(n_batch, channels, *out_shape).astype(x.dtype),)


@register("RoiAlign")
def roi_align(inputs, attrs, ctx):
    """Average (or max) of bilinear samples on a regular grid in each output bin of each RoI.
    ``half_pixel`` shifts RoI corners by -0.5 pixel; the legacy ``output_half_pixel`` does not
    and forces RoIs to be at least 1x1. Samples beyond one pixel outside the image count zero;
    max mode takes, as ONNX Runtime does, the largest weighted corner of each sample."""
    x, rois, batch_idx = inputs
    mode = attrs.get("mode", "avg")
    ph, pw = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    half = (
        attrs.get("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
        == "half_pixel"
    )
    height, width = x.shape[2:]
    out = np.zeros((rois.shape[0], x.shape[1], ph, pw), dtype=x.dtype)
    for r, roi in enumerate(rois.astype(np.float64)):
        off = 0.5 if half else 0.0
        x1, y1, x2, y2 = roi * scale - off
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = ratio if ratio > 0 else int(np.ceil(rh / ph))
        gw = ratio if ratio > 0 else int(np.ceil(rw / pw))
        count = max(gh * gw, 1)
        ys = y1 + np.arange(ph)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh  # (ph, gh)
        xs = x1 + np.arange(pw)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw  # (pw, gw)
        yy = ys[:, :, None, None]
        xx = xs[None, None, :, :]
        yy, xx = np.broadcast_arrays(yy, xx)  # (ph, gh, pw, gw)
        inside = ~((yy < -1.0) | (yy > height) | (xx < -1.0) | (xx > width))
        yc, xc = np.maximum(yy, 0.0), np.maximum(xx, 0.0)
        y_lo = np.floor(yc).astype(np.int64)
        x_lo = np.floor(xc).astype(np.int64)
        y_edge, x_edge = y_lo >= height - 1, x_lo >= width - 1
        y_lo = np.where(y_edge, height - 1, y_lo)
        x_lo = np.where(x_edge, width - 1, x_lo)
        y_hi = np.where(y_edge, height - 1, y_lo + 1)
        x_hi = np.where(x_edge, width - 1, x_lo + 1)
        ly = np.where(y_edge, 0.0, yc - y_lo)
        lx = np.where(x_edge, 0.0, xc - x_lo)
        hy, hx = 1.0 - ly, 1.0 - lx
        img = x[int(batch_idx[r])].astype(np.float64)  # (C, H, W)
        corners = [(hy * hx, y_lo, x_lo), (hy * lx, y_lo, x_hi), (ly * hx, y_hi, x_lo), (ly * lx, y_hi, x_hi)]
        terms = [w * img[:, yi, xi] for w, yi, xi in corners]  # each (C, ph, gh, pw, gw)
        terms = [np.where(inside, t, 0.0) for t in terms]
        if mode == "avg":
            val = sum(terms).sum(axis=(2, 4)) / count
        else:
            val = np.maximum.reduce(terms).max(axis=(2, 4))
        out[r] = val.astype(x.dtype)
    return (out,)


def _iou_matrix(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """Pairwise IoU; corners may come in any diagonal order ([y1, x1, y2, x2]) or as centres
    ([xc, yc, w, h]). Boxes that do not overlap, or have no area, have IoU 0."""
    b = boxes.astype(np.float64)
    if center_point_box:
        x_lo, x_hi = b[:, 0] - b[:, 2] / 2, b[:, 0] + b[:, 2] / 2
        y_lo, y_hi = b[:, 1] - b[:, 3] / 2, b[:, 1] + b[:, 3] / 2
    else:
        y_lo, y_hi = np.minimum(b[:, 0], b[:, 2]), np.maximum(b[:, 0], b[:, 2])
        x_lo, x_hi = np.minimum(b[:, 1], b[:, 3]), np.maximum(b[:, 1], b[:, 3])
    iw = np.minimum(x_hi[:, None], x_hi[None, :]) - np.maximum(x_lo[:, None], x_lo[None, :])
    ih = np.minimum(y_hi[:, None], y_hi[None, :]) - np.maximum(y_lo[:, None], y_lo[None, :])
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    area = (x_hi - x_lo) * (y_hi - y_lo)
    union = area[:, None] + area[None, :] - inter
    ok = (inter > 0) & (area[:, None] > 0) & (area[None, :] > 0) & (union > 0)
    return np.where(ok, inter / np.where(union > 0, union, 1.0), 0.0)


@register("NonMaxSuppression")
def non_max_suppression(inputs, attrs, ctx):
    """Greedy suppression per batch and class: visit boxes by score (descending, ties by lower
    index), keep a box unless its IoU with a kept one exceeds ``iou_threshold``; at most
    ``max_output_boxes_per_class`` (0 when absent) per class; with ``score_threshold`` only
    scores above it are candidates. Output rows are (batch, class, box)."""

    def scalar(i, default, cast):
        return (
            cast(np.asarray(inputs[i]).reshape(-1)[0])
            if len(inputs) > i and inputs[i] is not None and np.asarray(inputs[i]).size
            else default
        )

    boxes, scores = inputs[0], inputs[1]
    max_out = scalar(2, 0, int)
    iou_thr = scalar(3, 0.0, float)
    score_thr = scalar(4, None, float)
    center = int(attrs.get("center_point_box", 0))
    selected: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0]):
        iou = _iou_matrix(boxes[b], center)
        for c in range(scores.shape[1]):
            sc = scores[b, c]
            idx = np.arange(sc.shape[0])
            if score_thr is not None:
                idx = idx[sc > score_thr]
            order = idx[np.lexsort((idx, -sc[idx]))]
            kept: list[int] = []
            for i in order:
                if len(kept) >= max_out:
                    break
                if all(iou[i, k] <= iou_thr for k in kept):
                    kept.append(int(i))
            selected.extend((b, c, k) for k in kept)
    return (np.array(selected, dtype=np.int64).reshape(-1, 3),)


@register("TensorScatter")
def tensor_scatter(inputs, attrs, ctx):
    """Write ``update`` into a copy of the cache along ``axis`` at each batch row's write index
    (0 when absent); ``circular`` wraps positions modulo the cache length."""
    cache, update = inputs[0], inputs[1]
    idx = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros(cache.shape[0], np.int64)
    axis = int(attrs.get("axis", -2)) % cache.ndim
    circular = attrs.get("mode", "linear") == "circular"
    out = cache.copy()
    length, steps = cache.shape[axis], update.shape[axis]
    for b in range(cache.shape[0]):
        pos = int(idx[b]) + np.arange(steps)
        if circular:
            pos = pos % length
        dst = np.moveaxis(out[b], axis - 1, 0)
        dst[pos] = np.moveaxis(update[b], axis - 1, 0)
    return (out,)


# ----------------------------------------------------------------------------- fallback

# Ops that run through onnx.reference kernels. Each is outside the numerical path that
# verification, calibration and fine-tuning rely on, and none needs a VJP:
FALLBACK_OPS: tuple[tuple[str, str], ...] = (
    # string processing: Python string semantics, no tensor arithmetic
    ("", "StringNormalizer"),
    ("", "StringSplit"),
    ("", "StringConcat"),
    ("", "RegexFullMatch"),
    # text featurization (n-gram counting), a preprocessing step, not a network layer
    ("", "TfIdfVectorizer"),
    # image file decoding (needs an image codec), input preparation only
    ("", "ImageDecoder"),
    # classical ML (ai.onnx.ml): scikit-learn style pipelines, not deep networks
    ("ai.onnx.ml", "ArrayFeatureExtractor"),
    ("ai.onnx.ml", "Binarizer"),
    ("ai.onnx.ml", "LabelEncoder"),
    ("ai.onnx.ml", "TreeEnsemble"),
    # optimizer update rules (ai.onnx.preview.training): training-side state updates; mconv's
    # fine-tuning has its own optimizer and never runs these inside a graph
    ("ai.onnx.preview.training", "Adagrad"),
    ("ai.onnx.preview.training", "Adam"),
    ("ai.onnx.preview.training", "Momentum"),
)


def _fallback_kernel(op_type: str, domain: str):
    cache: dict[tuple, object] = {}

    def forward(inputs, attrs, ctx):
        from onnx.reference import ReferenceEvaluator

        key = (id(attrs), len(inputs), ctx.opset)
        sess = cache.get(key)
        if sess is None:
            names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
            n_out = ctx.num_outputs or 1
            proto_attrs = {
                k: onnx.numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
                for k, v in attrs.items()
            }
            node = onnx.helper.make_node(
                op_type, names, [f"o{k}" for k in range(n_out)], domain=domain, **proto_attrs
            )
            graph = onnx.helper.make_graph(
                [node],
                "fallback",
                [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in names if n],
                [onnx.helper.make_value_info(f"o{k}", onnx.TypeProto()) for k in range(n_out)],
            )
            opsets = [onnx.helper.make_opsetid(domain, ctx.opset)]
            if domain:
                opsets.append(onnx.helper.make_opsetid("", 21))
            sess = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=opsets))
            cache[key] = sess
        feeds = {f"i{k}": x for k, x in enumerate(inputs) if x is not None}
        return tuple(sess.run(None, feeds))

    return forward


for _domain, _op in FALLBACK_OPS:
    register(_op, domain=_domain)(_fallback_kernel(_op, _domain))
