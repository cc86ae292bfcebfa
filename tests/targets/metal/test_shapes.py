"""Symbolic dimensions on the metal target: refused with a hint naming ``--input-shape`` and the
input, baked by ``export --target metal --input-shape``; the shape arithmetic a torch export
writes (Shape -> Gather -> Concat -> Reshape) folds once the shapes are static; fp16-stored
weights (Cast nodes) are read as weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mconv.errors import InputError
from mconv.irio import save_onnx
from mconv.targets.metal import TARGET
from mconv.targets.metal.plan import build_plan, prepare
from mconv.targets.reference import ReferenceRunner
from metal_models import assert_fp16_close, make_model, needs_cxx
from onnx import helper


def torch_style_net(seed: int = 0):
    """Conv on [N, 2, H, W], then torch's flatten as ``x.view(x.size(0), -1)`` writes it, and a
    global average pool as Keras writes it (ReduceMean over axes 2, 3)."""
    rng = np.random.default_rng(seed)
    w = {
        "w": (rng.standard_normal((3, 2, 3, 3)) * 0.4).astype(np.float32),
        "b": (rng.standard_normal(3) * 0.1).astype(np.float32),
        "zero": np.array(0, np.int64),
        "minus1": np.array([-1], np.int64),
        "ax0": np.array([0], np.int64),
        "ax23": np.array([2, 3], np.int64),
    }
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        n("Relu", ["c"], ["r"], name="relu"),
        n("Shape", ["r"], ["shp"], name="shape"),
        n("Gather", ["shp", "zero"], ["n"], name="gather_n", axis=0),
        n("Unsqueeze", ["n", "ax0"], ["n1"], name="unsq"),
        n("Concat", ["n1", "minus1"], ["new_shape"], name="cat", axis=0),
        n("Reshape", ["r", "new_shape"], ["flat"], name="view"),
        n("ReduceMean", ["r", "ax23"], ["gap"], name="gap", keepdims=0),
    ]
    return make_model(nodes, [("x", ["N", 2, "H", "W"])], ["flat", "gap"], w, opset=18, name="torchish")


def test_symbolic_spatial_dims_are_refused_with_a_hint_naming_input_shape_and_the_input():
    with pytest.raises(InputError) as info:
        prepare(torch_style_net())
    line = info.value.line()
    assert "x (dimension 2 is symbolic: H)" in line and info.value.exit_code == 2
    assert "--input-shape x=1,2,H,W" in line


def test_fixed_shapes_reach_the_planner_and_the_shape_arithmetic_folds():
    from mconv.edit.input_shapes import fix_input_shapes

    model = torch_style_net()
    fix_input_shapes(model, {"x": [2, 2, 5, 4]})
    plan = build_plan(prepare(model), {"precision": "fp32"})
    assert plan.inputs[0]["shape"] == [2, 2, 5, 4]
    assert [layer.op for layer in plan.layers] == ["Conv+relu", "ReduceMean"]
    assert {o["name"]: o["shape"] for o in plan.outputs} == {"flat": [2, 60], "gap": [2, 3]}


@needs_cxx
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_export_cli_input_shape_bakes_symbolic_dims_and_the_bundle_agrees(tmp_path, precision):
    from mconv.cli.app import app
    from mconv.edit.input_shapes import fix_input_shapes
    from typer.testing import CliRunner

    src = tmp_path / "torchish.onnx"
    save_onnx(torch_style_net(), src)
    cli = CliRunner()
    refused = cli.invoke(app, ["export", str(src), "--target", "metal", "-o", str(tmp_path / "no")])
    assert refused.exit_code == 2, refused.output
    assert "--input-shape x=1,2,H,W" in refused.output and "torchish.onnx" in refused.output
    assert not (tmp_path / "no").exists()

    out = tmp_path / f"bundle_{precision}"
    args = ["export", str(src), "--target", "metal", "--precision", precision, "-o", str(out)]
    done = cli.invoke(app, [*args, "--input-shape", "x=1,2,6,5", "--json"])
    assert done.exit_code == 0, done.output
    plan = json.loads((out / "metal_plan.json").read_text())
    assert plan["inputs"][0]["shape"] == [1, 2, 6, 5]

    x = np.random.default_rng(3).standard_normal((1, 2, 6, 5)).astype(np.float32)
    fixed = torch_style_net()
    fix_input_shapes(fixed, {"x": [1, 2, 6, 5]})
    want = ReferenceRunner(fixed).run({"x": x})
    got = TARGET.load(out).run({"x": x})
    for name, ref in want.items():
        if precision == "fp32":
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
        else:
            assert_fp16_close(ref, got[name])


def test_input_shape_for_a_name_the_model_lacks_is_refused_by_export(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    src = tmp_path / "torchish.onnx"
    save_onnx(torch_style_net(), src)
    res = CliRunner().invoke(
        app,
        ["export", str(src), "--target", "metal", "-o", str(tmp_path / "o"), "--input-shape", "y=1,2,3,3"],
    )
    assert res.exit_code == 2 and "'y'" in res.output and "torchish.onnx" in res.output
    assert not (tmp_path / "o").exists()


@needs_cxx
def test_fp16_pass_casts_are_read_as_weights(tmp_path):
    from mconv.passes import parse_spec, run_pipeline

    model = torch_style_net(seed=4)
    half, _ = run_pipeline(model, parse_spec("fp16"))
    assert any(node.op_type == "Cast" for node in half.graph)
    x = np.random.default_rng(5).standard_normal((1, 2, 4, 4)).astype(np.float32)
    from mconv.edit.input_shapes import fix_input_shapes

    fix_input_shapes(half, {"x": [1, 2, 4, 4]})
    want = ReferenceRunner(half).run({"x": x})
    runner = TARGET.load(TARGET.export(half, tmp_path / "b", {"precision": "fp32"}))
    assert [layer.op for layer in runner.plan.layers] == ["Conv+relu", "ReduceMean"]
    got = runner.run({"x": x})
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
