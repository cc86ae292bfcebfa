"""fp16(mode=auto) with --data (issue 16 item 4) and bfloat16 (modes bf16, auto with dtype)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from mconv import api
from mconv.errors import InputError
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _overflow_model(path, seed: int, scale: float = 400.0):
    """x @ w1 reaches ~1e5 (> 65504, float16's largest) for inputs of std 20; the rest is tame."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((16, 32)) * scale).astype(np.float32)
    w2 = (rng.standard_normal((32, 8)) * 0.1).astype(np.float32)
    g = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w1"], ["a"], name="big"),
            h.make_node("Mul", ["a", "s"], ["b"], name="scale"),
            h.make_node("Relu", ["b"], ["c"], name="relu"),
            h.make_node("MatMul", ["c", "w2"], ["d"], name="mm2"),
            h.make_node("Softmax", ["d"], ["y"], name="softmax", axis=-1),
        ],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 16])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 8])],
        [nh.from_array(w1, "w1"), nh.from_array(w2, "w2"), nh.from_array(np.array(1e-3, np.float32), "s")],
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), path)
    x = (rng.standard_normal((8, 16)) * 20).astype(np.float32)
    return x


def _fp32_nodes(path) -> set[str]:
    m = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {v.name: v.type.tensor_type.elem_type for v in [*m.graph.value_info, *m.graph.output]}
    return {n.name for n in m.graph.node if n.op_type != "Cast" and types.get(n.output[0]) == T.FLOAT}


def _ref(path, x):
    runner = api.open(path)  # the reference executor rounds every op's output to its type
    return np.asarray(runner.run({"x": x})["y"], dtype=np.float64)


def test_auto_keeps_exactly_the_overflowing_nodes(tmp_path):
    x = _overflow_model(tmp_path / "m.onnx", seed=1)
    np.savez(tmp_path / "d.npz", x=x)
    ref = _ref(tmp_path / "m.onnx", x)
    # mode all runs MatMul in float16: its output overflows and the result is not finite
    api.optimize(tmp_path / "m.onnx", passes="fp16(mode=all)", output=tmp_path / "all.onnx")
    assert not np.isfinite(_ref(tmp_path / "all.onnx", x)).all()
    res = api.optimize(
        tmp_path / "m.onnx", passes="fp16(mode=auto)", data=tmp_path / "d.npz", output=tmp_path / "a.onnx"
    )
    auto = res.reports[0].tensors[-1]
    # big overflows; scale's input (big's float32 output) would overflow when cast down for it
    assert auto["kept_float32"] == ["big", "scale"]
    assert _fp32_nodes(tmp_path / "a.onnx") == {"big", "scale"}
    got = _ref(tmp_path / "a.onnx", x)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.01
    assert auto["output_rel_error"] < 0.01


def test_auto_keeps_nothing_when_nothing_overflows(tmp_path):
    x = _overflow_model(tmp_path / "m.onnx", seed=2, scale=1.0)
    np.savez(tmp_path / "d.npz", x=x)
    res = api.optimize(
        tmp_path / "m.onnx", passes="fp16(mode=auto)", data=tmp_path / "d.npz", output=tmp_path / "a.onnx"
    )
    assert res.reports[0].tensors[-1]["kept_float32"] == []
    # mode all keeps Softmax (its default block list); auto sees that it need not
    assert _fp32_nodes(tmp_path / "a.onnx") == set()
    api.optimize(tmp_path / "m.onnx", passes="fp16(mode=all)", output=tmp_path / "all.onnx")
    assert _fp32_nodes(tmp_path / "all.onnx") == {"softmax"}
    got, ref = _ref(tmp_path / "a.onnx", x), _ref(tmp_path / "m.onnx", x)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.01


def test_auto_tolerance_escalates_to_the_nodes_that_lose_most(tmp_path):
    x = _overflow_model(tmp_path / "m.onnx", seed=3, scale=1.0)
    np.savez(tmp_path / "d.npz", x=x)
    # a tolerance below float16's rounding: every node that rounds is kept, output error ~0
    res = api.optimize(
        tmp_path / "m.onnx",
        passes="fp16(mode=auto,tolerance=1e-7)",
        data=tmp_path / "d.npz",
        output=tmp_path / "a.onnx",
    )
    kept = res.reports[0].tensors[-1]["kept_float32"]
    assert {"big", "mm2"} <= set(kept)


def test_bf16_mode_and_auto_bfloat16(tmp_path):
    x = _overflow_model(tmp_path / "m.onnx", seed=4)
    np.savez(tmp_path / "d.npz", x=x)
    ref = _ref(tmp_path / "m.onnx", x)
    for spec in ("fp16(mode=bf16)", "fp16(mode=auto,dtype=bfloat16)"):
        res = api.optimize(
            tmp_path / "m.onnx", passes=spec, data=tmp_path / "d.npz", output=tmp_path / "b.onnx"
        )
        m = onnx.load(str(tmp_path / "b.onnx"))
        assert {t.data_type for t in m.graph.initializer} == {T.BFLOAT16}
        assert {p.key: p.value for p in m.metadata_props}["mconv.precision"] == "bfloat16"
        got = _ref(tmp_path / "b.onnx", x)  # bfloat16's range is float32's: no overflow, 8 bits of mantissa
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.05, spec
    assert res.reports[0].tensors[-1]["kept_float32"] == []


def test_auto_without_data_is_one_line(tmp_path):
    _overflow_model(tmp_path / "m.onnx", seed=5)
    with pytest.raises(InputError, match="needs data") as err:
        api.optimize(tmp_path / "m.onnx", passes="fp16(mode=auto)", output=tmp_path / "a.onnx")
    assert "m.onnx" in err.value.line()


def test_auto_data_without_the_input_names_it(tmp_path):
    _overflow_model(tmp_path / "m.onnx", seed=6)
    data = {"other": np.zeros((2, 16), np.float32), "labels": np.zeros(2, np.int64)}
    with pytest.raises(InputError) as err:
        api.optimize(tmp_path / "m.onnx", passes="fp16(mode=auto)", data=data, output=tmp_path / "a.onnx")
    line = err.value.line()
    assert "no array for input(s) x" in line and "m.onnx" in line and "other" in line


def test_cli_auto(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    x = _overflow_model(tmp_path / "m.onnx", seed=7)
    np.savez(tmp_path / "d.npz", x=x)
    r = CliRunner().invoke(
        app,
        ["optimize", str(tmp_path / "m.onnx"), "--passes", "fp16(mode=auto)", "--data", str(tmp_path / "d.npz"),
         "-o", str(tmp_path / "a.onnx"), "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert _fp32_nodes(tmp_path / "a.onnx") == {"big", "scale"}
    r = CliRunner().invoke(
        app,
        ["optimize", str(tmp_path / "m.onnx"), "--passes", "fp16(mode=auto)", "-o", str(tmp_path / "b.onnx")],
    )
    assert r.exit_code == 2
    assert "needs data" in r.output and "m.onnx" in r.output


def test_auto_on_a_model_with_external_data(tmp_path):
    x = _overflow_model(tmp_path / "inline.onnx", seed=8)
    m = onnx.load(str(tmp_path / "inline.onnx"))
    onnx.save(
        m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.onnx.data", size_threshold=0
    )
    np.savez(tmp_path / "d.npz", x=x)
    res = api.optimize(
        tmp_path / "m.onnx", passes="fp16(mode=auto)", data=tmp_path / "d.npz", output=tmp_path / "a.onnx"
    )
    assert res.reports[0].tensors[-1]["kept_float32"] == ["big", "scale"]


def test_auto_returns_an_absorbed_overflow_to_half(tmp_path):
    """A causal mask filled with -1e30 (as exporters write attention masks) overflows to -inf in
    float16, which the node-by-node screen flags; the Softmax after it absorbs the -inf, so the
    end-to-end check (rule 10 c) returns the node to half and nothing stays float32."""
    rng = np.random.default_rng(7)
    mask = np.tril(np.ones((6, 6), bool))
    g = h.make_graph(
        [
            h.make_node("Where", ["mask", "x", "neg"], ["filled"], name="fill"),
            h.make_node("Softmax", ["filled"], ["y"], name="softmax", axis=-1),
        ],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [4, 6, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 6, 6])],
        [nh.from_array(mask, "mask"), nh.from_array(np.array(-1e30, np.float32), "neg")],
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), str(tmp_path / "m.onnx"))
    x = rng.standard_normal((4, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    res = api.optimize(
        tmp_path / "m.onnx", passes="fp16(mode=auto)", data=tmp_path / "d.npz", output=tmp_path / "a.onnx"
    )
    auto = res.reports[0].tensors[-1]
    # all in half is within the tolerance (rule 10, step 0): one run, nothing screened
    assert auto["kept_float32"] == [] and auto["rounds"] == 1
    assert "all in half is within the tolerance end to end" in res.reports[0].notes[1]
    got, ref = _ref(tmp_path / "a.onnx", x), _ref(tmp_path / "m.onnx", x)
    assert np.isfinite(got).all() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.01


def test_auto_returns_an_absorbed_overflow_to_half_beside_a_real_one(tmp_path):
    """The causal mask of the test above beside the overflowing MatMul of _overflow_model: all in
    half overflows (step 0 fails), the screen flags the mask's Where and the MatMul chain, and the
    one-at-a-time check of rule 10 c returns the Where to half and keeps the chain."""
    rng = np.random.default_rng(9)
    w1 = (rng.standard_normal((6, 32)) * 400).astype(np.float32)
    w2 = (rng.standard_normal((32, 6)) * 0.1).astype(np.float32)
    mask = np.tril(np.ones((6, 6), bool))
    g = h.make_graph(
        [
            h.make_node("Where", ["mask", "x", "neg"], ["filled"], name="fill"),
            h.make_node("Softmax", ["filled"], ["p"], name="softmax", axis=-1),
            h.make_node("MatMul", ["x", "w1"], ["a"], name="big"),
            h.make_node("Mul", ["a", "s"], ["b"], name="scale"),
            h.make_node("Relu", ["b"], ["c"], name="relu"),
            h.make_node("MatMul", ["c", "w2"], ["d"], name="mm2"),
            h.make_node("Add", ["p", "d"], ["y"], name="join"),
        ],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [4, 6, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 6, 6])],
        [
            nh.from_array(mask, "mask"),
            nh.from_array(np.array(-1e30, np.float32), "neg"),
            nh.from_array(w1, "w1"),
            nh.from_array(w2, "w2"),
            nh.from_array(np.array(1e-3, np.float32), "s"),
        ],
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), str(tmp_path / "m.onnx"))
    x = (rng.standard_normal((4, 6, 6)) * 20).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    res = api.optimize(
        tmp_path / "m.onnx", passes="fp16(mode=auto)", data=tmp_path / "d.npz", output=tmp_path / "a.onnx"
    )
    auto = res.reports[0].tensors[-1]
    assert auto["kept_float32"] == ["big", "scale"] and auto["rounds"] > 1
    assert "3 flagged by their own error or overflow, 1 of them returned to half" in res.reports[0].notes[1]
    got, ref = _ref(tmp_path / "a.onnx", x), _ref(tmp_path / "m.onnx", x)
    assert np.isfinite(got).all() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.01


def test_the_overflow_the_trials_measure_is_not_warned_about(tmp_path):
    """``-q`` on a graph whose float16 trial overflows prints nothing: numpy's overflow
    warnings inside the trials are the measurement, not news for the user."""
    import subprocess
    import sys

    x = _overflow_model(tmp_path / "m.onnx", seed=9)
    np.savez(tmp_path / "d.npz", x=x)
    r = subprocess.run(
        [sys.executable, "-m", "mconv", "optimize", str(tmp_path / "m.onnx"), "--passes", "fp16(mode=auto)",
         "--data", str(tmp_path / "d.npz"), "-o", str(tmp_path / "a.onnx"), "-q"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and r.stdout == ""
    assert _fp32_nodes(tmp_path / "a.onnx") == {"big", "scale"}
