"""Every ``keras.applications`` model through ``mconv import``, against Keras: a table of results.

Usage:
    python3 bench/keras_apps.py [--only NAME[,NAME]] [--timeout 1800] [--saves .keras,.h5]
                                [--out bench/results/keras_apps.md]

Each application (``APPS`` in ``tests/formats/test_keras_applications.py``, checked there against
what ``keras.applications`` exports, plus ``VARIANTS``: constructor settings that bring other
layers) is built with ``weights=None`` at its smallest input, saved as ``.keras`` and ``.h5``,
imported by ``mconv import``, run by ONNX Runtime on scikit-image's astronaut through the
application's ``preprocess_input`` and compared with ``model.predict``: cosine >= 0.9999 and max
abs error <= 1e-4 of the output's scale (the test's own ``check``). Each application runs in its
own child process (memory of the large ones, a crash or a timeout stays one row). The table
gives seconds per stage; the same rows as JSON beside ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = ROOT / "tests" / "formats" / "test_keras_applications.py"


def _test_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mconv_test_keras_applications", TEST)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _one(name: str, saves: tuple[str, ...]) -> dict:
    """Run one application (or variant) in this process; the row as a dict."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    t = _test_module()
    if name in t.VARIANTS:
        base, app = t.VARIANTS[name]
    else:
        base, app = name, t.APPS[name]
    with tempfile.TemporaryDirectory(prefix="keras_apps_") as d:
        r = t.check(base, app, Path(d), saves=saves)
    return {
        "name": name,
        "family": t.family(base),
        "params": r.params,
        "side": r.side,
        "seconds": r.seconds,
        "cosine": r.cosine,
        "rel": r.rel,
        "status": "pass" if r.ok else "mismatch",
    }


def _child(name: str, saves: tuple[str, ...], timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--saves", ",".join(saves)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"name": name, "status": f"timeout after {timeout:.0f} s", "wall": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            row = json.loads(line)
            row["wall"] = wall
            return row
    err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return {"name": name, "status": f"fail: {err[:200]}", "wall": wall}


def _table(rows: list[dict], saves: tuple[str, ...]) -> str:
    head = ["application", "family", "params", "input", "build s", "keras s"]
    for e in saves:
        head += [f"import{e} s", f"cosine{e}", f"rel err{e}"]
    head += ["wall s", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s = r.get("seconds", {})
        cells = [
            r["name"],
            r.get("family", ""),
            f"{r['params'] / 1e6:.1f}M" if "params" in r else "",
            f"{r['side']}x{r['side']}" if "side" in r else "",
            f"{s['build']:.1f}" if "build" in s else "",
            f"{s['keras']:.1f}" if "keras" in s else "",
        ]
        for e in saves:
            cells += [
                f"{s[f'import{e}']:.1f}" if f"import{e}" in s else "",
                f"{r['cosine'][e]:.7f}" if e in r.get("cosine", {}) else "",
                f"{r['rel'][e]:.1e}" if e in r.get("rel", {}) else "",
            ]
        cells += [f"{r['wall']:.0f}", r["status"]]
        lines.append("| " + " | ".join(cells) + " |")
    n_pass = sum(r["status"] == "pass" for r in rows)
    total = sum(r["wall"] for r in rows)
    lines.append("")
    lines.append(f"{n_pass}/{len(rows)} pass; {total:.0f} s in all.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated names (applications or variants)")
    ap.add_argument("--saves", default=".keras,.h5")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per application")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "keras_apps.md")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    saves = tuple(s for s in args.saves.split(",") if s)
    if args.one:
        print(json.dumps(_one(args.one, saves)), flush=True)
        return 0
    os.environ.setdefault("KERAS_BACKEND", "jax")
    t = _test_module()
    found = t.enumerate_apps()
    missing = sorted(set(found) - set(t.APPS))
    if missing:
        print(f"keras.applications has constructors APPS does not list: {missing}", file=sys.stderr)
    names = [n for n in args.only.split(",") if n] or [*t.APPS, *sorted(t.VARIANTS)]
    rows = []
    for n in names:
        row = _child(n, saves, args.timeout)
        rows.append(row)
        print(f"{n}: {row['status']} ({row['wall']:.0f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(_table(rows, saves))
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["status"] == "pass" for r in rows) and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
