"""Byte-compile the mconv package before whole commands are timed.

A user's ``pip install`` compiles every module to ``__pycache__``; a bench that times ``mconv
...`` against a peer installed from a wheel (whose modules pip compiled) must do the same, or
mconv's side pays for compiling its ~150 modules from source on every command where
``PYTHONDONTWRITEBYTECODE`` is set (this machine: about 0.4 s a command)."""

from __future__ import annotations

import compileall
from pathlib import Path


def compile_mconv() -> Path:
    """Compile the installed mconv package in place (``__pycache__``, ignored by git)."""
    import mconv

    root = Path(mconv.__file__).parent
    compileall.compile_dir(str(root), quiet=1, workers=1)
    for sub in root.iterdir():  # compile_dir skips linked folders: the layers above core are links
        if sub.is_symlink() and sub.is_dir():
            compileall.compile_dir(str(sub), quiet=1, workers=1)
    return root
