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
class _Layer:
    name: str  # node name (recipe op_name key)
    op_type: str
    tensor: str
    params: int
    weights: np.ndarray
    # (sparsity, bits) -> (bytes, cost); bits None: not clustered
    options: dict[tuple[float, int | None], tuple[int, float]] = field(default_factory=dict)
    snr: dict[tuple[float, int | None], float] = field(default_factory=dict)


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
    target = ev.labels if ev.labels is not None else (ev.reference.argmax(1) if ev.is_scores else None)
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
