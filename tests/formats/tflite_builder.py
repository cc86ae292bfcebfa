"""A minimal TFLite flatbuffer writer for tests: no TensorFlow, only the tflite schema's builders."""

from __future__ import annotations

import flatbuffers
import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

OPCODE = {name: code for code, name in BUILTIN_OPCODE2NAME.items()}
# Ops whose kernels start at a version above 1 (version 1 was taken by a custom op).
_VERSIONS = {"BROADCAST_TO": 2}
_TYPES = {
    np.dtype(np.float32): 0,
    np.dtype(np.float16): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint8): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.bool_): 6,
    np.dtype(np.int16): 7,
    np.dtype(np.int8): 9,
}


class TflBuilder:
    """Collects tensors and ops, then writes a one-subgraph model with identifier ``TFL3``."""

    def __init__(self) -> None:
        self.tensors: list[dict] = []
        self.buffers: list[bytes] = [b""]
        self.ops: list[dict] = []
        self.codes: list[int | str] = []  # builtin codes, or "CUSTOM:<name>" for a custom op

    def tensor(
        self,
        name: str,
        shape,
        dtype=np.float32,
        data: np.ndarray | None = None,
        scale=None,
        zero_point=None,
        quantized_dimension: int = 0,
        variable: bool = False,
        sparsity: dict | None = None,
    ) -> int:
        buf = 0
        if data is not None:
            self.buffers.append(np.ascontiguousarray(data, dtype=dtype).tobytes())
            buf = len(self.buffers) - 1
        else:
            self.buffers.append(b"")
            buf = len(self.buffers) - 1
        self.tensors.append(
            dict(
                name=name,
                shape=list(shape),
                type=_TYPES[np.dtype(dtype)],
                buffer=buf,
                scale=scale,
                zero_point=zero_point,
                qdim=quantized_dimension,
                variable=variable,
                sparsity=sparsity,
            )
        )
        return len(self.tensors) - 1

    def const(self, name: str, data: np.ndarray, **kw) -> int:
        data = np.asarray(data)
        return self.tensor(name, data.shape, data.dtype, data, **kw)

    def op(
        self, code: str, inputs, outputs, options: str | None = None, custom: bytes = b"", **fields
    ) -> None:
        c: int | str = code if code.startswith("CUSTOM:") else OPCODE[code]
        if c not in self.codes:
            self.codes.append(c)
        self.ops.append(
            dict(
                code=self.codes.index(c),
                inputs=list(inputs),
                outputs=list(outputs),
                options=options,
                fields=fields,
                custom=custom,
            )
        )

    def build(self, inputs, outputs) -> bytes:
        b = flatbuffers.Builder(1024)

        def ivec(vals, start) -> int:
            start(b, len(vals))
            for v in reversed(list(vals)):
                b.PrependInt32(int(v))
            return b.EndVector()

        def tables(offs, start) -> int:
            start(b, len(offs))
            for o in reversed(offs):
                b.PrependUOffsetTRelative(o)
            return b.EndVector()

        buf_offs = []
        for data in self.buffers:
            vec = None
            if data:
                b.StartVector(1, len(data), 16)
                b.head = b.head - len(data)
                b.Bytes[b.head : b.head + len(data)] = data
                vec = b.EndVector()
            tflite.BufferStart(b)
            if vec is not None:
                tflite.BufferAddData(b, vec)
            buf_offs.append(tflite.BufferEnd(b))
        t_offs = []
        for t in self.tensors:
            name = b.CreateString(t["name"])
            shape = ivec(t["shape"], tflite.TensorStartShapeVector)
            q = None
            if t["scale"] is not None:
                scale = np.asarray(t["scale"], np.float32).reshape(-1)
                zp = np.asarray(
                    t["zero_point"] if t["zero_point"] is not None else np.zeros_like(scale), np.int64
                ).reshape(-1)
                tflite.QuantizationParametersStartScaleVector(b, scale.size)
                for v in reversed(scale):
                    b.PrependFloat32(float(v))
                sv = b.EndVector()
                tflite.QuantizationParametersStartZeroPointVector(b, zp.size)
                for v in reversed(zp):
                    b.PrependInt64(int(v))
                zv = b.EndVector()
                tflite.QuantizationParametersStart(b)
                tflite.QuantizationParametersAddScale(b, sv)
                tflite.QuantizationParametersAddZeroPoint(b, zv)
                tflite.QuantizationParametersAddQuantizedDimension(b, t["qdim"])
                q = tflite.QuantizationParametersEnd(b)
            sp = None
            if t.get("sparsity"):
                # {"order": [...], "block_map": [...], "dims": [("dense", n) | ("csr", segs, idx)]}
                spec = t["sparsity"]
                metas = []
                for d in spec["dims"]:
                    segs = idx = None
                    if d[0] == "csr":
                        segs = ivec(d[1], tflite.Int32VectorStartValuesVector)
                        tflite.Int32VectorStart(b)
                        tflite.Int32VectorAddValues(b, segs)
                        segs = tflite.Int32VectorEnd(b)
                        idx = ivec(d[2], tflite.Int32VectorStartValuesVector)
                        tflite.Int32VectorStart(b)
                        tflite.Int32VectorAddValues(b, idx)
                        idx = tflite.Int32VectorEnd(b)
                    tflite.DimensionMetadataStart(b)
                    tflite.DimensionMetadataAddFormat(b, 0 if d[0] == "dense" else 1)
                    if d[0] == "dense":
                        tflite.DimensionMetadataAddDenseSize(b, d[1])
                    else:
                        tflite.DimensionMetadataAddArraySegmentsType(b, 1)
                        tflite.DimensionMetadataAddArraySegments(b, segs)
                        tflite.DimensionMetadataAddArrayIndicesType(b, 1)
                        tflite.DimensionMetadataAddArrayIndices(b, idx)
                    metas.append(tflite.DimensionMetadataEnd(b))
                order = ivec(spec["order"], tflite.SparsityParametersStartTraversalOrderVector)
                bmap = ivec(spec.get("block_map", []), tflite.SparsityParametersStartBlockMapVector)
                mv = tables(metas, tflite.SparsityParametersStartDimMetadataVector)
                tflite.SparsityParametersStart(b)
                tflite.SparsityParametersAddTraversalOrder(b, order)
                tflite.SparsityParametersAddBlockMap(b, bmap)
                tflite.SparsityParametersAddDimMetadata(b, mv)
                sp = tflite.SparsityParametersEnd(b)
            tflite.TensorStart(b)
            if sp is not None:
                tflite.TensorAddSparsity(b, sp)
            tflite.TensorAddShape(b, shape)
            tflite.TensorAddType(b, t["type"])
            tflite.TensorAddBuffer(b, t["buffer"])
            tflite.TensorAddName(b, name)
            if q is not None:
                tflite.TensorAddQuantization(b, q)
            if t["variable"]:
                tflite.TensorAddIsVariable(b, True)
            t_offs.append(tflite.TensorEnd(b))
        op_offs = []
        for op in self.ops:
            ins = ivec(op["inputs"], tflite.OperatorStartInputsVector)
            outs = ivec(op["outputs"], tflite.OperatorStartOutputsVector)
            cust = None
            if op["custom"]:
                cust = b.CreateByteVector(op["custom"])
            inter = None  # set ops[k]["intermediates"] to write an op's intermediate tensors
            if op.get("intermediates"):
                inter = ivec(op["intermediates"], tflite.OperatorStartIntermediatesVector)
            opt = None
            if op["options"]:
                name = op["options"]
                fields = dict(op["fields"])
                for k, v in fields.items():  # vector fields (SqueezeDims) are built before the table
                    if isinstance(v, list | tuple):
                        fields[k] = ivec(v, getattr(tflite, f"{name}Start{k}Vector"))
                getattr(tflite, f"{name}Start")(b)
                for k, v in fields.items():
                    getattr(tflite, f"{name}Add{k}")(b, v)
                opt = getattr(tflite, f"{name}End")(b)
            tflite.OperatorStart(b)
            tflite.OperatorAddOpcodeIndex(b, op["code"])
            tflite.OperatorAddInputs(b, ins)
            tflite.OperatorAddOutputs(b, outs)
            if cust is not None:
                tflite.OperatorAddCustomOptions(b, cust)
            if inter is not None:
                tflite.OperatorAddIntermediates(b, inter)
            if opt is not None:
                tflite.OperatorAddBuiltinOptionsType(b, getattr(tflite.BuiltinOptions, op["options"]))
                tflite.OperatorAddBuiltinOptions(b, opt)
            op_offs.append(tflite.OperatorEnd(b))
        tv = tables(t_offs, tflite.SubGraphStartTensorsVector)
        ov = tables(op_offs, tflite.SubGraphStartOperatorsVector)
        iv = ivec(inputs, tflite.SubGraphStartInputsVector)
        outv = ivec(outputs, tflite.SubGraphStartOutputsVector)
        gname = b.CreateString("main")
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, tv)
        tflite.SubGraphAddOperators(b, ov)
        tflite.SubGraphAddInputs(b, iv)
        tflite.SubGraphAddOutputs(b, outv)
        tflite.SubGraphAddName(b, gname)
        g = tflite.SubGraphEnd(b)
        code_offs = []
        for c in self.codes:
            if isinstance(c, str):  # a custom op: builtin code CUSTOM (32) and its name
                cname = b.CreateString(c[len("CUSTOM:") :])
                tflite.OperatorCodeStart(b)
                tflite.OperatorCodeAddDeprecatedBuiltinCode(b, 32)
                tflite.OperatorCodeAddBuiltinCode(b, 32)
                tflite.OperatorCodeAddCustomCode(b, cname)
                tflite.OperatorCodeAddVersion(b, 1)
                code_offs.append(tflite.OperatorCodeEnd(b))
                continue
            tflite.OperatorCodeStart(b)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(c, 127))
            tflite.OperatorCodeAddBuiltinCode(b, c)
            tflite.OperatorCodeAddVersion(b, _VERSIONS.get(BUILTIN_OPCODE2NAME[c], 1))
            code_offs.append(tflite.OperatorCodeEnd(b))
        cv = tables(code_offs, tflite.ModelStartOperatorCodesVector)
        gv = tables([g], tflite.ModelStartSubgraphsVector)
        bv = tables(buf_offs, tflite.ModelStartBuffersVector)
        desc = b.CreateString("mconv test fixture")
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, cv)
        tflite.ModelAddSubgraphs(b, gv)
        tflite.ModelAddDescription(b, desc)
        tflite.ModelAddBuffers(b, bv)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())
