"""The cpu target: ONNX Runtime.

Export rules:

1. ``model.onnx`` is the graph serialized by onnx_ir with every top-level initializer and the
   graph's ``value_info`` removed from the protobuf (ONNX Runtime infers the intermediate types
   itself, and the weights come back typed as initializers at load; the value infos can be a
   third of a small model's graph); the graph is otherwise unchanged.
   The weights live only in ``weights.mcw``, each with the codec :func:`mconv.container.choose_codec`
   picks (option ``codec`` forces one for all); int4/uint4 weights, which the container has no
   dtype for, stay in ``model.onnx`` (ONNX packs them two per byte), listed with codec ``"dense"``.
   The model's ``mconv.passes`` and ``mconv.compression`` metadata are left out of ``model.onnx``:
   the manifest's ``provenance`` holds the pass history and ``weights.mcw`` each tensor's codec
   (after a budget search the two keys are about 3.6 KB, a tenth of a small bundle such as
   LeNet-5's 43 KB; ``bench/container_overhead.py``).
2. Option ``verification`` (a summary dict) goes to the manifest's ``verification``; the other
   options are recorded under ``options``.
3. Option ``dense=True`` writes a self-contained ``model.onnx`` with the weights inside and no
   ``weights.mcw``; the manifest lists every weight with codec ``"dense"``. For tools that read
   plain ONNX. Limited to the 2 GB protobuf limit.
4. Option ``matmul_nbits=True`` rewrites the ``blockwise`` pass's int4 DequantizeLinear + MatMul
   into ONNX Runtime's ``com.microsoft.MatMulNBits`` with packed uint8 weights
   (:mod:`mconv.targets.cpu.nbits`); ``nbits_accuracy_level`` is its ``accuracy_level``.
5. Serialization is deterministic, so the same model and options give byte-identical files.

Load rules:

1. Weights are decoded in memory (no temporary files) and attached to the graph proto, which
   ONNX Runtime receives as bytes.
2. When graph plus weights would pass the protobuf limit, each weight is kept as a placeholder
   initializer pointing at in-memory data and the real arrays are handed to ONNX Runtime as
   OrtValues (``SessionOptions.add_external_initializers``). Small weights (under
   ``INLINE_BYTES``, smallest first, ``INLINE_BUDGET`` in all) stay inside the proto: ONNX
   Runtime's shape inference reads the values of shape tensors (Reshape's shape, Unsqueeze's
   axes, 0-d Gather indices) and cannot read a placeholder.
3. Feeds are checked against the inputs (names, dtype, rank and fixed dimensions) before ONNX
   Runtime sees them; a bad feed raises :class:`mconv.errors.InputError` naming the input.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from mconv.bundle import DENSE, Bundle, TensorSpec, provenance_from_model, write_bundle
from mconv.container import choose_codec
from mconv.errors import InputError
from mconv.irio import real_inputs, to_proto
from mconv.onnx_check import check_model
from mconv.targets.base import open_bundle
from mconv.targets.cpu.options import Options as Options  # the export options

NAME = "cpu"
PAYLOAD = "model.onnx"
# Above this many bytes (graph + weights) a ModelProto cannot be serialized; keep a margin.
PROTOBUF_LIMIT = (2 << 30) - (64 << 20)
# Location named by placeholder initializers of an over-limit model; no such file exists.
_PLACEHOLDER_LOCATION = "mconv-in-memory-weights"
# Over the limit, weights up to this size stay in the proto (shape tensors), up to the budget.
INLINE_BYTES = 64 << 10
INLINE_BUDGET = 32 << 20  # well inside the 64 MB margin of PROTOBUF_LIMIT
# int4/uint4 weights (the blockwise pass's codes) have no weights.mcw dtype: ONNX packs them.
_SUB_BYTE = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


_IN_MANIFEST = ("mconv.passes", "mconv.compression")  # rule 1: said once, by the manifest and container


def _split_model(model: ir.Model) -> tuple[onnx.ModelProto, list[tuple[str, np.ndarray]]]:
    """The model as a proto without top-level initializers, and those initializers as arrays."""
    proto = to_proto(model)
    del proto.graph.initializer[:]
    weights = []
    for name, value in model.graph.initializers.items():
        if value.const_value is None:
            continue
        weights.append((name, value.const_value.numpy()))
    return proto, weights


def _serialize(proto: onnx.ModelProto) -> bytes:
    return proto.SerializeToString(deterministic=True)


def _contiguous(array: np.ndarray) -> np.ndarray:
    """``array`` in C order with its shape kept (``np.ascontiguousarray`` makes a 0-d array 1-d)."""
    return np.asarray(array, order="C")


def _tensor_proto(name: str, array: np.ndarray) -> onnx.TensorProto:
    return ir.serde.serialize_tensor(ir.Tensor(_contiguous(array), name=name))


def export(model: ir.Model, out_dir: str | os.PathLike, options: Mapping | None = None) -> Bundle:
    """Write a cpu bundle (model.onnx + weights.mcw + manifest.json) for ``model`` at ``out_dir``."""
    options = dict(options or {})
    dense = bool(options.get("dense", False))
    forced = options.get("codec")
    proto, weights = _split_model(model)
    if options.get("matmul_nbits"):
        from mconv.targets.cpu.nbits import rewrite

        weights, _ = rewrite(proto, weights, int(options.get("nbits_accuracy_level") or 0))
    del proto.graph.value_info[:]  # rule 1
    metadata = dict(model.metadata_props)
    kept = [p for p in proto.metadata_props if p.key not in _IN_MANIFEST]  # rule 1
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    if dense:
        if sum(a.nbytes for _, a in weights) + proto.ByteSize() > PROTOBUF_LIMIT:
            raise InputError(
                "the model is over the 2 GB protobuf limit and cannot be dense",
                where="--dense",
                hint="export without --dense (weights go to weights.mcw)",
            )
        proto.graph.initializer.extend(_tensor_proto(n, a) for n, a in weights)
        specs = [(n, a, {"codec": DENSE}) for n, a in weights]
    else:
        specs = []
        for n, a in weights:
            if a.dtype in _SUB_BYTE:  # no container dtype: kept in model.onnx, two codes per byte
                proto.graph.initializer.append(_tensor_proto(n, a))
                specs.append((n, a, {"codec": DENSE}))
            else:
                specs.append(
                    (n, a, {"codec": forced} if forced and forced != "auto" else choose_codec(a, metadata, n))
                )
    return write_bundle(
        out_dir,
        target=NAME,
        model_name=model.graph.name or Path(out_dir).name,
        inputs=[TensorSpec.from_value(v) for v in real_inputs(model.graph)],
        outputs=[TensorSpec.from_value(v) for v in model.graph.outputs],
        weights=specs,
        payload={PAYLOAD: _serialize(proto)},
        options={k: v for k, v in options.items() if k != "verification"},
        provenance=provenance_from_model(model),
        verification=options.get("verification"),
    )


@dataclass
class CpuRunner:
    """An ONNX Runtime session with checked feeds."""

    session: ort.InferenceSession
    inputs: list[TensorSpec]
    outputs: list[str]
    label: str = "model"
    # OrtValues handed to ORT as external initializers must outlive the session.
    _keepalive: list = field(default_factory=list, repr=False)

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = {s.name: s for s in self.inputs}
        unknown = sorted(set(feeds) - set(expected))
        if unknown:
            raise InputError(
                f"unknown input(s) {', '.join(unknown)}",
                path=self.label,
                hint=f"the model's inputs are: {', '.join(expected)}",
            )
        missing = [n for n in expected if n not in feeds]
        if missing:
            raise InputError(
                f"missing input(s) {', '.join(missing)}",
                path=self.label,
                hint="feed every model input (an .npz keyed by input name)",
            )
        checked = {}
        for name, spec in expected.items():
            arr = np.asarray(feeds[name])
            where = f"input '{name}'"
            if spec.dtype != "unknown" and arr.dtype.name != spec.dtype:
                raise InputError(
                    f"dtype {arr.dtype.name}, expected {spec.dtype}",
                    path=self.label,
                    where=where,
                    hint=f"cast the feed to {spec.dtype}",
                )
            if spec.shape is not None:
                shape_text = f"shape {list(arr.shape)}, expected {list(spec.shape)}"
                if arr.ndim != len(spec.shape):
                    raise InputError(
                        shape_text, path=self.label, where=where, hint=f"give a rank-{len(spec.shape)} array"
                    )
                for got, want in zip(arr.shape, spec.shape):
                    if isinstance(want, int) and got != want:
                        raise InputError(
                            shape_text, path=self.label, where=where, hint="only symbolic dimensions may vary"
                        )
            checked[name] = arr
        return checked

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        checked = self._check_feeds(feeds)
        try:
            values = self.session.run(self.outputs, checked)
        except Exception as exc:  # ORT raises its own Fail/InvalidArgument/RuntimeException types
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            shapes = ", ".join(f"{n}{list(a.shape)}:{a.dtype.name}" for n, a in checked.items())
            raise InputError(
                f"ONNX Runtime refused the feeds ({msg[:200]})",
                path=self.label,
                where=f"feeds {shapes}",
                hint=f"expected {', '.join(f'{s.name}{list(s.shape or [])}:{s.dtype}' for s in self.inputs)}",
            ) from None
        return dict(zip(self.outputs, values))


def _session_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only: ORT warns about unused initializers and such
    return so


def _make_session(
    proto: onnx.ModelProto, weights: list[tuple[str, np.ndarray]], label: str
) -> tuple[ort.InferenceSession, list]:
    """A session for ``proto`` (no initializers) plus ``weights``, all in memory."""
    so = _session_options()
    keepalive: list = []
    total = proto.ByteSize() + sum(int(a.nbytes) for _, a in weights)
    if total <= PROTOBUF_LIMIT:
        proto.graph.initializer.extend(_tensor_proto(n, a) for n, a in weights)
    else:
        # Placeholders keep each weight an initializer of the graph (ORT only replaces existing
        # external initializers); ORT swaps in the OrtValues before it reads any data.
        inline, budget = set(), INLINE_BUDGET
        for i in sorted(range(len(weights)), key=lambda i: weights[i][1].nbytes):
            nbytes = int(weights[i][1].nbytes)
            if nbytes > INLINE_BYTES or nbytes > budget:
                break
            inline.add(i)
            budget -= nbytes
        proto.graph.initializer.extend(_tensor_proto(*weights[i]) for i in sorted(inline))
        weights = [w for i, w in enumerate(weights) if i not in inline]
        for name, array in weights:
            placeholder = _tensor_proto(name, np.zeros((0,), dtype=array.dtype))
            del placeholder.dims[:]
            placeholder.dims.extend(array.shape)
            placeholder.ClearField("raw_data")
            placeholder.data_location = onnx.TensorProto.EXTERNAL
            # ORT replaces an external initializer before reading it, so this file never opens.
            for key, val in (
                ("location", _PLACEHOLDER_LOCATION),
                ("offset", "0"),
                ("length", str(array.nbytes)),
            ):
                entry = placeholder.external_data.add()
                entry.key, entry.value = key, val
            proto.graph.initializer.append(placeholder)
        names = [n for n, _ in weights]
        values = [ort.OrtValue.ortvalue_from_numpy(_contiguous(a)) for _, a in weights]
        so.add_external_initializers(names, values)
        keepalive = [values, [a for _, a in weights]]
    try:
        # ORT's Python wrapper prints its provider-fallback notes to stdout; stdout is the JSON's.
        with contextlib.redirect_stdout(io.StringIO()):
            session = ort.InferenceSession(
                _serialize(proto), sess_options=so, providers=["CPUExecutionProvider"]
            )
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"ONNX Runtime cannot load the model ({msg[:240]})",
            path=label,
            hint="check that every op is supported by ONNX Runtime at this opset",
        ) from None
    return session, keepalive


def _runner(
    session: ort.InferenceSession, inputs: list[TensorSpec], label: str, keepalive: list
) -> CpuRunner:
    outputs = [o.name for o in session.get_outputs()]
    return CpuRunner(session, inputs, outputs, label, keepalive)


def _bundle_parts(
    bundle: Bundle | str | os.PathLike,
) -> tuple[Bundle, onnx.ModelProto, list[tuple[str, np.ndarray]]]:
    """The bundle, its graph proto (as stored) and its weights decoded from weights.mcw."""
    bundle = open_bundle(bundle, NAME)
    label = str(bundle.root)
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bundle.read_bytes(PAYLOAD))
    except Exception as exc:
        raise InputError(
            f"{PAYLOAD} is not a valid ONNX model ({type(exc).__name__})",
            path=label,
            hint="re-export the bundle",
        ) from None
    weights: list[tuple[str, np.ndarray]] = []
    if any(w.get("codec") != DENSE for w in bundle.weights):
        with bundle.container() as container:
            weights = [(name, container.array(name)) for name in container.names]
    if bundle.is_zip:
        folder = tempfile.gettempdir()  # a zipped bundle's graph holds no external references
    else:
        folder = os.path.realpath(bundle.root)
    # The graph is a file from the bundle like any model file: checked before ONNX Runtime sees it
    # (strings, SSA, sizes, external locations inside the bundle), its weights as provided names.
    check_model(proto, path=f"{label}/{PAYLOAD}", folder=folder, provided=[n for n, _ in weights])
    return bundle, proto, weights


def load(bundle: Bundle | str | os.PathLike) -> CpuRunner:
    """An ONNX Runtime runner for a cpu bundle; weights decoded from weights.mcw in memory."""
    bundle, proto, weights = _bundle_parts(bundle)
    label = str(bundle.root)
    session, keepalive = _make_session(proto, weights, label)
    return _runner(session, bundle.inputs, label, keepalive)


def to_model(bundle: Bundle | str | os.PathLike) -> ir.Model:
    """The bundle's graph with its weights attached, as an IR model (for localization)."""
    bundle, proto, weights = _bundle_parts(bundle)
    proto.graph.initializer.extend(_tensor_proto(n, a) for n, a in weights)
    model = ir.serde.deserialize_model(proto)
    return model


def load_model(model: ir.Model, label: str = "model") -> CpuRunner:
    """An ONNX Runtime runner for a bare IR model (``mconv run model.onnx --target cpu``)."""
    proto, weights = _split_model(model)
    session, keepalive = _make_session(proto, weights, label)
    inputs = [TensorSpec.from_value(v) for v in real_inputs(model.graph)]
    return _runner(session, inputs, label, keepalive)


# The target (the protocol of mconv.targets.base) is this module.
name = NAME
TARGET = sys.modules[__name__]
