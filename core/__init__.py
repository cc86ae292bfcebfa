"""mconv: import, optimize, verify and export neural network models.

The package root holds the small core shared by every room:

- :mod:`mconv.errors`   the error types and their exit codes;
- :mod:`mconv.fileio`   atomic writes and bounded reads;
- :mod:`mconv.irio`     loading/saving ``.onnx`` as ``onnx_ir.Model`` plus model statistics;
- :mod:`mconv.verify`   comparison metrics and gates;
- :mod:`mconv.bundle`   the deployable bundle (manifest + weights container + payload);
- :mod:`mconv.container` the ``weights.mcw`` weight container and its codecs.

Rooms: :mod:`mconv.formats` (files -> IR), :mod:`mconv.passes` (IR -> IR),
:mod:`mconv.targets` (IR -> bundles and runners), :mod:`mconv.cli` (the command line).
"""

__version__ = "0.1.0"
