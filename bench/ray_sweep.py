"""The sensitivity sweep of ResNet-50 on Ray: whole `mconv analyze` commands, in-process vs N workers.

ONNX's ``light_resnet50`` graph (He-normal weights, seed 0, the dynamic-batch pass so that the
calibration batch runs at once) over its 54 weight layers at 6 sparsities each (324 measured
points), on ``--samples`` random images, with the xla engine on the CPU by default (the
reference engine with ``--engine reference``). Each run is the whole command as a user types it
(``mconv analyze MODEL --data D --sweep ... --engine E [--workers N] --json``), timed from start
to exit; the reports must be identical to the in-process run's (the script says so and exits 1
if not).

    python bench/ray_sweep.py --workers 1,2             # the 2-core machine
    python bench/ray_sweep.py --workers 1,8 --samples 8 # a 16-core host
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SWEEP = "0.3,0.5,0.6,0.7,0.8,0.9"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workers", default="1,2", help="comma-separated worker counts (0 = in-process is always run)"
    )
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--engine", default="xla", choices=["xla", "reference"])
    ap.add_argument(
        "--model", default="resnet50", help="a light_* graph of onnx's (resnet50, squeezenet, ...)"
    )
    args = ap.parse_args()

    import onnx_ir as ir
    from mconv.fixtures.light import he_normal, light_model
    from mconv.passes import PassContext, parse_spec, run_pipeline

    tmp = Path(tempfile.mkdtemp(prefix="ray-sweep."))
    model, _ = run_pipeline(light_model(args.model, he_normal), parse_spec("dynamic-batch"), PassContext())
    path = tmp / f"{args.model}.onnx"
    ir.save(model, path)
    rng = np.random.default_rng(0)
    name = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers][0]
    np.savez(tmp / "data.npz", **{name: rng.standard_normal((args.samples, 3, 224, 224)).astype(np.float32)})
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # every worker on the host's CPUs, none on a GPU
    base = [sys.executable, "-m", "mconv", "analyze", str(path), "--data", str(tmp / "data.npz")]
    base += ["--sweep", SWEEP, "--engine", args.engine, "--json", "--quiet"]
    rows, reports = [], {}
    for workers in [0, *[int(w) for w in args.workers.split(",") if w.strip()]]:
        cmd = base + (["--workers", str(workers)] if workers else [])
        t = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t
        if res.returncode != 0:
            print(f"workers={workers}: exit {res.returncode}: {res.stderr.strip()[-400:]}")
            return 1
        reports[workers] = json.loads(res.stdout)
        rows.append((workers, wall))
        print(f"workers={workers}: {wall:.1f} s", file=sys.stderr, flush=True)
    layers = len(reports[0]["layers"])
    points = sum(len(layer["sweep"]) for layer in reports[0]["layers"])
    same = all(r == reports[0] for r in reports.values())
    print(
        f"{args.model}, cpus: {os.cpu_count()}, engine {args.engine}, {layers} layers, {points} sweep points, {args.samples} samples"
    )
    print("| run | wall (s) | speed-up vs in-process | report identical |")
    print("|---|---:|---:|---|")
    t0 = rows[0][1]
    for workers, wall in rows:
        label = "in-process" if workers == 0 else f"Ray, {workers} worker{'s' if workers > 1 else ''}"
        print(
            f"| {label} | {wall:.1f} | {t0 / wall:.2f}x | {'yes' if reports[workers] == reports[0] else 'NO'} |"
        )
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "ray_sweep.json").write_text(
            json.dumps({"rows": rows, "same": same, "cpus": os.cpu_count(), "layers": layers}, indent=2)
            + "\n"
        )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
