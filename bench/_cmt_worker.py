"""coremltools side of bench/vs_coremltools.py: runs INSIDE coremltools' own venv (never the
base interpreter: coremltools pins protobuf and numpy), as a user without the source framework.

Input: ``layers.json`` (one entry a layer: kind conv / linear / other, the weight's key, the bias's
key, groups) and ``weights.npz`` (the arrays, already in Core ML's layout: conv [O, I/g, kh, kw],
linear [out, in]). Each layer is rebuilt as one MIL op fed by a graph input (so nothing folds):
``mb.conv`` / ``mb.linear`` with the weight and bias as ``mb.const``; any other float tensor is the
constant operand of an ``mb.mul``. The program is converted to an mlprogram (``ct.convert``, the
default float16 precision a Core ML user gets), then each configuration is applied with
``coremltools.optimize.coreml`` (``palettize_weights`` k-means, per-tensor or per-grouped-channel;
``prune_weights`` then ``palettize_weights(joint_compression=True)``), saved as an .mlpackage, and
measured: the bytes of ``Data/com.apple.CoreML/weights/weight.bin`` and of the whole package. The
compressed weights come back through ``decompress_weights``' graph pass (lut[indices], sparse
masks) as ``<config>.npz`` (float32, same keys), with ``results.json`` listing the bytes.

Usage (by the bench): python _cmt_worker.py WORKDIR [--weight-threshold N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np


def package_bytes(path: Path) -> tuple[int, int]:
    weights = path / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return (weights.stat().st_size if weights.exists() else 0), total


def build(layers: list[dict], arrays: dict[str, np.ndarray]):
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program

    placeholders = {}
    for i, layer in enumerate(layers):
        w = arrays[layer["weight"]]
        if layer["kind"] == "conv":
            shape = (1, w.shape[1] * layer.get("groups", 1), *w.shape[2:])
        elif layer["kind"] == "linear":
            shape = (1, w.shape[1])
        else:
            shape = w.shape
        placeholders[f"x{i}"] = mb.placeholder(shape=shape)
    with Function(placeholders, opset_version=ct.target.iOS18) as fn:
        outs = []
        for i, layer in enumerate(layers):
            x = fn.inputs[f"x{i}"]
            w = mb.const(val=arrays[layer["weight"]], name=f"w{i}")
            b = mb.const(val=arrays[layer["bias"]], name=f"b{i}") if layer.get("bias") else None
            kw = {"bias": b} if b is not None else {}
            if layer["kind"] == "conv":
                outs.append(mb.conv(x=x, weight=w, groups=layer.get("groups", 1), name=f"op{i}", **kw))
            elif layer["kind"] == "linear":
                outs.append(mb.linear(x=x, weight=w, name=f"op{i}", **kw))
            else:
                outs.append(mb.mul(x=x, y=w, name=f"op{i}"))
        fn.set_outputs(outs)
    prog = Program()
    prog.add_function("main", fn)

    return ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18)


def configs(threshold: int, channels: list[int]) -> list[tuple[str, object]]:
    import coremltools.optimize.coreml as cto

    out: list[tuple[str, object]] = []
    for nbits in (2, 3, 4, 6, 8):
        cfg = cto.OptimizationConfig(
            global_config=cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, weight_threshold=threshold)
        )
        out.append((f"palettize kmeans {nbits}-bit per_tensor", ("pal", cfg)))
    for nbits in (2, 3, 4):
        for gs in (8, 32):
            per_layer = {}  # coremltools needs the group size to divide the output channels
            for i, rows in enumerate(channels):
                size = max(d for d in range(1, gs + 1) if rows % d == 0)
                per_layer[f"w{i}_to_fp16"] = cto.OpPalettizerConfig(
                    mode="kmeans", nbits=nbits, granularity="per_grouped_channel", group_size=size,
                    weight_threshold=threshold,
                )  # fmt: skip
            cfg = cto.OptimizationConfig(op_name_configs=per_layer)
            out.append((f"palettize kmeans {nbits}-bit per_grouped_channel g{gs}", ("pal", cfg)))
    for sparsity in (0.5, 0.75, 0.9):
        for nbits in (2, 3, 4):
            prune = cto.OptimizationConfig(
                global_config=cto.OpMagnitudePrunerConfig(
                    target_sparsity=sparsity, weight_threshold=threshold
                )
            )
            pal = cto.OptimizationConfig(
                global_config=cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, weight_threshold=threshold)
            )
            out.append(
                (f"prune {sparsity:.0%} + palettize kmeans {nbits}-bit (joint)", ("joint", (prune, pal)))
            )
    return out


def weights_back(model, layers: list[dict]) -> dict[str, np.ndarray]:
    """The float32 values the compressed package decodes to, by the bench's keys."""
    from coremltools.models.utils import _apply_graph_pass
    from coremltools.optimize.coreml._quantization_passes import WeightDecompressor

    prog = _apply_graph_pass(model, WeightDecompressor(op_selector=lambda op: True), return_pymil_prog=True)
    ops = {}  # the layer op by its name, whatever suffix the float16 pass gave it (op3_cast_fp16)
    for op in prog.functions["main"].operations:
        if op.op_type in ("conv", "linear", "mul"):
            ops[op.name.split("_")[0]] = op
    got: dict[str, np.ndarray] = {}
    for i, layer in enumerate(layers):
        op = ops[f"op{i}"]
        wvar = op.inputs["y" if layer["kind"] == "other" else "weight"]
        got[layer["weight"]] = np.asarray(wvar.val, np.float32)
        if layer.get("bias"):
            got[layer["bias"]] = np.asarray(op.inputs["bias"].val, np.float32)
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--weight-threshold", type=int, default=512)
    ap.add_argument("--only", default=None, help="comma-separated config indices")
    args = ap.parse_args()
    import coremltools as ct
    import coremltools.optimize.coreml as cto

    layers = json.loads((args.work / "layers.json").read_text())
    with np.load(args.work / "weights.npz") as z:
        arrays = {k: z[k].astype(np.float32) for k in z.files}
    model = build(layers, arrays)
    base = args.work / "fp16.mlpackage"
    shutil.rmtree(base, ignore_errors=True)
    model.save(str(base))
    model = ct.models.MLModel(str(base), skip_model_load=True)
    results = [{"config": "float16 (ct.convert default)", "weight_bin": package_bytes(base)[0],
                "package": package_bytes(base)[1], "npz": "fp16.npz"}]  # fmt: skip
    np.savez(args.work / "fp16.npz", **weights_back(model, layers))
    chosen = configs(args.weight_threshold, [arrays[la["weight"]].shape[0] for la in layers])
    if args.only:
        chosen = [chosen[int(i)] for i in args.only.split(",")]
    for j, (name, (how, cfg)) in enumerate(chosen):
        if how == "pal":
            out = cto.palettize_weights(model, cfg)
        else:
            prune, pal = cfg
            out = cto.palettize_weights(cto.prune_weights(model, prune), pal, joint_compression=True)
        path = args.work / f"c{j}.mlpackage"
        shutil.rmtree(path, ignore_errors=True)
        out.save(str(path))
        wb, total = package_bytes(path)
        loaded = ct.models.MLModel(str(path), skip_model_load=True)
        np.savez(args.work / f"c{j}.npz", **weights_back(loaded, layers))
        results.append({"config": name, "weight_bin": wb, "package": total, "npz": f"c{j}.npz"})
        print(f"{name}: weight.bin {wb:,} B, package {total:,} B", file=sys.stderr, flush=True)
        shutil.rmtree(path)
    (args.work / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    raise SystemExit(main())
