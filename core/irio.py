"""The IR at rest: ``.onnx`` files in and out of ``onnx_ir.Model``, and model statistics.

``onnx_ir`` is the in-memory IR (ONNX semantics, use-def chains). Tensors stored as external
data are memory-mapped lazily by onnx_ir, so a model over 2 GB never becomes one protobuf.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import tempfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from mconv.errors import InputError, show
from mconv.fileio import require_file
from mconv.ir_maptypes import install as _install_map_types
from mconv.wire import encode_varint, iter_fields, length_delimited, read_varint

_install_map_types()  # map(key, value) types (ZipMap's outputs): onnx_ir has none of its own

# Above this many weight bytes a saved model puts its tensors in "<name>.data" beside it.
EXTERNAL_DATA_THRESHOLD = 1 << 27


# Single-file models at least this large load lazily: their big initializers stay in the file
# (memory-mapped on first use) instead of being copied into the parsed protobuf message.
LAZY_LOAD_THRESHOLD = 1 << 26
# Tensors whose raw_data is at least this large become references into the source file.
LAZY_TENSOR_BYTES = 1 << 20


def load_onnx(
    path: str | os.PathLike, *, lazy: bool | None = None, provided: Collection[str] = ()
) -> ir.Model:
    """Load an ``.onnx`` file (external data memory-mapped lazily) with one-line errors.

    Rules:
    1. A single-file model of at least ``LAZY_LOAD_THRESHOLD`` bytes (or any, with ``lazy=True``)
       is read lazily: :func:`lazy_model_proto` parses everything but the top-level graph's large
       ``raw_data`` payloads, which become external-data references (offset, length) into the
       file itself. Peak memory is then the model's structure, not its weights; a weight is
       read when a pass asks for it. The file is never written.
    2. Files with external data load as onnx_ir does: each tensor memory-mapped on first use.
    3. Before anything reads a weight, :func:`mconv.onnx_check.check_model` checks the parsed
       protobuf: structure (SSA, defined inputs, no cycle), dtypes, every tensor's data size, and
       every external location (inside the model's folder, symlinks resolved, within the file).
       External tensors then read from the resolved paths under the folder. ``provided`` names
       values defined outside the file (a bundle's weightless graph: its weights).
    """
    from mconv.onnx_check import check_model

    p = require_file(path, "ONNX model")
    size = p.stat().st_size
    real = p.resolve()  # references name the file itself, not a symlink to it (onnx_ir refuses those)
    if lazy is None:
        lazy = size >= LAZY_LOAD_THRESHOLD
    lazy = lazy and real.stat().st_nlink == 1  # onnx_ir refuses to map files with hard links
    # External locations are relative to the folder of the file as named (onnx's rule); a lazy
    # load's references name the resolved file, so its folder is the resolved one.
    folder = os.path.realpath(real.parent if lazy else p.parent)
    try:
        proto = lazy_model_proto(real) if lazy else onnx.load(p, load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise _invalid(p, size, exc) from None
    check_model(proto, path=p, folder=folder, provided=provided)
    # onnx_ir logs a warning for each value used but not defined: the provided ones are expected.
    quiet = contextlib.nullcontext() if not provided else _quiet_logger("onnx_ir.serde")
    try:
        with quiet:
            model = ir.serde.deserialize_model(proto)
    except Exception as exc:  # the protobuf parsed and passed the checks: not corrupt, unsupported
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        raise InputError(
            f"a construct of this ONNX model is not supported ({type(root).__name__}: {str(root)[:120]})",
            path=str(p),
            where=f"{size} bytes",
            hint="the file is valid protobuf; please report the model's producer",
        ) from None
    del proto
    for tensor in _external_tensors(model):
        tensor.base_dir = folder
    _unknown_negative_dims(model.graph)
    # A weight-only model (mconv.formats.weights: initializers, no nodes) is not empty.
    if model.graph is None or (
        len(model.graph) == 0 and not model.graph.outputs and not model.graph.initializers
    ):
        raise InputError("ONNX model has an empty graph", path=str(p), hint="re-export the model")
    return model


def _unknown_negative_dims(graph: ir.Graph) -> None:
    """A negative ``dim_value`` (Paddle2ONNX writes -1 for a dynamic dim; ONNX Runtime reads it as
    unknown) becomes an unknown dim, so nothing downstream takes -1 for a size (a bundle manifest
    with shape -1 is refused on load)."""
    values = [*graph.inputs, *graph.outputs]
    for node in graph:
        values.extend(v for v in node.outputs if v is not None)
    for v in values:
        shape = v.shape
        if shape is not None and any(isinstance(d, int) and d < 0 for d in shape):
            v.shape = ir.Shape([None if isinstance(d, int) and d < 0 else d for d in shape])


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _invalid(p: Path, size: int, exc: Exception) -> InputError:
    return InputError(
        f"not a valid ONNX model ({type(exc).__name__}: {str(exc)[:120]})",
        path=str(p),
        where=f"{size} bytes",
        hint="the file is truncated or corrupt; re-export it",
    )


def _external_tensors(model: ir.Model):
    """Every external tensor of the model: initializers and attribute tensors of the main graph,
    its subgraphs and the model-local functions (onnx_ir's set_base_dir skips functions)."""
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.TENSOR:
                    tensors = [attr.value]
                elif attr.type == ir.AttributeType.TENSORS:
                    tensors = list(attr.value)
                elif attr.type == ir.AttributeType.GRAPH:
                    tensors = [v.const_value for v in attr.value.initializers.values()]
                elif attr.type == ir.AttributeType.GRAPHS:
                    tensors = [v.const_value for g in attr.value for v in g.initializers.values()]
                else:
                    continue
                yield from (t for t in tensors if isinstance(t, ir.ExternalTensor))
    for value in model.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            yield value.const_value


# --------------------------------------------------------------------------- protobuf wire format
# ModelProto.graph = 7, GraphProto.initializer = 5, TensorProto.raw_data = 9, .external_data = 13,
# .data_location = 14 (EXTERNAL = 1); StringStringEntryProto.key = 1, .value = 2 (onnx.proto3).
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14


def _entry(key: str, value: str) -> bytes:
    return length_delimited(
        _TENSOR_EXTERNAL_DATA, length_delimited(1, key.encode()) + length_delimited(2, value.encode())
    )


def lazy_model_proto(path: Path, min_bytes: int | None = None) -> onnx.ModelProto:
    """Parse ``path`` with every top-level initializer's ``raw_data`` of at least ``min_bytes``
    replaced by an external-data reference to its own bytes in ``path`` (location = the file's
    name, offset and length of the payload), so the payloads are never copied into memory.

    Only the wire format is walked (ModelProto -> graph -> initializer -> raw_data); every other
    byte is kept as it was. Subgraph initializers, Constant nodes and typed data fields
    (float_data, ...) load as usual.
    """
    import mmap

    min_bytes = LAZY_TENSOR_BYTES if min_bytes is None else min_bytes
    location = path.name
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        model_parts = []
        for number, wire, field_start, payload, end in iter_fields(buf, 0, len(buf)):
            if number != _MODEL_GRAPH or wire != 2:
                model_parts.append(buf[field_start:end])
                continue
            graph_parts = []
            for g_number, g_wire, g_start, g_payload, g_end in iter_fields(buf, payload, end):
                if g_number != _GRAPH_INITIALIZER or g_wire != 2:
                    graph_parts.append(buf[g_start:g_end])
                    continue
                fields = list(iter_fields(buf, g_payload, g_end))
                # A tensor already marked external keeps its raw_data: the checks refuse it whole.
                external = any(
                    f[0] == _TENSOR_EXTERNAL_DATA
                    or (f[0] == _TENSOR_DATA_LOCATION and f[1] == 0 and read_varint(buf, f[3])[0] != 0)
                    for f in fields
                )
                tensor_parts, moved = [], None
                for t_number, t_wire, t_start, t_payload, t_end in fields:
                    if (
                        t_number == _TENSOR_RAW_DATA
                        and t_wire == 2
                        and t_end - t_payload >= min_bytes
                        and not external
                    ):
                        moved = (t_payload, t_end - t_payload)
                    else:
                        tensor_parts.append(buf[t_start:t_end])
                if moved is not None:
                    offset, length = moved
                    tensor_parts += [
                        _entry("location", location),
                        _entry("offset", str(offset)),
                        _entry("length", str(length)),
                        encode_varint(_TENSOR_DATA_LOCATION << 3) + encode_varint(1),
                    ]
                graph_parts.append(length_delimited(_GRAPH_INITIALIZER, b"".join(tensor_parts)))
            model_parts.append(length_delimited(_MODEL_GRAPH, b"".join(graph_parts)))
        return onnx.load_model_from_string(b"".join(model_parts))


# --------------------------------------------------------------------------- tensors out of core
# Inside ``spilling``, arrays of at least this many bytes go to scratch files.
SPILL_MIN_BYTES = 1 << 25
SPILL_PREFIX = ".mconv-spill-"
_SPILL: dict = {"dir": None, "min_bytes": SPILL_MIN_BYTES, "count": 0}


@contextlib.contextmanager
def spilling(directory: str | os.PathLike, min_bytes: int | None = None):
    """While active, :func:`weight_tensor` writes arrays of at least ``min_bytes`` to a scratch
    folder in ``directory`` and returns external tensors over them, so a pass rewriting a large
    model holds one weight in memory at a time, not all of them. The folder is deleted on exit:
    save the model (and read what you need of it) inside the block."""
    from mconv.fileio import clean_stale_scratch, lock_fd, output_errors, remove_quietly

    # The folder is named .mconv-spill-{pid}-* and locked while this process lives, so the next
    # run removes the ones that killed runs left (mconv.fileio rule 1) and never a live one.
    clean_stale_scratch(directory, SPILL_PREFIX)
    prefix = f"{SPILL_PREFIX}{os.getpid()}-"
    try:
        scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
    except OSError:  # not writable there (the output's own error comes when it is saved)
        with output_errors(tempfile.gettempdir(), what="create a scratch folder for large weights"):
            scratch = Path(tempfile.mkdtemp(prefix=prefix))
    fd = lock_fd(scratch)
    saved = dict(_SPILL)
    _SPILL.update(dir=scratch, min_bytes=SPILL_MIN_BYTES if min_bytes is None else min_bytes)
    try:
        yield scratch
    finally:
        _SPILL.clear()
        _SPILL.update(saved)
        if fd >= 0:
            os.close(fd)
        remove_quietly(scratch)


def weight_tensor(array: np.ndarray, name: str | None) -> ir.TensorProtocol:
    """``array`` as an IR tensor: in memory, or spilled to the scratch folder (see :func:`spilling`)."""
    from mconv.codecs.palette import known_histogram, remember_histogram

    known = known_histogram(array)  # palette rule 8: the tensor keeps what its array had
    array = np.asarray(array, order="C")  # keeps a 0-d array 0-d (ascontiguousarray: shape [1])
    scratch = _SPILL["dir"]
    if scratch is None or array.nbytes < _SPILL["min_bytes"] or array.dtype.byteorder == ">":
        tensor = ir.tensor(array, name=name)
        if known is not None:
            remember_histogram(tensor, *known)
        return tensor
    _SPILL["count"] += 1
    location = f"{_SPILL['count']}.bin"
    from mconv.fileio import output_errors

    with output_errors(scratch / location, what="write a large weight to the scratch folder"):
        with open(scratch / location, "wb") as f:
            f.write(array.data.cast("B"))  # the array's own buffer, as bytes
    spilled = ir.ExternalTensor(
        location,
        offset=0,
        length=array.nbytes,
        dtype=ir.DataType.from_numpy(array.dtype),
        shape=ir.Shape(array.shape),
        name=name or "",
        base_dir=str(scratch),
    )
    if known is not None:  # a scratch file is written once (palette rule 8)
        remember_histogram(spilled, *known)
    return spilled


def owned_array(tensor: ir.TensorProtocol) -> np.ndarray:
    """A writable copy of ``tensor``'s values that the caller owns. An external tensor is read
    from its file straight into the copy (no memory map left behind holding its pages)."""
    if isinstance(tensor, ir.ExternalTensor) and tensor.dtype.bitwidth >= 8 and tensor.size:
        dtype = np.dtype(tensor.dtype.numpy()).newbyteorder("<")
        with open(tensor.path, "rb") as f:
            f.seek(tensor.offset or 0)
            array = np.fromfile(f, dtype=dtype, count=tensor.size)
        if array.size != tensor.size:
            raise InputError(
                f"external data of {tensor.name!r} is truncated",
                path=str(tensor.path),
                where=f"offset {tensor.offset or 0}",
                hint="the weights file is incomplete; re-export the model",
            )
        return array.astype(array.dtype.newbyteorder("="), copy=False).reshape(tensor.shape.numpy())
    return np.array(tensor.numpy(), copy=True)


def from_proto(proto: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(proto)


def to_proto(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


# A protobuf message cannot exceed 2 GiB; self_contained_bytes refuses models that would.
_PROTO_LIMIT = (1 << 31) - (1 << 20)


def self_contained_bytes(model: ir.Model) -> bytes:
    """The model as one ONNX protobuf with every tensor's data inside it: the external tensors
    (a large file's lazily loaded initializers, spilled scratch tensors, ``.data`` files) read
    in. For a process that cannot see the source files (Ray workers on other hosts, or in
    another working folder: a plain serialisation keeps references such as ``resnet50.onnx``
    relative to the source's folder)."""
    external = {(t.location, int(t.offset or 0), t.length): t for t in _external_tensors(model)}
    total = sum(int(t.nbytes) for t in external.values())
    if total > _PROTO_LIMIT:
        raise InputError(
            f"the model's {total / 1e9:.1f} GB of weights do not fit one protobuf message",
            hint="run it in-process (without --workers / --ray)",
        )
    proto = ir.serde.serialize_model(model)
    from onnx.external_data_helper import _get_all_tensors

    for tensor in _get_all_tensors(proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        length = int(info["length"]) if "length" in info else None
        source = external.get((info.get("location"), int(info.get("offset", 0)), length))
        if source is None:  # only the model's own external tensors are ever serialised
            raise InputError(f"tensor {show(tensor.name)}: its external data is not the model's own")
        tensor.raw_data = source.tobytes()
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    if proto.ByteSize() > _PROTO_LIMIT:
        raise InputError(
            f"the model is {proto.ByteSize() / 1e9:.1f} GB, over one protobuf message's 2 GB",
            hint="run it in-process (without --workers / --ray)",
        )
    return proto.SerializeToString()


def save_onnx(
    model: ir.Model, path: str | os.PathLike, *, external_threshold: int = EXTERNAL_DATA_THRESHOLD
) -> list[Path]:
    """Save ``model`` atomically; large weights go to ``<name>.data`` beside it.

    Returns the files written. Rules:

    1. Everything is written into a temporary folder beside ``path`` (named and cleaned up as
       :mod:`mconv.fileio` rule 1 says) and renamed into place when complete; a failure leaves
       no temporary and the first error propagates (cleanup never raises).
    2. An ``OSError`` writing the output is one line naming it (a full disk, a read-only or
       missing folder); one reading the model's external data names that file.
    3. When the output gets ``<name>.data`` and the model still reads weights from ``path`` or
       its ``<name>.data`` (``-o`` naming the input), the save is refused: the pair cannot be
       replaced in one step, and a run killed between the two renames would leave the input
       unreadable.
    4. External initializers that the output keeps inside the ``.onnx`` (all of them for a
       self-contained file; those of at most 1 KB beside a data file) are read in with plain
       file reads first (:func:`_read_in_external`); no memory map is closed by the save.
    """
    from mconv.fileio import (
        check_output,
        output_errors,
        prepare_output,
        read_error,
        remove_quietly,
        temp_dir,
    )

    dest = prepare_output(path)
    total = weight_bytes(model)
    data_name = dest.name + ".data" if total > external_threshold else None
    if data_name:
        check_output(dest.parent / data_name, "file")  # the data file is replaced too
        _refuse_overwriting_sources(model, dest, [dest, dest.parent / data_name])
    tmpdir = None
    fd = -1
    try:
        with output_errors(dest, dest.parent, what="create a temporary folder beside the output"):
            tmpdir, fd = temp_dir(dest)
        tmp_model = tmpdir / dest.name
        targets = [dest, tmpdir] + ([dest.parent / data_name] if data_name else [])
        try:
            with output_errors(*targets):
                if data_name:
                    _read_in_external(model, _SMALL_EXTERNAL_BYTES)
                    ir.save(
                        model,
                        tmp_model,
                        external_data=data_name,
                        size_threshold_bytes=_SMALL_EXTERNAL_BYTES,
                    )
                else:
                    _read_in_external(model, None)
                    ir.save(model, tmp_model)
                written = []
                if data_name:
                    os.replace(tmpdir / data_name, dest.parent / data_name)
                    written.append(dest.parent / data_name)
                os.replace(tmp_model, dest)
        except OSError as exc:  # not about the output: an external-data file of the model
            raise read_error(exc, exc.filename or dest, "model's external data") from None
        written.insert(0, dest)
        return written
    finally:
        if fd >= 0:
            os.close(fd)
        if tmpdir is not None:
            remove_quietly(tmpdir)


# Initializers of at most this many bytes stay inside a saved ``.onnx``, the rest go to its data file.
_SMALL_EXTERNAL_BYTES = 1024


def _read_in_external(model: ir.Model, max_bytes: int | None) -> None:
    """Rule 4 of :func:`save_onnx`: every external initializer (of every graph) of at most
    ``max_bytes`` bytes (any size with None) becomes an in-memory copy read with plain file
    reads. The copies are what the saved file holds (a reference would point at a source or
    scratch file), and onnx_ir is never left to do it: it would read through the tensor's
    memory map and then close the map, which fails while any view of it is still alive."""
    from mconv.codecs.palette import known_histogram, remember_histogram

    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, ir.ExternalTensor):
                continue
            if max_bytes is not None and tensor.nbytes > max_bytes:
                continue
            known = known_histogram(tensor)
            value.const_value = ir.tensor(owned_array(tensor), name=value.name)
            if known is not None:  # palette rule 8: the same values
                remember_histogram(value.const_value, *known)


def _refuse_overwriting_sources(model: ir.Model, dest: Path, outputs: list[Path]) -> None:
    """Rule 3 of :func:`save_onnx`: no initializer may read from a file the save replaces."""
    existing = [o for o in outputs if o.exists()]
    if not existing:
        return
    for value in model.graph.initializers.values():
        t = value.const_value
        if not isinstance(t, ir.ExternalTensor):
            continue
        for o in existing:
            try:
                same = os.path.samefile(t.path, o)
            except OSError:
                same = False
            if same:
                raise InputError(
                    f"the output would replace '{o.name}', which the model's weights are read from "
                    f"(tensor '{show(value.name)}')",
                    path=str(dest),
                    hint="write to another -o path, then move it over the input",
                )


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
