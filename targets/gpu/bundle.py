"""What the GPU targets' bundles hold alike: the plan's JSON bytes, the weights' codecs, and the
options a plan is regenerated with.

Rules:

1. The plan file is the plan's JSON with sorted keys and a two-space indent, one newline at
   the end (byte-identical for the same plan).
2. A weight's codec is the container's choice, or the one forced; with half storage a raw
   float32 weight is rounded to fp16 and stored so (the kernels read half: nothing they see
   is lost).
3. The options a bundle's plan is regenerated from are the manifest's precision (fp16 or
   fp32; the target's default when absent) and batch (1 to :data:`MAX_BATCH`), checked.
"""

from __future__ import annotations

import json

import numpy as np
from mconv.bundle import Bundle, TensorSpec
from mconv.container import choose_codec
from mconv.errors import InputError
from mconv.targets.gpu.plan import GpuPlan

__all__ = ["MAX_BATCH", "plan_json", "plan_options", "weight_spec"]

MAX_BATCH = 1 << 20


def plan_json(plan: GpuPlan) -> bytes:
    """``metal_plan.json``'s bytes (sorted keys, two-space indent)."""
    return (json.dumps(plan.as_dict(), sort_keys=True, indent=2) + "\n").encode()


def weight_spec(array: np.ndarray, metadata: dict, name: str, storage: str, forced: str | None):
    """(array to store, codec spec): with half storage, raw float32 is rounded and stored fp16."""
    if forced and forced != "auto":
        return array, {"codec": forced}
    spec = choose_codec(array, metadata, name)
    if storage == "half" and spec.get("codec") == "raw" and array.dtype.name == "float32":
        # the kernels read half, so rounding here loses nothing they would see
        with np.errstate(over="ignore"):
            return array.astype(np.float16).astype(np.float32), {"codec": "fp16"}
    return array, spec


def plan_options(bundle: Bundle, label: str, default_precision: str) -> dict:
    """The options a bundle's plan was built with, from its manifest (checked: the plan is
    regenerated from them, and whatever they say, the result is compared with the shipped plan)."""
    opts = bundle.options if isinstance(bundle.options, dict) else {}
    precision = opts.get("precision") or default_precision
    batch = opts.get("batch") or 1
    if not isinstance(precision, str) or precision not in ("fp16", "fp32"):
        raise InputError(
            "options.precision is not fp16 or fp32",
            path=label,
            where="manifest.json",
            hint="re-export the bundle",
        )
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BATCH:
        raise InputError(
            f"options.batch is not a count from 1 to {MAX_BATCH}",
            path=label,
            where="manifest.json",
            hint="re-export the bundle",
        )
    return {"precision": precision, "batch": batch, "model_name": bundle.model_name}


def held_type(dtype: str | None) -> str:
    """An output's bundle dtype: the model's integer or bool type (given back typed by the
    runner), float32 for every float (the kernels' float16 storage is read back as float32)."""
    return "float32" if dtype in (None, "float16") else dtype


def bundle_io(
    plan: GpuPlan, original_inputs: list[TensorSpec], graph_outputs: list[TensorSpec]
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The manifest's inputs and outputs of a planned model: the plan's shapes, with the batch
    dimension written ``batch`` where the model's input had a symbolic one, and the model's own
    dtypes (outputs as :func:`held_type`)."""
    symbolic = {s.name: bool(s.shape) and not isinstance((s.shape or (0,))[0], int) for s in original_inputs}
    inputs = []
    for spec in plan.inputs:
        shape = list(spec["shape"])
        if symbolic.get(spec["name"]):
            shape[0] = "batch"
        src = next((s for s in original_inputs if s.name == spec["name"]), None)
        inputs.append(TensorSpec(spec["name"], src.dtype if src else "float32", tuple(shape)))
    out_dtypes = {s.name: s.dtype for s in graph_outputs}
    outputs = [
        TensorSpec(
            o["name"],
            held_type(out_dtypes.get(o["name"])),
            tuple(["batch", *o["shape"][1:]] if any(symbolic.values()) and o["shape"] else o["shape"]),
        )
        for o in plan.outputs
    ]
    return inputs, outputs
