"""Maps the top-level folders onto one installed namespace, ``mconv``, as a plain directory tree.

The design card fixes the layout (cli/, passes/, formats/, targets/, fixtures/ at the top level,
the small core in core/). ``ROOTS`` maps each folder onto the ``mconv`` namespace, and the tree
is made of symbolic links, committed with the code: ``src/mconv -> ../core`` and, for every
other folder, ``core/<name> -> ../<name>``. So ``src/mconv`` is the whole package as ordinary
directories (a src layout), and an editable install (``pip install -e .``) is one ``.pth`` line
naming ``src/``, which Python, mypy, pyright and IDEs all read; setuptools' import-hook finder,
which static tools cannot follow, is not used. New files appear without reinstalling.

A new folder is one line in ``ROOTS``; this script makes its link when it is missing (commit
it), and refuses a path in the way that is not that link. Subpackages are found by walking
``src/`` through the links.
"""

import os

from setuptools import find_packages, setup

ROOTS = {
    "mconv": "core",
    "mconv.cli": "cli",
    "mconv.engines": "engines",
    "mconv.drivers": "drivers",
    "mconv.passes": "passes",
    "mconv.formats": "formats",
    "mconv.targets": "targets",
    "mconv.fixtures": "fixtures",
    "mconv.api": "api",
    "mconv.report": "report",
}
HERE = os.path.dirname(os.path.abspath(__file__))


def _link(path: str, target: str) -> None:
    """``path`` is a symbolic link to ``target`` (relative): made when missing, else checked."""
    full = os.path.join(HERE, path)
    if os.path.islink(full) and os.readlink(full) == target:
        return
    if os.path.lexists(full):
        raise SystemExit(f"setup.py: {path} should be a symbolic link to {target}; move it away")
    os.makedirs(os.path.dirname(full), exist_ok=True)
    os.symlink(target, full)


def _links() -> None:
    _link(os.path.join("src", "mconv"), os.path.join("..", ROOTS["mconv"]))
    for package, folder in ROOTS.items():
        if package != "mconv":
            sub = package.split(".", 1)[1]
            assert "." not in sub, f"{package}: ROOTS maps top-level subpackages of mconv only"
            _link(os.path.join(ROOTS["mconv"], sub), os.path.join("..", folder))


_links()
setup(packages=find_packages(os.path.join(HERE, "src")), package_dir={"": "src"})
