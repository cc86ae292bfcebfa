"""Expression text the two dialects spell alike: float literals and the fused activations.

MSL and WGSL share C's operators, ``f``-suffixed float literals and most math builtins; they
differ, for the activations, only in a conditional (``c ? a : b`` against ``select(b, a, c)``),
the absolute value (``fabs`` / ``abs``), round-half-to-even (``rint`` / ``round``) and whether
a chained activation's inner expression is parenthesized. A :class:`Spelling` names those; each
formula is written once here (:func:`activation_expr`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import Activation, flit

__all__ = ["BINARY", "MSL", "WGSL", "Spelling", "activation_expr", "is_inf_expr", "wrap_expr"]


@dataclass(frozen=True)
class Spelling:
    """How a dialect writes what the activation formulas need."""

    select: Callable[[str, str, str], str]  # (condition, if true, if false) -> expression
    fabs: str
    rint: str
    paren_chain: bool  # a chained activation's inner expression in parentheses


MSL = Spelling(lambda c, a, b: f"({c} ? {a} : {b})", "fabs", "rint", False)
WGSL = Spelling(lambda c, a, b: f"select({b}, {a}, {c})", "abs", "round", True)


def activation_expr(act: Activation | None, v: str, s: Spelling) -> str:
    """The expression of ``act`` applied to the float ``v``, spelled ``s``."""
    if act is None:
        return v
    if act.then is not None:
        base = Activation(act.kind.split("+")[0], act.params, act.nodes)
        inner = activation_expr(base, v, s)
        return activation_expr(act.then, f"({inner})" if s.paren_chain else inner, s)
    k, p = act.kind, act.params
    if k == "relu":
        return f"max({v}, 0.0f)"
    if k == "clip":
        lo, hi = p
        out = v
        if np.isfinite(lo):
            out = f"max({out}, {flit(lo)})"
        if np.isfinite(hi):
            out = f"min({out}, {flit(hi)})"
        return out
    if k == "leaky":
        return s.select(f"{v} >= 0.0f", v, f"{flit(p[0])} * {v}")
    if k == "sigmoid":
        return f"(1.0f / (1.0f + exp(-{v})))"
    if k == "tanh":
        return f"tanh({v})"
    if k == "gelu":
        return f"(0.5f * {v} * (1.0f + mconv_erf({v} * 0.70710678118654752f)))"
    if k == "gelu_tanh":
        return f"(0.5f * {v} * (1.0f + tanh(0.79788456080286536f * ({v} + 0.044715f * {v} * {v} * {v}))))"
    if k == "swish":
        return f"({v} / (1.0f + exp(-{v})))"
    if k == "hardsigmoid":
        return f"min(max({flit(p[0])} * {v} + {flit(p[1])}, 0.0f), 1.0f)"
    if k == "hardswish":
        return f"({v} * min(max({v} * {flit(1 / 6)} + 0.5f, 0.0f), 1.0f))"
    if k == "elu":
        return s.select(f"{v} >= 0.0f", v, f"{flit(p[0])} * (exp({v}) - 1.0f)")
    if k == "celu":
        return f"(max({v}, 0.0f) + min(0.0f, {flit(p[0])} * (exp({v} / {flit(p[0])}) - 1.0f)))"
    if k == "selu":
        a, g = p
        return s.select(f"{v} > 0.0f", f"{flit(g)} * {v}", f"{flit(g * a)} * (exp({v}) - 1.0f)")
    if k == "softplus":  # log(1 + e^v) without overflow
        return f"(max({v}, 0.0f) + log(1.0f + exp(-{s.fabs}({v}))))"
    if k == "softsign":
        return f"({v} / (1.0f + {s.fabs}({v})))"
    if k == "quantize":  # QuantizeLinear per tensor: scale, zero point, code range; half to even
        sc, zp, lo, hi = p
        return f"min(max({s.rint}({v} / {flit(sc)}) + {flit(zp)}, {flit(lo)}), {flit(hi)})"
    if k == "dequantize":  # DequantizeLinear per tensor: scale, zero point
        return f"(({v} - {flit(p[1])}) * {flit(p[0])})"
    if k in ("mul", "add", "div"):  # x * c, x + c, x / c by a constant scalar (a literal)
        return f"({v} {dict(mul='*', add='+', div='/')[k]} {flit(p[0])})"
    if k == "mish":
        return f"({v} * tanh(max({v}, 0.0f) + log(1.0f + exp(-{s.fabs}({v})))))"
    simple = {
        "neg": "(-{v})",
        "exp": "exp({v})",
        "log": "log({v})",
        "sqrt": "sqrt({v})",
        "abs": s.fabs + "({v})",
        "reciprocal": "(1.0f / {v})",
        "erf": "mconv_erf({v})",
        "floor": "floor({v})",
        "ceil": "ceil({v})",
        "round": s.rint + "({v})",  # ONNX Round: half to even
        "sin": "sin({v})",
        "cos": "cos({v})",
        "identity": "{v}",
    }
    if k in simple:
        return simple[k].format(v=v)
    raise ValueError(f"unknown activation {k}")


BINARY = {
    "Add": "a + b",
    "Sum": "a + b",
    "Sub": "a - b",
    "Mul": "a * b",
    "Div": "a / b",
    "Max": "max(a, b)",
    "Min": "min(a, b)",
    "Mean": "(a + b) * 0.5f",
    "Pow": "mconv_pow(a, b)",
    "PRelu": "(a >= 0.0f ? a : a * b)",
}


def is_inf_expr(node: ir.Node, inf_test: str) -> str:
    """IsInf's 0/1 expression of ``a`` for the node's detect_negative / detect_positive."""
    neg = node.attributes.get_int("detect_negative", 1)
    pos = node.attributes.get_int("detect_positive", 1)
    if neg and pos:
        test = inf_test
    elif neg or pos:
        test = f"({inf_test} && a {'<' if neg else '>'} 0.0f)"
    else:
        return "0.0f"
    return test


def wrap_expr(bits: int, signed: bool) -> str:
    """``a`` (an integer held as a float) wrapped to a ``bits``-bit integer type, two's
    complement when ``signed``; MSL and WGSL spell it alike, so both targets take it here."""
    span = flit(2**bits)
    if signed:
        return f"(a - {span} * floor((a + {flit(2 ** (bits - 1))}) / {span}))"
    return f"(a - {span} * floor(a / {span}))"
