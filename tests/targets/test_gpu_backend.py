"""The metal and webgpu targets share one GPU backend (``targets/gpu``): neither target imports
the other's private names, and the two dialects (MSL, WGSL) never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import mconv.targets

TARGETS = Path(mconv.targets.__file__).resolve().parent


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every ``import`` and ``from ... import`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
    return found


def _offences(folder: str, other: str, dialect: str, other_dialect: str) -> list[str]:
    bad = []
    for path in sorted((TARGETS / folder).rglob("*.py")):
        rel = path.relative_to(TARGETS).as_posix()
        in_dialect = rel.startswith(dialect)
        for module, names in _imports(path):
            if not module.startswith(f"mconv.targets.{other}"):
                continue
            private = [n for n in names if n.startswith("_")] + (
                [module] if any(part.startswith("_") for part in module.split(".")) else []
            )
            if private:
                bad.append(f"{rel}: from {module} import {', '.join(private)}")
            if in_dialect or module.startswith(f"mconv.targets.{other_dialect}"):
                bad.append(f"{rel}: imports {module} (dialects import the GPU backend only)")
    return bad


def test_webgpu_imports_no_private_metal_name_and_wgsl_no_metal():
    assert _offences("webgpu", "metal", "webgpu/wgsl", "metal.msl") == []


def test_metal_imports_no_private_webgpu_name_and_msl_no_webgpu():
    assert _offences("metal", "webgpu", "metal/msl", "webgpu.wgsl") == []


def test_the_gpu_backend_imports_neither_target():
    for path in sorted((TARGETS / "gpu").rglob("*.py")):
        for module, _ in _imports(path):
            assert not module.startswith(("mconv.targets.metal", "mconv.targets.webgpu")), (path, module)


def test_the_check_sees_an_offence(tmp_path, monkeypatch):
    """The walk finds a private import and a dialect-to-dialect import where there is one."""
    (tmp_path / "webgpu" / "wgsl").mkdir(parents=True)
    (tmp_path / "webgpu" / "wgsl" / "x.py").write_text("from mconv.targets.metal.msl.conv import _bias\n")
    monkeypatch.setitem(globals(), "TARGETS", tmp_path)
    found = _offences("webgpu", "metal", "webgpu/wgsl", "metal.msl")
    assert len(found) == 2
