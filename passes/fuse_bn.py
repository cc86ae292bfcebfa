"""fuse-bn: fold inference BatchNormalization into the preceding Conv, ConvTranspose or Gemm."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import add_fused_from, add_initializer, constant_array, fresh_name, taken_names
from mconv.passes.base import Pass, PassContext, PassReport, register_pass

_PRODUCERS = ("Conv", "ConvTranspose", "Gemm")


@register_pass("fuse-bn")
class FuseBatchNorm(Pass):
    """Fold ``BatchNormalization`` (inference) into the Conv / ConvTranspose / Gemm before it.

    With ``s = scale / sqrt(var + epsilon)`` per output channel c::

        before: y = Conv(x, W, b);  z = BatchNormalization(y, scale, B, mean, var)
        after:  z = Conv(x, W * s[c], (b - mean) * s + B)

    1. The producer's output has the BatchNormalization as its only consumer and is not a graph
       output; the BatchNormalization is in inference mode (``training_mode`` 0, only its first
       output used); weights, bias and the four statistics are constants.
    2. The output channel is axis 0 of a Conv weight, axis 1 of a ConvTranspose weight (per
       group), and the column of a Gemm (axis 1 of B, or axis 0 when ``transB=1``). A Gemm's
       ``C`` becomes ``(beta * C - mean) * s + B`` and ``beta`` becomes 1.
    3. A missing bias is created. Weights shared with other nodes are copied, never changed
       under another user; folded arithmetic runs in float64 and is stored in the weight's dtype.
    4. The fused node's output takes the BatchNormalization output's name, and its metadata
       ``mconv.fused_from`` lists the original node names (a JSON list), for localization.
    """

    @dataclass
    class Config:
        pass

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        graph = model.graph
        ir_version = model.ir_version or 10
        taken = taken_names(graph)
        fused, notes = 0, []
        for bn in list(graph):
            if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
                continue
            why = self._try_fuse(graph, bn, ir_version, taken)
            if why is None:
                fused += 1
            elif why:
                notes.append(f"{bn.name or 'BatchNormalization'}: kept ({why})")
        notes.insert(0, f"fused {fused} BatchNormalization nodes")
        return self.report(fused > 0, notes=notes)

    def _try_fuse(self, graph: ir.Graph, bn: ir.Node, ir_version: int, taken: set[str]) -> str | None:
        y = bn.inputs[0]
        prod = y.producer() if y is not None else None
        if y is None or prod is None or prod.op_type not in _PRODUCERS or prod.domain not in ("", "ai.onnx"):
            return ""  # nothing to fuse into: not worth a note
        if len(y.uses()) != 1 or y.is_graph_output():
            return "its input has other consumers"
        if any(o is not None and (o.uses() or o.is_graph_output()) for o in bn.outputs[1:]):
            return "training outputs are used"
        mode = bn.attributes.get("training_mode")
        if mode is not None and mode.value:
            return "training_mode=1"
        params = [constant_array(v, graph, ir_version) for v in bn.inputs[1:5]]
        if len(params) != 4 or any(p is None for p in params):
            return "statistics are not constants"
        w = constant_array(prod.inputs[1], graph, ir_version) if len(prod.inputs) > 1 else None
        if w is None:
            return "weights are not constants"
        bias_in = prod.inputs[2] if len(prod.inputs) > 2 else None
        b = constant_array(bias_in, graph, ir_version) if bias_in is not None else None
        if bias_in is not None and b is None:
            return "bias is not a constant"
        scale, shift, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)
        eps = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
        s = scale / np.sqrt(var + eps)
        w64 = w.astype(np.float64)
        if prod.op_type == "Conv":
            if w64.shape[0] != s.size:
                return "channel count mismatch"
            new_w = w64 * s.reshape((-1,) + (1,) * (w64.ndim - 1))
            new_b = ((b.astype(np.float64) if b is not None else 0.0) - mean) * s + shift
        elif prod.op_type == "ConvTranspose":
            group = prod.attributes["group"].value if "group" in prod.attributes else 1
            c_in, c_out_g = w64.shape[0], w64.shape[1]
            if c_out_g * group != s.size:
                return "channel count mismatch"
            grouped = w64.reshape((group, c_in // group, c_out_g) + w64.shape[2:])
            new_w = (grouped * s.reshape((group, 1, c_out_g) + (1,) * (w64.ndim - 2))).reshape(w64.shape)
            new_b = ((b.astype(np.float64) if b is not None else 0.0) - mean) * s + shift
        else:  # Gemm: Y = alpha * A' B' + beta * C; channel = column of Y
            if w64.ndim != 2:
                return "Gemm weight is not 2-D"
            trans_b = prod.attributes["transB"].value if "transB" in prod.attributes else 0
            beta = prod.attributes["beta"].value if "beta" in prod.attributes else 1.0
            if (w64.shape[0] if trans_b else w64.shape[1]) != s.size:
                return "channel count mismatch"
            new_w = w64 * (s[:, None] if trans_b else s[None, :])
            c = beta * b.astype(np.float64) if b is not None else 0.0
            new_b = np.asarray((c - mean) * s + shift)
            if prod.attributes.get("beta") is not None or b is None:
                prod.attributes["beta"] = ir.AttrFloat32("beta", 1.0)
        dtype = w.dtype
        self._set_input(graph, prod, 1, new_w.astype(dtype), taken, f"{prod.name or 'node'}_W")
        bias_name = f"{prod.name or 'node'}_bias"
        self._set_input(graph, prod, 2, np.asarray(new_b).astype(dtype), taken, bias_name)
        add_fused_from(prod, bn)
        z = bn.outputs[0]
        name = z.name
        ir.convenience.replace_all_uses_with(z, y, replace_graph_outputs=True)
        graph.remove(bn, safe=True)
        z.name = None
        y.name = name
        return None

    @staticmethod
    def _set_input(
        graph: ir.Graph, node: ir.Node, index: int, array: np.ndarray, taken: set[str], base: str
    ) -> None:
        """Give ``node`` input ``index`` the value ``array``: in place if the initializer is
        this node's alone, else as a new initializer."""
        old = node.inputs[index] if len(node.inputs) > index else None
        if (
            old is not None
            and old.is_initializer()
            and len(old.uses()) == 1
            and not old.is_graph_input()
            and not old.is_graph_output()
        ):
            old.const_value = ir.tensor(array, name=old.name)
            old.shape = ir.Shape(array.shape)
            return
        value = add_initializer(graph, fresh_name(base, taken), array)
        if len(node.inputs) <= index:
            node.resize_inputs(index + 1)
        node.replace_input_with(index, value)
