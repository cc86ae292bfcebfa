"""Two revisions of mconv, the same commands: are the CLI's JSON and files byte-identical?

A move of modules (a new layer, a split file) must change nothing a user sees. This runs each
command of :data:`COMMANDS` on each model of the corpus's fast subset (``bench/zoo.py``, its
prepared files in the zoo cache; the Caffe LeNet-5 of ``../shared`` too) with each revision,
checked out with ``git worktree`` into a temporary folder and imported through ``PYTHONPATH``,
and compares:

- stdout (the ``--json`` document), after taking out what differs by nature: the keys
  ``seconds``/``time``/``wall``/``elapsed``/``duration`` and the paths of the two work folders;
- every file the command wrote, by sha256 (a bundle's files one by one).

Run: python bench/same_outputs.py REV_A REV_B [--models a,b] [--out bench/results/same_outputs.md]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

# (label, argv after `mconv`, with {src} the model's files and {out} a path in the work folder)
COMMANDS = [
    ("import", ["import", "{src}", "-o", "{out}/m.onnx", "--json"]),
    ("inspect", ["inspect", "{out}/m.onnx", "--json"]),
    ("lossless", ["optimize", "{out}/m.onnx", "--recipe", "lossless", "-o", "{out}/lossless.onnx", "--json"]),
    ("fp16", ["optimize", "{out}/m.onnx", "--passes", "fold,fp16", "-o", "{out}/fp16.onnx", "--json"]),
    ("int8", ["optimize", "{out}/m.onnx", "--passes", "quantize", "-o", "{out}/int8.onnx", "--json"]),
    ("cpu", ["export", "{out}/m.onnx", "--target", "cpu", "-o", "{out}/cpu", "--json"]),
    ("xla", ["export", "{out}/m.onnx", "--target", "xla", "-o", "{out}/xla", "--json"]),
    ("metal", ["export", "{out}/m.onnx", "--target", "metal", "-o", "{out}/metal", "--json"]),
    ("webgpu", ["export", "{out}/m.onnx", "--target", "webgpu", "-o", "{out}/webgpu", "--json"]),
]
_VOLATILE = {"seconds", "time", "wall", "elapsed", "duration", "time_s", "wall_s"}


def _clean(doc, work: str):
    if isinstance(doc, dict):
        return {k: _clean(v, work) for k, v in doc.items() if k not in _VOLATILE}
    if isinstance(doc, list):
        return [_clean(v, work) for v in doc]
    if isinstance(doc, str):
        return doc.replace(work, "<work>")
    return doc


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _checkout(rev: str, where: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(where), rev], cwd=ROOT, check=True)
    return where


def _run(tree: Path, argv: list[str], work: Path) -> tuple[int, object, dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    before = set(_files(work))
    r = subprocess.run([sys.executable, "-m", "mconv", *argv], capture_output=True, text=True, env=env)
    try:
        doc = _clean(json.loads(r.stdout), str(work)) if r.stdout.strip() else None
    except json.JSONDecodeError:
        doc = r.stdout.replace(str(work), "<work>")
    written = {k: v for k, v in _files(work).items() if k not in before}
    return r.returncode, doc, written


def models(names: list[str] | None) -> dict[str, list[str]]:
    import zoo

    out: dict[str, list[str]] = {}
    for m in zoo.CORPUS:
        if not m.fast or (names and m.name not in names):
            continue
        meta = zoo.prep_dir(m.name) / "meta.json"
        if not meta.exists():
            print(f"{m.name}: not prepared (run bench/zoo.py --subset fast once)", file=sys.stderr)
            continue
        out[m.name] = json.loads(meta.read_text())["files"]
    shared = Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared")) / "models" / "caffe"
    if (not names or "caffe-lenet" in names) and shared.is_dir():
        out["caffe-lenet"] = [str(shared / "lenet.prototxt"), str(shared / "lenet_iter_10000.caffemodel")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--models", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "same_outputs.md"))
    args = ap.parse_args()
    chosen = models([n for n in args.models.split(",") if n] or None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        t = Path(tmp)
        trees = [_checkout(args.rev_a, t / "a"), _checkout(args.rev_b, t / "b")]
        try:
            for name, src in chosen.items():
                for label, argv in COMMANDS:
                    results = []
                    for k, tree in enumerate(trees):
                        work = t / f"work{k}" / name
                        work.mkdir(parents=True, exist_ok=True)
                        filled = []
                        for a in argv:
                            if a == "{src}":
                                filled.extend(src)
                            else:
                                filled.append(a.replace("{out}", str(work)))
                        results.append(_run(tree, filled, work))
                    (ca, da, fa), (cb, db, fb) = results
                    same = ca == cb and da == db and fa == fb
                    why = []
                    if ca != cb:
                        why.append(f"exit {ca} vs {cb}")
                    if da != db:
                        why.append("json differs")
                    if fa != fb:
                        why.append(
                            f"files differ: {sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))[:4]}"
                        )
                    rows.append((name, label, ca, same, "; ".join(why)))
                    print(
                        f"{name:28s} {label:9s} exit {ca} {'same' if same else 'DIFFERENT: ' + '; '.join(why)}"
                    )
        finally:
            for tree in trees:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    n_same = sum(r[3] for r in rows)
    date = datetime.date.today().isoformat()
    text = (
        "| command | machine | figure | date | commit |\n|---|---|---|---|---|\n"
        f"| `python bench/same_outputs.py {args.rev_a} {args.rev_b}` ({len(chosen)} models x "
        f"{len(COMMANDS)} commands) | {os.cpu_count()}-core CPU | {n_same} of {len(rows)} commands "
        f"byte-identical (JSON without timings, every file written) | {date} | {args.rev_b} |\n\n"
        "| model | command | exit | identical | difference |\n|---|---|---:|---|---|\n"
        + "".join(f"| {n} | {c} | {e} | {'yes' if s else 'NO'} | {w} |\n" for n, c, e, s, w in rows)
    )
    Path(args.out).write_text(text)
    print(f"{n_same} of {len(rows)} identical; table in {args.out}")


if __name__ == "__main__":
    main()
