"""Weight-only models, and safetensors files (import and export).

A weight file (safetensors, ``.npz``, TensorFlow checkpoint) holds named tensors and no graph.
mconv imports it as a *weight-only model*: an ``onnx_ir.Model`` whose graph has the tensors as
initializers, in file order, and no nodes, no inputs and no outputs. It saves as a plain
``.onnx`` (every ONNX tool opens it), runs through passes that act on tensors (``cluster`` with
``tensors="all"``, ``fp16``), and exports as a weights bundle (:mod:`mconv.targets.weights`) or
back to a weight file.

Weight-only rules:

1. :func:`weight_only_model` builds the model; ``metadata_props["mconv.weight_only"] = "1"``
   marks it, and :func:`is_weight_only` recognises one by structure (no nodes, no outputs, at
   least one initializer), so a model read back from ``.onnx`` is still recognised.
2. Tensor names are kept verbatim (``conv1/kernel``, ``layer.0.weight``); only an empty name, a
   name given twice or one that is not valid Unicode (a lone surrogate) is refused.
3. :func:`mconv.fileio.check_shape` is the one shape check of every weight reader: a list of non-negative
   integers (not booleans), at most ``mconv.fileio.MAX_NDIM`` of them, whose byte size (the product of its
   non-zero dimensions times the item size) stays below 2**63, numpy's limit; it returns
   ``prod(shape) * itemsize`` for the reader to compare with the bytes the file really holds.

safetensors rules (https://github.com/huggingface/safetensors, format version 1):

1. Layout: u64 little-endian header length ``N``, ``N`` bytes of UTF-8 JSON, then the data
   area. The JSON is an object mapping each tensor name to ``{"dtype", "shape",
   "data_offsets": [begin, end]}`` (offsets relative to the data area) plus an optional
   ``"__metadata__"`` object of string values.
2. Reads are bounded: ``N`` is checked against the real file size (and a 100 MB cap, as the
   reference reader does) before the header is read. The header is parsed by
   :func:`parse_json` (strict UTF-8, nesting depth at most ``JSON_MAX_DEPTH``, a bounded number
   of containers, no NaN/Infinity, no key given twice), so no header reaches ``json.loads``'
   recursion or blows up into millions of objects.
3. As the safetensors reference reader validates: ``dtype`` is a known code, ``shape`` passes
   :func:`check_shape`, ``data_offsets`` is two integers ``0 <= begin <= end <= len(data)`` and
   ``end - begin == prod(shape) * itemsize``; sorted by offset, the tensors cover the data area
   exactly: each begins where the previous one ends (no overlap, no hole) and the last one ends
   at the end of the file. Any violation is an :class:`mconv.errors.InputError` naming the
   file, the tensor and the byte offset.
4. Tensors are memory-mapped (one ``np.memmap`` of the file, a view per tensor): nothing is
   copied until a pass or a writer touches the values.
5. ``save`` writes every initializer of any model (weight-only or not) with the official
   ``safetensors.numpy`` writer, atomically; ``__metadata__`` carries the model's string
   ``metadata_props`` (provenance).
"""

from __future__ import annotations

import json
import re
import stat
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, show
from mconv.fileio import atomic_path, check_shape, not_regular
from mconv.formats import Format

WEIGHT_ONLY_KEY = "mconv.weight_only"
# The reference reader's cap on the JSON header (safetensors' MAX_HEADER_SIZE).
SAFETENSORS_MAX_HEADER = 100_000_000
# A safetensors header nests three deep ({name: {"shape": [...]}}); anything past this is hostile.
JSON_MAX_DEPTH = 64
# The smallest real tensor entry ('"a":{"dtype":"U8","shape":[],"data_offsets":[0,0]},') spends
# 16 bytes per container; a header with a container per few bytes ('[{},{},...]') is a bomb.
JSON_BYTES_PER_CONTAINER = 8
# numpy's limit on dimensions (NPY_MAXDIMS in numpy 2).
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
        check_name(tensor_name, path=path)
        if tensor_name in graph.initializers:
            raise InputError(
                f"tensor '{show(tensor_name)}' appears twice", path=path, hint="tensor names must be unique"
            )
        tensor = ir.Tensor(array, name=tensor_name)
        value = ir.Value(name=tensor_name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype))
        value.const_value = tensor
        graph.register_initializer(value)
    model = ir.Model(graph, ir_version=10, producer_name="mconv")
    model.metadata_props[WEIGHT_ONLY_KEY] = "1"
    return model


def check_name(name: str, *, path: str | None, where: str | None = None) -> None:
    """A tensor name must be encodable as UTF-8 (JSON escapes can spell lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"tensor name '{show(name)}' is not valid Unicode (a lone surrogate)",
            path=path,
            where=where,
            hint="rename the tensor",
        ) from None


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


# --- bounded JSON --------------------------------------------------------------------------------

_JSON_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class _JsonRefused(ValueError):
    pass


def _no_constant(name: str) -> object:
    raise _JsonRefused(f"{name} is not JSON")


def _unique_object(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _JsonRefused(f"key '{show(key)}' appears twice")
            seen.add(key)
    return out


def json_nesting(text: str) -> tuple[int, int]:
    """(deepest nesting, number of containers) of a JSON text, without parsing it.

    Escape pairs go first (``\\\\`` then ``\\"``, left to right as JSON reads them), so every
    remaining quote opens or closes a string; strings go next (a bracket inside one is text);
    the brackets left are summed into a running depth with numpy a chunk at a time. Linear in
    the text, no recursion, and it reads strings exactly where ``json.loads`` would."""
    bare = _JSON_STRING.sub("", text.replace("\\\\", "").replace('\\"', ""))
    brackets = bare.encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    codes = np.frombuffer(brackets, dtype=np.uint8)
    step = np.zeros(256, dtype=np.int64)
    step[[ord("["), ord("{")]] = 1
    step[[ord("]"), ord("}")]] = -1
    depth = deepest = opens = 0
    for i in range(0, codes.size, 1 << 20):
        run = step[codes[i : i + (1 << 20)]]
        levels = depth + np.cumsum(run)
        deepest = max(deepest, int(levels.max()))
        opens += int(np.count_nonzero(run > 0))
        depth = int(levels[-1])
    return deepest, opens


def parse_json(raw: bytes, *, path: str, where: str, what: str = "header", hint: str) -> object:
    """Rule 2: strict, bounded JSON. The text must be UTF-8, nest at most ``JSON_MAX_DEPTH``
    deep, hold at most one container per ``JSON_BYTES_PER_CONTAINER`` bytes, and use no NaN /
    Infinity and no key twice in an object; anything else is one InputError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{what} is not UTF-8 (byte {exc.start} of the {what})", path=path, where=where, hint=hint
        ) from None
    deepest, containers = json_nesting(text)
    if deepest > JSON_MAX_DEPTH:
        raise InputError(
            f"{what} nests {deepest} levels deep, more than {JSON_MAX_DEPTH}",
            path=path,
            where=where,
            hint=hint,
        )
    if containers > len(raw) // JSON_BYTES_PER_CONTAINER + 8:
        raise InputError(
            f"{what} holds {containers} JSON arrays/objects in {len(raw)} bytes, far more than "
            "tensor entries need",
            path=path,
            where=where,
            hint=hint,
        )
    try:
        return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, _JsonRefused, int digit limit
        raise InputError(
            f"{what} is not valid JSON ({show(str(exc), 100)})", path=path, where=where, hint=hint
        ) from None


# --- safetensors -------------------------------------------------------------------------------


def _st_dtype(code: object, name: str, path: Path, where: str) -> np.dtype:
    if isinstance(code, str) and code in _ST_DTYPES:
        return np.dtype(_ST_DTYPES[code])
    if isinstance(code, str) and code in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[code]))
    shown = f"'{show(code)}'" if isinstance(code, str) else f"{show(repr(code))} (not a string)"
    raise InputError(
        f"tensor '{show(name)}' has unsupported dtype {shown}",
        path=str(path),
        where=where,
        hint=f"supported: {', '.join([*_ST_DTYPES, *_ML_DTYPES])}",
    )


def _st_header(path: Path) -> tuple[dict, int, int]:
    """Rules 1-2: the parsed header object, the data area's start and its length."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open below
        raise not_regular(path, "safetensors file", st.st_mode)
    size = st.st_size
    if size < 8:
        raise InputError(
            f"file is {size} bytes, shorter than the 8-byte header length",
            path=str(path),
            where="byte offset 0",
            hint=_HINT_CORRUPT,
        )
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8:
            raise InputError(
                f"header length {header_len} runs past the end of the {size}-byte file",
                path=str(path),
                where="byte offset 0",
                hint=_HINT_CORRUPT,
            )
        if header_len > SAFETENSORS_MAX_HEADER:
            raise InputError(
                f"header length {header_len} exceeds the {SAFETENSORS_MAX_HEADER:,}-byte limit",
                path=str(path),
                where="byte offset 0",
                hint="safetensors readers refuse headers over 100 MB; re-save the file",
            )
        raw = f.read(header_len)
    if len(raw) != header_len:
        raise InputError(
            "file shrank while being read", path=str(path), where="byte offset 8", hint="read a stable copy"
        )
    if raw.lstrip(b" \t\r\n")[:1] != b"{":
        raise InputError(
            "header is not a JSON object (it must start with '{')",
            path=str(path),
            where="byte offset 8",
            hint=_HINT_CORRUPT,
        )
    header = parse_json(raw, path=str(path), where="byte offset 8", hint=_HINT_CORRUPT)
    if not isinstance(header, dict):
        raise InputError(
            "header is not a JSON object", path=str(path), where="byte offset 8", hint=_HINT_CORRUPT
        )
    return header, 8 + header_len, size - 8 - header_len


def _st_metadata(header: dict, path: Path) -> dict[str, str]:
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InputError(
            f"__metadata__ is a JSON {type(metadata).__name__}, not an object of strings",
            path=str(path),
            where="header entry '__metadata__' (byte offset 8)",
            hint="__metadata__ maps strings to strings; re-save the file",
        )
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise InputError(
                f"__metadata__ value of '{show(key)}' is a JSON {type(value).__name__}, not a string",
                path=str(path),
                where="header entry '__metadata__' (byte offset 8)",
                hint="__metadata__ maps strings to strings; re-save the file",
            )
    return metadata


def safetensors_layout(
    path: str | Path,
) -> tuple[list[tuple[int, int, str, np.dtype, tuple[int, ...]]], int, dict[str, str]]:
    """Rules 1-3 without touching the data: the tensors as ``(begin, end, name, dtype, shape)``
    sorted by offset (relative to the data area), the data area's absolute start, and
    ``__metadata__``. The streaming path (:mod:`mconv.drivers.weights_stream`) reads from it."""
    path = Path(path)
    header, data_start, data_len = _st_header(path)
    metadata = _st_metadata(header, path)
    specs = []
    for name, info in header.items():
        where = f"header entry '{show(name)}' (byte offset 8)"
        tensor = f"tensor '{show(name)}'"
        check_name(name, path=str(path), where=where)
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise InputError(
                f"{tensor} entry lacks dtype/shape/data_offsets",
                path=str(path),
                where=where,
                hint=_HINT_CORRUPT,
            )
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        dtype = _st_dtype(code, name, path, where)
        need = check_shape(
            shape, dtype.itemsize, what=tensor, path=str(path), where=where, hint=_HINT_CORRUPT
        )
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise InputError(
                f"{tensor} data_offsets {show(repr(offsets), 80)} are not two integers [begin, end]",
                path=str(path),
                where=where,
                hint=_HINT_CORRUPT,
            )
        begin, end = offsets
        if begin < 0 or end < 0 or begin > end:
            raise InputError(
                f"{tensor} data_offsets [{begin}, {end}] are negative or run backwards",
                path=str(path),
                where=where,
                hint=_HINT_CORRUPT,
            )
        if end > data_len:
            raise InputError(
                f"{tensor} data [{begin}, {end}) lies outside the {data_len}-byte data area",
                path=str(path),
                where=f"byte offset {data_start + min(begin, data_len)}",
                hint=_HINT_CORRUPT,
            )
        if end - begin != need:
            raise InputError(
                f"{tensor} holds {end - begin} bytes but shape {shape} of {code} needs {need}",
                path=str(path),
                where=f"byte offset {data_start + begin}",
                hint=_HINT_CORRUPT,
            )
        specs.append((begin, end, name, dtype, tuple(shape)))
    # Rule 3: sorted by offset, the tensors tile the data area exactly.
    specs.sort(key=lambda s: (s[0], s[1], s[2]))
    covered, last = 0, None
    for begin, end, name, _, _ in specs:
        if begin < covered:
            raise InputError(
                f"tensor '{show(name)}' data [{begin}, {end}) overlaps tensor '{show(last)}' (which ends at {covered})",
                path=str(path),
                where=f"byte offset {data_start + begin}",
                hint="every byte of the data area belongs to exactly one tensor; re-save the file",
            )
        if begin > covered:
            raise InputError(
                f"data area bytes [{covered}, {begin}) belong to no tensor (before tensor '{show(name)}')",
                path=str(path),
                where=f"byte offset {data_start + covered}",
                hint="every byte of the data area belongs to exactly one tensor; re-save the file",
            )
        covered, last = end, name
    if covered != data_len:
        raise InputError(
            f"data area bytes [{covered}, {data_len}) after the last tensor belong to no tensor",
            path=str(path),
            where=f"byte offset {data_start + covered}",
            hint="the file has trailing bytes or is truncated; re-save it",
        )
    return specs, data_start, metadata


def read_safetensors(path: str | Path) -> tuple[list[tuple[str, np.ndarray]], dict[str, str]]:
    """Tensors (memory-mapped, file order by offset) and ``__metadata__`` of a safetensors file."""
    path = Path(path)
    specs, data_start, metadata = safetensors_layout(path)
    data_len = path.stat().st_size - data_start
    blob = np.memmap(path, dtype=np.uint8, mode="r") if data_len > 0 else np.zeros(0, np.uint8)
    arrays = []
    for begin, end, name, dtype, shape in sorted(specs, key=lambda s: (s[0], s[2])):
        chunk = blob[data_start + begin : data_start + end]
        arrays.append((name, chunk.view(dtype).reshape(shape) if chunk.size else np.zeros(shape, dtype)))
    return arrays, metadata


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
