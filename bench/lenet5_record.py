"""Issue 45's headline: the Caffe LeNet-5 through ``mconv optimize --recipe deep-compression`` at
the soft weight-sharing record (162x of 1,725,006 B: a 10,648 B cpu bundle) within 0.2 point, on
real MNIST digits the search never sees.

Data: ``../shared/data/mnist5k.npz`` (5,000 MNIST training digits, 500 a class), split seeded and
stratified (``--split-seed``, default 45): 400 digits a class (4,000) are ``--data`` (fine-tuning
and the search's estimates), the other 100 a class (1,000) ``--val-data`` (the gate; never trained
on); pixels / 256 as the Caffe net was trained. The command is the product's, run as a user
runs it (a subprocess of ``python -m mconv``); then the result is exported as a cpu bundle and
measured here with ONNX Runtime on the 1,000 held-out digits, and the ratio is counted three ways
(:mod:`mconv.drivers.budget.ratios`). Appends a row per run to bench/results/lenet5_record.md
(command, machine, figure, date, commit).

Run: python bench/lenet5_record.py [--target-size 10648] [--max-drop 0.002] [--engine xla]
     [--device cpu] [--prior auto|l2|gmm] [--epochs N] [--shared ../shared] [--work DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def split_digits(shared: Path, work: Path, seed: int, test: bool = False) -> tuple[Path, Path, Path | None]:
    """The stratified split as .npz files (``data`` float32 [N,1,28,28] /256, ``labels``):
    4,000 ``--data`` / 1,000 ``--val-data``, or with ``test`` 3,000 / 1,000 / 1,000 TEST digits
    that are never given to the product (the gate's set is then not the set reported)."""
    with np.load(shared / "data" / "mnist5k.npz") as z:
        x, y = z["images"], z["labels"]
    rng = np.random.default_rng(seed)
    n_tune = 300 if test else 400
    parts: dict[str, list[int]] = {"tune": [], "val": [], "test": []}
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        parts["tune"] += list(idx[:n_tune])
        parts["val"] += list(idx[n_tune : n_tune + 100])
        parts["test"] += list(idx[n_tune + 100 :])
    names = {
        "tune": "digits3k.npz" if test else "digits4k.npz",
        "val": "digits1k.npz",
        "test": "digits1k_test.npz",
    }
    paths: dict[str, Path] = {}
    for key, idx in parts.items():
        if not idx:
            continue
        p = work / names[key]
        sel = np.sort(np.asarray(idx))
        np.savez(p, data=x[sel][:, None].astype(np.float32) / 256.0, labels=y[sel].astype(np.int64))
        paths[key] = p
    return paths["tune"], paths["val"], paths.get("test")


def accuracy(model_path: Path, data: Path) -> float:
    import onnxruntime as ort

    with np.load(data) as z:
        x, y = z["data"], z["labels"]
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return float(np.mean(out.argmax(1) == y))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-size", default="10648", help="bytes of the cpu bundle, or none")
    ap.add_argument("--max-drop", default="0.002")
    ap.add_argument("--engine", default="xla")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prior", default=None, help="auto, l2 or gmm (the budget's pre-training)")
    ap.add_argument("--cluster", default="kmeans", help="kmeans or entropy, as mconv optimize --cluster")
    ap.add_argument("--epochs", default=None)
    ap.add_argument("--structured", default="auto", help="auto or off, as mconv optimize --structured")
    ap.add_argument("--split-seed", type=int, default=45)
    ap.add_argument(
        "--test",
        action="store_true",
        help="3,000 --data / 1,000 --val-data / 1,000 TEST digits never given to the product (reported)",
    )
    ap.add_argument(
        "--shared", type=Path, default=Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))
    )
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "lenet5_record.md")
    args = ap.parse_args()
    import mconv
    from mconv.drivers.budget.ratios import three_ratios

    work = args.work or Path(tempfile.mkdtemp(prefix="lenet5_record_"))
    work.mkdir(parents=True, exist_ok=True)
    caffe = args.shared / "models" / "caffe"
    files = [caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"]
    source_bytes = files[1].stat().st_size  # the 1.72 MB the papers divide (weights; prototxt aside)
    lenet = work / "lenet.onnx"
    run = [sys.executable, "-m", "mconv"]
    subprocess.run([*run, "import", *map(str, files), "-o", str(lenet)], check=True, capture_output=True)
    tune, held, test = split_digits(args.shared, work, args.split_seed, args.test)
    out = work / "lenet_record.onnx"
    cmd = [
        "optimize", str(lenet), "--recipe", "deep-compression", "--data", str(tune), "--val-data", str(held),
        "--max-drop", args.max_drop, "--engine", args.engine, "--device", args.device, "-o", str(out), "--json",
    ]  # fmt: skip
    if args.target_size != "none":  # "none": the smallest bundle within --max-drop
        cmd[8:8] = ["--target-size", args.target_size, "--target-of", "bundle"]
    if args.epochs:
        cmd += ["--epochs", args.epochs]
    env = dict(os.environ)
    if args.prior:
        cmd += ["--prior", args.prior]
    if args.cluster != "kmeans":
        cmd += ["--cluster", args.cluster]
    cmd += ["--structured", args.structured]  # explicit: the product's default is auto
    t0 = time.perf_counter()
    r = subprocess.run([*run, *cmd], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if not out.exists():
        print(r.stderr[-3000:])
        return 2
    report = json.loads(r.stdout)["budget"]
    bundle = work / "bundle"
    subprocess.run(
        [*run, "export", str(out), "--target", "cpu", "-o", str(bundle)], check=True, capture_output=True
    )
    ratios = three_ratios(mconv.open_model(lenet), mconv.open_model(out), source_bytes, bundle)
    base, got = accuracy(lenet, held), accuracy(out, held)
    if test is not None:
        gate = f"gate set {base:.4f} -> {got:.4f} (drop {100 * (base - got):.2f} pt)"
        base, got = accuracy(lenet, test), accuracy(out, test)
        seen = f"1,000 TEST digits never given to the product; {gate}"
    else:
        seen = "1,000 digits never trained on"
    figure = (
        f"{'met' if r.returncode == 0 else 'NOT met'}: held-out accuracy {base:.4f} -> {got:.4f} "
        f"(drop {100 * (base - got):.2f} pt, {seen}); ratios: nonzero parameters "
        f"{ratios['ratio_nonzero']}x ({ratios['nonzero_parameters']:,} of {ratios['parameters']:,}), cpu bundle "
        f"{ratios['ratio_bundle']}x ({ratios['bundle_bytes']:,} B), weights.mcw {ratios['ratio_weights_mcw']}x "
        f"({ratios['weights_mcw_bytes']:,} B); {seconds:.0f} s"
    )
    print(figure)
    print(
        json.dumps(
            {
                "ratios": ratios,
                "baseline": base,
                "final": got,
                "stages": report.get("stages"),
                "layers": report.get("layers"),
            },
            indent=1,
        )
    )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    machine = f"{platform.machine()}, {os.cpu_count()} cores (shared), engine {args.engine}/{args.device}"
    shown = "mconv " + " ".join(c if "/" not in c else Path(c).name for c in cmd)
    row = f"| `{shown}` | {machine} | {figure} | {datetime.date.today()} | {commit.stdout.strip()} |\n"
    if not args.results.exists():
        args.results.write_text("| command | machine | figure | date | commit |\n|---|---|---|---|---|\n")
    with args.results.open("a") as f:
        f.write(row)
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
