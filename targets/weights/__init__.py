"""Weights bundles (target ``weights``), and per-tensor verification of weight-only models.

A weights bundle is what a weight-only pipeline (``mconv optimize weights.safetensors --passes
'cluster(bits=4)' -o out``) ships: a bundle (:mod:`mconv.bundle`) with target ``"weights"``,
``manifest.json`` and ``weights.mcw``, no graph and no payload.

Rules:

1. Export stores every initializer in the model's order, each with the codec every target
   picks (:func:`mconv.container.choose_codec`, the one choice of :mod:`mconv.codecs.choose`),
   told the facts the compression passes recorded (``mconv.compression``): a tensor clustered
   to 4 bits is a 4-bit palette (or sparse + palette when that is smaller). Inputs and outputs
   are empty lists.
2. :func:`weight_set` opens anything that is only tensors: a weights bundle, a safetensors /
   npz / TensorFlow checkpoint file, or an ``.onnx`` weight-only model; it returns ``None`` for
   anything with a graph, so ``mconv verify`` falls back to running models.
3. :func:`verify_weights` compares tensors by name with the metrics of :mod:`mconv.metrics`
   (max_abs, max_rel, mean_abs, cosine, snr_db), one row per reference tensor; the candidate
   must hold every reference tensor with the same shape; gates apply per tensor.
4. The ``weights`` target cannot run a bundle (there is nothing to run): ``load`` raises a
   one-line :class:`mconv.errors.InputError` pointing at ``mconv verify``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.bundle import Bundle, is_bundle, load_bundle, provenance_from_model, write_bundle
from mconv.container import choose_codec
from mconv.errors import InputError
from mconv.metrics import Gates, VerifyReport, compare, gate_failures
from mconv.targets.weights.options import Options as Options  # the export options

NAME = "weights"
# Formats whose files hold tensors only (formats/weights.py, npz_format.py, tf_checkpoint.py).
WEIGHT_FORMATS = ("safetensors", "npz", "tf-checkpoint")


def export_weights(model: ir.Model, out_dir: str | os.PathLike, options: dict | None = None) -> Bundle:
    """Write ``model``'s initializers as a weights bundle at ``out_dir`` (rule 1), atomically."""
    from mconv.formats.weights import model_arrays

    options = dict(options or {})
    metadata = dict(model.metadata_props)
    forced = options.pop("codec", None)
    weights = []
    for name, array in model_arrays(model).items():
        array = np.ascontiguousarray(array)
        spec = {"codec": forced} if forced else choose_codec(array, metadata, name)
        weights.append((name, array, spec))
    if not weights:
        raise InputError("model has no weights to store", path=str(out_dir), hint="nothing to export")
    return write_bundle(
        out_dir,
        target=NAME,
        model_name=model.graph.name or "weights",
        inputs=[],
        outputs=[],
        weights=weights,
        payload={},
        options=options,
        provenance=provenance_from_model(model),
    )


def bundle_arrays(bundle: Bundle) -> dict[str, np.ndarray]:
    """Every tensor of a bundle's ``weights.mcw``, decoded, by name."""
    with bundle.container() as c:
        return {name: np.array(c.array(name)) for name in c.names}


def weight_set(path: str | os.PathLike, *, onnx_models: bool = True) -> dict[str, np.ndarray] | None:
    """Rule 2: the tensors of a weights-only thing at ``path``, or None when it has a graph.

    ``onnx_models=False`` answers None for any ``.onnx`` without parsing it (cheap probe).
    """
    from mconv.formats import detect
    from mconv.formats.weights import is_weight_only, model_arrays

    p = Path(path)
    if is_bundle(p):
        if load_bundle(p, verify=False).target != NAME:  # no hashing for bundles of other targets
            return None
        return bundle_arrays(load_bundle(p))
    if not p.is_file():
        return None
    if p.suffix.lower() == ".onnx":
        if not onnx_models:
            return None
        from mconv.irio import load_onnx

        model = load_onnx(p)
        return model_arrays(model) if is_weight_only(model) else None
    try:
        fmt = detect(p)
    except InputError:
        return None
    if fmt.name not in WEIGHT_FORMATS:
        return None
    from mconv.formats import import_model

    return model_arrays(import_model([p], format=fmt.name))


def weight_pair(
    reference: str | os.PathLike, candidate: str | os.PathLike
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """Both sides' tensors when both are weight-only (rule 2), else None.

    A ``.onnx`` is parsed only when the other side is already known to be tensors only, so a
    plain model-vs-model verify never loads a model twice.
    """
    ref = weight_set(reference, onnx_models=False)
    cand = weight_set(candidate, onnx_models=False)
    if ref is None and cand is None:
        return None
    if ref is None:
        ref = weight_set(reference)
    if cand is None:
        cand = weight_set(candidate)
    if ref is None or cand is None:
        return None
    return ref, cand


def verify_weights(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], gates: Gates | None = None
) -> VerifyReport:
    """Rule 3: per-tensor metrics and gates; ``samples`` is 0 (no inference ran)."""
    gates = gates or Gates()
    outputs: dict[str, dict] = {}
    failures: dict[str, list[str]] = {}
    missing = [n for n in reference if n not in candidate]
    if missing:
        raise InputError(
            f"candidate lacks {len(missing)} tensor(s): {', '.join(missing[:10])}",
            hint="compare weight files of the same model",
        )
    for name, ref in reference.items():
        r, c = np.asarray(ref), np.asarray(candidate[name])
        if r.shape != c.shape:
            raise InputError(
                f"tensor '{name}' has shape {list(r.shape)} in the reference, {list(c.shape)} in the candidate",
                hint="compare weight files of the same model",
            )
        metrics = compare(r.ravel(), c.ravel())  # flat: a 2-D weight is not a batch of class scores
        outputs[name] = metrics
        fails = gate_failures(metrics, gates, r, c)
        if fails:
            failures[name] = fails
    return VerifyReport(passed=not failures, outputs=outputs, failures=failures, samples=0)


def load(bundle: Bundle):
    """Rule 4: nothing to run."""
    raise InputError(
        "a weights bundle holds tensors and no graph; there is nothing to run",
        path=str(bundle.root),
        hint="compare it with: mconv verify WEIGHTS_FILE BUNDLE",
    )


def load_model(model: ir.Model, label: str = "model"):
    raise InputError("the weights target runs nothing", hint="run on --target reference or cpu")


# The target (the protocol of mconv.targets.base) is this module: export is rule 1.
name = NAME
export = export_weights
TARGET = sys.modules[__name__]
