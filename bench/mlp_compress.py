"""P3: Deep Compression of the embedded LeNet-300-100-style MLP (fixtures/digits_mlp.onnx).

Pipeline (the library API, the same code path as ``mconv optimize`` + ``mconv export``):
iterative magnitude pruning (three steps towards the final per-layer sparsities, masked retraining
after each) -> k-means weight sharing (linear init) -> centroid fine-tuning -> float16 values for
what is left in float32 (the biases) -> cpu bundle (sparse relative indices, palettes, Huffman).
Fine-tuning uses the training split (fixtures/digits_train.npz, 1347 digits, labels: softmax
cross-entropy); accuracy is measured on the held-out split (fixtures/digits_test.npz, 450 digits)
with the exported bundle on ONNX Runtime.

Gates: weights at least 40x smaller than float32, accuracy drop <= 0.5 points.

Run: python bench/mlp_compress.py [--epochs 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

FINAL_SPARSITY = {"fc1": 0.88, "fc2": 0.97, "fc3": 0.6}
BITS = {"fc1": 4, "fc2": 3, "fc3": 4}
STEPS = (0.5, 0.8, 1.0)  # fractions of the final sparsity, one prune + retrain each


def pipeline_spec(epochs: int) -> str:
    parts = []
    for f in STEPS:
        per_layer = {k: {"sparsity": round(s * f, 4)} for k, s in FINAL_SPARSITY.items()}
        parts.append(f"prune(op_name={per_layer!r})")
        parts.append(f"finetune(epochs={epochs},lr=0.003,holdout=0.0)")
    parts.append(f"cluster(init='linear',op_name={ {k: {'bits': b} for k, b in BITS.items()}!r})")
    parts.append(f"finetune(epochs={epochs},lr=0.0005,holdout=0.0)")
    return ",".join(parts)


def biases_to_half(model) -> list[str]:
    """Round the float32 tensors that no compression pass recorded (the biases) to float16 values.

    They keep dtype float32, so the graph is unchanged and the container stores them with its
    lossless fp16 codec. (The fp16 pass would also store them as float16, but as NAME_fp16
    behind a Cast, changing the graph; it now carries the clustered weights' compression
    records over to their new names, so those would still export with their codecs.)
    """
    import onnx_ir as ir
    from mconv.edit.weights import compression_info

    recorded = compression_info(model)
    done = []
    for name, value in model.graph.initializers.items():
        t = value.const_value
        if name in recorded or t is None or t.dtype != ir.DataType.FLOAT:
            continue
        value.const_value = ir.Tensor(t.numpy().astype(np.float16).astype(np.float32), name=name)
        done.append(name)
    return done


@contextmanager
def exported(model, out: Path | None, prefix: str):
    """``model`` exported as a cpu bundle to ``out`` (or a temporary folder removed on exit):
    yields the bundle, a runner over it, and the bytes of its weights.mcw."""
    from mconv.api.runtime import open_runner
    from mconv.targets import get_target

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = out or Path(tmp) / "bundle"
        bundle = get_target("cpu").export(model, folder, {})
        yield bundle, open_runner(folder), (folder / "weights.mcw").stat().st_size


def main() -> int:
    from mconv import passes as P
    from mconv.api.demo import digits_feeds, fixture_path
    from mconv.api.runtime import open_runner
    from mconv.irio import load_onnx, model_stats

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="keep the bundle here")
    args = ap.parse_args()

    src = fixture_path("digits_mlp.onnx")
    if not src.is_file():
        print("fixtures/digits_mlp.onnx is missing: run python fixtures/train_digits_mlp.py first")
        return 2
    train, test = digits_feeds("train"), digits_feeds("test")
    labels = test.pop("labels")
    model = load_onnx(src)
    original_bytes = model_stats(model).bytes
    baseline = float(np.mean(open_runner(src, "cpu").run(test)["logits"].argmax(1) == labels))

    t0 = time.perf_counter()
    specs = P.parse_spec(pipeline_spec(args.epochs))
    ctx = P.PassContext(data=train, seed=0)
    model, reports = P.run_pipeline(model, specs, ctx)
    halved = biases_to_half(model)
    seconds = time.perf_counter() - t0

    with exported(model, args.out, "mconv-p3-") as (bundle, runner, mcw):
        got = runner.run(test)["logits"]
    accuracy = float(np.mean(got.argmax(1) == labels))
    account = bundle.manifest["account"]

    print(f"P3: LeNet-300-100-style MLP, {len(labels)} held-out digits; pipeline {seconds:.1f}s")
    print(f"  pipeline: {pipeline_spec(args.epochs)}")
    print(f"  then float16 values for: {', '.join(halved)}")
    for r in reports:
        if r.name == "finetune":
            print(f"  finetune: {r.notes[-1]}")
    print()
    head = f"{'tensor':<12}{'codec':<26}{'kept':>7}{'w bits':>7}{'idx bits':>9}{'codebook':>9}{'bytes':>8}{'of f32':>8}"
    print(head)
    print("-" * len(head))
    for row in account["layers"]:
        print(
            f"{row['name']:<12}{row.get('codec', ''):<26}{100 * row.get('kept', 1):>6.1f}%"
            f"{row.get('weight_bits', '')!s:>7}{row.get('index_bits') or '':>9}{row.get('codebook_bytes') or '':>9}"
            f"{row['bytes']:>8,}{100 * row['bytes'] / row['original_bytes']:>7.2f}%"
        )
    total = account["total"]["bytes"]
    print("-" * len(head))
    print(f"{'total':<12}{'':<26}{100 * account['total'].get('kept', 1):>6.1f}%{'':>25}{total:>8,}")
    print()
    ratio = original_bytes / total
    print(f"float32 weights {original_bytes:,} B -> encoded tensors {total:,} B: {ratio:.1f}x")
    print(
        f"weights.mcw file (with its JSON index and 64-byte alignment): {mcw:,} B: {original_bytes / mcw:.1f}x"
    )
    drop = 100 * (baseline - accuracy)
    print(f"accuracy: original {baseline:.4f}, compressed bundle {accuracy:.4f} (drop {drop:.2f} points)")
    ok = ratio >= 40 and drop <= 0.5
    print(f"gate (>= 40x, drop <= 0.5 points): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
