"""int4 MatMulNBits on the cpu target (issue 16 item 2): size and ONNX Runtime latency of a
GPT-2-small-shaped model (random weights, tests/test_transformers.py's builder, dynamo export at
opset 21) as four cpu bundles:

- fp32: ``export --target cpu`` of the imported model;
- dq-int4: ``optimize --passes blockwise(bits=4,block=32)`` then ``export --target cpu --dense``
  (DequantizeLinear + MatMul; dense because weights.mcw does not store int4 tensors);
- nbits-int4: the same with ``--matmul-nbits`` (com.microsoft MatMulNBits, accuracy_level 0);
- nbits-int4-acc4: MatMulNBits with accuracy_level 4 (int8 activations; API option);
- nbits-int4-raw: nbits-int4 with every weight stored raw (``codec="raw"``: no decoding at load;
  the scales then take 32 bits, not float16's 16).

Per bundle: bytes, the bits per weight of the quantized MatMul weights (stored bytes of codes,
scales and zero points over K*N), the whole ``mconv run`` command (a fresh process: import, load,
session, one inference; median of ``--runs``), warm inference (median of ``--iters`` after one
warm-up, in process), and the output's cosine against fp32 and against ORT on the DQ model with
graph optimizations off (exact DQ math; ORT's own DQ+MatMul fusion uses int8 activations).

    python3 bench/matmul_nbits.py [--layers 12] [--small] [--seq 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _tt():
    spec = importlib.util.spec_from_file_location("_tt", ROOT / "tests" / "test_transformers.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


def _cos(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _nbits_bits_per_weight(d: Path) -> float | None:
    import onnx
    from mconv.bundle import load_bundle

    proto = onnx.load(str(d / "model.onnx"))
    nodes = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    if not nodes:
        return None
    weights = {w["name"]: w["bytes"] for w in load_bundle(d).weights}
    stored = sum(weights[i] for n in nodes for i in n.input[1:] if i)
    count = 0
    for n in nodes:
        a = {x.name: x.i for x in n.attribute}
        count += a["K"] * a["N"]
    return 8 * stored / count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--small", action="store_true", help="vocabulary 2048, context 64")
    ap.add_argument("--runs", type=int, default=3, help="mconv run processes per bundle")
    ap.add_argument("--iters", type=int, default=10, help="warm inferences per bundle")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import mconv.api as api
    import onnxruntime as ort
    from mconv.targets import get_target

    tt = _tt()
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        model, x = tt.build("gpt2", args.layers, args.small)
        t0 = time.perf_counter()
        tt.dynamo_export(model, x, tmp / "src.onnx", opset=21)
        print(f"dynamo export {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        api.optimize(tmp / "src.onnx", passes="blockwise(bits=4,block=32)", output=tmp / "q.onnx")
        bundles = {
            "fp32": (tmp / "src.onnx", {}),
            "dq-int4": (tmp / "q.onnx", {"dense": True}),
            "nbits-int4": (tmp / "q.onnx", {"matmul_nbits": True}),
            "nbits-int4-acc4": (tmp / "q.onnx", {"matmul_nbits": True, "nbits_accuracy_level": 4}),
            "nbits-int4-raw": (tmp / "q.onnx", {"matmul_nbits": True, "codec": "raw"}),
        }
        name = tt._input_name(tmp / "src.onnx") if hasattr(tt, "_input_name") else "ids"
        np.save(tmp / "x.npy", x)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        dq_exact = ort.InferenceSession(str(tmp / "q.onnx"), so, providers=["CPUExecutionProvider"])
        exact = dq_exact.run(None, {name: x})[0]
        del dq_exact
        rows, ref = [], None
        for label, (src, opts) in bundles.items():
            out = tmp / label
            t0 = time.perf_counter()
            api.export(src, "cpu", out, **opts)
            export_s = time.perf_counter() - t0
            cmd = [sys.executable, "-m", "mconv", "run", str(out), "--input", f"{name}={tmp / 'x.npy'}"]
            cmd += ["-o", str(tmp / f"{label}.npz"), "--quiet"]
            walls = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, timeout=900)
                walls.append(time.perf_counter() - t0)
            runner = get_target("cpu").load(out)
            y = next(iter(runner.run({name: x}).values()))
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                runner.run({name: x})
                times.append(time.perf_counter() - t0)
            del runner
            if ref is None:
                ref = y
            row = {
                "bundle": label,
                "bytes": _bytes(out),
                "quantized_bits_per_weight": _nbits_bits_per_weight(out),
                "export_s": round(export_s, 2),
                "mconv_run_s": round(statistics.median(walls), 3),
                "warm_ms": round(1000 * statistics.median(times), 2),
                "cosine_vs_fp32": _cos(y, ref),
                "cosine_vs_exact_dq": _cos(y, exact),
                "max_abs_vs_exact_dq": float(np.abs(y - exact).max()),
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    base = rows[0]
    print(
        f"GPT-2-small shape, {args.layers} layers{' (small vocab)' if args.small else ''}, input {list(x.shape)}"
    )
    print(
        "| bundle | bytes | x fp32 | q bits/w | mconv run s | x fp32 | warm ms | x fp32 | cos vs fp32 | cos vs DQ |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bpw = r["quantized_bits_per_weight"]
        print(
            f"| {r['bundle']} | {r['bytes']:,} | {r['bytes'] / base['bytes']:.3f} | {bpw:.2f} |"
            if bpw is not None
            else f"| {r['bundle']} | {r['bytes']:,} | {r['bytes'] / base['bytes']:.3f} | - |",
            f"{r['mconv_run_s']:.2f} | {r['mconv_run_s'] / base['mconv_run_s']:.2f} |"
            f" {r['warm_ms']:.1f} | {r['warm_ms'] / base['warm_ms']:.2f} |"
            f" {r['cosine_vs_fp32']:.6f} | {r['cosine_vs_exact_dq']:.7f} |",
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"layers": args.layers, "small": args.small, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
