"""Localization: the first node, in topological order, whose output drifts beyond tolerance.

Both models run on the reference executor with every intermediate value kept. Values are matched
by name; a node created by a fusing pass records the names it came from in its metadata
(``mconv.fused_from``), so a fused node is compared at the value its originals produced last.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mconv.verify import Gates, compare, gate_failures


def _model_for(path: Path, shapes: dict | None = None):
    """(model, None) or (None, why no graph)."""
    from mconv.bundle import is_bundle, load_bundle

    if is_bundle(path):
        bundle = load_bundle(path)
        from mconv.targets import get_target

        target = get_target(bundle.target)
        if not hasattr(target, "to_model"):
            return None, f"the {bundle.target} bundle {path} keeps no ONNX graph to run node by node"
        return target.to_model(bundle), None
    from mconv.passes.input_shapes import open_model_with_shapes

    return open_model_with_shapes(path, shapes), None


def _tolerance(gates: Gates) -> Gates:
    """Per-value tolerance from the gates the user gave: atol/rtol and min_cosine as given; with
    neither (no gates, the defaults, or top-1 only: not a per-value metric) atol 1e-4, rtol 1e-3."""
    if gates.atol is not None or gates.rtol is not None or gates.min_cosine is not None:
        return Gates(atol=gates.atol, rtol=gates.rtol, min_cosine=gates.min_cosine)
    return Gates(atol=1e-4, rtol=1e-3)


def localize(
    reference: Path,
    candidate: Path,
    feeds: dict[str, np.ndarray],
    gates: Gates,
    input_shapes: dict | None = None,
) -> dict:
    """The first node of the candidate (topological order) whose output differs from the same
    value in the reference beyond tolerance; or ``node: None`` with a ``note`` saying why not.

    ``gates``: the gates the user gave (not the defaults), see :func:`_tolerance`."""
    from mconv.targets.reference.executor import Executor

    ref_model, why_ref = _model_for(Path(reference), input_shapes)
    cand_model, why_cand = _model_for(Path(candidate), input_shapes)
    if ref_model is None or cand_model is None:
        return {
            "node": None,
            "compared": 0,
            "note": f"no intermediate value could be compared: {why_cand or why_ref}",
        }
    ref_vals = Executor(ref_model).run(feeds, intermediates=True)
    cand_vals = Executor(cand_model).run(feeds, intermediates=True)
    tol = _tolerance(gates)
    compared, worst = 0, None
    for node in cand_model.graph:
        for out in node.outputs:
            name = out.name
            if name not in ref_vals or name not in cand_vals:
                continue
            r, c = np.asarray(ref_vals[name]), np.asarray(cand_vals[name])
            if r.shape != c.shape or not np.issubdtype(r.dtype, np.number):
                continue
            compared += 1
            m = compare(r, c)
            fails = gate_failures(m, tol, r, c)
            entry = {
                "node": node.name,
                "op_type": node.op_type,
                "value": name,
                "fused_from": node.metadata_props.get("mconv.fused_from"),
                **m,
            }
            if fails:
                return {**entry, "compared": compared, "tolerance": tol.as_dict(), "failures": fails}
            if worst is None or m["cosine"] < worst["cosine"]:
                worst = entry
    if compared == 0:
        return {
            "node": None,
            "compared": 0,
            "note": "no intermediate value could be compared: the candidate shares no numeric value "
            "name (of the same shape) with the reference (a pass renamed them?)",
        }
    return {
        "node": None,
        "compared": compared,
        "tolerance": tol.as_dict(),
        "worst": worst,
        "note": f"none of the {compared} values both models share drifts beyond "
        + ", ".join(f"{k}={v:g}" for k, v in tol.as_dict().items())
        + (
            f"; the least similar is '{worst['value']}' ({worst['op_type']}, cosine {worst['cosine']:.6f})"
            if worst
            else ""
        ),
    }
