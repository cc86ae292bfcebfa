"""The corpus's table by stage, from ``bench/results/zoo.json`` (what ``bench/zoo.py`` wrote and
merged), and the commit each cell was measured at.

Usage:
    python3 bench/zoo_table.py [--json bench/results/zoo.json] [--out bench/results/zoo_stage_table.md]
                               [--backfill]

Rules:
- A cell is counted once per stage: ``pass``, ``fail``, ``unsupported`` (exit 2 naming an op or a
  feature), ``exit 3`` (a bug) or ``skipped`` (the stage does not apply to the row: webgpu on a
  row whose inputs are not an image, tensor-shaped audio or text (``WEBGPU_FEEDS``), verify where
  its input stage failed). A row of the corpus with no cell at all (never run) is ``not run``.
- rate = pass / (rows - skipped - not run): an ``unsupported`` cell is in the denominator even
  where the target refuses the op by design (the ``ai.onnx.ml`` operators of the skl2onnx rows on
  xla, metal and webgpu: a GPU target computes tensors, not maps and trees of branches); such
  cells are listed by name under the table so that the reader sees which misses are design.
- ``--backfill`` gives every cell that lacks ``at`` (cells measured before bench/zoo.py stamped
  them) the commit of the last run in the file's run log that measured that row and stage (the
  run's ``--only`` list and ``--stages``; a run whose ``--only`` was a description and not names
  is skipped), marked ``(run log)``, and writes the .json back.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import zoo  # noqa: E402

DESIGN = {  # (row prefix, stage): why the target refuses it by design
    ("skl-", "xla"): "ai.onnx.ml (maps, trees) on a tensor compiler",
    ("skl-", "metal"): "ai.onnx.ml on a GPU target",
    ("skl-", "webgpu"): "ai.onnx.ml on a GPU target",
    ("skl-", "webgpu16"): "ai.onnx.ml on a GPU target",
}


def _arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def _date(commit: str) -> str:
    end = commit.split("..")[-1].split()[0]
    r = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%cs", end], capture_output=True, text=True
    )
    return r.stdout.strip() or "?"


def backfill(doc: dict) -> int:
    """Stamp the cells without ``at`` from the run log (module docstring); returns how many."""
    known = {r["model"] for r in doc["rows"]}
    at: dict[tuple[str, str], str] = {}
    for run in [doc.get("run", {}), *doc.get("run", {}).get("merged", [])]:
        argv = [str(x) for x in run.get("argv", [])]
        only = _arg(argv, "--only")
        if only is not None:
            rows = only.split(",")
            if not set(rows) <= known:
                continue  # a description, not names
        elif _arg(argv, "--subset") == "webgpu":
            rows = zoo.webgpu_set()
        elif _arg(argv, "--subset") is None:
            rows = sorted(known)
        else:
            continue
        stages = (_arg(argv, "--stages") or ",".join(zoo.STAGES)).split(",") + ["import"]
        commit = str(run.get("commit", "?"))
        stamp = f"{commit}{' dirty' if run.get('dirty') else ''} {_date(commit)} (run log)"
        for r in rows:
            for s in stages:
                at[(r, s)] = stamp
    n = 0
    for r in doc["rows"]:
        for s, c in r["cells"].items():
            if "at" not in c:
                c["at"] = at.get((r["model"], s), "before 246d617 (not in the run log)")
                n += 1
    return n


def table(doc: dict, corpus: list[str]) -> tuple[list[str], list[str]]:
    rows = {r["model"]: r for r in doc["rows"]}
    out = [
        "| stage | pass | fail | unsupported | of which by design | exit 3 | skipped | not run | rate | cells measured at |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    design: list[str] = []
    for s in zoo.STAGES:
        n: collections.Counter[str] = collections.Counter()
        ats: collections.Counter[str] = collections.Counter()
        by_design = 0
        for name in corpus:
            c = rows.get(name, {}).get("cells", {}).get(s)
            if c is None:
                n["not run" if name not in rows else "skip"] += 1
                continue
            n[c["status"]] += 1
            if c["status"] != "skip":
                ats[c.get("at", "?").split(" (")[0].split()[0]] += 1
            why = next((w for (p, st), w in DESIGN.items() if name.startswith(p) and st == s), None)
            if c["status"] == "unsupported" and why:
                by_design += 1
                design.append(f"{name} / {s}: {why}")
        ran = len(corpus) - n["skip"] - n["not run"]
        rate = f"{100.0 * n['pass'] / ran:.1f}%" if ran else "-"
        where = ", ".join(f"{k} x{v}" for k, v in sorted(ats.items(), key=lambda kv: -kv[1]))
        out.append(
            f"| {s} | {n['pass']} | {n['fail']} | {n['unsupported']} | {by_design} | {n['BUG']} | "
            f"{n['skip']} | {n['not run']} | {rate} | {where} |"
        )
    return out, design


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "zoo.json"))
    ap.add_argument("--out", default="")
    ap.add_argument("--backfill", action="store_true")
    a = ap.parse_args(argv)
    path = Path(a.json)
    doc = json.loads(path.read_text())
    if a.backfill:
        print(f"stamped {backfill(doc)} cells from the run log", file=sys.stderr)
        path.write_text(json.dumps(doc, indent=1, default=str))
    corpus = [m.name for m in zoo.CORPUS]
    lines, design = table(doc, corpus)
    text = (
        "\n".join(lines)
        + "\n\nRefused by design (counted as unsupported, in the denominator):\n"
        + "".join(f"- {d}\n" for d in design)
    )
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
