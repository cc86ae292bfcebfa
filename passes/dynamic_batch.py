"""dynamic-batch: free a batch size that the model's constants pin, so every runtime agrees.

Exporters often write the batch they traced with into the graph: the inputs say ``[1, 3, 224,
224]`` and a ``Reshape(x, [1, 9216])`` before the classifier pins it again. A target that makes
the batch symbolic anyway (XLA's polymorphic export) then runs a model that the source model
refuses, and one that broadcasts a pinned shape can silently compute something else. This pass
rewrites the model itself, so the reference executor and every target run the same thing.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import constant_array, name_of
from mconv.errors import InputError, show
from mconv.irio import real_inputs
from mconv.passes.base import Pass, PassContext, PassReport, register_pass


def _dims(value_info) -> list | None:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [
        d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
        for d in t.shape.dim
    ]


def _inferred_dims(model: ir.Model) -> dict[str, list | None]:
    """Shapes of every main-graph value, inferred afresh from the inputs (intermediates cleared)."""
    from mconv.passes.shape_inference import infer_on_stripped_copy

    graph = model.graph
    keep = {v.name for v in graph.inputs} | set(graph.initializers)
    saved = {}
    for node in graph:
        for out in node.outputs:
            if out is not None and out.name not in keep:
                saved[out.name] = (out, out.shape)
                out.shape = None
    try:
        proto = infer_on_stripped_copy(model, keep_bytes=1 << 16, strict=False, data_prop=True)
    finally:
        for value, shape in saved.values():
            value.shape = shape
    if proto is None:
        return {}
    g = proto.graph
    return {vi.name: _dims(vi) for vi in [*g.input, *g.value_info, *g.output]}


def _set_shape_constant(node: ir.Node, index: int, array: np.ndarray) -> None:
    """Give input ``index`` of ``node`` a new constant, from a ``Constant`` node (the old value may
    be shared; an initializer would also have to be a graph input below IR version 4)."""
    graph = node.graph
    assert graph is not None  # a node of the graph being rewritten
    old = node.inputs[index]
    base = f"{node.name or node.op_type}_dynamic_batch_shape"
    taken = {v.name for v in ir.convenience.create_value_mapping(graph).values()}
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    const = ir.node(
        "Constant", [], attributes={"value": ir.tensor(array.astype(np.int64), name=name)}, name=name
    )
    const.outputs[0].name = name
    const.outputs[0].shape = ir.Shape(list(array.shape))
    const.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    graph.insert_before(node, const)
    node.replace_input_with(index, const.outputs[0])
    if old is not None and not old.uses() and not old.is_graph_output():
        producer = old.producer()
        if old.is_initializer() and old.name in graph.initializers and old not in graph.inputs:
            graph.initializers.pop(name_of(old))
        elif producer is not None and producer.op_type == "Constant":
            graph.remove(producer, safe=True)


@register_pass("dynamic-batch")
class DynamicBatch(Pass):
    """Make dimension 0 of the inputs and outputs symbolic, rewriting the constants that pin it.

    1. Each real graph input whose dimension 0 is a fixed size ``B`` (all such inputs must agree)
       gets the symbol (``N`` by default). Inputs already symbolic there: nothing to do.
    2. Shapes are inferred from the inputs; a ``Reshape`` whose data input has dimension 0 ``N``
       but whose constant target shape says ``B`` in position 0 pins the batch::

           before: Reshape(x[N,256,6,6], [1, 9216])     after: Reshape(x, [0, 9216])

       (a node with ``allowzero=1`` and no zero in its shape gets ``allowzero=0``, the same
       there, so that ``0`` copies the batch);
       an ``Expand`` to a constant ``[B, ...]`` of an ``N``-batched input becomes ``[1, ...]``.
       Repeated until no such node is left.
    3. The outputs whose inferred dimension 0 is ``N`` say so. An output that stays at ``B``
       (a constant of that size, an LSTM state, a pinned op this pass does not rewrite) is an
       error naming the first node whose output lost the symbol.
    4. With ``check`` (default), the rewritten model runs in the reference executor on two
       samples at once and on each sample alone with the original model; outputs must agree.
    """

    lossless = True

    @dataclass
    class Config:
        symbol: str = "N"
        check: bool = True

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        graph = model.graph
        inputs = [(v, s) for v in real_inputs(graph) if (s := v.shape) is not None and len(s) > 0]
        fixed = {v.name: s[0] for v, s in inputs if isinstance(s[0], int)}
        if not fixed:
            return self.report(False, notes=["dimension 0 of the inputs is already symbolic (or absent)"])
        sizes = set(fixed.values())
        if len(sizes) > 1:
            raise InputError(
                "dynamic-batch: the inputs disagree on dimension 0 "
                + ", ".join(f"'{show(n)}'={b}" for n, b in fixed.items()),
                where="graph inputs",
                hint="fix the batch with --input-shape instead",
            )
        batch = sizes.pop()
        original = model if not config.check else _copy(model)
        sym = config.symbol
        for v, s in inputs:
            if v.name in fixed:
                v.shape = ir.Shape([sym, *list(s)[1:]])
        rewritten: list[str] = []
        for _ in range(64):
            dims = _inferred_dims(model)
            hit = self._rewrite_one(graph, dims, sym, batch, model.ir_version or 10)
            if hit is None:
                break
            rewritten.append(hit)
        dims = _inferred_dims(model)
        for out in graph.outputs:
            d = dims.get(name_of(out))
            if d and d[0] == sym:
                out.shape = ir.Shape(d)
            elif d and d[0] is not None:
                culprit = self._first_pinning(graph, dims, sym)
                raise InputError(
                    f"dynamic-batch: output '{show(out.name)}' stays at batch {d[0]}",
                    where=culprit,
                    hint="this op pins the batch in a way the pass does not rewrite; keep a static batch",
                )
        # intermediates: stale static shapes go; inference fills them in with the symbol
        from mconv.passes.shape_inference import infer_on_stripped_copy, merge_inferred

        for node in graph:
            for o in node.outputs:
                if o is not None and not o.is_graph_output():
                    o.shape = None
        proto = infer_on_stripped_copy(model, keep_bytes=1 << 16, strict=False, data_prop=True)
        if proto is not None:
            merge_inferred(model, proto)
        notes = [f"batch {batch} -> {sym} on {len(fixed)} input(s)"] + [f"rewrote {h}" for h in rewritten]
        if config.check:
            _check_same(original, model, batch, ctx)
            notes.append("checked: 2 samples at once match each sample alone in the original")
        return self.report(True, notes=notes)

    @staticmethod
    def _rewrite_one(graph: ir.Graph, dims: dict, sym: str, batch: int, ir_version: int) -> str | None:
        for node in graph:
            if node.domain not in ("", "ai.onnx") or node.op_type not in ("Reshape", "Expand"):
                continue
            if len(node.inputs) < 2 or node.inputs[0] is None:
                continue
            d_in = dims.get(node.inputs[0].name)
            if not d_in or d_in[0] != sym:
                continue
            shape = constant_array(node.inputs[1], graph, ir_version)
            if shape is None or shape.ndim != 1 or shape.size == 0 or int(shape[0]) != batch:
                continue
            new = shape.astype(np.int64).copy()
            if node.op_type == "Reshape":
                allowzero = node.attributes.get("allowzero")
                if allowzero is not None and allowzero.value:
                    if (new == 0).any():
                        continue  # a literal zero-size dim: leave it
                    # no zeros in the shape: allowzero changes nothing, and 0 may mean "copy"
                    node.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
                new[0] = 0
            else:
                new[0] = 1
            _set_shape_constant(node, 1, new)
            return f"{node.op_type} '{show(node.name)}' shape {shape.tolist()} -> {new.tolist()}"
        return None

    @staticmethod
    def _first_pinning(graph: ir.Graph, dims: dict, sym: str) -> str:
        for node in graph:
            ins = [dims.get(v.name) for v in node.inputs if v is not None]
            if not any(d and d[0] == sym for d in ins):
                continue
            for o in node.outputs:
                d = dims.get(o.name) if o is not None else None
                if d and d[0] != sym:
                    return f"node '{show(node.name)}' ({node.op_type})"
        return "graph outputs"


def _copy(model: ir.Model) -> ir.Model:
    """A structural copy sharing the tensors (a serialised round trip would drop an external
    tensor's folder, and its copy would then read from the working folder)."""
    return model.clone()


def _feed(spec, batch: int, rng: np.random.Generator) -> np.ndarray:
    shape = [batch, *[d if isinstance(d, int) else 1 for d in list(spec.shape)[1:]]]
    dtype = spec.dtype.numpy() if spec.dtype is not None else np.float32
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 2, shape).astype(dtype)


def _run_all(model: ir.Model, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The model's outputs on each of ``feeds``, from one reference executor that is gone when
    this returns: an executor is a reference cycle (its ops' contexts point back at it), and
    what it prepared of the weights (a model's size again) would otherwise stay until the
    cyclic garbage collector runs, beside the next executor's, and keep views of memory-mapped
    weights alive."""
    from mconv.engines.reference import Executor

    runner = Executor(model)
    try:
        return [runner.run(f) for f in feeds]
    finally:
        del runner
        gc.collect()


def _check_same(original: ir.Model, model: ir.Model, batch: int, ctx: PassContext) -> None:
    """Two samples through the rewritten model == each sample alone through the original."""
    rng = ctx.rng(7)
    specs = [v for v in real_inputs(original.graph) if v.shape is not None and len(v.shape) > 0]
    n = 2 * batch
    feeds = {name_of(v): _feed(v, n, rng) for v in specs}
    got = _run_all(model, [feeds])[0]
    alones = _run_all(original, [{k: a[i : i + batch] for k, a in feeds.items()} for i in range(0, n, batch)])
    for i, alone in zip(range(0, n, batch), alones):
        for name, want in alone.items():
            have = np.asarray(got[name])[i : i + batch]
            if have.shape != np.asarray(want).shape or not np.allclose(have, want, rtol=1e-4, atol=1e-5):
                raise InputError(
                    f"dynamic-batch: output '{show(name)}' of a batch of {n} differs from the samples run alone",
                    where="graph outputs",
                    hint="the model mixes samples across the batch (or pins it where the pass cannot see); keep a static batch",
                )
