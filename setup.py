"""Maps the top-level folders onto one installed namespace, ``mconv``.

The design card fixes the layout (cli/, passes/, formats/, targets/, fixtures/ at the top level,
the small core in core/), so setuptools' package-dir mapping installs each folder under
``mconv``; subpackages are discovered by walking each folder for ``__init__.py``.
"""

import os

from setuptools import setup

ROOTS = {
    "mconv": "core",
    "mconv.cli": "cli",
    "mconv.passes": "passes",
    "mconv.formats": "formats",
    "mconv.targets": "targets",
    "mconv.fixtures": "fixtures",
}


def _packages() -> list[str]:
    found = []
    for package, folder in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, folder)
                found.append(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    return found


setup(packages=_packages(), package_dir=ROOTS)
