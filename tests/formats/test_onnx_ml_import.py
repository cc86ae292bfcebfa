"""Import of ONNX files with map and sequence types (ai.onnx.ml's ZipMap) and the wording of load
errors: a file that parses as protobuf and passes the structural checks is never called corrupt."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.cli.app import app
from onnx import TensorProto, helper
from typer.testing import CliRunner


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "-q"])


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and "Traceback" not in output
    return lines[0]


def _zipmap_model(path, labels=(0, 1, 2), string_labels=False):
    """Scaler -> LinearClassifier -> ZipMap, as skl2onnx writes a scaled logistic regression,
    built by hand (no converter needed): a label tensor and a sequence of maps."""
    rng = np.random.default_rng(0)
    k = len(labels)
    label_attr = (
        {"classlabels_strings": [str(v) for v in labels]}
        if string_labels
        else {"classlabels_ints": list(labels)}
    )
    zip_attr = (
        {"classlabels_strings": [str(v) for v in labels]}
        if string_labels
        else {"classlabels_int64s": list(labels)}
    )
    nodes = [
        helper.make_node("Scaler", ["x"], ["xs"], domain="ai.onnx.ml", offset=[0.5] * 4, scale=[2.0] * 4),
        helper.make_node(
            "LinearClassifier",
            ["xs"],
            ["label", "scores"],
            domain="ai.onnx.ml",
            coefficients=rng.standard_normal(4 * k).astype(np.float32).tolist(),
            intercepts=rng.standard_normal(k).astype(np.float32).tolist(),
            post_transform="SOFTMAX",
            multi_class=1,
            **label_attr,
        ),
        helper.make_node("ZipMap", ["scores"], ["probabilities"], domain="ai.onnx.ml", **zip_attr),
    ]
    key = TensorProto.STRING if string_labels else TensorProto.INT64
    seq_map = helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    )
    graph = helper.make_graph(
        nodes,
        "pipeline",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("label", key, ["N"]),
            helper.make_value_info("probabilities", seq_map),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=9
    )
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("string_labels", [False, True])
def test_map_typed_model_imports_runs_and_keeps_its_types(string_labels, tmp_path):
    src = _zipmap_model(tmp_path / "pipe.onnx", labels=(3, 5, 7), string_labels=string_labels)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "imported.onnx"
    r = _cli("import", str(src), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    saved = onnx.load(out)
    want = {o.name: o.type for o in onnx.load(src).graph.output}
    assert {o.name: o.type for o in saved.graph.output} == want
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    a = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    b = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1]
    bundle = tmp_path / "bundle"
    assert _cli("export", str(src), "--target", "cpu", "-o", str(bundle)).exit_code == 0
    data = tmp_path / "x.npz"
    np.savez(data, x=x)
    r = _cli("verify", str(src), str(bundle), "--data", str(data))
    assert r.exit_code == 0, r.output


def test_truncated_file_is_still_called_corrupt(tmp_path):
    src = _zipmap_model(tmp_path / "pipe.onnx")
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(src.read_bytes()[:-37])
    r = _cli("import", str(bad), "-o", str(tmp_path / "out.onnx"))
    assert r.exit_code == 2
    assert "corrupt" in _one_error_line(r.output)
    assert not (tmp_path / "out.onnx").exists()


def test_valid_file_the_ir_cannot_hold_is_not_called_corrupt(tmp_path, monkeypatch):
    """A parse that succeeds but a construct the in-memory IR lacks: one line naming the
    construct as unsupported, never 'truncated or corrupt'."""
    import onnx_ir

    src = _zipmap_model(tmp_path / "pipe.onnx")

    def refuse(proto):
        raise onnx_ir.serde.SerdeError("wrapped") from NotImplementedError(
            "Frobnicate types are not supported yet"
        )

    monkeypatch.setattr(onnx_ir.serde, "deserialize_model", refuse)
    r = _cli("import", str(src), "-o", str(tmp_path / "out.onnx"))
    assert r.exit_code == 2
    line = _one_error_line(r.output)
    assert "not supported" in line and "Frobnicate" in line
    assert "corrupt" not in line and "truncated" not in line
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("string_labels", [False, True])
@pytest.mark.parametrize("target", ["model", "cpu"])
def test_run_writes_a_sequence_of_maps_as_scores_and_keys(string_labels, target, tmp_path):
    """ZipMap's output (one {label: score} map per sample) goes to the .npz as [N, K] scores and
    its sorted keys, read back without pickling and equal to ONNX Runtime's maps."""
    src = _zipmap_model(tmp_path / "pipe.onnx", labels=(3, 5, 7), string_labels=string_labels)
    x = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    model = str(src)
    if target == "cpu":
        model = str(tmp_path / "bundle")
        assert _cli("export", str(src), "--target", "cpu", "-o", model).exit_code == 0
    out = tmp_path / "y.npz"
    r = _cli("run", model, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(out))
    assert r.exit_code == 0, r.output
    labels, maps = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    names = [o.name for o in onnx.load(src).graph.output]
    with np.load(out, allow_pickle=False) as z:
        np.testing.assert_array_equal(z[names[0]], labels)
        keys = list(z[f"{names[1]}.keys"])
        assert keys == sorted(maps[0], key=repr)
        want = np.array([[m[k] for k in keys] for m in maps], np.float64)
        np.testing.assert_allclose(z[names[1]], want, rtol=1e-6)
