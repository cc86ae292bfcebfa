"""mconv: import, optimize, verify and export neural network models.

The package root holds the small core shared by every room:

- :mod:`mconv.errors`   the error types and their exit codes;
- :mod:`mconv.fileio`   atomic writes and bounded reads;
- :mod:`mconv.irio`     loading/saving ``.onnx`` as ``onnx_ir.Model`` plus model statistics;
- :mod:`mconv.metrics`   comparison metrics and gates;
- :mod:`mconv.bundle`   the deployable bundle (manifest + weights container + payload);
- :mod:`mconv.container` the ``weights.mcw`` weight container and its codecs.

Rooms: :mod:`mconv.formats` (files -> IR), :mod:`mconv.passes` (IR -> IR),
:mod:`mconv.targets` (IR -> bundles and runners), :mod:`mconv.cli` (the command line).
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
