"""quantize(mode=static) with a budget (``max_drop``, the CLI's ``--max-drop``): layers kept float,
the most harmful first, until the held-out drop is within it (passes/quantize_static.py rules 6
and 7), on the real Caffe LeNet-5 and real digits; the QDQ result feeds the tflite writer."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.irio import from_proto, to_proto
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _tflite_help import file_ops  # noqa: E402


@pytest.fixture(scope="module")
def outlier_lenet(lenet_mnist):
    """LeNet-5 with one conv1 filter (and its bias) scaled by 1,000 and the conv2 weights reading
    that channel by 1/1,000: the same function (max pooling commutes with a positive scale), but
    conv1's output and conv2's input now span a 1,000x wider range in that one channel, so one
    int8 scale per tensor leaves the other 19 channels a few codes (an outlier channel, as in
    transformers' activations). Digits in a seeded order, so every slice holds every class."""
    model, x, labels = lenet_mnist
    proto = to_proto(model)
    inits = {t.name: t for t in proto.graph.initializer}
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    w1, b1 = (numpy_helper.to_array(inits[n]).copy() for n in convs[0].input[1:3])
    w2 = numpy_helper.to_array(inits[convs[1].input[1]]).copy()
    w1[0] *= 1000.0
    b1[0] *= 1000.0
    w2[:, 0] /= 1000.0
    for name, a in ((convs[0].input[1], w1), (convs[0].input[2], b1), (convs[1].input[1], w2)):
        inits[name].CopyFrom(numpy_helper.from_array(a.astype(np.float32), name))
    order = np.random.default_rng(0).permutation(len(labels))
    return from_proto(proto), x[order], labels[order], [n.name for n in convs]


def _accuracy(model, x, labels) -> float:
    import onnxruntime as ort

    sess = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    got = np.concatenate([sess.run(None, {"data": x[i : i + 1]})[0] for i in range(len(x))])
    return float((got.argmax(1) == labels).mean())


def _quantized(model, spec: str, x, labels):
    from mconv.passes import parse_spec, run_pipeline
    from mconv.passes.base import PassContext
    from mconv.passes.pipeline import snapshot_model

    return run_pipeline(
        snapshot_model(model), parse_spec(spec), PassContext(data={"data": x, "labels": labels})
    )


def test_the_budget_keeps_the_harmful_layers_float(outlier_lenet, tmp_path):
    """Without a budget every layer is int8 and the outlier channel costs most of the accuracy on
    600 digits neither step saw; with ``max_drop=0.01`` the pass holds out a quarter of its 400
    digits, finds conv1 and conv2 (the two layers around the outlier) the harmful ones, keeps
    them float and only them, and the result on the 600 unseen digits is within a point of
    float, where ONNX Runtime measures it. The QDQ model then exports to LiteRT (a float file:
    the activations' QDQ pairs as ONNX's rounding, lower rule 12; int8 weights DEQUANTIZEd),
    which agrees with ONNX Runtime on it."""
    from mconv.targets import get_target

    model, x, labels, convs = outlier_lenet
    cal, cal_y, test, test_y = x[:400], labels[:400], x[1000:1600], labels[1000:1600]
    base = _accuracy(model, test, test_y)
    assert base >= 0.98
    plain, _ = _quantized(model, "quantize(mode=static)", cal, cal_y)
    assert _accuracy(plain, test, test_y) < base - 0.05  # the outlier is real damage
    q, reports = _quantized(model, "quantize(mode=static,max_drop=0.01)", cal, cal_y)
    notes = " ".join(reports[-1].notes)
    assert (
        f"kept float for it: {convs[0]}, {convs[1]}" in notes
        or f"kept float for it: {convs[1]}, {convs[0]}" in notes
    ), notes
    assert "on 100 samples" in notes, notes
    assert "2 layer(s) with int8 activations" in notes, notes
    quantized = {n.name for n in q.graph if n.op_type == "Conv" and any(
        i is not None and i.producer() is not None and i.producer().op_type == "DequantizeLinear" for i in n.inputs
    )}  # fmt: skip
    assert quantized == set(), quantized  # both convolutions float
    assert _accuracy(q, test, test_y) >= base - 0.01
    t = get_target("tflite")
    bundle = t.export(q, tmp_path / "fallback", {})
    ops = [name for name, _, _ in file_ops((bundle.root / "model.tflite").read_bytes())]
    assert "ROUND" in ops and "DEQUANTIZE" in ops, ops
    import onnxruntime as ort

    # ORT runs the QDQ pairs as written (no fusion into its int8 kernels): the model's own
    # arithmetic on every CPU (fused, ORT's u8 x s8 kernels saturate without VNNI: tests/_ortq.py)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(to_proto(q).SerializeToString(), so, providers=["CPUExecutionProvider"])
    run = t.load(bundle)
    for i in (0, 7, 300):
        want = sess.run(None, {"data": test[i : i + 1]})[0]
        np.testing.assert_allclose(run.run({"data": test[i : i + 1]})["prob"], want, rtol=1e-4, atol=1e-5)


def test_a_budget_already_met_keeps_every_layer_int8(lenet_mnist):
    """The real LeNet-5 loses nothing to int8 on its held-out digits: with ``max_drop=0.01``
    all four layers stay int8, and the report says the drop it measured."""
    model, x, labels = lenet_mnist
    order = np.random.default_rng(1).permutation(len(labels))[:400]
    q, reports = _quantized(model, "quantize(mode=static,max_drop=0.01)", x[order], labels[order])
    notes = " ".join(reports[-1].notes)
    assert "4 layer(s) with int8 activations" in notes and "kept float" not in notes, notes
    assert "held-out drop" in notes, notes


def test_a_budget_the_held_out_samples_cannot_resolve_is_refused(lenet_mnist):
    """Rule 6: 100 samples hold out 25; one of them is 4 pt, more than a 1 pt budget: exit 2
    before any work. Rule 7: fewer than 40 samples cannot hold 20 out: exit 2."""
    from mconv.errors import InputError

    model, x, labels = lenet_mnist
    with pytest.raises(InputError, match="cannot be measured that finely"):
        _quantized(model, "quantize(mode=static,max_drop=0.01)", x[:100], labels[:100])
    with pytest.raises(InputError, match="holds out at least 20"):
        _quantized(model, "quantize(mode=static,max_drop=0.05)", x[:30], labels[:30])


def test_the_cli_takes_max_drop_with_a_static_quantize_pass(outlier_lenet, tmp_path):
    """``mconv optimize M --passes "quantize(mode=static)" --data D --max-drop F``: the budget
    goes to the pass (no Deep Compression recipe needed), the JSON report says the held-out drop
    and the layers kept float, and the written model is the pass's (ONNX Runtime runs it)."""
    import json
    import os
    import subprocess

    import onnx

    model, x, labels, convs = outlier_lenet
    (tmp_path / "m.onnx").write_bytes(to_proto(model).SerializeToString())
    np.savez(tmp_path / "cal.npz", data=x[:400], labels=labels[:400])
    r = subprocess.run(
        [sys.executable, "-m", "mconv", "optimize", str(tmp_path / "m.onnx"), "--passes", "quantize(mode=static)",
         "--data", str(tmp_path / "cal.npz"), "--max-drop", "0.01", "-o", str(tmp_path / "q.onnx"), "--json"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    notes = " ".join(n for rep in json.loads(r.stdout)["passes"] for n in rep["notes"])
    assert "held-out drop" in notes and convs[0] in notes and convs[1] in notes, notes
    q = from_proto(onnx.load(tmp_path / "q.onnx"))
    assert (
        _accuracy(q, x[1000:1300], labels[1000:1300])
        >= _accuracy(model, x[1000:1300], labels[1000:1300]) - 0.01
    )


def test_weights_stored_as_constant_nodes_are_quantized(lenet_mnist):
    """PaddleOCR's exports store every weight as a Constant node: LeNet-5 so rewritten is
    quantized like the original by both modes (the weights become initializers first, and the
    report says so), and the static result keeps the float model's accuracy on 300 unseen digits."""
    from onnx import helper

    model, x, labels = lenet_mnist
    proto = to_proto(model)
    weights = [t for t in proto.graph.initializer if t.dims and len(t.dims) >= 2]
    keep = [t for t in proto.graph.initializer if t not in weights]
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in weights]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    nodes = consts + list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    m = from_proto(proto)
    order = np.random.default_rng(2).permutation(len(labels))
    cal, test, test_y = x[order[:300]], x[order[1000:1300]], labels[order[1000:1300]]
    q, reports = _quantized(m, "quantize(mode=static)", cal, labels[order[:300]])
    notes = " ".join(reports[-1].notes)
    assert "4 layer(s) with int8 activations" in notes and "4 weights stored as Constant nodes" in notes, (
        notes
    )
    assert _accuracy(q, test, test_y) >= _accuracy(model, test, test_y) - 0.01
    w, reports = _quantized(m, "quantize", cal, labels[order[:300]])
    assert "4 weights quantized to int8" in " ".join(reports[-1].notes), reports[-1].notes
