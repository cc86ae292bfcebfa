"""The ``round-fp16`` pass: the budget schedule's last stage, usable alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.edit.weights import compression_info
from mconv.passes.base import Pass, PassContext, PassReport, register_pass


@register_pass("round-fp16")
class RoundFp16(Pass):
    """Round float32 initializers that no compression pass recorded (biases, BatchNorm) to
    float16 values, keeping dtype float32: the graph is unchanged and export stores them with
    its lossless fp16 codec. Tensors holding values beyond float16's range are left alone.
    ``compressed=true`` rounds the pruned and clustered tensors too: zeros stay zero and a
    palette keeps at most its values, whose codebook export then stores as float16."""

    lossless = False

    @dataclass
    class Config:
        min_elements: int = 1
        compressed: bool = False

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        recorded = compression_info(model)
        done = []
        for name, value in model.graph.initializers.items():
            t = value.const_value
            if (name in recorded and not config.compressed) or t is None or t.dtype != ir.DataType.FLOAT:
                continue
            if t.size < config.min_elements:
                continue
            a = t.numpy()
            if a.size and float(np.max(np.abs(a))) > 65504.0:
                continue
            half = a.astype(np.float16).astype(np.float32)
            if np.array_equal(half, a):
                continue
            value.const_value = ir.Tensor(half, name=name)
            done.append(name)
        return self.report(
            bool(done),
            notes=[f"{len(done)} tensors rounded to float16 values"],
            tensors=[{"name": n} for n in done],
        )
