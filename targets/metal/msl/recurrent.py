"""Recurrent kernels: LSTM, GRU and RNN (the reference executor's ``recurrent`` family).

Rules (ONNX notation, as ``engines/reference/ops/recurrent.py``):

1. One thread per (batch entry, direction), grid ``(B, D, 1)``: the thread loops over time and
   keeps its hidden (and cell) state in thread memory, in float, so a step reads the previous
   step's whole state without barriers or threadgroup memory (kernel convention 3). The gate
   pre-activations of a step are float sums of ``X W^T + H R^T + Wb + Rb`` over the stored weights.
2. One kernel per output that is used (Y, Y_h, Y_c), each the same recurrence writing its own
   output (``<kernel>_y``, ``_yh``, ``_yc``); a node whose outputs are all unused has no kernel.
3. Gate order: RNN ``i``; GRU ``z, r, h``; LSTM ``i, o, f, c`` (peepholes ``i, o, f``). Missing B,
   initial_h, initial_c, P are zeros. ``direction`` forward, reverse, bidirectional; ``layout``
   0 and 1; ``activations`` with ``activation_alpha``/``activation_beta`` consumed in order as
   the reference executor and ONNX Runtime do; ``clip``; LSTM ``input_forget``; GRU
   ``linear_before_reset``.
4. ``sequence_lens`` as a constant is baked (past a sequence's length Y is 0 and the state is
   frozen; the reverse direction reads each sequence backwards within its length); given at run
   time it is refused (the int values would need an integer buffer), named with the reason.
5. Hidden sizes up to 1024 (the per-thread state arrays); larger is refused.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.msl import Activation, KernelSource, LowerContext, flit, register
from mconv.targets.metal.msl.conv import constants

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_NEEDS_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
_NEEDS_BETA = {"affine", "scaledtanh", "hardsigmoid"}
_DEFAULT_ALPHA = {
    "affine": 1.0,
    "leakyrelu": 0.01,
    "thresholdedrelu": 1.0,
    "scaledtanh": 1.0,
    "hardsigmoid": 0.2,
    "elu": 1.0,
}
_DEFAULT_BETA = {"affine": 0.0, "scaledtanh": 1.0, "hardsigmoid": 0.5}
MAX_HIDDEN = 1024


def _act_expr(name: str, alpha: float | None, beta: float | None, v: str) -> str:
    """The MSL expression of one recurrent activation applied to the float ``v``."""
    key = name.lower()
    a = _DEFAULT_ALPHA.get(key, 0.0) if alpha is None else alpha
    b = _DEFAULT_BETA.get(key, 0.0) if beta is None else beta
    if key == "sigmoid":
        return f"(1.0f / (1.0f + exp(-({v}))))"
    if key == "tanh":
        return f"tanh({v})"
    if key == "relu":
        return f"max({v}, 0.0f)"
    if key == "affine":
        return f"({flit(a)} * ({v}) + {flit(b)})"
    if key == "leakyrelu":
        return f"(({v}) >= 0.0f ? ({v}) : {flit(a)} * ({v}))"
    if key == "thresholdedrelu":
        return f"(({v}) > {flit(a)} ? ({v}) : 0.0f)"
    if key == "scaledtanh":
        return f"({flit(a)} * tanh({flit(b)} * ({v})))"
    if key == "hardsigmoid":
        return f"min(max({flit(a)} * ({v}) + {flit(b)}, 0.0f), 1.0f)"
    if key == "elu":
        return f"(({v}) > 0.0f ? ({v}) : {flit(a)} * (exp(min({v}, 0.0f)) - 1.0f))"
    if key == "softsign":
        return f"(({v}) / (1.0f + fabs({v})))"
    if key == "softplus":
        return f"(max({v}, 0.0f) + log(1.0f + exp(-fabs({v}))))"
    raise ValueError(f"unknown recurrent activation {name!r}")


def _activations(node: ir.Node, num_dir: int) -> list[list[tuple[str, float | None, float | None]]]:
    """Per direction, the (name, alpha, beta) of each activation (rule 3)."""
    op = "LSTM" if node.op_type == "DynamicQuantizeLSTM" else node.op_type
    per = len(_DEFAULT_ACTS[op])
    attr = node.attributes.get("activations")
    names = list(attr.as_strings()) if attr is not None else _DEFAULT_ACTS[op] * num_dir
    if len(names) == per and num_dir == 2:
        names = names * 2
    a_attr, b_attr = node.attributes.get("activation_alpha"), node.attributes.get("activation_beta")
    alphas = list(a_attr.as_floats()) if a_attr is not None else []
    betas = list(b_attr.as_floats()) if b_attr is not None else []
    acts = []
    for name in names:
        a = alphas.pop(0) if name.lower() in _NEEDS_ALPHA and alphas else None
        b = betas.pop(0) if name.lower() in _NEEDS_BETA and betas else None
        acts.append((name, a, b))
    return [acts[d * per : (d + 1) * per] for d in range(num_dir)]


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i] is not None else None


def check_recurrent(ctx: LowerContext, node: ir.Node) -> str | None:
    """Why the node does not lower (rules 4-5), or None."""
    direction = node.attributes.get_string("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        return f"direction {direction!r}"
    for i in (1, 2):
        w = _input(node, i)
        if w is None or w.shape is None or not all(isinstance(d, int) for d in w.shape) or len(w.shape) != 3:
            return "W and R need static 3-D shapes"
    for i in (3, 5, 6, 7):
        v = _input(node, i)
        if v is not None and (v.shape is None or not all(isinstance(d, int) for d in v.shape)):
            return "input shape not static"
    lens = _input(node, 4)
    if lens is not None and lens.const_value is None:
        return "sequence_lens given at run time (give it as a constant, or drop it for full-length sequences)"
    R = _input(node, 2)
    assert R is not None
    hidden = ctx.shape(R)[-1]
    if hidden > MAX_HIDDEN:
        return f"hidden size {hidden} over {MAX_HIDDEN}"
    num_dir = 2 if direction == "bidirectional" else 1
    acts = _activations(node, num_dir)
    if any(len(a) != len(_DEFAULT_ACTS[node.op_type]) for a in acts):
        return "activations: wrong count"
    for per in acts:
        for name, _, _ in per:
            try:
                _act_expr(name, None, None, "v")
            except ValueError:
                return f"activation {name!r}"
    return None


@register("LSTM", "GRU", "RNN", check=check_recurrent)
def lower_recurrent(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> list[KernelSource]:
    op = node.op_type
    G = _GATES[op]
    x, W, R = node.inputs[0], node.inputs[1], node.inputs[2]
    assert x is not None and W is not None and R is not None
    layout = node.attributes.get_int("layout", 0)
    xs = ctx.shape(x)
    T, B = (xs[1], xs[0]) if layout else (xs[0], xs[1])
    I = xs[2]
    D, _, H = ctx.shape(R)
    direction = node.attributes.get_string("direction", "forward")
    reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
    clip_attr = node.attributes.get("clip")
    clip = None if clip_attr is None else float(clip_attr.as_float())
    input_forget = bool(node.attributes.get_int("input_forget", 0)) and op == "LSTM"
    lbr = bool(node.attributes.get_int("linear_before_reset", 0)) and op == "GRU"
    acts = _activations(node, D)
    lens_value = _input(node, 4)
    lens_const = LowerContext.const(lens_value)
    lens = [T] * B if lens_const is None else [int(v) for v in np.asarray(lens_const, np.int64).reshape(-1)]

    optional = {"Bias": _input(node, 3), "H0": _input(node, 5)}
    if op == "LSTM":
        optional.update(C0=_input(node, 6), Peep=_input(node, 7))
    present = [(n, v) for n, v in optional.items() if v is not None]
    reads: list[ir.Value] = [x, W, R, *[v for _, v in present]]
    names = ["X", "W", "R", *[n for n, _ in present]]
    has = {n for n, _ in present}

    out_names = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    suffix = {"Y": "y", "Y_h": "yh", "Y_c": "yc"}
    sources: list[KernelSource] = []
    for oi, which in enumerate(out_names):
        if oi >= len(node.outputs) or node.outputs[oi] is None:
            continue
        y = node.outputs[oi]
        if not (y.uses() or y.is_graph_output()):
            continue
        name = P = f"{kernel}_{suffix[which]}"  # the constants' prefix too: one set per kernel
        params = [ctx.buffer_param(i, n) for i, n in enumerate(names)]
        params.append(ctx.buffer_param(len(names), "OUT", out=True))
        src = (
            constants(P, dict(T=T, B=B, I=I, H=H, D=D, G=G))
            + f"constant int {P}_LENS[{B}] = {{{', '.join(map(str, lens))}}};\n"
            + ctx.signature(name, params)
            + " {\n"
            + _body(ctx, op, P, H, G, which, has, layout, reverse, acts, clip, input_forget, lbr)
            + "}\n"
        )
        sources.append(KernelSource(name, src, list(reads), (B, D, 1), output=y))
    return sources


def _body(
    ctx: LowerContext,
    op: str,
    P: str,
    hidden: int,
    gates: int,
    which: str,
    has: set[str],
    layout: int,
    reverse: list[bool],
    acts: list[list[tuple[str, float | None, float | None]]],
    clip: float | None,
    input_forget: bool,
    lbr: bool,
) -> str:
    H = f"{P}_H"
    GH = f"({P}_G * {P}_H)"
    x_index = f"((b * {P}_T + t) * {P}_I + k)" if layout else f"((t * {P}_B + b) * {P}_I + k)"
    st_index = f"((b * {P}_D + d) * {P}_H + j)" if layout else f"((d * {P}_B + b) * {P}_H + j)"
    y_index = (
        f"(((b * {P}_T + t) * {P}_D + d) * {P}_H + j)"
        if layout
        else f"(((t * {P}_D + d) * {P}_B + b) * {P}_H + j)"
    )

    def clipped(v: str) -> str:
        return v if clip is None else f"min(max({v}, {flit(-clip)}), {flit(clip)})"

    def act_by_dir(slot: int, v: str, clip_it: bool = True) -> str:
        """The direction's activation ``slot`` of ``v`` (a select on ``d`` when they differ); the
        gates' pre-activations are clipped, LSTM's h(C) is not."""
        exprs = [_act_expr(*per[slot], clipped(v) if clip_it else v) for per in acts]
        if len(exprs) == 1 or exprs[0] == exprs[1]:
            return exprs[0]
        return f"(d == 0 ? {exprs[0]} : {exprs[1]})"

    rev = "false" if not any(reverse) else ("true" if len(reverse) == 1 else "(d == 1)")
    # array sizes as literals (a program-scope constant is no array bound in every compiler)
    lines = [
        f"    if (gid.x >= uint({P}_B) || gid.y >= uint({P}_D)) return;",
        "    const int b = int(gid.x), d = int(gid.y);",
        f"    const bool rev = {rev};",
        f"    const int len = {P}_LENS[b];",
        f"    float h[{hidden}];",
        f"    float hn[{hidden}];",
        f"    float g[{gates * hidden}];",
    ]
    if op == "LSTM":
        lines.append(f"    float c[{hidden}];")
    init_h = f"float(H0[{st_index}])" if "H0" in has else "0.0f"
    init_c = f"float(C0[{st_index}])" if "C0" in has else "0.0f"
    lines.append(
        f"    for (int j = 0; j < {H}; ++j) {{ h[j] = {init_h};"
        + (f" c[j] = {init_c};" if op == "LSTM" else "")
        + " }"
    )

    def bias(offset: str) -> str:
        return f"float(Bias[d * 2 * {GH} + {offset}])" if "Bias" in has else "0.0f"

    wb, rb = bias("j"), bias(f"{GH} + j")
    # Rule 1: the gate pre-activations. GRU's h gate (j >= 2H) takes the reset gate: its input
    # part is summed here, its recurrent part below.
    rec_limit = f"2 * {H}" if op == "GRU" else GH
    lines += [
        f"    for (int s = 0; s < {P}_T; ++s) {{",
        "        if (s >= len) {",
    ]
    if which == "Y":
        lines += [
            "            const int t = s;",
            f"            for (int j = 0; j < {H}; ++j) OUT[{y_index}] = {ctx.storage}(0.0f);",
        ]
    lines += [
        "            continue;",
        "        }",
        "        const int t = rev ? len - 1 - s : s;",
        f"        for (int j = 0; j < {GH}; ++j) {{",
        f"            float acc = {wb};",
        f"            const int wrow = (d * {GH} + j) * {P}_I;",
        f"            for (int k = 0; k < {P}_I; ++k) acc += float(X[{x_index}]) * float(W[wrow + k]);",
        f"            if (j < {rec_limit}) {{",
        f"                acc += {rb};",
        f"                const int rrow = (d * {GH} + j) * {H};",
        f"                for (int k = 0; k < {H}; ++k) acc += h[k] * float(R[rrow + k]);",
        "            }",
        "            g[j] = acc;",
        "        }",
    ]
    if op == "RNN":
        lines.append(f"        for (int j = 0; j < {H}; ++j) hn[j] = {act_by_dir(0, 'g[j]')};")
    elif op == "GRU":
        z = act_by_dir(0, "g[j]")
        lines += [
            # the reset gate, in place (k < H: z's pre-activation stays; H..2H: r)
            f"        for (int j = {H}; j < 2 * {H}; ++j) g[j] = {act_by_dir(0, 'g[j]')};",
            f"        for (int j = 0; j < {H}; ++j) {{",
            f"            const int rrow = (d * {GH} + 2 * {H} + j) * {H};",
            f"            const float rbh = {bias(f'{GH} + 2 * {H} + j')};",
        ]
        if lbr:
            lines += [
                "            float u = rbh;",
                f"            for (int k = 0; k < {H}; ++k) u += h[k] * float(R[rrow + k]);",
                f"            const float ph = g[2 * {H} + j] + g[{H} + j] * u;",
            ]
        else:
            lines += [
                "            float u = rbh;",
                f"            for (int k = 0; k < {H}; ++k) u += g[{H} + k] * h[k] * float(R[rrow + k]);",
                f"            const float ph = g[2 * {H} + j] + u;",
            ]
        lines += [
            f"            const float hc = {act_by_dir(1, 'ph')};",
            f"            const float z = {z};",
            "            hn[j] = (1.0f - z) * hc + z * h[j];",
            "        }",
        ]
    else:  # LSTM, gates i, o, f, c

        def peep(offset: str, state: str) -> str:
            return f" + float(Peep[d * 3 * {H} + {offset}j]) * {state}" if "Peep" in has else ""

        pi = f"(g[j]{peep('', 'c[j]')})"
        pf = f"(g[2 * {H} + j]{peep(f'2 * {H} + ', 'c[j]')})"
        po = f"(g[{H} + j]{peep(f'{H} + ', 'cn')})"
        lines += [
            f"        for (int j = 0; j < {H}; ++j) {{",
            f"            const float i = {act_by_dir(0, pi)};",
            f"            const float f = {'1.0f - i' if input_forget else act_by_dir(0, pf)};",
            f"            const float ct = {act_by_dir(1, f'g[3 * {H} + j]')};",
            "            const float cn = f * c[j] + i * ct;",
            f"            const float o = {act_by_dir(0, po)};",
            f"            hn[j] = o * {act_by_dir(2, 'cn', clip_it=False)};",
            "            c[j] = cn;",
            "        }",
        ]
    if which == "Y":
        lines.append(f"        for (int j = 0; j < {H}; ++j) OUT[{y_index}] = {ctx.storage}(hn[j]);")
    lines += [f"        for (int j = 0; j < {H}; ++j) h[j] = hn[j];", "    }"]
    if which == "Y_h":
        lines.append(f"    for (int j = 0; j < {H}; ++j) OUT[{st_index}] = {ctx.storage}(h[j]);")
    elif which == "Y_c":
        lines.append(f"    for (int j = 0; j < {H}; ++j) OUT[{st_index}] = {ctx.storage}(c[j]);")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- DynamicQuantizeLSTM

MAX_QUANTIZED_STATE = 4096  # batch x hidden of DynamicQuantizeLSTM's one thread per direction


def _per_column(value: np.ndarray | None, D: int, G: int, default: float) -> np.ndarray:
    """A DynamicQuantizeLSTM scale or zero point as ``[D, G]`` (per tensor, direction or column)."""
    if value is None:
        return np.full((D, G), default, np.float64)
    v = np.asarray(value, np.float64)
    if v.size == 1:
        return np.full((D, G), float(v.reshape(())), np.float64)
    if v.size == D:
        return np.repeat(v.reshape(D, 1), G, axis=1)
    return np.broadcast_to(v.reshape(-1, G), (D, G)).copy()


def check_dynamic_quantize_lstm(ctx: LowerContext, node: ir.Node) -> str | None:
    """Why the node does not lower, or None (rules of :func:`lower_dynamic_quantize_lstm`)."""
    if node.domain != "com.microsoft":
        return "not com.microsoft's op"
    if node.attributes.get_int("layout", 0):
        return "layout 1"
    x, W, R = _input(node, 0), _input(node, 1), _input(node, 2)
    if x is None or W is None or R is None or W.const_value is None or R.const_value is None:
        return "W and R must be constants"
    for i in range(8, 12):
        v = _input(node, i)
        if i in (8, 10) and v is None:
            return "W_scale and R_scale are required"
        if v is not None and v.const_value is None:
            return "scales and zero points must be constants"
    lens = _input(node, 4)
    if lens is not None and lens.const_value is None:
        return "sequence_lens given at run time (give it as a constant, or drop it for full-length sequences)"
    D, H, G = ctx.shape(R)
    B = ctx.shape(x)[1]
    if G != 4 * H:
        return f"R of shape {[D, H, G]}"
    if B * H > MAX_QUANTIZED_STATE:
        return f"batch x hidden {B * H} over {MAX_QUANTIZED_STATE}"
    direction = node.attributes.get_string("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        return f"direction {direction!r}"
    acts = _activations(node, D)
    if any(len(a) != 3 for a in acts):
        return "activations: wrong count"
    for per in acts:
        for name, _, _ in per:
            try:
                _act_expr(name, None, None, "v")
            except ValueError:
                return f"activation {name!r}"
    return None


def _bake(P: str, name: str, values: np.ndarray) -> str:
    flat = np.asarray(values, np.float64).reshape(-1)
    return f"constant float {P}_{name}[{flat.size}] = {{{', '.join(flit(v) for v in flat)}}};\n"


class _DqLstmCell(NamedTuple):
    """The Metal expressions of DynamicQuantizeLSTM's cell, per direction where they differ:
    the gates ``i, f, o``, the candidate ``ct``, the new hidden state's activation ``h``, and
    the two bias terms (``Wb`` added to ``xW``, ``Rb`` to the sum)."""

    i: str
    f: str
    ct: str
    o: str
    h: str
    x_bias: str
    h_bias: str


def _dq_lstm_cell(node: ir.Node, D: int, H: int, G: int, has: set[str]) -> _DqLstmCell:
    """The cell's expressions: activations by direction, ``clip``, ``input_forget``, peepholes
    and biases (``Bias``/``Peep`` read only where ``has`` names them)."""
    clip_attr = node.attributes.get("clip")
    clip = None if clip_attr is None else float(clip_attr.as_float())
    input_forget = bool(node.attributes.get_int("input_forget", 0))
    acts = _activations(node, D)

    def clipped(v: str) -> str:
        return v if clip is None else f"min(max({v}, {flit(-clip)}), {flit(clip)})"

    def act_by_dir(slot: int, v: str, clip_it: bool = True) -> str:
        exprs = [_act_expr(*per[slot], clipped(v) if clip_it else v) for per in acts]
        if len(exprs) == 1 or exprs[0] == exprs[1]:
            return exprs[0]
        return f"(d == 0 ? {exprs[0]} : {exprs[1]})"

    def peep(offset: str, state: str) -> str:
        return f" + float(Peep[d * 3 * {H} + {offset}j]) * {state}" if "Peep" in has else ""

    def bias(offset: str) -> str:
        return f"float(Bias[d * 2 * {G} + {offset}])" if "Bias" in has else "0.0f"

    pi = f"(g[j]{peep('', 'c[b * ' + str(H) + ' + j]')})"
    pf = f"(g[2 * {H} + j]{peep(f'2 * {H} + ', 'c[b * ' + str(H) + ' + j]')})"
    po = f"(g[{H} + j]{peep(f'{H} + ', 'cn')})"
    return _DqLstmCell(
        i=act_by_dir(0, pi),
        f="1.0f - i" if input_forget else act_by_dir(0, pf),
        ct=act_by_dir(1, f"g[3 * {H} + j]"),
        o=act_by_dir(0, po),
        h=act_by_dir(2, "cn", clip_it=False),
        x_bias=bias("j"),
        h_bias=bias(f"{G} + j"),
    )


def _dq_lstm_body(
    ctx: LowerContext,
    P: str,
    which: str,
    dims: tuple[int, int, int, int, int, int],
    rev: str,
    has: set[str],
    cell: _DqLstmCell,
) -> str:
    """The kernel body for output ``which`` (``Y``, ``Y_h`` or ``Y_c``) of one direction's
    thread: ``dims`` is ``(T, B, I, D, H, G)``; ``P`` prefixes the baked lengths, scales and
    zero points; ``rev`` is the Metal expression of "this direction runs backwards"."""
    T, B, I, D, H, G = dims
    st = f"((d * {B} + b) * {H} + j)"
    y_index = f"(((t * {D} + d) * {B} + b) * {H} + j)"
    body = f"""    if (gid.x >= 1u || gid.y >= uint({D})) return;
    const int d = int(gid.y);
    const bool rev = {rev};
    float h[{B * H}];
    float c[{B * H}];
    float g[{G}];
    for (int b = 0; b < {B}; ++b) for (int j = 0; j < {H}; ++j) {{
        h[b * {H} + j] = {f"float(H0[{st}])" if "H0" in has else "0.0f"};
        c[b * {H} + j] = {f"float(C0[{st}])" if "C0" in has else "0.0f"};
    }}
    // X quantized once over every step (rule 1)
    float xlo = 0.0f, xhi = 0.0f;
    for (int e = 0; e < {T * B * I}; ++e) {{ xlo = min(xlo, float(X[e])); xhi = max(xhi, float(X[e])); }}
    const float xs = xhi == xlo ? 1.0f : (xhi - xlo) / 255.0f;
    const float xz = rint(min(max(0.0f - xlo / xs, 0.0f), 255.0f));
    for (int s = 0; s < {T}; ++s) {{
        // the state's range: rows whose sequence did not end before the previous step
        float hlo = 0.0f, hhi = 0.0f;
        for (int b = 0; b < {B}; ++b) {{
            if (s > 0 && {P}_LENS[b] < s) continue;
            for (int j = 0; j < {H}; ++j) {{ hlo = min(hlo, h[b * {H} + j]); hhi = max(hhi, h[b * {H} + j]); }}
        }}
        const float hs = hhi == hlo ? 1.0f : (hhi - hlo) / 255.0f;
        const float hz = rint(min(max(0.0f - hlo / hs, 0.0f), 255.0f));
        float hn[{B * H}];
        float cnew[{B * H}];
        for (int b = 0; b < {B}; ++b) {{
            const int len = {P}_LENS[b];
            if (s >= len) {{
{f"                {{ const int t = s; for (int j = 0; j < {H}; ++j) OUT[{y_index}] = {ctx.storage}(0.0f); }}" if which == "Y" else ""}
                for (int j = 0; j < {H}; ++j) {{ hn[b * {H} + j] = h[b * {H} + j]; cnew[b * {H} + j] = c[b * {H} + j]; }}
                continue;
            }}
            const int t = rev ? len - 1 - s : s;
            for (int j = 0; j < {G}; ++j) {{
                int ax = 0;
                for (int k = 0; k < {I}; ++k) {{
                    const int qx = int(min(max(rint(float(X[(t * {B} + b) * {I} + k]) / xs) + xz, 0.0f), 255.0f) - xz);
                    ax += qx * (int(float(W[(d * {I} + k) * {G} + j])) - int({P}_WZ[d * {G} + j]));
                }}
                int ah = 0;
                for (int k = 0; k < {H}; ++k) {{
                    const int qh = int(min(max(rint(h[b * {H} + k] / hs) + hz, 0.0f), 255.0f) - hz);
                    ah += qh * (int(float(R[(d * {H} + k) * {G} + j])) - int({P}_RZ[d * {G} + j]));
                }}
                const float xw = float(ax) * (xs * {P}_WS[d * {G} + j]) + {cell.x_bias};
                const float hr = float(ah) * (hs * {P}_RS[d * {G} + j]);
                g[j] = (xw + hr) + {cell.h_bias};
            }}
            for (int j = 0; j < {H}; ++j) {{
                const float i = {cell.i};
                const float f = {cell.f};
                const float ct = {cell.ct};
                const float cn = f * c[b * {H} + j] + i * ct;
                const float o = {cell.o};
                hn[b * {H} + j] = o * {cell.h};
                cnew[b * {H} + j] = cn;
{f"                OUT[{y_index}] = {ctx.storage}(hn[b * {H} + j]);" if which == "Y" else ""}
            }}
        }}
        for (int e = 0; e < {B * H}; ++e) {{ h[e] = hn[e]; c[e] = cnew[e]; }}
    }}
"""
    if which != "Y":
        state = "h" if which == "Y_h" else "c"
        body += f"    for (int b = 0; b < {B}; ++b) for (int j = 0; j < {H}; ++j) OUT[{st}] = {ctx.storage}({state}[b * {H} + j]);\n"
    return body


@register("DynamicQuantizeLSTM", check=check_dynamic_quantize_lstm)
def lower_dynamic_quantize_lstm(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> list[KernelSource]:
    """ONNX Runtime's ``com.microsoft::DynamicQuantizeLSTM``: an LSTM (gates ``i, o, f, c``)
    whose ``W`` ``[D, I, 4H]`` and ``R`` ``[D, H, 4H]`` are int8/uint8 codes with per-direction
    or per-column scales and zero points, and whose inputs to the two products are quantized
    at run time, as ORT's kernel does on one thread:

    1. X (every step at once) and, at each step, the hidden state of the whole batch (rows whose
       sequence ended before the previous step left out of the range) are quantized to uint8 by
       ORT's rule: range extended to 0, scale ``(max - min) / 255`` (1 when the range is empty),
       zero point ``round(clip(-min / scale, 0, 255))``, codes ``clip(round(v / scale) + zp)``.
    2. The products are exact int32 sums of centered codes, scaled by ``input scale x weight
       scale`` in float; ``pre = (xW + Wb) + hR + Rb``, then the LSTM cell in float.
    3. One thread per direction, grid ``(1, D, 1)``: it loops over time and, in each step, over
       the batch (the state's range spans the batch), keeping ``batch x hidden`` floats of
       state (at most :data:`MAX_QUANTIZED_STATE`). ``sequence_lens`` is baked as for LSTM.
    """
    x, W, R = node.inputs[0], node.inputs[1], node.inputs[2]
    assert x is not None and W is not None and R is not None
    T, B, I = ctx.shape(x)
    D, H, G = ctx.shape(R)
    direction = node.attributes.get_string("direction", "forward")
    reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
    lens_const = LowerContext.const(_input(node, 4))
    lens = [T] * B if lens_const is None else [int(v) for v in np.asarray(lens_const, np.int64).reshape(-1)]
    ws = _per_column(LowerContext.const(_input(node, 8)), D, G, 1.0)
    wz = _per_column(LowerContext.const(_input(node, 9)), D, G, 0.0)
    rs = _per_column(LowerContext.const(_input(node, 10)), D, G, 1.0)
    rz = _per_column(LowerContext.const(_input(node, 11)), D, G, 0.0)

    optional = {
        "Bias": _input(node, 3),
        "H0": _input(node, 5),
        "C0": _input(node, 6),
        "Peep": _input(node, 7),
    }
    present = [(n, v) for n, v in optional.items() if v is not None]
    reads: list[ir.Value] = [x, W, R, *[v for _, v in present]]
    names = ["X", "W", "R", *[n for n, _ in present]]
    has = {n for n, _ in present}
    cell = _dq_lstm_cell(node, D, H, G, has)

    rev = "false" if not any(reverse) else ("true" if len(reverse) == 1 else "(d == 1)")
    sources: list[KernelSource] = []
    for oi, which in enumerate(["Y", "Y_h", "Y_c"]):
        if oi >= len(node.outputs) or node.outputs[oi] is None:
            continue
        y = node.outputs[oi]
        if not (y.uses() or y.is_graph_output()):
            continue
        P = name = f"{kernel}_{dict(Y='y', Y_h='yh', Y_c='yc')[which]}"
        body = _dq_lstm_body(ctx, P, which, (T, B, I, D, H, G), rev, has, cell)
        params = [ctx.buffer_param(i, n) for i, n in enumerate(names)]
        params.append(ctx.buffer_param(len(names), "OUT", out=True))
        src = (
            f"constant int {P}_LENS[{B}] = {{{', '.join(map(str, lens))}}};\n"
            + _bake(P, "WS", ws.astype(np.float32))
            + _bake(P, "WZ", wz)
            + _bake(P, "RS", rs.astype(np.float32))
            + _bake(P, "RZ", rz)
            + ctx.signature(name, params)
            + " {\n"
            + body
            + "}\n"
        )
        sources.append(KernelSource(name, src, list(reads), (1, D, 1), output=y))
    return sources
