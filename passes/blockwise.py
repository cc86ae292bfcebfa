"""blockwise: int4 / int8 weight-only quantization in blocks (RTN, HQQ-style refinement, GPTQ).

Every selected 2-D weight (MatMul ``[K, N]``, Gemm; embedding tables, rule 6) is split along its input axis ``K`` into
blocks of ``block`` values (32, 64, 128, ...); each block of each output channel gets its own
scale (and, asymmetric, its own zero point)::

    before: W = initializer float32[K, N]
    after:  W_q    = initializer int4[K, N]         (uint4 when asymmetric; int8/uint8 at 8 bits)
            W_scale = initializer float32[ceil(K/block), N]   (float16-exact values)
            W_zero  = initializer uint4[ceil(K/block), N]     (asymmetric only)
            W = DequantizeLinear(W_q, W_scale[, W_zero], axis=0, block_size=block)   (opset 21)

Rules:

1. Round to nearest (``method=rtn``). Symmetric (``sym=true``): the value of largest magnitude
   ``m`` of a block sets ``scale = m / qmin`` (``qmin = -2**(bits-1)``, as ONNX Runtime's
   quantizer does, so the extreme value is a code exactly and the other codes span
   ``[-8, 7]``); codes are ``clip(round(w / scale), qmin, qmax)``. Asymmetric: the block's range
   widened to hold 0 gives ``scale = (max - min) / (2**bits - 1)`` and an integer zero point
   ``clip(round(-min / scale), 0, 2**bits - 1)``; codes are ``clip(round(w / scale) + zero)``.
   A block of zeros gets scale 1 (codes 0 / the zero point). Scales are rounded to float16 (the
   stored precision, counted in the bits per weight) before the codes are computed. A ragged last
   block (``K % block != 0``) is quantized on its real values only.
2. HQQ-style data-free refinement (``method=hqq``, after Badri & Shaji 2023): starting from RTN,
   ``iters`` rounds of the half-quadratic split ``W = dequant(Q) + E``: ``E`` is the residual
   shrunk by the generalized soft-threshold of an ``lp`` norm (``p < 1`` ignores outliers, as
   HQQ; ``p = 2`` makes E = 0), then scale and zero point are refitted to ``W - E`` in closed form
   (least squares per block, the zero point rounded to an integer in range), and the codes are
   recomputed; ``beta`` grows by ``kappa`` each round. Per block the pass keeps whichever of all
   rounds (RTN included) has the least squared error against the real weights, so refinement
   never loses to RTN.
3. GPTQ (``method=gptq``, Frantar et al. 2022) needs ``--data``: the reference executor runs the
   model on the feeds and records every selected MatMul/Gemm's activation input ``X``; with
   ``H = 2 X^T X / n`` (dampened by ``damp`` times its mean diagonal), the columns of ``W`` are
   quantized in order and each one's error is spread over the columns not yet quantized through
   the Cholesky factor of ``H^-1`` (lazy batches of 128 columns). A block's scale and zero point
   are fixed from the updated weights when its first column is reached (GPTQ's groups).
4. Reports: per tensor its shape, bits, block, sym, method, bits per weight (codes + float16
   scales + zero points at ``bits`` bits), MSE and SNR (dB) against the original weights, and
   for GPTQ the output SNR on the recorded activations.
5. The model's default-domain opset becomes 21 (``DequantizeLinear`` takes ``block_size`` from
   21). Only a model whose every default-domain op means the same at its current opset and at
   21 is raised: the definition is the same, or every later version only widens the type
   constraints (Reshape, Transpose, Equal: new element types) with the same inputs, outputs
   and attributes, or adds one of :data:`_NEUTRAL_ATTRS`, attributes whose defaults keep the
   old meaning (Cast's ``saturate`` concerns float8 types, which no earlier opset has).
   Otherwise the pass refuses in one line (the ops are named).
6. Embedding tables are weights too (``op_types`` includes ``Gather`` by default; leave it out
   to keep them float): a Gather whose ``data`` (input 0) is a float initializer of rank 2
   gathered along axis 0, ``[vocab, dim]``, is quantized with blocks along ``dim`` (each
   token's row has its own scales, the layout of ONNX Runtime's ``GatherBlockQuantized``)::

       before: E = initializer float32[vocab, dim];  y = Gather(E, ids)
       after:  E = DequantizeLinear(E_q int4[vocab, dim], E_scale[vocab, ceil(dim/block)],
                                    axis=1, block_size=block);  y = Gather(E, ids)

   Standard ONNX (opset 21), not the contrib op, because every target runs it: ONNX Runtime
   and the reference directly, xla lowers the blocked DequantizeLinear, metal and webgpu
   evaluate a DequantizeLinear of constants when they plan. A table that is also a MatMul or
   Gemm weight is quantized once, as that weight (its users, the Gather included, read the one
   DequantizeLinear), or not at all when that weight is not selected. A lookup's error does
   not depend on the indices (the Hessian of ``X @ W`` is what GPTQ needs; a row lookup has
   none), so ``method=gptq`` rounds a table to nearest (rule 1) and reports ``rtn``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx_ir as ir
from mconv.edit.weights import WeightRef, gather_tables, snr_db, squared_error, weight_refs
from mconv.errors import InputError, show
from mconv.metrics import check_finite
from mconv.passes.base import Pass, PassContext, PassReport, bounded, register_pass

Method = Literal["rtn", "hqq", "gptq"]
BLOCKWISE_KEY = "mconv.blockwise"
BLOCK_OPSET = 21


# --- the quantizer --------------------------------------------------------------------------


@dataclass
class Quantized:
    """Codes ``q`` (int8 array: signed codes when symmetric, 0..2**bits-1 when not) of a 2-D
    weight ``[R, K]`` blocked along K, per-block ``scale`` (float32, float16-exact) and ``zero``
    (uint8, asymmetric only), each ``[R, ceil(K / block)]``."""

    q: np.ndarray
    scale: np.ndarray
    zero: np.ndarray | None
    bits: int
    block: int

    @property
    def sym(self) -> bool:
        return self.zero is None

    def dequantize(self) -> np.ndarray:
        return dequantize(self.q, self.scale, self.zero, self.block)

    def bits_per_weight(self) -> float:
        r, k = self.q.shape
        extra = self.scale.size * 16 + (0 if self.zero is None else self.zero.size * self.bits)
        return self.bits + extra / max(r * k, 1)


def _check(bits: int, block: int) -> None:
    if bits not in (2, 3, 4, 5, 6, 7, 8):
        raise InputError(f"bits={bits}", where="pass blockwise", hint="use 2 .. 8 (4 and 8 export to ONNX)")
    if block < 8 or block & (block - 1):
        raise InputError(
            f"block={block}", where="pass blockwise", hint="use a power of two >= 16 (32, 64, 128)"
        )


def _blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``w [R, K]`` as float32 ``[R, nb, block]`` (a ragged tail padded with its block's first
    value, which changes no min/max/absmax) and the mask of real entries (None-like all True)."""
    r, k = w.shape
    nb = -(-k // block)
    pad = nb * block - k
    x = np.asarray(w, dtype=np.float32)
    if pad:
        tail = np.repeat(x[:, (nb - 1) * block : (nb - 1) * block + 1], pad, axis=1)
        x = np.concatenate([x, tail], axis=1)
    mask = np.ones(nb * block, dtype=bool)
    if pad:
        mask[k:] = False
    return x.reshape(r, nb, block), mask.reshape(nb, block)


def _f16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to float16 (scales are stored so), never 0 or inf."""
    y = np.clip(np.abs(x), 2.0**-24, 65504.0).astype(np.float16).astype(np.float32)
    return np.where(x < 0, -y, y)


def _codes(x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, bits: int) -> np.ndarray:
    """Rule 1's codes of blocked ``x [R, nb, B]`` for per-block scale/zero ``[R, nb]``."""
    v = np.rint(x / scale[..., None])
    if zero is None:
        return np.clip(v, -(1 << (bits - 1)), (1 << (bits - 1)) - 1).astype(np.int8)
    v += zero[..., None]
    return np.clip(v, 0, (1 << bits) - 1).astype(np.uint8).view(np.int8)


def _rtn_params(x: np.ndarray, bits: int, sym: bool) -> tuple[np.ndarray, np.ndarray | None]:
    if sym:
        idx = np.abs(x).argmax(axis=-1)
        m = np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]
        scale = np.where(m == 0, np.float32(1.0), m / np.float32(-(1 << (bits - 1))))
        return _f16(scale), None
    qmax = (1 << bits) - 1
    lo = np.minimum(x.min(axis=-1), 0.0)
    hi = np.maximum(x.max(axis=-1), 0.0)
    scale = _f16(np.where(hi > lo, (hi - lo) / qmax, np.float32(1.0)))
    zero = np.clip(np.rint(-lo / scale), 0, qmax)
    return scale, zero.astype(np.float32)


def _dq_blocks(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, bits: int) -> np.ndarray:
    v = q.view(np.uint8).astype(np.float32) if zero is not None else q.astype(np.float32)
    if zero is not None:
        v -= zero[..., None]
    return v * scale[..., None]


def _finish(q: np.ndarray, scale, zero, bits: int, block: int, k: int) -> Quantized:
    r, nb, b = q.shape
    codes = q.reshape(r, nb * b)[:, :k]
    if zero is not None:
        codes = codes.view(np.uint8)
    return Quantized(
        np.ascontiguousarray(codes),
        scale.astype(np.float32),
        None if zero is None else zero.astype(np.uint8),
        bits,
        block,
    )


def quantize_rtn(w: np.ndarray, bits: int = 4, block: int = 32, sym: bool = True) -> Quantized:
    """Round-to-nearest blockwise quantization of ``w [R, K]`` along K (rule 1)."""
    _check(bits, block)
    x, _ = _blocks(w, block)
    scale, zero = _rtn_params(x, bits, sym)
    return _finish(_codes(x, scale, zero, bits), scale, zero, bits, block, w.shape[1])


def dequantize(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, block: int) -> np.ndarray:
    """float32 ``[R, K]`` from codes ``[R, K]`` and per-block ``[R, nb]`` scale / zero."""
    r, k = q.shape
    s = np.repeat(scale, block, axis=1)[:, :k]
    if zero is None:
        return q.astype(np.float32) * s
    return (q.astype(np.float32) - np.repeat(zero, block, axis=1)[:, :k].astype(np.float32)) * s


def _shrink_lp(x: np.ndarray, beta: float, p: float) -> np.ndarray:
    """HQQ's generalized soft-threshold: argmin_e |e|_p + beta/2 |e - x|^2 (approximately)."""
    if p >= 2.0:
        return np.zeros_like(x)
    a = np.abs(x)
    return np.sign(x) * np.maximum(a - (1.0 / beta) * np.power(a + 1e-8, p - 1.0), 0.0)


def quantize_hqq(
    w: np.ndarray,
    bits: int = 4,
    block: int = 32,
    sym: bool = True,
    *,
    iters: int = 20,
    p: float = 0.7,
    beta: float = 10.0,
    kappa: float = 1.01,
) -> Quantized:
    """RTN, then HQQ-style refinement of scales and zero points (rule 2)."""
    _check(bits, block)
    x, mask = _blocks(w, block)
    m = mask.astype(np.float32)[None]  # ragged tail entries weigh nothing
    scale, zero = _rtn_params(x, bits, sym)
    q = _codes(x, scale, zero, bits)

    def err(q, scale, zero):
        d = (_dq_blocks(q, scale, zero, bits) - x) * m
        return np.einsum("rnb,rnb->rn", d, d)

    best_q, best_s, best_z = q, scale, zero
    best = err(q, scale, zero)
    qmax = (1 << bits) - 1
    # Scale relative to the block's spread so beta's meaning does not depend on the magnitudes.
    spread = np.maximum(np.abs(x).max(axis=-1, keepdims=True), 1e-12)
    for _ in range(iters):
        recon = _dq_blocks(q, scale, zero, bits)
        e = _shrink_lp((x - recon) / spread, beta, p) * spread
        target = x - e
        c = (q.view(np.uint8) if zero is not None else q).astype(np.float32)
        if zero is None:
            num = np.einsum("rnb,rnb->rn", target * m, c)
            den = np.einsum("rnb,rnb->rn", c * m, c)
            new_s = np.where(den > 0, num / np.maximum(den, 1e-30), scale)
            new_z = None
        else:
            # least squares target ~ a * c + b per block, then zero = -b / a (integer, in range)
            n = m.sum(axis=-1)
            sc, st = (c * m).sum(-1), (target * m).sum(-1)
            scc = np.einsum("rnb,rnb->rn", c * m, c)
            sct = np.einsum("rnb,rnb->rn", c * m, target)
            det = n * scc - sc * sc
            a = np.where(det > 0, (n * sct - sc * st) / np.where(det > 0, det, 1.0), scale)
            a = np.where(a > 0, a, scale)
            b = (st - a * sc) / np.maximum(n, 1)
            new_z = np.clip(np.rint(-b / a), 0, qmax)
            cz = c - new_z[..., None]
            num = np.einsum("rnb,rnb->rn", target * m, cz)
            den = np.einsum("rnb,rnb->rn", cz * m, cz)
            new_s = np.where(den > 0, num / np.maximum(den, 1e-30), a)
            new_s = np.where(new_s > 0, new_s, scale)
        scale = _f16(np.where(new_s == 0, scale, new_s).astype(np.float32))
        zero = None if new_z is None else new_z.astype(np.float32)
        q = _codes(x, scale, zero, bits)
        cur = err(q, scale, zero)
        better = cur < best
        best_q = np.where(better[..., None], q, best_q)
        best_s = np.where(better, scale, best_s)
        if zero is not None and best_z is not None:
            best_z = np.asarray(np.where(better, zero, best_z), dtype=np.float32)
        best = np.minimum(cur, best)
        beta *= kappa
    return _finish(best_q, best_s, best_z, bits, block, w.shape[1])


def quantize_gptq(
    w: np.ndarray,
    hessian: np.ndarray,
    bits: int = 4,
    block: int = 32,
    sym: bool = True,
    *,
    damp: float = 0.01,
    batch: int = 128,
) -> Quantized:
    """GPTQ (rule 3) of ``w [R, K]`` (rows: output channels) with ``hessian [K, K]``."""
    _check(bits, block)
    r, k = w.shape
    if hessian.shape != (k, k):
        raise InputError(f"hessian {hessian.shape} does not fit weight {w.shape}", where="pass blockwise")
    W = np.array(w, dtype=np.float64)
    H = np.array(hessian, dtype=np.float64)
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H[np.diag_indices(k)] += damp * float(np.mean(np.diag(H)))
    try:
        L = np.linalg.cholesky(np.linalg.inv(H))  # lower; its transpose is the upper factor
    except np.linalg.LinAlgError:
        raise InputError(
            "the activations' Hessian is not positive definite", where="pass blockwise", hint="raise damp"
        ) from None
    Hinv = L.T
    nb = -(-k // block)
    scale = np.ones((r, nb), dtype=np.float32)
    zero = None if sym else np.zeros((r, nb), dtype=np.float32)
    Q = np.zeros((r, k), dtype=np.int16)
    batch = max(block, batch // block * block)
    for i1 in range(0, k, batch):
        i2 = min(i1 + batch, k)
        W1 = W[:, i1:i2].copy()
        E1 = np.zeros_like(W1)
        Hb = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % block == 0:
                g = col // block
                seg = W1[:, i : i + block].astype(np.float32)[:, None, :]
                s, z = _rtn_params(seg, bits, sym)
                scale[:, g] = s[:, 0]
                if zero is not None and z is not None:
                    zero[:, g] = z[:, 0]
            g = col // block
            s = scale[:, g].astype(np.float64)
            v = np.rint(W1[:, i] / s)
            if sym:
                v = np.clip(v, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)
                dq = v * s
            else:
                assert zero is not None
                v = np.clip(v + zero[:, g], 0, (1 << bits) - 1)
                dq = (v - zero[:, g]) * s
            Q[:, col] = v
            e = (W1[:, i] - dq) / Hb[i, i]
            W1[:, i:] -= np.outer(e, Hb[i, i:])
            E1[:, i] = e
        W[:, i2:] -= E1 @ Hinv[i1:i2, i2:]
    codes = Q.astype(np.uint8) if not sym else Q.astype(np.int8)
    return Quantized(codes, scale, None if zero is None else zero.astype(np.uint8), bits, block)


def quantize(
    w: np.ndarray,
    bits: int = 4,
    block: int = 32,
    sym: bool = True,
    method: Method = "rtn",
    hessian: np.ndarray | None = None,
    **options,
) -> Quantized:
    """One entry point for the three methods."""
    if method == "rtn":
        return quantize_rtn(w, bits, block, sym)
    if method == "hqq":
        return quantize_hqq(w, bits, block, sym, **options)
    if method == "gptq":
        if hessian is None:
            raise InputError("gptq needs activations", where="pass blockwise", hint="give --data")
        return quantize_gptq(w, hessian, bits, block, sym, **options)
    raise InputError(f"unknown method {method!r}", where="pass blockwise", hint="use rtn, hqq or gptq")


# --- the graph rewrite ----------------------------------------------------------------------


# Attributes added after opset 18 whose defaults give an older node's meaning (rule 5).
_NEUTRAL_ATTRS = {
    ("Cast", "saturate"),
    ("CastLike", "saturate"),
    ("QuantizeLinear", "saturate"),
    ("QuantizeLinear", "block_size"),
    ("QuantizeLinear", "output_dtype"),
    ("DequantizeLinear", "block_size"),
}


def _schema_terms(schema) -> tuple[dict, list, list, dict]:
    attrs = {
        a.name: (a.type, a.default_value.SerializeToString() if a.default_value else b"")
        for a in schema.attributes.values()
    }
    inputs = [(i.name, i.option) for i in schema.inputs]
    outputs = [(o.name, o.option) for o in schema.outputs]
    types = {t.type_param_str: set(t.allowed_type_strs) for t in schema.type_constraints}
    return attrs, inputs, outputs, types


def _same_meaning(op: str, current: int, target: int) -> bool:
    """Rule 5: every version of ``op`` after ``current`` up to ``target`` keeps the inputs,
    outputs and attributes (or adds a neutral one) and only widens the type constraints."""
    import onnx.defs

    prev = onnx.defs.get_schema(op, current, "")
    later = []
    version = target
    while True:
        schema = onnx.defs.get_schema(op, version, "")
        if schema.since_version <= prev.since_version:
            break
        later.append(schema)
        version = schema.since_version - 1
    for schema in reversed(later):
        a0, i0, o0, t0 = _schema_terms(prev)
        a1, i1, o1, t1 = _schema_terms(schema)
        added = set(a1) - set(a0)
        if i0 != i1 or o0 != o1 or set(a0) - set(a1) or any((op, n) not in _NEUTRAL_ATTRS for n in added):
            return False
        if any(a0[n] != a1[n] for n in a0):
            return False
        if any(k not in t1 or not v <= t1[k] for k, v in t0.items()):
            return False
        prev = schema
    return True


def _opset_check(model: ir.Model) -> None:
    """Rule 5: raise the default opset to 21 when no op's meaning changes on the way."""
    import onnx.defs

    current = model.opset_imports.get("", model.graph.opset_imports.get("", 1))
    if current >= BLOCK_OPSET:
        return
    changed = set()
    for node in model.graph.all_nodes() if hasattr(model.graph, "all_nodes") else model.graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            a = onnx.defs.get_schema(node.op_type, current, "").since_version
            b = onnx.defs.get_schema(node.op_type, BLOCK_OPSET, "").since_version
        except onnx.defs.SchemaError:
            changed.add(node.op_type)
            continue
        if a != b and not _same_meaning(node.op_type, current, BLOCK_OPSET):
            changed.add(node.op_type)
    if changed:
        raise InputError(
            f"blockwise needs opset {BLOCK_OPSET} (DequantizeLinear block_size) and the model is at opset "
            f"{current}, where {', '.join(sorted(show(c) for c in changed))} differ from opset {BLOCK_OPSET}",
            where="pass blockwise",
            hint="re-export the model at opset 21",
        )
    model.opset_imports[""] = BLOCK_OPSET
    model.graph.opset_imports[""] = BLOCK_OPSET


def _record_activations(model: ir.Model, refs: list[WeightRef], data: dict) -> dict[str, np.ndarray]:
    """Rule 3: H = 2 X^T X / n of each weight's activation input, from the reference executor."""
    from mconv.engines.reference.executor import Executor

    names = {}
    for ref in refs:
        x = ref.node.inputs[0]
        if x is not None and x.name:
            names[ref.name] = x.name
    ex = Executor(model)
    feeds = {k: v for k, v in data.items() if k != "labels"}
    for k, v in feeds.items():
        check_finite(v, k, where="pass blockwise")
    env = ex.run(feeds, intermediates=True)
    hessians = {}
    for ref in refs:
        x = env.get(names.get(ref.name, ""))
        if x is None:
            continue
        k = ref.shape[ref.in_axis]
        x2 = np.asarray(x, dtype=np.float64).reshape(-1, k)
        hessians[ref.name] = 2.0 * (x2.T @ x2) / max(x2.shape[0], 1)
    return hessians


def _int4_tensor(codes: np.ndarray, signed: bool, name: str) -> ir.Tensor:
    import ml_dtypes

    dtype = ml_dtypes.int4 if signed else ml_dtypes.uint4
    arr = codes.astype(np.int8 if signed else np.uint8).astype(dtype)
    return ir.Tensor(arr, name=name)


def _code_tensor(codes: np.ndarray, bits: int, signed: bool, name: str) -> ir.Tensor:
    if bits == 4:
        return _int4_tensor(codes, signed, name)
    return ir.Tensor(codes.astype(np.int8 if signed else np.uint8), name=name)


@register_pass("blockwise")
class Blockwise(Pass):
    """Blockwise int4/int8 quantization of MatMul/Gemm weights and embedding tables, read through
    DequantizeLinear(block_size) (rules in the module doc)."""

    lossless = False

    @dataclass
    class Config:
        bits: int = bounded(4, 2, 8)
        block: int = bounded(32, 8, 1 << 16)
        sym: bool = True
        method: Method = "rtn"
        iters: int = bounded(20, 0, 10**4)  # hqq
        p: float = bounded(0.7, 0, None, lo_open=True)  # hqq's lp norm
        damp: float = bounded(0.01, 0, None)  # gptq
        min_elements: int = bounded(1024, 0, None)
        skip: bool = False
        op_types: list[str] = field(default_factory=lambda: ["MatMul", "Gemm", "Gather"])  # rule 6

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        refs = [r for r in weight_refs(model, ("MatMul", "Gemm")) if len(r.shape) == 2]
        refs += gather_tables(model, refs)  # rule 6
        chosen = []
        for ref in refs:
            cfg = ctx.config_for(ref.node) if ctx.spec is not None else config
            if cfg.skip or ref.node.op_type not in cfg.op_types or int(np.prod(ref.shape)) < cfg.min_elements:
                continue
            if cfg.bits not in (4, 8):
                raise InputError(
                    f"bits={cfg.bits}",
                    where=f"node {show(ref.node.name)}",
                    hint="ONNX blockwise takes 4 or 8",
                )
            _check(cfg.bits, cfg.block)
            k = ref.shape[ref.in_axis]
            if cfg.block > 2 * k:  # a row is padded to a whole block: more would mostly be padding
                raise InputError(
                    f"block={cfg.block} is longer than twice the rows of {show(ref.name)} ({k} values)",
                    where=f"node {show(ref.node.name)}",
                    hint=f"use a block of at most {2 * k}, or exclude the node (op_name override skip=true)",
                )
            chosen.append((ref, cfg))
        if not chosen:
            return self.report(False, notes=["no weight to quantize"])
        hessians: dict[str, np.ndarray] = {}
        if any(cfg.method == "gptq" for _, cfg in chosen):
            if not ctx.data:
                raise InputError(
                    "blockwise(method=gptq) needs activations",
                    where="pass blockwise",
                    hint="give --data FILE.npz",
                )
            gptq = [r for r, c in chosen if c.method == "gptq" and r.node.op_type != "Gather"]
            hessians = _record_activations(model, gptq, ctx.data)
        _opset_check(model)
        tensors = []
        for i, (ref, cfg) in enumerate(chosen):
            ctx.tick(f"blockwise {ref.name}", i, len(chosen))
            src = ref.array()
            w = src.astype(np.float32)
            rows = np.moveaxis(w, ref.in_axis, -1)  # [out, in]
            method = cfg.method
            if method == "gptq" and ref.node.op_type == "Gather":
                method = "rtn"  # rule 6: a lookup has no activations to weigh the error by
            options: dict = {}
            if method == "hqq":
                options = {"iters": cfg.iters, "p": cfg.p}
            elif method == "gptq":
                options = {"damp": cfg.damp}
            qz = quantize(rows, cfg.bits, cfg.block, cfg.sym, method, hessians.get(ref.name), **options)
            approx = qz.dequantize()
            row = {
                "name": ref.name,
                "node": ref.node.name,
                "op": ref.node.op_type,
                "shape": list(w.shape),
                "bits": cfg.bits,
                "block": cfg.block,
                "sym": cfg.sym,
                "method": method,
                "bits_per_weight": round(qz.bits_per_weight(), 4),
                "mse": squared_error(rows, approx) / max(rows.size, 1),
                "snr_db": snr_db(rows, approx),
            }
            if ref.name in hessians:
                h = hessians[ref.name]
                d = (approx - rows).astype(np.float64)
                noise = float(np.einsum("rk,kl,rl->", d, h, d))
                signal = float(np.einsum("rk,kl,rl->", rows.astype(np.float64), h, rows.astype(np.float64)))
                row["output_snr_db"] = 10 * np.log10(signal / noise) if noise > 0 else float("inf")
            tensors.append(row)
            # DequantizeLinear's output has the scale's type: float16 for a float16 weight (scales
            # are float16-exact), float32 otherwise (opset 21 has no double scale)
            self._rewrite(model, ref, qz, np.dtype(np.float16 if src.dtype == np.float16 else np.float32))
        notes = [f"{len(tensors)} tensors quantized to int{chosen[0][1].bits} blocks (opset {BLOCK_OPSET})"]
        return self.report(True, notes=notes, tensors=tensors)

    @staticmethod
    def _rewrite(model: ir.Model, ref: WeightRef, qz: Quantized, dtype: np.dtype) -> None:
        """Replace the weight initializer by codes, scales, zero points and a DequantizeLinear."""
        graph = model.graph
        name = ref.name
        codes = np.moveaxis(qz.q, -1, ref.in_axis)
        scale = np.moveaxis(qz.scale, -1, ref.in_axis).astype(dtype)
        sym = qz.zero is None
        q_val = ir.Value(name=f"{name}_q")
        q_val.const_value = _code_tensor(codes, qz.bits, sym, f"{name}_q")
        q_val.shape = ir.Shape(codes.shape)
        q_val.type = ir.TensorType(q_val.const_value.dtype)
        s_val = ir.Value(
            name=f"{name}_scale", shape=ir.Shape(scale.shape), type=ir.TensorType(ir.DataType.FLOAT)
        )
        s_val.const_value = ir.Tensor(np.ascontiguousarray(scale), name=f"{name}_scale")
        s_val.type = ir.TensorType(s_val.const_value.dtype)
        inputs = [q_val, s_val]
        if not sym:
            assert qz.zero is not None
            zero = np.moveaxis(qz.zero, -1, ref.in_axis)
            z_val = ir.Value(name=f"{name}_zero", shape=ir.Shape(zero.shape))
            z_val.const_value = _code_tensor(zero, qz.bits, False, f"{name}_zero")
            z_val.type = ir.TensorType(z_val.const_value.dtype)
            inputs.append(z_val)
        for v in inputs:
            graph.register_initializer(v)
        node = ir.Node(
            "",
            "DequantizeLinear",
            inputs,
            attributes=[ir.AttrInt64("axis", ref.in_axis), ir.AttrInt64("block_size", qz.block)],
            name=f"{name}_dequantize",
            num_outputs=1,
        )
        out = node.outputs[0]
        old = ref.value
        out.name = f"{name}_dq"
        out.shape = old.shape
        out.type = old.type
        old.replace_all_uses_with(out)
        first = min(
            (n for n in graph if any(i is out for i in n.inputs)),
            key=lambda n: list(graph).index(n),
            default=None,
        )
        if first is not None:
            graph.insert_before(first, node)
        else:
            graph.append(node)
        del graph.initializers[name]
        out.name = name
        node.metadata_props[BLOCKWISE_KEY] = json.dumps(
            {"bits": qz.bits, "block": qz.block, "sym": sym, "axis": ref.in_axis}, sort_keys=True
        )
