"""shape-inference: fill in value shapes and dtypes with ONNX's shape inference."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from mconv.edit.shapes import infer_on_stripped_copy, merge_inferred
from mconv.passes.base import Pass, PassContext, PassReport, register_pass

__all__ = ["ShapeInference", "infer_on_stripped_copy", "merge_inferred"]


@register_pass("shape-inference")
class ShapeInference(Pass):
    """Fill value shapes and dtypes from ONNX shape inference.

    1. Initializers larger than ``keep_bytes`` are replaced, for the inference call only, by typed
       graph inputs, so the proto stays small (models over 2 GB work); the model is restored.
    2. A value without a dtype takes the inferred dtype; a shape is replaced only by a shape of
       the same rank with more known dimensions (inference never erases what was known).
    3. If inference fails (an op it does not know, inconsistent shapes), the model is left
       unchanged and the reason is a note; this pass never fails a pipeline.
    """

    @dataclass
    class Config:
        keep_bytes: int = 1024  # initializers up to this size stay visible to data propagation
        strict: bool = False
        data_prop: bool = True

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        try:
            inferred = infer_on_stripped_copy(
                model, keep_bytes=config.keep_bytes, strict=config.strict, data_prop=config.data_prop
            )
        except Exception as exc:  # onnx raises InferenceError, ValidationError, RuntimeError...
            return self.report(False, notes=[f"shape inference failed, model unchanged: {str(exc)[:200]}"])
        if inferred is None:
            return self.report(False, notes=["skipped: the model without its weights is still over 2 GiB"])
        changed = merge_inferred(model, inferred)
        return self.report(changed > 0, notes=[f"{changed} values got shapes or dtypes"])
