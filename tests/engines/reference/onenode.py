"""One-node forward checks shared by the op-family tests: an oracle run and mconv's kernel."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from mconv.engines.reference.ops import OpContext, lookup
from onnx import helper


def oracle(op, inputs, attrs, n_out=1, opset=21, engine="ort"):
    """Run one ONNX node with onnxruntime (or onnx.reference) on ``inputs``."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(names, inputs)
        if n
    ]
    outs = [onnx.ValueInfoProto(name=f"out{k}") for k in range(n_out)]
    node = helper.make_node(op, names, [o.name for o in outs], **attrs)
    model = helper.make_model(
        helper.make_graph([node], "g", ins, outs),
        opset_imports=[helper.make_opsetid("", opset)],
        ir_version=10,
    )
    feeds = {n: x for n, x in zip(names, inputs) if n}
    if engine == "ort":
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def ours(op, inputs, attrs, opset=21):
    return lookup(op).forward(list(inputs), dict(attrs), OpContext(opset=opset))


def assert_same(op, inputs, attrs=None, opset=21, engine="ort", rtol=1e-6, atol=1e-6):
    attrs = attrs or {}
    want = oracle(op, inputs, attrs, opset=opset, engine=engine)
    got = ours(op, inputs, attrs, opset=opset)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
