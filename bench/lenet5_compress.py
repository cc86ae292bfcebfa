"""P2: Deep Compression of the real Caffe LeNet-5 (MNIST, 10k iterations) with distillation.

Model: ../shared/models/caffe/lenet.prototxt + lenet_iter_10000.caffemodel, imported with
``mconv.formats.import_model`` (1,724,320 bytes of float32 weights, Deep Compression's LeNet-5).
Data: the UCI digits (../shared/data/digits.npz, 1797 real handwritten digits) in MNIST framing
(``mconv.datasets.digits_as_mnist``), split as the embedded MLP's fixtures are
(``mconv.fixtures.train_digits_mlp.split``, seeded): 1347 digits for fine-tuning, the other 450
for measuring. No labels are used anywhere: fine-tuning distils from the uncompressed model
(T^2 KL on softmax(logits / T), plus a top-1 margin hinge), and the gate is top-1 agreement
with the uncompressed model.

Distillation set: no labels are needed, so any plausible input is a training sample. The 1347
fine-tuning digits are followed by ``--augment`` jittered copies of each (``augment``: rotated,
scaled and shifted about the frame's centre, ``--jitter`` scaling the ranges), and the teacher's
outputs on them are the targets. Options tried in the sweeps: ``--mixup`` (blends of two
frames), ``--hard`` (extra copies of frames on which the teacher's top-2 margin is under 0.3),
``--redraw`` (new 8x8 digits drawn as the UCI set was, see ``redraw``), ``--optimizer sgd`` and
``--prune-lr`` (masked retraining). The 450 measuring digits are never trained on; their labels
are used only to report both models' accuracy.

Pipeline (library API, the code path of ``mconv optimize`` + ``mconv export``): iterative
magnitude pruning in two steps (``--steps``) towards the final per-layer sparsities with masked
retraining after each (then ``--settle`` extra passes at lower rates, if given) -> k-means weight
sharing (linear init) -> centroid fine-tuning at lr 3e-4, then 1e-4 -> float16 values for the
biases -> cpu bundle (sparse relative indices, palettes, Huffman). Every fine-tuning stage decays
its rate to 0 on a cosine (``--schedule``) and adds the ``finetune`` pass's top-1 margin hinge,
weight 0.3, to the KL (``--margin``; 0 for KL alone).

Defaults (3 jittered copies, 4 epochs per stage) were chosen by ``--val 200`` (200 of the 1347
fine-tuning digits held out, scored plain and with 2 jittered copies each) over the earlier
defaults (1 copy, 3 epochs): val 0.9888 / 0.9650 mean over 4 seeds against 0.9875 / 0.9575 over
2 (the jittered frames are the ones that separate them). The cosine schedule and the margin
hinge came from ``bench/lenet5_probe.py``'s sweep (bench/results/lenet5_sweep_2.md). The hinge
cuts the student's disagreements on its own fine-tuning digits from 8-10 to 3-5. On the 450
measuring digits, 8 of 12 probe runs passed, against 3 of 13 before, but fresh seeds pass less
often than the seeds it was picked on.

Status: agreement with the uncompressed model sits just under 0.99: on 24 fresh seeds it passes
5 times, with 3-8 misses (bench/results/lenet5_sweep_3.md). Four digits make most misses: two
1-vs-4 near-ties (teacher margins 0.022 and 0.026) flip in every run, and two digits the teacher
gets wrong (margins 0.264 and 0.299) are corrected in most runs. The run prints the teacher's
top-2 margin on each digit it gets wrong, and which model the labels side with. Earlier findings: 3-bit ip1 with
more kept weights is larger (more indices) and no better; 5-bit ip1 goes over 44 KB.

Gates: the weights.mcw file <= 44 KB = 44,000 B (the paper's 44 KB; 45,056 B if KB = 1024), top-1
agreement >= 99% on the 450 digits.

Run: python bench/lenet5_compress.py [--seeds 0,1,2,3] [--epochs 4] [--augment 3] [--jitter 0.5]
     [--val 200] [--temperature 2] [--sparsity ip1=0.93] [--bits conv2=6] [--steps 0.7,1]
     [--settle 0.0003,0.0001] [--hard 2] [--mixup 2] [--final-lr 0.0003,0.0001] [--schedule cosine]
     [--margin 0.3] [--redraw 3] [--strength 1] [--optimizer adam] [--prune-lr 0.001]
     [--shared ../shared]
     (about 2.5 minutes per seed on 2 idle cores)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from mlp_compress import biases_to_half, exported

ROOT = Path(__file__).resolve().parent.parent
# Kept fractions in the spirit of the paper's Table 2 (conv1 66%, conv2 12%, ip1 8%, ip2 19%).
FINAL_SPARSITY = {"conv1": 0.3, "conv2": 0.8, "ip1": 0.93, "ip2": 0.8}
BITS = {"conv1": 6, "conv2": 6, "ip1": 4, "ip2": 5}
STEPS = (0.7, 1.0)  # fractions of the final sparsity, one prune + retrain each
FINAL_LR = (0.0003, 0.0001)  # centroid fine-tuning passes after clustering
PAPER = {"conv1": 0.66, "conv2": 0.12, "ip1": 0.08, "ip2": 0.19}


def pipeline_spec(
    epochs: int,
    loss: str = "kl",
    batch: int = 32,
    temperature: float = 2.0,
    final_lr: tuple[float, ...] = FINAL_LR,
    settle: tuple[float, ...] = (),
    schedule: str = "cosine",
    margin: float = 0.3,
    prune_lr: float = 0.001,
    optimizer: str = "adam",
) -> str:
    def finetune(lr: float, opt: str = "adam") -> str:
        return (
            f"finetune(epochs={epochs},lr={lr},batch_size={batch},holdout=0.0,loss={loss!r},"
            f"temperature={temperature},schedule={schedule!r},margin={margin}"
            + (f",optimizer={opt!r})" if opt != "adam" else ")")
        )

    parts = []
    for f in STEPS:
        per_layer = {k: {"sparsity": round(s * f, 4)} for k, s in FINAL_SPARSITY.items()}
        parts.append(f"prune(op_name={per_layer!r})")
        parts.append(finetune(prune_lr, optimizer))  # masked retraining
    parts.extend(finetune(lr, optimizer) for lr in settle)  # at decaying rates, before clustering
    parts.append(f"cluster(init='linear',op_name={ {k: {'bits': b} for k, b in BITS.items()}!r})")
    parts.extend(finetune(lr) for lr in final_lr)  # centroid fine-tuning (Adam), the learning rate decaying
    return ",".join(parts)


def augment(frames: np.ndarray, copies: int, seed: int = 0, jitter: float = 1.0) -> np.ndarray:
    """``frames`` (N, 1, 28, 28) followed by ``copies`` randomly jittered copies of each: rotated
    by up to 12 degrees, scaled by 0.9-1.1 and shifted by up to 2 pixels about the frame's centre
    (bilinear, seeded). Distillation needs no labels, so any plausible input is a training sample:
    the teacher's outputs on the copies are the targets."""
    from scipy import ndimage

    rng = np.random.default_rng([seed, 0xA06])
    out = [frames]
    centre = np.array([13.5, 13.5])
    for _ in range(copies):
        batch = np.empty_like(frames)
        for i, img in enumerate(frames[:, 0]):
            angle = np.deg2rad(rng.uniform(-12, 12) * jitter)
            scale = 1.0 + rng.uniform(-0.1, 0.1) * jitter
            shift = rng.uniform(-2, 2, size=2) * jitter
            c, s = np.cos(angle), np.sin(angle)
            inverse = np.array([[c, s], [-s, c]]) / scale  # output pixel -> input pixel
            offset = centre - inverse @ (centre + shift)
            batch[i, 0] = ndimage.affine_transform(img, inverse, offset, order=1, mode="constant")
        out.append(np.clip(batch, 0.0, 1.0))
    return np.concatenate(out)


def mixup(frames: np.ndarray, copies: int, seed: int = 0) -> np.ndarray:
    """``copies`` blends per frame of two random frames, ``lam * a + (1 - lam) * b`` with ``lam``
    uniform in [0, 1] (seeded). The teacher's outputs on blends show the student where its
    decision boundaries lie between digits, which plain digits rarely do (Beyer et al., 2022:
    "Knowledge distillation: a good teacher is patient and consistent")."""
    rng = np.random.default_rng([seed, 0x313])
    out = []
    for _ in range(copies):
        a, b = rng.permutation(len(frames)), rng.permutation(len(frames))
        lam = rng.uniform(0.0, 1.0, size=(len(frames), 1, 1, 1)).astype(frames.dtype)
        out.append(lam * frames[a] + (1 - lam) * frames[b])
    return np.concatenate(out) if out else frames[:0]


def redraw(images: np.ndarray, copies: int, seed: int = 0, strength: float = 1.0) -> np.ndarray:
    """``copies`` new 8x8 digits (values 0..16) per UCI digit in ``images``, made the way the UCI
    set itself was: each digit's ink density is upsampled to the 32x32 bitmap grid it was counted
    from, warped (rotation up to 10 degrees, scale 0.9-1.1 per axis, shear up to 0.2, a smooth
    elastic field of about a pixel; ``strength`` scales all four), thresholded into a bitmap at a
    random level in 0.45-0.65 (stroke width; 0.55 keeps the ink mass) and counted in 4x4 blocks.
    Framed with ``digits_as_mnist`` they are drawn from the measuring digits' own distribution,
    which jittering the 28x28 frames (``augment``) is not: every measuring frame is a bilinear
    upscale of an 8x8 grid, centred by its centre of mass. Seeded."""
    from scipy import ndimage

    rng = np.random.default_rng([seed, 0x8D8])
    out = np.empty((copies * len(images), 8, 8), np.uint8)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float64) - 15.5
    densities = [np.clip(ndimage.zoom(img / 16.0, 4, order=1), 0.0, 1.0) for img in images]  # once each
    for k in range(len(out)):
        density = densities[k % len(images)]
        a = np.deg2rad(rng.uniform(-10, 10) * strength)
        sy, sx = 1.0 + rng.uniform(-0.1, 0.1, size=2) * strength
        shear = rng.uniform(-0.2, 0.2) * strength
        forward = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]) @ np.array(
            [[sy, shear], [0, sx]]
        )
        inv = np.linalg.inv(forward)  # output pixel -> input pixel
        field = [
            ndimage.gaussian_filter(rng.uniform(-1, 1, (32, 32)), 4, mode="constant") * 16 * strength
            for _ in "yx"
        ]
        py = inv[0, 0] * yy + inv[0, 1] * xx + 15.5 + field[0]
        px = inv[1, 0] * yy + inv[1, 1] * xx + 15.5 + field[1]
        warped = ndimage.map_coordinates(density, [py, px], order=1, mode="constant")
        out[k] = (warped > rng.uniform(0.45, 0.65)).reshape(8, 4, 8, 4).sum(axis=(1, 3))
    return out


class P2Data(NamedTuple):
    files: list[Path]  # the Caffe LeNet-5's prototxt and caffemodel
    tune_frames: np.ndarray  # the fine-tuning digits as MNIST frames (N, 1, 28, 28)
    test_frames: np.ndarray  # the measuring digits, likewise
    tune_images: np.ndarray  # the fine-tuning digits' 8x8 originals (for ``redraw``)
    test_labels: np.ndarray  # the measuring digits' labels: never trained on, for reporting only


def p2_data(shared: Path) -> P2Data | None:
    """The Caffe LeNet-5's two files and the digits, split as the fixtures split them (seeded),
    or None (after saying so) when ``shared`` lacks them."""
    from mconv.datasets import digits_as_mnist
    from mconv.fixtures.train_digits_mlp import split

    caffe = shared / "models" / "caffe"
    files = [caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"]
    if not all(f.is_file() for f in files):
        print(f"{caffe} is missing (set --shared or MCONV_SHARED)")
        return None
    with np.load(shared / "data" / "digits.npz") as z:
        (tune_images, _), (test_images, test_labels) = split(z["images"], z["labels"])
    return P2Data(files, digits_as_mnist(tune_images), digits_as_mnist(test_images), tune_images, test_labels)


def apply_overrides(table: dict, text: str, kind: type) -> None:
    """``text`` like ``ip1=0.925,conv2=0.8`` into ``table``, each value through ``kind``."""
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        table[key] = kind(value)


def main() -> int:
    from mconv import passes as P
    from mconv.datasets import digits_as_mnist
    from mconv.engines.reference.executor import Executor
    from mconv.formats import import_model
    from mconv.irio import model_stats

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--loss", default="kl", choices=["kl", "mse"], help="distillation loss")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=2.0)
    ap.add_argument("--sparsity", default="", help="overrides, e.g. ip1=0.925,conv2=0.8")
    ap.add_argument("--bits", default="", help="overrides, e.g. conv2=5")
    ap.add_argument("--steps", default="", help="prune schedule as fractions of the final, e.g. 0.5,0.8,1")
    ap.add_argument(
        "--shared", type=Path, default=Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))
    )
    ap.add_argument("--out", type=Path, default=None, help="keep the bundle here")
    ap.add_argument("--augment", type=int, default=3, help="jittered copies of each fine-tuning digit")
    ap.add_argument("--jitter", type=float, default=0.5, help="scales the copies' rotation/scale/shift")
    ap.add_argument(
        "--hard", type=int, default=0, help="extra jittered copies of frames the teacher finds close"
    )
    ap.add_argument("--redraw", type=int, default=0, help="new 8x8 digits drawn per fine-tuning digit")
    ap.add_argument("--strength", type=float, default=1.0, help="scales the redrawn digits' warps")
    ap.add_argument("--mixup", type=int, default=0, help="blends of two digits per fine-tuning digit")
    ap.add_argument(
        "--settle", default="", help="extra masked-retraining lrs after the last prune, e.g. 0.0003,0.0001"
    )
    ap.add_argument("--seed", type=int, default=0, help="seeds the jittered copies and the fine-tuning order")
    ap.add_argument(
        "--seeds", default="", help="several runs, e.g. 0,1,2,3: a summary, and exit 0 only if all pass"
    )
    ap.add_argument("--final-lr", default=",".join(map(str, FINAL_LR)), help="centroid fine-tuning lrs")
    ap.add_argument(
        "--schedule", default="cosine", choices=["cosine", "constant"], help="lr within each stage"
    )
    ap.add_argument(
        "--margin",
        type=float,
        default=0.3,
        help="weight of the top-1 margin hinge added to the KL (0: KL only)",
    )
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"], help="for masked retraining")
    ap.add_argument("--prune-lr", type=float, default=0.001, help="masked retraining's learning rate")
    ap.add_argument(
        "--val",
        type=int,
        default=0,
        help="hold this many of the fine-tuning digits out (with their copies) for model selection",
    )
    args = ap.parse_args()
    final_lr = tuple(float(x) for x in args.final_lr.split(","))
    settle = tuple(float(x) for x in filter(None, args.settle.split(",")))
    apply_overrides(FINAL_SPARSITY, args.sparsity, float)
    apply_overrides(BITS, args.bits, int)
    if args.steps:
        global STEPS
        STEPS = tuple(float(f) for f in args.steps.split(","))

    loaded = p2_data(args.shared)
    if loaded is None:
        return 2
    files, tune_frames, test_frames, tune_images, test_labels = loaded
    val = None
    if args.val:  # a seeded slice of the fine-tuning digits, never trained on: for model selection
        order = np.random.default_rng(1).permutation(len(tune_frames))
        val = {"data": augment(tune_frames[order[: args.val]], 2, seed=1)}
        tune_frames, tune_images = tune_frames[order[args.val :]], tune_images[order[args.val :]]
    test = {"data": test_frames}
    original = import_model(files)
    original_bytes = model_stats(original).bytes
    reference = Executor(original).run(test)["prob"]
    teacher_accuracy = float(np.mean(reference.argmax(1) == test_labels))

    def run(seed: int) -> tuple[float, float, int, bool]:
        jittered = augment(tune_frames, args.augment, seed=seed, jitter=args.jitter)
        if args.redraw:  # new digits drawn as the UCI set was, framed as the measuring digits are
            redrawn = digits_as_mnist(redraw(tune_images, args.redraw, seed=seed, strength=args.strength))
            jittered = np.concatenate([jittered, redrawn])
        if args.hard:  # more copies of the frames the teacher finds close (its top-2 margin < 0.3)
            probs = Executor(original).run({"data": jittered})["prob"]
            ranked = np.sort(probs, axis=1)
            close = jittered[ranked[:, -1] - ranked[:, -2] < 0.3]
            extra = augment(close, args.hard, seed=seed + 100, jitter=args.jitter)[len(close) :]
            print(f"hard examples: {len(close)} frames with a teacher margin under 0.3, +{len(extra)} copies")
            jittered = np.concatenate([jittered, close, extra])
        tune = {
            "data": np.concatenate([jittered, mixup(jittered, args.mixup, seed=seed)])
        }  # no labels: distillation
        t0 = time.perf_counter()
        model = import_model(files)
        ctx = P.PassContext(data=tune, seed=seed)
        spec = pipeline_spec(
            args.epochs,
            args.loss,
            args.batch,
            args.temperature,
            final_lr,
            settle,
            args.schedule,
            args.margin,
            args.prune_lr,
            args.optimizer,
        )
        model, reports = P.run_pipeline(model, P.parse_spec(spec), ctx)
        before_half = Executor(model).run(test)["prob"].argmax(1)
        halved = biases_to_half(model)
        seconds = time.perf_counter() - t0

        with exported(model, args.out, "mconv-p2-") as (bundle, runner, mcw):
            got = runner.run(test)["prob"]
            if val is not None:
                same = runner.run(val)["prob"].argmax(1) == Executor(original).run(val)["prob"].argmax(1)
                val_clean, val_all = float(np.mean(same[: args.val])), float(np.mean(same))
        agreement = float(np.mean(got.argmax(1) == reference.argmax(1)))
        account = bundle.manifest["account"]

        print(
            f"P2: Caffe LeNet-5, distilled on {len(tune_frames)} digits (+{args.augment} jittered copies each: "
            f"{len(tune['data'])} frames), measured on {len(test_frames)} others"
        )
        print(f"  pipeline ({seconds:.1f}s): {spec}")
        print(f"  then float16 values for: {', '.join(halved)}")
        for r in reports:
            if r.name == "finetune":
                print(f"  finetune: {r.notes[0]} | {r.notes[-1]}")
        print()
        head = (
            f"{'tensor':<14}{'codec':<26}{'kept':>7}{'paper':>7}{'w bits':>7}{'idx bits':>9}"
            f"{'bytes':>9}{'of f32':>8}"
        )
        print(head)
        print("-" * len(head))
        for row in account["layers"]:
            layer = row["name"].split(".")[0]
            paper = f"{100 * PAPER[layer]:.0f}%" if row["name"].endswith("weight") and layer in PAPER else ""
            print(
                f"{row['name']:<14}{row.get('codec', ''):<26}{100 * row.get('kept', 1):>6.1f}%{paper:>7}"
                f"{row.get('weight_bits', '')!s:>7}{row.get('index_bits') or '':>9}"
                f"{row['bytes']:>9,}{100 * row['bytes'] / row['original_bytes']:>7.2f}%"
            )
        total = account["total"]["bytes"]
        print("-" * len(head))
        print(
            f"{'total':<14}{'':<26}{100 * account['total'].get('kept', 1):>6.1f}%{'8%':>7}{'':>16}{total:>9,}"
        )
        print()
        print(
            f"float32 weights {original_bytes:,} B -> encoded tensors {total:,} B: {original_bytes / total:.1f}x"
        )
        print(f"weights.mcw file (with its JSON index and 64-byte alignment): {mcw:,} B")
        if val is not None:
            print(
                f"model selection, {args.val} held-out fine-tuning digits: agreement {val_clean:.4f}, "
                f"{val_all:.4f} with 2 jittered copies each ({len(val['data'])} frames)"
            )
        print(f"top-1 agreement with the uncompressed model: {agreement:.4f} ({len(test_frames)} digits)")
        print(
            f"  before the biases were rounded to float16: "
            f"{float(np.mean(before_half == reference.argmax(1))):.4f}"
        )
        teacher_right, student_right = reference.argmax(1) == test_labels, got.argmax(1) == test_labels
        print(
            f"  accuracy against the digits' labels (never trained on): uncompressed {teacher_right.mean():.4f}, "
            f"compressed {student_right.mean():.4f}; where the two disagree, the compressed model is right on "
            f"{int(np.sum(student_right & ~teacher_right))}, the uncompressed on "
            f"{int(np.sum(teacher_right & ~student_right))}, neither on "
            f"{int(np.sum(~teacher_right & ~student_right & (got.argmax(1) != reference.argmax(1))))}"
        )
        ranked = np.sort(reference, axis=1)
        margin = ranked[:, -1] - ranked[:, -2]  # the teacher's top-1 minus top-2 probability
        differ = np.flatnonzero(got.argmax(1) != reference.argmax(1))
        print(
            f"  the teacher's top-2 margin on the {differ.size} disagreeing digits: "
            f"{', '.join(f'{m:.3f}' for m in np.sort(margin[differ]))}; digits with a margin under 0.1: "
            f"{int(np.sum(margin < 0.1))} of {len(margin)}"
        )
        ok = mcw <= 44_000 and agreement >= 0.99  # the file, not just its tensors; KB = 1000 (stricter)
        print(
            f"gate (weights.mcw <= 44 KB = 44,000 B [{mcw / 1000:.2f} KB; {mcw / 1024:.2f} KiB of 44 KiB], "
            f"agreement >= 0.99): {'PASS' if ok else 'FAIL'}"
        )
        return agreement, float(student_right.mean()), mcw, ok

    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    results = []
    for seed in seeds:
        if len(seeds) > 1:
            print(f"===== seed {seed}")
        results.append(run(seed))
        print()
    if len(seeds) > 1:
        agreements = [a for a, _, _, _ in results]
        accuracies = [acc for _, acc, _, _ in results]
        print(
            f"seed  agreement  accuracy  weights.mcw  gate   (uncompressed accuracy {teacher_accuracy:.4f})"
        )
        for seed, (a, acc, mcw, ok) in zip(seeds, results):
            print(f"{seed:>4}  {a:9.4f}  {acc:8.4f}  {mcw:>11,}  {'PASS' if ok else 'FAIL'}")
        print(
            f"{len(seeds)} seeds: agreement min {min(agreements):.4f}, median {np.median(agreements):.4f}, "
            f"max {max(agreements):.4f}; {sum(ok for *_, ok in results)} of {len(seeds)} pass the gate; "
            f"accuracy min {min(accuracies):.4f}, mean {np.mean(accuracies):.4f}"
        )
    return 0 if all(ok for *_, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
