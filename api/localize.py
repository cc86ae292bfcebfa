"""Localization: the first node, in topological order, whose output drifts beyond tolerance.

Each side runs where ``verify`` ran it, with every intermediate value kept: a model file on the
reference executor, a cpu bundle on ONNX Runtime (every node output of its graph exposed as a
graph output of the same session kind the bundle loads with). A drift between the reference and
ONNX Runtime on the same graph is therefore found at the node whose kernel differs, not missed
because both sides ran on the reference. Values are matched by name; a node created by a fusing
pass records the names it came from in its metadata (``mconv.fused_from``), so a fused node is
compared at the value its originals produced last. NaNs (and infinities) in the same places on
both sides are equal; in different places they are a drift.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mconv.errors import show
from mconv.metrics import Gates, compare, gate_failures


def _model_for(path: Path, shapes: dict | None = None):
    """(model, runtime, None) or (None, None, why no graph); runtime: "reference" or "cpu"."""
    from mconv.bundle import is_bundle, load_bundle

    if is_bundle(path):
        bundle = load_bundle(path)
        from mconv.targets import get_target

        target = get_target(bundle.target)
        if not hasattr(target, "to_model"):
            return None, None, f"the {bundle.target} bundle {path} keeps no ONNX graph to run node by node"
        return target.to_model(bundle), bundle.target, None
    from mconv.formats import open_model_with_shapes

    return open_model_with_shapes(path, shapes), "reference", None


def _tolerance(gates: Gates) -> Gates:
    """Per-value tolerance from the gates the user gave: atol/rtol and min_cosine as given; with
    neither (no gates, the defaults, or top-1 only: not a per-value metric) atol 1e-4, rtol 1e-3."""
    if gates.atol is not None or gates.rtol is not None or gates.min_cosine is not None:
        return Gates(atol=gates.atol, rtol=gates.rtol, min_cosine=gates.min_cosine)
    return Gates(atol=1e-4, rtol=1e-3)


def ort_values(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every top-level value ONNX Runtime computes for ``model`` (an ``onnx_ir.Model``): each node
    output whose type shape inference knows becomes a graph output of a cpu-target session."""
    import onnx
    import onnx_ir as ir
    from mconv.targets.cpu import load_model

    proto = ir.serde.serialize_model(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # noqa: BLE001 - types then come only from what the file declares
        inferred = proto
    typed = {
        v.name: v
        for v in list(inferred.graph.value_info) + list(inferred.graph.output)
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
    }
    have = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in have and name in typed:
                proto.graph.output.append(typed[name])
                have.add(name)
    runner = load_model(ir.serde.deserialize_model(proto), label="localize")
    return runner.run(feeds)


def _values(model, runtime: str, feeds: dict[str, np.ndarray]) -> dict:
    if runtime == "cpu":
        return ort_values(model, feeds)
    from mconv.engines.reference.executor import Executor

    return Executor(model).run(feeds, intermediates=True)


def _nonfinite_mismatch(r: np.ndarray, c: np.ndarray) -> int:
    """How many places hold a NaN or an infinity on one side and not the same on the other."""
    if not np.issubdtype(r.dtype, np.inexact) and not np.issubdtype(c.dtype, np.inexact):
        return 0
    rf, cf = r.astype(np.float64), c.astype(np.float64)
    same_nan = np.isnan(rf) == np.isnan(cf)
    same_inf = np.where(np.isinf(rf) | np.isinf(cf), rf == cf, True)
    return int((~(same_nan & same_inf)).sum())


def _finite_pair(r: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The entries where both sides are finite (shapes flattened)."""
    rf, cf = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    keep = np.isfinite(rf) & np.isfinite(cf)
    return rf[keep], cf[keep]


TRACE_LIMIT = 4096  # values kept in the trace (a graph's first ones, in topological order)


def _first_index(trace: list[dict]) -> int | None:
    return next((i for i, t in enumerate(trace) if t["drift"]), None)


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
    ref_model, ref_rt, why_ref = _model_for(Path(reference), input_shapes)
    cand_model, cand_rt, why_cand = _model_for(Path(candidate), input_shapes)
    if ref_model is None or cand_model is None:
        return {
            "node": None,
            "compared": 0,
            "note": f"no intermediate value could be compared: {why_cand or why_ref}",
        }
    ref_vals = _values(ref_model, ref_rt, feeds)
    cand_vals = _values(cand_model, cand_rt, feeds)
    tol = _tolerance(gates)
    compared, worst, first = 0, None, None
    trace: list[dict] = []  # every compared value in order: the report's error along the graph
    runtimes = {"reference": ref_rt, "candidate": cand_rt}
    for node in cand_model.graph:
        for out in node.outputs:
            name = out.name
            if name not in ref_vals or name not in cand_vals:
                continue
            r, c = np.asarray(ref_vals[name]), np.asarray(cand_vals[name])
            if r.shape != c.shape or not np.issubdtype(r.dtype, np.number):
                continue
            compared += 1
            bad_places = _nonfinite_mismatch(r, c)
            rf, cf = _finite_pair(r, c)
            m = compare(rf, cf)
            fails = gate_failures(m, tol, rf, cf)
            if bad_places:
                fails.insert(0, f"{bad_places} of {r.size} values NaN or infinite on one side only")
            entry = {
                "node": show(node.name or f"<unnamed {node.op_type}>"),
                "op_type": node.op_type,
                "value": show(name),
                "fused_from": node.metadata_props.get("mconv.fused_from"),
                **m,
            }
            if len(trace) < TRACE_LIMIT:
                trace.append(
                    {"node": entry["node"], "op_type": node.op_type, "drift": bool(fails)}
                    | {k: m[k] for k in ("cosine", "rel_l2", "max_abs") if k in m}
                )
            if fails and first is None:
                first = {
                    **entry, "compared": compared, "runtimes": runtimes,
                    "tolerance": tol.as_dict(), "failures": fails,
                }  # fmt: skip
            if first is not None:
                continue
            if worst is None or m["cosine"] < worst["cosine"]:
                worst = entry
    if first is not None:  # the values after it were compared for the trace only
        return {**first, "trace": trace, "first_drift": _first_index(trace)}
    if compared == 0:
        return {
            "node": None,
            "compared": 0,
            "runtimes": runtimes,
            "note": "no intermediate value could be compared: the candidate shares no numeric value "
            "name (of the same shape) with the reference (a pass renamed them?)",
        }
    return {
        "node": None,
        "compared": compared,
        "runtimes": runtimes,
        "tolerance": tol.as_dict(),
        "worst": worst,
        "trace": trace,
        "note": f"none of the {compared} values both models share drifts beyond "
        + ", ".join(f"{k}={v:g}" for k, v in tol.as_dict().items())
        + (
            f"; the least similar is '{worst['value']}' ({worst['op_type']}, cosine {worst['cosine']:.6f})"
            if worst
            else ""
        ),
    }
