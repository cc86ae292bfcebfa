"""CNNs as the frameworks write them, through the metal bundle and the C++ harness.

- a MobileNetV3/U-Net-style torch module (hardswish stem, depthwise relu6, squeeze-excite with
  hardsigmoid, bilinear upsampling, ConvTranspose, channel slices, concat, reflect pad, global
  average pool, flatten, linear, softmax, x**2 of a mean) exported by torch's TorchScript
  exporter at opsets 13 and 17 with a symbolic batch: checked against torch and the reference;
- a Keras 3 application (MobileNetV2; EfficientNetB0 and others in bench/metal_harness.py;
  KERAS_BACKEND=jax, weights=None, seeded)
  saved as .keras in a subprocess and imported with mconv, weights redrawn so that the logits
  are not vanishingly small: checked against the reference executor.

fp32: rtol 1e-4 against the reference; fp16: cosine >= 0.999, max abs error <= 2% of scale.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import onnx_ir as ir
import pytest
from mconv.targets.metal import TARGET
from mconv.targets.reference import ReferenceRunner
from metal_models import assert_fp16_close, needs_cxx

pytestmark = needs_cxx


def compare(model, feeds, tmp_path, precision):
    want = ReferenceRunner(model).run(feeds)
    bundle = TARGET.export(model, tmp_path / f"b_{precision}", {"precision": precision})
    got = TARGET.load(bundle).run(feeds)
    for name, ref in want.items():
        if precision == "fp32":
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref).max()))
        else:
            assert_fp16_close(ref, got[name])
    layers = json.loads((bundle.root / "metal_plan.json").read_text())["layers"]
    return got, [layer["op"] for layer in layers]


def _torch_module():
    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional

    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, c // 2, 1), nn.Conv2d(c // 2, c, 1)

        def forward(self, x):
            y = F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))
            return x * F.hardsigmoid(self.fc2(y))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.Hardswish())
            self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, groups=8), nn.BatchNorm2d(8), nn.ReLU6())
            self.se = SE(8)
            self.up = nn.ConvTranspose2d(8, 4, 2, 2)
            self.head = nn.Linear(12, 5)

        def forward(self, x):
            y = self.se(self.dw(self.stem(x)))
            u = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
            u = F.pad(torch.cat([u[:, :4], self.up(y)], 1), (1, 1, 1, 1), mode="reflect")
            p = torch.flatten(F.adaptive_avg_pool2d(torch.cat([u, u[:, :4]], 1), 1), 1)
            return torch.softmax(self.head(p), -1), p.mean(1, keepdim=True) ** 2

    torch.manual_seed(0)
    net = Net().eval()
    gen = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=gen) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return torch, net


@pytest.mark.parametrize(("opset", "precision"), [(13, "fp32"), (17, "fp32"), (17, "fp16")])
def test_torchscript_export_of_a_mobilenetv3_unet_style_module_agrees_with_torch(tmp_path, opset, precision):
    torch, net = _torch_module()
    import onnx
    from mconv.irio import from_proto

    x = torch.from_numpy(np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32))
    buf = io.BytesIO()
    torch.onnx.export(
        net, (x,), buf, opset_version=opset, input_names=["x"], dynamic_axes={"x": {0: "N"}}, dynamo=False
    )
    model = from_proto(onnx.load_from_string(buf.getvalue()))
    assert not isinstance(model.graph.inputs[0].shape[0], int)  # a symbolic batch, baked to 1
    got, ops = compare(model, {"x": x.numpy()}, tmp_path, precision)
    with torch.no_grad():
        expected = [t.numpy() for t in net(x)]
    for ref, name in zip(expected, [v.name for v in model.graph.outputs]):
        tol = 1e-4 if precision == "fp32" else 2e-2
        np.testing.assert_allclose(got[name], ref, rtol=tol, atol=tol * np.abs(ref).max())
    assert {"ConvTranspose", "Resize", "Pad", "Concat"} <= {op.split("+")[0] for op in ops}


KERAS_SCRIPT = """
import os, sys
os.environ["KERAS_BACKEND"] = "jax"
import keras
keras.utils.set_random_seed(0)
apps = {"mobilenetv2": lambda: keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), alpha=0.35),
        "efficientnetb0": lambda: keras.applications.EfficientNetB0(weights=None, input_shape=(32, 32, 3))}
apps[sys.argv[1]]().save(sys.argv[2])
"""


def redraw_weights(model: ir.Model, seed: int) -> None:
    """He-scaled kernels, BatchNorm scales/variances in [0.5, 1.5], small offsets."""
    rng = np.random.default_rng(seed)
    for v in model.graph.initializers.values():
        a = v.const_value.numpy()
        if a.dtype != np.float32 or a.size < 2:
            continue
        if a.ndim >= 2:
            fan = a.size // a.shape[0] if a.ndim == 4 else a.shape[0]
            new = rng.standard_normal(a.shape) * np.sqrt(2.0 / max(fan, 1))
        elif np.all(a == 1):
            new = rng.uniform(0.5, 1.5, a.shape)
        else:
            new = 0.1 * rng.standard_normal(a.shape)
        v.const_value = ir.tensor(new.astype(np.float32))


@pytest.mark.parametrize("app", ["mobilenetv2"])  # efficientnetb0 too in bench/metal_harness.py
def test_keras_application_exports_to_metal_and_agrees_with_the_reference(tmp_path, app):
    import importlib.util

    from mconv.formats import import_model

    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("keras with the jax backend is not installed")

    path = tmp_path / f"{app}.keras"
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    proc = subprocess.run(
        [sys.executable, "-c", KERAS_SCRIPT, app, str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = import_model([path])
    redraw_weights(model, seed=3)
    for node in list(model.graph):  # the logits too: the softmax of random weights is flat
        if node.op_type == "Softmax":
            model.graph.outputs.append(node.inputs[0])
    name = model.graph.inputs[0].name
    x = np.random.default_rng(4).standard_normal((1, 32, 32, 3)).astype(np.float32)
    for precision in ("fp32", "fp16"):
        _, ops = compare(model, {name: x}, tmp_path, precision)
    assert not any(op.startswith("BatchNormalization") for op in ops)  # all folded into convs
    if app == "mobilenetv2":
        assert "Conv+relu+clip" in ops and "Min" not in ops  # relu6 = Relu, Min: one kernel
