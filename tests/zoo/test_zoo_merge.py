"""bench/zoo.py's ``--merge`` of a rerun into earlier results: a rerun with ``--stages`` replaces
only the cells of the stages it ran (and import, always run) and keeps the row's other cells with
the commit each was measured at; a rerun whose import now fails replaces the row whole; a row that
could not be prepared leaves the old row standing. Checked on a real merge through the CLI entry
(``--merge-partial``) into a results file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_zoo():
    spec = importlib.util.spec_from_file_location("mconv_bench_zoo_merge", ROOT / "bench" / "zoo.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


zoo = _load_zoo()


def _cell(status: str, at: str | None = None) -> dict:
    c = {"status": status, "line": "", "rc": 0 if status == "pass" else 2, "seconds": 1.0}
    if at:
        c["at"] = at
    return c


def _row(name: str, cells: dict) -> dict:
    return {"model": name, "fmt": "onnx", "origin": "test", "cells": cells}


def test_merge_with_stages_keeps_the_other_cells(tmp_path):
    old_rows = [
        _row(
            "a",
            {s: _cell("pass", "old1 2026-12-01") for s in zoo.STAGES}
            | {"metal": _cell("unsupported", "old1")},
        ),
        _row("b", {s: _cell("pass", "old1 2026-12-01") for s in zoo.STAGES}),
        _row("c", {s: _cell("pass", "old1 2026-12-01") for s in zoo.STAGES}),
    ]
    out = tmp_path / "zoo.md"
    zoo.write_results(out, old_rows, zoo.STAGES, {"argv": ["--jobs", "1"], "commit": "old1"})
    rerun = {
        "stages": ["import", "metal", "webgpu"],
        "rows": [
            _row("a", {"import": _cell("pass"), "metal": _cell("pass"), "webgpu": _cell("pass")}),
            _row("b", {"import": _cell("fail")}),  # import fails now: the row is replaced whole
            {**_row("c", {}), "error": "RuntimeError('no venv')"},  # not prepared: the old row stands
        ],
        "run": {"argv": ["--stages", "import,metal,webgpu", "--merge"], "commit": "new2", "dirty": False},
    }
    part = tmp_path / "rerun.json"
    part.write_text(json.dumps(rerun))
    assert zoo.main(["--merge-partial", str(part), "--out", str(out)]) == 0
    rows = {r["model"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    a = rows["a"]["cells"]
    assert set(a) == set(zoo.STAGES)  # nothing blanked
    assert a["metal"]["status"] == "pass" and a["metal"]["at"].startswith("new2 ")
    assert a["import"]["at"].startswith("new2 ") and a["webgpu"]["at"].startswith("new2 ")
    assert a["ref"]["at"] == "old1 2026-12-01" and a["xla"]["status"] == "pass"
    assert set(rows["b"]["cells"]) == {"import"} and rows["b"]["cells"]["import"]["status"] == "fail"
    assert rows["c"]["cells"]["ref"]["at"] == "old1 2026-12-01" and "error" not in rows["c"]
    assert "| a |" in out.read_text()
