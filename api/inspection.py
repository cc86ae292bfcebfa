"""What ``mconv inspect`` shows: ops, parameters, bytes by dtype, I/O, largest tensors, manifest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mconv.api.runtime import value_spec
from mconv.irio import model_stats, real_inputs


def _spec_dict(spec) -> dict:
    return {"name": spec.name, "dtype": spec.dtype, "shape": spec.shape}


def inspect_model(model, *, top: int = 10) -> dict:
    stats = model_stats(model)
    largest = []
    for value in model.graph.initializers.values():
        t = value.const_value
        if t is None:
            continue
        largest.append(
            {
                "name": value.name,
                "dtype": t.dtype.name.lower(),
                "shape": [int(d) for d in t.shape.numpy()],
                "bytes": int(t.nbytes),
            }
        )
    largest.sort(key=lambda d: (-d["bytes"], d["name"]))
    return {
        **stats.as_dict(),
        "inputs": [_spec_dict(value_spec(v)) for v in real_inputs(model.graph)],
        "outputs": [_spec_dict(value_spec(v)) for v in model.graph.outputs],
        "largest": largest[:top],
        "metadata": dict(sorted(model.metadata_props.items())),
    }


def inspect_path(path: str | Path, *, top: int = 10) -> dict:
    from mconv.api.runtime import open_model
    from mconv.bundle import is_bundle, load_bundle

    p = Path(path)
    if is_bundle(p):
        bundle = load_bundle(p)
        m = bundle.manifest
        weights = bundle.weights  # weights.mcw's index, then the manifest's dense ones
        params = int(sum(int(np.prod(w["shape"])) for w in weights))
        graph_file = p / "model.onnx" if p.is_dir() else None
        ops: dict[str, int] = {}
        nodes = 0
        if graph_file is not None and graph_file.exists():
            from mconv.irio import load_onnx

            g = model_stats(load_onnx(graph_file, provided=[w["name"] for w in weights]))
            ops, nodes = g.ops, g.nodes
        by_dtype: dict[str, int] = {}
        for w in weights:
            by_dtype[w.get("codec", "raw")] = by_dtype.get(w.get("codec", "raw"), 0) + int(w["bytes"])
        largest = sorted(
            (
                {"name": w["name"], "dtype": w["dtype"], "shape": w["shape"], "bytes": int(w["bytes"])}
                for w in weights
            ),
            key=lambda d: (-d["bytes"], d["name"]),
        )[:top]
        return {
            "path": str(p),
            "kind": f"bundle ({m.get('target')})",
            "nodes": nodes,
            "params": params,
            "bytes": int(sum(w["bytes"] for w in weights)),
            "bytes_by_codec": by_dtype,
            "bytes_by_dtype": {},
            "ops": ops,
            "inputs": m.get("inputs", []),
            "outputs": m.get("outputs", []),
            "largest": largest,
            "manifest": m,
            "account": bundle.account,  # per tensor, from weights.mcw's index
        }
    model = open_model(p)
    doc = inspect_model(model, top=top)
    return {"path": str(p), "kind": model.metadata_props.get("mconv.source_format", "onnx"), **doc}
