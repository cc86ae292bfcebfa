"""Models whose inputs fix the batch at 1 (TFLite's, MediaPipe's) with data of many samples:
``optimize`` frees the batch for its work and gives it back, ``verify`` and ``run`` run a sample
at a time; a graph that mixes samples is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.cli.app import app
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime on the file as given, one sample at a time (its batch is 1)."""
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))])


def _dims(path: Path) -> tuple[list, list]:
    g = onnx.load(str(path)).graph
    d = lambda v: [x.dim_value or x.dim_param for x in v.type.tensor_type.shape.dim]  # noqa: E731
    return d(g.input[0]), d(g.output[0])


def _pinned(path: Path, *, mix: bool = False) -> Path:
    """x [1, 4, 3] -> Reshape [1, 12] -> MatMul w [12, 5] -> y [1, 5] (``mix``: minus the batch's
    mean, which a batch of one makes zero and a batch of many does not)."""
    w = np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "w"], ["z"], name="fc"),
    ]
    if mix:
        nodes += [
            helper.make_node("ReduceMean", ["z"], ["m"], axes=[0], keepdims=1, name="batch_mean"),
            helper.make_node("Sub", ["z", "m"], ["y"], name="centre"),
        ]
    else:
        nodes.append(helper.make_node("Relu", ["z"], ["y"], name="relu"))
    g = helper.make_graph(
        nodes,
        "pinned",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(np.array([1, 12], np.int64), "shape"), numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _one_line_exit_2(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_optimize_frees_the_batch_and_gives_it_back(tmp_path):
    """A data pass (pruning then fine-tuning) on 40 samples of a batch-1 model: the output keeps
    [1, 4, 3] -> [1, 5]; it is valid, runs in ONNX Runtime, and its pruned weights are what the
    fine-tuning left (not the input's)."""
    src = _pinned(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 4, 3)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    out = tmp_path / "o.onnx"
    r = _cli("optimize", str(src), "--passes", "prune(sparsity=0.5),finetune(epochs=2)",
             "--data", str(tmp_path / "d.npz"), "-o", str(out), "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert any("fix the batch at 1: freed for the data" in n for n in json.loads(r.stdout)["notes"])
    assert _dims(out) == ([1, 4, 3], [1, 5])
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    w = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}["w"]
    assert (w == 0).sum() == 30  # half of the 60 weights pruned
    y_in, y_out = _ort(src, x), _ort(out, x)
    assert y_out.shape == (40, 5) and not np.allclose(y_in, y_out)


def test_the_freed_model_is_the_model_on_each_sample(tmp_path):
    """Lossless passes only: the output, run by ONNX Runtime a sample at a time, equals the input."""
    src = _pinned(tmp_path / "m.onnx")
    x = np.random.default_rng(2).standard_normal((7, 4, 3)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    out = tmp_path / "o.onnx"
    r = _cli("optimize", str(src), "--passes", "fold,dce", "--data", str(tmp_path / "d.npz"), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert _dims(out) == ([1, 4, 3], [1, 5])
    np.testing.assert_array_equal(_ort(out, x), _ort(src, x))


def test_analyze_sweeps_a_batch_fixed_at_1(tmp_path):
    """``analyze --data`` of 40 samples on the [1, 4, 3] model: each layer's sweep measured."""
    src = _pinned(tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(4).standard_normal((40, 4, 3)).astype(np.float32))
    r = _cli("analyze", str(src), "--data", str(tmp_path / "d.npz"), "--sweep", "0.5,0.9", "--json")
    assert r.exit_code == 0, r.output
    layers = json.loads(r.stdout)["layers"]
    assert [(row["name"], row["tensor"]) for row in layers] == [("fc", "w")]
    sweep = layers[0]["sweep"]
    assert [p["sparsity"] for p in sweep] == [0.0, 0.5, 0.9]
    assert sweep[0]["metric"] == 1.0 and sweep[2]["drop"] > sweep[1]["drop"] > 0  # measured on the 40


def test_a_graph_that_mixes_samples_is_refused(tmp_path):
    src = _pinned(tmp_path / "m.onnx", mix=True)
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(3).standard_normal((8, 4, 3)).astype(np.float32))
    r = _cli("optimize", str(src), "--passes", "prune(sparsity=0.5),finetune(epochs=1)",
             "--data", str(tmp_path / "d.npz"), "-o", str(tmp_path / "o.onnx"))  # fmt: skip
    _one_line_exit_2(r, "d.npz", "fix the batch at 1", "does not batch")
    assert not (tmp_path / "o.onnx").exists()


def test_data_of_other_inner_shape_is_still_refused(tmp_path):
    src = _pinned(tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.zeros((8, 3, 4), np.float32))
    for args in (
        (
            "optimize",
            str(src),
            "--passes",
            "fold",
            "--data",
            str(tmp_path / "d.npz"),
            "-o",
            str(tmp_path / "o.onnx"),
        ),
        ("verify", str(src), str(src), "--data", str(tmp_path / "d.npz")),
        ("run", str(src), "--data", str(tmp_path / "d.npz")),
    ):
        _one_line_exit_2(_cli(*args), "d.npz", "[8, 3, 4]", "[1, 4, 3]")


@pytest.fixture
def lstm(tmp_path_factory, shared) -> tuple[Path, np.ndarray, np.ndarray]:
    """tflite-micro's MNIST LSTM (inputs [1, 28, 28], 28 unrolled steps) imported, and 300 real
    MNIST digits (pixels / 255) with their labels."""
    d = tmp_path_factory.mktemp("lstm")
    r = _cli("import", str(shared / "models" / "tflite" / "trained_lstm.tflite"), "-o", str(d / "lstm.onnx"))
    assert r.exit_code == 0, r.output
    with np.load(shared / "data" / "mnist5k.npz") as z:
        idx = np.random.default_rng(0).permutation(len(z["labels"]))[:300]
        x, y = z["images"][idx].astype(np.float32) / 255.0, z["labels"][idx]
    return d / "lstm.onnx", x, y


def test_real_lstm_verify_and_run_take_many_digits(lstm, tmp_path):
    """``run --data`` of 100 digits gives ONNX Runtime's outputs sample by sample; ``verify`` of the
    model against itself passes with a run per sample, and its accuracy is the labels'."""
    model, x, y = lstm
    name = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    np.savez(tmp_path / "d.npz", **{name: x[:100], "labels": y[:100]})
    r = _cli("run", str(model), "--data", str(tmp_path / "d.npz"), "-o", str(tmp_path / "r.npz"))
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "r.npz") as z:
        got = z[z.files[0]]
    want = _ort(model, x[:100])
    assert got.shape == (100, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    r = _cli("verify", str(model), str(model), "--data", str(tmp_path / "d.npz"), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["batching"]["runs"] == 100 and doc["samples"] == 100
    acc = float((want.argmax(1) == y[:100]).mean())
    assert acc > 0.95
    assert doc["outputs"][next(iter(doc["outputs"]))]["accuracy_reference"] == pytest.approx(acc)


def test_real_lstm_fine_tunes_on_many_digits(lstm, tmp_path):
    """Prune 60% of the LSTM's weights and retrain on 200 real digits (batches of 32 through the
    freed batch): it keeps its [1, 28, 28] input and, on 100 digits it never saw, its accuracy
    within 5 points of the original's (pruning alone, untrained, loses more)."""
    model, x, y = lstm
    name = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    np.savez(tmp_path / "cal.npz", **{name: x[:200], "labels": y[:200]})
    out, raw = tmp_path / "o.onnx", tmp_path / "raw.onnx"
    data = str(tmp_path / "cal.npz")
    r = _cli("optimize", str(model), "--passes", "prune(sparsity=0.6),finetune(epochs=10)",
             "--data", data, "-o", str(out), "--seed", "0")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert _cli("optimize", str(model), "--passes", "prune(sparsity=0.6)", "-o", str(raw)).exit_code == 0
    assert _dims(out) == ([1, 28, 28], [1, 10])
    held, labels = x[200:], y[200:]
    acc = {p: float((_ort(p, held).argmax(1) == labels).mean()) for p in (model, out, raw)}
    assert acc[out] >= acc[model] - 0.05, acc
    assert acc[out] > acc[raw] + 0.2, acc
