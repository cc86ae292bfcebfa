"""mconv: import, optimize, verify and export neural network models.

The package root (``core/``) is the base layer: it imports nothing above it (no engines, passes,
formats, targets, drivers, fixtures, api or cli; ``tests/test_layering.py`` walks every import).
Its modules:

- :mod:`mconv.errors`     the error types and their exit codes;
- :mod:`mconv.fileio`     atomic writes and bounded reads;
- :mod:`mconv.npzio`      bounded ``.npz`` / ``.npy`` reading;
- :mod:`mconv.wire`       the protobuf wire format read and written by hand;
- :mod:`mconv.onnx_check` the load-time ONNX check (structure, sizes, external data);
- :mod:`mconv.irio`       loading/saving ``.onnx`` as ``onnx_ir.Model`` plus model statistics;
- :mod:`mconv.onnx_rules` ONNX attribute defaults and opset rules, stated once for every engine;
- :mod:`mconv.ir_maptypes` map types (ONNX-ML's ``map(K, V)``) for ``onnx_ir``, which has none;
- :mod:`mconv.metrics`    comparison metrics, gates and feeds;
- :mod:`mconv.quantmath`  integer quantization arithmetic (symmetric, affine, KL calibration);
- :mod:`mconv.sorting`    a float16 sort that is exact on every CPU (numpy's misorders on some);
- :mod:`mconv.codecs`     the weight codecs (raw, fp16, palette, sparse, huffman, the choice);
- :mod:`mconv.container`  the ``weights.mcw`` weight container;
- :mod:`mconv.bundle`     the deployable bundle (manifest + weights container + payload);
- :mod:`mconv.account`    the per-layer byte account of a bundle (and of an export, predicted);
- :mod:`mconv.datasets`   small real data sets in the shapes models expect;
- :mod:`mconv.edit`       IR editing helpers (names and initializers, weight references, output
  channels, input shapes, shape inference on models of any size).

``core/__main__.py`` (``python -m mconv``) is a link to ``cli/__main__.py``: the command line's
entry point belongs to the command line's layer.

The layers above, each importing only those before it: :mod:`mconv.engines` (the reference and
XLA engines that run and differentiate a model), :mod:`mconv.passes` (IR -> IR),
:mod:`mconv.formats` (files -> IR), :mod:`mconv.targets` (IR -> bundles and runners),
:mod:`mconv.drivers` (the budget search, sensitivity analysis, parallel trials, weight
streaming), :mod:`mconv.fixtures`, :mod:`mconv.api` (the Python API) and :mod:`mconv.cli` (the
command line).

One declared exception to the layering: the lazy forward below of the API names
(``mconv.load`` is ``mconv.api.load``, imported on first use, so importing a core module loads
nothing above it).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

__version__ = "0.1.0"

# The public API (mconv.api), reached from the package root: ``mconv.load(...)``. Forwarded
# lazily, so that ``import mconv.errors`` (or any core module) loads no format, pass or target.
_API = (
    "load",
    "save",
    "convert",
    "optimize",
    "export",
    "open",
    "run",
    "verify",
    "inspect",
    "analyze",
    "open_model",
    "ConvertResult",
    "OptimizeResult",
    "ExportResult",
    "RunResult",
    "VerifyResult",
    "InspectResult",
    "AnalyzeResult",
)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module("mconv.api"), name)
    raise AttributeError(f"module 'mconv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


class _Deferred(types.ModuleType):
    """A module's stand-in in ``sys.modules`` until an attribute of it is first read."""

    def __getattr__(self, attr: str):
        if not self.__dict__.get("_mconv_ready"):  # the import system probing the new stand-in
            raise AttributeError(attr)
        spec = self.__spec__
        assert spec is not None  # made by _DeferFinder
        name = spec.name
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)  # the real module, now in sys.modules
        self.__dict__.update(real.__dict__)  # so that names bound to the stand-in work too
        return getattr(real, attr)


class _DeferLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Deferred(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["_mconv_ready"] = True  # from now on, a missing name loads the real module


class _DeferFinder(importlib.abc.MetaPathFinder):
    """Gives the first import of each of ``names`` a :class:`_Deferred` stand-in; the stand-in's
    first attribute read imports the real module past this finder (the name is spent)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.names:
            return None
        self.names.discard(name)
        return importlib.util.spec_from_loader(name, _DeferLoader())


def _defer_sympy() -> None:
    """Load sympy on first use instead of at ``import onnx_ir``.

    onnx_ir imports sympy at module level (about 0.8 s of every command on a 2-core machine)
    for arithmetic on symbolic dimensions (``SymbolicDim('N') + 1``), which mconv never asks of
    it. A finder first on ``sys.meta_path`` gives the first import of ``sympy`` and of
    ``onnx_ir._symbolic_shapes`` (which reads sympy's names at import) a stand-in
    (:class:`_Deferred`); the first attribute read of a stand-in imports the real module, so any
    code that uses sympy (onnx_ir's symbolic arithmetic, torch) gets all of it, and nothing is
    in ``sys.modules`` before something imports them. (The standard library's LazyLoader does
    not do here: the import statement reads ``__spec__``, which loads a LazyLoader module at
    once.) ``MCONV_EAGER_SYMPY=1`` turns it off."""
    if "sympy" in sys.modules or "onnx_ir" in sys.modules or os.environ.get("MCONV_EAGER_SYMPY"):
        return
    if any(isinstance(f, _DeferFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _DeferFinder({"sympy", "onnx_ir._symbolic_shapes"}))


_defer_sympy()
