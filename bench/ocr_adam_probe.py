"""Probe (bench/results/s44-ocr.md): one L2 pre-training step of the budget (Adam, lr 1e-3, decay 1e-3,
shift 3, KL + margin, xla) on the folded PP-OCRv4 recognizer, as is or with the convolutions whose weight
RMS is under 0.01 frozen, at a given ``relative_step`` (default 0: Adam's rate uncapped). Usage:
python bench/ocr_adam_probe.py asis|freeze-small [RELATIVE_STEP] (paths in /tmp/s44ocr)."""

import sys

import numpy as np
from mconv.edit.weights import weight_refs
from mconv.irio import load_onnx
from mconv.passes.finetune import FinetuneConfig, finetune_model

mode = sys.argv[1]
model = load_onnx("/tmp/s44ocr/folded.onnx")
ref = load_onnx("/tmp/s44ocr/folded.onnx")
small = {
    r.node.name
    for r in weight_refs(model)
    if float(np.sqrt(np.mean(r.array().astype(np.float64) ** 2))) < 0.01
}
print("tensors with RMS < 0.01:", sorted(small), flush=True)
frozen = (lambda n: n.name in small) if mode == "freeze-small" else None
x = np.load("/tmp/s44ocr/cal32.npz")["x"]
cfg = FinetuneConfig(
    relative_step=float(sys.argv[2]) if len(sys.argv) > 2 else 0.0,
    epochs=1,
    lr=1e-3,
    weight_decay=1e-3,
    seed=0,
    holdout=0.0,
    batch_size=32,
    schedule="cosine",
    loss="kl",
    margin=0.3,
    shift=3,
    engine="xla",
)
res = finetune_model(model, {"x": x}, cfg, reference_model=ref, frozen=frozen, seed=0)
print(mode, [(e.epoch, e.loss, e.metric) for e in res.epochs], flush=True)
