"""The numpy reference engine: :class:`~mconv.engines.reference.executor.Executor` runs an
``onnx_ir.Model`` op by op (``ops/``, one module per op family, registered by name) and
differentiates it in reverse mode."""

from mconv.engines.reference.executor import Executor, run_node

__all__ = ["Executor", "run_node"]
