"""Files no larger than they need be. Constants with equal bytes are stored once in a written
.tflite (targets/tflite/schema.py rule 1): a siamese pair of LeNet-5's real first convolution on real MNIST digits, its tied weight written
once per branch under two names (as mconv's TFLite reader writes a buffer several tensors share,
basic-pitch's CQT kernels: a 4x larger file before). Keras's ReLU6 (Relu then Min) is the conv's
fused RELU6 (targets/tflite/lower.py rule 4)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mconv.irio import from_proto, to_proto
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import ai_edge_litert.interpreter  # noqa: E402, F401  (t.load runs the files in LiteRT; the test extra installs it)
from _gates import assert_close  # noqa: E402
from _tflite_help import file_ops  # noqa: E402


def _siamese(lenet_model) -> tuple:
    """Both digits through LeNet's trained conv1: two Conv nodes, each with its own copy of the
    weight and bias (equal bytes, different names)."""
    proto = to_proto(lenet_model)
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    w, b = inits[conv.input[1]], inits[conv.input[2]]
    nodes = [
        helper.make_node("Conv", ["a", "w", "b"], ["ca"]),
        helper.make_node("Conv", ["b_in", "w_copy", "b_copy"], ["cb"]),
        helper.make_node("Relu", ["ca"], ["ya"]),
        helper.make_node("Relu", ["cb"], ["yb"]),
    ]
    oh = 28 - w.shape[2] + 1
    g = helper.make_graph(
        nodes,
        "siamese",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 28, 28]) for n in ("a", "b_in")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, w.shape[0], oh, oh]) for n in ("ya", "yb")],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (w, "w_copy"), (b, "b_copy"))],
    )
    return from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])), w


def test_a_weight_copied_for_two_convolutions_is_one_buffer(lenet_mnist, tmp_path):
    import tflite
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    siamese, w = _siamese(model)
    t = get_target("tflite")
    bundle = t.export(siamese, tmp_path / "siamese", {})
    data = (bundle.root / "model.tflite").read_bytes()
    m = tflite.Model.GetRootAsModel(data, 0)
    sg = m.Subgraphs(0)
    filters = []
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        oc = m.OperatorCodes(op.OpcodeIndex())
        if max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode()) == tflite.BuiltinOperator.CONV_2D:
            filters.append(sg.Tensors(int(op.InputsAsNumpy()[1])).Buffer())
    assert len(filters) == 2 and filters[0] == filters[1] != 0, filters
    # the kernel's bytes (OHWI, as LiteRT lays a CONV_2D filter out) are in the file once
    assert data.count(np.ascontiguousarray(w.transpose(0, 2, 3, 1)).astype("<f4").tobytes()) == 1
    ref, run = get_target("reference").load_model(siamese), t.load(bundle)
    for i in (7, 2024, 4100):  # digits of three classes (the file is sorted by label)
        feeds = {"a": digits[i : i + 1], "b_in": digits[i + 500 : i + 501]}
        want, got = ref.run(feeds), run.run(feeds)
        for name in ("ya", "yb"):
            assert_close(want[name], got[name], what=name)


def test_keras_relu6_written_as_relu_then_min_is_one_fused_conv(lenet_mnist, tmp_path):
    """Keras's ReLU6 arrives from the Keras reader as Relu then Min(6) (keras MobileNetV2: 35 of
    each); in the file it is the conv's fused RELU6, and the clipped values are LiteRT's."""
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    proto = to_proto(model)
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    w, b = inits[conv.input[1]], inits[conv.input[2]]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["xc", "w", "b"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Min", ["r", "six"], ["m"]),
        helper.make_node("Transpose", ["m"], ["y"], perm=[0, 2, 3, 1]),
    ]
    oh = 28 - w.shape[2] + 1
    g = helper.make_graph(
        nodes,
        "relu6",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 28, 28, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oh, oh, w.shape[0]])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array(6.0, np.float32), "six"),
        ],
    )
    m = from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    t = get_target("tflite")
    bundle = t.export(m, tmp_path / "relu6", {})
    ops = [name for name, _, _ in file_ops((bundle.root / "model.tflite").read_bytes())]
    assert ops == ["CONV_2D"], ops
    ref, run = get_target("reference").load_model(m), t.load(bundle)
    clipped = 0
    for i in (7, 2024, 4100):
        x = {"x": digits[i : i + 1].transpose(0, 2, 3, 1) * 8}  # bright strokes: some values reach 6
        want = ref.run(x)["y"]
        clipped += int((want == 6.0).sum())
        assert_close(want, run.run(x)["y"], what="y")
    assert clipped > 0, "no value reached 6: the test would not see a missing clip"


def test_a_tflite_weight_read_by_two_convolutions_imports_as_one_initializer(lenet_mnist, tmp_path):
    """The reader's side (formats/tflite/reader.py rule 2c): a file tensor two CONV_2D ops read
    (written here from LeNet's conv1 shared by a siamese pair) is one ONNX initializer, not one
    copy per convolution (basic-pitch's CQT kernel: 9 copies, a 766 KB import of a 204 KB file)."""
    from mconv.formats import import_model
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    siamese, w = _siamese(model)
    shared = from_proto(to_proto(siamese))
    for node in shared.graph:  # both branches read the one weight and bias
        if node.op_type == "Conv":
            node.replace_input_with(1, shared.graph.initializers["w"])
            node.replace_input_with(2, shared.graph.initializers["b"])
    bundle = get_target("tflite").export(shared, tmp_path / "shared", {})
    back = import_model([bundle.root / "model.tflite"])
    weights = [
        v
        for v in back.graph.initializers.values()
        if v.const_value is not None and v.const_value.size == w.size
    ]
    assert len(weights) == 1, [v.name for v in weights]
    ref, got = get_target("reference").load_model(siamese), get_target("reference").load_model(back)
    a, b = digits[7:8], digits[2024:2025]
    want = ref.run({"a": a, "b_in": b})
    out = got.run({"a": a, "b_in": b})  # the file keeps the model's NCHW inputs and outputs
    for name in ("ya", "yb"):
        assert_close(want[name], out[name], what=name)


def _conv1(lenet_model) -> tuple[np.ndarray, np.ndarray]:
    proto = to_proto(lenet_model)
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    return inits[conv.input[1]], inits[conv.input[2]]


def _check(m, t, bundle, digits, name: str) -> None:
    from mconv.targets import get_target

    ref, run = get_target("reference").load_model(m), t.load(bundle)
    for i in (7, 2024, 4100):
        x = {"x": digits[i : i + 1]}
        assert_close(ref.run(x)[name], run.run(x)[name], what=name)


def test_a_squeeze_excite_block_keeps_only_its_mean(lenet_mnist, tmp_path):
    """Lower rule 13 on a squeeze-excite block as the Keras reader writes one (global mean, then
    Reshape to [1, C] and back to [1, C, 1, 1], a 1x1 conv, a sigmoid scaling the features), over
    LeNet-5's real first convolution on real digits: the file's ops are CONV_2D, MEAN, CONV_2D,
    LOGISTIC, MUL between the layout's first and last moves (the NCHW input of one channel to
    NHWC is a RESHAPE: only a unit axis moves); no RESHAPE in the block (Keras EfficientNets: 16
    TRANSPOSE and 33 RESHAPE before, with their shape constants), and the outputs are the
    reference's."""
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    w, b = _conv1(model)
    c = w.shape[0]
    se = (np.random.default_rng(0).normal(size=(c, c, 1, 1)) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["f"]),
        helper.make_node("ReduceMean", ["f", "axes"], ["m"], keepdims=1),
        helper.make_node("Reshape", ["m", "flat"], ["m2"]),
        helper.make_node("Reshape", ["m2", "back"], ["m4"]),
        helper.make_node("Conv", ["m4", "se"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["g"]),
        helper.make_node("Mul", ["f", "g"], ["y"]),
    ]
    oh = 28 - w.shape[2] + 1
    graph = helper.make_graph(
        nodes,
        "se",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, oh, oh])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(se, "se"),
            numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
            numpy_helper.from_array(np.array([1, c], np.int64), "flat"),
            numpy_helper.from_array(np.array([1, c, 1, 1], np.int64), "back"),
        ],
    )
    m = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    t = get_target("tflite")
    bundle = t.export(m, tmp_path / "se", {})
    ops = [name for name, _, _ in file_ops((bundle.root / "model.tflite").read_bytes())]
    # the NCHW input to NHWC moves only a unit axis: a RESHAPE; the output goes back to NCHW
    assert ops == ["RESHAPE", "CONV_2D", "MEAN", "CONV_2D", "LOGISTIC", "MUL", "TRANSPOSE"], ops
    _check(m, t, bundle, digits, "y")


def test_per_channel_affines_fold_into_the_fully_connected_layer(lenet_mnist, tmp_path):
    """Lower rule 14 on LeNet-5's real ip1 weights (the first 784 of its 800 inputs, so a digit's
    pixels feed it) with a LayerNorm's
    gamma and beta before it, and its bias add and a layer scale after it (ConvNeXt's block): one
    FULLY_CONNECTED in the file, nothing else, and the same outputs on real digits."""
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    proto = to_proto(model)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    ip1 = next(n for n in proto.graph.node if n.op_type in ("Gemm", "MatMul"))
    wt = inits[ip1.input[1]]
    w = wt.T if ip1.op_type == "Gemm" and any(a.name == "transB" and a.i for a in ip1.attribute) else wt
    w = w[:784]
    k, n = w.shape  # [in, out] as MatMul takes it
    rng = np.random.default_rng(1)
    gamma, beta = rng.uniform(0.5, 1.5, k).astype(np.float32), rng.normal(0, 0.1, k).astype(np.float32)
    bias, scale = rng.normal(0, 0.1, n).astype(np.float32), rng.uniform(0.1, 1.0, n).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["v"]),
        helper.make_node("Mul", ["v", "gamma"], ["v1"]),
        helper.make_node("Add", ["v1", "beta"], ["v2"]),
        helper.make_node("MatMul", ["v2", "w"], ["h"]),
        helper.make_node("Add", ["h", "bias"], ["h1"]),
        helper.make_node("Mul", ["h1", "scale"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [
            numpy_helper.from_array(np.array([1, k], np.int64), "shape"),
            numpy_helper.from_array(np.ascontiguousarray(w, np.float32), "w"),
            *(numpy_helper.from_array(a, nm) for a, nm in ((gamma, "gamma"), (beta, "beta"), (bias, "bias"), (scale, "scale"))),
        ],
    )  # fmt: skip
    m = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    t = get_target("tflite")
    bundle = t.export(m, tmp_path / "affine", {})
    ops = [name for name, _, _ in file_ops((bundle.root / "model.tflite").read_bytes())]
    assert [o for o in ops if o != "RESHAPE"] == ["FULLY_CONNECTED"], ops
    _check(m, t, bundle, digits, "y")


def test_a_shift_before_a_padded_convolution_is_not_folded(lenet_mnist, tmp_path):
    """Lower rule 14 leaves an ADD before a convolution with zero padding (the padding would see
    the shift): the ADD stays, and the outputs on real digits are the reference's."""
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    w, b = _conv1(model)
    nodes = [
        helper.make_node("Add", ["x", "shift"], ["xs"]),
        helper.make_node("Conv", ["xs", "w", "b"], ["y"], pads=[2, 2, 2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "shift",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[0], 28, 28])],
        [
            numpy_helper.from_array(np.array([0.5], np.float32).reshape(1, 1, 1, 1), "shift"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
        ],
    )
    m = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    t = get_target("tflite")
    bundle = t.export(m, tmp_path / "shift", {})
    ops = [name for name, _, _ in file_ops((bundle.root / "model.tflite").read_bytes())]
    assert "ADD" in ops, ops
    _check(m, t, bundle, digits, "y")


def test_a_zero_pad_of_same_size_before_a_valid_convolution_is_its_same_padding(lenet_mnist, tmp_path):
    """Lower rule 13's last step on LeNet-5's real 5x5 conv1 in an NHWC model (as the Keras reader
    writes one: Transpose in, Conv, Transpose out) after an explicit zero Pad of 2 on each side
    (Keras's ZeroPadding2D before a stride-1 conv: ResNetV2 has 14): TF's SAME pads for a 5x5
    stride-1 kernel, so the file has one CONV_2D with SAME padding and no PAD; the same Pad before
    a stride-2 conv (SAME would pad 1 and 2) stays a PAD. Outputs on real digits are the
    reference's."""
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    w, b = _conv1(model)
    for stride, folded in ((1, True), (2, False)):
        oh = (28 + 4 - 5) // stride + 1
        nodes = [
            helper.make_node("Pad", ["x", "pads"], ["xp"]),
            helper.make_node("Transpose", ["xp"], ["xc"], perm=[0, 3, 1, 2]),
            helper.make_node("Conv", ["xc", "w", "b"], ["c"], strides=[stride, stride]),
            helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1]),
        ]
        graph = helper.make_graph(
            nodes,
            "pad",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 28, 28, 1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oh, oh, w.shape[0]])],
            [
                numpy_helper.from_array(np.array([0, 2, 2, 0, 0, 2, 2, 0], np.int64), "pads"),
                numpy_helper.from_array(w, "w"),
                numpy_helper.from_array(b, "b"),
            ],
        )
        m = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
        t = get_target("tflite")
        bundle = t.export(m, tmp_path / f"pad{stride}", {})
        ops = [name for name, _, _ in file_ops((bundle.root / "model.tflite").read_bytes())]
        assert ("PAD" not in ops) == folded and "CONV_2D" in ops, (stride, ops)
        ref, run = get_target("reference").load_model(m), t.load(bundle)
        for i in (7, 2024, 4100):
            x = {"x": digits[i : i + 1].transpose(0, 2, 3, 1)}
            assert_close(ref.run(x)["y"], run.run(x)["y"], what="y")


def test_an_all_zero_fully_connected_bias_is_left_out(lenet_mnist, tmp_path):
    """Lower rule 15 on LeNet-5's real ip1 weights (the first 784 inputs, so a digit's pixels feed
    it): with an all-zero bias (a randomly initialized Keras Dense, as in the Keras applications'
    ConvNeXt, where these biases made mconv's file 12 KB larger than onnx2tf's) the file's
    FULLY_CONNECTED reads no bias tensor; a second layer with a real bias keeps it; the outputs on
    real digits are the reference's."""
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    proto = to_proto(model)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    ip1 = next(n for n in proto.graph.node if n.op_type in ("Gemm", "MatMul"))
    wt = inits[ip1.input[1]]
    w = (wt.T if ip1.op_type == "Gemm" and any(a.name == "transB" and a.i for a in ip1.attribute) else wt)[
        :784
    ]
    k, n = w.shape
    w2 = np.random.default_rng(2).normal(0, 0.05, (n, 10)).astype(np.float32)
    b2 = np.random.default_rng(3).normal(0, 0.1, 10).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["v"]),
        helper.make_node("Gemm", ["v", "w", "zeros"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "zero_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [
            numpy_helper.from_array(np.array([1, k], np.int64), "shape"),
            numpy_helper.from_array(np.ascontiguousarray(w, np.float32), "w"),
            numpy_helper.from_array(np.zeros(n, np.float32), "zeros"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    m = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    t = get_target("tflite")
    bundle = t.export(m, tmp_path / "zero_bias", {})
    fcs = [
        types
        for name, _, types in file_ops((bundle.root / "model.tflite").read_bytes())
        if name == "FULLY_CONNECTED"
    ]
    assert fcs == [["FLOAT32", "FLOAT32"], ["FLOAT32", "FLOAT32", "FLOAT32"]], fcs
    _check(m, t, bundle, digits, "y")


def test_a_dynamic_quantized_convolution_net_keeps_nhwc_between_its_layers(lenet_mnist, tmp_path):
    """Lower rules 1 and 2 on ONNX Runtime's dynamic quantization of LeNet-5 (quantize_dynamic:
    a DynamicQuantizeLinear before each ConvInteger / MatMulInteger, the product scaled by a
    computed one-element scale): a one-element computed operand and a reduction over every axis
    (the range of DynamicQuantizeLinear) take no part in the layout, so the activations stay NHWC
    from the first convolution to the flatten: one TRANSPOSE in the file (before the flatten,
    ONNX's channel-first order), not one on each side of each convolution; the outputs on real
    digits are ONNX Runtime's."""
    import onnx
    import onnxruntime as ort
    from mconv.targets import get_target
    from onnxruntime import quantization

    model, digits, _ = lenet_mnist
    src, q = tmp_path / "lenet.onnx", tmp_path / "lenet_dyn.onnx"
    src.write_bytes(to_proto(model).SerializeToString())
    quantization.quantize_dynamic(src, q, weight_type=quantization.QuantType.QInt8, reduce_range=True)
    qm = from_proto(onnx.load(q))
    assert any(n.op_type == "ConvInteger" for n in qm.graph)
    t = get_target("tflite")
    bundle = t.export(qm, tmp_path / "dyn", {})
    ops = [name for name, _, _ in file_ops((bundle.root / "model.tflite").read_bytes())]
    assert ops.count("CONV_2D") == 2 and ops.count("TRANSPOSE") == 1, ops
    sess = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    run = t.load(bundle)
    name = sess.get_inputs()[0].name
    out_name = sess.get_outputs()[0].name
    for i in (7, 2024, 4100):
        x = digits[i : i + 1]
        want = sess.run(None, {name: x})[0]
        got = run.run({name: x})[out_name]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_small_parameter_read_by_several_ops_is_one_tensor(lenet_mnist, tmp_path):
    """Lower rule 16: HardSigmoid written out (MUL, ADD, MAXIMUM, MINIMUM by scalars) three
    times after LeNet-5's real first convolution reads each scalar from one tensor, as the three
    Clip bounds and scale initializers of equal value are one; the outputs on real digits are the
    reference's."""
    import tflite
    from mconv.targets import get_target

    model, digits, _ = lenet_mnist
    w, b = _conv1(model)
    c, oh = w.shape[0], 28 - w.shape[2] + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["f"])]
    last = "f"
    for k in range(3):
        nodes.append(helper.make_node("HardSigmoid", [last], [f"h{k}"], alpha=0.25, beta=0.5))
        last = f"h{k}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(
        nodes,
        "params",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, oh, oh])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    t = get_target("tflite")
    bundle = t.export(m, tmp_path / "params", {})
    fm = tflite.Model.GetRootAsModel((bundle.root / "model.tflite").read_bytes(), 0)
    sg = fm.Subgraphs(0)
    code = {v: k for k, v in vars(tflite.BuiltinOperator).items() if isinstance(v, int)}
    readers: dict[str, set[int]] = {}
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        oc = fm.OperatorCodes(op.OpcodeIndex())
        name = code[max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())]
        if name in ("MUL", "ADD", "MAXIMUM", "MINIMUM"):
            readers.setdefault(name, set()).add(int(op.InputsAsNumpy()[1]))
    assert set(readers) == {"MUL", "ADD", "MAXIMUM", "MINIMUM"}, readers
    assert all(len(v) == 1 for v in readers.values()), readers  # three ops, one scalar tensor
    _check(m, t, bundle, digits, "y")
