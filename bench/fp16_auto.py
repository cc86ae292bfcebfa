"""fp16(mode=auto) against onnxconverter-common's auto_convert_mixed_precision (issue 16 item 4).

Models: the GPT-2-small- and ViT-B/16-shaped transformers of tests/test_transformers.py (random
weights, dynamo-exported, opset 18) and a graph with a MatMul whose float16 output overflows.
For each: the float32 nodes of the converted model (non-Cast nodes with a float32 output, after
ONNX shape inference), the output's relative L2 error against float32 in ONNX Runtime on the same
feeds, and the conversion's wall time: the call alone (onnxconverter-common's function on a
loaded model; mconv's api.optimize with load, save and the written-model check) and the whole
command each way in a fresh process (`mconv optimize ...`; a Python command that imports
onnxconverter-common, loads, converts and saves). Both tools are given the same relative tolerance.

    python3 bench/fp16_auto.py [--layers 2] [--tolerance 0.01] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent


def _transformers():
    spec = importlib.util.spec_from_file_location("_tt", ROOT / "tests" / "test_transformers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def overflow_model(path: Path, seed: int = 0) -> dict:
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((64, 256)) * 400).astype(np.float32)  # x @ w1 ~ 1e5 > 65504
    w2 = (rng.standard_normal((256, 256)) * 0.05).astype(np.float32)
    w3 = (rng.standard_normal((256, 10)) * 0.05).astype(np.float32)
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["a"], name="big"),
        h.make_node("Mul", ["a", "s"], ["b"], name="scale"),
        h.make_node("Relu", ["b"], ["c"], name="relu"),
        h.make_node("MatMul", ["c", "w2"], ["d"], name="mm2"),
        h.make_node("Tanh", ["d"], ["e"], name="tanh"),
        h.make_node("MatMul", ["e", "w3"], ["f"], name="mm3"),
        h.make_node("Softmax", ["f"], ["y"], name="softmax", axis=-1),
    ]
    inits = [nh.from_array(w1, "w1"), nh.from_array(w2, "w2"), nh.from_array(w3, "w3")]
    inits.append(nh.from_array(np.array(1e-3, np.float32), "s"))
    g = h.make_graph(
        nodes, "overflow", [h.make_tensor_value_info("x", T.FLOAT, ["N", 64])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 10])], inits,
    )  # fmt: skip
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), path)
    return {"x": (rng.standard_normal((8, 64)) * 20).astype(np.float32)}


def fp32_nodes(path: Path) -> int:
    m = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {v.name: v.type.tensor_type.elem_type for v in [*m.graph.value_info, *m.graph.output]}
    return sum(
        1
        for n in m.graph.node
        if n.op_type != "Cast" and any(types.get(o) == onnx.TensorProto.FLOAT for o in n.output)
    )


def ort_run(path: Path, feeds: dict) -> np.ndarray:
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0].astype(np.float64)


def ref_run(path: Path, feeds: dict) -> np.ndarray:
    """mconv's reference executor: every op rounds its output to the model's type (ORT's CPU
    provider computes most float16 ops in float32 behind inserted Casts, so it hides overflow)."""
    from mconv import api

    r = api.open(path)
    return np.asarray(next(iter(r.run(feeds).values())), dtype=np.float64)


def rel(a, b) -> float:
    fin = np.isfinite(a).all()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b)) if fin else float("inf")


def compare(name: str, src: Path, feeds: dict, tol: float, work: Path) -> dict:
    from mconv import api

    ref = ort_run(src, feeds)
    np.savez(work / f"{name}_data.npz", **feeds)
    row: dict = {"model": name, "nodes": len(onnx.load(str(src), load_external_data=False).graph.node)}
    t = time.perf_counter()
    out = work / f"{name}_mconv.onnx"
    res = api.optimize(
        src, passes=f"fp16(mode=auto,tolerance={tol})", data=work / f"{name}_data.npz", output=out
    )
    row["mconv_s"] = round(time.perf_counter() - t, 2)  # the optimize call: load, pass, save, ORT check
    row["mconv_pass_s"] = round(res.reports[0].seconds, 2)  # the pass alone (occ's figure is its call alone)
    row["mconv_kept"] = len(res.reports[0].tensors[-1]["kept_float32"])
    row["mconv_fp32_nodes"] = fp32_nodes(out)
    row["mconv_rel_err"] = rel(ort_run(out, feeds), ref)
    row["mconv_rel_err_fp16_exec"] = rel(ref_run(out, feeds), ref)
    t = time.perf_counter()
    api.optimize(src, passes="fp16(mode=all)", output=work / f"{name}_all.onnx")
    row["all_fp32_nodes"] = fp32_nodes(work / f"{name}_all.onnx")
    row["all_rel_err"] = rel(ort_run(work / f"{name}_all.onnx", feeds), ref)
    row["all_rel_err_fp16_exec"] = rel(ref_run(work / f"{name}_all.onnx", feeds), ref)
    try:
        from onnxconverter_common import auto_mixed_precision

        model = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
        t = time.perf_counter()
        conv = auto_mixed_precision.auto_convert_mixed_precision(
            model, feeds, rtol=tol, atol=tol, keep_io_types=True
        )
        row["occ_s"] = round(time.perf_counter() - t, 2)
        onnx.save(conv, work / f"{name}_occ.onnx")
        row["occ_fp32_nodes"] = fp32_nodes(work / f"{name}_occ.onnx")
        row["occ_rel_err"] = rel(ort_run(work / f"{name}_occ.onnx", feeds), ref)
        row["occ_rel_err_fp16_exec"] = rel(ref_run(work / f"{name}_occ.onnx", feeds), ref)
    except Exception as exc:  # record why, keep the row
        row["occ_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    # Whole commands as a user runs them, side by side: start-up, load, convert, save.
    data = work / f"{name}_data.npz"
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "mconv", "optimize", str(src), "--passes", f"fp16(mode=auto,tolerance={tol})",
         "--data", str(data), "-o", str(work / f"{name}_cmd.onnx")],
        capture_output=True, text=True,
    )  # fmt: skip
    row["mconv_cmd_s"] = round(time.perf_counter() - t, 2) if r.returncode == 0 else None
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", OCC_COMMAND, str(src), str(data), str(tol), str(work / f"{name}_occ_cmd.onnx")],
                       capture_output=True, text=True)  # fmt: skip
    row["occ_cmd_s"] = round(time.perf_counter() - t, 2) if r.returncode == 0 else None
    return row


# onnxconverter-common's auto mixed precision as a command: load, shape inference (it needs the
# value types), convert on the feeds, save.
OCC_COMMAND = """
import sys
import numpy as np, onnx
from onnxconverter_common import auto_mixed_precision
src, data, tol, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
feeds = dict(np.load(data))
model = onnx.shape_inference.infer_shapes(onnx.load(src))
conv = auto_mixed_precision.auto_convert_mixed_precision(model, feeds, rtol=tol, atol=tol, keep_io_types=True)
onnx.save(conv, out)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--models", default="overflow,vit,gpt2")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    from _startup import compile_mconv

    compile_mconv()  # as pip install does: mconv's commands start from bytecode, as the peer's do
    tt = _transformers()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for name in args.models.split(","):
            if name == "overflow":
                feeds = overflow_model(work / "overflow.onnx")
            else:
                model, x = tt.build(name, layers=args.layers, small=False)
                tt.dynamo_export(model, x, work / f"{name}.onnx")
                feeds = {
                    onnx.load(str(work / f"{name}.onnx"), load_external_data=False).graph.input[0].name: x
                }
            row = compare(name, work / f"{name}.onnx", feeds, args.tolerance, work)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
