"""mconv: import, optimize, verify and export neural network models.

The package root (``core/``) is the base layer: it imports nothing above it (no formats, passes,
targets, fixtures, api or cli; ``tests/test_layering.py`` walks every import). Its modules:

- :mod:`mconv.errors`     the error types and their exit codes;
- :mod:`mconv.fileio`     atomic writes and bounded reads;
- :mod:`mconv.npzio`      bounded ``.npz`` / ``.npy`` reading;
- :mod:`mconv.wire`       the protobuf wire format read and written by hand;
- :mod:`mconv.onnx_check` the load-time ONNX check (structure, sizes, external data);
- :mod:`mconv.irio`       loading/saving ``.onnx`` as ``onnx_ir.Model`` plus model statistics;
- :mod:`mconv.metrics`    comparison metrics, gates and feeds;
- :mod:`mconv.codecs`     the weight codecs (raw, fp16, palette, sparse, huffman, the choice);
- :mod:`mconv.container`  the ``weights.mcw`` weight container;
- :mod:`mconv.bundle`     the deployable bundle (manifest + weights container + payload);
- :mod:`mconv.account`    the per-layer byte account of a bundle (and of an export, predicted);
- :mod:`mconv.datasets`   small real data sets in the shapes models expect;
- :mod:`mconv.__main__`   ``python -m mconv``: the command line's entry point.

The layers above: :mod:`mconv.formats` (files -> IR), :mod:`mconv.passes` (IR -> IR) and
:mod:`mconv.targets` (IR -> bundles and runners) on the core; :mod:`mconv.api` (the Python API)
on them; :mod:`mconv.cli` (the command line) on the API.

Two declared exceptions to the layering: the lazy forward below of the API names
(``mconv.load`` is ``mconv.api.load``, imported on first use, so importing a core module loads
nothing above it), and ``__main__``, which starts the command line.
"""

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
        import importlib

        return getattr(importlib.import_module("mconv.api"), name)
    raise AttributeError(f"module 'mconv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
