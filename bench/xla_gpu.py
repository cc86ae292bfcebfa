"""Latency of xla bundles vs PyTorch eager vs ONNX Runtime (AlexNet, VGG-19, ResNet-50).

The models are the ``light_*`` graphs of ONNX's backend test data with random weights (their
ConstantOfShape weight generators replaced by random initializers). Each is exported as an xla
bundle with a symbolic batch, loaded, and timed at each batch size: warmup runs, then the
median of N runs (``block_until_ready``). PyTorch eager runs torchvision's model of the same
name (weights=None, eval, no_grad, cuda synchronize); ``torch.compile`` the same module
compiled (default mode); ONNX Runtime runs the same ONNX graph
(CUDAExecutionProvider when available, else CPU, labelled). Missing torch/torchvision or
onnxruntime-gpu are reported, not fatal.

Usage::

    python bench/xla_gpu.py                      # all models, batch 1 and 64
    python bench/xla_gpu.py --models alexnet --batches 1 --runs 3   # CPU smoke

Prints a markdown table; writes $OUT/xla_gpu.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from mconv.fixtures.light import he_normal, light_model

MODELS = {"alexnet": "bvlc_alexnet", "vgg19": "vgg19", "resnet50": "resnet50"}


def timed(fn, warmup: int, runs: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_xla(model: ir.Model, batches, warmup, runs, platform) -> dict:
    import jax
    from mconv.targets.xla import export, load

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        from mconv import passes as P

        # the light graphs pin batch 1 (Reshape [1, ...]); the exporter refuses a symbolic batch then
        model, _ = P.run_pipeline(model, P.parse_spec("dynamic-batch"), P.PassContext())
        export(model, Path(tmp) / "b", {"platforms": [platform]})
        runner = load(str(Path(tmp) / "b"))
        name = runner.inputs[0].name
        for b in batches:
            x = jax.device_put(np.random.default_rng(0).standard_normal((b, 3, 224, 224)).astype(np.float32))

            def run(x=x):
                jax.block_until_ready(runner.call(x, *runner.weights))

            out[b] = timed(run, warmup, runs)
        del name
    return out


def bench_torch(arch: str, batches, warmup, runs, compiled: bool = False) -> tuple[dict, str]:
    try:
        import torch
        import torchvision
    except ImportError as exc:
        return {}, f"skipped ({exc.name} missing)"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    net = getattr(torchvision.models, arch)(weights=None).eval().to(dev)
    if compiled:
        net = torch.compile(net)  # default mode; each batch size compiles once, in the warmup
    out = {}
    with torch.no_grad():
        for b in batches:
            x = torch.randn(b, 3, 224, 224, device=dev)

            def run(x=x):
                net(x)
                if dev == "cuda":
                    torch.cuda.synchronize()

            out[b] = timed(run, warmup, runs)
    return out, f"PyTorch {'torch.compile' if compiled else 'eager'} ({dev})"


def bench_ort(model: ir.Model, batches, warmup, runs) -> tuple[dict, str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return {}, "skipped (onnxruntime missing)"
    providers = [
        p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()
    ]
    proto = ir.serde.serialize_model(model)
    # A symbolic batch: the Reshape's fixed [1, N] target becomes [0, N] (keep the batch).
    for node in proto.graph.node:
        if node.op_type == "Reshape":
            for init in proto.graph.initializer:
                if init.name == node.input[1]:
                    arr = onnx.numpy_helper.to_array(init).copy()
                    arr[0] = 0
                    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "b"
    del proto.graph.output[0].type.tensor_type.shape.dim[:]
    sess = ort.InferenceSession(proto.SerializeToString(), providers=providers)
    used = sess.get_providers()[0]
    name = sess.get_inputs()[0].name
    out = {}
    for b in batches:
        x = np.random.default_rng(0).standard_normal((b, 3, 224, 224)).astype(np.float32)
        out[b] = timed(lambda x=x: sess.run(None, {name: x}), warmup, runs)
    return out, f"ONNX Runtime ({used})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--skip", nargs="*", default=[], choices=["torch", "compile", "ort"])
    args = ap.parse_args()

    import jax

    platform = jax.devices()[0].platform  # "gpu" on CUDA machines
    platform = "cuda" if platform == "gpu" else platform
    results = {"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": []}
    for arch in args.models:
        model = light_model(MODELS[arch], he_normal)
        rows = {f"XLA bundle ({platform})": bench_xla(model, args.batches, args.warmup, args.runs, platform)}
        if "torch" not in args.skip:
            t, label = bench_torch(arch, args.batches, args.warmup, args.runs)
            rows[label] = t
        if "compile" not in args.skip:
            t, label = bench_torch(arch, args.batches, args.warmup, args.runs, compiled=True)
            rows[label] = t
        if "ort" not in args.skip:
            o, label = bench_ort(model, args.batches, args.warmup, args.runs)
            rows[label] = o
        for label, times in rows.items():
            results["rows"].append(
                {"model": arch, "runtime": label, "ms": {str(b): v for b, v in times.items()}}
            )
    head = "| model | runtime | " + " | ".join(f"batch {b} (ms)" for b in args.batches) + " |"
    print(
        f"device: {results['device']}, jax {results['jax']}, median of {args.runs} runs after {args.warmup} warmup"
    )
    print(head)
    print("|" + "---|" * (2 + len(args.batches)))
    for r in results["rows"]:
        cells = [f"{r['ms'][str(b)]:.2f}" if str(b) in r["ms"] else "-" for b in args.batches]
        print(f"| {r['model']} | {r['runtime']} | " + " | ".join(cells) + " |")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "xla_gpu.json"
        path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
