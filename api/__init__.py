"""The library's front door: what every ``mconv`` command does, callable from Python.

``import mconv`` exposes these functions (the package root forwards them here)::

    import mconv

    model = mconv.load("lenet.prototxt", "lenet.caffemodel")            # ir.Model
    res = mconv.optimize(model, recipe="deep-compression", data="calib.npz", output="c.onnx")
    print(res.predicted_bundle_weight_bytes, res.as_dict()["passes"][0]["name"])
    exp = mconv.export(res.model, "cpu", "bundle/")
    report = mconv.metrics("lenet.onnx", "bundle/", data="test.npz")
    assert report.passed, report.failures

Each command of the CLI is one call here with the same options (``mconv import`` is
:func:`convert`; the others have the command's name), and each returns a dataclass whose
``as_dict()`` is exactly the command's ``--json`` document. The CLI only parses options, calls
one of these and renders the result. Errors are the same exception types as the CLI's, with the
same exit codes (:mod:`mconv.errors`): ``InputError`` (2), ``UnsupportedError`` (2),
``GateFailed`` (1; :func:`verify` returns the report and ``report.check()`` raises it), anything
else is a bug.

``progress``: where a call takes it, a factory ``progress(title, total)`` returning a context
manager that yields ``update(description=None, completed=None, total=None, info=None)`` (with
``update.advance(n)``), as the CLI's ``Out.progress``; None shows nothing.
"""

from __future__ import annotations

from mconv.api.analyze import AnalyzeResult, analyze
from mconv.api.common import ModelLike, PathLike, load, load_data, naming_the_file, open_model, save  # noqa: F401  (the commands' helpers, as api.NAME)
from mconv.api.convert import ConvertResult, convert
from mconv.api.export import ExportResult, bundle_file_bytes, export, input_file_bytes  # noqa: F401  (the commands' helpers, as api.NAME)
from mconv.api.inspect import InspectResult, inspect
from mconv.api.optimize import OptimizeResult, optimize
from mconv.api.run import RunResult, open, output_summary, run  # noqa: F401  (the commands' helpers, as api.NAME)
from mconv.api.verify import VerifyResult, verify

__all__ = [
    "AnalyzeResult",
    "ConvertResult",
    "ExportResult",
    "InspectResult",
    "OptimizeResult",
    "RunResult",
    "VerifyResult",
    "analyze",
    "convert",
    "export",
    "inspect",
    "load",
    "open",
    "optimize",
    "run",
    "save",
    "verify",
]
