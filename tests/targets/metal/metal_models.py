"""Model builders and oracles for the metal target's tests (``from metal_models import ...``)."""

from __future__ import annotations

import shutil

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.irio import from_proto, to_proto
from onnx import TensorProto, helper, numpy_helper

needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("clang++") is None, reason="no C++ compiler for the harness"
)


def make_model(
    nodes, inputs, outputs, weights: dict[str, np.ndarray], opset: int = 17, name: str = "net"
) -> ir.Model:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, k) for k, a in weights.items()],
    )
    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def run_ort(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = to_proto(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    """(max abs error, the output's scale (max |ref|), cosine similarity)."""
    a = np.asarray(ref, np.float64).ravel()
    g = np.asarray(got, np.float64).ravel()
    cos = float(a @ g / (np.linalg.norm(a) * np.linalg.norm(g))) if a.any() else float(not g.any())
    return float(np.abs(a - g).max()), float(np.abs(a).max()), cos


def assert_fp16_close(ref: np.ndarray, got: np.ndarray, rel: float = 2e-2) -> None:
    """fp16 storage: cosine >= 0.999 and max abs error <= rel x the output's scale."""
    assert got.shape == ref.shape
    err, scale, cos = agreement(ref, got)
    assert cos >= 0.999, f"cosine {cos}"
    assert err <= rel * max(scale, 1e-6), f"max abs {err} for scale {scale}"


def mobilenet_style(seed: int = 0) -> ir.Model:
    """A small MobileNet-v1/v2-style net: conv-BN-relu6, depthwise-BN-relu6, pointwise, swish,
    residual Add, global average pool, flatten, fc, softmax (batch symbolic)."""
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {}

    def conv_bn(x, out, cin, cout, k, stride, group, act):
        w[f"{out}_w"] = (
            rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2 / (cin // group * k * k))
        ).astype(np.float32)
        for p, v in (
            ("s", 1 + 0.1 * rng.standard_normal(cout)),
            ("b", 0.1 * rng.standard_normal(cout)),
            ("m", 0.1 * rng.standard_normal(cout)),
            ("v", 0.5 + rng.random(cout)),
        ):
            w[f"{out}_{p}"] = v.astype(np.float32)
        nodes = [
            helper.make_node(
                "Conv",
                [x, f"{out}_w"],
                [f"{out}_c"],
                name=f"{out}_conv",
                pads=[k // 2] * 4,
                strides=[stride] * 2,
                group=group,
            ),
            helper.make_node(
                "BatchNormalization",
                [f"{out}_c", f"{out}_s", f"{out}_b", f"{out}_m", f"{out}_v"],
                [f"{out}_bn"],
                name=f"{out}_bn",
                epsilon=1e-3,
            ),
        ]
        if act == "relu6":
            nodes.append(helper.make_node("Clip", [f"{out}_bn", "zero", "six"], [out], name=f"{out}_relu6"))
        elif act == "swish":
            nodes += [
                helper.make_node("Sigmoid", [f"{out}_bn"], [f"{out}_sig"], name=f"{out}_sig"),
                helper.make_node("Mul", [f"{out}_bn", f"{out}_sig"], [out], name=f"{out}_swish"),
            ]
        else:
            nodes.append(helper.make_node("Identity", [f"{out}_bn"], [out], name=f"{out}_id"))
        return nodes

    w["zero"], w["six"] = np.float32(0), np.float32(6)
    nodes = []
    nodes += conv_bn("x", "a", 3, 16, 3, 2, 1, "relu6")  # 16x8x8
    nodes += conv_bn("a", "dw", 16, 16, 3, 1, 16, "relu6")  # depthwise
    nodes += conv_bn("dw", "pw", 16, 16, 1, 1, 1, "none")
    nodes.append(helper.make_node("Add", ["a", "pw"], ["res"], name="residual"))
    nodes += conv_bn("res", "dw2", 16, 16, 3, 2, 16, "swish")  # 16x4x4
    nodes += conv_bn("dw2", "pw2", 16, 24, 1, 1, 1, "relu6")
    w["fc_w"] = (rng.standard_normal((24, 10)) * 0.3).astype(np.float32)
    w["fc_b"] = (0.1 * rng.standard_normal(10)).astype(np.float32)
    nodes += [
        helper.make_node("GlobalAveragePool", ["pw2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc_w"], ["mm"], name="fc"),
        helper.make_node("Add", ["mm", "fc_b"], ["logits"], name="fc_bias"),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=-1),
    ]
    return make_model(nodes, [("x", ["N", 3, 16, 16])], ["prob"], w, opset=17, name="mobilenet-style")


def light_with_random_weights(name: str, seed: int = 0) -> ir.Model:
    """onnx's light_<name> model, folded to initializers, with He-scaled random weights."""
    from mconv.fixtures.light import light_model

    def fill(value_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        if len(shape) == 1:
            new = 0.1 + 0.01 * rng.standard_normal(shape)
            return np.abs(new) + 0.5 if "var" in value_name else new
        return rng.standard_normal(shape) * np.sqrt(2.0 / int(np.prod(shape[1:])))

    return light_model(name, fill, seed)


# -- GridSample cases, shared with tests/targets/webgpu/test_gridsample.py -------------------------

GRID_PADDINGS = ("zeros", "border", "reflection")
GRID_MODES = {
    16: ("bilinear", "nearest", "bicubic"),
    20: ("linear", "nearest", "cubic"),
    22: ("linear", "nearest", "cubic"),
}


def grid_special_points(size: int, align: bool) -> np.ndarray:
    """Normalized coordinates of every pixel centre and pixel edge of an axis of ``size``."""
    if align:
        centres = np.arange(size) * 2 / (size - 1) - 1
        edges = (np.arange(size - 1) + 0.5) * 2 / (size - 1) - 1
    else:
        centres, edges = (np.arange(size) + 0.5) * 2 / size - 1, np.arange(size + 1) * 2 / size - 1
    return np.concatenate([centres, edges])


def gridsample_model(opset: int, align: bool, size: list[int], out: list[int], modes=None, batch: int = 2):
    """X (batch, 3, *size) and a grid computed as Concat(gx, gy[, gz]) of (batch, *out, 1) inputs;
    one GridSample per mode x padding_mode, each output named ``<mode>_<padding>``."""
    rank = len(size)
    planes = ["gx", "gy", "gz"][:rank]
    nodes = [helper.make_node("Concat", planes, ["grid"], name="grid", axis=-1)]
    outs = []
    for mode in modes or GRID_MODES[opset]:
        for padding in GRID_PADDINGS:
            name = f"{mode}_{padding}"
            attrs = dict(mode=mode, padding_mode=padding, align_corners=int(align))
            nodes.append(helper.make_node("GridSample", ["x", "grid"], [name], name=f"gs_{name}", **attrs))
            outs.append(name)
    inputs = [("x", [batch, 3, *size]), *[(p, [batch, *out, 1]) for p in planes]]
    return make_model(nodes, inputs, outs, {}, opset=opset, name="gridsample"), outs


def gridsample_feeds(rng: np.random.Generator, align: bool, size: list[int], out: list[int], batch: int = 2):
    """X standard normal; each grid plane mixes its axis's pixel centres and edges (exact in f32
    for sizes 2^k, or 2^k + 1 with align_corners), points far outside [-1, 1] (reflection folds
    them more than once), +-1 exactly, and uniform points in [-1.6, 1.6], shuffled."""
    count = batch * int(np.prod(out))
    feeds = {"x": rng.standard_normal((batch, 3, *size)).astype(np.float32)}
    for plane, extent in zip(["gx", "gy", "gz"], reversed(size)):  # x addresses the last axis
        far = np.array([-7.3, -3.1, -1.0, 1.0, 2.2, 5.6])
        pts = np.concatenate([grid_special_points(extent, align), far, rng.uniform(-1.6, 1.6, count)])
        feeds[plane] = rng.permutation(pts[:count]).reshape(batch, *out, 1).astype(np.float32)
    return feeds


def assert_f32_close(got: dict, ref: dict, tol: float = 1e-5) -> None:
    """Same outputs, same shapes, max abs difference within ``tol``."""
    assert set(got) == set(ref)
    for name, want in ref.items():
        assert got[name].shape == want.shape, name
        err = float(np.abs(got[name].astype(np.float64) - want).max())
        assert err <= tol, f"{name}: max abs {err}"
