"""The workgroup-tiled kernels (mconv.targets.webgpu.tiled) on real MNIST digits, against ONNX
Runtime: both entry points (workgroup memory, and the direct one software adapters run), at
batch 1 (split-K matrix-vector products) and batch 16 (tiled Gemm), f32 and f16 storage."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from mconv.irio import save_onnx
from mconv.targets import get_target
from mconv.targets.webgpu import tiled
from onnx import helper

sys.path.insert(0, str(Path(__file__).parent))
from test_webgpu import make_model, needs_adapter  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[2]))
from _gates import assert_close  # noqa: E402
from mconv.targets.webgpu import runner as webgpu_runner  # noqa: E402


def cnn(seed: int):
    """Every tiled shape: a padded 3x3 conv, a strided one, a grouped one, a pointwise one with
    a fused Relu, a depthwise one (stays direct), then Gemm with B transposed, Gemm without, and
    a MatMul."""
    rng = np.random.default_rng(seed)

    def he(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:]))).astype(np.float32)

    w = {
        "c1w": he(16, 1, 3, 3),
        "c1b": (0.1 * rng.standard_normal(16)).astype(np.float32),
        "c2w": he(32, 16, 3, 3),
        "c3w": he(32, 8, 3, 3),
        "c3b": (0.1 * rng.standard_normal(32)).astype(np.float32),
        "c4w": he(40, 32, 1, 1),
        "c4b": (0.1 * rng.standard_normal(40)).astype(np.float32),
        "dww": he(40, 1, 3, 3),
        "f1w": he(100, 40 * 7 * 7),
        "f1b": (0.1 * rng.standard_normal(100)).astype(np.float32),
        "f2w": (rng.standard_normal((100, 72)) * 0.15).astype(np.float32),
        "f2b": (0.1 * rng.standard_normal(72)).astype(np.float32),
        "f3w": (rng.standard_normal((72, 10)) * 0.15).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2w"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Tanh", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "c3w", "c3b"], ["c3"], pads=[1, 1, 1, 1], group=4),
        helper.make_node("Conv", ["c3", "c4w", "c4b"], ["c4"]),
        helper.make_node("Relu", ["c4"], ["r4"]),
        helper.make_node("Conv", ["r4", "dww"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2], group=40),
        helper.make_node("Flatten", ["d"], ["f"]),
        helper.make_node("Gemm", ["f", "f1w", "f1b"], ["g1"], transB=1),
        helper.make_node("Relu", ["g1"], ["h1"]),
        helper.make_node("Gemm", ["h1", "f2w", "f2b"], ["g2"]),
        helper.make_node("Sigmoid", ["g2"], ["h2"]),
        helper.make_node("MatMul", ["h2", "f3w"], ["y"]),
    ]
    return make_model(nodes, [("x", ["N", 1, 28, 28])], ["y"], w, name="tiled_cnn")


def digits(shared: Path, n: int) -> np.ndarray:
    images = np.load(shared / "data" / "mnist5k.npz")["images"][:n]
    return (images.astype(np.float32) / 256.0)[:, None]


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiled") / "cnn.onnx"
    save_onnx(cnn(0), path)
    return path


def _run(path: Path, x: np.ndarray, tmp: Path, precision: str, shared_memory: bool, monkeypatch):
    from mconv.irio import load_onnx

    monkeypatch.setattr(webgpu_runner, "uses_shared_memory", lambda info: shared_memory)
    target = get_target("webgpu")
    bundle = target.export(load_onnx(path), tmp / "b", {"precision": precision, "batch": x.shape[0]})
    runner = target.load(bundle.root)
    try:
        return runner, runner.run({"x": x})["y"]
    finally:
        runner.close()


def _agrees_with_ort(model, x: np.ndarray, tmp: Path, monkeypatch, shared_memory: bool, what: str):
    """The model saved, run by ONNX Runtime and by the webgpu bundle on ``x``; the outputs
    agree at fp32's bound; the runner (its kernel sources) and its output."""
    path = tmp / f"{what.replace(' ', '_')}.onnx"
    save_onnx(model, path)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    runner, got = _run(path, x, tmp, "fp32", shared_memory, monkeypatch)
    assert_close(ref, got, "fp32", what=what)
    return runner, got, ref


@needs_adapter
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("shared_memory", [False, True], ids=["direct", "workgroup-memory"])
def test_tiled_kernels_agree_with_onnxruntime(onnx_path, shared, tmp_path, monkeypatch, batch, shared_memory):
    x = digits(shared, batch)
    ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    runner, got = _run(onnx_path, x, tmp_path, "fp32", shared_memory, monkeypatch)
    assert_close(ref, got, "fp32", what=f"batch {batch}")
    # the convolutions but the depthwise one and every matrix product ran tiled
    tiled_layers = [k for k, src in runner.sources.items() if f"fn {k}{tiled.DIRECT}(" in src]
    convs = [k for k in runner.sources if k.endswith("_conv")]
    assert len([k for k in tiled_layers if k.endswith("_conv")]) == len(convs) - 1
    assert len(tiled_layers) == len(convs) - 1 + 3


@needs_adapter
def test_tiled_kernels_in_half_storage(onnx_path, shared, tmp_path, monkeypatch):
    x = digits(shared, 8)
    ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    _, got = _run(onnx_path, x, tmp_path, "fp16", False, monkeypatch)
    assert_close(ref, got, "fp16")


def test_the_wgsl_is_deterministic_and_the_tiles_fit(onnx_path, tmp_path):
    from mconv.irio import load_onnx
    from mconv.targets.webgpu.plan import build_plan, prepare

    plans = [build_plan(prepare(load_onnx(onnx_path), 1)) for _ in range(2)]
    assert plans[0].sources == plans[1].sources
    for m, n, b in ((64, 3136, 1), (2048, 49, 1), (6, 784, 1), (10, 1, 1)):
        t = tiled.choose_tile(m, n, b)
        if t is not None:
            assert -(-m // t.tm) * -(-n // t.tn) * b * tiled.LANES <= m * n * b
            assert t.ty * t.tx == tiled.LANES
    assert tiled.choose_tile(64, 3136, 1) == tiled.Tile(32, 32, 4, 4)
    assert tiled.choose_tile(10, 1, 1) is None


def test_software_adapters_run_the_direct_entry_point():
    lavapipe = {"vendor": "llvmpipe", "device": "llvmpipe (LLVM 15.0.6, 256 bits)", "adapter_type": "CPU"}
    h100 = {"vendor": "NVIDIA", "device": "NVIDIA H100 80GB HBM3", "adapter_type": "DiscreteGPU"}
    assert not tiled.uses_shared_memory(lavapipe)
    assert tiled.uses_shared_memory(h100)
    src = "fn L1_conv(a: i32) {}\nfn L1_conv_direct(a: i32) {}\n"
    assert tiled.entry_point("L1_conv", src, shared=False) == "L1_conv_direct"
    assert tiled.entry_point("L1_conv", src, shared=True) == "L1_conv"
    assert tiled.entry_point("L2_add", "fn L2_add(a: i32) {}", shared=False) == "L2_add"


def downsample(seed: int):
    """ResNet's projection shortcut on digits: a 1x1 convolution of stride 2 (no padding) next
    to a padded 3x3 one of stride 2, added, then a Gemm."""
    rng = np.random.default_rng(seed)

    def he(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:]))).astype(np.float32)

    w = {
        "c0w": he(16, 1, 3, 3),
        "pw": he(32, 16, 1, 1),
        "pb": (0.1 * rng.standard_normal(32)).astype(np.float32),
        "sw": he(32, 16, 3, 3),
        "fw": he(10, 32 * 14 * 14),
    }
    nodes = [
        helper.make_node("Conv", ["x", "c0w"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "pw", "pb"], ["p"], strides=[2, 2]),
        helper.make_node("Conv", ["r0", "sw"], ["s"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Add", ["p", "s"], ["a"]),
        helper.make_node("Flatten", ["a"], ["f"]),
        helper.make_node("Gemm", ["f", "fw"], ["y"], transB=1),
    ]
    return make_model(nodes, [("x", ["N", 1, 28, 28])], ["y"], w, name="downsample")


@needs_adapter
@pytest.mark.parametrize("shared_memory", [False, True], ids=["direct", "workgroup-memory"])
def test_strided_pointwise_convolution_agrees_with_onnxruntime(shared, tmp_path, monkeypatch, shared_memory):
    runner, _, _ = _agrees_with_ort(
        downsample(1), digits(shared, 2), tmp_path, monkeypatch, shared_memory, "downsample"
    )
    # the strided 1x1 convolution reads its pixels without a padding test (no select of zero)
    pointwise = [s for k, s in runner.sources.items() if k.endswith("_conv") and "const KH: i32 = 1;" in s]
    assert len(pointwise) == 1 and "const SH: i32 = 2;" in pointwise[0]
    direct = pointwise[0].split(f"{tiled.DIRECT}(", 1)[1]
    assert "select(0.0f" not in direct and "* SH * IW" in direct


def test_direct_register_blocks_cover_the_tile():
    """Rule 6: the direct entry's fewer invocations compute exactly the tile's outputs."""
    for t in tiled.CANDIDATES:
        d = tiled.direct_tile(t)
        assert (d.tm, d.tn, d.rn) == (t.tm, t.tn, t.rn)
        assert d.rm in (t.rm, t.rm * tiled.DIRECT_FOLD)
        rows = sorted(ty + i * d.ty for ty in range(d.ty) for i in range(d.rm))
        assert rows == list(range(t.tm))
        assert d.ty * d.tx <= tiled.LANES


def deep(seed: int):
    """Rule 8's layers: a 3x3 convolution of 64 channels on a 7x7 map (K = 576, a handful of
    tiles) and a Gemm of K = 6,272, both with lane groups sharing K."""
    rng = np.random.default_rng(seed)

    def he(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:]))).astype(np.float32)

    w = {
        "c1w": he(64, 1, 4, 4),
        "c2w": he(128, 64, 3, 3),
        "c2b": (0.1 * rng.standard_normal(128)).astype(np.float32),
        "fw": he(10, 128 * 7 * 7),
    }
    nodes = [
        helper.make_node("Conv", ["x", "c1w"], ["c1"], strides=[4, 4]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Flatten", ["r2"], ["f"]),
        helper.make_node("Gemm", ["f", "fw"], ["y"], transB=1),
    ]
    return make_model(nodes, [("x", ["N", 1, 28, 28])], ["y"], w, name="split_k")


@needs_adapter
@pytest.mark.parametrize("shared_memory", [False, True], ids=["direct", "workgroup-memory"])
def test_lane_groups_share_long_k_loops(shared, tmp_path, monkeypatch, shared_memory):
    runner, got, ref = _agrees_with_ort(
        deep(1), digits(shared, 8), tmp_path, monkeypatch, shared_memory, "lane groups"
    )
    grouped = [k for k, src in runner.sources.items() if f"@workgroup_size({4 * tiled.LANES})" in src]
    assert any(k.endswith("_conv") for k in grouped) and any(k.endswith("_gemm") for k in grouped), grouped
    # a digit's class scores agree with ONNX Runtime's
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_lane_groups_follow_the_layer():
    t = tiled.Tile(32, 32, 4, 4)
    assert tiled.k_groups(8, 4608, t) == 4  # few tiles, long K
    assert tiled.k_groups(8, 200, t) == 1  # too short to split
    assert tiled.k_groups(1024, 4608, t) == 1  # enough tiles already
    assert tiled.k_groups(300, 4608, t) == 2  # 2 groups reach SPLIT_BELOW
    for ks in (2, 4):
        slab = ks * tiled.TK * (t.tm + t.tn)
        assert 4 * max(slab, (ks - 1) * t.tm * t.tn) <= tiled.WORKGROUP_BYTES


@needs_adapter
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shared_memory", [False, True], ids=["direct", "workgroup-memory"])
def test_long_softmax_rows_take_a_workgroup(shared, tmp_path, monkeypatch, op, shared_memory):
    """Rule 9: a 1,000-way (Log)Softmax of a digit's features, a workgroup a row, against ORT."""
    rng = np.random.default_rng(3)
    w = {"fw": (rng.standard_normal((784, 1000)) * 0.2).astype(np.float32)}
    nodes = [
        helper.make_node("Flatten", ["x"], ["f"]),
        helper.make_node("MatMul", ["f", "fw"], ["z"]),
        helper.make_node(op, ["z"], ["y"], axis=1),
    ]
    model = make_model(nodes, [("x", ["N", 1, 28, 28])], ["y"], w, name="softmax_rows")
    runner, _, _ = _agrees_with_ort(model, digits(shared, 4), tmp_path, monkeypatch, shared_memory, op)
    kernel = next(k for k in runner.sources if k.endswith("softmax"))
    assert "var<workgroup> Red" in runner.sources[kernel]
