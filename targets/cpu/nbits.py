"""The cpu target's ``matmul_nbits`` rewrite: blockwise int4 MatMul as ONNX Runtime's MatMulNBits.

The ``blockwise`` pass writes a 4-bit weight as ``W = DequantizeLinear(W_q int4|uint4[K, N],
W_scale[ceil(K/B), N], [W_zero], axis=0, block_size=B)`` feeding ``MatMul(X, W)``. ONNX Runtime's
contrib op ``com.microsoft.MatMulNBits`` computes the same product from packed codes (the
layout is the schema's, as ONNX Runtime 1.32 documents it):

- ``B``: uint8 ``[N, k_blocks, B/2]``, the codes of output channel ``n`` along K, two per byte,
  the first in the low 4 bits; ``k_blocks = ceil(K / B)``. A ragged last block is padded with
  its zero point (the padding is never read: ``K`` bounds the product).
- ``scales``: ``[N, k_blocks]``, the dtype of ``X``.
- ``zero_points``: uint8 ``[N, ceil(k_blocks / 2)]``, packed like ``B``; left out when every
  zero point is 8 (the op's default, 2^(bits-1)).
- attributes ``K``, ``N``, ``bits=4``, ``block_size=B``, ``accuracy_level`` (0: X is not
  quantized, so the result is DequantizeLinear + MatMul up to float summation order).

Codes are made unsigned: an int4 code ``q`` with zero point ``z`` (0 when absent) becomes
``q + 8`` with zero point ``z + 8``; a uint4 code keeps its value and its zero point (0 when
absent, written explicitly since the op's default is 8).

Rules:
1. Rewritten only when all of this holds, else the pattern is left as it is: the
   DequantizeLinear (default domain) has constant inputs (weights of the bundle) of a 2-D int4
   or uint4 code tensor, scales ``[k_blocks, N]`` float32 or float16 and zero points of the
   codes' dtype and shape of the scales; ``axis`` is 0 (or -2), ``block_size`` a power of two
   >= 16, no other attribute; its output is no graph output, is used by no subgraph, and every
   user is a default-domain MatMul reading it as its second input, whose first input or output
   has a known rank >= 2 (MatMulNBits has no 1-D ``A``).
2. The DequantizeLinear goes; each of its MatMuls becomes a MatMulNBits with the MatMul's name,
   inputs ``X`` and outputs. The code, scale and zero-point weights go when nothing else uses
   them; the packed tensors are new weights named ``<codes>.nbits``, ``<scale>.nbits``,
   ``<zero>.nbits`` (a suffix ``_1``, ``_2``, ... when taken). ``value_info`` follows (stale
   entries out, the new weights typed). The ``com.microsoft`` opset 1 is imported.
3. Nothing else in the graph changes; the rewrite is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

DOMAIN = "com.microsoft"
OP = "MatMulNBits"
BITS = 4
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_INT4, _UINT4 = np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """``codes`` (values 0..15, last axis even) as uint8, two per byte, the first in the low bits."""
    c = codes.astype(np.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def pack_weight(
    codes: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, block: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """MatMulNBits' ``B``, ``scales`` and ``zero_points`` (None: all 8) for DequantizeLinear's
    ``codes`` (int4/uint4 ``[K, N]``), ``scale`` and ``zero`` (``[k_blocks, N]``, axis 0)."""
    k, n = codes.shape
    nb = -(-k // block)
    if codes.dtype == _INT4:
        u = codes.astype(np.int16) + 8
        z = (zero.astype(np.int16) if zero is not None else np.zeros((nb, n), np.int16)) + 8
    else:
        u = codes.astype(np.int16)
        z = zero.astype(np.int16) if zero is not None else np.zeros((nb, n), np.int16)
    u_t = np.ascontiguousarray(u.T)  # [N, K]
    z_t = np.ascontiguousarray(z.T)  # [N, nb]
    if nb * block != k:
        pad = np.repeat(z_t[:, -1:], nb * block - k, axis=1)
        u_t = np.concatenate([u_t, pad], axis=1)
    packed = pack_nibbles(u_t.reshape(n, nb, block))
    scales = np.ascontiguousarray(scale.T)
    if np.all(z_t == 8):
        return packed, scales, None
    if nb % 2:
        z_t = np.concatenate([z_t, np.zeros((n, 1), np.int16)], axis=1)
    return packed, scales, pack_nibbles(z_t)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _names_in_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of a subgraph (at any depth) of ``graph`` reads."""
    names: set[str] = set()
    stack = [g for node in graph.node for g in _subgraphs(node)]
    while stack:
        g = stack.pop()
        for node in g.node:
            names.update(node.input)
            stack.extend(_subgraphs(node))
    return names


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    ranks = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            ranks[vi.name] = len(t.shape.dim)
    return ranks


def _attrs(node: onnx.NodeProto) -> dict[str, onnx.AttributeProto]:
    return {a.name: a for a in node.attribute}


def _block(node: onnx.NodeProto) -> int | None:
    """The block size of a DequantizeLinear along axis 0 that MatMulNBits can take, else None."""
    attrs = _attrs(node)
    if set(attrs) - {"axis", "block_size"}:
        return None
    axis = attrs["axis"].i if "axis" in attrs else 1
    block = attrs["block_size"].i if "block_size" in attrs else 0
    if axis not in (0, -2) or block < 16 or block & (block - 1):
        return None
    return int(block)


def rewrite(
    proto: onnx.ModelProto, weights: list[tuple[str, np.ndarray]], accuracy_level: int = 0
) -> tuple[list[tuple[str, np.ndarray]], int]:
    """Rewrite ``proto`` (a graph without initializers, ``weights`` its weights) in place as the
    module doc says; the new weight list and the number of MatMuls rewritten."""
    graph = proto.graph
    wmap = dict(weights)
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            users.setdefault(name, []).append((node, i))
    taken = set(wmap) | {n for node in graph.node for n in node.output} | {v.name for v in graph.input}
    blocked = _names_in_subgraphs(graph) | {o.name for o in graph.output}
    fed = {v.name for v in graph.input}  # an initializer listed as an input may be overridden
    ranks = _ranks(graph)
    removed_nodes: list[onnx.NodeProto] = []
    new_weights: dict[str, np.ndarray] = {}
    dropped: set[str] = set()
    count = 0

    from mconv.edit.rewrite import fresh_name

    def fresh(base: str) -> str:
        return fresh_name(base, taken)

    for node in list(graph.node):
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        block = _block(node)
        ins = list(node.input)
        if block is None or len(ins) not in (2, 3) or not ins[1]:
            continue
        if not all(n in wmap and n not in fed for n in ins if n):
            continue
        codes, scale = wmap[ins[0]], wmap[ins[1]]
        zero = wmap[ins[2]] if len(ins) == 3 and ins[2] else None
        if codes.dtype not in (_INT4, _UINT4) or codes.ndim != 2 or scale.dtype not in _FLOATS:
            continue
        k, n = codes.shape
        nb = -(-k // block)
        if scale.shape != (nb, n) or (
            zero is not None and (zero.dtype != codes.dtype or zero.shape != (nb, n))
        ):
            continue
        out = node.output[0]
        uses = users.get(out, [])
        if out in blocked or not uses:
            continue
        if not all(
            u.op_type == "MatMul"
            and u.domain in ("", "ai.onnx")
            and i == 1
            and u.input[0] != out
            and max(ranks.get(u.input[0], 0), ranks.get(u.output[0], 0)) >= 2
            for u, i in uses
        ):
            continue
        packed, scales, zps = pack_weight(codes, scale, zero, block)
        b_name = fresh(f"{ins[0]}.nbits")
        s_name = fresh(f"{ins[1]}.nbits")
        new_weights[b_name], new_weights[s_name] = packed, scales
        inputs = [b_name, s_name]
        if zps is not None:
            z_name = fresh(f"{ins[2]}.nbits" if zero is not None else f"{ins[0]}_zero.nbits")
            new_weights[z_name] = zps
            inputs.append(z_name)
        for user, _ in uses:
            fused = helper.make_node(
                OP,
                [user.input[0], *inputs],
                list(user.output),
                name=user.name,
                domain=DOMAIN,
                K=k,
                N=n,
                bits=BITS,
                block_size=block,
                accuracy_level=accuracy_level,
            )
            user.CopyFrom(fused)
            count += 1
        removed_nodes.append(node)
        dropped.add(out)
        for name in ins:
            if name and all(u is node for u, _ in users.get(name, [])) and name not in blocked:
                dropped.add(name)
    if not count:
        return weights, 0
    for node in removed_nodes:
        graph.node.remove(node)
    keep_vi = [vi for vi in graph.value_info if vi.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(keep_vi)
    for name, arr in new_weights.items():
        elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
        graph.value_info.append(helper.make_tensor_value_info(name, elem, list(arr.shape)))
    if not any(o.domain == DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    kept = [(name, arr) for name, arr in weights if name not in dropped]
    return kept + list(new_weights.items()), count
