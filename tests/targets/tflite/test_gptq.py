"""Int8 weight codes fitted on the calibration samples (GPTQ, writer rule 10,
:mod:`mconv.targets.tflite.gptq`).

The solver on a seeded layer whose inputs are correlated as activations are; the patch geometry
against LiteRT's own convolutions; the export on the real Caffe LeNet-5 with real MNIST digits,
judged on digits the fit never saw.
"""

from __future__ import annotations

import warnings

import ai_edge_litert.interpreter  # noqa: F401  (the test extra installs LiteRT: absent is a failure)
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def test_gptq_codes_cut_the_layer_error_on_inputs_the_fit_never_saw():
    """A 64 x 256 layer whose inputs lie near a 24-dimensional subspace (as activations do):
    the codes GPTQ fits on 4,000 inputs give at least 3x less output error than the nearest codes
    on 4,000 other inputs of the same kind (measured 4.8x), with the same per-channel scales and
    every code in [-127, 127]."""
    from mconv.quantmath import symmetric
    from mconv.targets.tflite.gptq import _solve

    rng = np.random.default_rng(0)
    basis = rng.normal(size=(24, 256))

    def draw(n: int) -> np.ndarray:
        return rng.normal(size=(n, 24)) @ basis + 0.1 * rng.normal(size=(n, 256))

    fit, unseen = draw(4000), draw(4000)
    w = rng.normal(size=(64, 256)) * 0.05
    q, s = symmetric(w, 0)
    codes = _solve(w, fit.T @ fit, s.astype(np.float64))
    assert codes.min() >= -127 and codes.max() <= 127 and np.array_equal(codes, np.round(codes))

    def err(c: np.ndarray) -> float:
        return float(np.linalg.norm((c * s[:, None] - w) @ unseen.T) / np.linalg.norm(w @ unseen.T))

    nearest, fitted = err(q.astype(np.float64)), err(codes)
    assert nearest / fitted >= 3.0, (nearest, fitted)


def test_an_input_no_sample_reaches_keeps_its_nearest_code():
    """Rule 3: a column whose input is always 0 on the samples (H_ii = 0) is rounded to its
    nearest code and passes no error on (its row of H^-1 is empty)."""
    from mconv.quantmath import symmetric
    from mconv.targets.tflite.gptq import _solve

    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 16))
    x[:, 5] = 0.0
    w = rng.normal(size=(8, 16))
    q, s = symmetric(w, 0)
    codes = _solve(w, x.T @ x, s.astype(np.float64))
    assert np.array_equal(codes[:, 5], q[:, 5].astype(np.float64))


def _convs() -> onnx.ModelProto:
    """A CONV_2D (stride 2, SAME padding) then a DEPTHWISE_CONV_2D (dilation 2, VALID), no
    activations (their outputs are the raw sums)."""
    rng = np.random.default_rng(2)
    w1 = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(size=(4, 1, 3, 3)).astype(np.float32)
    b1 = rng.normal(size=4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["y1"], strides=[2, 2], auto_pad="SAME_UPPER"),
        helper.make_node("Conv", ["y1", "w2"], ["y2"], group=4, dilations=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 11])],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_patches_reproduce_litert_convolutions():
    """Rule 2's patches, laid out as the filters are, times the filters plus the bias give LiteRT's
    own outputs of a strided SAME CONV_2D and a dilated DEPTHWISE_CONV_2D: the padding, stride
    and dilation geometry the Hessians are built on is the runtime's."""
    import onnx_ir as ir
    from mconv.targets.gpu.plan import prepare
    from mconv.targets.tflite import gptq, lower
    from mconv.targets.tflite.litert import open_interpreter
    from mconv.targets.tflite.schema import serialize

    g = lower.lower(prepare(ir.from_proto(_convs())))
    with warnings.catch_warnings():  # keeping every tensor is LiteRT's debugging aid: ours here
        warnings.simplefilter("ignore")
        interp = open_interpreter(serialize(g), experimental_preserve_all_tensors=True)
    x = np.random.default_rng(3).normal(size=(1, 3, 13, 11)).astype(np.float32)  # the model's NCHW
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    codes = [op.code for op in g.ops]
    assert "CONV_2D" in codes and "DEPTHWISE_CONV_2D" in codes, codes
    rng = np.random.default_rng(0)
    for op in g.ops:
        if op.code not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            continue
        w = g.tensors[op.inputs[1]].data
        b = g.tensors[op.inputs[2]].data if len(op.inputs) > 2 and op.inputs[2] >= 0 else 0.0
        xin = interp.get_tensor(op.inputs[0])
        y = interp.get_tensor(op.outputs[0])
        p = gptq._patches(op, xin, w.shape[1], w.shape[2], rng)  # [P, KH*KW, C], P = all positions
        if op.code == "CONV_2D":
            got = p.reshape(p.shape[0], -1) @ w.reshape(w.shape[0], -1).T + b
        else:
            got = np.einsum("pkc,kc->pc", p, w.reshape(-1, w.shape[3])) + b
        np.testing.assert_allclose(got, y.reshape(-1, y.shape[-1]), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def lenet(lenet_mnist):
    return lenet_mnist[:2]


def test_fitted_codes_follow_float_closer_on_held_out_digits(lenet, tmp_path):
    """The real LeNet-5, ``--precision int16x8`` (16-bit activations: the weights' codes are what
    is left of the error), calibrated on 200 real digits: with GPTQ (the default) its class
    probabilities on 500 other digits are nearer the float file's than with ``--rounding
    nearest``, top-1 agreement with float stays >= 0.99, and the notes say how many weights were
    fitted and that a quarter of the runs were held out for the gate."""
    from mconv.targets import get_target

    model, x = lenet
    calib, held = x[::25].copy(), x[7::10][:500]
    t = get_target("tflite")
    want = t.load(t.export(model, tmp_path / "f32", {})).run({"data": held})["prob"]

    def run(name: str, **opts) -> tuple[float, float, str]:
        b = t.export(model, tmp_path / name, {"precision": "int16x8", "data": {"data": calib}, **opts})
        got = t.load(b).run({"data": held})["prob"]
        rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        return rel, float((got.argmax(1) == want.argmax(1)).mean()), " ".join(b.manifest["notes"])

    fitted, top1, notes = run("gptq")
    nearest, top1_nearest, notes_nearest = run("nearest", rounding="nearest")
    assert "(GPTQ) for 4 weight tensor(s)" in notes and "50 of 200 run(s) held out" in notes, notes
    assert "GPTQ" not in notes_nearest
    assert fitted < nearest and top1 >= 0.99 and top1_nearest >= 0.99, (fitted, nearest, top1)


def test_rounding_needs_a_calibrated_precision(tmp_path):
    """``--rounding`` at a float precision is bad input: exit 2, one line, no file."""
    import subprocess
    import sys

    src = tmp_path / "convs.onnx"
    onnx.save(_convs(), src)
    r = subprocess.run(
        [sys.executable, "-m", "mconv", "export", str(src), "--target", "tflite", "--rounding", "nearest",
         "-o", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--rounding" in r.stderr
    assert not (tmp_path / "out").exists()
