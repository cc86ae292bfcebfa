"""optimize, import and export check what they wrote: a model that ONNX Runtime refuses although
its input was accepted is mconv's bug, reported as exit 3 in one line (issue 12, item 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from mconv.cli.app import app
from mconv.passes.base import PASSES, Pass
from onnx import TensorProto, helper
from typer.testing import CliRunner

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "digits_mlp.onnx"


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


class _Breaks(Pass):
    """A pass with a bug: it renames the first Relu to an op no runtime has."""

    def run(self, model, config, ctx):
        for node in model.graph:
            if node.op_type == "Relu":
                node.op_type = "NoSuchOp"
                break
        return self.report(True)


def _register_breaking_pass(monkeypatch) -> None:
    monkeypatch.setitem(PASSES, "test-breaks", _Breaks)
    _Breaks.name = "test-breaks"


def test_optimize_that_breaks_a_valid_model_is_mconvs_bug(tmp_path, monkeypatch):
    _register_breaking_pass(monkeypatch)
    r = _cli("optimize", str(FIXTURE), "--passes", "test-breaks", "-o", str(tmp_path / "o.onnx"), "-q")
    assert r.exit_code == 3, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("internal error: "), r.output
    assert "o.onnx" in lines[0] and "bug in mconv" in lines[0] and "NoSuchOp" in lines[0]


def test_optimize_of_a_model_ort_refuses_itself_makes_no_such_claim(tmp_path, monkeypatch):
    # The input already uses an op ONNX Runtime lacks (a custom domain): its output may too.
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Custom", ["r"], ["y"], domain="acme")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    src = tmp_path / "custom.onnx"
    onnx.save(m, src)
    r = _cli("optimize", str(src), "--passes", "dce", "-o", str(tmp_path / "o.onnx"))
    assert r.exit_code == 0, r.output


def test_export_and_import_pass_the_check_on_a_valid_model(tmp_path):
    assert _cli("import", str(FIXTURE), "-o", str(tmp_path / "i.onnx"), "-q").exit_code == 0
    r = _cli("optimize", str(tmp_path / "i.onnx"), "--recipe", "fp16", "-o", str(tmp_path / "h.onnx"), "-q")
    assert r.exit_code == 0, r.output
    r = _cli("export", str(tmp_path / "h.onnx"), "--target", "cpu", "-o", str(tmp_path / "b"), "-q")
    assert r.exit_code == 0, r.output


def test_the_check_itself_tells_a_refused_file(tmp_path):
    from mconv.targets.validity import onnx_refusal

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    good = tmp_path / "good.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), good)
    assert onnx_refusal(good) is None
    g.node[0].op_type = "Gemm"
    g.node[0].attribute.extend([helper.make_attribute("transA", 1)])  # x^T is [4, 1]: K mismatch
    g.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    bad = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), bad)
    assert onnx_refusal(bad) is not None
