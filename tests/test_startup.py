"""Start-up: onnx_ir imports sympy at module level; mconv defers it to its first use
(``mconv._defer_sympy``), and code that does use sympy still gets all of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
from mconv import api
model = api.load(sys.argv[1])
api.optimize(model, passes="fold,dce,cluster(bits=4)", output=sys.argv[2] + "/m.onnx")
api.export(sys.argv[2] + "/m.onnx", "cpu", sys.argv[2] + "/bundle")
api.verify(sys.argv[1], sys.argv[2] + "/bundle")
print(type(sys.modules["sympy"]).__name__, type(sys.modules["onnx_ir._symbolic_shapes"]).__name__)
import onnx_ir as ir
print(ir.SymbolicDim("N") * 2 + 1)
import sympy
print(sympy.Max(sympy.Symbol("a"), 3), type(sys.modules["sympy"]).__name__)
"""


def test_a_load_optimize_export_verify_never_loads_sympy_and_sympy_still_works(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT / "fixtures" / "digits_mlp.onnx"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert lines[0] == "_Deferred _Deferred"  # not loaded by anything the commands did
    assert lines[1] == "2*N + 1"  # onnx_ir's symbolic arithmetic loads the real modules
    assert lines[2] == "Max(3, a) module"


def test_sympy_imported_first_is_left_alone():
    code = "import sympy, mconv.api, sys; print(type(sys.modules['sympy']).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "module", out.stderr[-2000:]
