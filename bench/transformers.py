"""Transformers end to end at full size (issue 16 item 3): GPT-2 small (124M parameters, vocab
50257) and ViT-B/16 (86M) shapes with random weights, exported by torch's dynamo exporter (opset
18), imported, optimized (fp16 weights, fp16 compute with auto mixed precision, 4-bit k-means
palettes, int4 blockwise where that pass is registered), exported for cpu (ONNX Runtime) and xla,
and verified against the imported model (mconv verify) and against torch's own output.

    python3 bench/transformers.py [--layers 12] [--models gpt2,vit] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _tt():
    spec = importlib.util.spec_from_file_location("_tt", ROOT / "tests" / "test_transformers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--models", default="gpt2,vit")
    ap.add_argument("--passes", default="fp16;fp16(mode=auto);cluster(bits=4);blockwise(bits=4,block=32)")
    ap.add_argument("--targets", default="cpu,xla")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    from mconv import api
    from mconv.passes import PASSES

    tt = _tt()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for kind in args.models.split(","):
            model, x = tt.build(kind, layers=args.layers, small=False)
            params = sum(p.numel() for p in model.parameters())
            with torch.no_grad():
                expected = model(torch.from_numpy(x)).numpy()
            t = time.perf_counter()
            tt.dynamo_export(model, x, work / f"{kind}.onnx")
            t_export = time.perf_counter() - t
            t = time.perf_counter()
            res = api.convert(work / f"{kind}.onnx", work / f"{kind}_m.onnx")
            t_import = time.perf_counter() - t
            name = tt._input_name(work / f"{kind}_m.onnx")
            np.savez(work / "feed.npz", **{name: x})
            t = time.perf_counter()
            ref_out = next(iter(api.open(work / f"{kind}_m.onnx").run({name: x}).values()))
            base = {
                "model": kind, "layers": args.layers, "params": params, "ops": res.stats["ops"],
                "dynamo_export_s": round(t_export, 1), "import_s": round(t_import, 1),
                "reference_vs_torch_cosine": tt.cosine(ref_out, expected),
                "reference_run_s": round(time.perf_counter() - t, 1),
            }  # fmt: skip
            print(json.dumps(base), file=sys.stderr, flush=True)
            rows.append(base)
            for spec in args.passes.split(";"):
                if spec.split("(")[0] not in PASSES:
                    rows.append({"model": kind, "passes": spec, "skipped": "pass not registered"})
                    continue
                tag = "".join(c if c.isalnum() else "_" for c in spec)
                t = time.perf_counter()
                try:
                    api.optimize(
                        work / f"{kind}_m.onnx",
                        passes=spec,
                        data=work / "feed.npz",
                        output=work / f"{tag}.onnx",
                    )
                except Exception as exc:
                    rows.append(
                        {"model": kind, "passes": spec, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                    continue
                t_opt = time.perf_counter() - t
                for target in args.targets.split(","):
                    row = {"model": kind, "passes": spec, "target": target, "optimize_s": round(t_opt, 1)}
                    try:
                        t = time.perf_counter()
                        extra = {"batch": 1} if target == "xla" else {}
                        api.export(work / f"{tag}.onnx", target, work / f"{tag}_{target}", **extra)
                        row["export_s"] = round(time.perf_counter() - t, 1)
                        t = time.perf_counter()
                        v = api.verify(
                            work / f"{kind}_m.onnx", work / f"{tag}_{target}", data=work / "feed.npz"
                        )
                        row["verify_s"] = round(time.perf_counter() - t, 1)
                        m = next(iter(v.as_dict()["outputs"].values()))
                        row.update(
                            {
                                f"vs_import_{k}": m.get(k)
                                for k in ("cosine", "snr_db", "max_abs", "top1_agreement")
                            }
                        )
                        got = next(iter(api.open(work / f"{tag}_{target}").run({name: x}).values()))
                        row["vs_torch_cosine"] = tt.cosine(got, expected)
                        row["bundle_bytes"] = sum(
                            p.stat().st_size for p in (work / f"{tag}_{target}").rglob("*") if p.is_file()
                        )
                    except Exception as exc:
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
