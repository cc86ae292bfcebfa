"""DeepLearningKit JSON: read (DLK and caffemodel2json spellings), write, round trip via Caffe LeNet."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from mconv.errors import InputError, UnsupportedError
from mconv.formats import detect, import_model
from mconv.formats.dlk_json import FORMAT, model_to_dlk
from mconv.irio import from_proto, to_proto
from onnx import TensorProto, helper

RNG = np.random.default_rng(1)


def run(model, x):
    sess = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def blob(a):
    return {"shape": {"dim": list(a.shape)}, "data": a.ravel().tolist()}


def dlk_doc(w, b, pool=0):
    """A document as DeepLearningKit's Swift reader expects it: scalars, pool as 0/1, no bottoms."""
    return {
        "layer": [
            {
                "name": "conv1",
                "type": "Convolution",
                "convolution_param": {"pad": 1, "kernel_size": 3, "stride": 1},
                "blobs": [blob(w), blob(b)],
            },
            {"name": "relu1", "type": "ReLU"},
            {
                "name": "pool1",
                "type": "Pooling",
                "pooling_param": {"pool": pool, "kernel_size": 2, "stride": 2},
            },
        ]
    }


def test_reads_dlk_chain_with_caffe_ceil_pooling(tmp_path):
    w, b = RNG.standard_normal((2, 1, 3, 3)).astype(np.float32), RNG.standard_normal(2).astype(np.float32)
    path = tmp_path / "net.json"
    path.write_text(json.dumps(dlk_doc(w, b, pool=1)))
    model = import_model([path], options={"input_shape": [1, 1, 5, 5]})
    x = RNG.standard_normal((1, 1, 5, 5)).astype(np.float32)
    got = run(model, x)
    # Oracle: 3x3 conv, pad 1 (loops), ReLU, 2x2/2 AVE pooling in Caffe's ceil mode (5 -> 3, the
    # last window hangs over the end and divides by the 1 or 2 rows/cols inside the image).
    xp = np.pad(x[0, 0].astype(np.float64), 1)
    conv = np.array(
        [
            [[(xp[i : i + 3, j : j + 3] * w[o, 0]).sum() + b[o] for j in range(5)] for i in range(5)]
            for o in range(2)
        ]
    )
    act = np.maximum(conv, 0)
    ref = np.zeros((2, 3, 3))
    for i in range(3):
        for j in range(3):
            win = act[:, 2 * i : min(2 * i + 2, 5), 2 * j : min(2 * j + 2, 5)]
            ref[:, i, j] = win.sum(axis=(1, 2)) / (win.shape[1] * win.shape[2])
    assert got.shape == (1, 2, 3, 3)
    np.testing.assert_allclose(got[0], ref, rtol=1e-5, atol=1e-5)


def test_reads_caffemodel2json_spelling_lists_and_enum_names(tmp_path):
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    doc = {
        "name": "mlp",
        "input": ["x"],
        "input_shape": [{"dim": [2, 4]}],
        "layer": [
            {
                "name": "ip",
                "type": "InnerProduct",
                "bottom": ["x"],
                "top": ["ip"],
                "inner_product_param": {"num_output": 3, "bias_term": False},
                "blobs": [blob(w)],
            },
            {"name": "prob", "type": "Softmax", "bottom": ["ip"], "top": ["prob"]},
        ],
    }
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(doc))
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    z = x.astype(np.float64) @ w.T
    ref = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(run(import_model([path]), x), ref, rtol=1e-5)


def test_unknown_layer_types_are_all_named(tmp_path):
    doc = {
        "input": ["data"],
        "input_shape": [{"dim": [1, 1, 4, 4]}],
        "layer": [
            {"name": "a", "type": "Warp"},
            {"name": "r", "type": "ReLU"},
            {"name": "b", "type": "Twist"},
        ],
    }
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UnsupportedError) as err:
        import_model([path], format="dlk-json")
    assert err.value.items == [("a", "Warp"), ("b", "Twist")]


def test_missing_input_shape_and_broken_json_are_input_errors(tmp_path):
    w, b = np.ones((2, 1, 3, 3), np.float32), np.zeros(2, np.float32)
    path = tmp_path / "net.json"
    path.write_text(json.dumps(dlk_doc(w, b)))
    with pytest.raises(InputError, match="input_shape"):
        import_model([path], format="dlk-json")
    path.write_text(json.dumps(dlk_doc(w, b))[:-40])
    with pytest.raises(InputError, match="line 1"):
        import_model([path], format="dlk-json")


def test_sniff_tells_dlk_json_from_keras_json():
    dlk = b'{"layer": [{"name": "conv1", "type": "Convolution"'
    keras = b'{"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense"'
    assert FORMAT.sniff(dlk, None) and not FORMAT.sniff(keras, None)


def test_writer_names_every_node_outside_dlk_set():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["s"], name="sig"),
        helper.make_node("Flatten", ["s"], ["y"], name="flat"),
    ]
    model = from_proto(
        helper.make_model(
            helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
        )
    )
    with pytest.raises(UnsupportedError) as err:
        model_to_dlk(model)
    assert [n for n, _ in err.value.items] == ["sig", "flat"]


PREFIX = """name: "LeNetPrefix"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 28 dim: 28 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 20 kernel_size: 5 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "relu_p1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 50 kernel_size: 5 } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
"""


def test_lenet_conv_pool_relu_prefix_round_trips_through_dlk_json(shared, tmp_path):
    proto = tmp_path / "prefix.prototxt"
    proto.write_text(PREFIX)
    caffe = import_model([proto, shared / "models" / "caffe" / "lenet_iter_10000.caffemodel"])
    dest = tmp_path / "lenet_prefix.json"
    written = FORMAT.save(caffe, dest, {})
    assert written == [dest] and not list(tmp_path.glob(".*tmp"))
    doc = json.loads(dest.read_text())
    assert [layer["type"] for layer in doc["layer"]] == [
        "Convolution",
        "Pooling",
        "ReLU",
        "Convolution",
        "Pooling",
    ]
    assert doc["layer"][0]["blobs"][0]["shape"]["dim"] == [20, 1, 5, 5]
    assert detect(dest).name == "dlk-json"
    back = import_model([dest])
    x = RNG.random((1, 1, 28, 28), dtype=np.float32)
    np.testing.assert_array_equal(run(back, x), run(caffe, x))
