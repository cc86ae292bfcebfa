"""Weight codecs: how one tensor becomes bytes in ``weights.mcw`` and back, losslessly.

A tensor is stored with a *codec spec*: a JSON-able dict ``{"codec": NAME, ...params}``.
``encode(array, spec)`` returns the blob plus a *record* (JSON-able dict) that holds everything
``decode`` needs besides the blob: the codec name, its parameters, shape, dtype and a per-stream
byte account (``streams``: name -> bytes, e.g. ``{"values": 1234}``) used by size reports.

``decode(blob, record)`` returns an array bit-identical to what was encoded.

One module per codec; each registers a ``Codec`` in ``CODECS``. Portable C99 decoders for the
same records live beside them (``decoder.c``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mconv.errors import InputError


@dataclass
class Codec:
    name: str
    # encode(array, params) -> (blob, record-without-shape/dtype)
    encode: Callable[[np.ndarray, dict], tuple[bytes, dict]]
    # decode(blob, record) -> array (record includes "shape" and "dtype")
    decode: Callable[[memoryview, dict], np.ndarray]


CODECS: dict[str, Codec] = {}


def register(codec: Codec) -> Codec:
    CODECS[codec.name] = codec
    return codec


def encode(array: np.ndarray, spec: dict | None = None) -> tuple[bytes, dict]:
    spec = dict(spec or {"codec": "raw"})
    name = spec.pop("codec", "raw")
    if name not in CODECS:
        raise InputError(f"unknown weight codec '{name}'", hint=f"choose one of: {', '.join(sorted(CODECS))}")
    array = np.asarray(array)
    blob, record = CODECS[name].encode(array, spec)
    record = {"codec": name, **record, "shape": [int(d) for d in array.shape], "dtype": array.dtype.name}
    record.setdefault("streams", {"data": len(blob)})
    return blob, record


def decode(blob: bytes | memoryview, record: dict) -> np.ndarray:
    name = record.get("codec")
    if name not in CODECS:
        raise InputError(f"unknown weight codec '{name}' in container", hint="upgrade mconv")
    try:
        shape = [int(d) for d in record["shape"]]
        np.dtype(record["dtype"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{name} record lacks a valid shape/dtype", hint="the weights index is damaged"
        ) from exc
    if any(d < 0 for d in shape):
        raise InputError(
            f"{name} record has a negative dimension {shape}", hint="the weights index is damaged"
        )
    return CODECS[name].decode(memoryview(blob), {**record, "shape": shape})


def _expect_bytes(blob: memoryview, nbytes: int, codec: str) -> None:
    if len(blob) != nbytes:
        raise InputError(
            f"{codec} blob holds {len(blob)} bytes, its record needs {nbytes}",
            where=f"byte offset {min(len(blob), nbytes)}",
            hint="the weights file is damaged or was cut short; re-export it",
        )


def _raw_encode(array: np.ndarray, params: dict) -> tuple[bytes, dict]:
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes(), {}


def _raw_decode(blob: memoryview, record: dict) -> np.ndarray:
    dtype = np.dtype(record["dtype"]).newbyteorder("<")
    _expect_bytes(blob, int(np.prod(record["shape"], dtype=np.int64)) * dtype.itemsize, "raw")
    return np.frombuffer(blob, dtype=dtype).reshape(record["shape"]).astype(dtype.newbyteorder("="))


def _fp16_encode(array: np.ndarray, params: dict) -> tuple[bytes, dict]:
    """float32 values stored as float16. Lossless only for values that are fp16-representable."""
    half = array.astype("<f2")
    if not np.array_equal(half.astype(array.dtype), array, equal_nan=True):
        raise InputError("fp16 codec would change values", hint="round to fp16 first (the fp16 pass)")
    return half.tobytes(), {}


def _fp16_decode(blob: memoryview, record: dict) -> np.ndarray:
    _expect_bytes(blob, int(np.prod(record["shape"], dtype=np.int64)) * 2, "fp16")
    return np.frombuffer(blob, dtype="<f2").reshape(record["shape"]).astype(record["dtype"])


register(Codec("raw", _raw_encode, _raw_decode))
register(Codec("fp16", _fp16_encode, _fp16_decode))

# One line per codec module. A new codec is one new file plus one line here.
_MODULES: tuple[str, ...] = ("huffman", "palette", "sparse")

for _mod in _MODULES:
    importlib.import_module(f"{__name__}.{_mod}")

from mconv.codecs.choose import (  # noqa: E402  (needs the codecs above)
    COMPRESSION_KEY,
    best_spec,
    choose_spec,
    compression_hints,
    predict_bytes,
)

__all__ = [
    "CODECS",
    "COMPRESSION_KEY",
    "Codec",
    "best_spec",
    "choose_spec",
    "compression_hints",
    "decode",
    "encode",
    "predict_bytes",
    "register",
]
