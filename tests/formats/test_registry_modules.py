"""formats/__init__.py refuses a listed module that does not exist (issue 13 item 8)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import mconv.formats
import pytest


def test_every_listed_format_module_exists_and_registers():
    mconv.formats.check_modules("mconv.formats", mconv.formats._MODULES)  # no error
    assert len(mconv.formats.registry()) == len(mconv.formats._MODULES)


def test_a_missing_module_is_an_import_error_naming_it():
    with pytest.raises(ImportError, match="tf_checkpiont") as info:
        mconv.formats.check_modules("mconv.formats", ("onnx_format", "tf_checkpiont"))
    assert "onnx_format," not in str(info.value) and info.value.name == "mconv.formats.tf_checkpiont"


def test_importing_a_registry_that_lists_a_typo_fails_at_import_time(tmp_path, monkeypatch):
    # A copy of formats/__init__.py as package 'fmtcopy', listing one real module and one typo.
    source = Path(mconv.formats.__file__).read_text()
    listed = re.search(r"_MODULES = \(\n(.*?)\n\)", source, re.S)
    assert listed, "formats/__init__.py no longer has a _MODULES tuple"
    package = tmp_path / "fmtcopy"
    package.mkdir()
    copy = source.replace(listed.group(0), '_MODULES = (\n    "onnx_format",\n    "onnx_formt",\n)')
    (package / "__init__.py").write_text(copy)
    (package / "onnx_format.py").write_text("FORMAT = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fmtcopy", raising=False)
    with pytest.raises(ImportError, match=r"do not exist: onnx_formt$"):
        importlib.import_module("fmtcopy")
    assert "fmtcopy" not in sys.modules
