"""quantize: int8 weights per output channel (or fp16 weights).

Mode ``int8`` (default)::

    before: W = initializer float32[O, I, k, k];   y = Conv(x, W)
    after:  W_int8 = initializer int8[O, I, k, k];  W_scale = initializer float32[O]
            W = DequantizeLinear(W_int8, W_scale, axis=0);  y = Conv(x, W)

1. Symmetric per output channel: ``scale[c] = max|W[c]| / 127`` (1.0 for an all-zero channel),
   ``q = clip(round_half_even(W / scale), -127, 127)``. So ``|dequant(q) - W| <= scale / 2``
   for every weight, and 0 stays exactly 0 (a pruning mask survives).
2. The DequantizeLinear output keeps the weight's name, so consumers and localization see the
   same value. ``axis`` is the output-channel axis (0 for Conv and Gemm with transB=1, 1 for
   ConvTranspose, Gemm with transB=0 and MatMul). Opset < 13 has no per-axis
   DequantizeLinear: there it is ``Mul(Cast(W_int8, to=FLOAT), W_scale)`` with the scale shaped
   to broadcast along the channel axis.
3. Only float32 constant weights (input 1 of Conv/ConvTranspose/Gemm/MatMul, at least
   ``min_elements`` elements) are quantized; biases and activations stay float32. A weight
   stored as a Constant node becomes an initializer first (PaddleOCR's exports store every
   weight so), in both modes.
4. A pruned weight (``mconv.pruned``) keeps its flag on the int8 initializer.

Mode ``fp16`` runs the ``fp16`` pass in mode ``weights`` (its rules apply). Mode ``static`` (with
``--data``) also quantizes activations, as QDQ, from calibration (``method`` minmax, percentile or
entropy; :mod:`mconv.passes.quantize_static` has its rules).
Report per tensor: scale range, max abs error, SNR (dB).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import fresh_name, taken_names, upgrade_ir3
from mconv.edit.weights import WEIGHT_OPS, layer_weights, record_compression, snr_db
from mconv.passes.base import Pass, PassContext, PassReport, register_pass

F32 = ir.DataType.FLOAT


def quantize_per_channel(array: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 codes and float32 scales along ``axis`` (rule 1)."""
    moved = np.moveaxis(array.astype(np.float32), axis, 0)
    peak = np.abs(moved).reshape(moved.shape[0], -1).max(axis=1) if moved.size else np.zeros(moved.shape[0])
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    shape = [1] * array.ndim
    shape[axis] = -1
    q = np.clip(np.rint(array / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def dequantize_per_channel(q: np.ndarray, scale: np.ndarray, axis: int) -> np.ndarray:
    shape = [1] * q.ndim
    shape[axis] = -1
    return q.astype(np.float32) * scale.reshape(shape)


@register_pass("quantize")
class Quantize(Pass):
    """int8 per-channel weights with DequantizeLinear, or fp16 weights (rules in the module doc)."""

    lossless = False

    @dataclass
    class Config:
        mode: Literal["int8", "fp16", "static"] = "int8"
        min_elements: int = 16
        skip: bool = False
        op_types: list[str] = field(default_factory=lambda: list(WEIGHT_OPS))
        # mode static: calibration method, its percentile, and how many samples of --data
        method: Literal["minmax", "percentile", "entropy"] = "minmax"
        percentile: float = 99.99
        samples: int = 500
        max_drop: float | None = None  # mode static: keep layers float until within it

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        if config.mode == "static":
            from mconv.passes.quantize_static import quantize_static

            return quantize_static(self, model, config, ctx)
        if config.mode == "fp16":
            from mconv.passes.fp16 import Float16

            return Float16().run(model, Float16.Config(mode="weights", min_elements=config.min_elements), ctx)
        graph = model.graph
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        taken = taken_names(graph)
        tensors, new_nodes = [], []
        lifted, refs = layer_weights(model, "quantize", required=False)
        for ref in refs:
            cfg = ctx.config_for(ref.node) if ctx.spec is not None else config
            w = ref.array()
            if cfg.skip or ref.node.op_type not in cfg.op_types or w.dtype != np.float32:
                continue
            if w.size < cfg.min_elements:
                continue
            q, scale = quantize_per_channel(w, ref.out_axis)
            name = ref.name
            value = ref.value
            if value in graph.inputs:  # IR 3: a weight listed as an input
                upgrade_ir3(model)
            graph.initializers.pop(name)
            meta = dict(value.metadata_props)
            value.name = None
            q_value = _initializer(graph, fresh_name(f"{name}_int8", taken), q)
            s_value = _initializer(graph, fresh_name(f"{name}_scale", taken), scale)
            q_value.metadata_props.update(meta)
            nodes = _dequantize(q_value, s_value, ref.out_axis, w.ndim, opset, name, taken)
            out = nodes[-1].outputs[0]
            out.name, out.dtype, out.shape = name, F32, ir.Shape(w.shape)
            ir.convenience.replace_all_uses_with(value, out)
            new_nodes += nodes
            if meta.get("mconv.pruned") == "1":
                record_compression(model, q_value, pruned=True)
            back = dequantize_per_channel(q, scale, ref.out_axis)
            tensors.append(
                {
                    "name": name,
                    "node": ref.node.name,
                    "op": ref.node.op_type,
                    "shape": list(w.shape),
                    "scale_min": float(scale.min()),
                    "scale_max": float(scale.max()),
                    "max_abs_error": float(np.max(np.abs(back - w))) if w.size else 0.0,
                    "snr_db": snr_db(w, back),
                    "bytes_before": int(w.nbytes),
                    "bytes_after": int(q.nbytes + scale.nbytes),
                }
            )
        if new_nodes:
            first = next(iter(graph), None)
            if first is None:
                graph.extend(new_nodes)
            else:
                graph.insert_before(first, new_nodes)
        notes = [f"{len(tensors)} weights quantized to int8 per channel"]
        if lifted:
            notes.append(f"{len(lifted)} weights stored as Constant nodes became initializers")
        return self.report(bool(tensors), notes=notes, tensors=tensors)


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(
        name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype))
    )
    value.const_value = ir.tensor(array, name=name)
    graph.register_initializer(value)
    return value


def _dequantize(
    q: ir.Value, scale: ir.Value, axis: int, rank: int, opset: int, name: str, taken: set[str]
) -> list[ir.Node]:
    """DequantizeLinear(axis) at opset >= 13, else Mul(Cast(q), broadcast scale) (rule 2)."""
    if opset >= 13:
        node = ir.Node(
            "",
            "DequantizeLinear",
            [q, scale],
            attributes=[ir.AttrInt64("axis", axis)],
            name=fresh_name(f"{name}_dequantize", taken),
        )
        return [node]
    shape = [1] * rank
    shape[axis] = -1
    tensor = scale.const_value
    assert tensor is not None  # made by _initializer
    s = tensor.numpy().reshape(shape)
    scale.const_value = ir.tensor(s, name=scale.name)
    scale.shape = ir.Shape(s.shape)
    cast = ir.Node(
        "", "Cast", [q], attributes=[ir.AttrInt64("to", F32)], name=fresh_name(f"{name}_cast", taken)
    )
    cast.outputs[0].name = fresh_name(f"{name}_float", taken)
    cast.outputs[0].dtype = F32
    mul = ir.Node("", "Mul", [cast.outputs[0], scale], name=fresh_name(f"{name}_dequantize", taken))
    return [cast, mul]
