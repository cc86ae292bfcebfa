"""The IR at rest: ``.onnx`` files in and out of ``onnx_ir.Model``, and model statistics.

``onnx_ir`` is the in-memory IR (ONNX semantics, use-def chains). Tensors stored as external
data are memory-mapped lazily by onnx_ir, so a model over 2 GB never becomes one protobuf.
"""

from __future__ import annotations

import collections
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from mconv.errors import InputError
from mconv.fileio import require_file

# Above this many weight bytes a saved model puts its tensors in "<name>.data" beside it.
EXTERNAL_DATA_THRESHOLD = 1 << 27


def load_onnx(path: str | os.PathLike) -> ir.Model:
    """Load an ``.onnx`` file (external data memory-mapped lazily) with one-line errors."""
    p = require_file(path, "ONNX model")
    try:
        model = ir.load(p)
    except Exception as exc:  # protobuf raises DecodeError and friends
        size = p.stat().st_size
        raise InputError(
            f"not a valid ONNX model ({type(exc).__name__}: {str(exc)[:120]})",
            path=str(p),
            where=f"{size} bytes",
            hint="the file is truncated or corrupt; re-export it",
        ) from None
    # A weight-only model (mconv.formats.weights: initializers, no nodes) is not empty.
    if model.graph is None or (
        len(model.graph) == 0 and not model.graph.outputs and not model.graph.initializers
    ):
        raise InputError("ONNX model has an empty graph", path=str(p), hint="re-export the model")
    return model


def from_proto(proto: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(proto)


def to_proto(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def save_onnx(
    model: ir.Model, path: str | os.PathLike, *, external_threshold: int = EXTERNAL_DATA_THRESHOLD
) -> list[Path]:
    """Save ``model`` atomically; large weights go to ``<name>.data`` beside it.

    Returns the files written.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    total = weight_bytes(model)
    data_name = dest.name + ".data" if total > external_threshold else None
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        tmp_model = tmpdir / dest.name
        if data_name:
            ir.save(model, tmp_model, external_data=data_name, size_threshold_bytes=1024)
        else:
            ir.save(model, tmp_model)
        written = []
        if data_name:
            os.replace(tmpdir / data_name, dest.parent / data_name)
            written.append(dest.parent / data_name)
        os.replace(tmp_model, dest)
        written.insert(0, dest)
        return written
    finally:
        for leftover in tmpdir.glob("*"):
            leftover.unlink()
        tmpdir.rmdir()


def real_inputs(graph: ir.Graph) -> list[ir.Value]:
    """Graph inputs that are not also initializers (old ONNX files list weights as inputs)."""
    return [v for v in graph.inputs if v.name not in graph.initializers]


def tensor_nbytes(value: ir.Value) -> int:
    t = value.const_value
    if t is None:
        return 0
    return int(t.nbytes)


def weight_bytes(model: ir.Model) -> int:
    return sum(tensor_nbytes(v) for v in model.graph.initializers.values())


@dataclass
class ModelStats:
    """Counts that every report prints: nodes, parameters and bytes (by dtype), ops."""

    nodes: int = 0
    params: int = 0
    bytes: int = 0
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "nodes": self.nodes,
            "params": self.params,
            "bytes": self.bytes,
            "bytes_by_dtype": dict(sorted(self.bytes_by_dtype.items())),
            "ops": dict(sorted(self.ops.items())),
        }


def _walk_nodes(graph: ir.Graph):
    for node in graph:
        yield node
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from _walk_nodes(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for g in attr.value:
                    yield from _walk_nodes(g)


def model_stats(model: ir.Model) -> ModelStats:
    stats = ModelStats()
    ops: collections.Counter[str] = collections.Counter()
    for node in _walk_nodes(model.graph):
        stats.nodes += 1
        ops[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"] += 1
        if node.op_type == "Constant" and "value" in node.attributes:
            t = node.attributes["value"].value
            stats.params += int(np.prod(t.shape.numpy())) if t.shape is not None else 0
    by_dtype: collections.Counter[str] = collections.Counter()
    for value in model.graph.initializers.values():
        t = value.const_value
        if t is None:
            continue
        stats.params += int(np.prod(t.shape.numpy()))
        by_dtype[t.dtype.name.lower()] += int(t.nbytes)
    stats.ops = dict(ops)
    stats.bytes_by_dtype = dict(by_dtype)
    stats.bytes = int(sum(by_dtype.values()))
    return stats
