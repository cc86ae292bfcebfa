"""Models whose inputs fix the batch at 1, run on data of many samples.

TFLite and MediaPipe graphs (and many exported ones) declare every input as ``[1, ...]`` and
carry the 1 in their shape constants. Data of N samples then cannot be fed in one run. Two ways
serve the commands that take data:

- running the model once per sample (:func:`per_sample`, for ``verify`` and ``run``: exact by
  construction, the samples' outputs joined along the batch axis);
- for ``optimize``, whose fine-tuning and teacher outputs need whole batches, the ``dynamic-batch``
  pass frees the batch (each constant that pins it rewritten to the identity at batch 1, and
  the result checked against the samples run alone: ``mconv.api.common.load_data_batched``);
  :func:`fix_batch` puts the leading 1 back before the model is written, so the interface the
  user gets is the one the input had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir


def fixed_batch_inputs(model: ir.Model) -> bool:
    """Every real input has a known rank of at least 1 and a leading dimension fixed at 1."""
    from mconv.irio import real_inputs

    inputs = real_inputs(model.graph)
    if not inputs:
        return False
    for v in inputs:
        if v.shape is None or len(v.shape) == 0 or not isinstance(v.shape[0], int) or v.shape[0] != 1:
            return False
    return True


def batched_data(feeds: Mapping[str, np.ndarray], specs: Sequence) -> int | None:
    """N when every input of ``specs`` (``TensorSpec``-like: name, shape) declares a leading 1 and
    its array in ``feeds`` has N > 1 samples with the other dimensions as declared; else None."""
    n = None
    for spec in specs:
        a = feeds.get(spec.name)
        shape = spec.shape
        if a is None or shape is None or len(shape) == 0 or shape[0] != 1 or np.ndim(a) != len(shape):
            return None
        if any(isinstance(d, int) and d >= 0 and d != s for d, s in zip(shape[1:], a.shape[1:])):
            return None
        if n is None:
            n = int(a.shape[0])
        elif int(a.shape[0]) != n:
            return None
    return n if n is not None and n > 1 else None


def per_sample(feeds: Mapping[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    """``feeds`` of ``n`` samples as ``n`` feed dicts of one sample each (``labels`` stay out)."""
    return [{k: np.asarray(v)[i : i + 1] for k, v in feeds.items() if k != "labels"} for i in range(n)]


def _clear_shapes(model: ir.Model) -> None:
    """Forget the inferred shapes of every value but the inputs and weights (they change with N)."""
    graph = model.graph
    keep = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    for node in graph:
        for out in node.outputs:
            if id(out) not in keep:
                out.shape = None


def fix_batch(model: ir.Model) -> None:
    """Give the inputs of a model whose batch ``dynamic-batch`` freed their leading 1 again, in
    place; the inner shapes are inferred again (the rewritten constants stay: at batch 1 they
    are the model's own)."""
    from mconv.irio import real_inputs

    for v in real_inputs(model.graph):
        if v.shape is not None and len(v.shape) and not isinstance(v.shape[0], int):
            v.shape = ir.Shape([1, *list(v.shape)[1:]])
    _clear_shapes(model)
    from mconv.edit.shapes import infer_on_stripped_copy, merge_inferred

    try:
        inferred = infer_on_stripped_copy(model, keep_bytes=1024, strict=False, data_prop=True)
    except Exception:  # onnx raises InferenceError, ValidationError, RuntimeError: shapes stay unknown
        return
    if inferred is not None:
        merge_inferred(model, inferred)
