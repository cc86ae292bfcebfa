"""The IR at rest: .onnx in and out, external data written for large models and read lazily."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.errors import InputError
from mconv.irio import load_onnx, model_stats, real_inputs, save_onnx
from onnx import TensorProto, helper, numpy_helper


def _model(n: int = 256) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, n)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [n, n]),
        ],  # old style: weight also an input
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_large_models_save_external_data_and_load_it_lazily_memory_mapped(tmp_path):
    proto = _model()
    written = save_onnx(ir.serde.deserialize_model(proto), tmp_path / "m.onnx", external_threshold=1024)
    assert sorted(p.name for p in written) == ["m.onnx", "m.onnx.data"]
    assert (tmp_path / "m.onnx").stat().st_size < 4096  # the graph file holds no weights
    model = load_onnx(tmp_path / "m.onnx")
    w = model.graph.initializers["w"].const_value
    assert isinstance(w, ir.ExternalTensor)  # not read yet: a lazy, memory-mapped reference
    np.testing.assert_array_equal(w.numpy(), numpy_helper.to_array(proto.graph.initializer[0]))
    x = np.ones((2, 256), np.float32)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x, "w": w.numpy()})[0]
    got = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_small_models_stay_one_file_and_initializers_listed_as_inputs_are_not_inputs(tmp_path):
    written = save_onnx(ir.serde.deserialize_model(_model(8)), tmp_path / "m.onnx")
    assert [p.name for p in written] == ["m.onnx"]
    model = load_onnx(tmp_path / "m.onnx")
    assert [v.name for v in real_inputs(model.graph)] == ["x"]
    assert model_stats(model).params == 64


def test_corrupt_file_is_one_input_error_naming_it(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07" + b"\xff" * 40)
    with pytest.raises(InputError) as e:
        load_onnx(tmp_path / "bad.onnx")
    assert "bad.onnx" in e.value.line() and "\n" not in e.value.line()


def _mixed_model() -> onnx.ModelProto:
    """Big and small initializers, a typed-field initializer, a Constant node and metadata."""
    rng = np.random.default_rng(1)
    big = rng.standard_normal((600, 500)).astype(np.float32)  # 1.2 MB of raw_data
    big16 = rng.standard_normal((1 << 19) + 3).astype(np.float16)  # 1 MB + 6 B
    small = rng.standard_normal((4, 500)).astype(np.float32)
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])  # float_data, not raw
    nodes = [
        helper.make_node("MatMul", ["x", "big"], ["h"], name="mm"),
        helper.make_node(
            "Constant", [], ["c"], name="const", value=numpy_helper.from_array(np.float32(2.0), "c")
        ),
        helper.make_node("Mul", ["h", "c"], ["y"], name="mul"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 600])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 500])],
        [
            numpy_helper.from_array(big, "big"),
            numpy_helper.from_array(big16, "big16"),
            numpy_helper.from_array(small, "small"),
            typed,
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="t")
    helper.set_model_props(model, {"k": "v"})
    return model


def test_lazy_load_reads_large_raw_data_in_place_and_equals_onnx_own_parse(tmp_path):
    proto = _mixed_model()
    path = tmp_path / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    before = path.read_bytes()
    model = load_onnx(path, lazy=True)
    inits = model.graph.initializers
    # Only the large payloads became references into the file itself; the rest parsed as usual.
    assert isinstance(inits["big"].const_value, ir.ExternalTensor)
    assert isinstance(inits["big16"].const_value, ir.ExternalTensor)
    assert inits["big"].const_value.location == "m.onnx"
    assert not isinstance(inits["small"].const_value, ir.ExternalTensor)
    for t in proto.graph.initializer:  # the oracle: onnx's own full parse
        got = inits[t.name].const_value.numpy()
        want = numpy_helper.to_array(t)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert dict(model.metadata_props) == {"k": "v"} and model.producer_name == "t"
    x = np.random.default_rng(2).standard_normal((2, 600)).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    save_onnx(model, tmp_path / "out.onnx")  # the references are read back when saving
    got = ort.InferenceSession(str(tmp_path / "out.onnx")).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    assert path.read_bytes() == before  # the source is never written


def test_lazy_load_of_a_truncated_file_is_one_input_error(tmp_path):
    data = _mixed_model().SerializeToString()
    for cut in (len(data) // 2, len(data) - 7, 3):
        (tmp_path / "t.onnx").write_bytes(data[:cut])
        with pytest.raises(InputError) as e:
            load_onnx(tmp_path / "t.onnx", lazy=True)
        assert "t.onnx" in e.value.line() and "\n" not in e.value.line()


def test_spilling_moves_large_arrays_to_scratch_files_and_removes_them(tmp_path):
    from mconv.irio import owned_array, spilling, weight_tensor

    a = np.arange(1000, dtype=np.float32).reshape(10, 100)
    with spilling(tmp_path, min_bytes=1024) as scratch:
        big = weight_tensor(a, "w")
        small = weight_tensor(a[:1, :10], "s")
        assert isinstance(big, ir.ExternalTensor) and not isinstance(small, ir.ExternalTensor)
        assert list(scratch.iterdir())  # the array's bytes are on disk, not in memory
        copy = owned_array(big)
        np.testing.assert_array_equal(copy, a)
        copy[0, 0] = -1  # the caller owns the copy: the file is untouched
        np.testing.assert_array_equal(owned_array(big), a)
    assert not scratch.exists()
    assert not isinstance(weight_tensor(a, "w"), ir.ExternalTensor)  # outside the block: in memory


def test_optimize_cli_on_a_lazily_loaded_spilled_model_writes_what_the_in_memory_pipeline_does(
    tmp_path, monkeypatch
):
    """The optimize command loads big single-file models lazily and spills rewritten weights;
    thresholds lowered so a 1.2 MB model takes both paths. Oracle: the same passes run on an
    eagerly loaded model with nothing spilled."""
    import mconv.irio as irio
    import mconv.passes as P
    from mconv.cli.app import app
    from typer.testing import CliRunner

    proto = _mixed_model()
    src = tmp_path / "m.onnx"
    src.write_bytes(proto.SerializeToString())
    spec = "prune(sparsity=0.6),cluster(bits=4)"
    want, _ = P.run_pipeline(load_onnx(src, lazy=False), P.parse_spec(spec), P.PassContext())
    monkeypatch.setattr(irio, "LAZY_LOAD_THRESHOLD", 0)
    monkeypatch.setattr(irio, "LAZY_TENSOR_BYTES", 1024)
    monkeypatch.setattr(irio, "SPILL_MIN_BYTES", 1024)
    r = CliRunner().invoke(
        app, ["optimize", str(src), "--passes", spec, "-o", str(tmp_path / "o.onnx"), "-q"]
    )
    assert r.exit_code == 0, r.output
    got = load_onnx(tmp_path / "o.onnx", lazy=False)
    for name, value in want.graph.initializers.items():
        np.testing.assert_array_equal(
            got.graph.initializers[name].const_value.numpy(), value.const_value.numpy()
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "o.onnx"]  # scratch removed


def test_optimize_failing_inside_the_pipeline_leaves_no_scratch_and_no_output(tmp_path, monkeypatch):
    import mconv.irio as irio
    from mconv.cli.app import app
    from typer.testing import CliRunner

    src = tmp_path / "m.onnx"
    src.write_bytes(_mixed_model().SerializeToString())
    monkeypatch.setattr(irio, "LAZY_LOAD_THRESHOLD", 0)
    monkeypatch.setattr(irio, "SPILL_MIN_BYTES", 1024)
    spec = "prune(sparsity=0.5),cluster(bits=9)"  # the prune spills; the cluster refuses its bits
    r = CliRunner().invoke(app, ["optimize", str(src), "--passes", spec, "-o", str(tmp_path / "o.onnx")])
    assert r.exit_code == 2, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_lazy_load_through_a_symlink_or_of_a_hard_linked_file_reads_the_right_values(tmp_path):
    proto = _mixed_model()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    real = tmp_path / "a" / "m.onnx"
    real.write_bytes(proto.SerializeToString())
    (tmp_path / "b" / "link.onnx").symlink_to(real)
    (tmp_path / "b" / "hard.onnx").hardlink_to(real)
    want = numpy_helper.to_array(proto.graph.initializer[0])
    for path in (tmp_path / "b" / "link.onnx", tmp_path / "b" / "hard.onnx"):
        got = load_onnx(path, lazy=True).graph.initializers["big"].const_value.numpy()
        np.testing.assert_array_equal(got, want)
