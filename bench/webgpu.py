"""Benchmark: webgpu bundles on this machine's WebGPU adapter (lavapipe on a CPU) next to ONNX Runtime.

For each model: export time, the bundle's layers, agreement with mconv's reference executor
(max abs error, the output's scale, cosine) on every output, and one whole `mconv run`-style
command each way, timed from the bundle on disk to the outputs in hand (webgpu: load the bundle,
decode weights, compile every kernel, one inference; ORT: load the cpu bundle, one inference),
their ratio, plus one warm inference each. Optionally the page in headless Chromium too
(``--page``: SwiftShader's Vulkan, the page's median of 3). Prints a markdown table.

    python bench/webgpu.py [--models alexnet,resnet50,lenet,mobilenet,pruned] [--precision fp32] [--page]

Models: onnx's light AlexNet and ResNet-50 (folded, He-normal fill of fixtures/light.py, seed
0), the LeNet-5 and MobileNet-style test builders, and that LeNet-5 pruned to 80% and clustered
to 5 bits (``pruned``). One run each (the whole-command figure is a
cold start and is not repeated).
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
sys.path.insert(0, str(ROOT / "tests" / "targets" / "metal"))
sys.path.insert(0, str(ROOT / "tests" / "targets" / "webgpu"))

from mconv.fixtures.light import he_normal, light_model  # noqa: E402
from mconv.targets import get_target  # noqa: E402
from metal_models import agreement, mobilenet_style  # noqa: E402


def build(name: str):
    if name in ("alexnet", "resnet50"):
        return light_model({"alexnet": "bvlc_alexnet", "resnet50": "resnet50"}[name], he_normal, 0)
    if name == "lenet":
        from test_webgpu import lenet

        return lenet(0)
    if name == "mobilenet":
        return mobilenet_style(2)
    if name == "pruned":  # issue 5's pruned and clustered LeNet-5
        from mconv.passes import parse_spec, run_pipeline
        from test_webgpu import lenet

        return run_pipeline(lenet(0), parse_spec("prune(sparsity=0.8),cluster(bits=5)"))[0]
    raise SystemExit(f"unknown model {name}")


def feeds_for(model, seed: int = 0) -> dict[str, np.ndarray]:
    from mconv.irio import real_inputs

    rng = np.random.default_rng(seed)
    out = {}
    for v in real_inputs(model.graph):
        shape = [d if isinstance(d, int) else 1 for d in v.shape]
        out[v.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def warm(fn, feeds, runs: int) -> float:
    """The median of ``runs`` timed calls of ``fn(feeds)``, in seconds."""
    times = []
    for _ in range(max(runs, 1)):
        t = time.perf_counter()
        fn(feeds)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="alexnet,resnet50")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--page", action="store_true", help="also run the bundle's page in headless Chromium")
    ap.add_argument("--runs", type=int, default=1, help="warm inferences timed (the median is shown)")
    ap.add_argument(
        "--xla",
        action="store_true",
        help="also time the xla bundle (jax's first device: a GPU where there is one)",
    )
    ap.add_argument("--direct", action="store_true", help="direct kernels only (no workgroup tiling)")
    ap.add_argument("--profile", action="store_true", help="each layer's GPU time (timestamp queries)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        help="NAME=INT: a constant of mconv.targets.webgpu.tiled for this run (e.g. MIN_WORKGROUPS=512)",
    )
    args = ap.parse_args()
    from mconv.targets.webgpu import tiled

    if args.direct:
        tiled.TILING = False
    for item in args.set:
        key, _, value = item.partition("=")
        if not hasattr(tiled, key):
            raise SystemExit(f"tiled has no constant {key}")
        setattr(tiled, key, int(value))
    webgpu, cpu = get_target("webgpu"), get_target("cpu")
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-webgpu."))
    try:
        for name in args.models.split(","):
            model = build(name)
            feeds = feeds_for(model)
            ref = get_target("reference").load_model(model).run(feeds)
            t = time.perf_counter()
            bundle = webgpu.export(model, tmp / f"{name}.webgpu", {"precision": args.precision})
            export_s = time.perf_counter() - t
            cpu.export(build(name), tmp / f"{name}.cpu", {})

            t = time.perf_counter()
            runner = webgpu.load(bundle.root)
            got = runner.run(feeds)
            webgpu_cmd = time.perf_counter() - t
            webgpu_warm = warm(runner.run, feeds, args.runs)
            if args.profile:
                prof = runner.profile(feeds, runs=max(args.runs, 3))
                total = sum(p["ms"] for p in prof)
                print(
                    f"{name}: {len(prof)} layers, GPU sum {total:.2f} ms, warm {webgpu_warm * 1e3:.2f} ms "
                    f"({runner.adapter_info})",
                    flush=True,
                )
                for p in sorted(prof, key=lambda p: -p["ms"])[:25]:
                    print(
                        f"  {p['ms']:8.3f} ms  {p['layer']:3d} {p['kernel']:<40} grid {p['grid']}", flush=True
                    )

            t = time.perf_counter()
            ort = cpu.load(tmp / f"{name}.cpu")
            ort.run(feeds)
            ort_cmd = time.perf_counter() - t
            ort_warm = warm(ort.run, feeds, args.runs)
            xla_warm, xla_s = "", 0.0
            if args.xla:
                import jax

                platform = {"gpu": "cuda"}.get(jax.devices()[0].platform, jax.devices()[0].platform)
                xb = get_target("xla").export(build(name), tmp / f"{name}.xla", {"platforms": [platform]})
                xr = get_target("xla").load(xb.root)
                xr.run(feeds)
                xla_s = warm(xr.run, feeds, args.runs)
                xla_warm = f"{xla_s * 1e3:.2f} ms ({platform})"

            cos = min(agreement(ref[k], got[k])[2] for k in ref)
            err, scale = max((agreement(ref[k], got[k])[:2] for k in ref), key=lambda e: e[0])
            page = ""
            if args.page:
                from mconv.targets.webgpu.browser import run_page

                r = run_page(bundle.root, feeds, runs=3, timeout_s=900)
                if "error" in r:
                    page = r["error"][:60]
                else:
                    pcos = min(agreement(ref[k], r["outputs"][k])[2] for k in ref)
                    page = f"{r['median_ms']:.0f} ms, cos {pcos:.7f} ({r['storage']})"
            rows.append(
                (
                    name,
                    args.precision,
                    str(len(runner.plan.layers)),
                    f"{export_s:.1f} s",
                    f"{err:.2e} / {scale:.2e}",
                    f"{cos:.7f}",
                    f"{webgpu_cmd:.2f} s",
                    f"{ort_cmd:.2f} s",
                    f"{webgpu_cmd / ort_cmd:.1f}x",
                    f"{webgpu_warm * 1e3:.2f} ms",
                    f"{ort_warm * 1e3:.2f} ms",
                    f"{webgpu_warm / ort_warm:.2f}x",
                    xla_warm + (f", webgpu / xla {webgpu_warm / xla_s:.2f}x" if xla_s else ""),
                    page,
                )
            )
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
            runner.close()
        adapter = runner.adapter_info if rows else {}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"adapter: {adapter}")
    head = (
        "model",
        "precision",
        "layers",
        "export",
        "max err / scale",
        "cosine",
        "webgpu command",
        "ORT command",
        "ratio",
        "webgpu warm",
        "ORT warm",
        "warm ratio",
        "xla warm",
        "page (Chromium)",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
