"""Sweeps on Ray (issue 15 item 4): a local Ray with 2 workers gives the in-process report, value
for value; bad --workers/--ray values are one line and exit 2."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest
import ray  # in .[test]: a missing ray fails here, never skips
from mconv.drivers.analyze import analyze_sensitivity
from mconv.drivers.parallel import map_trials, worker_state
from mconv.errors import InputError
from mconv.irio import from_proto
from onnx import TensorProto, helper, numpy_helper


def conv_proto(seed: int) -> onnx.ModelProto:
    """x[N,2,8,8] -> conv (4x2x3x3) -> Relu -> conv (3x4x3x3) -> y[N,3,4,4]: not class scores, so
    the metric is cosine, a float the workers must reproduce bit for bit."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((3, 4, 3, 3)).astype(np.float32), "w2"),
    ]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def gemm_proto(seed: int) -> onnx.ModelProto:
    """x[N,8] -> fc1 (16x8) -> Relu -> fc2 (4x16) -> logits[N,4] (class scores)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2"], ["logits"], name="fc2", transB=1),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((4, 16)).astype(np.float32), "w2"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of 2 workers for the module (map_trials leaves a Ray it did not start)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def test_a_conv_sweep_on_two_workers_is_the_in_process_report(local_ray):
    rng = np.random.default_rng(5)
    data = {"x": rng.standard_normal((40, 2, 8, 8)).astype(np.float32)}
    kw = dict(sweep=(0.3, 0.6, 0.9), bits=(4, 2), max_drop=0.02)
    here = analyze_sensitivity(from_proto(conv_proto(1)), data, **kw)
    there = analyze_sensitivity(from_proto(conv_proto(1)), data, workers=2, **kw)
    assert here.metric == "cosine" and len(here.layers) == 2
    assert json.dumps(there.as_dict(), sort_keys=True) == json.dumps(here.as_dict(), sort_keys=True)
    # the sweep measured something: a 90%-pruned layer drifts
    assert max(p.drop for layer in here.layers for p in layer.sweep) > 1e-3


def test_a_labelled_sweep_on_two_workers_is_the_in_process_report(local_ray):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 300).astype(np.int64)
    here = analyze_sensitivity(from_proto(gemm_proto(2)), {"x": x, "labels": labels}, sweep=(0.5, 0.9))
    there = analyze_sensitivity(
        from_proto(gemm_proto(2)), {"x": x, "labels": labels}, sweep=(0.5, 0.9), workers=2
    )
    assert here.metric == "accuracy"
    assert there.as_dict() == here.as_dict()


def _pid_and_build_count(shared, item):
    import os

    state = worker_state(shared, lambda s: {"builds": 1})
    state["calls"] = state.get("calls", 0) + 1
    return item * item, os.getpid(), state["calls"]


def test_results_keep_the_items_order_and_workers_build_their_state_once(local_ray):
    out = map_trials(_pid_and_build_count, {"x": 1}, list(range(12)), workers=2)
    assert [r[0] for r in out] == [i * i for i in range(12)]
    pids = {r[1] for r in out}
    assert 1 <= len(pids) <= 2  # two worker processes at most
    # one state per process: its call counter runs 1..k over that process's tasks
    for pid in pids:
        counts = sorted(r[2] for r in out if r[1] == pid)
        assert counts == list(range(1, len(counts) + 1))
    assert map_trials(_pid_and_build_count, {"x": 1}, list(range(5)))[3][0] == 9  # in-process


@pytest.mark.parametrize(
    "workers, address, words",
    [(-1, None, "negative"), (2, "auto", "both given")],
)
def test_bad_worker_options_are_input_errors(workers, address, words):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((10, 8)).astype(np.float32)
    with pytest.raises(InputError, match=words):
        analyze_sensitivity(from_proto(gemm_proto(3)), {"x": x}, workers=workers, ray_address=address)


def test_without_ray_installed_the_refusal_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(InputError, match="Ray is not installed") as info:
        map_trials(_pid_and_build_count, {}, [1], workers=2)
    assert "mconv[ray]" in str(info.value.hint)


def test_cli_analyze_with_workers_matches_the_plain_run_and_refuses_bad_values(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    rng = np.random.default_rng(8)
    model = tmp_path / "tiny.onnx"
    onnx.save(gemm_proto(4), model)
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.standard_normal((64, 8)).astype(np.float32))
    runner = CliRunner()
    args = ["analyze", str(model), "--data", str(data), "--sweep", "0.5,0.8", "--json"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    on_ray = runner.invoke(app, [*args, "--workers", "2"])  # starts and stops its own local Ray
    assert on_ray.exit_code == 0, on_ray.output
    assert json.loads(on_ray.stdout) == json.loads(plain.stdout)
    assert len(json.loads(plain.stdout)["layers"]) == 2
    bad = runner.invoke(app, [*args, "--workers", "-2"])
    assert bad.exit_code == 2 and "--workers" in bad.output and "Traceback" not in bad.output


def test_a_lazily_loaded_model_reaches_the_workers_with_its_weights(tmp_path, monkeypatch):
    """A large single-file model loads lazily: its weights stay references into the file, named
    relative to its folder. Shipped to Ray as a plain serialisation, a worker in another folder
    read 'resnet50.onnx' from its own cwd (exit 3 on the H200 host). The bytes sent now carry
    the weights: the lazily loaded model's report on 2 workers is the in-process one's."""
    from mconv.cli.app import app
    from mconv.irio import load_onnx, self_contained_bytes
    from typer.testing import CliRunner

    rng = np.random.default_rng(9)
    models = tmp_path / "models"
    models.mkdir()
    onnx.save(conv_proto(3), models / "convs.onnx")
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.standard_normal((16, 2, 8, 8)).astype(np.float32))
    monkeypatch.setattr("mconv.irio.LAZY_LOAD_THRESHOLD", 1)
    monkeypatch.setattr("mconv.irio.LAZY_TENSOR_BYTES", 64)  # w1, w2 become references
    lazy = load_onnx(models / "convs.onnx")
    assert isinstance(lazy.graph.initializers["w1"].const_value, ir_external())
    # the self-contained bytes hold the weights: they parse and read with no folder at all
    alone = onnx.load_from_string(self_contained_bytes(lazy))
    assert not any(t.external_data for t in alone.graph.initializer)
    assert np.array_equal(
        numpy_helper.to_array(alone.graph.initializer[0]),
        numpy_helper.to_array(conv_proto(3).graph.initializer[0]),
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    args = ["analyze", str(models / "convs.onnx"), "--data", str(data), "--sweep", "0.5,0.8", "--json"]
    runner = CliRunner()
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    on_ray = runner.invoke(app, [*args, "--workers", "2"])
    assert on_ray.exit_code == 0, on_ray.output
    assert json.loads(on_ray.stdout) == json.loads(plain.stdout)


def ir_external():
    import onnx_ir as ir

    return ir.ExternalTensor
