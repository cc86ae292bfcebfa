"""The compression ratio counted three ways, as the papers count it and as files take it.

1. **Nonzero parameters**: the original's parameters (every float initializer's elements) over
   the compressed model's nonzero ones (the count Han et al. and Ullrich et al. prune to; says
   nothing of bits).
2. **The cpu bundle**: the source model's bytes on disk (all its files) over the bytes of the
   directory ``mconv export --target cpu`` writes (weights, graph, manifest).
3. **weights.mcw alone**: the same source bytes over the bundle's weight container (sparse
   indices, codebooks and entropy-coded indices included: what the papers' tables count).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir


def float_parameters(model: ir.Model) -> tuple[int, int]:
    """(elements, nonzero elements) of the model's float initializers."""
    total = nonzero = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None or tensor.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
            continue
        a = np.asarray(tensor.numpy())
        total += int(a.size)
        nonzero += int(np.count_nonzero(a))
    return total, nonzero


def directory_bytes(path: str | Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def three_ratios(original: ir.Model, compressed: ir.Model, source_bytes: int, bundle: str | Path) -> dict:
    """The module's three ratios (and the counts behind them) of ``compressed`` against
    ``original`` (``source_bytes`` on disk), ``bundle`` the cpu bundle of ``compressed``."""
    params, _ = float_parameters(original)
    _, nonzero = float_parameters(compressed)
    bundle_bytes = directory_bytes(bundle)
    mcw = (Path(bundle) / "weights.mcw").stat().st_size
    return {
        "parameters": params,
        "nonzero_parameters": nonzero,
        "ratio_nonzero": round(params / max(nonzero, 1), 2),
        "source_bytes": int(source_bytes),
        "bundle_bytes": bundle_bytes,
        "ratio_bundle": round(source_bytes / max(bundle_bytes, 1), 2),
        "weights_mcw_bytes": mcw,
        "ratio_weights_mcw": round(source_bytes / max(mcw, 1), 2),
    }
