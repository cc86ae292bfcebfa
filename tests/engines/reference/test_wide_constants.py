"""Speed without giving up exactness: constants widened once per executor, convolutions as one
GEMM over the batch, tiled MaxPool and blocked BatchNormalization giving the same values."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from mconv.engines.reference.executor import Executor
from mconv.engines.reference.ops import conv as conv_module
from mconv.engines.reference.ops import fast_math, lookup
from onenode import ours
from onnx import TensorProto, helper, numpy_helper


def _gemm_model(w: np.ndarray) -> ir.Model:
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, w.shape[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, w.shape[0]])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return ir.serde.deserialize_model(model)


def test_a_weight_is_widened_once_and_its_copy_is_read_only():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 512)).astype(np.float32)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    exe = Executor(_gemm_model(w))
    with fast_math():  # float32 accumulation needs no copy
        exe.run({"x": x})
    assert exe.constants.nbytes == 0
    first = exe.run({"x": x})["y"]
    assert exe.constants.nbytes == w.size * 8  # one float64 copy, and only of the weight
    copy = exe.constants.get(exe.initializers["w"], np.dtype(np.float64))
    assert copy is not None and not copy.flags.writeable
    second = exe.run({"x": x})["y"]
    assert exe.constants.get(exe.initializers["w"], np.dtype(np.float64)) is copy
    truth = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)
    np.testing.assert_array_equal(first, truth)
    np.testing.assert_array_equal(second, truth)


def test_set_initializer_drops_the_stale_copy_even_for_the_same_array_changed_in_place():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    exe = Executor(_gemm_model(w))
    exe.run({"x": x})
    weight = exe.initializers["w"].copy()
    exe.set_initializer("w", weight)
    exe.run({"x": x})  # widens the new array
    weight *= -2.0  # changed in place (fine-tuning does this), then handed back
    exe.set_initializer("w", weight)
    got = exe.run({"x": x})["y"]
    truth = (x.astype(np.float64) @ weight.astype(np.float64).T).astype(np.float32)
    np.testing.assert_array_equal(got, truth)
    assert exe.constants.nbytes == w.size * 8  # the old copies are gone


@pytest.mark.parametrize(
    "xshape,wshape,attrs",
    [
        ((5, 4, 9, 9), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # flat layout
        ((5, 4, 12, 12), (6, 4, 5, 5), {}),  # junk above a quarter: strided layout
        ((5, 4, 11, 10), (6, 2, 3, 3), {"group": 2, "strides": [2, 1], "pads": [0, 1, 2, 0]}),
        ((3, 4, 7, 7), (8, 4, 1, 1), {}),  # 1x1: the canvas is the patch matrix
        ((2, 2, 20), (3, 2, 4), {"dilations": [2], "pads": [3, 1]}),  # 1-D
    ],
)
def test_conv_over_the_batch_in_chunks_equals_the_rounded_float64_truth(monkeypatch, xshape, wshape, attrs):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32)
    whole = ours("Conv", [x, w, b], attrs)[0]
    monkeypatch.setattr(conv_module, "_COLS_BYTES", 1)  # one image per GEMM
    chunked = ours("Conv", [x, w, b], attrs)[0]
    per_image = np.concatenate([ours("Conv", [x[i : i + 1], w, b], attrs)[0] for i in range(len(x))])
    truth = ours("Conv", [x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)], attrs)[0]
    assert whole.dtype == np.float32
    np.testing.assert_array_equal(whole, truth.astype(np.float32))
    np.testing.assert_array_equal(chunked, whole)
    np.testing.assert_array_equal(per_image, whole)


def test_tiled_maxpool_equals_the_general_window_walk():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 12, 9)).astype(np.float32)
    x[0, 1, 2, 4] = np.nan
    tiled = ours("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [3, 3]})[0]
    # an extra output asks for Indices, which takes the general path
    general = lookup("MaxPool").forward([x], {"kernel_shape": [3, 3], "strides": [3, 3]}, _ctx(2))[0]
    np.testing.assert_array_equal(tiled, general)


def test_blocked_batchnorm_is_rounded_once_from_float64():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 40, 40)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal(5).astype(np.float32) for _ in range(3))
    var = (rng.random(5) + 0.5).astype(np.float32)
    got = ours("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": 1e-3})[0]
    inv = 1.0 / np.sqrt(var.astype(np.float64) + 1e-3)
    a = scale * inv
    shape = (1, -1, 1, 1)
    truth = x * a.reshape(shape) + (bias.astype(np.float64) - mean * a).reshape(shape)
    np.testing.assert_array_equal(got, truth.astype(np.float32))


def _ctx(num_outputs: int):
    from mconv.engines.reference.ops import OpContext

    return OpContext(num_outputs=num_outputs)
