"""Localization: the first node, in topological order, whose output drifts beyond tolerance.

Both models run on the reference executor with every intermediate value kept. Values are matched
by name; a node created by a fusing pass records the names it came from in its metadata
(``mconv.fused_from``), so a fused node is compared at the value its originals produced last.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mconv.verify import Gates, compare, gate_failures


def _model_for(path: Path):
    from mconv.bundle import is_bundle, load_bundle

    if is_bundle(path):
        bundle = load_bundle(path)
        from mconv.targets import get_target

        target = get_target(bundle.target)
        if not hasattr(target, "to_model"):
            return None
        return target.to_model(bundle)
    from mconv.runtime import open_model

    return open_model(path)


def localize(reference: Path, candidate: Path, feeds: dict[str, np.ndarray], gates: Gates) -> dict | None:
    from mconv.targets.reference.executor import Executor

    ref_model = _model_for(Path(reference))
    cand_model = _model_for(Path(candidate))
    if ref_model is None or cand_model is None:
        return {"node": None, "note": "the candidate's target cannot expose its graph for localization"}
    ref_vals = Executor(ref_model).run(feeds, intermediates=True)
    cand_exec = Executor(cand_model)
    cand_vals = cand_exec.run(feeds, intermediates=True)
    if not gates.any():
        gates = Gates(atol=1e-4, rtol=1e-3)
    for node in cand_model.graph:
        for out in node.outputs:
            name = out.name
            if name not in ref_vals or name not in cand_vals:
                continue
            r, c = np.asarray(ref_vals[name]), np.asarray(cand_vals[name])
            if r.shape != c.shape or not np.issubdtype(r.dtype, np.number):
                continue
            m = compare(r, c)
            fails = gate_failures(
                {**m, "top1_agreement": 1.0},
                Gates(atol=gates.atol, rtol=gates.rtol, min_cosine=gates.min_cosine),
                r,
                c,
            )
            if fails:
                return {
                    "node": node.name,
                    "op_type": node.op_type,
                    "value": name,
                    "fused_from": node.metadata_props.get("mconv.fused_from"),
                    **m,
                    "failures": fails,
                }
    return {"node": None, "note": "no shared intermediate value drifts beyond tolerance"}
