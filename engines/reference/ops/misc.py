"""Op family: everything outside the other families: constants and identities, dropout, random
ops, bit shifts and bit casts, small linear algebra, NonMaxSuppression, TensorScatter, and a
documented fallback to ``onnx.reference`` for the non-numerical long tail.

Rules
-----
1. Dropout is the identity at inference (``training_mode`` false or ratio 0) with an all-true
   mask; in training mode it draws a mask from the context's generator and scales by 1/(1-ratio).
2. Random ops use ``seed`` when given (numpy's legacy MT19937 stream for that seed, the one
   ``np.random.seed`` gives), else the executor's generator.
3. NonMaxSuppression and TensorScatter follow the ONNX spec where it is explicit and ONNX
   Runtime's conventions where it is not (each docstring says which).
4. ``FALLBACK_OPS`` run through ``onnx.reference`` kernels (see its comment for why each);
   everything else here is our own numpy.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
from mconv.engines.reference.ops import register, register_vjp

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


# ----------------------------------------------------------------------------- bit shifts, bit casts


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


# ----------------------------------------------------------------------------- boxes, caches


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
    ("ai.onnx.ml", "TreeEnsembleClassifier"),
    ("ai.onnx.ml", "TreeEnsembleRegressor"),
    ("ai.onnx.ml", "SVMClassifier"),
    ("ai.onnx.ml", "SVMRegressor"),
    ("ai.onnx.ml", "LinearClassifier"),
    ("ai.onnx.ml", "LinearRegressor"),
    ("ai.onnx.ml", "OneHotEncoder"),
    ("ai.onnx.ml", "Imputer"),
    ("ai.onnx.ml", "FeatureVectorizer"),
    ("ai.onnx.ml", "DictVectorizer"),
    # optimizer update rules (ai.onnx.preview.training): training-side state updates; mconv's
    # fine-tuning has its own optimizer and never runs these inside a graph
    ("ai.onnx.preview.training", "Adagrad"),
    ("ai.onnx.preview.training", "Adam"),
    ("ai.onnx.preview.training", "Momentum"),
)


def _attrs_key(attrs: dict) -> tuple:
    """A hashable key of an attribute dict's values (arrays by dtype, shape and bytes)."""
    items = []
    for name in sorted(attrs):
        v = attrs[name]
        if isinstance(v, np.ndarray):
            v = ("ndarray", v.dtype.str, v.shape, v.tobytes())
        elif isinstance(v, list | tuple):
            v = tuple(x.tobytes() if isinstance(x, np.ndarray) else x for x in v)
        elif not isinstance(v, str | bytes | int | float | bool | None):
            v = repr(v)
        items.append((name, v))
    return tuple(items)


def _fallback_kernel(op_type: str, domain: str):
    cache: dict[tuple, object] = {}

    def forward(inputs, attrs, ctx):
        from onnx.reference import ReferenceEvaluator

        # keyed by the attributes' values: an id() of a dict that was freed can be reused by
        # another node's attributes, which then ran with the first node's (a flaky test did)
        key = (_attrs_key(attrs), len(inputs), ctx.opset, ctx.num_outputs)
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
