"""Lowering a whole ``onnx_ir`` graph to one jax function.

Rules:

1. Graph inputs (those that are not initializers) become the function's first arguments, in
   graph order; then come the *weight arguments*: initializers of a floating type (and int8/uint8
   quantized weights) that no rule needs as a static value, in graph order.
2. Every other initializer (shape tensors, indices, axes, and any weight a rule needs or
   prefers static) is a static value embedded in the program (see the registry's static-value
   rules).
3. ``baked`` weights (``bake_weights``) are embedded as constants too; a float32 weight that
   float16 represents exactly is embedded as float16 and widened inside the program with
   ``lax.convert_element_type``, which halves the artifact without changing a value.
4. Nodes are lowered in graph order (ONNX requires topological order). A node whose inputs are
   all static is evaluated with numpy; any other node needs a lowering rule.
5. Before anything is traced, every node that cannot be lowered is collected, and one
   :class:`mconv.errors.UnsupportedError` names them all (name and op type), nodes of
   subgraphs (If/Loop/Scan bodies) included.
6. A node that owns a subgraph is never folded with numpy (its body may read traced outer
   values); its rule lowers the body with :func:`lower_subgraph`, which sees the enclosing
   values by name (outer scope). Static values a body's rules need are collected like the main
   graph's: outer-scope values are the same ``ir.Value`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.engines.xla.lower import LowerContext, is_static, lookup
from mconv.errors import UnsupportedError
from mconv.irio import real_inputs

# Ops that must never be folded at export time: their value is not a constant.
_NEVER_FOLD = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli"}
_ARG_INT_DTYPES = {np.dtype(np.int8), np.dtype(np.uint8)}


def _name(value: ir.Value) -> str:
    """The name of a value of a graph: onnx_ir names every value a graph takes in (a loaded
    model's values keep their file's names), so None is a bug, not bad input."""
    name = value.name
    assert name is not None, "a value outside any graph"
    return name


def _attrs(node: ir.Node) -> dict:
    from mconv.engines.reference.executor import attr_to_python

    return {name: attr_to_python(a) for name, a in node.attributes.items()}


def _opset(model: ir.Model) -> int:
    return int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 21)))


def _widened(arr: np.ndarray) -> np.ndarray:
    """4-bit integer codes (ml_dtypes int4/uint4) as int8/uint8: numpy and the weights
    container have no 4-bit arrays, and DequantizeLinear computes the same from either."""
    name = arr.dtype.name
    if name == "int4":
        return arr.astype(np.int8)
    if name == "uint4":
        return arr.astype(np.uint8)
    return arr


def _is_weight_dtype(arr: np.ndarray) -> bool:
    # 4-bit codes too: as arguments (stored by the container, a palette of 16 values at 4 bits
    # or less) rather than constants serialised at a byte each into both program files
    return arr.dtype.kind == "f" or arr.dtype in _ARG_INT_DTYPES or arr.dtype.name in ("int4", "uint4")


def _subgraphs(node: ir.Node) -> list[ir.Graph]:
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.value)
    return graphs


def _all_nodes(graph: ir.Graph):
    """Every node of ``graph`` and, recursively, of its nodes' subgraphs."""
    for node in graph:
        yield node
        for sub in _subgraphs(node):
            yield from _all_nodes(sub)


def _static_needs(graph: ir.Graph) -> set[str]:
    """Names of values that some rule needs as static values, closed over their producers."""
    needed: set[str] = set()
    stack: list[ir.Value] = []
    for node in _all_nodes(graph):
        rule = lookup(node.op_type, node.domain)
        if rule is None:
            continue
        for i in rule.static:
            if i < len(node.inputs) and node.inputs[i] is not None:
                stack.append(node.inputs[i])
    while stack:
        v = stack.pop()
        if v.name in needed:
            continue
        needed.add(_name(v))
        producer = v.producer()
        if producer is None:
            continue
        rule = lookup(producer.op_type, producer.domain)
        if rule is not None and rule.shape_only:
            continue
        stack.extend(x for x in producer.inputs if x is not None)
    return needed


def _preferred_static(graph: ir.Graph) -> set[str]:
    """Names of the inputs some rule prefers static (the registry's rule 5)."""
    names: set[str] = set()
    for node in _all_nodes(graph):
        rule = lookup(node.op_type, node.domain)
        if rule is None:
            continue
        for i in rule.prefer_static:
            if i < len(node.inputs) and (v := node.inputs[i]) is not None and v.name:
                names.add(v.name)
    return names


def _dtype_name(value: ir.Value | None) -> str | None:
    dtype = value.dtype if value is not None else None
    return dtype.name if dtype is not None else None


def _check_supported(graph: ir.Graph, static_init: set[str], needed: set[str]) -> None:
    """Refuse, in one error, every node that can be neither lowered nor folded (rule 5)."""
    static: set[str] = set(static_init)
    bad: list[tuple[str, str]] = []
    not_static: list[tuple[str, str]] = []

    def visit(g: ir.Graph) -> None:
        for node in g:
            ins = [v for v in node.inputs if v is not None]
            rule = lookup(node.op_type, node.domain)
            subs = _subgraphs(node)
            all_static = not subs and all(v.name in static for v in ins) and node.op_type not in _NEVER_FOLD
            if all_static or (rule is not None and rule.shape_only):
                static.update(_name(o) for o in node.outputs)
            elif rule is None:
                bad.append(
                    (node.name or "<unnamed>", f"{node.domain + '::' if node.domain else ''}{node.op_type}")
                )
            for sub in subs:
                visit(sub)

    visit(graph)
    for node in graph:
        for o in node.outputs:
            if o.name in needed and o.name not in static:
                not_static.append((node.name or "<unnamed>", f"{node.op_type} output '{o.name}'"))
    for v in graph.inputs:
        if v.name in needed and v.name not in static_init:
            not_static.append((v.name, "graph input"))
    if bad:
        raise UnsupportedError(
            bad,
            what="op for XLA",
            path=graph.name or None,
            hint="run the model on the cpu target, or rewrite these ops with mconv passes",
        )
    if not_static:
        raise UnsupportedError(
            not_static,
            what="value that must be known at export time but depends on runtime data",
            path=graph.name or None,
            hint="XLA needs static shapes; fix the input shapes (--batch) or fold the model first",
        )


@dataclass
class LoweredGraph:
    """A model ready to trace: argument order, static values and the traced function."""

    model: ir.Model
    input_names: list[str]
    output_names: list[str]
    weight_names: list[str]
    static_values: dict[str, np.ndarray]
    declared_batch: int | None = None
    opset: int = 21
    baked: dict[str, np.ndarray] = field(default_factory=dict)
    model_batch: int | None = None  # the leading dimension the model declares (declared_batch's source)
    shape_note: str | None = None  # set by the exporter when it fell back to static shapes
    # weight name -> the permutation the exported program takes it in (the exporter's rule 9)
    layouts: dict[str, list[int]] = field(default_factory=dict)

    def weights(self, stored: bool = False) -> list[tuple[str, np.ndarray]]:
        """The weight arguments as (name, array), in argument order: as the exported program
        takes them (permuted by ``layouts``), or with ``stored`` as the model holds them."""
        inits = self.model.graph.initializers
        out = []
        for n in self.weight_names:
            tensor = inits[n].const_value
            assert tensor is not None  # an initializer holds its tensor
            arr = _widened(tensor.numpy())
            perm = None if stored else self.layouts.get(n)
            out.append((n, arr if perm is None else np.ascontiguousarray(np.transpose(arr, perm))))
        return out

    def function(self, batch_dim: Any = None) -> Callable:
        """``f(*inputs, *weights) -> tuple(outputs)`` for jax to trace."""
        import jax.numpy as jnp
        from jax import lax

        graph = self.model.graph
        n_in = len(self.input_names)

        def embedded(name: str, arr: np.ndarray) -> Any:
            if arr.dtype == np.float32 and arr.size:
                with np.errstate(over="ignore"):
                    half = arr.astype(np.float16)
                if np.array_equal(half.astype(np.float32), arr, equal_nan=True):
                    return lax.convert_element_type(jnp.asarray(half), jnp.float32)
            return jnp.asarray(arr)

        def fn(*args: Any) -> tuple:
            env: dict[str, Any] = dict(self.static_values)
            for name, arr in self.baked.items():
                env[name] = embedded(name, arr)
            env.update(zip(self.input_names, args[:n_in]))
            env.update(zip(self.weight_names, args[n_in:]))
            run_graph(graph, env, self.opset, self.declared_batch, batch_dim)
            return tuple(jnp.asarray(env[n]) for n in self.output_names)

        return fn


def run_graph(graph: ir.Graph, env: dict, opset: int, declared_batch: int | None, batch_dim: Any) -> None:
    """Lower every node of ``graph`` in order, reading and writing values in ``env``."""

    def lower_subgraph(sub: ir.Graph, inputs: list, scope: Mapping[str, Any]) -> list:
        """Lower ``sub`` with positional ``inputs``; ``scope`` (the enclosing values) is visible."""
        inner: dict[str, Any] = dict(scope)
        for name, value in sub.initializers.items():
            if value.const_value is not None:
                inner[name] = value.const_value.numpy()
        for v, x in zip(sub.inputs, inputs):
            inner[_name(v)] = x
        run_graph(sub, inner, opset, declared_batch, batch_dim)
        return [inner[_name(v)] for v in sub.outputs]

    for node in graph:
        ctx = LowerContext(
            opset=opset,
            node_name=node.name or "",
            num_outputs=len(node.outputs),
            declared_batch=declared_batch,
            batch_dim=batch_dim,
            lower_subgraph=lower_subgraph,
            scope=env,
            input_types=[_dtype_name(v) for v in node.inputs],
        )
        outs = lower_node(node, [env[v.name] if v is not None else None for v in node.inputs], ctx)
        for o, val in zip(node.outputs, outs):
            if o.name:
                env[o.name] = val


def lower_node(node: ir.Node, inputs: list, ctx: LowerContext) -> list:
    from mconv.errors import InputError

    attrs = _attrs(node)
    rule = lookup(node.op_type, node.domain)
    all_static = (
        all(is_static(x) for x in inputs) and node.op_type not in _NEVER_FOLD and not _subgraphs(node)
    )
    outs: Sequence[Any]
    try:
        if all_static and not any(isinstance(x, np.ndarray) and x.dtype == object for x in inputs):
            if node.op_type == "Constant" or rule is None or not rule.shape_only:
                from mconv.engines.reference.executor import run_node

                outs = run_node(node.op_type, inputs, attrs, domain=node.domain, opset=ctx.opset)
                return [np.asarray(o) if o is not None else None for o in outs]
        if rule is None:  # _check_supported refused these before tracing began
            raise NotImplementedError("no lowering rule")
        outs = rule.fn(inputs, attrs, ctx)
    except (UnsupportedError, InputError):
        raise
    except NotImplementedError as exc:  # a rule refusing one variant of its op
        raise UnsupportedError(
            [(node.name or "<unnamed>", f"{node.op_type}: {exc}")],
            what="op variant for XLA",
            hint="run the model on the cpu target",
        ) from None
    except Exception as exc:
        raise InputError(
            f"{node.op_type} cannot be lowered: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
            where=f"node {node.name or '<unnamed>'}",
            hint="check the node's input shapes and attributes against the ONNX spec",
        ) from exc
    return list(outs)


def lower_graph(model: ir.Model, *, bake_weights: bool = False) -> LoweredGraph:
    """Plan the lowering of ``model``: argument order and static values; refuse unsupported nodes."""
    graph = model.graph
    needed = _static_needs(graph)
    preferred = _preferred_static(graph)
    static_values: dict[str, np.ndarray] = {}
    weight_names: list[str] = []
    baked: dict[str, np.ndarray] = {}
    for name, value in graph.initializers.items():
        if value.const_value is None:
            continue
        arr = value.const_value.numpy()
        if name in needed or name in preferred or not _is_weight_dtype(arr):
            static_values[name] = arr
        elif bake_weights:
            baked[name] = arr
        else:
            weight_names.append(name)
    _check_supported(graph, set(static_values) | set(baked), needed)
    inputs = real_inputs(graph)
    declared = None
    for v in inputs:
        if v.shape is not None and len(v.shape) >= 1 and isinstance(v.shape[0], int):
            declared = v.shape[0]
            break
    return LoweredGraph(
        model=model,
        input_names=[_name(v) for v in inputs],
        output_names=[_name(v) for v in graph.outputs],
        weight_names=weight_names,
        static_values=static_values,
        declared_batch=declared,
        opset=_opset(model),
        baked=baked,
    )


def initializer_arrays(model: ir.Model) -> Mapping[str, np.ndarray]:
    return {
        n: v.const_value.numpy() for n, v in model.graph.initializers.items() if v.const_value is not None
    }
