"""P4: 1-D k-means weight clustering of one AlexNet fc6-sized tensor (4096 x 9216, 37.7M floats).

The tensor is trained-like: Student-t (3 degrees of freedom, heavy tails as real AlexNet fc
weights have) scaled to the He std sqrt(2 / 9216). Methods, each at 4 and 5 bits:

- mconv ``optimal`` (the headline): ``mconv.passes.cluster.cluster_array`` (the cluster pass's
  code): one O(n) pass bins the values by bit pattern (float16's precision, exact counts and
  sums), DP on the bins merged to a grid, Lloyd on the bins, exact nearest-centroid assignment
  through a bin -> centroid table.
- mconv ``linear`` (the pass's default): the same bins, linear init + Lloyd on the bins.
  Each mconv row is the best of ``--repeat`` runs (default 3), wall and CPU time apart.
- scikit-learn ``KMeans(n_clusters, n_init=1, init='k-means++', random_state=0)``: fitted on a
  random subsample (``--sk-sample``, default 1M values: the full tensor takes minutes), then every
  value is assigned to its nearest centre; MSE is over the full tensor.
- coremltools 9 ``palettize_weights`` k-means: the per-tensor routine palettize_weights runs for
  each weight (``palettize_weights._get_lut_and_indices(val, "KMEANS", nbits, None)``, which
  fits sklearn KMeans on the whole float32 tensor), timed when coremltools imports and
  ``--coremltools`` is given (slow); otherwise the issue's figure (25.8 s, 4-bit, no 5-bit
  mode) is printed as an external reference, NOT measured here.

    python bench/kmeans.py [--coremltools] [--sk-sample 1000000]
    python bench/kmeans.py --whole [--coremltools-python VENV/bin/python]

``--whole`` (issue 14 item 4) measures the product, not the function: the tensor is written as
``fc6.onnx`` (a Gemm with the 4096 x 9216 weight) and ``mconv optimize fc6.onnx --passes
"cluster(bits=4,init='optimal')"`` runs as its own process (wall and CPU time of the whole
process: start-up, load, pass, byte account, save and the ONNX Runtime check); a second,
in-process run times the pipeline and the predicted account apart (the account's share). With
``--coremltools-python`` (a Python where coremltools 9 imports, e.g. a venv beside this one) the
same seeded tensor goes through ``palettize_weights``' per-tensor k-means in that process, in
the same run, and both MSEs are printed.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def trained_like(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    std = np.sqrt(2.0 / shape[1])
    t = rng.standard_t(3, size=shape)
    return (t / np.sqrt(3.0) * std).astype(np.float32)  # t(3) has variance 3


def mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def run_sklearn(w: np.ndarray, bits: int, sample: int) -> tuple[float, float]:
    from sklearn.cluster import KMeans

    t0 = time.perf_counter()
    c0 = time.process_time()
    flat = w.ravel()
    rng = np.random.default_rng(0)
    fit_on = flat if sample >= flat.size else flat[rng.choice(flat.size, sample, replace=False)]
    km = KMeans(1 << bits, init="k-means++", n_init=1, random_state=0).fit(fit_on.reshape(-1, 1))
    centers = np.sort(km.cluster_centers_.ravel())
    mids = (centers[1:] + centers[:-1]) / 2
    out = centers.astype(np.float32)[np.searchsorted(mids.astype(np.float32), flat)]
    run_sklearn.cpu = time.process_time() - c0
    return time.perf_counter() - t0, mse(out, flat)


def run_coremltools(w: np.ndarray, bits: int) -> tuple[float, float]:
    from coremltools.optimize.coreml._quantization_passes import palettize_weights

    t0 = time.perf_counter()
    lut, indices = palettize_weights._get_lut_and_indices(w, "KMEANS", bits, None)
    seconds = time.perf_counter() - t0
    return seconds, mse(lut[indices.astype(np.int64)].reshape(w.shape), w)


_CML_SNIPPET = """
import sys, time, numpy as np
sys.path.insert(0, {bench!r})
from kmeans import trained_like, mse
from coremltools.optimize.coreml._quantization_passes import palettize_weights
w = trained_like((4096, 9216))
t0, c0 = time.perf_counter(), time.process_time()
lut, idx = palettize_weights._get_lut_and_indices(w, "KMEANS", 4, None)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(wall, cpu, mse(lut[idx.astype(np.int64)].reshape(w.shape), w))
"""


def whole(coremltools_python: str | None) -> None:
    import json
    import resource
    import shutil
    import subprocess
    import tempfile

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = trained_like((4096, 9216))
    print(f"machine load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "fc6.onnx")
        graph = helper.make_graph(
            [helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)],
            "fc6",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 9216])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])],
            [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.zeros(4096, np.float32), "B")],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
        out = os.path.join(tmp, "out.onnx")
        cmd = [
            shutil.which("mconv") or "mconv",
            "optimize",
            src,
            "--passes",
            "cluster(bits=4,init='optimal')",
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([*cmd, "-o", out, "--json"], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        report = json.loads(proc.stdout)
        clustered = numpy_helper.to_array(next(t for t in onnx.load(out).graph.initializer if t.name == "W"))
        ours = mse(clustered, w)
        print(
            f"mconv optimize (whole process): {wall:.2f} s wall, {cpu:.2f} s CPU, MSE {ours:.4e}, "
            f"predicted bundle weights {report['predicted_bundle_weight_bytes']:,} B"
        )
        share = _account_share(src, os.path.join(tmp, "again.onnx"))
        print(
            f"in-process: passes {share['passes'][0]:.2f} s wall / {share['passes'][1]:.2f} s CPU, "
            f"predicted account {share['account'][0]:.2f} s wall / {share['account'][1]:.2f} s CPU "
            f"({share['account'][1] / share['passes'][1]:.1%} of the passes' CPU)"
        )
    if coremltools_python:
        snippet = _CML_SNIPPET.format(bench=os.path.dirname(os.path.abspath(__file__)))
        res = subprocess.run([coremltools_python, "-c", snippet], capture_output=True, text=True)
        if res.returncode:
            print(f"coremltools: failed ({res.stderr.strip().splitlines()[-1:]})")
            return
        cwall, ccpu, cmse = (float(x) for x in res.stdout.split())
        print(
            f"coremltools 9 palettize_weights k-means (the call alone): {cwall:.2f} s wall, {ccpu:.2f} s CPU, MSE {cmse:.4e}"
        )
        print(
            f"whole mconv command is {cwall / wall:.1f}x faster (wall), {ccpu / cpu:.1f}x (CPU); "
            f"MSE mconv/coremltools = {ours / cmse:.4f}"
        )


def _account_share(src: str, out: str) -> dict:
    """Wall and CPU seconds of the pipeline and of the predicted account inside one optimize."""
    import mconv.account as account
    import mconv.api as api
    import mconv.passes as passes

    times: dict = {}

    def timed(mod, name: str, key: str) -> None:
        f = getattr(mod, name)

        def g(*a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            r = f(*a, **k)
            times[key] = (time.perf_counter() - t0, time.process_time() - c0)
            return r

        setattr(mod, name, g)

    timed(account, "predicted_account", "account")
    timed(passes, "run_pipeline", "passes")
    api.optimize(src, passes="cluster(bits=4,init='optimal')", output=out)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coremltools", action="store_true", help="also time coremltools (minutes)")
    ap.add_argument("--sk-sample", type=int, default=1_000_000, help="values sklearn is fitted on")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mconv method; the best is kept")
    ap.add_argument("--whole", action="store_true", help="time the whole mconv optimize process")
    ap.add_argument("--coremltools-python", help="a python with coremltools 9, for --whole")
    args = ap.parse_args()
    if args.whole:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _startup import compile_mconv

        compile_mconv()  # as pip install does: the timed command starts from bytecode
        whole(args.coremltools_python)
        return

    w = trained_like((4096, 9216))
    print(f"machine load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print("tensor: 4096 x 9216 float32, Student-t(3) scaled to He std sqrt(2/9216)")
    rows = []
    for bits in (4, 5):
        for init in ("optimal", "linear"):
            wall = cpu = float("inf")
            for _ in range(max(1, args.repeat)):
                t0, c0 = time.perf_counter(), time.process_time()
                from mconv.passes.cluster import cluster_array  # here: the peer's venv imports this file

                out = cluster_array(w, bits, init)
                wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
            rows.append((f"mconv {init}", bits, wall, mse(out, w), f"measured (CPU time {cpu:.3f} s)"))
        seconds, err = run_sklearn(w, bits, args.sk_sample)
        note = "measured" if args.sk_sample >= w.size else f"fit on {args.sk_sample:,} sampled values"
        note += f" (CPU time {run_sklearn.cpu:.3f} s)"
        rows.append(("scikit-learn KMeans", bits, seconds, err, note))
        if args.coremltools:
            try:
                seconds, err = run_coremltools(w, bits)
                rows.append(("coremltools 9 palettize", bits, seconds, err, "measured"))
            except Exception as exc:  # not installable / API moved: say so
                rows.append(("coremltools 9 palettize", bits, float("nan"), float("nan"), f"failed: {exc}"))
        elif bits == 4:
            rows.append(("coremltools 9 palettize", 4, 25.8, float("nan"), "issue figure, NOT measured here"))
    print(f"{'method':26s} {'bits':>4s} {'seconds':>9s} {'MSE':>12s}  note")
    for name, bits, seconds, err, note in rows:
        print(f"{name:26s} {bits:4d} {seconds:9.3f} {err:12.4e}  {note}")
    print()
    for bits in (4, 5):
        for init in ("optimal", "linear"):
            ours = next(r for r in rows if r[0] == f"mconv {init}" and r[1] == bits)
            for other in rows:
                if other[1] == bits and not other[0].startswith("mconv") and np.isfinite(other[2]):
                    line = f"{bits}-bit: mconv {init} is {other[2] / ours[2]:.1f}x faster than {other[0]} ({other[4]})"
                    if np.isfinite(other[3]):
                        line += f"; MSE ratio mconv/other = {ours[3] / other[3]:.4f}"
                    print(line)


if __name__ == "__main__":
    main()
