"""The engine a long data-driven run uses, chosen once, and compiled programs kept for the run.

Rules:

1. **Choice.** ``engine="auto"`` (the budget search's default) is ``xla`` (jax, compiled) when
   jax imports, else ``reference`` (numpy, the oracle): the fastest engine present. For the
   budget search (:func:`auto_engine`) also by the work: a fine-tuning stage of fewer than
   :data:`AUTO_XLA_MACS` multiply-adds (a small model on few samples) runs faster on the
   reference than the dozen programs xla would compile for the search cost (about a second of
   CPU each), so it stays there. ``device`` is ``cpu`` unless given (``cuda`` needs ``xla``). :func:`engine_label` names the
   choice as the CLI prints it and the JSON holds it (``"xla-cpu"``, ``"xla-cuda"``,
   ``"reference"``).
2. **Compiled once.** A model whose graph differs from an earlier one only in its float weights
   (a compression stage prunes, clusters or retrains values, never the graph) runs on the
   program compiled for the earlier one: :func:`xla_engine` keeps one
   :class:`~mconv.engines.xla.engine.XlaEngine` per (graph structure, outputs, device) in the
   run's memo and sets the weights of the model at hand into it. The structure is the nodes
   (ops, attributes, value names), the inputs' and initializers' names, dtypes and shapes, and
   the values of the initializers the lowering keeps static (shape tensors): a model whose
   static values differ gets a program of its own. jit then compiles once per batch shape.
3. **Batched forward.** :func:`run_batched` runs fixed feeds in batches of one size (the last
   one padded by repeating its first sample, the padding's outputs dropped), so a held-out
   split of any size costs one compiled program, not two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

_MEMO_KEY = "fast_engine.xla"


def has_jax() -> bool:
    try:
        import jax  # noqa: F401
    except Exception:  # noqa: BLE001  (a broken jax install is "not present" too)
        return False
    return True


def resolve_engine(engine: str | None, device: str | None) -> tuple[str, str]:
    """Rule 1: ``(engine, device)`` with ``auto`` (and None) decided."""
    chosen = engine or "auto"
    if chosen == "auto":
        chosen = "xla" if has_jax() else "reference"
    return chosen, device or "cpu"


# Rule 1: below this many multiply-adds of forward passes per fine-tuning stage the budget
# search stays on the reference (LeNet-5 on 750 digits: 3.4e10, xla; the 64 -> 10 digits
# classifier on 225: 1.2e7, reference).
AUTO_XLA_MACS = 1e9


def auto_engine(stage_macs: float, device: str | None = None) -> tuple[str, str]:
    """Rule 1 for a search whose stages each run ``stage_macs`` multiply-adds: ``(engine,
    device)``; a device other than the CPU is xla's."""
    device = device or "cpu"
    if device != "cpu":
        return "xla", device
    if not has_jax() or stage_macs < AUTO_XLA_MACS:
        return "reference", device
    return "xla", device


def engine_label(engine: str, device: str) -> str:
    """``xla-cpu``, ``xla-cuda`` or ``reference`` (rule 1)."""
    return f"xla-{device}" if engine == "xla" else "reference"


def _attr_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, ir.TensorProtocol):
        arr = value.numpy()
        return (arr.dtype.str, arr.shape, arr.tobytes())
    if isinstance(value, list | tuple):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, int | float | str | bytes | bool) or value is None:
        return value
    return repr(value)


def structure_key(model: ir.Model) -> tuple:
    """Rule 2's structure: what the compiled program depends on besides the weights' values."""
    g = model.graph
    nodes = tuple(
        (
            n.op_type,
            n.domain,
            tuple(v.name if v is not None else "" for v in n.inputs),
            tuple(o.name for o in n.outputs),
            tuple(sorted((k, _attr_key(a.value)) for k, a in n.attributes.items())),
        )
        for n in g
    )
    values = tuple(
        (v.name, str(v.dtype), tuple(str(d) for d in v.shape) if v.shape is not None else None)
        for v in (*g.inputs, *g.outputs)
    )
    inits = tuple(
        (name, str(v.const_value.dtype), tuple(v.const_value.shape))
        for name, v in g.initializers.items()
        if v.const_value is not None
    )
    return nodes, values, inits


def _same_static(engine: Any, model: ir.Model) -> bool:
    inits = model.graph.initializers
    for name, arr in engine.lowered.static_values.items():
        v = inits.get(name)
        if v is None or v.const_value is None or not np.array_equal(v.const_value.numpy(), arr):
            return False
    return True


def xla_engine(
    model: ir.Model, outputs: Sequence[str], device: str = "cpu", memo: dict | None = None, role: str = ""
) -> Any:
    """Rule 2: an :class:`~mconv.engines.xla.engine.XlaEngine` of ``model`` with its current
    weights, compiled once per structure for the run that owns ``memo`` (None: a new one).
    ``role`` keeps engines that hold different weights at once apart (the teacher's and the
    student's of one fine-tuning stage)."""
    from mconv.engines.xla.engine import XlaEngine

    if memo is None:
        return XlaEngine(model, list(outputs), device=device)
    cache = memo.setdefault(_MEMO_KEY, {})
    key = (role, structure_key(model), tuple(outputs), device)
    engine = cache.get(key)
    if engine is None or not _same_static(engine, model):
        engine = cache[key] = XlaEngine(model, list(outputs), device=device)
        return engine
    refresh_weights(engine, model)
    return engine


def refresh_weights(engine: Any, model: ir.Model) -> None:
    """The model's current weights into a cached engine (as the engine's lowering takes them)."""
    import jax

    inits = model.graph.initializers
    layouts = engine.lowered.layouts
    for name in engine.weight_names:
        tensor = inits[name].const_value
        assert tensor is not None  # the structure key holds the same initializers
        arr = np.asarray(tensor.numpy())
        old = engine.weights[name]
        if arr.dtype != old.dtype:
            arr = arr.astype(old.dtype)
        perm = layouts.get(name)
        if perm is not None:
            arr = np.ascontiguousarray(np.transpose(arr, perm))
        engine.weights[name] = jax.device_put(arr, engine.device)


def run_batched(
    runner: Any, feeds: Mapping[str, np.ndarray], names: Sequence[str], batch: int = 256
) -> dict[str, np.ndarray]:
    """Rule 3: ``runner.run`` over ``feeds`` in batches of ``batch`` (the last padded)."""
    n = len(next(iter(feeds.values())))
    size = min(batch, n)
    parts: dict[str, list] = {k: [] for k in names}
    for s in range(0, n, size):
        fb = {k: v[s : s + size] for k, v in feeds.items()}
        got = len(next(iter(fb.values())))
        if got < size:  # one program for every batch: pad with the first sample, drop its outputs
            fb = {k: np.concatenate([v, np.repeat(v[:1], size - got, axis=0)]) for k, v in fb.items()}
        res = runner.run(fb, outputs=list(names))
        for k in names:
            parts[k].append(np.asarray(res[k])[:got])
    return {k: np.concatenate(v) for k, v in parts.items()}


def squared_gradients(
    model: ir.Model,
    loss_value: str,
    batches: Sequence[tuple[Mapping[str, np.ndarray], np.ndarray]],
    tensors: Sequence[str],
    kind: str,
    device: str = "cpu",
    memo: dict | None = None,
) -> dict[str, np.ndarray] | None:
    """``sum over batches of len(batch) * grad**2`` (float64) of ``tensors`` for the mean loss
    of ``loss_value`` per batch: ``kind`` ``xent`` (softmax cross-entropy against integer
    targets: ``[N]`` for ``[N, classes]``, ``[N, T]`` for per-position ``[N, T, classes]``) or
    ``mse`` (against float targets), one jitted gradient program for the run (the
    budget search's Fisher, rule 3). None when a tensor is not a weight argument of the lowered
    program (the caller's reference path then)."""
    import jax
    import jax.numpy as jnp
    from mconv.engines.xla.jit import jit

    engine = xla_engine(model, [loss_value], device, memo, role="fisher")
    if any(t not in engine.weights or t in engine.lowered.layouts for t in tensors):
        return None
    fns = engine.__dict__.setdefault("_squared_gradients", {})
    key = (tuple(tensors), kind)
    if key not in fns:

        def loss(trained: dict, rest: dict, inputs: tuple, target: Any) -> Any:
            z = engine._call(inputs, {**rest, **trained})[0].astype(jnp.float32)
            if kind == "xent":  # classes on the last axis: [N, C] per sample, [N, T, C] per position
                logp = jax.nn.log_softmax(z, axis=-1)
                return -jnp.mean(jnp.take_along_axis(logp, target[..., None], axis=-1))
            d = z - target
            return jnp.mean(d * d)

        fns[key] = jit(jax.grad(loss))
    fn = fns[key]
    wanted = set(tensors)
    trained = {n: engine.weights[n] for n in tensors}
    rest = {n: w for n, w in engine.weights.items() if n not in wanted}
    acc = {t: np.zeros(engine.weights[t].shape) for t in tensors}
    for feeds, target in batches:
        target = target.astype(np.int32) if target.dtype.kind in "iu" else target.astype(np.float32)
        grads = fn(trained, rest, engine._inputs(feeds), target)
        n = len(target)
        for t in tensors:
            acc[t] += np.square(np.asarray(grads[t], dtype=np.float64)) * n
    return acc
