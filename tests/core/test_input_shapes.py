"""--input-shape NAME=DIMS: checked against the model's inputs, fixed in, downstream dims inferred."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.cli.app import app
from mconv.edit.input_shapes import fix_input_shapes
from mconv.errors import InputError
from mconv.irio import load_onnx
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line_exit_2(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    assert "internal error" not in r.output and "Traceback" not in r.output
    return lines[0]


def _two_inputs(path: Path) -> Path:
    """a [N, 4] + b [N, 4] -> MatMul w [4, 3] -> y (no declared output shape)."""
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["s"], name="add"),
            helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
        ],
        "two",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_fix_input_shapes_fixes_the_symbol_everywhere_and_infers_downstream(tmp_path):
    model = load_onnx(_two_inputs(tmp_path / "m.onnx"))
    notes = fix_input_shapes(model, {"a": [3, 4]}, path="m.onnx")
    assert notes == ["input 'a' fixed to [3, 4]"]
    ins = {v.name: list(v.shape) for v in model.graph.inputs}
    assert ins == {"a": [3, 4], "b": [3, 4]}  # b shares the symbol N
    assert list(model.graph.outputs[0].shape) == [3, 3]


@pytest.mark.parametrize(
    ("shapes", "needles"),
    [
        ({"c": [3, 4]}, ["'c'", "not an input", "inputs: a [N,4], b [N,4]"]),
        ({"a": [3, 5]}, ["dimension 1 is fixed at 4", "not 5"]),
        ({"a": [3]}, ["1 dimensions", "has 2"]),
        ({"a": [-1, 4]}, ["integers >= 1"]),
        ({"a": [2, 4], "b": [3, 4]}, ["symbol 'N' two sizes"]),
    ],
)
def test_fix_input_shapes_refuses_what_does_not_fit(tmp_path, shapes, needles):
    model = load_onnx(_two_inputs(tmp_path / "m.onnx"))
    with pytest.raises(InputError) as exc:
        fix_input_shapes(model, shapes, path=str(tmp_path / "m.onnx"))
    line = exc.value.line()
    assert "m.onnx" in line
    for n in needles:
        assert n in line, line


def test_import_onnx_with_an_unknown_name_is_exit_2_listing_the_inputs(tmp_path):
    m = _two_inputs(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    _one_line_exit_2(
        _cli("import", str(m), "-o", str(out), "--input-shape", "zz=1,4"), "m.onnx", "zz", "a [N,4]"
    )
    assert not out.exists()
    _one_line_exit_2(_cli("import", str(m), "-o", str(out), "--input-shape", "a=2,7"), "m.onnx", "fixed at 4")


def test_import_onnx_fixes_the_shape_in_the_written_model(tmp_path):
    m = _two_inputs(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    r = _cli("import", str(m), "-o", str(out), "--input-shape", "a=2,4", "--json")
    assert r.exit_code == 0, r.output
    assert "input 'a' fixed to [2, 4]" in json.loads(r.stdout)["notes"]
    written = onnx.load(out)
    dims = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in written.graph.input]
    assert dims == [[2, 4], [2, 4]]
    assert [d.dim_value for d in written.graph.output[0].type.tensor_type.shape.dim] == [2, 3]


def test_inspect_run_and_verify_take_input_shape(tmp_path):
    m = _two_inputs(tmp_path / "m.onnx")
    r = _cli("inspect", str(m), "--input-shape", "a=5,4", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [i["shape"] for i in doc["inputs"]] == [[5, 4], [5, 4]] and doc["outputs"][0]["shape"] == [5, 3]
    _one_line_exit_2(_cli("inspect", str(m), "--input-shape", "q=5,4"), "m.onnx", "'q'")

    r = _cli("run", str(m), "--input-shape", "a=5,4", "--json")  # fixed batch 5: one run of 5
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["outputs"]["y"]["shape"] == [5, 3] and doc["samples"] == 5
    _one_line_exit_2(_cli("run", str(m), "--input-shape", "q=5,4"), "m.onnx", "'q'")

    r = _cli("verify", str(m), str(m), "--input-shape", "a=2,4", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["samples"] == 4 and doc["batching"] == {
        "mode": "fixed",
        "batch": 2,
        "runs": 2,
        "how": "2 run(s) of the fixed batch size 2",
    }
    _one_line_exit_2(_cli("verify", str(m), str(m), "--input-shape", "a=2,9"), "m.onnx", "fixed at 4")


def test_input_shape_on_a_bundle_is_checked(tmp_path):
    m = _two_inputs(tmp_path / "m.onnx")
    assert _cli("export", str(m), "-o", str(tmp_path / "b"), "-q").exit_code == 0
    _one_line_exit_2(
        _cli("inspect", str(tmp_path / "b"), "--input-shape", "nope=1,4"), str(tmp_path / "b"), "nope"
    )
    r = _cli("verify", str(m), str(tmp_path / "b"), "--input-shape", "a=3,4", "--samples", "3", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["samples"] == 3


def test_export_takes_input_shape_and_bakes_it_into_the_bundle(tmp_path):
    m = _two_inputs(tmp_path / "m.onnx")
    b = tmp_path / "b"
    r = _cli("export", str(m), "-o", str(b), "--input-shape", "a=2,4", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["notes"] == ["input 'a' fixed to [2, 4]"]
    r = _cli("inspect", str(b), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [i["shape"] for i in doc["inputs"]] == [[2, 4], [2, 4]]
    # the bundle runs at the baked size and matches the source model there
    r = _cli("verify", str(m), str(b), "--input-shape", "a=2,4", "--json")
    assert r.exit_code == 0, r.output
    _one_line_exit_2(
        _cli("export", str(m), "-o", str(tmp_path / "c"), "--input-shape", "q=2,4"), "m.onnx", "'q'"
    )
    assert not (tmp_path / "c").exists()
