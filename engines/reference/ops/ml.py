"""Op family: classical ML (``ai.onnx.ml``): scikit-learn style pipelines as skl2onnx writes them.

Rules
-----
1. ``ZipMap``, ``Scaler``, ``Normalizer``, ``LinearClassifier``, ``LinearRegressor``,
   ``Imputer`` and ``OneHotEncoder`` are kernels of their own (numpy, float64 inside, rounded
   once to float32 as ONNX Runtime's outputs are). The tree ensembles, SVMs and the ops listed in
   :data:`mconv.engines.reference.ops.misc.FALLBACK_OPS` run through ``onnx.reference``'s kernels.
2. ``ZipMap`` turns each row of a ``[N, C]`` score tensor into a dict ``{label: float}`` (labels
   from ``classlabels_int64s`` or ``classlabels_strings``); its output is a Python list of
   dicts, a sequence of maps.
3. Classifiers return labels as int64 (or numpy str arrays for string labels) and scores as
   float32; a single-target binary classifier writes two score columns as ONNX Runtime does.
4. No op of this family has a VJP: pipelines are never fine-tuned through.
"""

from __future__ import annotations

import numpy as np
from mconv.engines.reference.ops import register

ML = "ai.onnx.ml"


@register("ZipMap", domain=ML)
def zipmap(inputs, attrs, ctx):
    x = np.asarray(inputs[0], dtype=np.float32)
    if "classlabels_strings" in attrs:
        labels: list = [s.decode() if isinstance(s, bytes) else str(s) for s in attrs["classlabels_strings"]]
    else:
        labels = [int(v) for v in attrs.get("classlabels_int64s", [])]
    rows = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    if rows.shape[1] != len(labels):
        raise ValueError(f"ZipMap: {rows.shape[1]} scores per row for {len(labels)} labels")
    return ([{k: float(v) for k, v in zip(labels, row, strict=True)} for row in rows],)


def _rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], -1)


@register("Scaler", domain=ML)
def scaler(inputs, attrs, ctx):
    x = np.asarray(inputs[0], dtype=np.float64)
    offset = np.asarray(attrs.get("offset", [0.0]), np.float32).astype(np.float64)
    scale = np.asarray(attrs.get("scale", [1.0]), np.float32).astype(np.float64)
    return (((x - offset) * scale).astype(np.float32),)


@register("Normalizer", domain=ML)
def normalizer(inputs, attrs, ctx):
    x = _rows(inputs[0]).astype(np.float64)
    norm = attrs.get("norm", "MAX")
    norm = norm.decode() if isinstance(norm, bytes) else norm
    if norm == "MAX":
        d = x.max(axis=1, keepdims=True)
    elif norm == "L1":
        d = np.abs(x).sum(axis=1, keepdims=True)
    elif norm == "L2":
        d = np.sqrt((x * x).sum(axis=1, keepdims=True))
    else:
        raise ValueError(f"Normalizer: unknown norm {norm!r}")
    d = np.where(d == 0, 1.0, d)
    return ((x / d).astype(np.float32).reshape(np.shape(inputs[0])),)


def _multiclass_probability(k: int, r: np.ndarray) -> np.ndarray:
    """libsvm's pairwise coupling (``multiclass_probability``), as ONNX Runtime runs it: ``r[i, j]``
    is P(i | i or j); float32 throughout, the same iteration and stopping rule."""
    r = r.astype(np.float32)
    q = np.zeros((k, k), np.float32)
    p = np.full(k, 1.0 / k, np.float32)
    for t in range(k):
        q[t, t] = (r[:t, t] ** 2).sum() + (r[t + 1 :, t] ** 2).sum()
        q[t, :t] = q[:t, t]
        q[t, t + 1 :] = -r[t + 1 :, t] * r[t, t + 1 :]
    eps = np.float32(0.005 / k)
    for _ in range(max(100, k)):
        qp = q @ p
        pqp = np.float32((p * qp).sum())
        if float(np.abs(qp - pqp).max()) < eps:
            break
        for t in range(k):
            diff = np.float32((-qp[t] + pqp) / q[t, t])
            p[t] += diff
            pqp = np.float32((pqp + diff * (diff * q[t, t] + 2 * qp[t])) / (1 + diff) / (1 + diff))
            p /= 1 + diff
            qp = (qp + diff * q[t, :]) / (1 + diff)
    return p


def _svm_classifier_kernel():
    """SVMClassifier through onnx.reference's kernel with the pairwise coupling above (onnx 1.17's
    own writes a dot product into every off-diagonal entry of Q, so probabilities of three or more
    classes come out wrong)."""
    from onnx.reference.ops.aionnxml.op_svm_classifier import SVMClassifier as _Base

    class SVMClassifier(_Base):
        op_domain = ML

        def _probabilities(self, scores, class_count_):
            pairs = np.zeros((class_count_, class_count_), np.float32)
            index = 0
            for i in range(class_count_):
                for j in range(i + 1, class_count_):
                    val = np.float32(scores[index]) * np.float32(self._svm.atts.prob_a[index]) + np.float32(
                        self._svm.atts.prob_b[index]
                    )
                    v = np.float32(1.0) - np.float32(1.0 / (1.0 + np.exp(-np.float64(val))))
                    v = min(max(float(v), 1.0e-7), 1 - 1.0e-7)
                    pairs[i, j] = v
                    pairs[j, i] = 1 - v
                    index += 1
            return _multiclass_probability(class_count_, pairs)

    return SVMClassifier


def _with_class(op_type: str, make_cls):
    """A kernel running one node through onnx.reference with ``make_cls()`` as its implementation."""
    import onnx
    from mconv.engines.reference.ops.misc import _attrs_key

    cache: dict[tuple, object] = {}

    def forward(inputs, attrs, ctx):
        from onnx.reference import ReferenceEvaluator

        key = (_attrs_key(attrs), len(inputs), ctx.opset, ctx.num_outputs)
        sess = cache.get(key)
        if sess is None:
            names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
            n_out = ctx.num_outputs or 1
            node = onnx.helper.make_node(op_type, names, [f"o{k}" for k in range(n_out)], domain=ML, **attrs)
            graph = onnx.helper.make_graph(
                [node],
                "ml",
                [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in names if n],
                [onnx.helper.make_value_info(f"o{k}", onnx.TypeProto()) for k in range(n_out)],
            )
            opsets = [onnx.helper.make_opsetid(ML, ctx.opset), onnx.helper.make_opsetid("", 21)]
            model = onnx.helper.make_model(graph, opset_imports=opsets)
            sess = ReferenceEvaluator(model, new_ops=[make_cls()])
            cache[key] = sess
        return tuple(sess.run(None, {f"i{k}": x for k, x in enumerate(inputs) if x is not None}))

    return forward


register("SVMClassifier", domain=ML)(_with_class("SVMClassifier", _svm_classifier_kernel))
