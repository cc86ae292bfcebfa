"""TFLite importer: a ``.tflite`` flatbuffer (float, int8/uint8 or int16x8 quantized) into the IR.

Parsed with the ``tflite`` package's generated flatbuffers classes; no TensorFlow, no interpreter.

Rules

1. Bounded parse. The file must carry the identifier ``TFL3`` at bytes 4..8. The whole model is
   read up front into plain Python records (:class:`TflTensor`, :class:`TflOp`), and every vector
   length, buffer offset and tensor size is checked against the file size before it is used; a
   truncated or corrupt file raises ``InputError`` naming the byte offset of the table being read.
   No tensor may hold more than ``MAX_ELEMENTS`` elements; a constant's bytes must match its shape.
1a. What the importer makes from a shape alone (a sparse constant's dense form, the zeros a
   variable tensor without data starts from) totals at most ``MADE_BASE`` plus ``MADE_FACTOR``
   times the file's size: a few bytes claiming a [2**15, 2**15] state are refused before anything
   is made.
1b. Sparse constants (``sparsity``: traversal order, block map, DENSE / SPARSE_CSR levels) are made
   dense when read, every segment and index checked against the shape first; DENSIFY folds. Each
   entry a level lists is a stored value or a segment's start, so a level listing more entries
   than the file has bytes is refused before it is listed.
2. Graph. Subgraph 0 is the model. Operators must come in execution order (as TFLite requires):
   a tensor read before any op writes it, written twice, or an index outside the tensor table is
   bad input. Each TFLite tensor becomes one ONNX value named after the tensor (duplicates get
   ``_<index>``), except a computed tensor inside the graph whose name is over 32 bytes: that
   one is ``t<index>`` (converters' fused ``a;b;c`` names can be most of a small model's graph;
   graph inputs, outputs and weights keep their names); the nodes of operator k are named
   ``op<k>``, ``op<k>/1``, ... (its index in the file: a name taken from the output tensor would
   repeat that name once more per node), and the values between them, which no TFLite tensor
   names, ``op<k>/t``, ``op<k>/t/1``, ...
2c. Helper constants (scales, zero points, axes, bounds the lowerings add; up to 1 KB) are one
   initializer per distinct value, shared by every node that reads it (also a small constant of
   the file read twice); constant tensors of the file keep their own names. A larger tensor
   read by several nodes (one kernel of several convolutions: basic-pitch's CQT) is one
   initializer too, not one copy per reader. Quantization
   parameters of tensor k are named ``t<k>/scale`` and ``t<k>/zero_point`` (k: its index).
3. Layout. Values keep TFLite's layout (NHWC): the graph's inputs and outputs are exactly the
   arrays TFLite takes and gives. Convolutions and pools run in NCHW between two Transposes;
   a value made by such a back-Transpose remembers its NCHW source, so the next conv reads that
   source directly and chains of convs carry no transpose pairs (unused Transposes are dropped).
4. Quantization. Constant tensors (weights, biases) are dequantized to float32 at import,
   ``(q - zero_point) * scale``, per tensor or per channel along ``quantized_dimension``; float16
   constants become float32. The graph computes in float. Quantized graph inputs/outputs keep
   their integer dtype (``options["io"] = "tflite"``, the default: a DequantizeLinear after each
   input, a QuantizeLinear before each output) or become float (``io = "float"``). With
   ``options["activations"] = "qdq"`` (the default; "fake-quant" is its older name) every per-tensor
   quantized activation gets a QuantizeLinear/DequantizeLinear pair, so rounding and clamping to the
   int8 range follow the interpreter, and quantized filters/biases are kept as their codes plus a
   DequantizeLinear; ``"float"`` leaves activations unrounded. QUANTIZE becomes such a pair
   (identity with ``"float"``), DEQUANTIZE an identity (a constant folds).
4b. Hybrid ops (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED with int8/uint8 weights and float
   activations): LiteRT quantizes the input to int8 on the fly, per row, and multiplies codes. With
   Q/DQ activations the import spells that quantization out (ReduceMin/ReduceMax or
   ReduceMax(Abs), scale, Round, Clip; then ``(codes - zp) * scale`` into the conv on the filter's
   codes), so it computes what LiteRT computes. ``options["hybrid"]`` says whose rows:
   ``"xnnpack"`` (the default: LiteRT's default interpreter; conv asymmetric per image, a 1x1
   stride-1 conv and a fully connected layer per pixel / row, asymmetric; depthwise as builtin) or
   ``"builtin"`` (LiteRT's kernels without delegates: conv per image, asymmetric when its filter
   scales differ per channel, else symmetric ``max|x| / 127``; fully connected per row, symmetric
   unless ``asymmetric_quantize_inputs``). ``activations=float`` keeps the exact float product.
5. Padding follows TF: SAME pads ``max((ceil(in/s)-1)*s + (k-1)*d + 1 - in, 0)`` split with the
   smaller half first; SAME average pooling divides by the valid (unpadded) window.
6. UNIDIRECTIONAL_SEQUENCE_LSTM: TFLite's gates i, f, c, o become ONNX LSTM's i, o, f, c (weights
   ``[4H, I]``, biases ``[Wb, Rb]``, peepholes i, o, f). Variable state tensors start at zero: the
   imported graph is stateless, one run is one fresh sequence (call ``reset_all_variables`` on the
   interpreter to compare). A cell clip, projection, CIFG or a RELU6 cell activation has no ONNX
   LSTM attribute, so such an LSTM is unrolled over its (static) time steps into MatMul/Sigmoid/
   Clip ops with TFLite's exact equations. Layer-norm LSTMs are unsupported.
6b. MediaPipe's custom ops follow their kernels (mediapipe/util/tflite/operations/*.cc):
   Convolution2DTransposeBias (options {padding, stride_w, stride_h}) is a ConvTranspose + bias;
   the face-mesh attention ops (version 2, FlexBuffers options): Landmarks2TransformMatrix builds
   its 4x4 matrix from the landmarks in ONNX ops, TransformLandmarks applies the matrix's first
   two rows, TransformTensorBilinear is a GridSample (align_corners) masked to the input's box.
7. Every op no rule maps (and other custom ops) is collected; one ``UnsupportedError`` names all of
   them as ``(first output tensor name, op type)``.
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from mconv.errors import InputError, UnsupportedError, show
from mconv.formats import Format
from mconv.irio import from_proto
from onnx import TensorProto, helper

OPSET = 21
# options["activations"]: quantized activations rounded by QuantizeLinear/DequantizeLinear pairs
# ("qdq", the default; "fake-quant" is its older name) or left in float.
ACTIVATION_MODES = {"qdq": True, "fake-quant": True, "float": False}
# options["hybrid"]: whose on-the-fly input quantization a hybrid op (int8 weights, float
# activations) follows (rule 4b): the XNNPACK delegate of LiteRT's default interpreter, or LiteRT's
# builtin kernels (an interpreter without default delegates).
HYBRID_MODES = ("xnnpack", "builtin")
IR_VERSION = 10
IDENTIFIER = b"TFL3"
MAX_ELEMENTS = 1 << 31
MAX_RANK = 8
MAX_UNROLL_STEPS = 512
# Rule 1a: bytes made from shapes alone, in all: a base plus this many times the file's size.
MADE_BASE = 64 << 20
MADE_FACTOR = 64
# Low-level exceptions the generated flatbuffers readers raise on corrupt bytes.
_PARSE_ERRORS = (
    struct.error,
    IndexError,
    ValueError,
    TypeError,
    OverflowError,
    UnicodeDecodeError,
    AttributeError,
    RecursionError,
    MemoryError,
)

# tflite TensorType -> (numpy dtype, ONNX dtype); None where the type carries no numbers we read.
_DTYPES: dict[int, tuple[np.dtype, int]] = {
    0: (np.dtype(np.float32), TensorProto.FLOAT),
    1: (np.dtype(np.float16), TensorProto.FLOAT16),
    2: (np.dtype(np.int32), TensorProto.INT32),
    3: (np.dtype(np.uint8), TensorProto.UINT8),
    4: (np.dtype(np.int64), TensorProto.INT64),
    6: (np.dtype(np.bool_), TensorProto.BOOL),
    7: (np.dtype(np.int16), TensorProto.INT16),
    9: (np.dtype(np.int8), TensorProto.INT8),
    10: (np.dtype(np.float64), TensorProto.DOUBLE),
    12: (np.dtype(np.uint64), TensorProto.UINT64),
    15: (np.dtype(np.uint32), TensorProto.UINT32),
    16: (np.dtype(np.uint16), TensorProto.UINT16),
}
_LONG_NAME = 32  # bytes; a computed tensor with a longer name is named t<index> (rule 2)
_SHARED_INIT_BYTES = 1024  # helper constants up to this size are shared by value (rule 2c)
_QUANT_TYPES = {3, 7, 9}  # uint8, int16, int8 activations

# Fused activation functions (tflite.ActivationFunctionType).
ACT_NONE, ACT_RELU, ACT_RELU_N1_TO_1, ACT_RELU6, ACT_TANH, ACT_SIGN_BIT = range(6)
SAME, VALID = 0, 1


# ------------------------------------------------------------------------------------- records


@dataclass
class TflTensor:
    index: int
    name: str
    type: int
    shape: tuple[int, ...]
    signature: tuple[int, ...] | None
    data: np.ndarray | None  # typed, shaped constant data; None for activations
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    quantized_dimension: int = 0
    variable: bool = False
    sparse: bool = False

    @property
    def quantized(self) -> bool:
        return self.scale is not None and self.scale.size > 0

    def quant(self) -> tuple[np.ndarray, np.ndarray]:
        """(scale, zero_point) of a quantized tensor (the reader sets both or neither)."""
        assert self.scale is not None and self.zero_point is not None, "not a quantized tensor"
        return self.scale, self.zero_point


@dataclass
class TflOp:
    index: int
    code: str  # BUILTIN name, or "CUSTOM:<code>"
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict = field(default_factory=dict)
    custom: bytes = b""  # a custom op's custom_options bytes (read by its lowering, bounds checked)


@dataclass
class TflModel:
    version: int
    tensors: list[TflTensor]
    ops: list[TflOp]
    inputs: list[int]
    outputs: list[int]


# ------------------------------------------------------------------------------------- parsing


def sniff(head: bytes, path: Path) -> bool:
    return len(head) >= 8 and head[4:8] == IDENTIFIER


def _builtin_names() -> dict[int, str]:
    from tflite.utils import BUILTIN_OPCODE2NAME

    return dict(BUILTIN_OPCODE2NAME)


def _options_class_names() -> dict[int, str]:
    import tflite

    return {
        v: k for k, v in vars(tflite.BuiltinOptions).items() if isinstance(v, int) and not k.startswith("_")
    }


def _read_table_fields(obj) -> dict:
    """Every scalar getter and ``...AsNumpy`` vector of a generated options table, read now."""
    out: dict = {}
    for name, fn in inspect.getmembers(obj, predicate=inspect.ismethod):
        if name.startswith(("GetRootAs", "Init", "_")) or name.endswith(
            ("IsNone", "Length", "HasIdentifier")
        ):
            continue
        if len(inspect.signature(fn).parameters) != 0:
            continue
        value = fn()
        if name.endswith("AsNumpy"):
            value = np.array(value).copy() if not isinstance(value, int) else np.zeros(0, np.int32)
            name = name[: -len("AsNumpy")]
        elif not isinstance(value, int | float | bool | bytes | type(None)):
            continue  # nested tables: not used by any op mapped here
        out[name] = value
    return out


class _Reader:
    """Reads the flatbuffer into :class:`TflModel`, checking every length against the file size."""

    def __init__(self, buf: bytes, path: str) -> None:
        self.buf, self.path, self.size = buf, path, len(buf)
        self.where = "byte offset 0"
        self.made = 0  # rule 1a: bytes the import will make from shapes alone

    def make(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` that the import makes from a shape alone (rule 1a), or refuse."""
        self.made += nbytes
        limit = MADE_BASE + MADE_FACTOR * self.size
        if self.made > limit:
            raise self.fail(
                f"{what} would make {nbytes} bytes from its shape alone, more than a "
                f"{self.size}-byte file can describe (limit {limit} in all)",
                hint="the file is damaged or its shapes are forged",
            )

    def fail(self, msg: str, hint: str = "the file is truncated or damaged") -> InputError:
        return InputError(msg, path=self.path, where=self.where, hint=hint)

    def length(self, n: int, unit: int, what: str) -> int:
        if n < 0 or n * unit > self.size:
            raise self.fail(f"{what} claims {n} entries, more than the file's {self.size} bytes can hold")
        return n

    def at(self, table, what: str) -> None:
        self.where = f"{what} at byte offset {table._tab.Pos}"

    def read(self) -> TflModel:
        import tflite

        buf = self.buf
        if self.size < 8:
            raise self.fail(f"file of {self.size} bytes is too short for a TFLite flatbuffer")
        if buf[4:8] != IDENTIFIER:
            self.where = "byte offset 4"
            raise self.fail(
                f"file identifier is {bytes(buf[4:8])!r}, expected b'TFL3'",
                hint="this is not a TFLite model (.tflite)",
            )
        root = struct.unpack_from("<I", buf, 0)[0]
        if root + 4 > self.size:
            raise self.fail(f"root table offset {root} lies beyond the end of the file ({self.size} bytes)")
        model = tflite.Model.GetRootAsModel(buf, 0)
        self.at(model, "model")
        version = model.Version()
        builtin = _builtin_names()
        codes = []
        for i in range(self.length(model.OperatorCodesLength(), 4, "operator_codes")):
            oc = model.OperatorCodes(i)
            self.at(oc, f"operator code {i}")
            code = max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode()))
            if code == 32:  # CUSTOM
                custom = oc.CustomCode()
                # Escaped and bounded now; lowerings of known custom ops (MediaPipe's) are keyed by
                # this form, which is the code itself for a plain short name.
                codes.append("CUSTOM:" + (show(custom) if custom else "?"))
            else:
                codes.append(builtin.get(code, f"BUILTIN_{code}"))
        nbuf = self.length(model.BuffersLength(), 4, "buffers")
        if self.length(model.SubgraphsLength(), 4, "subgraphs") < 1:
            raise self.fail("the model has no subgraph")
        g = model.Subgraphs(0)
        self.at(g, "subgraph 0")
        tensors = [
            self._tensor(model, g, i, nbuf) for i in range(self.length(g.TensorsLength(), 4, "tensors"))
        ]
        n = len(tensors)
        inputs = self._indices(g.InputsAsNumpy() if g.InputsLength() else [], n, "subgraph inputs")
        outputs = self._indices(g.OutputsAsNumpy() if g.OutputsLength() else [], n, "subgraph outputs")
        opt_names = _options_class_names()
        ops = []
        for i in range(self.length(g.OperatorsLength(), 4, "operators")):
            op = g.Operators(i)
            self.at(op, f"operator {i}")
            ci = op.OpcodeIndex()
            if not 0 <= ci < len(codes):
                raise self.fail(f"operator {i} uses opcode index {ci}, the model has {len(codes)} codes")
            ins = self._indices(
                op.InputsAsNumpy() if op.InputsLength() else [], n, f"operator {i} inputs", True
            )
            outs = self._indices(
                op.OutputsAsNumpy() if op.OutputsLength() else [], n, f"operator {i} outputs"
            )
            options: dict = {}
            otype = op.BuiltinOptionsType()
            table = op.BuiltinOptions() if otype else None
            if table is not None and otype in opt_names:
                cls = getattr(tflite, opt_names[otype], None)
                if isinstance(cls, type):
                    obj = cls()
                    obj.Init(table.Bytes, table.Pos)
                    options = _read_table_fields(obj)
            custom_opts = b""
            if codes[ci].startswith("CUSTOM:") and op.CustomOptionsLength():
                n_custom = self.length(op.CustomOptionsLength(), 1, f"operator {i} custom_options")
                custom_opts = op.CustomOptionsAsNumpy()[:n_custom].tobytes()
            ops.append(TflOp(i, codes[ci], tuple(ins), tuple(outs), options, custom_opts))
        return TflModel(version, tensors, ops, list(inputs), list(outputs))

    def _densify(self, sp, vals: np.ndarray, shape: tuple[int, ...], shown: str) -> np.ndarray:
        """TFLite's sparse format (SparsityParameters) to a dense array: the traversal order walks
        the tensor's dimensions and then its block dimensions; a DENSE level has ``dense_size``
        entries, a SPARSE_CSR level the entries ``array_indices[segments[p]:segments[p+1]]``.
        Every segment, index and the number of values is checked before it is used."""
        rank = len(shape)
        order = (
            [int(v) for v in sp.TraversalOrderAsNumpy()] if sp.TraversalOrderLength() else list(range(rank))
        )
        block_map = [int(v) for v in sp.BlockMapAsNumpy()] if sp.BlockMapLength() else []
        nd = rank + len(block_map)
        if (
            sorted(order) != list(range(nd))
            or sp.DimMetadataLength() != nd
            or any(not 0 <= d < rank for d in block_map)
        ):
            raise self.fail(
                f"sparse tensor '{shown}' has a traversal order or block map that does not fit "
                f"its rank {rank}"
            )
        metas = [sp.DimMetadata(k) for k in range(nd)]
        # Extent of every traversal dimension: a blocked dimension d is (outer, block) with
        # outer * block == shape[d].
        block_size = {}
        for k, d in enumerate(block_map):
            level = order.index(rank + k)
            if metas[level].Format() != 0:
                raise self.fail(f"sparse tensor '{shown}' has a sparse block dimension")
            block_size[d] = int(metas[level].DenseSize())
            if block_size[d] < 1 or shape[d] % block_size[d]:
                raise self.fail(f"sparse tensor '{shown}' has block {block_size[d]} for dimension {shape[d]}")
        extent = [shape[d] // block_size.get(d, 1) for d in range(rank)]
        extent += [block_size[d] for d in block_map]
        # Walk level by level, keeping (position in the level's arrays, coordinates) for each entry.
        pos = np.zeros(1, np.int64)
        coords = np.zeros((1, nd), np.int64)
        for level, dim in enumerate(order):
            dm = metas[level]
            if dm.Format() == 0:  # DENSE
                size = int(dm.DenseSize())
                if size != extent[dim]:
                    raise self.fail(
                        f"sparse tensor '{shown}' level {level} has dense size {size}, expected {extent[dim]}"
                    )
                # Every entry a level lists is either a stored value or the start of a segment
                # the file stores: a walk longer than the file is forged.
                if pos.size * size > self.size:
                    raise self.fail(
                        f"sparse tensor '{shown}' level {level} lists {pos.size * size} entries, more "
                        f"than the file's {self.size} bytes can address"
                    )
                pos = (pos[:, None] * size + np.arange(size)[None]).reshape(-1)
                coords = np.repeat(coords, size, axis=0)
                coords[:, dim] = np.tile(np.arange(size), coords.shape[0] // max(size, 1))
            else:  # SPARSE_CSR
                seg, idx = _index_vector(dm, "segments"), _index_vector(dm, "indices")
                if seg is None or idx is None or seg.size < 1:
                    raise self.fail(f"sparse tensor '{shown}' level {level} lacks its segments or indices")
                if (
                    seg[0] != 0
                    or (np.diff(seg) < 0).any()
                    or seg[-1] > idx.size
                    or seg.size != pos.size + 1
                    or (idx < 0).any()
                    or (idx >= extent[dim]).any()
                ):
                    raise self.fail(
                        f"sparse tensor '{shown}' level {level} has segments or indices out of range"
                    )
                counts = np.diff(seg)[pos] if pos.size else np.zeros(0, np.int64)
                starts = seg[pos]
                new_pos = (
                    np.concatenate([np.arange(a, a + n) for a, n in zip(starts, counts, strict=True)])
                    if pos.size
                    else pos
                )
                coords = np.repeat(coords, counts, axis=0)
                coords[:, dim] = idx[new_pos.astype(np.int64)] if new_pos.size else 0
                pos = new_pos.astype(np.int64)
        if pos.size != vals.size or (pos.size and (pos.max() >= vals.size or pos.min() < 0)):
            raise self.fail(
                f"sparse tensor '{shown}' holds {vals.size} values, its sparsity addresses {pos.size}"
            )
        full = coords[:, :rank].copy()
        for k, d in enumerate(block_map):
            full[:, d] = full[:, d] * block_size[d] + coords[:, rank + k]
        dense = np.zeros(shape, dtype=vals.dtype)
        if pos.size:
            dense[tuple(full.T)] = vals[pos]
        return dense

    def _indices(self, arr, n: int, what: str, optional: bool = False) -> list[int]:
        vals = [int(v) for v in np.asarray(arr).reshape(-1)]
        self.length(len(vals), 4, what)
        for v in vals:
            if not (0 <= v < n or (optional and v == -1)):
                raise self.fail(
                    f"{what} refer to tensor {v}, the subgraph has {n} tensors",
                    hint="the file is damaged (tensor index out of range)",
                )
        return vals

    def _tensor(self, model, g, i: int, nbuf: int) -> TflTensor:
        t = g.Tensors(i)
        self.at(t, f"tensor {i}")
        raw = t.Name()
        name = raw.decode("utf-8", "replace") if raw else f"tensor_{i}"
        shown = show(name)  # the name as messages quote it: escaped, at most 60 characters
        ttype = int(t.Type())
        shape = tuple(int(d) for d in (t.ShapeAsNumpy() if t.ShapeLength() else []))
        sig = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else None
        if len(shape) > MAX_RANK or any(d < 0 for d in shape):
            raise self.fail(f"tensor '{shown}' has absurd shape {list(shape)[:12]}")
        if sig is not None and (len(sig) != len(shape) or any(d < -1 for d in sig)):
            raise self.fail(
                f"tensor '{shown}' has shape signature {list(sig)[:12]} that does not fit its shape"
            )
        count = int(np.prod(shape, dtype=np.float64)) if shape else 1
        if count > MAX_ELEMENTS:
            raise self.fail(
                f"tensor '{shown}' shape {list(shape)} holds {count} elements (limit {MAX_ELEMENTS})"
            )
        scale = zp = None
        qdim = 0
        q = t.Quantization()
        if q is not None:
            if q.ScaleLength():
                scale = np.array(q.ScaleAsNumpy(), dtype=np.float32)
                zp = (
                    np.array(q.ZeroPointAsNumpy(), dtype=np.int64)
                    if q.ZeroPointLength()
                    else np.zeros(scale.shape, np.int64)
                )
                qdim = int(q.QuantizedDimension())
                if zp.size not in (1, scale.size):
                    raise self.fail(f"tensor '{shown}' has {scale.size} scales but {zp.size} zero points")
                if scale.size > 1 and len(shape) == 1 and shape[0] == scale.size:
                    qdim = 0  # converters copy a filter's quantized_dimension onto its 1-D bias
                if scale.size > 1 and not (0 <= qdim < len(shape) and shape[qdim] == scale.size):
                    raise self.fail(
                        f"tensor '{shown}' has {scale.size} scales along dimension {qdim} "
                        f"of shape {list(shape)}"
                    )
                if not np.all(np.isfinite(scale)):
                    raise self.fail(f"tensor '{shown}' has a non-finite quantization scale")
        b = int(t.Buffer())
        if not 0 <= b < max(nbuf, 1):
            raise self.fail(f"tensor '{shown}' refers to buffer {b}, the model has {nbuf}")
        data = None
        if b > 0 and nbuf:
            bb = model.Buffers(b)
            self.at(bb, f"buffer {b} of tensor '{shown}'")
            off, size = int(bb.Offset()), int(bb.Size())
            if off > 1:  # large models: data lies outside the flatbuffer, at an absolute offset
                if off + size > self.size:
                    raise self.fail(
                        f"buffer {b} [{off}, {off + size}) lies beyond the end of the file "
                        f"({self.size} bytes)"
                    )
                raw_bytes = np.frombuffer(self.buf, dtype=np.uint8, count=size, offset=off)
            elif bb.DataLength():
                self.length(bb.DataLength(), 1, f"buffer {b}")
                raw_bytes = bb.DataAsNumpy()
            else:
                raw_bytes = None
            if raw_bytes is not None and raw_bytes.size:
                dt = _DTYPES.get(ttype)
                if dt is None:
                    raise InputError(
                        f"constant tensor '{shown}' has type {ttype}, which mconv cannot read",
                        path=self.path,
                        where=self.where,
                        hint="unsupported tensor type",
                    )
                itemsize = dt[0].itemsize
                sp = t.Sparsity()
                if sp is not None:  # stored compressed (rule 1b): densified, every index checked
                    if raw_bytes.size % itemsize:
                        raise self.fail(
                            f"sparse tensor '{shown}' has {raw_bytes.size} bytes of {itemsize}-byte values"
                        )
                    vals = np.frombuffer(raw_bytes.tobytes(), dtype=dt[0].newbyteorder("<")).astype(dt[0])
                    self.where = f"sparsity of tensor '{shown}'"
                    self.make(count * itemsize, f"sparse tensor '{shown}' of shape {list(shape)}")
                    data = self._densify(sp, vals, shape, shown)
                    return TflTensor(i, name, ttype, shape, sig, data, scale, zp, qdim, bool(t.IsVariable()))
                if raw_bytes.size != count * itemsize:
                    self.where = f"buffer {b} of tensor '{shown}'"
                    raise self.fail(
                        f"tensor '{shown}' shape {list(shape)} needs {count * itemsize} bytes, "
                        f"its buffer holds {raw_bytes.size}"
                    )
                data = np.frombuffer(raw_bytes.tobytes(), dtype=dt[0].newbyteorder("<")).astype(dt[0])
                data = data.reshape(shape)
        if data is None and t.IsVariable():  # starts at zero, made by the import (rule 1a)
            dt = _DTYPES.get(ttype)
            itemsize = max(dt[0].itemsize if dt else 4, 4)
            self.make(count * itemsize, f"variable tensor '{shown}' of shape {list(shape)}")
        return TflTensor(
            i, name, ttype, shape, sig, data, scale, zp, qdim, bool(t.IsVariable()), t.Sparsity() is not None
        )


def _index_vector(dm, kind: str) -> np.ndarray | None:
    """A DimensionMetadata's array_segments / array_indices union (Int32, Uint16 or Uint8 vector)."""
    import tflite

    vtype = dm.ArraySegmentsType() if kind == "segments" else dm.ArrayIndicesType()
    table = dm.ArraySegments() if kind == "segments" else dm.ArrayIndices()
    cls = {1: tflite.Int32Vector, 2: tflite.Uint16Vector, 3: tflite.Uint8Vector}.get(int(vtype))
    if cls is None or table is None:
        return None
    v = cls()
    v.Init(table.Bytes, table.Pos)
    return np.array(v.ValuesAsNumpy() if v.ValuesLength() else [], dtype=np.int64).reshape(-1)


def read_tflite(data: bytes, path: str = "<bytes>") -> TflModel:
    """Parse a TFLite flatbuffer into plain records. Corrupt bytes raise ``InputError``."""
    reader = _Reader(data, path)
    try:
        return reader.read()
    except InputError:
        raise
    except _PARSE_ERRORS as exc:
        raise reader.fail(f"corrupt flatbuffer ({type(exc).__name__}: {show(exc, 80)})") from None


# ------------------------------------------------------------------------------------- helpers


def dequantize(t: TflTensor) -> np.ndarray:
    """A constant's real values as float32: ``(q - zero_point) * scale`` (per tensor or channel)."""
    assert t.data is not None
    if t.type == 0:
        return t.data
    if t.type in (1, 10):
        return t.data.astype(np.float32)
    if not t.quantized:
        return t.data
    t_scale, t_zp = t.quant()
    scale, zp = t_scale.astype(np.float64), t_zp.astype(np.float64)
    if t_scale.size > 1:
        bshape = [1] * t.data.ndim
        bshape[t.quantized_dimension] = t_scale.size
        scale = scale.reshape(bshape)
        zp = zp.reshape(bshape) if zp.size > 1 else zp.reshape(())
    else:
        scale, zp = scale.reshape(()), zp.reshape(())
    return ((t.data.astype(np.float64) - zp) * scale).astype(np.float32)


def tf_same_pads(size: int, k: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF's SAME padding for one spatial dimension: (before, after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


_ACT_NAMES = {
    ACT_NONE: "NONE",
    ACT_RELU: "RELU",
    ACT_RELU_N1_TO_1: "RELU_N1_TO_1",
    ACT_RELU6: "RELU6",
    ACT_TANH: "TANH",
    ACT_SIGN_BIT: "SIGN_BIT",
}


class _Unsupported(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class _Missing(ValueError):
    """A required input slot holds -1 (reported as a malformed op)."""


# ------------------------------------------------------------------------------------- converter

Lowering = Callable[["_Converter", TflOp], None]
OPS: dict[str, Lowering] = {}


def lowering(*codes: str) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for c in codes:
            OPS[c] = fn
        return fn

    return deco


class _Converter:
    """Builds ONNX nodes for the ops of one :class:`TflModel` (see the module rules)."""

    def __init__(self, m: TflModel, path: str, options: dict) -> None:
        self.m, self.path = m, path
        self.io = options.get("io", "tflite")
        acts = options.get("activations", "qdq")
        if self.io not in ("tflite", "float"):
            raise InputError(
                f"option io='{show(self.io)}' is not one of tflite, float",
                path=path,
                hint="io=tflite or io=float",
            )
        if acts not in ACTIVATION_MODES:
            raise InputError(
                f"option activations='{show(acts)}' is not one of qdq, float",
                path=path,
                hint="activations=qdq (the default: Quantize/DequantizeLinear pairs) or activations=float",
            )
        self.fake_quant = ACTIVATION_MODES[acts]
        self.hybrid = options.get("hybrid", "xnnpack")
        if self.hybrid not in HYBRID_MODES:
            raise InputError(
                f"option hybrid='{show(self.hybrid)}' is not one of {', '.join(HYBRID_MODES)}",
                path=path,
                hint="hybrid=xnnpack (LiteRT's default interpreter) or hybrid=builtin (its own kernels)",
            )
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, TensorProto] = {}
        self.vals: dict[int, str] = {}  # tensor index -> ONNX name of its (float, NHWC) value
        self.nchw_src: dict[str, str] = {}  # NHWC value made by a back-Transpose -> its NCHW source
        self.used_names: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.node_names: set[str] = set()
        self.notes: list[str] = []
        self.node_base = ""
        self.node_tag = ""  # nodes and helper values of the op being lowered: "op<index>"
        self.node_count = 0
        # helper constants by content (dtype, shape, bytes) -> name: one initializer for all
        self.shared_inits: dict[tuple[str, tuple[int, ...], bytes], str] = {}
        # larger arrays made from one file tensor (a weight laid out for a convolution), by tensor
        # name, dtype and shape: a tensor read by several nodes is one initializer (rule 2c)
        self.derived_inits: dict[tuple[str, str, tuple[int, ...]], list[tuple[str, np.ndarray]]] = {}
        names: dict[str, int] = {}
        for t in m.tensors:
            names[t.name] = names.get(t.name, 0) + 1
        self.tname = {t.index: (t.name if names[t.name] == 1 else f"{t.name}_{t.index}") for t in m.tensors}
        # A computed tensor inside the graph with a long name (a converter's fused "a;b;c" names
        # run to a hundred bytes, repeated by every node that reads it) is named t<index>.
        io = set(m.inputs) | set(m.outputs)
        for t in m.tensors:
            short = f"t{t.index}"
            if (
                t.data is None
                and t.index not in io
                and len(self.tname[t.index].encode("utf-8")) > _LONG_NAME
                and short not in names
            ):
                self.tname[t.index] = short
        self.used_names.update(self.tname.values())
        # Names a weight may keep: constant tensors' names. A computed tensor's name is reserved for
        # its value (rule 2), so no initializer ever takes it (an op named 'x/Reshape' asks for
        # 'x/Reshape/shape', which may be another op's output tensor).
        self.tensor_names = {self.tname[t.index] for t in m.tensors if t.data is not None}
        self.poisoned: set[int] = set()  # outputs of unsupported ops (and of ops reading only those)
        self.folded: dict[int, np.ndarray] = {}  # computed tensors known at import (DEQUANTIZE of a constant)
        self.bound: set[str] = set()  # tensor names already given to an initializer

    # -- values --------------------------------------------------------------------------

    def T(self, i: int) -> TflTensor:
        if i < 0:  # an optional input left out (-1): never Python's "last tensor"
            raise _Missing("a required input is missing (tensor index -1)")
        return self.m.tensors[i]

    def has(self, op: TflOp, k: int) -> bool:
        """Whether optional input slot ``k`` of ``op`` is given (present and not -1)."""
        return len(op.inputs) > k and op.inputs[k] >= 0

    def shape(self, i: int) -> tuple[int, ...]:
        return self.T(i).shape

    def onnx_type(self, i: int) -> int:
        """The ONNX element type of tensor ``i``'s value (quantized and float16 tensors are float)."""
        t = self.T(i)
        if t.type in (0, 1) or (t.quantized and t.type in _QUANT_TYPES):
            return TensorProto.FLOAT
        dt = _DTYPES.get(t.type)
        if dt is None:
            raise _Unsupported(f"tensor '{show(t.name)}' of type {t.type}")
        return dt[1]

    def const_ints(self, i: int, what: str) -> np.ndarray:
        a = self.need_const(i, what)
        if a.dtype.kind not in "iub":
            raise _Unsupported(f"{what} of type {a.dtype}")
        return a.astype(np.int64)

    def fresh(self, base: str) -> str:
        """``base`` if free, else the first free ``base/1``, ``base/2``, ...; the search for each base
        resumes where it stopped, so N names from one base (an unrolled LSTM's steps, a shared
        constant's name) cost N probes in all, not N**2 / 2."""
        if base not in self.used_names:
            self.used_names.add(base)
            return base
        k = self.next_suffix.get(base, 1)
        name = f"{base}/{k}"
        while name in self.used_names:
            k += 1
            name = f"{base}/{k}"
        self.next_suffix[base] = k + 1
        self.used_names.add(name)
        return name

    def qname(self, i: int, what: str) -> str:
        """The name of a quantization parameter (``scale``, ``zero_point``) of tensor ``i``:
        ``t<i>/<what>``, short where the tensor's own name may be a hundred bytes (rule 2c)."""
        return f"t{i}/{what}"

    def const_array(self, i: int) -> np.ndarray | None:
        t = self.T(i)
        if t.data is not None:
            return dequantize(t)
        return self.folded.get(i)

    def qweight(self, i: int, fn: Callable[[np.ndarray], np.ndarray], qdim: int, axis: int) -> str | None:
        """With Q/DQ activations, a quantized constant (weights int8/uint8, biases int32) as its
        codes ``fn(q)`` plus a DequantizeLinear (per channel along ``axis`` of the transformed codes,
        which is dimension ``qdim`` of the TFLite tensor). A runtime that quantizes float weights
        itself (ONNX Runtime's QDQ weight transformer) then keeps TFLite's own codes and scales.
        None where the tensor is not such a constant (the caller dequantizes it at import)."""
        t = self.T(i)
        if not (self.fake_quant and t.data is not None and t.quantized and t.type in (2, 3, 9)):
            return None
        scale, zero = t.quant()
        per_channel = scale.size > 1
        if per_channel and t.quantized_dimension != qdim:
            return None
        codes = np.ascontiguousarray(fn(t.data))
        zp = np.broadcast_to(zero.reshape(-1), scale.shape).astype(t.data.dtype)
        base = self.tname[i]
        q = self.init(base, codes)
        if per_channel:
            s, z = self.init(self.qname(i, "scale"), scale), self.init(self.qname(i, "zero_point"), zp)
            return self.one("DequantizeLinear", [q, s, z], axis=axis)
        s = self.init(self.qname(i, "scale"), scale.reshape(()))
        z = self.init(self.qname(i, "zero_point"), zp.reshape(()))
        return self.one("DequantizeLinear", [q, s, z])

    def need_const(self, i: int, what: str) -> np.ndarray:
        a = self.const_array(i)
        if a is None:
            raise _Unsupported(f"{what} must be a constant tensor")
        return a

    def init(self, base: str, array: np.ndarray | np.generic) -> str:
        # A weight keeps its tensor's name when that name is still free for an initializer.
        tensor_name = base in self.tensor_names and base not in self.inits and base not in self.bound
        a = np.asarray(array)
        key = None
        if not tensor_name and a.nbytes <= _SHARED_INIT_BYTES:
            # a helper constant (a scale, a zero point, axes, a clip bound): one initializer per
            # distinct value, shared by every node that reads it (rule 2c)
            key = (a.dtype.str, a.shape, a.tobytes())
            if key in self.shared_inits:
                return self.shared_inits[key]
        derived = (base, a.dtype.str, a.shape)
        if key is None and a.nbytes > _SHARED_INIT_BYTES:
            for seen, prior in self.derived_inits.get(derived, []):
                if np.array_equal(prior, a):  # the same tensor laid out the same way again
                    return seen
        name = base if tensor_name else self.fresh(base)
        self.bound.add(name)
        self.inits[name] = onnx.numpy_helper.from_array(a, name)
        if a.nbytes > _SHARED_INIT_BYTES:
            self.derived_inits.setdefault(derived, []).append((name, a))
        if key is not None or a.nbytes <= _SHARED_INIT_BYTES:
            # a small constant of the file read again (a bias shared by two convolutions)
            self.shared_inits.setdefault(key or (a.dtype.str, a.shape, a.tobytes()), name)
        return name

    def value(self, i: int) -> str:
        """The ONNX name of tensor ``i``'s value (constants become initializers on first use)."""
        if i in self.vals:
            return self.vals[i]
        t = self.T(i)
        a = self.const_array(i)
        if a is None:
            if t.variable:  # variable tensors without data start at zero (real zero when quantized)
                ft = self.onnx_type(i) == TensorProto.FLOAT
                a = np.zeros(t.shape, np.float32 if ft else _DTYPES[t.type][0])
                self.notes.append(f"variable tensor '{show(t.name)}' starts at zero (the graph is stateless)")
            else:
                raise _Unsupported(f"tensor '{show(t.name)}' is read before it is computed")
        name = self.tname[i] if self.tname[i] not in self.bound else self.fresh(self.tname[i])
        self.bound.add(name)
        self.inits[name] = onnx.numpy_helper.from_array(np.asarray(a), name)
        self.vals[i] = name
        return name

    def emit(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, **attrs) -> list[str]:
        tag = self.node_tag or self.node_base
        outs = [self.fresh(f"{tag}/t") for _ in range(outputs)] if isinstance(outputs, int) else outputs
        name = tag if self.node_count == 0 else f"{tag}/{self.node_count}"
        while name in self.node_names:
            self.node_count += 1
            name = f"{tag}/{self.node_count}"
        self.node_count += 1
        self.node_names.add(name)
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs

    def one(self, op_type: str, inputs: list[str], **attrs) -> str:
        return self.emit(op_type, inputs, 1, **attrs)[0]

    def ints(self, base: str, vals) -> str:
        return self.init(f"{self.node_tag or self.node_base}/{base}", np.asarray(vals, dtype=np.int64))

    def to_nchw(self, i: int) -> str:
        v = self.value(i)
        if v in self.nchw_src:
            return self.nchw_src[v]
        return self.one("Transpose", [v], perm=[0, 3, 1, 2])

    def activation(self, x: str, act: int) -> str:
        if act == ACT_NONE:
            return x
        if act == ACT_RELU:
            return self.one("Relu", [x])
        if act in (ACT_RELU6, ACT_RELU_N1_TO_1):
            lo, hi = (0.0, 6.0) if act == ACT_RELU6 else (-1.0, 1.0)
            return self.one(
                "Clip", [x, self.init("clip_lo", np.float32(lo)), self.init("clip_hi", np.float32(hi))]
            )
        if act == ACT_TANH:
            return self.one("Tanh", [x])
        raise _Unsupported(f"fused activation {_ACT_NAMES.get(act, act)}")

    def qdq(self, x: str, t: TflTensor) -> str:
        """Round ``x`` to tensor ``t``'s quantization grid (per-tensor params only)."""
        if not (t.quantized and t.type in _QUANT_TYPES and t.quant()[0].size == 1):
            return x
        scale, zero = t.quant()
        s = self.init(self.qname(t.index, "scale"), scale.reshape(()).astype(np.float32))
        zp = zero.reshape(())
        # int8 grids are written as the same grid in uint8 (codes + 128): ONNX Runtime 1.32's QDQ
        # propagation fails on int8 pairs next to Reshape/Transpose ("output_dtype INT8 does not
        # match y_zero_point type UINT8").
        z = self.init(
            self.qname(t.index, "zero_point"),
            (zp + 128).astype(np.uint8) if t.type == 9 else zp.astype(_DTYPES[t.type][0]),
        )
        q = self.one("QuantizeLinear", [x, s, z])
        return self.one("DequantizeLinear", [q, s, z])

    def bind(self, i: int, x: str, act: int = ACT_NONE, nchw: bool = False, quantize: bool = True) -> None:
        """Tensor ``i`` is ``act(x)`` (rounded to its grid); ``nchw`` values are transposed back."""
        t = self.T(i)
        x = self.activation(x, act)
        if quantize and self.fake_quant:
            x = self.qdq(x, t)
        if nchw:
            src = x
            x = self.one("Transpose", [src], perm=[0, 2, 3, 1])
            self.nchw_src[x] = src
        self.vals[i] = x

    def opt(self, op: TflOp, key: str, default=0):
        return op.options.get(key, default)

    # -- graph ---------------------------------------------------------------------------

    def _value_info(self, i: int, onnx_type: int) -> onnx.ValueInfoProto:
        t = self.T(i)
        dims: list = list(t.shape)
        if t.signature is not None:
            dims = [
                ("N" if k == 0 else f"{self.tname[i]}_d{k}") if d == -1 else d
                for k, d in enumerate(t.signature)
            ]
        return helper.make_tensor_value_info(self.tname[i], onnx_type, dims)

    def convert(self) -> onnx.ModelProto:
        m = self.m
        graph_inputs = []
        for i in m.inputs:
            t = self.T(i)
            if t.data is not None:
                continue  # a constant listed as input stays a constant
            dt = _DTYPES.get(t.type)
            if dt is None:
                raise InputError(
                    f"input tensor '{show(t.name)}' has type {t.type}",
                    path=self.path,
                    where=f"tensor {i}",
                    hint="only numeric inputs are supported",
                )
            quant_in = t.quantized and t.type in _QUANT_TYPES
            if quant_in and self.io == "tflite":
                graph_inputs.append(self._value_info(i, dt[1]))
                self.node_base, self.node_tag = self.tname[i], f"input{i}"
                self.node_count = 0
                scale, zero = t.quant()
                s = self.init(self.qname(i, "scale"), scale.reshape(-1)[:1].reshape(()))
                # (x - zero_point) * scale spelled out: ONNX Runtime 1.32's QDQ propagation breaks on
                # a DequantizeLinear of a graph input that feeds a Transpose (int8 vs uint8 zero point).
                xf = self.one("Cast", [self.tname[i]], to=TensorProto.FLOAT)
                zf = self.init(
                    self.qname(i, "zero_point"), zero.reshape(-1)[:1].reshape(()).astype(np.float32)
                )
                self.vals[i] = self.emit(
                    "Mul", [self.one("Sub", [xf, zf]), s], [self.fresh(f"{self.tname[i]}/dequantized")]
                )[0]
            else:
                onnx_type = TensorProto.FLOAT if (quant_in or t.type == 1) else dt[1]
                graph_inputs.append(self._value_info(i, onnx_type))
                self.vals[i] = self.tname[i]
        written: set[int] = set(self.vals)
        unsupported: list[tuple[str, str]] = []
        for op in m.ops:
            label = show(self.tname[op.outputs[0]]) if op.outputs else f"op_{op.index}"
            for k in op.inputs:
                src = self.T(k) if k >= 0 else None
                if src is not None and src.data is None and not src.variable and k not in written:
                    raise InputError(
                        f"operator {op.index} ({op.code}) reads tensor '{show(src.name)}' before any "
                        "operator writes it",
                        path=self.path,
                        where=f"operator {op.index}",
                        hint="the graph has a cycle or a bad tensor index",
                    )
            for k in op.outputs:
                if k in written or self.T(k).data is not None:
                    raise InputError(
                        f"operator {op.index} ({op.code}) writes tensor '{show(self.T(k).name)}' "
                        "that is already defined",
                        path=self.path,
                        where=f"operator {op.index}",
                        hint="the graph has a cycle or a bad tensor index",
                    )
                written.add(k)
            fn = OPS.get(op.code)
            # An op downstream of an unsupported one is lowered as usual (it may be unsupported
            # itself, and is then named), but a refusal caused by a poisoned input (a shape or
            # constant that is not known because its producer was not lowered) is not reported.
            reads_poison = any(k in self.poisoned for k in op.inputs)
            if fn is None:
                unsupported.append((label, op.code))
                self._poison(op)
                continue
            if any(self.T(k).sparse for k in op.inputs if k >= 0):
                unsupported.append((label, f"{op.code} with sparse weights"))
                self._poison(op)
                continue
            self.node_base, self.node_tag, self.node_count = label, f"op{op.index}", 0
            mark = len(self.nodes)
            if not op.outputs or not op.inputs:
                raise InputError(
                    f"operator {op.index} ({op.code}) has no inputs or no outputs",
                    path=self.path,
                    where=f"operator {op.index}",
                    hint="the file is damaged",
                )
            try:
                fn(self, op)
                missing = [k for k in op.outputs if k not in self.vals]
                if missing:
                    raise _Unsupported(f"output '{show(self.T(missing[0]).name)}' is not produced")
                if reads_poison:  # computed from a placeholder: as unknown as its input
                    self.poisoned.update(op.outputs)
            except (IndexError, ValueError, KeyError, TypeError, ZeroDivisionError, OverflowError) as exc:
                if reads_poison:
                    del self.nodes[mark:]
                    self._poison(op)
                    continue
                # Tensors that do not fit the op (too few inputs, wrong ranks, bad sizes).
                raise InputError(
                    f"operator {op.index} ({op.code}) is malformed: {type(exc).__name__}: {show(exc, 100)}",
                    path=self.path,
                    where=f"operator {op.index}",
                    hint="the file is damaged or uses this op in a way mconv does not know",
                ) from None
            except _Unsupported as exc:
                del self.nodes[mark:]
                if not reads_poison:
                    unsupported.append((label, f"{op.code}: {show(exc.why, 200)}"))
                self._poison(op)
        if unsupported:
            raise UnsupportedError(
                unsupported,
                what="TFLite op",
                path=self.path,
                hint="these ops have no mapping to ONNX in mconv yet",
            )
        self._name_values_after_tensors()
        graph_outputs = []
        for i in m.outputs:
            t = self.T(i)
            v = self.value(i)
            dt = _DTYPES.get(t.type) or (np.dtype(np.float32), TensorProto.FLOAT)
            quant_out = t.quantized and t.type in _QUANT_TYPES
            self.node_base, self.node_tag, self.node_count = self.tname[i], f"output{i}", 0
            if quant_out and self.io == "tflite":
                scale, zero = t.quant()
                s = self.init(self.qname(i, "scale"), scale.reshape(-1)[:1].reshape(()))
                z = self.init(self.qname(i, "zero_point"), zero.reshape(-1)[:1].reshape(()).astype(dt[0]))
                self._rename_or_emit("QuantizeLinear", [v, s, z], self.tname[i])
                graph_outputs.append(self._value_info(i, dt[1]))
            else:
                onnx_type = TensorProto.FLOAT if (quant_out or t.type in (0, 1)) else dt[1]
                if v != self.tname[i]:
                    self._rename_or_emit("Identity", [v], self.tname[i])
                graph_outputs.append(self._value_info(i, onnx_type))
        nodes = _drop_dead(self.nodes, {o.name for o in graph_outputs})
        used = {x for n in nodes for x in n.input}
        inits = [t for n, t in self.inits.items() if n in used]
        graph = helper.make_graph(nodes, "main", graph_inputs, graph_outputs, initializer=inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="mconv",
            ir_version=IR_VERSION,
        )
        notes = list(dict.fromkeys(self.notes))
        if notes:
            helper.set_model_props(model, {"mconv.import_notes": "\n".join(notes)})
        return model

    def _poison(self, op: TflOp) -> None:
        """Outputs of an op that was not lowered: later readers get a placeholder name and go on
        (so that every unsupported op is named), and their own refusals are not reported."""
        for k in op.outputs:
            self.vals[k] = self.tname[k]
            self.poisoned.add(k)

    def _rename_or_emit(self, op_type: str, inputs: list[str], out: str) -> None:
        self.emit(op_type, inputs, [out])

    def _name_values_after_tensors(self) -> None:
        """Give each computed value its TFLite tensor's name (localization compares by name)."""
        fixed = set(self.m.inputs) | {t.index for t in self.m.tensors if t.data is not None}
        protected = {self.vals[i] for i in self.m.inputs if i in self.vals} | set(self.inits)
        outs = set(self.m.outputs)
        rename: dict[str, str] = {}
        for i, v in self.vals.items():
            if i in fixed or v == self.tname[i] or v in rename or v in protected:
                continue
            t = self.T(i)
            quant_out = i in outs and self.io == "tflite" and t.quantized and t.type in _QUANT_TYPES
            rename[v] = self.fresh(f"{self.tname[i]}/dequantized") if quant_out else self.tname[i]
        for n in self.nodes:
            for k, x in enumerate(n.input):
                if x in rename:
                    n.input[k] = rename[x]
            for k, x in enumerate(n.output):
                if x in rename:
                    n.output[k] = rename[x]
        self.vals = {i: rename.get(v, v) for i, v in self.vals.items()}


def _drop_dead(nodes: list[onnx.NodeProto], keep: set[str]) -> list[onnx.NodeProto]:
    """Drop nodes none of whose outputs is used (the back-Transposes that rule 3 made idle)."""
    live = set(keep)
    out = []
    for n in reversed(nodes):
        if any(o in live for o in n.output):
            out.append(n)
            live.update(x for x in n.input if x)
    return out[::-1]


# ------------------------------------------------------------------------------------- loading


def load_tflite_bytes(data: bytes, path: str = "<bytes>", options: dict | None = None) -> ir.Model:
    """Import TFLite flatbuffer bytes (see the module rules; ``options``: io, activations)."""
    model = read_tflite(data, path)
    proto = _Converter(model, path, dict(options or {})).convert()
    return from_proto(proto)


def load(paths: list[Path], options: dict) -> ir.Model:
    path = paths[0]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path=str(path), hint="check the path") from None
    return load_tflite_bytes(data, str(path), options)


FORMAT = Format(
    name="tflite",
    description="TensorFlow Lite flatbuffer (float, int8/uint8/int16 quantized)",
    extensions=(".tflite",),
    load=load,
    sniff=sniff,
)
