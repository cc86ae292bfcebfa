"""Rules 3, 4 and 12: each layer's candidate settings with their bytes and estimated cost."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from mconv.drivers.budget.config import BITS, PRUNE_RECOVERY, SPARSITIES, Progress
from mconv.drivers.budget.evaluation import _Evaluator
from mconv.edit.weights import weight_refs
from mconv.irio import self_contained_bytes


@dataclass
class _Cut:
    """Rule 14: one structured option of a layer, ``fraction`` of its output channels removed
    (the smallest L2 norms, as ``prune(structured="l2")`` removes them)."""

    fraction: float
    out_axis: int
    channels: int
    keep: list[int]
    removed: list[int]
    removed_cost: float = 0.0  # Fisher-weighted cost of the removed channels (PRUNE_RECOVERY counted)
    own: dict[tuple[float, int | None], int] = field(default_factory=dict)  # the kept tensor's bytes
    credit: dict[tuple[float, int | None], int] = field(default_factory=dict)  # the consumers' saving


@dataclass
class _Layer:
    name: str  # node name (recipe op_name key)
    op_type: str
    tensor: str
    params: int
    weights: np.ndarray
    # (sparsity, bits) -> (bytes, cost); bits None: not clustered
    # (sparsity, bits, fraction): structured, rule 14 (sparsity of the kept weights)
    options: dict[tuple, tuple[int, float]] = field(default_factory=dict)
    snr: dict[tuple, float] = field(default_factory=dict)
    cuts: dict[float, _Cut] = field(default_factory=dict)  # rule 14: fraction -> its cut
    unsafe: str | None = None  # rule 14: why its channels cannot be removed, when they cannot


def _compressed(w: np.ndarray, sparsity: float, bits: int | None) -> np.ndarray:
    from mconv.passes.cluster import cluster_array
    from mconv.passes.prune import magnitude_mask

    out = w
    if sparsity > 0:
        keep, _ = magnitude_mask(w, sparsity)
        out = np.where(keep, w, np.zeros((), w.dtype))
    if bits is not None:
        out = cluster_array(out, bits, "linear")
    return out


def _stored_bytes(a: np.ndarray, sparsity: float, bits: int | None) -> int:
    """What export stores for ``a`` once the schedule's last stage has rounded its values (and
    a palette's codebook) to float16."""
    from mconv.codecs.choose import best_spec

    if a.dtype == np.float32:
        a = a.astype(np.float16).astype(np.float32)
    hints: dict = {}
    if sparsity > 0:
        hints["pruned"] = True
    if bits is not None:
        hints["bits"] = bits
    return int(best_spec(a, hints)[1])


def _fisher(model: ir.Model, ev: _Evaluator, idx: np.ndarray, tensors: list[str], batch: int = 8) -> dict:
    """Diagonal empirical Fisher of the cross-entropy for ``tensors`` (rule 3): B * mean(g_B**2)."""
    from mconv.engines.reference.executor import Executor
    from mconv.passes.finetune import _score_output, softmax_cross_entropy

    _, loss_value = _score_output(model)
    # per-position probabilities [N, T, C] (a CTC recognizer): the cross-entropy at every position
    # against the original's top-1 class there, on the logits the loss reads; a squared error of
    # those logits against the original's probabilities is far from zero at the original itself
    target = (
        ev.labels
        if ev.labels is not None
        else (ev.reference.argmax(-1) if ev.is_scores or ev.is_sequence else None)
    )
    if ev.engine == "xla":  # rule 11: one compiled gradient program for the search
        from mconv.engines.fast import squared_gradients

        batches = [
            (
                {k: v[idx[s : s + batch]] for k, v in ev.feeds.items()},
                (target if target is not None else ev.reference)[idx[s : s + batch]],
            )
            for s in range(0, len(idx), batch)
        ]
        kind = "xent" if target is not None else "mse"
        got = squared_gradients(model, loss_value, batches, tensors, kind, ev.device, ev.memo)
        if got is not None:
            return {t: a / max(len(batches), 1) for t, a in got.items()}
    ex = Executor(model)
    ex.output_names = [loss_value]
    acc = {t: np.zeros(ex.initializers[t].shape) for t in tensors}
    steps = 0
    for s in range(0, len(idx), batch):
        sel = idx[s : s + batch]

        def loss_fn(outputs, sel=sel):
            z = outputs[loss_value]
            if target is not None and z.ndim == 2:
                value, g = softmax_cross_entropy(z, target[sel])
            elif target is not None and z.ndim == 3 and target.ndim == 2:  # per position
                value, g = softmax_cross_entropy(z.reshape(-1, z.shape[-1]), target[sel].ravel())
                g = g.reshape(z.shape)
            else:  # not class scores: squared error against the original
                d = z.astype(np.float64) - ev.reference[sel]
                value, g = float(np.mean(d * d)), (2 * d / d.size).astype(z.dtype)
            return value, {loss_value: g}

        _, grads = ex.value_and_grad({k: v[sel] for k, v in ev.feeds.items()}, loss_fn, tensors)
        for t in tensors:
            acc[t] += np.square(grads[t].astype(np.float64)) * len(sel)
        steps += 1
    return {t: a / max(steps, 1) for t, a in acc.items()}


def _candidates(
    model: ir.Model,
    ev: _Evaluator | None,
    train: np.ndarray | None,
    estimator: str,
    progress: Progress | None,
    sparsities=SPARSITIES,
    bits=BITS,
    *,
    workers: int = 0,
    ray_address: str | None = None,
    structured: tuple[float, ...] = (),
) -> tuple[list[_Layer], dict]:
    """Every layer's options with bytes and estimated cost (rules 3, 4); and timing facts.

    Each layer's options are one independent trial (rule 12): with ``workers`` / ``ray_address``
    they run on Ray (:func:`mconv.drivers.parallel.map_trials`), the weights, the Fisher and (for
    the ``sweep`` estimator) the model and data put in the object store once."""
    from mconv.drivers.parallel import check_workers, map_trials, new_token, uses_ray

    check_workers(workers, ray_address)
    layers = []
    for ref in weight_refs(model):
        if not ref.node.name:
            continue
        w = ref.array()
        if w.dtype.kind != "f" or w.size < 16:
            continue
        layers.append(_Layer(ref.node.name, ref.node.op_type, ref.name, int(w.size), w))
    t0 = time.perf_counter()
    fisher = None
    sample = None if train is None else train[:256]
    if ev is not None and estimator == "fisher":
        assert sample is not None  # an evaluator comes with its training split
        fisher = _fisher(model, ev, sample, [layer.tensor for layer in layers])
    on_ray = uses_ray(workers, ray_address)
    shared: dict = {
        "token": new_token(),
        "weights": {layer.tensor: layer.weights for layer in layers},
        "fisher": fisher,
        "sparsities": tuple(sparsities),
        "bits": tuple(bits),
        "ev": ev,
        "sample": sample,
        "sweep": ev is not None and fisher is None,
    }
    if shared["sweep"]:  # the sweep estimator runs the model: ONNX bytes on Ray, never objects
        if on_ray:
            shared["onnx"] = self_contained_bytes(model)
        else:
            shared["model"] = model
    per_layer = len(sparsities) * (1 + len(bits))
    total = len(layers) * per_layer
    if on_ray:

        def tick(done: int, count: int) -> None:
            if progress is not None:
                progress(f"sensitivity ({estimator}): {done}/{count} layers on Ray", done * per_layer, total)

        results = map_trials(
            _options_trial,
            shared,
            [layer.tensor for layer in layers],
            workers=workers,
            address=ray_address,
            progress=tick,
        )
    else:
        state = _OptionsState(shared)
        results = []
        for i, layer in enumerate(layers):

            def step(j: int, name: str = layer.name, before: int = i * per_layer) -> None:
                if progress is not None:
                    progress(f"sensitivity ({estimator}) {name}", before + j, total)

            results.append(state.options(layer.tensor, step))
    for layer, (options, snr) in zip(layers, results):
        layer.options.update(options)
        layer.snr.update(snr)
    if structured and fisher is not None:  # rule 14: with the Fisher estimate only
        if progress is not None:
            progress("sensitivity: structured options", total, total)
        _structured_options(model, layers, fisher, tuple(sparsities), tuple(bits), structured)
    facts = {"estimator": estimator if ev is not None else "weight-snr", "seconds": time.perf_counter() - t0}
    return layers, facts


class _OptionsState:
    """One process's state for the layers' options (rule 12): built here, or once per Ray worker
    from the shared object (the model parsed from its ONNX bytes, an executor for ``sweep``)."""

    def __init__(self, shared: Mapping) -> None:
        from mconv.engines.reference.executor import Executor

        self.weights: Mapping[str, np.ndarray] = shared["weights"]
        self.fisher: Mapping[str, np.ndarray] | None = shared["fisher"]
        self.sparsities = tuple(shared["sparsities"])
        self.bits = tuple(shared["bits"])
        self.ev: _Evaluator | None = shared["ev"]
        self.sample: np.ndarray | None = shared["sample"]
        self.executor = None
        if shared["sweep"]:
            if "model" in shared:
                model = shared["model"]
            else:
                import onnx

                model = ir.serde.deserialize_model(onnx.load_from_string(shared["onnx"]))
            self.executor = Executor(model)

    def options(
        self, tensor: str, step: Callable[[int], None] | None = None
    ) -> tuple[dict[tuple[float, int | None], tuple[int, float]], dict[tuple[float, int | None], float]]:
        """``(options, snr)`` of one layer's weight: (sparsity, bits) -> (bytes, cost) and -> dB."""
        w = self.weights[tensor]
        ev, fisher, executor, sample = self.ev, self.fisher, self.executor, self.sample
        options: dict[tuple[float, int | None], tuple[int, float]] = {}
        snr: dict[tuple[float, int | None], float] = {}
        energy = float(np.sum(np.square(w, dtype=np.float64)))
        base_kl = 0.0
        pruned_kl: dict[float, float] = {}
        done = 0
        for s in self.sparsities:
            pruned = _compressed(w, s, None)
            for b in (None, *self.bits):
                a = pruned if b is None else _compressed(pruned, 0.0, b)
                nbytes = _stored_bytes(a, s, b) if (s > 0 or b is not None) else w.size * 2
                err = float(np.sum(np.square(a.astype(np.float64) - w)))
                if ev is None:
                    cost = err / max(energy, 1e-300)
                elif fisher is not None:
                    f2 = fisher[tensor] * np.square(a.astype(np.float64) - w)
                    cut = (pruned == 0) & (w != 0)
                    cost = 0.5 * float(PRUNE_RECOVERY * np.sum(f2[cut]) + np.sum(f2[~cut]))
                elif s == 0 and b is None:
                    cost = 0.0
                else:
                    assert executor is not None and sample is not None  # made above for ev
                    executor.set_initializer(tensor, a)
                    cost = ev.kl(ev.outputs(executor, sample), sample) - base_kl
                    executor.set_initializer(tensor, w)
                    if b is None:
                        pruned_kl[s] = cost
                    if PRUNE_RECOVERY != 1.0:
                        cut = pruned_kl.get(s, 0.0)
                        cost = PRUNE_RECOVERY * cut + max(cost - cut, 0.0)
                options[(s, b)] = (nbytes, max(cost, 0.0))
                snr[(s, b)] = 10 * np.log10(energy / err) if err > 0 else np.inf
                done += 1
                if step is not None:
                    step(done)
        return options, snr


def _options_trial(shared: Mapping, tensor: str) -> tuple[dict, dict]:
    """One layer's options in a Ray worker (its state built once per worker)."""
    from mconv.drivers.parallel import worker_state

    return worker_state(shared, _OptionsState).options(tensor)


def _structured_options(
    model: ir.Model,
    layers: list[_Layer],
    fisher: Mapping[str, np.ndarray],
    sparsities: tuple[float, ...],
    bits: tuple[int, ...],
    fractions: tuple[float, ...],
) -> None:
    """Rule 14: each Conv/Gemm layer whose output channels can be removed safely (the rewiring
    plan of :mod:`mconv.edit.channels`, made on a copy and never applied) gets, per fraction
    ``f`` of ``fractions``, the options ``(s, b, f)``: ``f`` of its channels removed (L2 norm),
    then the kept weights pruned to ``s`` and clustered to ``b`` bits. Bytes: the kept tensor's
    as export codes it (rule 4) less what the cut saves downstream (the consumers' weight rows,
    counted at the consumer's own option ``(s, b)`` in proportion to the weights removed, and
    the sliced biases and constants at :data:`~mconv.drivers.budget.schedule.BIAS_BITS`).
    Cost: the Fisher-weighted loss of the removed channels counted :data:`PRUNE_RECOVERY`
    times (a masked retraining follows the cut as it follows a prune step) plus the option
    ``(s, b)``'s cost on the kept weights, as rule 3 counts it."""
    from mconv.edit.channels import Unsafe, channel_norms, plan_removal
    from mconv.edit.shapes import infer_on_stripped_copy, merge_inferred
    from mconv.passes.pipeline import snapshot_model

    copy = snapshot_model(model)
    inferred = infer_on_stripped_copy(copy, keep_bytes=1024, strict=False, data_prop=True)
    if inferred is not None:
        merge_inferred(copy, inferred)
    refs = {ref.node.name: ref for ref in weight_refs(copy) if ref.node.name}
    by_tensor = {layer.tensor: layer for layer in layers}
    for layer in layers:
        ref = refs.get(layer.name)
        if ref is None or layer.op_type not in ("Conv", "Gemm"):
            continue
        w, f2 = layer.weights.astype(np.float64), fisher[layer.tensor]
        count = ref.shape[ref.out_axis]
        order = np.argsort(channel_norms(ref, "l2"), kind="stable")
        for fraction in fractions:
            n_remove = min(int(round(fraction * count)), count - 1)
            if n_remove <= 0:
                continue
            removed = sorted(int(c) for c in order[:n_remove])
            keep = sorted(int(c) for c in order[n_remove:])
            try:
                plan = plan_removal(ref, keep)
            except Unsafe as exc:
                layer.unsafe = exc.reason
                break
            cut = _Cut(fraction, ref.out_axis, count, keep, removed)
            gone = np.take(f2 * w * w, removed, axis=ref.out_axis)
            cut.removed_cost = 0.5 * PRUNE_RECOVERY * float(np.sum(gone))
            kept = np.take(layer.weights, keep, axis=ref.out_axis)
            kept_f = np.take(f2, keep, axis=ref.out_axis)
            downstream = []  # (consumer layer or None, weights removed there)
            for value, axis, kept_idx in plan.slices.values():
                if value.name == layer.tensor or value.const_value is None:
                    continue
                shape = tuple(int(d) for d in value.const_value.shape.numpy())
                size = int(np.prod(shape))
                lost = size - size // max(shape[axis], 1) * len(kept_idx)
                downstream.append((by_tensor.get(value.name or ""), lost, size))
            for s in sparsities:
                pruned = _compressed(kept, s, None)
                cut_mask = (pruned == 0) & (kept != 0)
                for b in (None, *bits):
                    a = pruned if b is None else _compressed(pruned, 0.0, b)
                    own = _stored_bytes(a, s, b) if (s > 0 or b is not None) else a.size * 2
                    e2 = kept_f * np.square(a.astype(np.float64) - kept)
                    cost = 0.5 * float(PRUNE_RECOVERY * np.sum(e2[cut_mask]) + np.sum(e2[~cut_mask]))
                    credit = 0
                    for consumer, lost, size in downstream:
                        if consumer is None:  # a bias or constant: clustered to BIAS_BITS
                            credit += lost // 2
                        elif (s, b) in consumer.options:
                            credit += int(round(consumer.options[(s, b)][0] * lost / max(size, 1)))
                    cut.own[(s, b)], cut.credit[(s, b)] = own, credit
                    layer.options[(s, b, fraction)] = (max(own - credit, 1), cut.removed_cost + cost)
            layer.cuts[fraction] = cut


def cut_of(layer: _Layer, key: tuple) -> _Cut | None:
    """Rule 14: the structured cut an option ``key`` makes, None for an unstructured one."""
    return layer.cuts.get(key[2]) if len(key) > 2 and key[2] else None


def simulated(layer: _Layer, key: tuple) -> np.ndarray:
    """The layer's weights as option ``key`` leaves them, at their original shape (a cut
    channel zeroed rather than removed): rule 7's start estimate."""
    cut = cut_of(layer, key)
    s, b = key[0], key[1]
    if cut is None:
        return _compressed(layer.weights, s, b) if (s or b) else layer.weights
    kept = np.take(layer.weights, cut.keep, axis=cut.out_axis)
    out = np.zeros_like(layer.weights)
    index = [slice(None)] * out.ndim
    index[cut.out_axis] = cut.keep  # type: ignore[call-overload]
    out[tuple(index)] = _compressed(kept, s, b) if (s or b) else kept
    return out


def after_cut(layers: list[_Layer], alloc: Mapping, model: ir.Model) -> tuple[list[_Layer], dict]:
    """Rule 14: the layers and allocation once the cuts of ``alloc`` are made (the model's
    graph rewired): a cut layer's options are its cut's (its kept weights' own bytes, the cost
    less the removed channels', paid), every other layer keeps its unstructured options (the
    re-estimates of rule 6 then measure the consumers' smaller tensors); keys ``(s, b)``."""
    inits = model.graph.initializers
    out, new_alloc = [], {}
    for layer in layers:
        key = alloc[layer.name]
        cut = cut_of(layer, key)
        value = inits[layer.tensor].const_value
        w = np.asarray(value.numpy()) if value is not None else layer.weights
        new = _Layer(layer.name, layer.op_type, layer.tensor, int(w.size), w)
        if cut is None:
            new.options = {k: v for k, v in layer.options.items() if len(k) == 2}
        else:
            for k, (_, cost) in layer.options.items():
                if len(k) > 2 and k[2] == cut.fraction:
                    new.options[k[:2]] = (cut.own[k[:2]], max(cost - cut.removed_cost, 0.0))
        out.append(new)
        new_alloc[layer.name] = (key[0], key[1])
    return out, new_alloc
