"""Helpers of the LiteRT tests: a written ``.tflite`` file's ops read with the ``tflite`` package
(not mconv's writer), and a model quantized by ONNX Runtime's ``quantize_static`` (the peer's QDQ
and QOperator files mconv reads). Import with ``tests/`` on ``sys.path`` (``from _tflite_help
import file_ops``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def file_ops(data: bytes) -> list[tuple[str, int, list[str]]]:
    """(op name, version, input tensor dtypes) of every op of the first subgraph."""
    import tflite

    m = tflite.Model.GetRootAsModel(data, 0)
    sg = m.Subgraphs(0)
    code_names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if isinstance(v, int)}
    type_names = {v: k for k, v in vars(tflite.TensorType).items() if isinstance(v, int)}
    out = []
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        oc = m.OperatorCodes(op.OpcodeIndex())
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        types = [type_names[sg.Tensors(j).Type()] for j in op.InputsAsNumpy() if j >= 0]
        out.append((code_names[code], oc.Version(), types))
    return out


def ort_quantized(
    model: Any, digits: np.ndarray, d: Path, quant_format: Any, qtype: Any, per_channel: bool = False
) -> Path:
    """``model`` through ONNX Runtime's quantize_static, calibrated on ``digits`` one at a time
    (input ``data``): the path of its ``q.onnx`` in ``d``."""
    from mconv.irio import to_proto
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    (d / "f.onnx").write_bytes(to_proto(model).SerializeToString())

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"data": digits[i : i + 1]} for i in range(len(digits))])

        def get_next(self) -> dict | None:
            return next(self.it, None)

    quantize_static(
        str(d / "f.onnx"),
        str(d / "q.onnx"),
        Reader(),
        quant_format=quant_format,
        per_channel=per_channel,
        activation_type=qtype,
        weight_type=qtype,
    )
    return d / "q.onnx"
