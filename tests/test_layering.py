"""The layering: every folder imports only the folders below it.

    core (+ core/edit) <- engines <- passes <- formats <- targets <- drivers <- fixtures <- report
    <- api <- cli

core/ (the package root ``mconv``) holds the symbolic links of the src layout (``core/cli ->
../cli`` ...), so the walk skips links: they are the other layers, not core modules
(``core/__main__.py`` too: a link to ``cli/__main__.py``, the command line's entry point in the
command line's layer). Each import is checked at module level and inside functions. Declared
exceptions, each with its reason, are listed in ``EXCEPTIONS``.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"

ORDER = ("core", "engines", "passes", "formats", "targets", "drivers", "fixtures", "report", "api", "cli")
ABOVE_CORE = ORDER[1:]
# (file relative to its layer's folder, imported module) -> why it is allowed
EXCEPTIONS = {
    ("__init__.py", "mconv.api"): "the package root forwards the API names lazily (PEP 562)",
}
# folder -> {(file, module): why}: imports that go up or sideways on purpose
FOLDER_EXCEPTIONS: dict[str, dict[tuple[str, str], str]] = {
    "cli": {
        ("export.py", "mconv.targets.names"): "building the commands reads each target's light "
        "options.py registry, so that `mconv --help` imports no onnx_ir (tests/test_startup.py)",
        ("export.py", "mconv.targets.options_class"): "the same registry: the target's option fields",
        ("export.py", "mconv.targets.base"): "the same registry: flags and their help from the fields",
        ("export.py", "mconv.targets"): "the package of that registry",
    },
}


def _package_of(folder: Path, path: Path, package: str) -> list[str]:
    rel = path.relative_to(folder)
    parts = [package, *rel.parts[:-1]]
    return parts  # the package a module in ``rel`` belongs to (its own, for an __init__.py)


def imported_modules(path: Path, folder: Path, package: str = "mconv") -> list[tuple[int, str]]:
    """Every module ``path`` imports (line, dotted name), anywhere in the file: module level,
    functions, ``from mconv import X`` (as ``mconv.X``), relative imports resolved against the
    file's package, and ``importlib.import_module("...")`` with a constant name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    pkg = _package_of(folder, path, package)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            found.extend((node.lineno, f"{mod}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                arg = node.args[0].value
                if isinstance(arg, str):
                    found.append((node.lineno, arg))
    return found


def modules_of(folder: Path) -> list[Path]:
    """The .py files of a layer's folder, links (files or folders) skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(
            d for d in dirnames if not (Path(dirpath) / d).is_symlink() and d != "__pycache__"
        )
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if f.endswith(".py") and not p.is_symlink():
                out.append(p)
    return out


def violations(
    folder: Path, forbidden: tuple[str, ...], package: str = "mconv", exceptions=None
) -> list[str]:
    exceptions = EXCEPTIONS if exceptions is None else exceptions
    bad = []
    for path in modules_of(folder):
        rel = path.relative_to(folder).as_posix()
        for line, mod in imported_modules(path, folder, package):
            parts = mod.split(".")
            if parts[0] != "mconv" or len(parts) < 2 or parts[1] not in forbidden:
                continue
            if any(rel == f and (mod == m or mod.startswith(m + ".")) for f, m in exceptions):
                continue
            bad.append(f"{rel}:{line} imports {mod}")
    return sorted(set(bad))


def test_core_imports_nothing_above_it():
    assert modules_of(CORE), "no core modules found"
    # python -m mconv: the command line's entry point is the command line's file, linked
    assert (CORE / "__main__.py").is_symlink()
    assert (CORE / "__main__.py").resolve() == ROOT / "cli" / "__main__.py"
    assert violations(CORE, ABOVE_CORE) == []


def test_the_walk_finds_every_kind_of_upward_import_and_skips_links(tmp_path):
    core = tmp_path / "core"
    (core / "sub").mkdir(parents=True)
    (core / "__init__.py").write_text("import importlib\nimportlib.import_module('mconv.api')\n")
    (core / "top.py").write_text("import mconv.passes.fold\n")
    (core / "lazy.py").write_text("def f():\n    from mconv.targets.cpu import load\n    return load\n")
    (core / "root.py").write_text("from mconv import formats\nfrom mconv import errors\n")
    (core / "sub" / "__init__.py").write_text("")
    (core / "sub" / "rel.py").write_text("from ..cli import app\nfrom . import sibling\n")
    (core / "dyn.py").write_text("import importlib\nm = importlib.import_module('mconv.fixtures.light')\n")
    (core / "fine.py").write_text("import numpy\nfrom mconv.errors import InputError\nimport mconv.codecs\n")
    elsewhere = tmp_path / "targets"
    elsewhere.mkdir()
    (elsewhere / "t.py").write_text("from mconv.api import load\n")
    os.symlink(elsewhere, core / "targets")  # a link into another layer: not walked
    os.symlink(elsewhere / "t.py", core / "linked.py")
    found = violations(core, ABOVE_CORE, exceptions={})
    assert found == [
        "__init__.py:2 imports mconv.api",
        "dyn.py:2 imports mconv.fixtures.light",
        "lazy.py:2 imports mconv.targets.cpu",
        "lazy.py:2 imports mconv.targets.cpu.load",
        "root.py:1 imports mconv.formats",
        "sub/rel.py:1 imports mconv.cli",
        "sub/rel.py:1 imports mconv.cli.app",
        "top.py:1 imports mconv.passes.fold",
    ]
    # the declared exception covers the forward and nothing else
    assert violations(core, ABOVE_CORE, exceptions={("__init__.py", "mconv.api"): "forward"}) == found[1:]


def test_core_docstring_lists_every_core_module():
    import mconv

    doc = mconv.__doc__ or ""
    names = set()
    for path in CORE.iterdir():
        if path.is_symlink() or path.name.startswith((".", "_")):
            continue
        if path.suffix == ".py":
            names.add(path.stem)
        elif path.is_dir() and (path / "__init__.py").is_file():
            names.add(path.name)
    assert names, "no core modules found"
    missing = sorted(n for n in names if f":mod:`mconv.{n}`" not in doc)
    assert missing == [], f"core/__init__.py's docstring does not list {missing}"


def test_every_folder_imports_only_the_folders_below_it():
    assert sorted(ORDER) == sorted(
        p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
    ), "a package folder is missing from ORDER (or ORDER names one that is gone)"
    for rank, folder in enumerate(ORDER):
        if folder == "core":
            continue
        above = tuple(f for f in ORDER[rank + 1 :]) + ("core_links",)
        # sideways counts as up: a folder sees only the ones before it in ORDER
        found = violations(
            ROOT / folder, above, f"mconv.{folder}", exceptions=FOLDER_EXCEPTIONS.get(folder, {})
        )
        assert found == [], f"{folder}/ imports a layer above it: {found}"


def test_the_order_is_strict_for_each_pair():
    # each pair of folders: the lower one never imports the higher one (this is what ORDER means)
    for rank, folder in enumerate(ORDER):
        for higher in ORDER[rank + 1 :]:
            if folder == "core":
                continue
            found = violations(
                ROOT / folder,
                (higher,),
                f"mconv.{folder}",
                exceptions=FOLDER_EXCEPTIONS.get(folder, {}),
            )
            assert found == [], (folder, higher, found)


def test_the_declared_exceptions_are_still_used():
    for folder, declared in FOLDER_EXCEPTIONS.items():
        for file, module in declared:
            mods = {m for _, m in imported_modules(ROOT / folder / file, ROOT / folder, f"mconv.{folder}")}
            assert module in mods, f"{folder}/{file} no longer imports {module}: drop the exception"


def test_the_command_line_imports_only_the_api_and_core():
    # the CLI is a face on the API: every command is one api call (export's flags excepted)
    beside = tuple(f for f in ORDER if f not in ("core", "api", "cli"))
    found = violations(ROOT / "cli", beside, "mconv.cli", exceptions=FOLDER_EXCEPTIONS["cli"])
    assert found == [], found
