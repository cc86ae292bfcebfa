"""The numeric gates catch a uniform scale error, which cosine cannot see.

A kernel made 6% low (WebGPU's ReduceMean divided by N and multiplied by 0.94, or a runner whose
outputs are scaled by 0.94) keeps cosine at 1.0 and every class score in its order. `mconv
verify`'s default gates, the tests' gate (``tests/_gates.py``) and the corpus benchmark's gate
(``bench/zoo.py``) must fail it; the same model unmutated passes each of them (so none of these
checks passes by construction).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.cli.app import app
from onnx import TensorProto, helper
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _gates import TOLERANCES, assert_close, figures  # noqa: E402
from _system import needs_webgpu_adapter  # noqa: E402

SCALE = 0.94


def _reduce_mean_model(path: Path) -> Path:
    """x [N, 4, 6] -> ReduceMean over the last axis -> y [N, 4] (2-D: verify's top-1 applies)."""
    node = helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=[2], keepdims=0)
    graph = helper.make_graph(
        [node],
        "mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _feeds(path: Path) -> Path:
    x = np.random.default_rng(0).uniform(0.5, 2.0, (8, 4, 6)).astype(np.float32)  # means far from 0
    np.savez(path, x=x)
    return path


def _verify(ref: Path, cand: Path, data: Path) -> tuple[int, dict]:
    r = CliRunner().invoke(app, ["verify", str(ref), str(cand), "--data", str(data), "--json"])
    return r.exit_code, json.loads(r.stdout)


def _scaled_cpu_runs(monkeypatch) -> None:
    """The cpu target's runner returns every float output 6% low."""
    from mconv.targets.cpu import CpuRunner

    run = CpuRunner.run

    def low(self, feeds):
        return {
            k: (v * SCALE).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in run(self, feeds).items()
        }

    monkeypatch.setattr(CpuRunner, "run", low)


def test_verify_defaults_fail_a_uniform_scale_error_that_cosine_passes(tmp_path, monkeypatch):
    model = _reduce_mean_model(tmp_path / "mean.onnx")
    data = _feeds(tmp_path / "x.npz")
    bundle = tmp_path / "cpu"
    r = CliRunner().invoke(app, ["export", str(model), "--target", "cpu", "-o", str(bundle), "-q"])
    assert r.exit_code == 0, r.output

    rc, doc = _verify(model, bundle, data)  # unmutated: passes the defaults
    assert rc == 0 and doc["passed"] is True and doc["outputs"]["y"]["rel_l2"] < 1e-6, doc

    _scaled_cpu_runs(monkeypatch)
    rc, doc = _verify(model, bundle, data)
    y = doc["outputs"]["y"]
    assert y["cosine"] > 0.999999 and y["top1_agreement"] == 1.0  # what the old defaults checked
    assert abs(y["rel_l2"] - (1 - SCALE)) < 1e-3, y
    assert rc == 1 and doc["passed"] is False and doc["gates_source"] == "default", doc
    assert doc["failures"] == {"y": [f"rel_l2 {y['rel_l2']:.3g} > 0.03"]}, doc["failures"]
    r = CliRunner().invoke(app, ["verify", str(model), str(bundle), "--data", str(data)])
    assert r.exit_code == 1 and "rel_l2" in r.output, r.output  # the one-line failure names it


@pytest.mark.parametrize("precision", sorted(TOLERANCES))
def test_the_tests_gate_fails_a_uniform_scale_error(precision):
    ref = np.random.default_rng(1).standard_normal((3, 17)).astype(np.float32)
    assert_close(ref, ref.copy(), precision)
    f = figures(ref, ref * SCALE)
    assert f.cosine > 0.999999
    with pytest.raises(AssertionError, match="relative L2 error 0.06"):
        assert_close(ref, ref * SCALE, precision)
    for edit in (lambda g: g.__setitem__((0, 0), np.nan), lambda g: g.__setitem__((1, 2), np.inf)):
        bad = ref.copy()
        edit(bad)
        with pytest.raises(AssertionError):
            assert_close(ref, bad, precision)


def _zoo():
    spec = importlib.util.spec_from_file_location("mconv_bench_zoo_gates", ROOT / "bench" / "zoo.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_corpus_gates_fail_a_uniform_scale_error():
    zoo = _zoo()
    ref = np.random.default_rng(2).standard_normal((2, 50)).astype(np.float32)
    labels = np.array([3, 4], np.int64)
    for bound in (zoo.REF_REL, *zoo.TARGET_REL.values()):
        cos, _, why = zoo._compare([ref.copy(), labels], [ref, labels], max_rel=bound)
        assert cos > 0.999999 and not why
        cos, _, why = zoo._compare([ref * SCALE, labels], [ref, labels], max_rel=bound)
        assert cos > 0.999999 and "output 0: relative L2 error 0.06" in why, (bound, why)


@needs_webgpu_adapter
def test_a_webgpu_reduce_mean_made_6_percent_low_fails_verify_and_the_webgpu_tests(tmp_path, monkeypatch):
    from mconv.irio import load_onnx
    from mconv.targets.webgpu import wgsl

    sys.path.insert(0, str(ROOT / "tests" / "targets" / "webgpu"))
    from test_webgpu import _check

    model = _reduce_mean_model(tmp_path / "mean.onnx")
    data = _feeds(tmp_path / "x.npz")
    feeds = {"x": np.load(data)["x"]}

    def export(dest: Path) -> Path:
        r = CliRunner().invoke(app, ["export", str(model), "--target", "webgpu", "-o", str(dest), "-q"])
        assert r.exit_code == 0, r.output
        return dest

    (tmp_path / "good").mkdir()
    _check(load_onnx(str(model)), tmp_path / "good", feeds)  # unmutated: the test's gate passes
    rc, doc = _verify(model, export(tmp_path / "good_bundle"), data)
    assert rc == 0 and doc["passed"] is True, doc

    init, step, final = wgsl._FORMS["ReduceMean"]
    monkeypatch.setitem(wgsl._FORMS, "ReduceMean", (init, step, f"({final}) * {SCALE}f"))
    (tmp_path / "bad").mkdir()
    with pytest.raises(AssertionError, match="relative L2 error 0.06"):
        _check(load_onnx(str(model)), tmp_path / "bad", feeds)
    rc, doc = _verify(model, export(tmp_path / "bad_bundle"), data)
    assert doc["outputs"]["y"]["cosine"] > 0.999999, doc
    assert rc == 1 and list(doc["failures"]["y"]) == [f"rel_l2 {doc['outputs']['y']['rel_l2']:.3g} > 0.03"]
