"""Benchmark: the fp16 recipe on AlexNet (onnx's light_bvlc_alexnet, 61M random weights).

Folds the ConstantOfShape weight generators first, fills the weights with random values (a
constant tensor would flatter nothing here, but real-looking data is honest), then runs the
``fp16`` recipe. Prints time, peak RSS and bytes before/after; with ``--save DIR`` also the saved
``.onnx`` sizes and whether onnxruntime agrees.

    python bench/optimize_fp16.py [--save /tmp/fp16bench]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import mconv.passes as P
import numpy as np
import onnx
import onnx_ir as ir
from mconv.irio import load_onnx, save_onnx

ALEXNET = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_bvlc_alexnet.onnx"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path, help="directory to save the models before/after")
    args = ap.parse_args()

    model = load_onnx(ALEXNET)
    t0 = time.perf_counter()
    model, fold_reports = P.run_pipeline(model, P.parse_spec("fold,dce"))
    t_fold = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    for name, value in model.graph.initializers.items():
        t = value.const_value
        if t.dtype == ir.DataType.FLOAT:
            value.const_value = ir.tensor(rng.standard_normal(t.shape.numpy(), np.float32) * 0.01, name=name)
    rss_before = peak_rss_mb()
    if args.save:
        before_file = save_onnx(model, args.save / "alexnet_fp32.onnx")[0]

    t0 = time.perf_counter()
    model, reports = P.run_pipeline(model, P.load_recipe("fp16"))
    t_fp16 = time.perf_counter() - t0
    first, last = reports[0], reports[-1]

    rows = [
        ("fold+dce (ConstantOfShape -> initializers)", f"{t_fold:.2f} s"),
        ("parameters", f"{fold_reports[-1].params_after:,}"),
        ("fp16 recipe time", f"{t_fp16:.2f} s"),
        ("weight bytes before", f"{first.bytes_before:,}"),
        ("weight bytes after", f"{last.bytes_after:,}"),
        ("ratio", f"{first.bytes_before / last.bytes_after:.3f}x"),
        ("peak RSS before fp16 / after", f"{rss_before:.0f} MB / {peak_rss_mb():.0f} MB"),
    ]
    if args.save:
        after_file = save_onnx(model, args.save / "alexnet_fp16.onnx")[0]
        rows.append(
            ("saved .onnx before / after", f"{before_file.stat().st_size:,} / {after_file.stat().st_size:,}")
        )
        import onnxruntime as ort

        x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
        outs = [
            ort.InferenceSession(str(f), providers=["CPUExecutionProvider"]).run(None, {"data_0": x})[0]
            for f in (before_file, after_file)
        ]
        rows.append(("onnxruntime max |fp32 - fp16| (softmax)", f"{np.abs(outs[0] - outs[1]).max():.2e}"))
    width = max(len(k) for k, _ in rows)
    for key, val in rows:
        print(f"{key:<{width}}  {val}")


if __name__ == "__main__":
    main()
