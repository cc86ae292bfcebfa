"""Calibration of the data-free check that limits a recipe run without data.

``mconv optimize MODEL --recipe deep-compression`` without ``--data`` backs every prune and
cluster off per layer until the layer's weight SNR is at least ``base + 10 log10(layers)`` dB
(:func:`mconv.drivers.budget.limit_datafree`). This bench picks ``base``
(:data:`mconv.drivers.budget.DATAFREE_SNR_DB`): for each base in ``--bases`` it runs the recipe
through the API (no data: the product sees none) on trained models of the corpus and measures,
with ONNX Runtime on real inputs the product never sees, the top-1 agreement of the compressed
model with the original (cosine for outputs that are not class scores) and the predicted bundle
weights. The chosen base is the smallest at which every model keeps top-1 agreement >= 0.99.

Models and inputs (real where the corpus has them):
- ``digits-mlp``, ``digits-dwcnn``: the fixtures, on the 450 held-out UCI digits
  (``fixtures/digits_test.npz``);
- ``caffe-lenet``: the Caffe LeNet-5 of ``../shared/models``, on 1,000 real MNIST digits
  (``../shared/data/mnist5k.npz``, pixels in [0, 1]);
- ``keras2-conv2d``: the Keras 2 digits classifier of ``../shared/models``, on the 1,797 UCI
  digits as bench/zoo.py prepares them (8x8 in [0, 1]);
- ``tflite-mnist-lstm``: the TFLite MNIST LSTM, on 200 MNIST digits (28 rows of 28);
- ``keras2-3layer``, ``keras2-jettagger-conv2d``, ``keras2-conv1d``: the jet taggers, on 256
  draws of bench/zoo.py's standardized jet features (the jet data itself is not shipped here);
- ``rapidocr-cls-v2`` (wheel): the text-orientation classifier, on 48 rendered text lines,
  upright and turned 180 degrees, as bench/zoo.py renders them;
- ``magika`` (wheel): the file-type classifier, on the bytes of 120 real files of this checkout;
- ``nudenet-320n`` (wheel): a detector (outputs are boxes and scores, judged by cosine), on
  scikit-image's sample photos.

The jet taggers' inputs are synthetic (the jet data set is not shipped here) and their outputs
nearly tied on them, so their agreement is reported but not used to choose the base.

Usage: ``python3 bench/datafree_check.py [--bases 15,20,25] [--only NAME,...] [--out FILE.md]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import zoo  # noqa: E402

SHARED = zoo.SHARED
TEXTS = [
    "Hello World 123",
    "mconv reads models",
    "OCR 2024: 42.5%",
    "The quick brown fox",
    "jumps over the lazy dog",
    "Please call me back",
    "Invoice no. 1187",
    "Total due: $93.10",
    "Deep Compression",
    "pruning and clustering",
    "weights and biases",
    "top-1 agreement",
    "Room 4B, 2nd floor",
    "Monday 9:30 am",
    "keep out of reach",
    "best before 12/27",
    "Exit",
    "Main Street 221",
    "orientation",
    "no data was given",
    "signal to noise",
    "ONNX Runtime",
    "batch of images",
    "Caffe LeNet-5",
]


def _digits_uci() -> tuple[np.ndarray, np.ndarray]:
    with np.load(ROOT / "fixtures" / "digits_test.npz") as z:
        return z["images"].astype(np.float32) / 16.0, z["labels"]


def _mnist(n: int) -> np.ndarray:
    with np.load(SHARED / "data" / "mnist5k.npz") as z:
        idx = np.random.default_rng(0).permutation(len(z["images"]))[:n]
        return z["images"][idx].astype(np.float32) / 255.0


def _jets(shape: list[int], n: int = 256) -> np.ndarray:
    """bench/zoo.py's standardized jet features (``jets16``/``jet_images``/``jet_seq``), n draws."""
    rng = np.random.default_rng(12)
    size = int(np.prod(shape))
    basis = rng.standard_normal((3, size)).astype(np.float32)
    coef = rng.standard_normal((n, 3)).astype(np.float32)
    x = coef @ basis / np.sqrt(3) + 0.1 * rng.standard_normal((n, size)).astype(np.float32)
    return x.reshape([n, *shape]).astype(np.float32)


def _ocr_cls() -> np.ndarray:
    imgs = [zoo.text_image(t, 48, 192) for t in TEXTS]
    imgs += [im[::-1, ::-1] for im in imgs]  # the same lines turned 180 degrees
    x = (np.stack(imgs).astype(np.float32) / 255.0 - 0.5) / 0.5
    return x.transpose(0, 3, 1, 2).astype(np.float32)


def _magika() -> np.ndarray:
    files = sorted(
        p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts and p.stat().st_size > 64
    )
    rows = []
    for p in files[:: max(len(files) // 120, 1)][:120]:
        data = p.read_bytes()
        beg = list(data[:1024]) + [256] * max(0, 1024 - len(data))
        rows.append(beg[:1024] + list(data[-1024:]) + [256] * max(0, 1024 - len(data)))
    return np.array([r[:2048] for r in rows], np.int32)


DETECTORS = {"nudenet-320n"}  # boxes and scores: cosine only
SYNTHETIC = {"keras2-3layer", "keras2-jettagger-conv2d", "keras2-conv1d"}  # inputs not real
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "cat", "coins", "camera", "moon")


def _photos(size: int) -> np.ndarray:
    """scikit-image's sample photos, as bench/zoo.py gives them, resized, NCHW in [0, 1]."""
    out = []
    for name in PHOTOS:
        try:
            img = zoo.photo(name)
        except Exception:  # noqa: BLE001 - a sample this scikit-image lacks
            continue
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, -1)
        out.append(zoo.resize(img[..., :3], size, size).astype(np.float32) / 255.0)
    return np.stack(out).transpose(0, 3, 1, 2).astype(np.float32)


# name -> (zoo name or fixture path, input builder -> {input name: array})
MODELS: dict[str, tuple[str, Callable[[list[str]], dict[str, np.ndarray]]]] = {
    "digits-mlp": ("fixture:digits_mlp.onnx", lambda n: {n[0]: _digits_uci()[0].reshape(-1, 64)}),
    "digits-dwcnn": ("fixture:digits_dwcnn.onnx", lambda n: {n[0]: _digits_uci()[0][:, None]}),
    "caffe-lenet": ("caffe-lenet", lambda n: {n[0]: _mnist(1000)[:, None]}),
    "keras2-conv2d": (
        "keras2-conv2d",
        lambda n: {n[0]: zoo.digits(1797, 8)[0][..., None].astype(np.float32)},
    ),
    "tflite-mnist-lstm": ("tflite-mnist-lstm", lambda n: {n[0]: _mnist(200)}),
    "keras2-3layer": ("keras2-3layer-h5", lambda n: {n[0]: _jets([16])}),
    "keras2-jettagger-conv2d": ("keras2-jettagger-conv2d", lambda n: {n[0]: np.abs(_jets([25, 25, 1]))}),
    "keras2-conv1d": ("keras2-conv1d", lambda n: {n[0]: _jets([10, 4])}),
    "rapidocr-cls-v2": ("rapidocr-cls-v2", lambda n: {n[0]: _ocr_cls()}),
    "magika": ("magika", lambda n: {n[0]: _magika()}),
    "nudenet-320n": ("nudenet-320n", lambda n: {n[0]: _photos(320)}),
}


def onnx_of(name: str, work: Path) -> Path:
    """The model as ONNX: a fixture, or the corpus's source imported by ``mconv``."""
    import mconv.api as api

    source = MODELS[name][0]
    if source.startswith("fixture:"):
        return ROOT / "fixtures" / source.split(":", 1)[1]
    meta = zoo.prepare(source)
    out = work / f"{name}.onnx"
    if not out.is_file():
        api.convert([Path(f) for f in meta["files"]], out)
    return out


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The first output on every sample (one at a time where the model's batch is fixed)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_outputs()[0].name
    n = len(next(iter(feeds.values())))
    fixed = any(isinstance(i.shape[0], int) for i in sess.get_inputs())
    step = 1 if fixed else 256
    outs = [sess.run([name], {k: v[s : s + step] for k, v in feeds.items()})[0] for s in range(0, n, step)]
    return np.concatenate(outs).reshape(n, -1)


def measure(ref: np.ndarray, got: np.ndarray, scores: bool = True) -> dict:
    """Top-1 agreement (class scores only), cosine, and how many classes the result predicts."""
    cos = float(np.sum(ref * got) / (np.linalg.norm(ref) * np.linalg.norm(got) + 1e-30))
    scores = scores and ref.shape[1] > 1
    agree = float(np.mean(ref.argmax(1) == got.argmax(1))) if scores else None
    hit = int(len(np.unique(got.argmax(1)))) if scores else None
    return {"top1_agreement": agree, "cosine": cos, "classes_hit": hit}


def run_model(name: str, bases: list[float], work: Path) -> list[dict]:
    import mconv.api as api
    import mconv.drivers.budget as B
    import onnx

    src = onnx_of(name, work)
    names = [i.name for i in onnx.load(str(src), load_external_data=False).graph.input]
    feeds = MODELS[name][1](names)
    ref = _run(src, feeds)
    rows = []
    for base in bases:
        B.DATAFREE_SNR_DB = base
        out = work / f"{name}.{base:g}.onnx"
        t0 = time.perf_counter()
        res = api.optimize(str(src), recipe="deep-compression", output=str(out))
        seconds = time.perf_counter() - t0
        got = _run(out, feeds)
        plan = res.datafree
        rows.append(
            {
                "model": name,
                "base_db": base,
                "layer_db": round(plan.snr_db, 2),
                "layers": len(plan.layers),
                "backed_off": plan.backed_off,
                "samples": int(len(ref)),
                # the dense weights as written (a model whose weights were Constant nodes counts
                # them once fold made them initializers) against the predicted bundle weights
                "ratio": round(res.weight_bytes_after / max(res.predicted_bundle_weight_bytes or 1, 1), 2),
                "seconds": round(seconds, 1),
                **measure(ref, got, scores=name not in DETECTORS),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = "| model | base dB | per-layer dB | layers (backed off) | samples | top-1 agreement | cosine | classes hit | bundle ratio | s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        agree = "-" if r["top1_agreement"] is None else f"{r['top1_agreement']:.4f}"
        lines.append(
            f"| {r['model']} | {r['base_db']:g} | {r['layer_db']:.1f} | {r['layers']} ({r['backed_off']}) | "
            f"{r['samples']} | {agree} | {r['cosine']:.5f} | {r['classes_hit'] or '-'} | {r['ratio']}x | {r['seconds']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bases", default="15,20,25")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    bases = [float(b) for b in args.bases.split(",")]
    names = [n for n in MODELS if not args.only or n in args.only.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                rows += run_model(name, bases, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a model that cannot run is listed, not fatal
                print(f"{name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    text = table(rows)
    for base in bases:
        at = [
            r
            for r in rows
            if r["base_db"] == base and r["top1_agreement"] is not None and r["model"] not in SYNTHETIC
        ]
        worst = min((r["top1_agreement"] for r in at), default=float("nan"))
        cos = min((r["cosine"] for r in rows if r["base_db"] == base), default=float("nan"))
        text += (
            f"\n\nbase {base:g} dB: worst top-1 agreement {worst:.4f} over {len(at)} classifiers on "
            f"real inputs; worst cosine {cos:.4f} over all"
        )
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
