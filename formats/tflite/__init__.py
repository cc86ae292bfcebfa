"""TFLite flatbuffers -> ONNX IR: ``reader`` parses the file and holds the converter and its
rules (see its docstring), ``ops`` the lowering of each builtin op (registered into
``reader.OPS`` when this package is imported), ``lstm_int`` the integer LSTM kernels. The
reader imports neither of the others, so the package has no import loop."""

from mconv.formats.tflite import ops  # noqa: F401  (registers the op lowerings)
from mconv.formats.tflite.reader import FORMAT, load, load_tflite_bytes, read_tflite

__all__ = ["FORMAT", "load", "load_tflite_bytes", "read_tflite"]
