"""The Linux harness: plan checks, batching, the compiler requirement, and the CLI around it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from mconv.errors import InputError, IntegrityError
from mconv.irio import to_proto
from mconv.targets.metal import TARGET, read_plan
from mconv.targets.metal.harness import check_plan, compile_harness
from metal_models import make_model, needs_cxx, run_ort
from onnx import helper


def small_model():
    rng = np.random.default_rng(0)
    w = {
        "w": (rng.standard_normal((3, 2, 3, 3)) * 0.3).astype(np.float32),
        "fc": rng.standard_normal((27, 4)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc"),
    ]
    return make_model(nodes, [("x", ["N", 2, 5, 5])], ["y"], w, name="small")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return TARGET.export(small_model(), tmp_path_factory.mktemp("h") / "small", {"precision": "fp32"})


def _kernels(bundle):
    return (bundle.root / "Sources/Small/kernels.metal").read_text()


def test_check_plan_refuses_a_plan_whose_bindings_do_not_match_the_kernel(bundle):
    plan = read_plan(bundle)
    check_plan(plan, _kernels(bundle))  # the exported plan passes
    bad = dataclasses.replace(
        plan, layers=[dataclasses.replace(plan.layers[0], bindings=plan.layers[0].bindings[:-1])]
    )
    with pytest.raises(IntegrityError, match="layer 0 .*2 bindings for 3 buffer parameters"):
        check_plan(bad, _kernels(bundle))
    renamed = dataclasses.replace(plan, layers=[dataclasses.replace(plan.layers[0], kernel="L9_nothing")])
    with pytest.raises(IntegrityError, match="kernel not found"):
        check_plan(renamed, _kernels(bundle))
    huge = dataclasses.replace(plan, layers=[dataclasses.replace(plan.layers[0], grid=[100, 100, 100])])
    with pytest.raises(IntegrityError, match="more threads than output"):
        check_plan(huge, _kernels(bundle))


@needs_cxx
def test_batch_of_three_runs_as_three_samples_of_the_batch_one_plan(bundle):
    x = np.random.default_rng(1).standard_normal((3, 2, 5, 5)).astype(np.float32)
    got = TARGET.load(bundle).run({"x": x})["y"]
    expected = run_ort(small_model(), {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert bundle.manifest["inputs"][0]["shape"] == ["batch", 2, 5, 5]


@needs_cxx
def test_feed_of_the_wrong_shape_is_refused_naming_the_input(bundle):
    with pytest.raises(InputError, match="input 'x'.*shape \\[1, 2, 6, 5\\]"):
        TARGET.load(bundle).run({"x": np.zeros((1, 2, 6, 5), np.float32)})


def test_without_a_cxx_compiler_loading_says_so_in_one_line(bundle, monkeypatch):
    monkeypatch.setenv("MCONV_CXX", "no-such-compiler-mconv")
    plan = read_plan(bundle)
    with pytest.raises(InputError, match="needs a C\\+\\+ compiler \\(g\\+\\+ or clang\\+\\+\\)"):
        compile_harness(plan, _kernels(bundle))


def _mconv(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=300,
    )


@needs_cxx
def test_cli_export_then_verify_metal_bundle_passes_and_without_compiler_exits_2(tmp_path):
    model_path = tmp_path / "small.onnx"
    onnx.save(to_proto(small_model()), model_path)
    out = tmp_path / "bundle"
    r = _mconv("export", str(model_path), "-o", str(out), "--target", "metal", "--precision", "fp32")
    assert r.returncode == 0, r.stderr
    r = _mconv("verify", str(model_path), str(out), "--samples", "2", "--rtol", "1e-4", "--atol", "1e-5")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _mconv("verify", str(model_path), str(out), env={"MCONV_CXX": "no-such-compiler-mconv"})
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "g++ or clang++" in err[0] and "Traceback" not in r.stderr
