"""Issue 44 item 2: how the budget search's time grows with the samples and with the model.

Each row is one whole CLI command, as a user runs it:

    mconv optimize MODEL -o OUT --recipe deep-compression --data D.npz \
        --target-size SIZE --target-of bundle --engine ENGINE [--device DEVICE] --json

timed from outside (wall seconds and the child's CPU seconds, user + system), with the JSON's
``budget`` report: the engine it ran on, the held-out metric before and after, the bundle's
bytes, the attempts, and the search's own seconds.

Models and data (nothing downloaded):
- ``lenet``: the real Caffe LeNet-5 (``$MCONV_SHARED/models/caffe``), imported with
  ``mconv import``; data: the first N of the 5,000 real MNIST digits
  (``$MCONV_SHARED/data/mnist5k.npz``), pixels / 256 as the net was trained, with labels;
  target 44KB of bundle (the paper's 44 KB).
- ``dwcnn``: the depthwise digits CNN of ``mconv.fixtures`` (``digits_dwcnn.onnx``), on the
  1,347 UCI digits it was fixtured with (``digits_train.npz``, pixels / 16), target 2,792 B of
  ``weights.mcw`` (20x, bench/deep_compression.py's; its graph and manifest alone are over 2 KB, so
  a bundle target that small cannot be met).
- ``mnv2``: the corpus's Keras MobileNetV2 (alpha 0.35, 96x96, ``keras-mobilenetv2-035`` of
  bench/zoo.py, its ``model.keras`` given by ``--mnv2``), imported with ``mconv import``; data: N
  crops of scikit-image's colour photos (seeded positions, scales and flips, 96x96, scaled to
  [-1, 1] as Keras's MobileNetV2 takes them), no labels, so the metric is top-1 agreement with
  the original; target 1MB of bundle (6.4x).

Run: python bench/budget_scaling.py [--models lenet,dwcnn] [--samples 1000,2500,5000]
     [--engine auto] [--device cpu] [--machine "2-core CPU"] [--out bench/results/budget_scaling.md]
     [--append] [--jobs N] [--mnv2 model.keras]

On a loaded machine the wall seconds say little; each row's CPU seconds (the command's own, all
its threads) do: on an idle machine of C cores the wall time is at least CPU / C.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def shared() -> Path:
    return Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))


def mconv(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """The CLI as a child process: (result, wall seconds, CPU seconds of that child: user +
    system, from its own rusage, so rows run side by side are told apart)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, "-m", "mconv", *args], stdout=out, stderr=err, env=env or os.environ.copy()
        )
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        r = subprocess.CompletedProcess(p.args, code, out.read(), err.read())
    p.returncode = code  # reaped by wait4
    return r, wall, usage.ru_utime + usage.ru_stime


def prepare(model: str, n: int, work: Path) -> tuple[Path, Path, str, str]:
    """(model file, data file, target size, metric's name) of one row."""
    if model == "lenet":
        onnx_path = work / "lenet.onnx"
        if not onnx_path.exists():
            caffe = shared() / "models" / "caffe"
            r, _, _ = mconv(
                "import", str(caffe / "lenet.prototxt"), str(caffe / "lenet_iter_10000.caffemodel"),
                "-o", str(onnx_path), "-q",
            )  # fmt: skip
            if r.returncode:
                raise SystemExit(r.stderr)
        with np.load(shared() / "data" / "mnist5k.npz") as z:
            images, labels = z["images"][:n], z["labels"][:n]
        data = work / f"mnist{n}.npz"
        np.savez(data, data=(images.astype(np.float32) / 256.0)[:, None], labels=labels)
        return onnx_path, data, "44KB", "accuracy"
    if model == "dwcnn":
        fixtures = ROOT / "fixtures"
        with np.load(fixtures / "digits_train.npz") as z:
            images, labels = z["images"][:n], z["labels"][:n]
        data = work / f"digits{n}.npz"
        np.savez(data, input=(images.astype(np.float32) / 16.0)[:, None], labels=labels)
        return fixtures / "digits_dwcnn.onnx", data, "2792", "accuracy"
    if model == "mnv2":
        onnx_path = work / "mnv2.onnx"
        if not onnx_path.exists():
            r, _, _ = mconv("import", str(MNV2), "-o", str(onnx_path), "-q")
            if r.returncode:
                raise SystemExit(r.stderr)
        data = work / f"photos{n}.npz"
        np.savez(data, input_layer=photo_crops(n, 96))  # PHOTOS: made once, read on a GPU host
        return onnx_path, data, "1MB", "agreement"
    raise SystemExit(f"unknown model {model}")


MNV2 = Path(
    os.environ.get("MCONV_BENCH_MNV2", Path.home() / ".cache/mconv/zoo/keras-mobilenetv2-035/model.keras")
)


PHOTOS: Path | None = None  # --photos: an npz of crops made here, for a host without scikit-image


def photo_crops(n: int, size: int) -> np.ndarray:
    """N real-photo crops, NHWC float32 in [-1, 1]: seeded positions, scales (30-100% of the
    shorter side) and flips over scikit-image's colour photos (bench/zoo.py's ``square_crop``).
    With ``--photos FILE``: read from FILE when it holds at least N of this size, else made and
    written there."""
    crops = None
    if PHOTOS is not None and PHOTOS.exists():
        with np.load(PHOTOS) as z:
            crops = z["crops"]
        if len(crops) < n or crops.shape[1] != size:
            crops = None
    if crops is None:
        crops = _make_crops(n, size)
        if PHOTOS is not None:
            np.savez(PHOTOS, crops=crops)
    return crops[:n].astype(np.float32) / 255.0 * 2.0 - 1.0


def _make_crops(n: int, size: int) -> np.ndarray:
    """The crops as uint8 (NHWC), flips applied."""
    from skimage import data as skd

    sys.path.insert(0, str(ROOT / "bench"))
    import zoo

    names = (
        "astronaut",
        "coffee",
        "chelsea",
        "rocket",
        "hubble_deep_field",
        "retina",
        "immunohistochemistry",
    )
    photos = [getattr(skd, name)()[..., :3] for name in names]
    photos += list(skd.stereo_motorcycle()[:2])
    rng = np.random.default_rng(0)
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        crop = zoo.square_crop(photos[i % len(photos)], rng, 0.3, size, size)
        out[i] = crop[:, ::-1] if rng.random() < 0.5 else crop
    return out


def commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lenet,dwcnn")
    ap.add_argument("--samples", default="1000,2500,5000")
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--machine", default=f"{os.cpu_count()}-core CPU")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "budget_scaling.md"))
    ap.add_argument("--append", action="store_true", help="add rows to the file's table")
    ap.add_argument("--jobs", type=int, default=1, help="rows run side by side (CPU seconds stay per row)")
    ap.add_argument(
        "--mnv2", default=None, help="the keras-mobilenetv2-035 model.keras (bench/zoo.py builds it)"
    )
    ap.add_argument("--photos", default=None, help="npz of the mnv2 row's photo crops (made if absent)")
    args = ap.parse_args()
    global MNV2, PHOTOS
    if args.mnv2:
        MNV2 = Path(args.mnv2)
    if args.photos:
        PHOTOS = Path(args.photos)
    jobs = []
    with tempfile.TemporaryDirectory(prefix="budget-scaling-") as tmp:
        work = Path(tmp)
        for model in args.models.split(","):
            for n in (int(s) for s in args.samples.split(",")):
                if model == "dwcnn" and n > 1347:
                    continue  # the fixture's digits are 1,347
                path, data, target, _ = prepare(model, n, work)
                cmd = [
                    "optimize", str(path), "-o", str(work / f"out-{model}-{n}.onnx"), "--recipe",
                    "deep-compression", "--data", str(data), "--target-size", target, "--target-of",
                    "weights" if model == "dwcnn" else "bundle", "--engine", args.engine, "--json",
                ]  # fmt: skip
                if args.device:
                    cmd += ["--device", args.device]
                jobs.append((model, n, target, cmd))
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            rows = list(pool.map(lambda job: one(*job), jobs))
    write(Path(args.out), rows, args)


def one(model: str, n: int, target: str, cmd: list[str]) -> dict:
    r, wall, cpu = mconv(*cmd)
    try:
        b = json.loads(r.stdout)["budget"]
    except (json.JSONDecodeError, KeyError):
        print(r.stderr[-3000:], file=sys.stderr)
        b = {}
    row = {
        "model": model,
        "samples": n,
        "target": target,
        "exit": r.returncode,
        "engine": b.get("engine", "?"),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "search_s": round(b.get("seconds", float("nan")), 1),
        "attempts": len(b.get("attempts", [])),
        "baseline": b.get("baseline"),
        "final": b.get("final"),
        "drop": b.get("held_out_drop"),
        "bundle": (b.get("size") or {}).get("bundle"),
        "met": b.get("met"),
    }
    print(json.dumps(row), flush=True)
    return row


def write(out: Path, rows: list[dict], args) -> None:
    date = datetime.date.today().isoformat()
    head = (
        "| command | machine | figure | date | commit |\n|---|---|---|---|---|\n"
        if not (args.append and out.exists())
        else ""
    )
    lines = []
    for r in rows:
        fig = (
            f"{r['wall_s']} s wall, {r['cpu_s']} s CPU; engine {r['engine']}; {r['attempts']} attempt(s); "
            f"held-out {r['baseline']} -> {r['final']} (drop {r['drop']}); bundle {r['bundle']} B; "
            f"met {r['met']} (exit {r['exit']})"
        )
        cmd = (
            f"`mconv optimize {r['model']} --recipe deep-compression --data <{r['samples']} samples> "
            f"--target-size {r['target']} --target-of {'weights' if r['model'] == 'dwcnn' else 'bundle'} --engine {args.engine}"
            + (f" --device {args.device}" if args.device else "")
            + "`"
        )
        lines.append(f"| {cmd} | {args.machine} | {fig} | {date} | {commit()} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a" if args.append and out.exists() else "w") as f:
        if head:
            f.write("# Budget search scaling (issue 44 item 2; bench/budget_scaling.py)\n\n" + head)
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
