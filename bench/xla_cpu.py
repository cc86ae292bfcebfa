"""The xla bundle against ONNX Runtime on the CPU, in one run (issue 15 item 3).

Light AlexNet (onnx's ``light_bvlc_alexnet`` with He-normal weights, its batch freed by the
``dynamic-batch`` pass) is exported twice: ``--target xla`` (cpu platform) and ``--target cpu``
(ONNX Runtime). Measured side by side, interleaved so that load on a shared machine hits both:

- in-process latency: the loaded runner's ``run`` (xla: jitted call, weights on the device;
  ORT: the cpu bundle's session), warmup then the median of ``--runs``, at each batch;
- whole command: ``mconv run BUNDLE --input data_0=x.npy`` as a subprocess (interpreter start,
  imports, bundle check, load, compile, one run), median of ``--cli-runs``.

Prints a table with the ratios xla / ORT (target: within 2x) and writes $OUT/xla_cpu.json.

Usage::

    python bench/xla_cpu.py                 # batches 1 and 8, 15 runs, 3 CLI runs
    python bench/xla_cpu.py --batches 1 --runs 5 --cli-runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--cli-runs", type=int, default=3)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    from mconv import passes as P
    from mconv.fixtures.light import he_normal, light_model
    from mconv.irio import save_onnx
    from mconv.targets import get_target

    tmp = Path(tempfile.mkdtemp(prefix="xla_cpu_"))
    try:
        model = light_model("bvlc_alexnet", he_normal, seed=0)
        model, _ = P.run_pipeline(model, P.parse_spec("dynamic-batch"), P.PassContext())
        save_onnx(model, tmp / "alexnet.onnx")
        get_target("xla").export(model, tmp / "xla", {"platforms": ["cpu"]})
        get_target("cpu").export(model, tmp / "cpu", {})
        xla = get_target("xla").load(str(tmp / "xla"))
        from mconv.bundle import load_bundle

        ort = get_target("cpu").load(load_bundle(tmp / "cpu"))
        name = xla.inputs[0].name
        rows = []
        for b in batches:
            x = np.random.default_rng(b).standard_normal((b, 3, 224, 224)).astype(np.float32)
            want = ort.run({name: x})
            got = xla.run({name: x})
            key = next(iter(want))
            err = float(np.max(np.abs(got[key] - want[key])))
            for _ in range(3):
                xla.run({name: x})
                ort.run({name: x})
            tx, to = [], []
            for _ in range(args.runs):  # interleaved: a busy neighbour slows both
                t = time.perf_counter()
                xla.run({name: x})
                tx.append(time.perf_counter() - t)
                t = time.perf_counter()
                ort.run({name: x})
                to.append(time.perf_counter() - t)
            rows.append(
                {
                    "what": f"in-process, batch {b}",
                    "xla_ms": _median_ms(tx),
                    "ort_ms": _median_ms(to),
                    "max_abs_diff": err,
                }
            )
        np.save(tmp / "x.npy", np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
        mconv = [sys.executable, "-m", "mconv"]
        cx, co = [], []
        for _ in range(args.cli_runs):
            for bundle, acc in (("xla", cx), ("cpu", co)):
                cmd = [*mconv, "run", str(tmp / bundle), "--input", f"{name}={tmp / 'x.npy'}", "--quiet"]
                t = time.perf_counter()
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=600)
                acc.append(time.perf_counter() - t)
        rows.append(
            {"what": "mconv run (whole command), batch 1", "xla_ms": _median_ms(cx), "ort_ms": _median_ms(co)}
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"light AlexNet on the CPU ({os.cpu_count()} cores), xla bundle vs ONNX Runtime (cpu bundle)\n")
    print("| measurement | xla (ms) | ORT (ms) | xla / ORT |")
    print("|---|---|---|---|")
    for r in rows:
        r["ratio"] = r["xla_ms"] / r["ort_ms"]
        print(f"| {r['what']} | {r['xla_ms']:.1f} | {r['ort_ms']:.1f} | {r['ratio']:.2f}x |")
    out = os.environ.get("OUT")
    if out:
        Path(out, "xla_cpu.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
