"""Weight-only models, and safetensors files (import and export).

A weight file (safetensors, ``.npz``, TensorFlow checkpoint) holds named tensors and no graph.
mconv imports it as a *weight-only model*: an ``onnx_ir.Model`` whose graph has the tensors as
initializers, in file order, and no nodes, no inputs and no outputs. It saves as a plain
``.onnx`` (every ONNX tool opens it), runs through passes that act on tensors (``cluster`` with
``tensors="all"``, ``fp16``), and exports as a weights bundle (:mod:`mconv.weightbundle`) or
back to a weight file.

Weight-only rules:

1. :func:`weight_only_model` builds the model; ``metadata_props["mconv.weight_only"] = "1"``
   marks it, and :func:`is_weight_only` recognises one by structure (no nodes, no outputs, at
   least one initializer), so a model read back from ``.onnx`` is still recognised.
2. Tensor names are kept verbatim (``conv1/kernel``, ``layer.0.weight``); only an empty name or
   a name given twice is refused.

safetensors rules (https://github.com/huggingface/safetensors, format version 1):

1. Layout: u64 little-endian header length ``N``, ``N`` bytes of UTF-8 JSON, then the data
   area. The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
   (offsets relative to the data area) plus an optional ``"__metadata__"`` of strings.
2. Reads are bounded: ``N`` is checked against the real file size (and a 100 MB cap, as the
   reference reader does) before the header is read; every tensor's ``[begin, end)`` must lie
   inside the data area and hold exactly ``prod(shape) * itemsize`` bytes. Any violation is an
   :class:`mconv.errors.InputError` naming the file, the tensor and the byte offset.
3. Tensors are memory-mapped (one ``np.memmap`` of the file, a view per tensor): nothing is
   copied until a pass or a writer touches the values.
4. ``save`` writes every initializer of any model (weight-only or not) with the official
   ``safetensors.numpy`` writer, atomically; ``__metadata__`` carries the model's string
   ``metadata_props`` (provenance).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError
from mconv.fileio import atomic_path
from mconv.formats import Format

WEIGHT_ONLY_KEY = "mconv.weight_only"
# The reference reader's cap on the JSON header (safetensors' MAX_HEADER_SIZE).
SAFETENSORS_MAX_HEADER = 100_000_000
_HINT_CORRUPT = "the file is truncated or corrupt; re-save it"

# safetensors dtype names -> numpy dtypes (bfloat16 and float8 through ml_dtypes, as onnx_ir uses).
_ST_DTYPES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


# --- weight-only models ------------------------------------------------------------------------


def weight_only_model(
    arrays: Iterable[tuple[str, np.ndarray]], *, name: str = "weights", path: str | None = None
) -> ir.Model:
    """A model whose graph holds ``arrays`` as initializers and nothing else (rule 1)."""
    graph = ir.Graph(inputs=[], outputs=[], nodes=[], opset_imports={"": 17}, name=name)
    for tensor_name, array in arrays:
        if not tensor_name:
            raise InputError("a tensor has an empty name", path=path, hint="name every tensor")
        if tensor_name in graph.initializers:
            raise InputError(
                f"tensor '{tensor_name}' appears twice", path=path, hint="tensor names must be unique"
            )
        tensor = ir.Tensor(array, name=tensor_name)
        value = ir.Value(name=tensor_name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype))
        value.const_value = tensor
        graph.register_initializer(value)
    model = ir.Model(graph, ir_version=10, producer_name="mconv")
    model.metadata_props[WEIGHT_ONLY_KEY] = "1"
    return model


def is_weight_only(model: ir.Model) -> bool:
    """True for a model with tensors and no computation (rule 1)."""
    g = model.graph
    return len(g) == 0 and not g.outputs and len(g.initializers) > 0


def model_arrays(model: ir.Model) -> dict[str, np.ndarray]:
    """Every initializer with a value, by name, in graph order."""
    return {
        name: value.const_value.numpy()
        for name, value in model.graph.initializers.items()
        if value.const_value is not None
    }


def _shape_bytes(shape: list, itemsize: int, name: str, path: Path, where: str) -> int:
    """Bytes a tensor of ``shape`` needs; refuses negative or non-integer dimensions."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InputError(
            f"tensor '{name}' has an invalid shape {shape!r}", path=str(path), where=where, hint=_HINT_CORRUPT
        )
    return math.prod(shape) * itemsize


# --- safetensors -------------------------------------------------------------------------------


def _st_dtype(code: str, name: str, path: Path, where: str) -> np.dtype:
    if code in _ST_DTYPES:
        return np.dtype(_ST_DTYPES[code])
    if code in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[code]))
    raise InputError(
        f"tensor '{name}' has unsupported dtype {code!r}",
        path=str(path),
        where=where,
        hint=f"supported: {', '.join([*_ST_DTYPES, *_ML_DTYPES])}",
    )


def read_safetensors(path: str | Path) -> tuple[list[tuple[str, np.ndarray]], dict[str, str]]:
    """Tensors (memory-mapped, file order by offset) and ``__metadata__`` of a safetensors file."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise InputError(
            f"file is {size} bytes, shorter than the 8-byte header length",
            path=str(path),
            where="byte offset 0",
            hint=_HINT_CORRUPT,
        )
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8 or header_len > SAFETENSORS_MAX_HEADER:
            raise InputError(
                f"header length {header_len} runs past the end of the {size}-byte file",
                path=str(path),
                where="byte offset 0",
                hint=_HINT_CORRUPT,
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(
            f"header is not valid JSON ({str(exc)[:80]})",
            path=str(path),
            where="byte offset 8",
            hint=_HINT_CORRUPT,
        ) from None
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        metadata = {}
    data_start = 8 + header_len
    data_len = size - data_start
    specs = []
    for name, info in header.items():
        where = f"header entry '{name}' (byte offset 8)"
        try:
            code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise InputError(
                f"tensor '{name}' entry lacks dtype/shape/data_offsets",
                path=str(path),
                where=where,
                hint=_HINT_CORRUPT,
            ) from None
        dtype = _st_dtype(code, name, path, where)
        need = _shape_bytes(shape, dtype.itemsize, name, path, where)
        if not (isinstance(begin, int) and isinstance(end, int)) or not 0 <= begin <= end <= data_len:
            raise InputError(
                f"tensor '{name}' data [{begin}, {end}) lies outside the {data_len}-byte data area",
                path=str(path),
                where=f"byte offset {data_start + (begin if isinstance(begin, int) else 0)}",
                hint=_HINT_CORRUPT,
            )
        if end - begin != need:
            raise InputError(
                f"tensor '{name}' holds {end - begin} bytes but shape {shape} of {code} needs {need}",
                path=str(path),
                where=f"byte offset {data_start + begin}",
                hint=_HINT_CORRUPT,
            )
        specs.append((begin, name, dtype, tuple(shape), end))
    specs.sort(key=lambda s: (s[0], s[1]))
    blob = np.memmap(path, dtype=np.uint8, mode="r") if data_len > 0 else np.zeros(0, np.uint8)
    arrays = []
    for begin, name, dtype, shape, end in specs:
        chunk = blob[data_start + begin : data_start + end]
        arrays.append((name, chunk.view(dtype).reshape(shape) if chunk.size else np.zeros(shape, dtype)))
    return arrays, {str(k): str(v) for k, v in metadata.items()}


def _load_safetensors(paths: list[Path], options: dict) -> ir.Model:
    arrays, metadata = read_safetensors(paths[0])
    model = weight_only_model(arrays, name=paths[0].stem, path=str(paths[0]))
    if metadata:
        model.metadata_props["mconv.safetensors_metadata"] = json.dumps(metadata, sort_keys=True)
    return model


def writable_arrays(model: ir.Model) -> list[tuple[str, np.ndarray]]:
    """Initializers as contiguous numpy arrays, in graph order (the writers' input)."""
    return [(name, np.ascontiguousarray(a)) for name, a in model_arrays(model).items()]


def save_safetensors(model: ir.Model, dest: Path, options: dict) -> list[Path]:
    """Write every initializer of ``model`` to ``dest`` with the official writer (rule 4)."""
    from safetensors.numpy import save_file

    tensors = dict(writable_arrays(model))
    if not tensors:
        raise InputError(
            "model has no weights to write", path=str(dest), hint="safetensors holds initializers only"
        )
    metadata = {k: v for k, v in model.metadata_props.items() if isinstance(v, str)}
    metadata["producer"] = "mconv"
    with atomic_path(dest) as tmp:
        try:
            save_file(tensors, str(tmp), metadata=metadata)
        except (ValueError, TypeError) as exc:  # a dtype safetensors cannot hold (strings, ...)
            raise InputError(
                f"cannot write safetensors ({str(exc)[:120]})", path=str(dest), hint="write .onnx instead"
            ) from None
    return [Path(dest)]


def _sniff_safetensors(head: bytes, path: Path) -> bool:
    if len(head) < 10:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= SAFETENSORS_MAX_HEADER and head[8:9] == b"{"


FORMAT = Format(
    name="safetensors",
    description="safetensors weight file (weight-only model; memory-mapped)",
    extensions=(".safetensors",),
    load=_load_safetensors,
    save=save_safetensors,
    sniff=_sniff_safetensors,
)
