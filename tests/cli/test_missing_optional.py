"""A command that needs an optional package this installation lacks: one line, exit 2, the
package and the extra to install named; any other missing module stays an internal error."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
from mconv.cli.app import app
from typer.testing import CliRunner


def _hide(monkeypatch, *names: str) -> None:
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.split(".")[0] in names:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


@pytest.fixture
def tflite_file(tmp_path, shared) -> Path:
    return shared / "models" / "tflite" / "hello_world_float.tflite"


def test_import_tflite_without_the_tflite_package(monkeypatch, tmp_path, tflite_file):
    _hide(monkeypatch, "tflite")
    r = CliRunner().invoke(app, ["import", str(tflite_file), "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines == ["error: this needs the optional package 'tflite', which is not installed "
                     "(hint: pip install 'mconv[tflite]')"], r.output  # fmt: skip
    assert not (tmp_path / "m.onnx").exists()


def test_another_missing_module_is_still_internal(monkeypatch, tmp_path, tflite_file):
    _hide(monkeypatch, "tflite")
    from mconv import errors

    monkeypatch.setattr(errors, "OPTIONAL_MODULES", {})
    r = CliRunner().invoke(app, ["import", str(tflite_file), "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 3, r.output
    assert "internal error: ModuleNotFoundError" in r.output
