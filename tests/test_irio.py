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
