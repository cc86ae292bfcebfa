"""One masked fine-tuning step of ResNet-50 at batch 32: mconv's xla engine vs PyTorch (issue 15).

The step is what ``finetune`` runs for a pruned model (Deep Compression's masked retraining):
forward, cross-entropy on labels, backward, SGD with momentum 0.9, and the pruned weights held at
zero. Three implementations of the same step:

- mconv, xla engine: the ``light_resnet50`` graph (ONNX's, random He weights), ``dynamic-batch``
  then ``prune(sparsity=0.5)`` through the project's passes, and the finetune pass's own jitted
  step (``passes/finetune._XlaTrainer`` over ``targets/xla/engine.XlaEngine.train_step``) on
  ``--device`` (cuda where jax sees a GPU);
- mconv, reference engine (numpy VJPs) on the CPU, the same model and step (``--reference-steps``
  steps, 0 to skip);
- PyTorch: torchvision's resnet50 (weights=None) with 50% magnitude masks on every conv and fc
  weight, BatchNorm in eval mode (as the ONNX graph's BatchNormalization is), ``torch.optim.SGD``,
  the masks re-applied after each step; eager, and ``torch.compile`` of the model.

Each time is the median of ``--runs`` steps after ``--warmup`` steps, synchronised (the loss is
read back to the host, as the product does every step). Prints a markdown table; writes
$OUT/train_gpu.json when OUT is set.

    python bench/train_gpu.py                        # on a GPU machine
    python bench/train_gpu.py --batch 2 --runs 2 --warmup 1 --reference-steps 1   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import types
from pathlib import Path

import numpy as np


def timed(step, warmup: int, runs: int) -> tuple[float, list[float]]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, [round(x * 1e3, 3) for x in times]


def mconv_model(batch: int):
    from mconv.fixtures.light import he_normal, light_model
    from mconv.passes import PassContext, parse_spec, run_pipeline

    model = light_model("resnet50", he_normal)
    model, _ = run_pipeline(model, parse_spec("dynamic-batch,prune(sparsity=0.5)"), PassContext())
    return model


def mconv_params(model):
    from mconv.edit.weights import compression_info
    from mconv.passes.finetune import make_parameter, trainable_values

    facts = compression_info(model)
    return [make_parameter(v, facts) for v in trainable_values(model)]


def data(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    y = rng.integers(0, 1000, batch).astype(np.int64)
    return x, y


CONFIG = types.SimpleNamespace(optimizer="sgd", momentum=0.9, weight_decay=0.0, temperature=2.0, margin=0.0)


def bench_xla(batch: int, device: str, warmup: int, runs: int) -> dict:
    from mconv.engines.xla.engine import XlaEngine
    from mconv.passes.finetune import _score_output, _XlaTrainer

    model = mconv_model(batch)
    params = mconv_params(model)
    _, logits = _score_output(model)
    t0 = time.perf_counter()
    engine = XlaEngine(model, [logits], device=device)
    for p in params:
        engine.set_weight(p.name, p.weights)
    trainer = _XlaTrainer(engine, params, "xent", CONFIG)
    x, y = data(batch)
    feeds = {engine.input_names[0]: x}
    first = trainer.step(feeds, y, 0.01)  # compiles
    compile_s = time.perf_counter() - t0
    ms, all_ms = timed(lambda: trainer.step(feeds, y, 0.01), warmup, runs)
    masked = sum(p.mode == "masked" for p in params)
    return {
        "ms": ms,
        "runs_ms": all_ms,
        "first_step_s": round(compile_s, 2),
        "loss0": first,
        "params": len(params),
        "masked": masked,
        "device": str(engine.device),
    }


def bench_reference(batch: int, steps: int) -> dict:
    from mconv.engines.reference.executor import Executor
    from mconv.passes.finetune import Optimizer, _score_output, softmax_cross_entropy

    model = mconv_model(batch)
    params = mconv_params(model)
    _, logits = _score_output(model)
    ex = Executor(model)
    ex.output_names = [logits]
    opt = Optimizer("sgd", 0.01, 0.9, 0.0)
    x, y = data(batch)
    name = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers][0]
    wrt = [p.name for p in params]

    def loss(outputs):
        value, g = softmax_cross_entropy(outputs[logits], y)
        return value, {logits: g}

    times = []
    for _ in range(steps):
        t = time.perf_counter()
        _, grads = ex.value_and_grad({name: x}, loss, wrt)
        opt.step({p.name: p.trained for p in params}, {p.name: p.gradient(grads[p.name]) for p in params})
        for p in params:
            p.commit()
            ex.set_initializer(p.name, p.weights)
        times.append(time.perf_counter() - t)
    return {"ms": statistics.median(times) * 1e3, "runs_ms": [round(t * 1e3, 1) for t in times]}


def bench_torch(batch: int, warmup: int, runs: int, compiled: bool) -> dict:
    import torch
    import torchvision

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    net = torchvision.models.resnet50(weights=None).to(dev).eval()  # BN: running statistics
    masks = {}
    with torch.no_grad():
        for name, w in net.named_parameters():
            if w.dim() in (2, 4):
                k = w.numel() // 2
                thr = w.abs().flatten().kthvalue(k).values
                masks[name] = (w.abs() > thr).to(w.dtype)
                w.mul_(masks[name])
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    model = torch.compile(net) if compiled else net
    x, y = data(batch)
    xt, yt = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
    named = dict(net.named_parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for n, m in masks.items():
                named[n].mul_(m)
        return float(loss)  # host read-back, as the product's step

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    ms, all_ms = timed(step, warmup, runs)
    return {"ms": ms, "runs_ms": all_ms, "first_step_s": round(first, 2), "device": dev}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when jax sees a GPU)")
    ap.add_argument("--reference-steps", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], choices=["xla", "torch", "compile", "reference"])
    args = ap.parse_args()

    import jax

    device = args.device or ("cuda" if jax.devices()[0].platform == "gpu" else "cpu")
    rows: dict[str, dict] = {}
    if "xla" not in args.skip:
        rows[f"mconv xla engine ({device})"] = bench_xla(args.batch, device, args.warmup, args.runs)
    if "torch" not in args.skip:
        rows["PyTorch eager"] = bench_torch(args.batch, args.warmup, args.runs, compiled=False)
    if "compile" not in args.skip:
        rows["PyTorch torch.compile"] = bench_torch(args.batch, args.warmup, args.runs, compiled=True)
    if "reference" not in args.skip and args.reference_steps > 0:
        rows["mconv reference engine (cpu, numpy)"] = bench_reference(args.batch, args.reference_steps)
    result = {"device": str(jax.devices()[0]), "jax": jax.__version__, "batch": args.batch, "rows": rows}
    print(f"device: {result['device']}, batch {args.batch}, median of {args.runs} steps after {args.warmup}")
    print("| implementation | step (ms) | first step (s) |")
    print("|---|---:|---:|")
    for label, r in rows.items():
        print(f"| {label} | {r['ms']:.2f} | {r.get('first_step_s', '-')} |")
    xla = next((r for k, r in rows.items() if k.startswith("mconv xla")), None)
    if xla:
        for label, r in rows.items():
            if r is not xla:
                print(f"xla engine vs {label}: {r['ms'] / xla['ms']:.2f}x (>1: xla faster)")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "train_gpu.json"
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
