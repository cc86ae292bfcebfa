"""Benchmark the cpu target's bundle path: export, load (decode + ORT session) and run.

    python bench/cpu_bundle.py --mb 64            # one model with ~64 MB of float32 weights
    python bench/cpu_bundle.py --mb 2200 --fp16   # over the 2 GB protobuf limit

The model is a chain of MatMul+Add layers (width 1024 -> 4 MB per layer). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.targets import cpu


def chain_model(mb: int, fp16: bool, width: int = 1024) -> ir.Model:
    layers = max(1, (mb << 20) // (width * width * 4))
    rng = np.random.default_rng(0)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["N", width]))
    graph = ir.Graph([x], [], nodes=[], name="chain", opset_imports={"": 17})
    h = x
    for i in range(layers):
        w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        if fp16:
            w = w.astype(np.float16).astype(np.float32)
        wv = ir.Value(
            name=f"l{i}.W",
            const_value=ir.Tensor(w, name=f"l{i}.W"),
            type=ir.TensorType(ir.DataType.FLOAT),
            shape=ir.Shape(w.shape),
        )
        graph.register_initializer(wv)
        node = ir.Node("", "MatMul", [h, wv], name=f"l{i}")
        graph.append(node)
        h = node.outputs[0]
        h.name = f"h{i}"
    graph.outputs.append(h)
    h.type, h.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(["N", width])
    return ir.Model(graph, ir_version=8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--fp16", action="store_true")
    args = ap.parse_args()
    model = chain_model(args.mb, args.fp16)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        bundle = cpu.export(model, Path(d) / "b", {})
        t1 = time.perf_counter()
        runner = cpu.load(Path(d) / "b")
        t2 = time.perf_counter()
        y = runner.run({"x": np.ones((1, 1024), np.float32)})
        t3 = time.perf_counter()
        files = {k: v["bytes"] for k, v in bundle.files.items()}
    print(
        json.dumps(
            {
                "weights_mb": args.mb,
                "fp16": args.fp16,
                "files": files,
                "export_s": round(t1 - t0, 3),
                "load_s": round(t2 - t1, 3),
                "run_s": round(t3 - t2, 3),
                "finite": bool(np.isfinite(next(iter(y.values()))).all()),
                "over_protobuf_limit": sum(files.values()) > cpu.PROTOBUF_LIMIT,
            }
        )
    )


if __name__ == "__main__":
    main()
