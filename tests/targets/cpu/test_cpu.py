"""The cpu target: export to a bundle, load into ONNX Runtime, and compare with ORT on the original."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.bundle import TensorSpec, load_bundle, zip_bundle
from mconv.errors import InputError, IntegrityError
from mconv.irio import from_proto
from mconv.targets import cpu, get_target
from onnx import TensorProto, helper, numpy_helper

X = np.random.default_rng(3).standard_normal((3, 2, 4, 4)).astype(np.float32)


def conv_gemm(seed: int = 0, fp16: bool = False) -> onnx.ModelProto:
    """x[N,2,4,4] -> Conv(4, 3x3, pad 1) -> Relu -> Flatten -> Gemm(5) -> y[N,5]."""
    rng = np.random.default_rng(seed)
    weights = {
        "conv.W": rng.standard_normal((4, 2, 3, 3)).astype(np.float32),
        "conv.B": rng.standard_normal(4).astype(np.float32),
        "fc.W": rng.standard_normal((5, 64)).astype(np.float32),
        "fc.B": rng.standard_normal(5).astype(np.float32),
    }
    if fp16:
        weights = {k: v.astype(np.float16).astype(np.float32) for k, v in weights.items()}
    nodes = [
        helper.make_node("Conv", ["x", "conv.W", "conv.B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.W", "fc.B"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "convgemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _ort_original(proto: onnx.ModelProto, path: Path, x: np.ndarray = X) -> np.ndarray:
    onnx.save(proto, path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_registry_hands_out_the_cpu_target():
    assert get_target("cpu") is cpu.TARGET and cpu.TARGET.name == "cpu"


def test_exported_bundle_runs_like_ort_on_the_original_file(tmp_path):
    proto = conv_gemm()
    expected = _ort_original(proto, tmp_path / "orig.onnx")
    bundle = cpu.TARGET.export(from_proto(proto), tmp_path / "bundle", {})
    runner = cpu.TARGET.load(load_bundle(tmp_path / "bundle"))
    assert runner.inputs == [TensorSpec("x", "float32", ("N", 2, 4, 4))]
    assert runner.outputs == ["y"]
    got = runner.run({"x": X})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    assert bundle.manifest["outputs"] == [{"name": "y", "dtype": "float32", "shape": ["N", 5]}]


def test_model_onnx_has_no_initializers_and_the_same_graph(tmp_path):
    proto = conv_gemm()
    cpu.export(from_proto(proto), tmp_path / "b", {})
    stored = onnx.load(tmp_path / "b" / "model.onnx")
    assert len(stored.graph.initializer) == 0
    assert sorted(tmp_path.joinpath("b").iterdir()) == sorted(
        tmp_path / "b" / n for n in ("manifest.json", "model.onnx", "weights.mcw")
    )

    def strip(n: onnx.NodeProto) -> tuple:
        return (
            n.op_type,
            n.name,
            list(n.input),
            list(n.output),
            [a.SerializeToString() for a in n.attribute],
        )

    assert [strip(n) for n in stored.graph.node] == [strip(n) for n in proto.graph.node]
    assert [i.SerializeToString() for i in stored.graph.input] == [
        i.SerializeToString() for i in proto.graph.input
    ]
    assert [o.SerializeToString() for o in stored.graph.output] == [
        o.SerializeToString() for o in proto.graph.output
    ]
    assert stored.opset_import == proto.opset_import
    # and the weights are in the container, bit for bit
    with load_bundle(tmp_path / "b").container() as c:
        for t in proto.graph.initializer:
            assert c.array(t.name).tobytes() == numpy_helper.to_array(t).tobytes()


def test_export_twice_gives_identical_bytes_for_every_file(tmp_path):
    model = from_proto(conv_gemm())
    cpu.export(model, tmp_path / "one", {})
    cpu.export(model, tmp_path / "two", {})
    cpu.export(model, tmp_path / "one", {})  # over an existing bundle
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_export_in_another_process_gives_identical_bytes(tmp_path):
    onnx.save(conv_gemm(), tmp_path / "m.onnx")
    script = textwrap.dedent("""
        import sys
        from mconv.irio import load_onnx
        from mconv.targets import cpu
        cpu.export(load_onnx(sys.argv[1]), sys.argv[2], {})
    """)
    for name, seed in (("a", "1"), ("b", "2")):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "m.onnx"), str(tmp_path / name)],
            check=True,
            env=env,
        )
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_fp16_rounded_weights_take_the_fp16_codec_and_halve_the_container(tmp_path):
    raw = cpu.export(from_proto(conv_gemm(fp16=False)), tmp_path / "raw", {})
    half = cpu.export(from_proto(conv_gemm(fp16=True)), tmp_path / "half", {})
    assert {w["codec"] for w in raw.weights} == {"raw"}
    assert {w["codec"] for w in half.weights} == {"fp16"}
    raw_bytes = sum(w["bytes"] for w in raw.weights)
    assert raw_bytes == 4 * (72 + 4 + 320 + 5)
    assert sum(w["bytes"] for w in half.weights) * 2 == raw_bytes
    assert (tmp_path / "half" / "weights.mcw").stat().st_size < (
        tmp_path / "raw" / "weights.mcw"
    ).stat().st_size
    # lossless: the fp16 bundle still runs exactly like ORT on its float32 original
    expected = _ort_original(conv_gemm(fp16=True), tmp_path / "half.onnx")
    np.testing.assert_allclose(cpu.load(half).run({"x": X})["y"], expected, rtol=1e-6, atol=0)


def test_codec_option_forces_one_codec(tmp_path):
    b = cpu.export(from_proto(conv_gemm(fp16=True)), tmp_path / "b", {"codec": "raw"})
    assert {w["codec"] for w in b.weights} == {"raw"}
    assert b.options == {"codec": "raw"}


def test_dense_export_writes_a_self_contained_model(tmp_path):
    proto = conv_gemm()
    expected = _ort_original(proto, tmp_path / "orig.onnx")
    b = cpu.export(from_proto(proto), tmp_path / "d", {"dense": True})
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["manifest.json", "model.onnx"]
    assert {w["codec"] for w in b.weights} == {"dense"}
    # plain ONNX Runtime reads it without mconv
    plain = ort.InferenceSession(str(tmp_path / "d" / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(plain.run(None, {"x": X})[0], expected, rtol=1e-6, atol=0)
    np.testing.assert_allclose(cpu.load(tmp_path / "d").run({"x": X})["y"], expected, rtol=1e-6, atol=0)


def test_models_over_the_protobuf_limit_load_through_external_initializers(tmp_path, monkeypatch):
    proto = conv_gemm()
    expected = _ort_original(proto, tmp_path / "orig.onnx")
    cpu.export(from_proto(proto), tmp_path / "b", {})
    monkeypatch.setattr(cpu, "PROTOBUF_LIMIT", 0)  # every model counts as too big for one protobuf
    monkeypatch.setattr(cpu, "INLINE_BYTES", 0)  # and every weight goes to ORT as an OrtValue
    np.testing.assert_allclose(cpu.load(tmp_path / "b").run({"x": X})["y"], expected, rtol=1e-6, atol=0)
    np.testing.assert_allclose(
        cpu.load_model(from_proto(proto)).run({"x": X})["y"], expected, rtol=1e-6, atol=0
    )
    assert not any(p.name.startswith("mconv-in-memory") for p in tmp_path.rglob("*"))


def test_load_model_runs_a_bare_ir_model(tmp_path):
    proto = conv_gemm(seed=5)
    expected = _ort_original(proto, tmp_path / "orig.onnx")
    runner = cpu.TARGET.load_model(from_proto(proto))
    assert [s.name for s in runner.inputs] == ["x"]
    np.testing.assert_allclose(runner.run({"x": X})["y"], expected, rtol=1e-6, atol=0)


def test_zipped_bundle_loads_and_runs(tmp_path):
    proto = conv_gemm()
    expected = _ort_original(proto, tmp_path / "orig.onnx")
    cpu.export(from_proto(proto), tmp_path / "b", {})
    zip_bundle(tmp_path / "b", tmp_path / "b.zip")
    np.testing.assert_allclose(cpu.load(tmp_path / "b.zip").run({"x": X})["y"], expected, rtol=1e-6, atol=0)


def test_to_model_gives_back_the_graph_with_weights(tmp_path):
    proto = conv_gemm()
    cpu.export(from_proto(proto), tmp_path / "b", {})
    model = cpu.TARGET.to_model(tmp_path / "b")
    # weights.mcw holds them sorted by name (its names are front-coded)
    assert list(model.graph.initializers) == sorted(t.name for t in proto.graph.initializer)
    for t in proto.graph.initializer:
        assert np.array_equal(model.graph.initializers[t.name].const_value.numpy(), numpy_helper.to_array(t))


def test_tampered_bundle_is_refused_on_load(tmp_path):
    cpu.export(from_proto(conv_gemm()), tmp_path / "b", {})
    f = tmp_path / "b" / "weights.mcw"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x80
    f.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="weights.mcw: sha256 mismatch"):
        cpu.load(tmp_path / "b")


def test_bundle_for_another_target_is_refused(tmp_path):
    cpu.export(from_proto(conv_gemm()), tmp_path / "b", {})
    mpath = tmp_path / "b" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["target"] = "xla"
    mpath.write_text(json.dumps(m))
    with pytest.raises(InputError, match="target 'xla', not 'cpu'"):
        cpu.load(tmp_path / "b")


@pytest.mark.parametrize(
    "feeds, match",
    [
        ({"x": X.astype(np.float64)}, r"input 'x': dtype float64, expected float32"),
        ({"x": X[0]}, r"input 'x': shape \[2, 4, 4\], expected \['N', 2, 4, 4\]"),
        ({"x": np.zeros((3, 3, 4, 4), np.float32)}, r"input 'x': shape \[3, 3, 4, 4\], expected"),
        ({}, "missing input"),
        ({"x": X, "z": X}, "unknown input"),
    ],
)
def test_bad_feeds_are_input_errors_naming_the_input(tmp_path, feeds, match):
    runner = cpu.load_model(from_proto(conv_gemm()))
    with pytest.raises(InputError, match=match):
        runner.run(feeds)


def test_symbolic_batch_dimension_accepts_any_batch(tmp_path):
    runner = cpu.load_model(from_proto(conv_gemm()))
    assert runner.run({"x": X[:1]})["y"].shape == (1, 5)
    assert runner.run({"x": np.concatenate([X, X])})["y"].shape == (6, 5)


def test_ort_failures_at_run_time_become_input_errors(tmp_path):
    # Reshape to a shape that does not fit the element count only fails inside ORT.
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([2, 2], np.int64), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    runner = cpu.load_model(from_proto(model))
    assert runner.run({"x": np.arange(4, dtype=np.float32)})["y"].shape == (2, 2)
    with pytest.raises(InputError, match="ONNX Runtime refused the feeds") as exc:
        runner.run({"x": np.arange(5, dtype=np.float32)})
    assert "x[5]:float32" in str(exc.value)


def test_verification_option_goes_to_the_manifest_verification(tmp_path):
    summary = {"passed": True, "max_abs_error": 0.0}
    b = cpu.export(from_proto(conv_gemm()), tmp_path / "b", {"verification": summary, "dense": False})
    assert b.manifest["verification"] == summary
    assert b.manifest["options"] == {"dense": False}


def test_dense_export_over_the_protobuf_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "PROTOBUF_LIMIT", 100)
    with pytest.raises(InputError, match="2 GB protobuf limit"):
        cpu.export(from_proto(conv_gemm()), tmp_path / "d", {"dense": True})
    assert not (tmp_path / "d").exists()


def scalar_model() -> onnx.ModelProto:
    """0-d initializers where detectors and OCR models have them: a Gather index, the factor of
    a Mul, and a scalar Unsqueezed into a Concat that feeds Reshape."""
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=1, name="gather"),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["minus1", "n1"], ["shape"], axis=0, name="concat"),
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Mul", ["r", "k"], ["y"], name="mul"),
    ]
    inits = {
        "idx": np.array(1, np.int64),
        "n": np.array(3, np.int64),
        "axes0": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
        "k": np.array(1.5, np.float32),
    }
    graph = helper.make_graph(
        nodes,
        "scalars",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor_value_info("g", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
        ],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


SCALARS = ("idx", "n", "k")


@pytest.mark.parametrize("dense", [False, True])
def test_scalar_initializers_stay_zero_dimensional_through_export_and_load(tmp_path, dense, monkeypatch):
    proto = scalar_model()
    x = np.random.default_rng(21).standard_normal((4, 3)).astype(np.float32)
    expected = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    b = cpu.export(from_proto(proto), tmp_path / "b", {"dense": dense})
    assert {w["name"]: w["shape"] for w in b.weights if w["name"] in SCALARS} == dict.fromkeys(SCALARS, [])
    if dense:
        stored = onnx.load(tmp_path / "b" / "model.onnx")
    else:  # weights.mcw decoded and attached as load does it
        with load_bundle(tmp_path / "b").container() as c:
            assert all(c.array(n).shape == () for n in SCALARS)
        stored = onnx.ModelProto()
        stored.CopyFrom(cpu.ir.serde.serialize_model(cpu.to_model(tmp_path / "b")))
    assert {t.name: list(t.dims) for t in stored.graph.initializer if t.name in SCALARS} == dict.fromkeys(
        SCALARS, []
    )
    onnx.checker.check_model(stored, full_check=True)
    for limit in (cpu.PROTOBUF_LIMIT, 0):  # 0: weights go to ORT as external OrtValues
        monkeypatch.setattr(cpu, "PROTOBUF_LIMIT", limit)
        got = cpu.load(tmp_path / "b").run({"x": x})
        np.testing.assert_array_equal(got["g"], expected[0])
        np.testing.assert_array_equal(got["y"], expected[1])


def test_over_the_limit_small_shape_tensors_stay_in_the_proto(tmp_path, monkeypatch):
    # ORT's shape inference reads Reshape's shape and Unsqueeze's axes; a placeholder it cannot.
    proto = scalar_model()
    x = np.random.default_rng(22).standard_normal((2, 3)).astype(np.float32)
    expected = cpu.load_model(from_proto(proto)).run({"x": x})
    seen = {}
    real = cpu._serialize

    def spy(p):
        seen.update({t.name: t.data_location for t in p.graph.initializer})
        return real(p)

    monkeypatch.setattr(cpu, "_serialize", spy)
    monkeypatch.setattr(cpu, "PROTOBUF_LIMIT", 0)
    monkeypatch.setattr(cpu, "INLINE_BYTES", 4)  # only the 0-d float32 k (4 bytes) stays inline
    with pytest.raises(InputError, match="ONNX Runtime cannot load"):
        cpu.load_model(from_proto(proto))  # int64 shape data left as placeholders: refused
    assert seen["k"] == TensorProto.DEFAULT and seen["axes0"] == TensorProto.EXTERNAL
    monkeypatch.setattr(cpu, "INLINE_BYTES", 1 << 16)
    seen.clear()
    got = cpu.load_model(from_proto(proto)).run({"x": x})
    assert set(seen.values()) == {TensorProto.DEFAULT}
    np.testing.assert_array_equal(got["y"], expected["y"])
    monkeypatch.setattr(cpu, "INLINE_BUDGET", 4 + 8)  # the budget bounds what stays inline
    seen.clear()
    with pytest.raises(InputError, match="ONNX Runtime cannot load"):
        cpu.load_model(from_proto(proto))
    assert {n for n, loc in seen.items() if loc == TensorProto.DEFAULT} == {"k", "idx"}  # smallest first


def test_zero_dimensional_weight_handed_to_ort_as_an_ortvalue(tmp_path, monkeypatch):
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array(-2.5, np.float32), "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cpu.export(from_proto(model), tmp_path / "b", {})
    monkeypatch.setattr(cpu, "PROTOBUF_LIMIT", 0)
    monkeypatch.setattr(cpu, "INLINE_BYTES", 0)
    got = cpu.load(tmp_path / "b").run({"x": np.float32([1, 2, 4])})["y"]
    np.testing.assert_array_equal(got, np.float32([-2.5, -5, -10]))
