"""The graph a metal or webgpu bundle's kernels are generated from, shipped beside them.

A bundle's kernel text (``kernels.metal``, ``kernels/*.wgsl``) is never compiled as shipped:
the loader regenerates plan and kernels from this graph and compares them with the shipped
files, then compiles only its own text. The graph is data; everything executable is mconv's.

Rules:

1. Export (:func:`plan_with_stored_weights`): the plan is built from the prepared model with
   every weight buffer holding the values ``weights.mcw`` stores (half storage rounds raw
   float32 weights to fp16; the codecs are lossless), so a loader that restores the weights
   from ``weights.mcw`` builds the very same plan.
2. :func:`graph_bytes` is that prepared model as ONNX (deterministic protobuf), with the weight
   buffers' initializers removed (their data is in ``weights.mcw``) and the model's metadata
   left out; every other tensor (small constants the kernels bake in) is inside the file, none
   external.
3. :func:`read_graph` parses the graph file from a bundle: a missing file is a bundle from
   before the rule (refused: re-export); a tensor with external data is refused; the weights
   decoded from ``weights.mcw`` become initializers again, and the whole model is checked by
   :func:`mconv.onnx_check.check_model` (names, SSA, sizes) before onnx_ir deserializes it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Collection

import numpy as np
import onnx
import onnx_ir as ir
from mconv.bundle import DENSE, Bundle
from mconv.errors import InputError, IntegrityError, show
from mconv.targets.gpu.plan import GpuPlan

__all__ = ["graph_bytes", "plan_with_stored_weights", "read_graph", "regenerated_mismatch"]

WeightSpec = Callable[[GpuPlan, str, np.ndarray], tuple[np.ndarray, dict]]
MAX_ROUNDS = 4  # rule 1: rounding is idempotent, so the second round changes nothing


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def plan_with_stored_weights(
    prepared: ir.Model, build: Callable[[ir.Model], GpuPlan], weight_spec: WeightSpec
) -> tuple[GpuPlan, list[tuple[str, np.ndarray, dict]]]:
    """Rule 1: (plan, weights as (name, stored array, codec spec)) with the plan built from the
    stored values. ``build`` plans the prepared model; ``weight_spec(plan, name, array)`` gives
    a weight's stored array and codec."""
    inits = prepared.graph.initializers
    for _ in range(MAX_ROUNDS):
        plan = build(prepared)
        weights = []
        changed = False
        for b in plan.weight_buffers():
            value = inits[b.name]
            assert value.const_value is not None, f"weight buffer {b.name} without a tensor"
            array = value.const_value.numpy()
            stored, spec = weight_spec(plan, b.name, array)
            stored = np.asarray(stored)
            if not _same(stored, array):
                value.const_value = ir.tensor(np.asarray(stored, order="C"), name=b.name)
                changed = True
            weights.append((b.name, stored, spec))
        if not changed:
            return plan, weights
    raise AssertionError("stored weights did not settle")  # rounding is idempotent


def _fill_external(model: ir.Model, proto: onnx.ModelProto) -> None:
    """Rule 2: tensors onnx_ir serialized as external references get their bytes inline."""
    from mconv.irio import _external_tensors
    from onnx.external_data_helper import _get_all_tensors

    external = {(t.location, int(t.offset or 0), t.length): t for t in _external_tensors(model)}
    for tensor in _get_all_tensors(proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        length = int(info["length"]) if "length" in info else None
        source = external.get((info.get("location"), int(info.get("offset", 0)), length))
        assert source is not None, f"tensor {tensor.name}: external data not the model's own"
        tensor.raw_data = source.tobytes()
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def graph_bytes(model: ir.Model, weight_names: Collection[str]) -> bytes:
    """Rule 2: the prepared ``model`` without the initializers ``weight_names`` and metadata."""
    from mconv.irio import to_proto

    names = set(weight_names)
    proto = to_proto(model)
    kept = [t for t in proto.graph.initializer if t.name not in names]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    del proto.metadata_props[:]
    _fill_external(model, proto)
    return proto.SerializeToString(deterministic=True)


def read_graph(bundle: Bundle, rel: str, label: str) -> tuple[ir.Model, dict[str, np.ndarray]]:
    """Rule 3: the bundle's graph ``rel`` with its weights restored, and the weights by name."""
    from mconv.irio import _quiet_logger
    from mconv.onnx_check import check_model
    from onnx.external_data_helper import _get_all_tensors

    if rel not in bundle.files:
        raise InputError(
            f"bundle has no {rel}: mconv compiles only kernels it generates itself from the "
            "bundle's graph, and this bundle (from an older mconv) has none",
            path=label,
            hint="re-export the bundle with this mconv",
        )
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bundle.read_bytes(rel))
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise InputError(
            f"{rel} is not a valid ONNX model ({type(exc).__name__})",
            path=label,
            hint="re-export the bundle",
        ) from None
    for tensor in _get_all_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            raise IntegrityError(
                f"tensor {show(tensor.name)} names external data",
                path=label,
                where=rel,
                hint="a bundle's graph holds its constants itself; re-export the bundle",
            )
    weights: dict[str, np.ndarray] = {}
    if any(w.get("codec") != DENSE for w in bundle.weights):
        with bundle.container() as container:
            weights = {name: np.asarray(container.array(name), order="C") for name in container.names}
    proto.graph.initializer.extend(
        ir.serde.serialize_tensor(ir.Tensor(a, name=n)) for n, a in weights.items()
    )
    # no tensor names external data (checked above), so the folder is never read
    check_model(proto, path=f"{label}/{rel}", folder=tempfile.gettempdir())
    try:
        with _quiet_logger("onnx_ir.serde"):
            model = ir.serde.deserialize_model(proto)
    except Exception as exc:  # noqa: BLE001 - onnx_ir raises several types on bad input
        raise InputError(
            f"{rel} is not a valid ONNX model ({type(exc).__name__}: {show(str(exc)[:80])})",
            path=label,
            hint="re-export the bundle",
        ) from None
    return model, weights


def regenerated_mismatch(bundle: Bundle, expected: dict[str, bytes], label: str, graph: str) -> None:
    """Each shipped file of ``expected`` (bundle-relative path -> bytes mconv generates from the
    bundle's graph) must be byte-identical; else one InputError naming the first that is not."""
    for rel, data in expected.items():
        if rel not in bundle.files or bundle.read_bytes(rel) != data:
            raise InputError(
                f"{rel} is not what mconv generates from the bundle's graph ({graph})",
                path=label,
                hint="the bundle was edited after export; re-export it from the model",
            )
