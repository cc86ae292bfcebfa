"""Reports that do not mislead (issue 12 item 9): optimize's predicted bundle size, export's
like-for-like byte keys, localize's sentence, inspect's stdout table and shapes, and refusals of
many unsupported ops in one short line (every op in --json / --debug)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.bundle import load_bundle
from mconv.cli.app import app, format_shape, localize_line
from mconv.errors import UnsupportedError, summarize_names
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _cli(*args: str, env: dict | None = None):
    return CliRunner(env=env).invoke(app, [str(a) for a in args])


def _cnn(path: Path, *, seed: int = 0, scale_conv: float = 1.0, input_shape=("N", 1, 6, 6)) -> Path:
    """x -> Conv(conv1) -> Relu(act1) -> Flatten -> Gemm(fc) -> y [N, 3]."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((4, 1, 3, 3)) * 0.5 * scale_conv).astype(np.float32)
    b = (rng.standard_normal(4) * 0.1).astype(np.float32)
    fc = (rng.standard_normal((3, 4 * 6 * 6)) * 0.1).astype(np.float32)
    fcb = np.zeros(3, np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="act1"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (fc, "fc"), (fcb, "fcb"))],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


# --- optimize: the predicted bundle size next to the .onnx size -------------------------------


def test_optimize_prints_and_emits_the_predicted_bundle_size_of_pruned_clustered_weights(tmp_path):
    m = _cnn(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    r = _cli("optimize", m, "--passes", "prune(sparsity=0.8),cluster(bits=4)", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    # pruned and clustered weights stay dense in the .onnx ...
    assert doc["weight_bytes_after"] == doc["weight_bytes_before"] == doc["bytes_after"]
    assert doc["file_bytes_after"] == out.stat().st_size
    # ... and the byte account predicts what export will store
    predicted = doc["predicted_bundle_weight_bytes"]
    assert predicted == doc["account"]["total"]["bytes"]
    assert 0 < predicted < doc["weight_bytes_after"] / 3
    r = _cli("optimize", m, "--passes", "prune(sparsity=0.8),cluster(bits=4)", "-o", tmp_path / "o2.onnx")
    assert r.exit_code == 0, r.output
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("wrote ")][-1]
    assert "in the .onnx (1.0x)" in line and "predicted bundle weights" in line, line
    # export then stores about what was predicted
    r = _cli("export", out, "-o", tmp_path / "b", "--json")
    assert r.exit_code == 0, r.output
    exported = json.loads(r.stdout)["weight_bytes_after"]
    assert abs(exported - predicted) <= 0.05 * predicted + 64, (exported, predicted)


def test_optimize_without_compression_facts_predicts_nothing(tmp_path):
    m = _cnn(tmp_path / "m.onnx")
    r = _cli("optimize", m, "--passes", "fold,dce", "-o", tmp_path / "o.onnx", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["predicted_bundle_weight_bytes"] is None and doc["account"] is None


# --- export: like for like ---------------------------------------------------------------------


def test_export_json_compares_weights_with_weights_and_files_with_files(tmp_path):
    m = _cnn(tmp_path / "m.onnx")
    bundle = tmp_path / "b"
    r = _cli("export", m, "-o", bundle, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["weights"] == []  # weights.mcw's index lists them; the manifest does not repeat it
    stored = sum(w["bytes"] for w in load_bundle(bundle).weights)
    dense = sum(numpy_helper.to_array(t).nbytes for t in onnx.load(m).graph.initializer)
    assert doc["weight_bytes_before"] == doc["bytes_before"] == dense
    assert doc["weight_bytes_after"] == doc["bytes_after"] == doc["weights_bytes"] == stored
    assert doc["file_bytes_before"] == m.stat().st_size
    assert doc["file_bytes_after"] == sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    r = _cli("export", m, "-o", tmp_path / "b2")
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("wrote bundle")][-1]
    assert "weights " in line and "files " in line and "(2 files + manifest)" in line, line


def test_export_counts_external_data_in_the_input_files(tmp_path):
    m = _cnn(tmp_path / "m.onnx")
    proto = onnx.load(m)
    onnx.save(proto, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.bin", size_threshold=0)
    r = _cli("export", tmp_path / "ext.onnx", "-o", tmp_path / "b", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (
        doc["file_bytes_before"]
        == (tmp_path / "ext.onnx").stat().st_size + (tmp_path / "ext.bin").stat().st_size
    )


# --- verify --localize: an honest sentence -----------------------------------------------------


def test_localize_line_never_prints_none_or_nan():
    nothing = localize_line({"node": None, "compared": 3, "note": "none of the 3 values drifts"})
    assert nothing == "localize: none of the 3 values drifts"
    bare = localize_line({"node": None, "value": None})
    assert bare == "localize: no drifting node found"
    unnamed = localize_line(
        {"node": "", "op_type": "Mul", "value": "m1", "max_abs": float("nan"), "cosine": None}
    )
    assert unnamed == "first drifting node: an unnamed node (Mul), output 'm1'", unnamed
    named = localize_line(
        {
            "node": "conv1",
            "op_type": "Conv",
            "value": "c",
            "max_abs": 0.5,
            "cosine": 0.9,
            "failures": ["atol"],
        }
    )
    assert named.startswith(
        "first drifting node: node 'conv1' (Conv), output 'c': max_abs 0.5; cosine 0.900000"
    )
    assert "fails atol" in named
    for text in (nothing, bare, unnamed, named):
        assert "None" not in text and "nan" not in text


def test_verify_localize_names_the_drifting_node(tmp_path):
    ref = _cnn(tmp_path / "ref.onnx")
    cand = _cnn(tmp_path / "cand.onnx", scale_conv=1.5)
    r = _cli("verify", ref, cand, "--localize", "--min-cosine", "0.9999", "--samples", "4")
    assert r.exit_code == 1, r.output
    line = [ln for ln in r.stderr.splitlines() if "drifting node" in ln]
    assert line and line[0].startswith("first drifting node: node 'conv1' (Conv), output 'c'"), r.stderr
    assert "None" not in line[0] and "nan" not in line[0]


def test_verify_localize_says_when_no_node_drifts(tmp_path):
    ref = _cnn(tmp_path / "ref.onnx")
    r = _cli("verify", ref, ref, "--localize", "--samples", "4")
    assert r.exit_code == 0, r.output
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("localize:")]
    assert line and line[0].startswith("localize: none of the "), r.stderr
    assert "drifts beyond" in line[0]
    assert "None" not in line[0]


# --- inspect: stdout, shapes as lists ----------------------------------------------------------


def test_format_shape():
    assert format_shape((1, 3, 224, 224)) == "[1,3,224,224]"
    assert format_shape(["N", 3, None, None]) == "[N,3,?,?]"
    assert format_shape(()) == "[]"
    assert format_shape(None) == "?"


def test_inspect_prints_its_table_on_stdout_and_json_alone_with_json(tmp_path):
    m = _cnn(tmp_path / "m.onnx", input_shape=("N", 1, 6, 6))
    r = _cli("inspect", m)
    assert r.exit_code == 0, r.output
    assert "[N,1,6,6]" in r.stdout and "[N,3]" in r.stdout and "[4,1,3,3]" in r.stdout, r.stdout
    assert "(4, 1, 3, 3)" not in r.stdout and "('N'" not in r.stdout
    assert r.stderr.strip() == ""
    r = _cli("inspect", m, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # nothing but the document on stdout
    assert doc["inputs"][0]["shape"] == ["N", 1, 6, 6]
    r = _cli("inspect", m, "--quiet")
    assert r.exit_code == 0 and r.stdout == ""


def test_inspect_shows_unknown_dims_as_question_marks(tmp_path):
    p = tmp_path / "u.onnx"
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "u",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, None, None])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    r = _cli("inspect", p)
    assert r.exit_code == 0, r.output
    assert "[N,3,?,?]" in r.stdout, r.stdout


def test_inspect_of_a_bundle_prints_on_stdout(tmp_path):
    m = _cnn(tmp_path / "m.onnx")
    assert _cli("export", m, "-o", tmp_path / "b", "-q").exit_code == 0
    r = _cli("inspect", tmp_path / "b")
    assert r.exit_code == 0, r.output
    assert "bundle: target cpu" in r.stdout and "weight storage" in r.stdout and "[N,1,6,6]" in r.stdout


def test_inspect_escapes_markup_in_names_from_the_file(tmp_path):
    p = tmp_path / "markup.onnx"
    g = helper.make_graph(
        [helper.make_node("Relu", ["[/bold]x"], ["y"], name="relu")],
        "u",
        [helper.make_tensor_value_info("[/bold]x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    r = _cli("inspect", p)
    assert r.exit_code == 0, r.output
    assert "[/bold]x" in r.stdout


# --- many unsupported ops: one short line, all of them in --json / --debug -------------------


def test_summarize_names():
    assert summarize_names([]) == "none"
    assert summarize_names(["a", "b"]) == "a, b"
    assert summarize_names([f"n{i}" for i in range(142)], 3) == "n0, n1, n2 and 139 more"
    assert summarize_names(["x\ny"]) == "x\\x0ay"  # names from files are escaped


def test_few_unsupported_ops_are_all_named_and_many_are_summarized():
    few = UnsupportedError([("a", "Foo"), ("b", "Bar")], path="m.onnx")
    assert few.line() == "m.onnx: 2 unsupported op(s): a (Foo), b (Bar)"
    kinds = ["STRIDED_SLICE", "MIRROR_PAD", "SQUEEZE", "GATHER", "NEG", "SPLIT"]
    items = [(f"model/layer_{i}/op" + "x" * 40, kinds[i % len(kinds)]) for i in range(142)]
    many = UnsupportedError(items, path="audio.tflite", hint="see docs/formats.md")
    line = many.line()
    assert len(line) < 700 and "\n" not in line
    assert line.startswith("audio.tflite: 142 unsupported op(s) of 6 kind(s): ")
    assert "GATHER x24" in line and "and 137 more (every one with --json or --debug)" in line
    assert [d["name"] for d in many.details()["items"]] == [n for n, _ in items]


def _many_custom_ops(path: Path, n: int) -> Path:
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node(f"Mystery{i % 3}", [prev], [f"v{i}"], name=f"node{i}", domain="my.dom"))
        prev = f"v{i}"
    g = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.dom", 1)]
    )
    onnx.save(proto, path)
    return path


def test_cli_refusal_of_many_ops_is_one_short_line_and_json_lists_every_one(tmp_path):
    m = _many_custom_ops(tmp_path / "custom.onnx", 40)
    r = _cli("run", m)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and len(lines[0]) < 700, r.stderr
    assert str(m) in lines[0] and "40 unsupported" in lines[0] and "and 35 more" in lines[0]
    r = _cli("run", m, "--json")
    assert r.exit_code == 2
    err = json.loads(r.stdout)["error"]
    assert err["exit_code"] == 2 and err["path"] == str(m) and err["kind"] == "UnsupportedError"
    assert [i["name"] for i in err["items"]] == [f"node{i}" for i in range(40)]
    assert err["items"][0]["kind"] == "my.dom::Mystery0"
    r = _cli("run", m, "--debug")
    assert r.exit_code == 2
    assert all(f"node{i} (my.dom::Mystery{i % 3})" in r.stderr for i in range(40))


def test_json_error_document_for_plain_bad_input(tmp_path):
    r = _cli("inspect", tmp_path / "missing.onnx", "--json")
    assert r.exit_code == 2
    err = json.loads(r.stdout)["error"]
    assert err["exit_code"] == 2 and "missing.onnx" in err["line"] and "items" not in err


@pytest.mark.parametrize("name", ["hello_world_int8.tflite", "person_detect.tflite"])
def test_real_tflite_bundle_figures_are_reported_like_for_like(tmp_path, name, shared):
    src = shared / "models" / "tflite" / name
    assert src.is_file(), f"{src} is missing from the shared real-model folder"
    assert _cli("import", src, "-o", tmp_path / "m.onnx", "-q").exit_code == 0
    r = _cli("export", tmp_path / "m.onnx", "-o", tmp_path / "b", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["file_bytes_before"] == (tmp_path / "m.onnx").stat().st_size
    assert doc["file_bytes_after"] == sum(p.stat().st_size for p in (tmp_path / "b").iterdir())
    assert doc["weight_bytes_after"] <= doc["weight_bytes_before"]  # lossless never grows the weights


def test_optimize_summary_names_the_onnx_only_when_it_wrote_one():
    from mconv.cli.render import optimize_summary

    onnx = optimize_summary(Path("o.onnx"), 4000, 4000, 4100, 500)
    assert "in the .onnx (1.0x)" in onnx and "stored dense in the .onnx until export" in onnx, onnx
    packed = optimize_summary(Path("out.safetensors"), 4000, 1000, 1100, None)  # a streamed checkpoint
    assert ".onnx" not in packed and "in the output (4.0x)" in packed, packed
