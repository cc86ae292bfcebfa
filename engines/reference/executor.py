"""The reference interpreter: a plan built once, a lean loop that runs it, and a reverse sweep.

Rules
-----
1. A *plan* is prepared once per graph: nodes in topological order (the file's order is not
   trusted), each node's kernel looked up by ``(op_type, domain)``, attributes converted once into
   plain Python values, initializers read once as numpy arrays. ``run`` does no parsing.
2. A node resolves, in this order, to: a model-local function (``model.functions``), a kernel of
   the op registry (:mod:`mconv.engines.reference.ops`), or the function body that the ONNX
   schema defines for the op (plain or context-dependent). Function bodies are expanded into a
   sub-plan per call site, with ``ref_attr_name`` attributes bound to the caller's attributes.
3. Every node no rule resolves is collected, subgraphs included, and reported in ONE
   :class:`~mconv.errors.UnsupportedError` at construction time.
4. Subgraphs (If/Loop/Scan bodies) get their own plan, built at construction; a subgraph reads
   outer-scope values through its *free variables* (names used inside, defined outside), which
   also count as uses of the node that owns the subgraph for topological order and liveness.
5. Without ``intermediates`` a value is dropped from the environment right after its last use.
6. Reverse mode records the forward environment, then visits, in reverse topological order, only
   the nodes on a path from a ``wrt`` value to a value with a cotangent; each calls its op's VJP
   and gradients that fan out are summed. A control-flow VJP may return ``(input_grads,
   {outer_name: grad})`` so that gradients reach the outer values its body read. Ops defined by
   a function body differentiate through that body.
7. ``ai.onnx.preview.training::Gradient`` is answered by the same reverse sweep over its graph
   (such a graph keeps all its values alive).
8. The schema's function body used is the newest one defined at or before the model's opset.
9. Constants (initializers of every plan, ``Constant`` values) are registered with the executor's
   :class:`~mconv.engines.reference.ops.WideConstants` while plans are built, so a kernel that
   accumulates wide widens each of them once per executor, not once per run (op registry,
   Exactness). ``set_initializer`` drops the old weight's wide copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
from mconv.engines.reference.ops import OpContext, OpDef, WideConstants, fast_math, lookup, wide_constants
from mconv.errors import InputError, UnsupportedError, show

_AT = ir.AttributeType
DEFAULT_OPSET = 21


# --------------------------------------------------------------------------- attributes


def _named(value: ir.Value) -> str:
    """The name of a value of a graph or function: onnx_ir names every value a graph takes in
    (a loaded model's values keep their file's names), so None is a bug, not bad input."""
    name = value.name
    assert name is not None, "a value outside any graph"
    return name


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """An ``onnx_ir`` tensor as numpy; string tensors become object arrays of ``str``."""
    arr = tensor.numpy()
    if arr.dtype.kind in ("O", "S"):
        arr = np.array(
            [s.decode("utf-8") if isinstance(s, bytes) else s for s in arr.ravel()], dtype=object
        ).reshape(arr.shape)
    return arr


def attr_to_python(attr: ir.Attr) -> Any:
    """One ONNX attribute as a plain Python value (see the op registry's conventions)."""
    t, v = attr.type, attr.value
    if t in (_AT.INT, _AT.FLOAT, _AT.GRAPH, _AT.TYPE_PROTO):
        return v
    if t == _AT.STRING:
        return v.decode("utf-8") if isinstance(v, bytes) else v
    if t == _AT.TENSOR:
        return tensor_to_numpy(v)
    if t in (_AT.INTS, _AT.FLOATS, _AT.GRAPHS, _AT.TYPE_PROTOS):
        return list(v)
    if t == _AT.STRINGS:
        return [s.decode("utf-8") if isinstance(s, bytes) else s for s in v]
    if t == _AT.TENSORS:
        return [tensor_to_numpy(x) for x in v]
    return v  # sparse tensors: passed through; the op that accepts them converts


def _graph_attrs(node: ir.Node) -> list[ir.Graph]:
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.is_ref():
            continue
        if attr.type == _AT.GRAPH:
            graphs.append(attr.value)
        elif attr.type == _AT.GRAPHS:
            graphs.extend(attr.value)
    return graphs


# --------------------------------------------------------------------------- plan


@dataclass(slots=True)
class Step:
    """One node, ready to run: kernel, value names, converted attributes."""

    name: str | None
    op_type: str
    domain: str
    opdef: OpDef
    inputs: tuple[str | None, ...]
    outputs: tuple[str | None, ...]
    attrs: dict
    ctx: OpContext
    uses: tuple[str, ...]  # inputs plus free variables of subgraphs (for liveness)
    has_subgraph: bool = False


@dataclass
class Plan:
    """A graph (or function body) in topological order with everything pre-resolved."""

    steps: list[Step]
    inputs: list[str]
    outputs: list[str | None]  # None: an optional output a function body does not produce
    initializers: dict[str, np.ndarray]
    free_vars: tuple[str, ...]  # names read from the enclosing scope
    keep_values: bool = False  # a Gradient node differentiates this plan: free nothing
    _schedules: dict = field(default_factory=dict)

    def schedule(self, wanted: tuple[str, ...], keep_all: bool) -> list[tuple[Step, tuple[str, ...]]]:
        """Steps needed for ``wanted``, each with the values that die right after it."""
        keep_all = keep_all or self.keep_values
        key = (wanted, keep_all)
        sched = self._schedules.get(key)
        if sched is not None:
            return sched
        needed = set(wanted)
        chosen: list[Step] = []
        for step in reversed(self.steps):
            if any(o in needed for o in step.outputs if o):
                chosen.append(step)
                needed.update(u for u in step.uses)
        chosen.reverse()
        sched = []
        if keep_all:
            sched = [(s, ()) for s in chosen]
        else:
            last: dict[str, int] = {}
            for i, s in enumerate(chosen):
                for u in s.uses:
                    last[u] = i
                for o in s.outputs:  # an unused output dies where it is born
                    if o and o not in last:
                        last[o] = i
            keep = set(wanted)
            dying: list[list[str]] = [[] for _ in chosen]
            for name, i in last.items():
                if name not in keep:
                    dying[i].append(name)
            sched = [(s, tuple(d)) for s, d in zip(chosen, dying)]
        self._schedules[key] = sched
        return sched


def _toposort(nodes: list[ir.Node], node_uses: list[tuple[str, ...]], where: str) -> list[int]:
    """Kahn's algorithm; keeps the given order among independent nodes."""
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.outputs:
            if out.name:
                producer[out.name] = i
    indegree = [0] * len(nodes)
    consumers: list[list[int]] = [[] for _ in nodes]
    for i, uses in enumerate(node_uses):
        deps = {producer[u] for u in uses if u in producer and producer[u] != i}
        indegree[i] = len(deps)
        for d in deps:
            consumers[d].append(i)
    ready = [i for i in range(len(nodes)) if indegree[i] == 0]
    ready.reverse()
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for c in sorted(consumers[i], reverse=True):
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if indegree[i] > 0]
        raise InputError(
            f"graph has a cycle through {len(stuck)} node(s): {', '.join(stuck[:5])}",
            where=where,
            hint="the model is malformed; re-export it",
        )
    return order


class _Builder:
    """Turns graphs and function bodies into plans, collecting unknown ops as it goes."""

    def __init__(
        self, executor: Executor, model_opsets: Mapping[str, int], functions: Mapping[tuple, ir.Function]
    ) -> None:
        self.executor = executor
        self.functions = {(f.domain, f.name): f for f in functions.values()}
        self.model_opsets = dict(model_opsets)
        self.unknown: list[tuple[str, str]] = []
        self.subplans: dict[int, Plan] = {}

    def graph_plan(
        self,
        graph: ir.Graph | ir.Function,
        opsets: Mapping[str, int],
        bound_attrs: Mapping[str, Any] | None = None,
        fn_defaults: Mapping[str, ir.Attr] | None = None,
    ) -> Plan:
        nodes = list(graph)
        inits: dict[str, np.ndarray] = {}
        if isinstance(graph, ir.Graph):
            for name, value in graph.initializers.items():
                if value.const_value is not None:
                    inits[name] = tensor_to_numpy(value.const_value)
                    self.executor.constants.add(inits[name])
        # Subgraph plans first: their free variables are uses of the owning node.
        sub_free: list[tuple[str, ...]] = []
        for node in nodes:
            fv: list[str] = []
            for g in _graph_attrs(node):
                sub = self.subgraph_plan(g, opsets)
                fv.extend(sub.free_vars)
            sub_free.append(tuple(dict.fromkeys(fv)))
        node_uses = [
            tuple(v.name for v in n.inputs if v is not None and v.name) + sf + _gradient_target(n)
            for n, sf in zip(nodes, sub_free)
        ]
        where = f"graph {getattr(graph, 'name', '') or '?'}"
        order = _toposort(nodes, node_uses, where)
        steps = [
            self.step(
                nodes[i],
                node_uses[i],
                bool(sub_free[i] or _graph_attrs(nodes[i]) or _gradient_target(nodes[i])),
                opsets,
                bound_attrs,
                fn_defaults,
            )
            for i in order
        ]
        inputs = [_named(v) for v in graph.inputs]
        outputs = [v.name for v in graph.outputs]
        defined = set(inputs) | set(inits)
        free: list[str] = []
        for s in steps:
            for u in s.uses:
                if u not in defined:
                    free.append(u)
            defined.update(o for o in s.outputs if o)
        free.extend(
            o for o in outputs if o is not None and o not in defined
        )  # outputs passed straight through
        plan = Plan(steps, inputs, outputs, inits, tuple(dict.fromkeys(free)))
        for step in steps:
            if (step.domain, step.op_type) == _GRADIENT:
                step.opdef = _gradient_opdef(self.executor, plan)
                plan.keep_values = True
        return plan

    def subgraph_plan(self, graph: ir.Graph, opsets: Mapping[str, int]) -> Plan:
        plan = self.subplans.get(id(graph))
        if plan is None:
            plan = self.graph_plan(graph, opsets)
            self.subplans[id(graph)] = plan
        return plan

    def step(
        self,
        node: ir.Node,
        uses: tuple[str, ...],
        has_sub: bool,
        opsets: Mapping[str, int],
        bound: Mapping[str, Any] | None,
        fn_defaults: Mapping[str, ir.Attr] | None,
    ) -> Step:
        attrs: dict[str, Any] = {}
        for key, attr in node.attributes.items():
            ref = attr.ref_attr_name
            if ref is not None:  # inside a function body: take the caller's value or the default
                if bound is not None and ref in bound:
                    attrs[key] = bound[ref]
                elif fn_defaults is not None and ref in fn_defaults and fn_defaults[ref].value is not None:
                    attrs[key] = attr_to_python(fn_defaults[ref])
                continue
            attrs[key] = attr_to_python(attr)
        domain = "" if node.domain == "ai.onnx" else node.domain
        if node.op_type == "Constant" and domain == "":  # its forward returns this very array
            self.executor.constants.add(attrs.get("value"))
        opset = opsets.get(domain, self.model_opsets.get(domain, DEFAULT_OPSET if domain == "" else 1))
        ctx = OpContext(
            opset=opset,
            executor=self.executor,
            scope={},
            rng=self.executor.rng,
            num_outputs=len(node.outputs),
        )
        opdef = self.resolve(node, attrs, opset, opsets)
        if opdef is None:
            self.unknown.append(
                (
                    node.name or f"<unnamed {node.op_type}>",
                    node.op_type if not domain else f"{domain}::{node.op_type}",
                )
            )
            opdef = OpDef(node.op_type, domain, _unresolved)
        ins = tuple(v.name if v is not None and v.name else None for v in node.inputs)
        outs = tuple(v.name if v.name else None for v in node.outputs)
        return Step(node.name, node.op_type, domain, opdef, ins, outs, attrs, ctx, uses, has_sub)

    def resolve(self, node: ir.Node, attrs: dict, opset: int, opsets: Mapping[str, int]) -> OpDef | None:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) == _GRADIENT:
            return OpDef(node.op_type, domain, _unresolved)  # bound to its plan by graph_plan
        fn = self.functions.get((node.domain, node.op_type))
        if fn is not None:
            fopsets = {**self.model_opsets, **dict(fn.opset_imports)}
            plan = self.graph_plan(fn, fopsets, attrs, fn.attributes)
            return _function_opdef(node.op_type, domain, plan, self.executor)
        opdef = lookup(node.op_type, domain)
        if opdef is not None:
            return opdef
        return self.schema_function(node, attrs, opset, opsets)

    def schema_function(
        self, node: ir.Node, attrs: dict, opset: int, opsets: Mapping[str, int]
    ) -> OpDef | None:
        # Any: onnx's stub of OpSchema lacks the function_* members read below (onnx 1.17+ has them)
        schema: Any
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        except onnx.defs.SchemaError:
            return None
        domain = "" if node.domain == "ai.onnx" else node.domain
        fopsets = {**self.model_opsets, **dict(opsets)}
        defaults = {}
        for name, a in schema.attributes.items():  # the body's @refs fall back to these
            if a.default_value is not None and a.default_value.type != 0:
                value = onnx.helper.get_attribute_value(a.default_value)
                if isinstance(value, onnx.TensorProto):
                    value = onnx.numpy_helper.to_array(value)
                elif isinstance(value, bytes):
                    value = value.decode("utf-8")
                elif isinstance(value, list) and value and isinstance(value[0], bytes):
                    value = [v.decode("utf-8") for v in value]
                defaults[name] = value
        attrs = {**defaults, **attrs}
        body = b""
        version = _body_version(schema.function_opset_versions, opset)
        if version is not None:
            body = schema.get_function_with_opset_version(version)
        elif schema.has_function:
            body = schema.function_body.SerializeToString()
        if body:
            plan = _function_plan(self, body, fopsets, attrs)
            return _function_opdef(node.op_type, domain, plan, self.executor)
        if _body_version(schema.context_dependent_function_opset_versions, opset) is not None:
            # The builder reads attributes from the node: give it resolved values, not @refs.
            proto_attrs = {k: _attr_to_proto_value(v) for k, v in attrs.items()}
            node_bytes = onnx.helper.make_node(
                node.op_type,
                [_named(v) if v is not None else "" for v in node.inputs],
                [_named(v) for v in node.outputs],
                domain=node.domain,
                **proto_attrs,
            ).SerializeToString()
            return _context_function_opdef(
                node.op_type, domain, schema, opset, node_bytes, attrs, fopsets, self
            )
        return None


def _function_plan(builder: _Builder, body: bytes, opsets: Mapping[str, int], attrs: dict) -> Plan:
    """A plan for a schema's function body. Outputs that the body never produces (optional ones
    the builder left out for this node, e.g. SoftmaxCrossEntropyLoss's log_prob) stay empty."""
    proto = onnx.FunctionProto()
    proto.ParseFromString(body)
    defined = set(proto.input) | {o for n in proto.node for o in n.output}
    outputs = [o if o in defined else None for o in proto.output]
    del proto.output[:]
    proto.output.extend(o for o in outputs if o)
    fn = ir.serde.deserialize_function(proto)
    plan = builder.graph_plan(fn, {**opsets, **dict(fn.opset_imports)}, attrs, fn.attributes)
    plan.outputs = outputs
    return plan


def _body_version(versions: Iterable[int], opset: int) -> int | None:
    """The function body that applies at ``opset``: the newest one defined at or before it."""
    usable = [v for v in versions if v <= opset]
    return max(usable) if usable else None


def _attr_to_proto_value(v: Any) -> Any:
    """A plain attribute value back into what ``onnx.helper.make_attribute`` accepts."""
    if isinstance(v, np.ndarray):
        return onnx.numpy_helper.from_array(v)
    if isinstance(v, ir.Graph):
        return ir.serde.serialize_graph(v)
    if isinstance(v, list) and v and isinstance(v[0], (np.ndarray, ir.Graph)):
        return [_attr_to_proto_value(x) for x in v]
    return v


_GRADIENT = ("ai.onnx.preview.training", "Gradient")


def _gradient_target(node: ir.Node) -> tuple[str, ...]:
    """A Gradient node reads ``y`` by name: it runs after ``y`` is computed."""
    if (node.domain, node.op_type) == _GRADIENT and "y" in node.attributes:
        return (node.attributes["y"].value,)
    return ()


def _gradient_opdef(executor: Executor, plan: Plan) -> OpDef:
    """ai.onnx.preview.training::Gradient: d y / d xs through the enclosing graph, by the same
    reverse sweep as ``Executor.vjp`` (the plan keeps every value, so nothing is recomputed)."""

    def forward(inputs, attrs, ctx):
        xs, y = list(attrs["xs"]), attrs["y"]
        env = ctx.scope
        grads = executor._reverse(plan, env, {y: np.ones_like(env[y])}, xs)
        return tuple(grads[x] for x in xs)

    return OpDef(_GRADIENT[1], _GRADIENT[0], forward)


def _unresolved(inputs, attrs, ctx):  # never reached: construction refuses unknown ops
    raise AssertionError("unresolved op")


def _function_opdef(op_type: str, domain: str, plan: Plan, executor: Executor) -> OpDef:
    def forward(inputs, attrs, ctx):
        return executor.run_plan(plan, inputs, ctx.scope)

    def vjp(inputs, attrs, outputs, grads, ctx):
        return executor.plan_vjp(plan, inputs, grads, ctx.scope)

    return OpDef(op_type, domain, forward, vjp)


def _context_function_opdef(
    op_type: str,
    domain: str,
    schema: Any,
    opset: int,
    node_bytes: bytes,
    attrs: dict,
    opsets: dict,
    builder: _Builder,
) -> OpDef:
    """An op whose body depends on its input types: built at first use, cached per input types."""
    cache: dict[tuple, Plan] = {}
    executor = builder.executor

    def plan_for(inputs: list) -> Plan:
        key = tuple((None if x is None else (str(getattr(x, "dtype", "seq")), np.ndim(x))) for x in inputs)
        plan = cache.get(key)
        if plan is None:
            types = []
            while inputs and inputs[-1] is None:
                inputs = inputs[:-1]
            for x in inputs:
                if x is None:  # an omitted optional input in the middle: no type to give
                    types.append(onnx.TypeProto().SerializeToString())
                    continue
                # onnx's builder crashes (segfault) on a type it cannot read: refuse first.
                if not isinstance(x, np.ndarray):
                    raise UnsupportedError(
                        [(op_type, op_type)],
                        what="context-dependent function",
                        hint="only tensor inputs can expand its body",
                    )
                elem = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
                types.append(onnx.helper.make_tensor_type_proto(elem, x.shape).SerializeToString())
            version = _body_version(schema.context_dependent_function_opset_versions, opset)
            body = schema.get_context_dependent_function_with_opset_version(version, node_bytes, types)
            sub = _Builder(executor, builder.model_opsets, {})
            plan = _function_plan(sub, body, opsets, attrs)
            if sub.unknown:
                raise UnsupportedError(sub.unknown, hint=f"needed by the body of {op_type}")
            cache[key] = plan
        return plan

    def forward(inputs, attrs_, ctx):
        return executor.run_plan(plan_for(inputs), inputs, ctx.scope)

    def vjp(inputs, attrs_, outputs, grads, ctx):
        return executor.plan_vjp(plan_for(inputs), inputs, grads, ctx.scope)

    return OpDef(op_type, domain, forward, vjp)


# --------------------------------------------------------------------------- executor


def _input_specs(graph: ir.Graph, skip: Iterable[str]) -> list[tuple[str, Any, tuple | None]]:
    skip = set(skip)
    specs = []
    for v in graph.inputs:
        if v.name in skip:
            continue
        dtype = None
        if isinstance(v.type, ir.TensorType):
            try:
                dtype = np.dtype(v.type.dtype.numpy())
            except Exception:  # noqa: BLE001 - dtypes numpy cannot name (e.g. int4) are not checked
                dtype = None
        shape = None
        if v.shape is not None:
            shape = tuple(
                d if isinstance(d, int) else (str(d) if d.value is not None else None) for d in v.shape
            )
        specs.append((_named(v), dtype, shape))
    return specs


class Executor:
    """Runs an ``onnx_ir.Model`` with the numpy kernels of the op registry.

    ``dtype_check`` refuses feeds whose dtype or rank differs from the graph's declaration.
    """

    def __init__(self, model: ir.Model, *, dtype_check: bool = True) -> None:
        self.model = model
        self.dtype_check = dtype_check
        self.rng = np.random.default_rng(0)
        self.constants = WideConstants()  # wide copies of the constants, made on first use (rule 9)
        graph = model.graph
        opsets = {("" if k == "ai.onnx" else k): v for k, v in model.opset_imports.items()}
        self._builder = _Builder(self, opsets, model.functions)
        self.plan = self._builder.graph_plan(graph, opsets)
        if self._builder.unknown:
            raise UnsupportedError(
                self._builder.unknown, hint="implement them in mconv.engines.reference.ops"
            )
        self._subplans = self._builder.subplans
        self.initializers: dict[str, np.ndarray] = self.plan.initializers
        self.input_specs = _input_specs(graph, self.initializers)
        self.input_names = [s[0] for s in self.input_specs]
        self.output_names = [n for n in self.plan.outputs if n is not None]  # a graph names every output
        missing = [n for n in self.plan.free_vars if n not in self.input_names]
        if missing:
            raise InputError(
                f"values used but never defined: {', '.join(missing[:8])}",
                where=f"graph {graph.name or '?'}",
                hint="the model is malformed",
            )

    # -- weights -------------------------------------------------------------------------

    def set_initializer(self, name: str, array: np.ndarray) -> None:
        """Replace a weight (fine-tuning); shape and dtype must stay the same. A weight is never
        written in place behind the executor's back: its wide copy (rule 9) would go stale; call
        this again after changing an array in place."""
        old = self.initializers.get(name)
        if old is None:
            raise InputError(f"no initializer named '{name}'", hint="see Executor.initializers")
        array = np.asarray(array)
        if array.shape != old.shape:
            raise InputError(f"initializer '{name}' has shape {old.shape}, got {array.shape}")
        self.constants.discard(old)
        self.initializers[name] = array.astype(old.dtype, copy=False)
        self.constants.add(self.initializers[name])

    # -- forward -------------------------------------------------------------------------

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        env: dict[str, Any] = dict(self.initializers)
        for name, dtype, shape in self.input_specs:
            if name not in feeds:
                raise InputError(
                    f"missing input '{name}'", hint=f"the model's inputs are: {', '.join(self.input_names)}"
                )
            x = feeds[name]
            if x is not None and not isinstance(x, (np.ndarray, list)):  # scalars, nested lists
                x = np.asarray(x)
            if isinstance(x, np.ndarray) and self.dtype_check:
                if dtype is not None and x.dtype != dtype:
                    raise InputError(
                        f"input '{name}' has dtype {x.dtype}, the model declares {dtype}",
                        hint=f"cast the feed to {dtype}",
                    )
                if shape is not None and x.ndim != len(shape):
                    raise InputError(
                        f"input '{name}' has rank {x.ndim} (shape {x.shape}), "
                        f"the model declares {len(shape)} {shape}",
                        hint="reshape the feed",
                    )
            env[name] = x
        for name, x in feeds.items():  # initializers listed as inputs may be overridden
            if name in self.initializers:
                env[name] = x
        return env

    def run(
        self, feeds: Mapping[str, Any], *, outputs: Iterable[str] | None = None, intermediates: bool = False
    ) -> dict[str, Any]:
        """Run the graph. Returns the requested outputs, or with ``intermediates`` every value
        (graph inputs, initializers excluded) keyed by name in topological order."""
        env = self._check_feeds(feeds)
        wanted = tuple(outputs) if outputs is not None else tuple(self.output_names)
        if intermediates:
            wanted_all = tuple(
                dict.fromkeys(wanted + tuple(o for s in self.plan.steps for o in s.outputs if o))
            )
            self._execute(self.plan, env, wanted_all, keep_all=True)
            result = {n: env[n] for n in self.input_names if n in env}
            for s in self.plan.steps:
                for o in s.outputs:
                    if o and o in env:
                        result[o] = env[o]
            return result
        self._execute(self.plan, env, wanted, keep_all=False)
        try:
            return {n: env[n] for n in wanted}
        except KeyError as exc:
            raise InputError(
                f"no value named {exc.args[0]!r} in the graph",
                hint="ask for a graph output or an intermediate value name",
            ) from None

    def _execute(self, plan: Plan, env: dict, wanted: tuple[str, ...], keep_all: bool) -> None:
        with wide_constants(self.constants):
            self._execute_steps(plan, env, wanted, keep_all)

    def _execute_steps(self, plan: Plan, env: dict, wanted: tuple[str, ...], keep_all: bool) -> None:
        for step, dying in plan.schedule(wanted, keep_all):
            args = [env[n] if n is not None else None for n in step.inputs]
            if step.has_subgraph:
                step.ctx.scope = env
            try:
                results = step.opdef.forward(args, step.attrs, step.ctx)
            except InputError as exc:
                if not (exc.where or "").startswith("node "):  # the innermost node names itself
                    here = f"node {show(step.name or '<unnamed>')} ({step.op_type})"
                    exc.where = f"{here}: {exc.where}" if exc.where and exc.where != step.op_type else here
                raise
            except Exception as exc:
                raise _node_failure(step, exc) from exc
            for name, val in zip(step.outputs, results):
                if name is not None:
                    env[name] = val
            for name in dying:
                env.pop(name, None)

    def _run_bound(self, plan: Plan, inputs: list, scope: Mapping[str, Any], *, keep_all: bool) -> dict:
        """Bind a body plan's initializers, outer-scope values and positional inputs, then run it."""
        env = dict(plan.initializers)
        for name in plan.free_vars:
            if name in scope:
                env[name] = scope[name]
        for name, x in zip(plan.inputs, inputs):
            if name:
                env[name] = x
        self._execute(plan, env, tuple(o for o in plan.outputs if o), keep_all=keep_all)
        return env

    def run_plan(self, plan: Plan, inputs: list, scope: Mapping[str, Any]) -> list:
        """Run a function body or subgraph plan with positional ``inputs`` and outer ``scope``."""
        env = self._run_bound(plan, inputs, scope, keep_all=False)
        return [env.get(n) if n else None for n in plan.outputs]

    def run_graph(self, graph: ir.Graph, inputs: list, scope: Mapping[str, Any]) -> list:
        """Run a subgraph (If/Loop/Scan body) of this model: the control-flow ops' entry point."""
        plan = self._subplans.get(id(graph))
        if plan is None:  # a graph built after construction (tests, passes)
            plan = self._builder.subgraph_plan(graph, self._builder.model_opsets)
        return self.run_plan(plan, inputs, scope)

    def subgraph_plan(self, graph: ir.Graph) -> Plan:
        plan = self._subplans.get(id(graph))
        return plan if plan is not None else self._builder.subgraph_plan(graph, self._builder.model_opsets)

    # -- reverse mode --------------------------------------------------------------------

    def vjp(
        self, feeds: Mapping[str, Any], cotangents: Mapping[str, np.ndarray], wrt: list[str]
    ) -> dict[str, np.ndarray]:
        """Gradients of ``sum(cotangent * output)`` with respect to the ``wrt`` values (forward
        and sweep under ``fast_math``: see the op registry's Exactness)."""
        with fast_math():
            env = self._check_feeds(feeds)
            self._execute(self.plan, env, tuple(cotangents), keep_all=True)
            self._check_wrt(wrt, env)
            return self._reverse(self.plan, env, dict(cotangents), wrt)

    def value_and_grad(
        self, feeds: Mapping[str, Any], loss: str | Callable[[dict], tuple[float, dict]], wrt: list[str]
    ) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and its gradients. ``loss`` names a scalar graph output, or is a callable
        taking the outputs and returning ``(loss, {output_name: dloss/doutput})``. Runs under
        ``fast_math`` (float32 accumulation: training needs no oracle precision)."""
        with fast_math():
            return self._value_and_grad(feeds, loss, wrt)

    def _value_and_grad(
        self, feeds: Mapping[str, Any], loss: str | Callable[[dict], tuple[float, dict]], wrt: list[str]
    ) -> tuple[float, dict[str, np.ndarray]]:
        env = self._check_feeds(feeds)
        if isinstance(loss, str):
            self._execute(self.plan, env, (loss,), keep_all=True)
            if loss not in env:
                raise InputError(f"no value named '{loss}' to use as the loss")
            value = env[loss]
            if np.size(value) != 1:
                raise InputError(
                    f"loss '{loss}' has shape {np.shape(value)}, expected a scalar",
                    hint="reduce it in the graph or pass a callable loss",
                )
            cot = {loss: np.ones_like(value)}
            loss_value = float(np.asarray(value).reshape(()))
        else:
            self._execute(self.plan, env, tuple(self.output_names), keep_all=True)
            loss_value, cot = loss({n: env[n] for n in self.output_names})
            loss_value = float(loss_value)
        self._check_wrt(wrt, env)
        return loss_value, self._reverse(self.plan, env, dict(cot), wrt)

    def _check_wrt(self, wrt: list[str], env: Mapping[str, Any]) -> None:
        bad = [w for w in wrt if w not in env]
        if bad:
            raise InputError(
                f"cannot differentiate with respect to unknown value(s): {', '.join(bad)}",
                hint="name graph inputs or initializers",
            )

    def _reverse(
        self, plan: Plan, env: Mapping[str, Any], grads: dict[str, Any], wrt: list[str]
    ) -> dict[str, np.ndarray]:
        # Forward reachability from wrt: only these values may carry gradient.
        live = set(wrt)
        active: list[Step] = []
        for step in plan.steps:
            if any(u in live for u in step.uses):
                active.append(step)
                live.update(o for o in step.outputs if o)
        for step in reversed(active):
            gouts = [grads.get(o) if o else None for o in step.outputs]
            if all(g is None for g in gouts):
                continue
            if step.opdef.vjp is None:
                raise UnsupportedError(
                    [(step.name or f"<unnamed {step.op_type}>", step.op_type)],
                    what="op without a VJP on the gradient path",
                    hint="add a vjp for it in mconv.engines.reference.ops",
                )
            args = [env[n] if n is not None else None for n in step.inputs]
            outs = [env.get(o) if o else None for o in step.outputs]
            if step.has_subgraph:
                step.ctx.scope = env
            gins = step.opdef.vjp(args, step.attrs, outs, gouts, step.ctx)
            pairs = list(zip(step.inputs, gins))
            if isinstance(gins, tuple) and len(gins) == 2 and isinstance(gins[1], dict):
                # a control-flow VJP: (input grads, grads of outer-scope values its body read)
                pairs = list(zip(step.inputs, gins[0])) + list(gins[1].items())
            for name, g in pairs:
                if name is None or g is None or name not in live:
                    continue
                prev = grads.get(name)
                grads[name] = g if prev is None else prev + g
        result = {}
        for w in wrt:
            g = grads.get(w)
            result[w] = np.zeros_like(env[w]) if g is None else g
        return result

    def subgraph_vjp(
        self, graph: ir.Graph, inputs: list, scope: Mapping[str, Any], cotangents: list
    ) -> tuple[list, dict[str, np.ndarray]]:
        """VJP through a subgraph: gradients of its positional inputs and of the outer-scope
        values it reads (control-flow ops return the latter so the sweep reaches them)."""
        plan = self.subgraph_plan(graph)
        env = self._run_bound(plan, inputs, scope, keep_all=True)
        cot = {o: g for o, g in zip(plan.outputs, cotangents) if o and g is not None}
        wrt = [
            n
            for n in (*plan.inputs, *plan.free_vars)
            if isinstance(env.get(n), np.ndarray) and np.issubdtype(env[n].dtype, np.inexact)
        ]
        got = self._reverse(plan, env, cot, wrt)
        return [got.get(n) for n in plan.inputs], {n: got[n] for n in plan.free_vars if n in got}

    def plan_vjp(self, plan: Plan, inputs: list, grads: list, scope: Mapping[str, Any]) -> list:
        """VJP through a function body plan: forward recorded, then the reverse sweep."""
        env = self._run_bound(plan, inputs, scope, keep_all=True)
        cot = {o: g for o, g in zip(plan.outputs, grads) if o and g is not None}
        wrt = [
            n
            for n, x in zip(plan.inputs, inputs)
            if n and x is not None and np.issubdtype(np.asarray(x).dtype, np.inexact)
        ]
        got = self._reverse(plan, env, cot, wrt)
        return [got.get(n) if n else None for n in plan.inputs]


def _node_failure(step: Step, exc: Exception) -> Exception:
    """Kernel failures on user data name the node; the original stays chained for --debug."""
    return InputError(
        f"{step.op_type} failed: {type(exc).__name__}: {str(exc)[:200]}",
        where=f"node {show(step.name or '<unnamed>')}",
        hint="check the input shapes and dtypes against the model",
    )


# --------------------------------------------------------------------------- single node


def run_node(
    op_type: str,
    inputs: list,
    attrs: Mapping[str, Any] | None = None,
    *,
    domain: str = "",
    opset: int = DEFAULT_OPSET,
    num_outputs: int | None = None,
) -> list[np.ndarray]:
    """Evaluate one node on numpy inputs (constant folding). Ops defined by a function body are
    expanded through a one-node model."""
    attrs = dict(attrs or {})
    opdef = lookup(op_type, domain)
    n_out = num_outputs if num_outputs is not None else _num_outputs(op_type, domain, opset)
    if opdef is not None:
        return list(opdef.forward(list(inputs), attrs, OpContext(opset=opset, num_outputs=n_out)))
    in_values = [ir.Value(name=f"in{i}") if x is not None else None for i, x in enumerate(inputs)]
    node = ir.Node(
        domain,
        op_type,
        in_values,
        attributes=ir.convenience.convert_attributes(attrs),
        num_outputs=n_out,
        name=op_type,
    )
    for i, out in enumerate(node.outputs):
        out.name = f"out{i}"
    graph = ir.Graph(
        [v for v in in_values if v is not None],
        list(node.outputs),
        nodes=[node],
        opset_imports={domain: opset} if domain else {"": opset},
    )
    model = ir.Model(graph, ir_version=10)
    exe = Executor(model, dtype_check=False)
    feeds = {f"in{i}": x for i, x in enumerate(inputs) if x is not None}
    res = exe.run(feeds)
    return [res[f"out{i}"] for i in range(len(node.outputs))]


def _num_outputs(op_type: str, domain: str, opset: int) -> int:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return 1
    return max(
        1,
        sum(1 for o in schema.outputs if o.option != onnx.defs.OpSchema.FormalParameterOption.Optional) or 1,
    )
