"""Static tools see the package (issue 13 item 7): the editable install is a path, and mypy
checks the package clean with the configuration in pyproject.toml ([tool.mypy])."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _setup_roots() -> dict[str, str]:
    """setup.py's ROOTS mapping, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ROOTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ROOTS mapping")


def test_every_mapped_folder_is_a_link_in_the_src_tree():
    roots = _setup_roots()
    assert (ROOT / "src" / "mconv").is_symlink() and (ROOT / "src" / "mconv").resolve() == ROOT / roots[
        "mconv"
    ]
    for package, folder in roots.items():
        if package == "mconv":
            continue
        link = ROOT / roots["mconv"] / package.split(".", 1)[1]
        assert link.is_symlink() and link.resolve() == ROOT / folder, package
        assert (ROOT / "src" / Path(*package.split(".")) / "__init__.py").is_file(), package


@pytest.fixture(scope="module")
def editable_here():
    import mconv

    if not Path(mconv.__file__).resolve().is_relative_to(ROOT):
        pytest.skip("mconv is not installed from this checkout (pip install -e .)")
    pytest.importorskip("mypy")


def test_the_editable_install_is_a_path_entry_not_an_import_hook(editable_here):
    import mconv
    import mconv.passes

    assert str(ROOT / "src") in sys.path  # the .pth line static tools read
    assert Path(mconv.__file__) == ROOT / "src" / "mconv" / "__init__.py"
    assert Path(mconv.passes.__file__) == ROOT / "src" / "mconv" / "passes" / "__init__.py"
    hooks = [f for f in sys.meta_path if getattr(f, "__module__", "").startswith("__editable__")]
    assert not hooks, hooks


def _mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # the timeout is a generous bound against a hang, not a speed assertion (a cold run takes
    # about half a minute on two cores; later runs reuse build/mypy_cache)
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_mypy_resolves_mconv_modules_outside_the_checkout(editable_here, tmp_path):
    # An empty configuration, run elsewhere: only the installed .pth line can tell mypy where
    # mconv is (imports are found, not analysed: follow_imports=skip).
    (tmp_path / "mypy.ini").write_text("[mypy]\n")

    def probe(module: str) -> subprocess.CompletedProcess:
        code = f"import {module}\n"
        return _mypy("--config-file", "mypy.ini", "--follow-imports=skip", "-c", code, cwd=tmp_path)

    for module in ("mconv", "mconv.passes", "mconv.cli.app", "mconv.codecs.choose", "mconv.targets.cpu"):
        r = probe(module)
        assert r.returncode == 0 and "Success" in r.stdout, (module, r.stdout, r.stderr)
    r = probe("mconv.no_such_module")  # the control: a module that is not there is reported
    assert r.returncode == 1 and "Cannot find implementation" in r.stdout, r.stdout


def test_the_package_type_checks_clean(editable_here):
    r = _mypy()  # [tool.mypy]: packages = ["mconv"], found through the install like any import
    assert r.returncode == 0, (r.stdout[-8000:], r.stderr[-2000:])
    assert "Success: no issues found" in r.stdout, r.stdout[-2000:]


def test_no_module_is_exempt_from_the_check():
    # issue 13 item 7: the whole package is clean; the "not clean yet" list is gone for good
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    exempt = [o["module"] for o in config.get("overrides", []) if o.get("ignore_errors")]
    assert not exempt, exempt
    assert not config.get("ignore_errors")
