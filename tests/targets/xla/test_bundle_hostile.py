"""A received xla bundle is data: its program is checked before anything of it is deserialized
for a call. A custom call mconv's exporter does not write is refused by name, damaged bytes and
impossible shapes are one line with exit 2, never a crash or a traceback."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.export import _export
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from mconv.cli.app import app
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "fixtures" / "digits_mlp.onnx"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("xla") / "b"
    res = CliRunner().invoke(app, ["export", str(DIGITS), "--target", "xla", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    return out


def _copy(bundle: Path, dest: Path) -> Path:
    shutil.copytree(bundle, dest)
    return dest


def _rehash(b: Path, edit_manifest=None) -> None:
    """Fix the manifest's sizes and sha256s, as whoever edits a bundle does."""
    m = json.loads((b / "manifest.json").read_text())
    if edit_manifest is not None:
        edit_manifest(m)
    for rel in m["files"]:
        data = (b / rel).read_bytes()
        m["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (b / "manifest.json").write_text(json.dumps(m))


def _mconv(*args: str) -> subprocess.CompletedProcess:
    """A real process: a crash shows as a signal, C++ output on fd 2 as stderr text."""
    return subprocess.run([sys.executable, "-m", "mconv", *args], capture_output=True, text=True, timeout=300)


def _one_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def _hostile_program(b: Path, target: str) -> None:
    """Replace the program by one (batch 4, cpu) whose ``sine`` became a custom call to
    ``target`` with an out-of-range callback index, and fix xla.json and the manifest."""
    conv = json.loads((b / "xla.json").read_text())

    def f(x, *w):
        return (jnp.sin(x[:, :10]) + sum(jnp.sum(a) for a in w) * 0,)

    specs = [jax.ShapeDtypeStruct((4, 64), jnp.float32)]
    for a in conv["weight_args"]:
        shape = a["shape"] if a.get("layout") is None else [a["shape"][p] for p in a["layout"]]
        specs.append(jax.ShapeDtypeStruct(tuple(shape), jnp.float32))
    exp = jax.export.export(jax.jit(f), platforms=["cpu"])(*specs)
    text, n = re.subn(
        r"stablehlo\.sine (%\d+) : tensor<4x10xf32>",
        lambda m: (
            f"stablehlo.custom_call @{target}({m.group(1)}) {{api_version = 4 : i32, "
            "backend_config = {index = 123456789 : ui64}, has_side_effect = true} : "
            "(tensor<4x10xf32>) -> tensor<4x10xf32>"
        ),
        exp.mlir_module(),
    )
    assert n == 1
    with mlir.make_ir_context():
        module_bytes = _export._module_to_bytecode(ir.Module.parse(text))
    exp = dataclasses.replace(exp, mlir_module_serialized=module_bytes)
    (b / "model.jax_export").write_bytes(exp.serialize())
    conv["inputs"][0]["shape"] = [4, 64]
    conv["output_specs"][0]["shape"] = [4, 10]
    conv["platforms"] = ["cpu"]
    (b / "xla.json").write_text(json.dumps(conv))

    def edit(m):
        m["inputs"][0]["shape"] = [4, 64]
        m["outputs"][0]["shape"] = [4, 10]

    _rehash(b, edit)


@pytest.mark.parametrize("target", ["xla_ffi_python_cpu_callback", "mconv_no_such_target"])
def test_custom_call_mconv_does_not_write_is_refused_by_name(bundle, tmp_path, target):
    b = _copy(bundle, tmp_path / "b")
    _hostile_program(b, target)
    before = (b / "model.jax_export").read_bytes()
    for args in (["run", str(b), "-q"], ["verify", str(DIGITS), str(b), "-q"]):
        res = _mconv(*args)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        line = _one_error(res.stderr)
        assert f"custom call '{target}'" in line and "model.jax_export" in line
    assert (b / "model.jax_export").read_bytes() == before


def test_the_exporters_own_bundle_passes_the_check(bundle):
    res = _mconv("run", str(bundle), "-q")
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_bit_flips_in_the_program_are_exit_0_or_one_line_exit_2(bundle, tmp_path):
    orig = (bundle / "model.jax_export").read_bytes()
    rng = np.random.default_rng(41)
    for case in range(8):
        b = _copy(bundle, tmp_path / f"b{case}")
        data = bytearray(orig)
        # spread over the file: header, avals and the module's bytecode
        lo, hi = case * len(data) // 8, (case + 1) * len(data) // 8
        for _ in range(2):
            data[int(rng.integers(lo, hi))] ^= 1 << int(rng.integers(8))
        (b / "model.jax_export").write_bytes(bytes(data))
        _rehash(b)
        res = _mconv("run", str(b), "-q")
        assert res.returncode in (0, 2), (case, res.returncode, res.stderr)
        if res.returncode == 2:
            assert "model.jax_export" in _one_error(res.stderr)
        else:
            assert res.stderr == "", (case, res.stderr)


def test_a_module_that_crashes_the_mlir_reader_is_one_line(bundle, tmp_path):
    """Bit 3 of byte 1634 and bit 2 of byte 3631 of this (deterministic) program each made MLIR's
    bytecode reader crash the process: the module is read in a child first."""
    orig = (bundle / "model.jax_export").read_bytes()
    found = 0
    for offset, bit in ((1634, 3), (3631, 2)):
        b = _copy(bundle, tmp_path / f"c{offset}")
        data = bytearray(orig)
        data[offset] ^= 1 << bit
        (b / "model.jax_export").write_bytes(bytes(data))
        _rehash(b)
        res = _mconv("run", str(b), "-q")
        assert res.returncode in (0, 2), (offset, res.returncode, res.stderr)
        if res.returncode == 2:
            _one_error(res.stderr)
            found += 1
    assert found, "neither flip is refused: the program's layout changed, pick new offsets"


@pytest.mark.parametrize("where", ["xla.json", "manifest.json"])
def test_a_2_to_the_40_input_shape_is_one_line_exit_2(bundle, tmp_path, where):
    b = _copy(bundle, tmp_path / "b")
    if where == "xla.json":
        conv = json.loads((b / "xla.json").read_text())
        conv["inputs"][0]["shape"] = [2**40, 64]
        (b / "xla.json").write_text(json.dumps(conv))
        _rehash(b)
    else:
        _rehash(b, lambda m: m["inputs"][0].update(shape=[2**40, 64]))
    for args in (["run", str(b), "-q"], ["verify", str(DIGITS), str(b), "-q"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        line = _one_error(res.stderr)
        assert "inputs" in line, line
