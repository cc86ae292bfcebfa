"""The reference executor as an ``onnx.backend.base.Backend``, so ONNX's backend test suite runs it.

Rules
-----
1. ``prepare(model_proto)`` converts the proto with ``onnx_ir.serde.deserialize_model`` and builds
   one :class:`~mconv.engines.reference.executor.Executor`; ``BackendRep.run(inputs)`` feeds the
   graph's real inputs by position (or by name, given a dict) and returns outputs in graph order.
2. Only the CPU device is supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from mconv.engines.reference.executor import Executor
from onnx.backend.base import Backend, BackendRep, Device, DeviceType


class ReferenceBackendRep(BackendRep):
    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        names = self.executor.input_names
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        out = self.executor.run(feeds)
        return tuple(out[n] for n in self.executor.output_names)


class ReferenceBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> ReferenceBackendRep:
        if not cls.supports_device(device):
            raise RuntimeError(f"device {device!r} is not supported; the reference backend runs on CPU")
        return ReferenceBackendRep(Executor(ir.serde.deserialize_model(model), dtype_check=False))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[Any],
        device: str = "CPU",
        outputs_info: Any = None,
        **kwargs: Any,
    ) -> tuple:
        from mconv.engines.reference.executor import run_node as _run_node

        attrs = {}
        for a in node.attribute:
            attrs[a.name] = onnx.helper.get_attribute_value(a)
            if isinstance(attrs[a.name], bytes):
                attrs[a.name] = attrs[a.name].decode("utf-8")
        return tuple(
            _run_node(
                node.op_type, list(inputs), attrs, domain=node.domain, opset=kwargs.get("opset_version", 21)
            )
        )

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = ReferenceBackend.prepare
run_model = ReferenceBackend.run_model
run_node = ReferenceBackend.run_node
supports_device = ReferenceBackend.supports_device
