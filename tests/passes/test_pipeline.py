"""The pass framework: spec strings, recipes, override precedence, reports and provenance."""

from __future__ import annotations

import json
from dataclasses import dataclass

import mconv.passes as P
import numpy as np
import onnx_ir as ir
import pytest
from mconv.errors import InputError
from mconv.passes.base import PASSES, Pass, PassReport, register_pass
from onnx import TensorProto, helper


class _Threshold(Pass):
    """Test-only pass: records the per-node config it resolves (does not change the model)."""

    @dataclass
    class Config:
        sparsity: float = 0.5
        bits: int = 8
        init: str = "linear"
        flag: bool = False

    def run(self, model, config, ctx) -> PassReport:
        seen = [{"node": n.name, "sparsity": ctx.config_for(n).sparsity} for n in model.graph]
        return self.report(False, tensors=seen)


@pytest.fixture(autouse=True, scope="module")
def _threshold_registered():
    """The test-only pass is in the registry while this module's tests run, and only then: every
    test module is imported by every worker, so a pass registered at import would show in other
    modules' listings of the registered passes."""
    register_pass("test-threshold")(_Threshold)
    yield
    PASSES.pop("test-threshold", None)


def _two_layer_model(build):
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h"], name="conv1"),
        helper.make_node("Conv", ["h", "w2"], ["h2"], name="conv2"),
        helper.make_node("Flatten", ["h2"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w3"], ["y"], name="fc8", transB=1),
        helper.make_node("Gemm", ["y", "w4"], ["z"], name="fc9", transB=1),
    ]
    rng = np.random.default_rng(0)
    inits = [
        ("w1", rng.random((2, 1, 1, 1), np.float32)),
        ("w2", rng.random((2, 2, 1, 1), np.float32)),
        ("w3", rng.random((3, 8), np.float32)),
        ("w4", rng.random((3, 3), np.float32)),
    ]
    return build(nodes, [("x", TensorProto.FLOAT, [1, 1, 2, 2])], [("z", TensorProto.FLOAT, [1, 3])], inits)


def test_parse_spec_reads_names_and_python_literal_options():
    specs = P.parse_spec("fold, dce,test-threshold(sparsity=0.9,bits=5,init='density',flag=True),fp16")
    assert [s.name for s in specs] == ["fold", "dce", "test-threshold", "fp16"]
    cfg = specs[2].resolve()
    assert (cfg.sparsity, cfg.bits, cfg.init, cfg.flag) == (0.9, 5, "density", True)


def test_parse_spec_accepts_list_values_and_widens_int_to_float():
    (spec,) = P.parse_spec("fp16(mode='all', block_list=['Softmax', 'Exp'])")
    assert spec.resolve().block_list == ["Softmax", "Exp"]
    (spec,) = P.parse_spec("test-threshold(sparsity=1)")
    assert isinstance(spec.resolve().sparsity, float)


def test_parse_spec_expands_a_recipe_name():
    assert [s.name for s in P.parse_spec("lossless")] == [s.name for s in P.load_recipe("lossless")]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("fold,nosuchpass", "unknown pass 'nosuchpass'"),
        ("fold(nosuchkey=1)", "unknown option 'nosuchkey'"),
        ("test-threshold(bits='five')", "must be an integer"),
        ("fp16(mode='quarter')", "'mode' is 'quarter'"),
        ("test-threshold(sparsity=0.9", "unbalanced"),
        ("test-threshold(0.9)", "options must be named"),
        ("test-threshold(init=open(0))", "not a literal"),  # a bare word is a string now (issue 13)
    ],
)
def test_bad_specs_raise_input_error_with_a_hint(spec, fragment):
    with pytest.raises(InputError) as info:
        P.parse_spec(spec)
    assert fragment in str(info.value)
    assert info.value.hint


def test_unknown_pass_hint_lists_valid_passes():
    with pytest.raises(InputError) as info:
        P.parse_spec("nosuchpass")
    assert "fold" in info.value.hint and "dce" in info.value.hint


def test_override_precedence_name_beats_type_beats_global(build):
    model = _two_layer_model(build)
    spec = P.make_spec(
        "test-threshold",
        {
            "sparsity": 0.9,
            "op_type": {"Conv": {"sparsity": 0.6}, "Gemm": {"bits": 5}},
            "op_name": {"fc8": {"sparsity": 0.75}, "conv2": {"sparsity": 0.1}},
        },
    )
    _, (report,) = P.run_pipeline(model, [spec])
    seen = {t["node"]: t["sparsity"] for t in report.tensors}
    assert seen == {"conv1": 0.6, "conv2": 0.1, "flat": 0.9, "fc8": 0.75, "fc9": 0.9}
    fc8 = next(n for n in model.graph if n.name == "fc8")
    assert P.resolve_config(spec, fc8).bits == 5  # type override still applies where name is silent


def test_recipe_toml_overrides_resolve_like_spec_overrides(tmp_path, build):
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        'description = "test"\n[[pass]]\nname = "test-threshold"\nsparsity = 0.9\n'
        "[pass.op_type.Conv]\nsparsity = 0.6\n[pass.op_name.fc8]\nsparsity = 0.75\n"
        '[[pass]]\nname = "dce"\n'
    )
    specs = P.load_recipe(recipe)
    assert [s.name for s in specs] == ["test-threshold", "dce"]
    _, reports = P.run_pipeline(_two_layer_model(build), specs)
    seen = {t["node"]: t["sparsity"] for t in reports[0].tensors}
    assert seen["conv1"] == 0.6 and seen["fc8"] == 0.75 and seen["fc9"] == 0.9


def test_recipe_errors_name_the_file_and_pass(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[pass]]\nname = "fold"\n[[pass]]\nname = "fold"\nmax_byts = 3\n')
    with pytest.raises(InputError) as info:
        P.load_recipe(bad)
    assert info.value.path == str(bad) and "#2" in info.value.where and "max_bytes" in info.value.hint
    bad.write_text("[[pass]\n")
    with pytest.raises(InputError, match="not a valid TOML"):
        P.load_recipe(bad)
    with pytest.raises(InputError, match="unknown recipe"):
        P.load_recipe("no-such-recipe")


def test_builtin_recipes_are_found_by_name():
    names = P.recipe_names()
    assert {"lossless", "fp16"} <= set(names)
    for name in names:
        assert all(s.name in PASSES for s in P.load_recipe(name))


def test_run_pipeline_reports_counts_and_records_provenance(build):
    nodes = [
        helper.make_node("Identity", ["x"], ["a"], name="id1"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    model, reports = P.run_pipeline(model, P.parse_spec("eliminate-identity,dce"))
    d = reports[0].as_dict()
    for key in (
        "name",
        "config",
        "nodes_before",
        "nodes_after",
        "params_before",
        "params_after",
        "bytes_before",
        "bytes_after",
        "seconds",
        "tensors",
        "notes",
    ):
        assert key in d
    assert (d["nodes_before"], d["nodes_after"]) == (2, 1)
    assert reports[0].modified and not reports[1].modified
    json.dumps([r.as_dict() for r in reports])
    history = json.loads(model.metadata_props["mconv.passes"])
    assert [h["name"] for h in history] == ["eliminate-identity", "dce"]
    assert history[0]["config"] == {}  # eliminate-identity ran with its defaults


def test_provenance_records_the_options_that_differ_from_the_defaults(build):
    model = _two_layer_model(build)
    model, _ = P.run_pipeline(model, P.parse_spec("eliminate-identity(dropout=false),dce"))
    history = json.loads(model.metadata_props["mconv.passes"])
    assert history == [
        {"name": "eliminate-identity", "config": {"dropout": False}},
        {"name": "dce", "config": {}},
    ]
    # the record replays to the very configs that ran
    ran = P.parse_spec("eliminate-identity(dropout=false),dce")
    for h, spec in zip(history, ran):
        assert P.PassSpec(h["name"], h["config"]).resolve() == spec.resolve()


def test_provenance_appends_across_runs_and_keeps_overrides(build):
    model = _two_layer_model(build)
    model, _ = P.run_pipeline(model, P.parse_spec("dce"))
    model, _ = P.run_pipeline(model, P.parse_spec("test-threshold(op_name={'fc8': {'bits': 4}})"))
    history = json.loads(model.metadata_props["mconv.passes"])
    assert [h["name"] for h in history] == ["dce", "test-threshold"]
    assert history[1]["config"]["op_name"] == {"fc8": {"bits": 4}}


def test_progress_callback_sees_every_pass(build):
    calls = []
    ctx = P.PassContext(progress=lambda desc, done, total: calls.append((desc, done, total)))
    model = _two_layer_model(build)
    P.run_pipeline(model, P.parse_spec("dce,eliminate-identity"), ctx)
    assert ("pass dce", 0, 2) in calls and ("pass eliminate-identity", 1, 2) in calls


def test_a_pass_may_return_a_new_model(build):
    @register_pass("test-replace")
    class _Replace(Pass):
        def run(self, model, config, ctx):
            graph = ir.Graph([], [], nodes=[], opset_imports={"": 17})
            return self.report(True, model=ir.Model(graph, ir_version=8))

    try:
        new, (report,) = P.run_pipeline(_two_layer_model(build), P.parse_spec("test-replace"))
        assert len(new.graph) == 0 and report.nodes_before == 5 and report.nodes_after == 0
    finally:
        PASSES.pop("test-replace")


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):

        @register_pass("fold")
        class _Other(Pass):
            pass
