"""inline-if: an If whose condition is a constant becomes the nodes of its taken branch; and
``bake_input_values`` (``export --input-value NAME=VALUE``): graph inputs become constants,
then fold and inline-if run until nothing changes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import constant_array, fresh_name, replace_value
from mconv.errors import InputError, show
from mconv.passes.base import Pass, PassContext, PassReport, register_pass


def _all_names(model: ir.Model) -> Counter:
    """Every value name of the model (inputs, initializers, node outputs, every subgraph)."""
    names: Counter = Counter()
    for graph in model.graphs():
        names.update(v.name for v in graph.inputs if v.name)
        names.update(n for n, v in graph.initializers.items() if v not in graph.inputs)
        for node in graph:
            names.update(o.name for o in node.outputs if o.name)
    return names


def _inline(model: ir.Model, graph: ir.Graph, node: ir.Node, taken: bool, names: Counter) -> None:
    """Replace the If ``node`` of ``graph`` by its ``then_branch`` (taken) or ``else_branch``."""
    outs = move_branch(graph, node, taken, names)
    for if_out, br_out in zip(node.outputs, outs):
        replace_value(if_out, br_out)
    graph.remove(node, safe=True)


def move_branch(graph: ir.Graph, node: ir.Node, taken: bool, names: Counter) -> list[ir.Value]:
    """Move the nodes and initializers of the If ``node``'s ``then_branch`` (taken) or
    ``else_branch`` into ``graph`` before the If; returns a value for each If output (its own:
    an outer value or a repeated one goes through an Identity), typed as the If output."""
    attr = node.attributes["then_branch" if taken else "else_branch"]
    branch = attr.as_graph()
    outs = list(branch.outputs)
    moved = {id(v) for v in branch.initializers.values()}
    for n in branch:
        moved.update(id(o) for o in n.outputs)
    all_names = set(names)
    # names produced inside the branch that are used elsewhere too get fresh ones
    for n in branch:
        for o in n.outputs:
            if o.name and names[o.name] > 1:
                names[o.name] -= 1
                o.name = fresh_name(o.name, all_names)
                names[o.name] += 1
    inits = list(branch.initializers.values())
    branch.outputs.clear()
    branch.initializers.clear()
    for v in inits:
        if v.name is not None and v.name in graph.initializers or names[v.name or ""] > 1:
            names[v.name or ""] -= 1
            v.name = fresh_name(v.name or "branch_init", all_names)
            names[v.name] += 1
        graph.register_initializer(v)
    body = list(branch)
    branch.remove(body, safe=False)
    if body:
        graph.insert_before(node, body)
    results = []
    for if_out, br_out in zip(node.outputs, outs):
        if id(br_out) not in moved or br_out.is_graph_output() or outs.count(br_out) > 1:
            # an outer value, or one value for two outputs: an Identity keeps each output its own
            ident = ir.node("Identity", [br_out], name=fresh_name(f"{node.name or 'If'}_out", all_names))
            graph.insert_before(node, ident)
            br_out = ident.outputs[0]
            br_out.name = fresh_name(f"{if_out.name or 'if_out'}_inlined", all_names)
            names[br_out.name] += 1  # a second branch moved beside this one sees it taken
            moved.add(id(br_out))
        if br_out.type is None:
            br_out.type = if_out.type
        if br_out.shape is None:
            br_out.shape = if_out.shape
        results.append(br_out)
    return results


def inline_constant_ifs(model: ir.Model) -> list[str]:
    """Inline every If whose condition is a constant, nested ones too; returns one note per If."""
    notes: list[str] = []
    for _ in range(64):  # a taken branch may hold another If: sweep again
        found = False
        names = _all_names(model)
        for graph in model.graphs():
            for node in list(graph):
                if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs:
                    continue
                cond = constant_array(node.inputs[0], graph, model.ir_version)
                if cond is None or cond.size != 1:
                    continue
                taken = bool(np.asarray(cond).reshape(-1)[0])
                _inline(model, graph, node, taken, names)
                notes.append(
                    f"If '{show(node.name or '')}': the {'then' if taken else 'else'} branch inlined"
                )
                found = True
                break  # the graph list changed (the branch's subgraphs moved): start over
            if found:
                break
        if not found:
            break
    return notes


@register_pass("inline-if")
class InlineIf(Pass):
    """An If whose condition is a constant is replaced by its taken branch.

    1. The condition is a constant: an initializer that is not an overridable input, or a
       ``Constant`` node's output (run ``fold`` first to make a computed condition constant).
    2. The taken branch's nodes move into the If's graph before the If, its initializers become
       the graph's; values the branch reads from outer scopes stay those values. A branch value
       whose name is taken elsewhere in the model gets a fresh name.
    3. Each If output becomes the branch output it stood for; a branch output that is an outer
       value, or one value given for two outputs, goes through an Identity. An If output that
       is a graph output keeps its name.
    4. Ifs inside subgraphs, and Ifs a taken branch brings along, are inlined too.
    """

    @dataclass
    class Config:
        pass

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        notes = inline_constant_ifs(model)
        return self.report(bool(notes), notes=notes or ["no If with a constant condition"])


# --- export --input-value -------------------------------------------------------------------------

_INTS = {
    ir.DataType.INT8,
    ir.DataType.INT16,
    ir.DataType.INT32,
    ir.DataType.INT64,
    ir.DataType.UINT8,
    ir.DataType.UINT16,
    ir.DataType.UINT32,
    ir.DataType.UINT64,
}
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def _parse_value(text: str, value: ir.Value, path: str | None) -> np.ndarray:
    """``text`` as a constant for input ``value``: its dtype, broadcast to its (static) shape."""
    name = show(value.name or "")
    dtype = value.dtype
    if dtype is None:
        raise InputError(
            f"--input-value {name}: the input has no element type", path=path, hint="check the model"
        )
    shape = [] if value.shape is None else list(value.shape)
    dims = [d for d in shape if isinstance(d, int)]
    if len(dims) != len(shape):
        raise InputError(
            f"--input-value {name}: input '{name}' has symbolic dimensions {[str(d) for d in shape]}",
            path=path,
            hint=f"fix them first: --input-shape {name}=DIMS",
        )
    t = text.strip().lower()
    try:
        if dtype == ir.DataType.BOOL:
            if t not in _TRUE | _FALSE:
                raise ValueError("not a bool (true/false or 1/0)")
            scalar: float | int | bool = t in _TRUE
        elif dtype in _INTS:
            scalar = int(t)
            info = np.iinfo(dtype.numpy())
            if not info.min <= scalar <= info.max:
                raise ValueError(f"outside {dtype.name.lower()}'s range")
        elif dtype.is_floating_point():
            scalar = float(t)
        else:
            raise ValueError(f"a {dtype.name.lower()} input takes no --input-value")
    except ValueError as exc:
        detail = (
            str(exc)
            if "input" in str(exc) or "range" in str(exc) or "bool" in str(exc)
            else f"not a {dtype.name.lower()}"
        )
        raise InputError(
            f"--input-value {name}={show(text)}: {detail}",
            path=path,
            hint=f"input '{name}' is {dtype.name.lower()} {dims}: give one number",
        ) from None
    return np.full(dims, scalar, dtype=dtype.numpy())


def bake_input_values(
    model: ir.Model, values: dict[str, str], *, path: str | None = None
) -> tuple[ir.Model, list[str]]:
    """Rule of ``export --input-value NAME=VALUE``: each named graph input becomes a constant of
    its dtype (the value broadcast to its static shape), then ``fold`` and ``inline-if`` run until
    nothing changes (a condition on the input picks its branch), then ``dce``. Returns the model
    (``model`` itself, changed in place, unless a pass gave a new one) and notes."""
    if not values:
        return model, []
    from mconv.irio import real_inputs
    from mconv.passes import parse_spec, run_pipeline

    graph = model.graph
    inputs = {v.name: v for v in real_inputs(graph)}
    notes = []
    for name, text in values.items():
        value = inputs.get(name)
        if value is None:
            listed = ", ".join(show(n or "") for n in inputs) or "none"
            raise InputError(
                f"--input-value names '{show(name)}', which is not an input of the model",
                path=path,
                hint=f"inputs: {listed}",
            )
        array = _parse_value(text, value, path)
        graph.inputs.remove(value)
        value.const_value = ir.tensor(array, name=name)
        graph.register_initializer(value)
        notes.append(f"input '{show(name)}' baked to {show(text.strip())}")
    for _ in range(16):
        before = len(list(model.graph))
        model, _ = run_pipeline(model, parse_spec("fold"))
        inlined = inline_constant_ifs(model)
        notes += inlined
        if not inlined and len(list(model.graph)) == before:
            break
    model, _ = run_pipeline(model, parse_spec("dce"))
    return model, notes
