"""Benchmark: metal bundles run through the Linux C++ harness, against the reference executor.

For each model: export time, bundle size (and weights.mcw size), harness compile time, harness
run time for one sample, and agreement with mconv's reference executor (max abs error, the
output's scale, cosine) on the logits (the Softmax input, added as an output) and the final
output. Prints a markdown table.

    python bench/metal_harness.py [--models lenet,lenet-fp32,mobilenet,alexnet,resnet50,lenet-dc]
    python bench/metal_harness.py --models keras-mobilenetv2,keras-efficientnetb0,keras-resnet50,keras-densenet121

Models: Caffe LeNet-5 (../shared/models/caffe), a MobileNet-style depthwise net built with
onnx.helper, onnx's light AlexNet and ResNet-50 (folded, random He-scaled weights), and LeNet-5
after ``prune(sparsity=0.8),cluster(bits=5)``; Keras 3 applications (``keras-*``, 64x64 inputs,
weights redrawn as in tests/targets/metal/test_framework_models.py). The harness compiles with -O2 -march=native; the
first run of a bundle includes the compile (cached afterwards under $TMPDIR).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "targets" / "metal"))  # the tests' model builders

from mconv.targets.metal import TARGET  # noqa: E402
from mconv.targets.metal.harness import compile_harness  # noqa: E402
from mconv.targets.reference import ReferenceRunner  # noqa: E402
from metal_models import agreement, light_with_random_weights, mobilenet_style  # noqa: E402

SHARED = ROOT.parent / "shared"


def with_logits(model):
    for node in model.graph:
        if node.op_type == "Softmax" and node.inputs[0].name not in {v.name for v in model.graph.outputs}:
            model.graph.outputs.append(node.inputs[0])
    return model


def lenet():
    from mconv.formats import import_model

    caffe = SHARED / "models" / "caffe"
    return import_model([caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"])


def lenet_dc():
    from mconv.passes import parse_spec, run_pipeline

    model, _ = run_pipeline(lenet(), parse_spec("prune(sparsity=0.8),cluster(bits=5)"))
    return model


def keras_app(app: str, size: int = 64):
    """A Keras 3 application (KERAS_BACKEND=jax, weights=None, seeded) saved as .keras in a
    subprocess, imported with mconv, kernels and BatchNorm statistics redrawn (the test's rule)."""
    import os
    import subprocess

    from mconv.formats import import_model
    from test_framework_models import redraw_weights

    script = (
        "import os, sys\nos.environ['KERAS_BACKEND'] = 'jax'\nimport keras\nkeras.utils.set_random_seed(0)\n"
        f"keras.applications.{app}(weights=None, input_shape=({size}, {size}, 3)).save(sys.argv[1])\n"
    )
    path = Path(tempfile.mkdtemp(prefix="mconv-keras.")) / f"{app}.keras"
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, capture_output=True)
    model = import_model([path])
    shutil.rmtree(path.parent, ignore_errors=True)
    redraw_weights(model, seed=3)
    return model


MODELS = {
    **{
        f"keras-{app.lower()}": (lambda app=app: keras_app(app), "fp16")
        for app in ("MobileNetV2", "EfficientNetB0", "ResNet50", "DenseNet121")
    },
    "lenet": (lenet, "fp16"),
    "lenet-fp32": (lenet, "fp32"),
    "mobilenet": (mobilenet_style, "fp16"),
    "alexnet": (lambda: light_with_random_weights("bvlc_alexnet"), "fp16"),
    "resnet50": (lambda: light_with_random_weights("resnet50"), "fp16"),
    "lenet-dc": (lenet_dc, "fp16"),
}


def bench(name: str, work: Path) -> dict:
    build, precision = MODELS[name]
    model = with_logits(build())
    inp = [v for v in model.graph.inputs if v.name not in model.graph.initializers][0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected = ReferenceRunner(model).run({inp.name: x})
    t0 = time.perf_counter()
    bundle = TARGET.export(model, work / name, {"precision": precision})
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    from mconv.targets.metal import regenerate

    plan, kernels, _ = regenerate(bundle, str(bundle.root))  # only text mconv generated compiles
    compile_harness(plan, kernels)
    compile_s = time.perf_counter() - t0
    runner = TARGET.load(bundle)
    t0 = time.perf_counter()
    got = runner.run({inp.name: x})
    run_s = time.perf_counter() - t0
    rows = {}
    for out, ref in expected.items():
        rows[out] = agreement(ref, got[out])
    files = bundle.manifest["files"]
    return {
        "model": name,
        "precision": precision,
        "layers": len(plan.layers),
        "export_s": export_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "bundle_bytes": sum(f["bytes"] for f in files.values()),
        "weights_bytes": files.get("weights.mcw", {}).get("bytes", 0),
        "agreement": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mconv-metal-bench."))
    print(
        "| model | storage | layers | export s | compile s | run s | bundle MB | weights MB | output | max abs | scale | cosine |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for name in args.models.split(","):
            try:
                r = bench(name, work)
            except Exception as exc:  # noqa: BLE001 - report and go on to the next model
                print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:120]} |||||||||||")
                continue
            for out, (err, scale, cos) in r["agreement"].items():
                print(
                    f"| {r['model']} | {r['precision']} | {r['layers']} | {r['export_s']:.1f} | {r['compile_s']:.1f} | "
                    f"{r['run_s']:.1f} | {r['bundle_bytes'] / 1e6:.2f} | {r['weights_bytes'] / 1e6:.2f} | {out} | "
                    f"{err:.3g} | {scale:.3g} | {cos:.6f} |",
                    flush=True,
                )
            shutil.rmtree(work / name, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
