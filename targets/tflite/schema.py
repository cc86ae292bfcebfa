"""A TFLite graph as plain records, and its serialization to the ``TFL3`` flatbuffer.

The records (:class:`Tensor`, :class:`Op`, :class:`Graph`) are what the lowering and the
quantizer edit; :func:`serialize` writes them with the ``flatbuffers`` builder and the schema
classes the ``tflite`` package generates from LiteRT's ``schema.fbs`` (the same classes
:mod:`mconv.formats.tflite` reads with). Rules:

1. Buffer 0 is the empty buffer (LiteRT's convention); each distinct constant byte string has one
   buffer, whose bytes start 16-byte aligned (LiteRT maps them in place). Constant tensors with
   equal bytes share it (a weight the lowering gave each consumer its own copy of, e.g. one kernel
   laid out for several convolutions, is stored once, as TensorFlow's converter does): constants
   are read-only in LiteRT, and a tensor's type, shape and quantization stay its own.
2. Options go in through the generated ``Add<Field>`` functions by name: an option the schema
   does not know is a programming error (``AttributeError``), not a silently dropped field.
3. Each opcode is written with ``builtin_code`` and ``deprecated_builtin_code`` (the latter
   ``min(code, 127)``, as LiteRT's reader takes the larger of the two).
4. The model's ``signature_defs`` name every input and output after the graph's values, so a
   LiteRT signature runner finds them under the ONNX names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import flatbuffers  # type: ignore[import-untyped]
import numpy as np
import tflite

SCHEMA_VERSION = 3
_DTYPES: dict[str, int] = {
    "float32": tflite.TensorType.FLOAT32,
    "float16": tflite.TensorType.FLOAT16,
    "int32": tflite.TensorType.INT32,
    "int64": tflite.TensorType.INT64,
    "int8": tflite.TensorType.INT8,
    "uint8": tflite.TensorType.UINT8,
    "int16": tflite.TensorType.INT16,
    "bool": tflite.TensorType.BOOL,
}


@dataclass
class Quant:
    """Affine quantization ``real = (q - zero_point) * scale``, per tensor or along ``axis``."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0


@dataclass
class Tensor:
    name: str
    shape: list[int]
    dtype: str  # a key of _DTYPES
    data: np.ndarray | None = None  # constants only
    quant: Quant | None = None


@dataclass
class Op:
    code: str  # a BuiltinOperator name, e.g. "CONV_2D"
    inputs: list[int]  # tensor indices (-1: an optional input left out)
    outputs: list[int]
    options_type: str | None = None  # a BuiltinOptions name, e.g. "Conv2DOptions"
    options: dict[str, Any] = field(default_factory=dict)  # schema field name -> value
    version: int = 1
    label: str = ""  # the ONNX node it came from (messages only)


@dataclass
class Graph:
    tensors: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def add(self, tensor: Tensor) -> int:
        self.tensors.append(tensor)
        return len(self.tensors) - 1

    def const(self, name: str, array: np.ndarray, quant: Quant | None = None) -> int:
        a = np.ascontiguousarray(array)
        return self.add(Tensor(name, list(a.shape), a.dtype.name, a, quant))

    def consumers(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for k, op in enumerate(self.ops):
            for t in op.inputs:
                if t >= 0:
                    out.setdefault(t, []).append(k)
        return out

    def producer(self) -> dict[int, int]:
        return {t: k for k, op in enumerate(self.ops) for t in op.outputs}


def _module(name: str) -> Any:
    return sys.modules[f"tflite.{name}"]


def _vector(b: flatbuffers.Builder, start: Any, values: list, kind: str) -> int:
    start(b, len(values))
    prepend = getattr(b, f"Prepend{kind}")
    for v in reversed(values):
        prepend(v)
    return b.EndVector()


def _bytes(b: flatbuffers.Builder, data: bytes) -> int:
    """A [ubyte] vector whose first byte is 16-byte aligned (rule 1)."""
    b.assertNotNested()
    b.nested = True
    b.Prep(16, len(data))
    b.head = b.head - len(data)
    b.Bytes[b.head : b.head + len(data)] = data
    b.vectorNumElems = len(data)
    return b.EndVector()


def _options(b: flatbuffers.Builder, kind: str, values: dict[str, Any]) -> int:
    mod = _module(kind)
    pre: dict[str, int] = {}
    for key, value in values.items():  # vectors first: flatbuffers builds no nested objects
        if isinstance(value, list | tuple):
            pre[key] = _vector(b, getattr(mod, f"Start{key}Vector"), list(value), "Int32")
    mod.Start(b)
    for key, value in values.items():
        add = getattr(mod, f"Add{key}")  # rule 2
        add(b, pre[key] if key in pre else value)
    return mod.End(b)


def _quant(b: flatbuffers.Builder, q: Quant) -> int:
    mod = _module("QuantizationParameters")
    scale = np.asarray(q.scale, np.float32).ravel().tolist()
    zp = np.asarray(q.zero_point, np.int64).ravel().tolist()
    s = _vector(b, mod.StartScaleVector, scale, "Float32")
    z = _vector(b, mod.StartZeroPointVector, zp, "Int64")
    mod.Start(b)
    mod.AddScale(b, s)
    mod.AddZeroPoint(b, z)
    mod.AddQuantizedDimension(b, int(q.axis))
    return mod.End(b)


def serialize(graph: Graph, description: str = "mconv") -> bytes:
    """The ``TFL3`` flatbuffer of ``graph``."""
    b = flatbuffers.Builder(1024)
    # buffers: 0 empty, then one per distinct constant byte string (rule 1)
    buffer_of: dict[int, int] = {}
    blobs: list[bytes] = [b""]
    index_of: dict[bytes, int] = {}
    for i, t in enumerate(graph.tensors):
        if t.data is not None:
            blob = np.ascontiguousarray(t.data).astype(t.data.dtype.newbyteorder("<")).tobytes()
            if blob not in index_of:
                index_of[blob] = len(blobs)
                blobs.append(blob)
            buffer_of[i] = index_of[blob]
    Buf = _module("Buffer")
    buffer_offsets = []
    for blob in blobs:
        data = _bytes(b, blob) if blob else None
        Buf.Start(b)
        if data is not None:
            Buf.AddData(b, data)
        buffer_offsets.append(Buf.End(b))
    # opcodes
    codes: list[tuple[str, int]] = []
    for op in graph.ops:
        if (op.code, op.version) not in codes:
            codes.append((op.code, op.version))
    OC = _module("OperatorCode")
    code_offsets = []
    for code, version in codes:
        value = getattr(tflite.BuiltinOperator, code)
        OC.Start(b)
        OC.AddDeprecatedBuiltinCode(b, min(value, 127))  # rule 3
        OC.AddBuiltinCode(b, value)
        OC.AddVersion(b, version)
        code_offsets.append(OC.End(b))
    # tensors
    T = _module("Tensor")
    tensor_offsets = []
    for i, t in enumerate(graph.tensors):
        name = b.CreateString(t.name)
        shape = _vector(b, T.StartShapeVector, [int(d) for d in t.shape], "Int32")
        quant = _quant(b, t.quant) if t.quant is not None else None
        T.Start(b)
        T.AddShape(b, shape)
        T.AddType(b, _DTYPES[t.dtype])
        T.AddBuffer(b, buffer_of.get(i, 0))
        T.AddName(b, name)
        if quant is not None:
            T.AddQuantization(b, quant)
        tensor_offsets.append(T.End(b))
    # operators
    O = _module("Operator")
    op_offsets = []
    for op in graph.ops:
        ins = _vector(b, O.StartInputsVector, op.inputs, "Int32")
        outs = _vector(b, O.StartOutputsVector, op.outputs, "Int32")
        opts = _options(b, op.options_type, op.options) if op.options_type else None
        O.Start(b)
        O.AddOpcodeIndex(b, codes.index((op.code, op.version)))
        O.AddInputs(b, ins)
        O.AddOutputs(b, outs)
        if opts is not None and op.options_type is not None:
            O.AddBuiltinOptionsType(b, getattr(tflite.BuiltinOptions, op.options_type))
            O.AddBuiltinOptions(b, opts)
        op_offsets.append(O.End(b))
    S = _module("SubGraph")
    tensors = _vector(b, S.StartTensorsVector, tensor_offsets, "UOffsetTRelative")
    inputs = _vector(b, S.StartInputsVector, graph.inputs, "Int32")
    outputs = _vector(b, S.StartOutputsVector, graph.outputs, "Int32")
    operators = _vector(b, S.StartOperatorsVector, op_offsets, "UOffsetTRelative")
    sg_name = b.CreateString("main")
    S.Start(b)
    S.AddTensors(b, tensors)
    S.AddInputs(b, inputs)
    S.AddOutputs(b, outputs)
    S.AddOperators(b, operators)
    S.AddName(b, sg_name)
    subgraph = S.End(b)
    signature = _signature(b, graph)
    M = _module("Model")
    subgraphs = _vector(b, M.StartSubgraphsVector, [subgraph], "UOffsetTRelative")
    opcodes = _vector(b, M.StartOperatorCodesVector, code_offsets, "UOffsetTRelative")
    buffers = _vector(b, M.StartBuffersVector, buffer_offsets, "UOffsetTRelative")
    sigs = _vector(b, M.StartSignatureDefsVector, [signature], "UOffsetTRelative")
    desc = b.CreateString(description)
    M.Start(b)
    M.AddVersion(b, SCHEMA_VERSION)
    M.AddOperatorCodes(b, opcodes)
    M.AddSubgraphs(b, subgraphs)
    M.AddDescription(b, desc)
    M.AddBuffers(b, buffers)
    M.AddSignatureDefs(b, sigs)
    b.Finish(M.End(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _signature(b: flatbuffers.Builder, graph: Graph) -> int:
    """Rule 4: the ``serving_default`` signature, every input and output by its value's name."""
    TM = _module("TensorMap")
    SD = _module("SignatureDef")

    def maps(indices: list[int]) -> list[int]:
        out = []
        for i in indices:
            name = b.CreateString(graph.tensors[i].name)
            TM.Start(b)
            TM.AddName(b, name)
            TM.AddTensorIndex(b, i)
            out.append(TM.End(b))
        return out

    ins = _vector(b, SD.StartInputsVector, maps(graph.inputs), "UOffsetTRelative")
    outs = _vector(b, SD.StartOutputsVector, maps(graph.outputs), "UOffsetTRelative")
    key = b.CreateString("serving_default")
    SD.Start(b)
    SD.AddInputs(b, ins)
    SD.AddOutputs(b, outs)
    SD.AddSignatureKey(b, key)
    SD.AddSubgraphIndex(b, 0)
    return SD.End(b)
