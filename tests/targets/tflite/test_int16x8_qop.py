"""LiteRT's 16x8 mode (int16 activations, int8 weights: ``--precision int16x8``, and the int8
export's fallback where no int8 file is kept) and QOperator models written with their own
parameters (issue 46 item 4).

LeNet-5 (Caffe) on real MNIST digits, run by LiteRT; the QOperator model is ONNX Runtime's
``quantize_static`` of it, run by ONNX Runtime beside the file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import ai_edge_litert.interpreter  # noqa: E402, F401  (the test extra installs LiteRT: absent is a failure)
from _tflite_help import file_ops, ort_quantized  # noqa: E402


@pytest.fixture(scope="module")
def lenet(lenet_mnist):
    """The LeNet-5 and its digits in the file's order (sorted by label: strided picks mix them)."""
    return lenet_mnist[:2]


_ops = file_ops  # (op name, version, input dtypes), read with the tflite package


def test_int16x8_computes_on_int16_codes_and_is_closer_to_float_than_int8(lenet, tmp_path):
    """Every compute op takes int16 activations, int8 weights and int64 biases, at the versions
    LiteRT's op_version.cc gives 16x8 (CONV_2D 4, FULLY_CONNECTED 7); on 500 held-out digits it
    agrees with float on top-1 and its probabilities are nearer float's than the int8 file's."""
    from mconv.targets import get_target

    model, x = lenet
    calib, held = {"data": x[::50]}, x[25::10]
    t = get_target("tflite")
    want = t.load(t.export(model, tmp_path / "f32", {})).run({"data": held})["prob"]
    errors = {}
    for precision in ("int8", "int16x8"):
        b = t.export(model, tmp_path / precision, {"precision": precision, "data": calib})
        got = t.load(b).run({"data": held})["prob"]
        assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.99, precision
        errors[precision] = float(np.abs(got - want).mean())
        ops = _ops((b.root / "model.tflite").read_bytes())
        if precision == "int16x8":
            notes = " ".join(b.manifest["notes"])
            assert "16x8: int16 activations" in notes and "(kept;" in notes
            compute = [(op, v, ty) for op, v, ty in ops if op not in ("QUANTIZE", "DEQUANTIZE")]
            assert compute and all(ty[0] == "INT16" for _, _, ty in compute), compute
            for op, v, ty in compute:
                if op in ("CONV_2D", "FULLY_CONNECTED"):
                    assert ty[1] == "INT8" and ty[2] == "INT64", (op, ty)
                    assert v == {"CONV_2D": 4, "FULLY_CONNECTED": 7}[op]
    assert errors["int16x8"] < 0.5 * errors["int8"], errors


def test_int8_writes_16x8_where_no_int8_file_is_kept(lenet, tmp_path):
    """Two 40x over-exposed frames among 100 calibration digits stretch min-max's input range
    40-fold: the int8 file is not kept (tests/targets/tflite/test_int8_calibration.py), so the
    export writes the 16x8 file, which the gate keeps, and says so; with int8 outputs it cannot
    (a 16x8 file gives float32) and the int8 file stands, NOT kept."""
    from mconv.targets import get_target

    model, x = lenet
    calib = x[::50].copy()
    calib[:2] *= 40.0
    held = x[25::10]
    t = get_target("tflite")
    want = t.load(t.export(model, tmp_path / "f32", {})).run({"data": held})["prob"].argmax(1)
    opts = {"precision": "int8", "data": {"data": calib}, "calibration": "minmax"}
    b = t.export(model, tmp_path / "wide", opts)
    notes = " ".join(b.manifest["notes"])
    assert "16x8: int16 activations" in notes and "no int8 file was kept" in notes, notes
    assert "minmax top1" in notes and "minmax 16x8 top1" in notes  # both measured, named
    assert "int16 against float" in notes and "(kept;" in notes
    ops = _ops((b.root / "model.tflite").read_bytes())
    assert any(op == "CONV_2D" and ty[0] == "INT16" for op, _, ty in ops)
    got = t.load(b).run({"data": held})["prob"].argmax(1)
    assert float((got == want).mean()) >= 0.99
    b8 = t.export(model, tmp_path / "codes", {**opts, "io_dtype": "int8"})
    notes8 = " ".join(b8.manifest["notes"])
    assert "16x8" not in notes8 and "NOT kept" in notes8
    assert all(
        ty[0] == "INT8" for op, _, ty in _ops((b8.root / "model.tflite").read_bytes()) if op == "CONV_2D"
    )


def test_int16x8_refuses_8_bit_inputs_and_needs_data(lenet, tmp_path):
    from mconv.errors import InputError
    from mconv.targets import get_target

    model, x = lenet
    t = get_target("tflite")
    with pytest.raises(InputError, match="int16x8 files take and give float32"):
        t.export(model, tmp_path / "a", {"precision": "int16x8", "data": {"data": x[:8]}, "io_dtype": "int8"})
    with pytest.raises(InputError, match="int16x8 needs calibration inputs"):
        t.export(model, tmp_path / "b", {"precision": "int16x8"})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.fixture(scope="module")
def lenet_qop(lenet, tmp_path_factory):
    """LeNet-5 through ONNX Runtime's quantize_static in QOperator form (QLinearConv,
    QLinearMatMul/QGemm; uint8 activations and weights), calibrated on 100 real digits."""
    from onnxruntime.quantization import QuantFormat, QuantType

    model, x = lenet
    d = tmp_path_factory.mktemp("qop")
    return ort_quantized(model, x[::50], d, QuantFormat.QOperator, QuantType.QUInt8)


def test_a_qoperator_model_exports_int8_with_its_own_parameters(lenet, lenet_qop, tmp_path):
    """QLinearConv and the quantized fully connected layers become int8 CONV_2D and
    FULLY_CONNECTED with the model's own output parameters (no integer emulation in float: no
    CAST, SUB of zero points or MUL by scale ratios), so on 500 held-out digits the file's
    probabilities are ONNX Runtime's, to one step of the output's scale, and the export keeps it."""
    import onnx
    import onnxruntime as ort
    from mconv.formats import import_model
    from mconv.targets import get_target

    _, x = lenet
    proto = onnx.load(str(lenet_qop))
    kinds = {n.op_type for n in proto.graph.node}
    assert "QLinearConv" in kinds, kinds
    held = x[25::10]
    sess = ort.InferenceSession(str(lenet_qop), providers=["CPUExecutionProvider"])
    want = np.concatenate([sess.run(None, {"data": held[i : i + 1]})[0] for i in range(len(held))])
    t = get_target("tflite")
    b = t.export(import_model([lenet_qop]), tmp_path / "q", {"precision": "int8", "data": {"data": x[5::50]}})
    notes = " ".join(b.manifest["notes"])
    assert "tensor(s) quantized with the model's QuantizeLinear parameters" in notes and "(kept;" in notes
    ops = _ops((b.root / "model.tflite").read_bytes())
    names = [op for op, _, _ in ops]
    assert names.count("CONV_2D") == 2 and names.count("FULLY_CONNECTED") == 2, names
    assert not {"CAST", "SUB", "ROUND", "DIV"} & set(names), names
    for op, _, ty in ops:
        if op not in ("QUANTIZE", "DEQUANTIZE"):
            assert ty[0] == "INT8", (op, ty)
    got = t.load(b).run({"data": held})["prob"]
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.99
    step = 1 / 256  # the softmax's int8 step
    assert float((np.abs(got - want) <= step + 1e-6).mean()) >= 0.99
