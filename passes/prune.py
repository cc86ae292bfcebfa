"""prune: magnitude pruning (per layer or global), N:M sparsity, structured channel pruning.

Deep Compression's first stage (Han et al. 2016, section 2; Han et al. 2015): small weights are
set to zero. Which tensors: the weights (input 1) of Conv, ConvTranspose, Gemm and MatMul that
are constant initializers (``op_types``); biases are never pruned. Per-op-type and per-op-name
overrides choose per layer (name beats type beats global)::

    before: W = [[0.9, -0.01], [0.02, -0.7]]      prune(sparsity=0.5)
    after:  W = [[0.9,  0.0 ], [0.0,  -0.7]]      W.metadata_props["mconv.pruned"] = "1"

Rules:

1. ``sparsity = s`` zeroes exactly ``round(s * size)`` weights of smallest magnitude per tensor
   (ties broken by position). ``threshold_std = k`` instead zeroes ``|w| < k * std(w)`` (the
   paper's rule). ``s = 0`` and no ``threshold_std`` leaves the tensor alone.
2. ``scope = "global"``: every tensor whose resolved scope is global shares one threshold: the
   magnitude below which the global ``sparsity`` of all their weights falls (weights tied at
   the threshold are all pruned), or ``threshold_std`` times the std of all their weights.
3. ``n`` and ``m`` (e.g. 2 and 4): in each run of ``m`` consecutive weights along the input
   channel axis, the ``n`` largest magnitudes are kept (N:M sparsity); the input channel count
   must be a multiple of ``m``.
4. ``structured = "l1"`` or ``"l2"`` removes the fraction ``sparsity`` of output channels with
   the smallest norms from Conv/Gemm and rewires every consumer (see
   :mod:`mconv.edit.channels` for what is followed and what is refused). With
   ``on_unsafe = "error"`` (default) a layer that cannot be rewired safely raises
   :class:`~mconv.errors.InputError` naming node and reason and nothing is changed; with
   ``"skip"`` the layer is left whole and the report says why.
5. The mask persists as exact zeros plus ``value.metadata_props["mconv.pruned"] = "1"`` (and the
   model-level ``mconv.compression`` JSON, with the kept fraction and ``index_bits`` when set).
   Later passes keep flagged zeros at exactly zero: ``cluster`` leaves zeros out, ``quantize``
   maps 0 to 0, ``fp16`` keeps 0, ``finetune`` masks gradients with ``w != 0``.
6. Report per tensor: name, node, op, shape, kept fraction, threshold.
7. Weights stored as ``Constant`` nodes (paddle2onnx stores every weight so) become initializers
   of the same name first (:func:`mconv.edit.weights.lift_constant_weights`: the model computes
   what it computed); weights computed from constants (a Transpose, Reshape or
   DequantizeLinear of one) are not weights the pass can change: when the model has no other,
   the pass refuses with one line naming them and what to run first (``fold``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx_ir as ir
from mconv.edit.weights import (
    WEIGHT_OPS,
    WeightRef,
    layer_weights,
    record_compression,
)
from mconv.errors import InputError
from mconv.passes.base import MAX_COUNT, Pass, PassContext, PassReport, bounded, register_pass


def magnitude_mask(array: np.ndarray, sparsity: float, chunk: int = 1 << 20) -> tuple[np.ndarray, float]:
    """Keep-mask zeroing exactly round(sparsity * size) smallest magnitudes (rule 1), threshold.

    Ties at the threshold: the first ones by position go. Memory: the bool mask and chunk-sized
    scratch. For IEEE floats the k-th smallest magnitude is found by radix selection on the bit
    patterns (sign cleared, they sort as the magnitudes do): a histogram of the top 16 bits,
    then an exact selection among the few values in the one bin that holds it. No full-size
    copy of the tensor is made, so AlexNet's fc6 (151 MB) prunes in about 40 MB of scratch.
    """
    flat = np.ascontiguousarray(array).ravel()
    k = min(int(round(sparsity * flat.size)), flat.size)
    if k <= 0:
        return np.ones(array.shape, dtype=bool), 0.0
    if flat.dtype not in (np.float16, np.float32, np.float64):
        return _magnitude_mask_sorted(flat, k, array.shape)
    unsigned = np.dtype(f"u{flat.dtype.itemsize}")
    bits = flat.view(unsigned)
    width = 8 * flat.dtype.itemsize - 1  # magnitude bits
    magnitude = unsigned.type((1 << width) - 1)
    shift = max(width - 16, 0)
    hist = np.zeros(1 << (width - shift), dtype=np.int64)
    for start in range(0, flat.size, chunk):
        m = bits[start : start + chunk] & magnitude
        hist += np.bincount((m >> shift).astype(np.intp), minlength=hist.size)
    cumulative = np.cumsum(hist)
    b = int(np.searchsorted(cumulative, k))  # the bin of the k-th smallest magnitude
    before = int(cumulative[b - 1]) if b else 0
    in_bin = np.concatenate(
        [m[(m >> shift) == b] for m in (bits[s : s + chunk] & magnitude for s in range(0, flat.size, chunk))]
    )
    in_bin.partition(k - before - 1)
    cut = in_bin[k - before - 1]  # bit pattern of the threshold magnitude
    below = before + int(np.count_nonzero(in_bin < cut))
    del in_bin
    keep = np.empty(flat.size, dtype=bool)
    ties_to_drop = k - below
    for start in range(0, flat.size, chunk):
        m = bits[start : start + chunk] & magnitude
        part = keep[start : start + chunk]
        np.greater(m, cut, out=part)
        ties = np.flatnonzero(m == cut)
        part[ties[ties_to_drop:]] = True  # later ties stay
        ties_to_drop = max(ties_to_drop - ties.size, 0)
    threshold = float(np.array([cut], dtype=unsigned).view(flat.dtype)[0])
    return keep.reshape(array.shape), threshold


def _magnitude_mask_sorted(flat: np.ndarray, k: int, shape: tuple[int, ...]) -> tuple[np.ndarray, float]:
    """``magnitude_mask`` for integer tensors: a partitioned copy of the magnitudes."""
    work = np.abs(flat)
    work.partition(k - 1)
    threshold = work[k - 1]
    np.abs(flat, out=work)
    keep = work > threshold
    ties = np.flatnonzero(work == threshold)  # |w| == threshold: the first ones by position go
    del work
    below = flat.size - int(np.count_nonzero(keep)) - ties.size
    keep[ties[k - below :]] = True
    return keep.reshape(shape), float(threshold)


def n_m_mask(array: np.ndarray, n: int, m: int, in_axis: int, where: str) -> np.ndarray:
    """Keep-mask with the n largest of every m consecutive weights along ``in_axis`` (rule 3)."""
    channels = array.shape[in_axis]
    if channels % m:
        raise InputError(
            f"{channels} input channels are not a multiple of m={m}",
            where=where,
            hint=f"choose m dividing {channels}, or exclude the layer (op_name override with m=0)",
        )
    moved = np.moveaxis(np.abs(array), in_axis, -1)
    groups = moved.reshape(*moved.shape[:-1], channels // m, m)
    order = np.argsort(-groups, axis=-1, kind="stable")
    keep = np.zeros(groups.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :n], True, axis=-1)
    return np.moveaxis(keep.reshape(moved.shape), -1, in_axis)


@register_pass("prune")
class Prune(Pass):
    """Zero small weights or remove whole channels (rules in the module docstring)."""

    lossless = False

    @dataclass
    class Config:
        sparsity: float = bounded(0.0, 0, 1, hi_open=True)
        threshold_std: float | None = bounded(None, 0, None)
        scope: Literal["layer", "global"] = "layer"
        n: int = bounded(0, 0, MAX_COUNT)
        m: int = bounded(0, 0, MAX_COUNT)
        structured: Literal["none", "l1", "l2"] = "none"
        on_unsafe: Literal["error", "skip"] = "error"
        op_types: list[str] = field(default_factory=lambda: list(WEIGHT_OPS))
        index_bits: int | None = bounded(None, 1, 8)

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        selected: list[tuple[WeightRef, Prune.Config]] = []
        lifted, refs = layer_weights(model, "prune")  # rule 7: weights stored as Constant nodes
        for ref in refs:
            cfg = ctx.config_for(ref.node) if ctx.spec is not None else config
            if ref.node.op_type in cfg.op_types:
                _check(cfg, ref.node)
                selected.append((ref, cfg))
        tensors, notes = [], []
        structured = [(r, c) for r, c in selected if c.structured != "none"]
        if structured:
            from mconv.edit.channels import prune_channels

            s_tensors, s_notes = prune_channels(model, structured)
            tensors += s_tensors
            notes += s_notes
        rest = [(r, c) for r, c in selected if c.structured == "none"]
        global_refs = [(r, c) for r, c in rest if c.scope == "global" and (c.sparsity > 0 or c.threshold_std)]
        global_threshold = _global_threshold(
            [r for r, _ in global_refs], ctx.config_for() if ctx.spec else config
        )
        for i, (ref, cfg) in enumerate(rest):
            ctx.tick(f"prune {ref.name}", i, len(rest))
            w = ref.array()
            keep = np.ones(w.shape, dtype=bool)
            threshold = None
            if (
                cfg.scope == "global"
                and global_threshold is not None
                and (cfg.sparsity > 0 or cfg.threshold_std)
            ):
                threshold, strict = global_threshold
                keep = np.abs(w) > threshold if not strict else np.abs(w) >= threshold
            elif cfg.threshold_std is not None:
                threshold = float(cfg.threshold_std * np.std(w, dtype=np.float64))
                keep = np.abs(w) >= threshold
            elif cfg.sparsity > 0:
                keep, threshold = magnitude_mask(w, cfg.sparsity)
            if cfg.m:
                keep &= n_m_mask(w, cfg.n, cfg.m, ref.in_axis, f"node {ref.node.name or ref.name}")
            if keep.all() and threshold is None and not cfg.m:
                continue
            if isinstance(ref.value.const_value, ir.ExternalTensor):  # w is our own copy: prune in place
                np.logical_not(keep, out=keep)
                w[keep] = 0
                pruned = w
            else:
                pruned = np.where(keep, w, np.zeros((), dtype=w.dtype))
            del keep
            ref.set_array(pruned)
            kept = float(np.count_nonzero(pruned)) / max(pruned.size, 1)
            record_compression(model, ref.value, pruned=True, kept=round(kept, 6), index_bits=cfg.index_bits)
            tensors.append(
                {
                    "name": ref.name,
                    "node": ref.node.name,
                    "op": ref.node.op_type,
                    "shape": list(w.shape),
                    "kept": kept,
                    "threshold": threshold,
                    "pattern": f"{cfg.n}:{cfg.m}" if cfg.m else None,
                }
            )
            del w, pruned  # before the next tensor is read: one large weight in memory at a time
        total = sum(int(np.prod(t["shape"])) for t in tensors) or 1
        kept_all = sum(t["kept"] * int(np.prod(t["shape"])) for t in tensors) / total
        notes.insert(0, f"{len(tensors)} tensors pruned, {100 * kept_all:.1f}% of their weights kept")
        if lifted:
            notes.append(f"{len(lifted)} weights stored as Constant nodes became initializers (rule 7)")
        return self.report(bool(tensors), notes=notes, tensors=tensors)


def _check(cfg: Prune.Config, node: ir.Node) -> None:
    where = f"node {node.name or node.op_type}"
    if not 0.0 <= cfg.sparsity < 1.0:
        raise InputError(f"sparsity={cfg.sparsity}", where=where, hint="sparsity is a fraction in [0, 1)")
    if cfg.threshold_std is not None and cfg.threshold_std < 0:
        raise InputError(f"threshold_std={cfg.threshold_std}", where=where, hint="use k >= 0")
    if cfg.m or cfg.n:
        if not 0 < cfg.n < cfg.m:
            raise InputError(f"n={cfg.n}, m={cfg.m}", where=where, hint="N:M needs 0 < n < m, e.g. n=2, m=4")


def _global_threshold(refs: list[WeightRef], cfg: Prune.Config) -> tuple[float, bool] | None:
    """The shared threshold of rule 2 and whether it is strict (keep |w| >= t) or not (keep > t)."""
    if not refs:
        return None
    flat = np.concatenate([np.abs(r.array()).ravel() for r in refs])
    if cfg.threshold_std is not None:
        signed = np.concatenate([r.array().ravel() for r in refs])
        return float(cfg.threshold_std * np.std(signed, dtype=np.float64)), True
    k = int(round(cfg.sparsity * flat.size))
    if k <= 0:
        return None
    return float(np.partition(flat, k - 1)[k - 1]), False
