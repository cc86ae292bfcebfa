"""Bundle size per target for the same compressed model, and export time (issue 5).

The model is the real Caffe LeNet-5 (../shared/models/caffe, or $MCONV_SHARED) compressed with
the built-in ``deep-compression`` recipe (no fine-tuning data), then exported to every target
from the same ``.onnx``. All through the library's public API, one process.

    python bench/targets_size.py [SHARED_DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    from mconv import passes as P
    from mconv.api.runtime import open_model
    from mconv.formats import import_model
    from mconv.irio import model_stats, save_onnx
    from mconv.targets import get_target

    shared = Path(
        sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MCONV_SHARED", ROOT.parent / "shared")
    )
    caffe = shared / "models" / "caffe"
    model = import_model([caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"])
    dense_bytes = model_stats(model).bytes
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, _ = P.run_pipeline(model, P.load_recipe("deep-compression"), P.PassContext())
        save_onnx(model, work / "lenet_dc.onnx")
        onnx_bytes = (work / "lenet_dc.onnx").stat().st_size
        print(
            f"LeNet-5 (Caffe, real weights): dense float32 weights {dense_bytes:,} bytes; "
            f"deep-compression .onnx (dense initializers) {onnx_bytes:,} bytes"
        )
        print()
        print("| target | export s | bundle bytes | weights.mcw bytes | payload files |")
        print("|---|---:|---:|---:|---|")
        for target, options in (("cpu", {}), ("xla", {}), ("metal", {}), ("metal", {"precision": "fp32"})):
            m = open_model(work / "lenet_dc.onnx")
            label = target + (" fp32" if options else "")
            out = work / f"bundle_{label.replace(' ', '_')}"
            t0 = time.perf_counter()
            bundle = get_target(target).export(m, out, options)
            seconds = time.perf_counter() - t0
            files = bundle.manifest["files"]
            total = sum(f["bytes"] for f in files.values()) + (out / "manifest.json").stat().st_size
            weights = files.get("weights.mcw", {}).get("bytes", 0)
            payload = ", ".join(f"{k} {v['bytes']:,}" for k, v in sorted(files.items()) if k != "weights.mcw")
            print(f"| {label} | {seconds:.2f} | {total:,} | {weights:,} | {payload} |")


if __name__ == "__main__":
    main()
