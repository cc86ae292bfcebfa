"""Gather and GatherND parameters: the indices' conditions and the geometry (axis, inner size, counts)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext
from mconv.targets.gpu.values import required


def check_gather(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return "Gather takes 2 inputs"
    idx = node.inputs[1]
    if idx.const_value is None and (idx.shape is None or any(not isinstance(d, int) for d in idx.shape)):
        return "indices shape not static"
    return None


def gather_geometry(ctx: LowerContext, node: ir.Node) -> tuple[list[int], int, int, int, int]:
    """(data shape, axis, inner size, index count, output count) of a Gather."""
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(xs) if axis < 0 else axis
    idx_value = required(node.inputs[1])
    const = LowerContext.const(idx_value)
    n_idx = int(const.size) if const is not None else int(np.prod(ctx.shape(idx_value)))
    inner = int(np.prod(xs[axis + 1 :]))
    count = int(np.prod(xs[:axis])) * n_idx * inner
    return xs, axis, inner, n_idx, count


def check_gathernd(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return "GatherND takes 2 inputs"
    x, idx = node.inputs[0], node.inputs[1]
    for v in (x, idx):
        if v.const_value is None and (v.shape is None or any(not isinstance(d, int) for d in v.shape)):
            return "data or indices shape not static"
    xs, ishape = ctx.shape(x), ctx.shape(idx)
    b = node.attributes.get_int("batch_dims", 0)
    if not ishape or not 0 <= b < min(len(ishape), len(xs)):
        return f"batch_dims {b} outside the ranks"
    if ishape[-1] > len(xs) - b or list(ishape[:b]) != list(xs[:b]):
        return "indices' last axis or batch axes do not fit the data"
    return None


@dataclass(frozen=True)
class GatherND:
    """A GatherND's geometry: ``tuples`` index tuples of ``k`` entries, each picking a slab of
    ``inner`` elements at ``sum(i_j * strides[j])`` (``i_j`` in ``[0, dims[j])``) within the
    ``slab``-element block of its batch (``per`` tuples per batch)."""

    k: int
    tuples: int
    per: int
    slab: int
    inner: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def count(self) -> int:
        return self.tuples * self.inner

    def offsets(self, indices: np.ndarray) -> list[int]:
        """Constant indices as data offsets, one per tuple (negatives from the end); -1 where a
        component is out of range (the kernel gives zeros, as it does for run-time indices)."""
        rows = np.asarray(indices, np.int64).reshape(self.tuples, self.k)
        out = []
        for t, row in enumerate(rows):
            off = (t // self.per) * self.slab
            for i, d, s in zip(row.tolist(), self.dims, self.strides):
                if not -d <= i < d:
                    off = -1
                    break
                off += (i + d if i < 0 else i) * s
            out.append(off)
        return out


def gathernd_geometry(ctx: LowerContext, node: ir.Node) -> GatherND:
    xs = ctx.shape(required(node.inputs[0]))
    ishape = ctx.shape(required(node.inputs[1]))
    b = node.attributes.get_int("batch_dims", 0)
    k = int(ishape[-1])
    tuples = int(np.prod(ishape[:-1]))
    batches = int(np.prod(xs[:b]))
    dims = tuple(int(d) for d in xs[b : b + k])
    strides = tuple(int(np.prod(xs[b + j + 1 :])) for j in range(k))
    return GatherND(
        k=k,
        tuples=tuples,
        per=max(tuples // max(batches, 1), 1),
        slab=int(np.prod(xs[b:])),
        inner=int(np.prod(xs[b + k :])),
        dims=dims,
        strides=strides,
    )
