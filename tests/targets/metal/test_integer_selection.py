"""MaxPool and a nearest-neighbour Resize on uint8 codes (as ORT's QOperator
quantizer leaves them between QLinearConvs: YOLOv8's SPPF and its upsampling) select elements,
so the GPU targets run them on integers held as floats, equal to ORT's codes; a linear Resize on
codes interpolates and stays refused. Checked on a photo (scikit-image's astronaut) on metal
(the C++ harness) and webgpu (wgpu, where an adapter is present)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.errors import UnsupportedError
from mconv.irio import from_proto
from mconv.targets import get_target
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "webgpu"))
from test_webgpu import needs_adapter  # noqa: E402


def _photo() -> np.ndarray:
    from skimage import data

    img = data.astronaut()[::16, ::16].astype(np.float32) / 255.0  # 32 x 32 x 3
    return np.ascontiguousarray(img.transpose(2, 0, 1)[None])


def _model(mode: str) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(1 / 255, np.float32), "s"),
        numpy_helper.from_array(np.array(3, np.uint8), "z"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("MaxPool", ["q"], ["p"], kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1]),
        helper.make_node("Resize", ["p", "", "scales"], ["r"], mode=mode),
        helper.make_node("DequantizeLinear", ["r", "s", "z"], ["y"]),
        helper.make_node("DequantizeLinear", ["p", "s", "z"], ["py"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 64, 64]),
            helper.make_tensor_value_info("py", TensorProto.FLOAT, [1, 3, 32, 32]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)


@pytest.mark.parametrize("target", ["metal", pytest.param("webgpu", marks=needs_adapter)])
def test_selections_on_codes_equal_ort(target, tmp_path):
    model, x = _model("nearest"), _photo()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    t = get_target(target)
    got = t.load(t.export(from_proto(model), tmp_path / "b", {})).run({"x": x})
    assert np.unique(want[0]).size > 50  # a photo's codes, not a flat image
    np.testing.assert_array_equal(got["y"], want[0])
    np.testing.assert_array_equal(got["py"], want[1])


def test_linear_resize_on_codes_is_refused(tmp_path):
    with pytest.raises(UnsupportedError, match="Resize on integers"):
        get_target("metal").export(from_proto(_model("linear")), tmp_path / "b", {})
