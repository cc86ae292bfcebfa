"""Per-tensor error of a full-int8 LiteRT file against its float file (issue 46 item 4 diagnosis).

``python3 bench/int8_layers.py imported.onnx calibration.npz feeds.npz [--calibration M] [--top N]
[--bits 16]``:
the writer's own lowering, calibration and int8 rules (``mconv.targets.tflite``), both files run by
LiteRT with every tensor kept on the judged feeds; per activation tensor present in both, the
relative L2 error of the dequantized int8 values against the float ones, and the jump over the
worst input of the op that made it (the error that op's quantization added)."""

from __future__ import annotations

import argparse
import copy
import warnings

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("calib")
    ap.add_argument("feeds")
    ap.add_argument("--calibration", default="minmax")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument(
        "--first", type=float, default=0.0, help="list ops in graph order from the first error over this"
    )
    ap.add_argument("--bits", type=int, default=8, help="activation bits: 8, or 16 (LiteRT's 16x8)")
    a = ap.parse_args()
    import onnx_ir as ir
    from mconv.edit.input_shapes import fix_input_shapes
    from mconv.targets.gpu.plan import prepare
    from mconv.targets.tflite import lower, quant, writer
    from mconv.targets.tflite.litert import open_interpreter
    from mconv.targets.tflite.schema import serialize

    model = ir.load(a.model)
    with np.load(a.feeds) as z:  # a symbolic input dimension takes the judged feeds' size
        fix_input_shapes(model, {k: list(z[k].shape[:1]) + list(z[k].shape[1:]) for k in z.files})
    prepared = prepare(model)
    g = lower.lower(prepared)
    fbytes = serialize(g)
    cal = writer._calibration_feeds(prepared, a.calib)
    ranges = quant.calibrate(fbytes, g, cal, a.calibration)
    base = copy.deepcopy(g)
    quant.to_int8(g, ranges, bits=a.bits)
    qg = lower.compact(g)
    for op in qg.ops:
        op.version = writer.op_version(op, qg)
    qbytes = serialize(qg)
    feeds = writer._calibration_feeds(prepared, a.feeds)
    shapes = {base.tensors[i].name: base.tensors[i].shape for i in base.inputs}
    runs = quant._batches(feeds, shapes, 64)

    def run(data: bytes) -> dict[str, list[np.ndarray]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            it = open_interpreter(data, experimental_preserve_all_tensors=True)
        ins = {d["name"]: d for d in it.get_input_details()}
        out: dict[str, list[np.ndarray]] = {}
        for feed in runs:
            for n, v in feed.items():
                it.set_tensor(ins[n]["index"], np.ascontiguousarray(v, ins[n]["dtype"]))
            it.invoke()
            for d in it.get_tensor_details():
                try:
                    t = it.get_tensor(d["index"])
                except ValueError:
                    continue
                s, z = d["quantization"]
                if t.dtype.kind in "iu" and s > 0:
                    t = (t.astype(np.float64) - z) * s
                out.setdefault(d["name"], []).append(np.asarray(t, np.float64).ravel())
        return out

    f, q = run(fbytes), run(qbytes)
    err = {}
    for n, parts in f.items():
        if n in q and len(q[n]) == len(parts):
            x, y = np.concatenate(parts), np.concatenate(q[n])
            if x.shape == y.shape and x.size > 1:
                nx = np.linalg.norm(x)
                err[n] = float(np.linalg.norm(y - x) / nx) if nx else 0.0
    rows = []
    for k, op in enumerate(base.ops):
        o = base.tensors[op.outputs[0]].name
        if o not in err:
            continue
        before = max([err.get(base.tensors[i].name, 0.0) for i in op.inputs if i >= 0] or [0.0])
        r = ranges.get(op.outputs[0])
        rows.append((err[o] - before, err[o], k, op.code, o, r))
    print(
        f"{len(base.ops)} ops; outputs:",
        [(base.tensors[o].name, round(err.get(base.tensors[o].name, -1), 4)) for o in base.outputs],
    )
    if a.first:  # where the error starts: the first ops past the bound, in graph order
        start = next((i for i, row in enumerate(rows) if row[1] > a.first), len(rows))
        listed = rows[start : start + a.top]
    else:
        listed = sorted(rows, reverse=True)[: a.top]
    for jump, e, k, code, name, r in listed:
        rr = "" if r is None else f"[{r[0]:.3g}, {r[1]:.3g}]"
        print(f"{jump:+.4f} {e:.4f} op{k} {code} {name[:60]} {rr}")


if __name__ == "__main__":
    main()
