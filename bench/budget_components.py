"""Issue 44 item 2 on a loaded machine: the budget search's parts that grow with the samples,
timed in CPU seconds of this process (all its threads; wall seconds say little when other jobs
share the cores): the original's outputs on every sample and on the 24 other moves of rule 8's
translation table (once per search), the held-out gate's forward, and one fine-tuning stage's
steps, on the xla engine (CPU) and, for the forward parts, the reference executor.

Run: python bench/budget_components.py [--samples 1000,2500,5000] [--reference-samples 1000]
Needs $MCONV_SHARED (the Caffe LeNet-5 and mnist5k.npz).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def cpu(fn):
    t0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - t0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="1000,2500,5000")
    ap.add_argument("--reference-samples", default="1000")
    args = ap.parse_args()
    from mconv.engines import fast as FE
    from mconv.formats import import_model
    from mconv.passes.finetune import _score_output

    shared = Path(os.environ.get("MCONV_SHARED", "../shared"))
    caffe = shared / "models" / "caffe"
    model = import_model([caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"], options={})
    out, logits = _score_output(model)
    with np.load(shared / "data" / "mnist5k.npz") as z:
        images = (z["images"].astype(np.float32) / 256.0)[:, None]
        labels = z["labels"]
    memo: dict = {}
    eng = FE.xla_engine(model, [logits], "cpu", memo, role="teacher")
    FE.run_batched(eng, {"data": images[:256]}, [logits])  # the one compile, outside the timings
    moves = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]
    for n in (int(s) for s in args.samples.split(",")):
        row(n, str(n) in args.reference_samples.split(","), model, logits, images, labels, memo, eng, moves)


def row(n, with_reference, model, logits, images, labels, memo, eng, moves) -> None:  # noqa: PLR0913
    """One sample count's rows of the table."""
    from mconv.drivers.budget.schedule import default_epochs
    from mconv.engines import fast as FE
    from mconv.engines.reference.executor import Executor
    from mconv.passes.base import PassContext
    from mconv.passes.finetune import move_images
    from mconv.passes.pipeline import make_spec, snapshot_model

    feeds = {"data": images[:n]}

    def table(runner):
        for dy, dx in moves:
            fd = move_images(feeds, ["data"], 2, np.full(n, dy), np.full(n, dx))
            FE.run_batched(runner, fd, [logits]) if runner is eng else runner(fd)

    _, c, w = cpu(lambda: table(eng))
    epochs = default_epochs(model, feeds, int(0.75 * n))
    print(f"| teacher table (25 moves x {n:,}) | xla-cpu | {c:.1f} s CPU ({w:.1f} s wall) |", flush=True)
    if with_reference:
        ex = Executor(model)

        def ref(fd):
            for s in range(0, n, 256):
                ex.run({k: v[s : s + 256] for k, v in fd.items()}, outputs=[logits])

        _, c1, w1 = cpu(lambda: ref(feeds))
        print(
            f"| teacher outputs, one move ({n:,}) | reference | {c1:.1f} s CPU ({w1:.1f} s wall); the table: 25x |",
            flush=True,
        )
    # one fine-tuning stage as the search runs it (default epochs, the table memoized)
    data = {"data": images[:n], "labels": labels[:n]}
    spec = make_spec(
        "finetune",
        {"epochs": epochs, "lr": 2e-3, "holdout": 0.25, "batch_size": 32, "schedule": "cosine",
         "loss": "kl", "margin": 0.3, "shift": 2, "shift_targets": "table", "engine": "xla"},
    )  # fmt: skip
    work = snapshot_model(model)
    ctx = PassContext(data=data, reference_model=model, seed=0, memo=memo)

    def stage():
        ctx.spec = spec
        spec.pass_class().run(work, spec.resolve(), ctx)

    cpu(stage)  # the first: compiles and the table
    _, c2, w2 = cpu(stage)
    steps = epochs * -(-int(n - round(0.25 * n)) // 32)
    print(
        f"| one fine-tuning stage ({n:,} samples: {epochs} epochs, {steps} steps) | xla-cpu | "
        f"{c2:.1f} s CPU ({w2:.1f} s wall), {1000 * c2 / steps:.0f} ms CPU a step |",
        flush=True,
    )


if __name__ == "__main__":
    main()
