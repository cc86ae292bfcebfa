"""Sensitivity analysis: how much each layer tolerates pruning (and weight sharing) on its own.

Deep Compression chose per-layer sparsities from such curves (the paper's Figure 5): prune ONE
layer at a time across a sweep of sparsities, leave the others intact, and measure the metric.

Rules
-----
1. Layers are the weights of Conv/ConvTranspose/Gemm/MatMul nodes (``passes._weights``), named
   by their node (the name a recipe's ``[pass.op_name.NAME]`` override uses). Nodes without a
   name cannot be addressed by a recipe and are skipped with a note.
2. Metric: with ``labels`` in the data, top-1 accuracy of the class-score output; without, top-1
   agreement with the unmodified model's outputs (for outputs that are not class scores: cosine
   similarity with them). ``drop = baseline - metric`` (fractions: 0.01 is one point).
3. Pruning at sparsity s zeroes the round(s * n) weights of smallest magnitude (as the prune
   pass does per layer). With ``bits``, the pruned tensor's nonzero weights are also clustered to
   2^bits shared values (the cluster pass's k-means, linear init), for every sparsity of the
   sweep. Sparsity 0 without clustering is always measured: it equals the baseline.
4. The recipe (``--max-drop X``): per layer, the highest sparsity whose drop (unclustered) is
   <= X; then, at that sparsity, the fewest bits whose drop is <= X (no clustering if none is).
   Budgets hold per layer, measured alone; their effects add up when all layers are compressed
   together, which is why the recipe also fine-tunes (when data is given to ``mconv optimize``).
5. Layers are independent trials: with ``workers=N`` (a local Ray) or ``ray_address`` (a
   cluster) each layer's sweep is one Ray task (:mod:`mconv.drivers.parallel`); the model travels
   as ONNX bytes and the data once through the object store, and the report is the same as the
   in-process run's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError
from mconv.irio import real_inputs, self_contained_bytes

SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class SweepPoint:
    sparsity: float
    bits: int | None
    metric: float
    drop: float

    def as_dict(self) -> dict:
        return {"sparsity": self.sparsity, "bits": self.bits, "metric": self.metric, "drop": self.drop}


@dataclass
class LayerSensitivity:
    name: str  # the node's name (recipe op_name key)
    op_type: str
    tensor: str  # the weight initializer's name
    params: int
    sweep: list[SweepPoint] = field(default_factory=list)
    choice: dict | None = None  # {"sparsity", "bits"} within the budget, when one was given

    def as_dict(self) -> dict:
        d = {
            "name": self.name,
            "op_type": self.op_type,
            "tensor": self.tensor,
            "params": self.params,
            "sweep": [p.as_dict() for p in self.sweep],
        }
        if self.choice is not None:
            d["choice"] = self.choice
        return d


@dataclass
class SensitivityReport:
    baseline: float
    metric: str  # "accuracy", "top1_agreement" or "cosine"
    samples: int
    layers: list[LayerSensitivity] = field(default_factory=list)
    max_drop: float | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "metric": self.metric,
            "samples": self.samples,
            "max_drop": self.max_drop,
            "layers": [layer.as_dict() for layer in self.layers],
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- weight edits


def prune_smallest(weights: np.ndarray, sparsity: float) -> np.ndarray:
    """A copy of ``weights`` with the round(sparsity * n) smallest magnitudes set to zero, by the
    prune pass's own rule (``magnitude_mask``)."""
    from mconv.passes.prune import magnitude_mask

    keep, _ = magnitude_mask(np.asarray(weights), sparsity)
    return np.where(keep, weights, 0).astype(weights.dtype)


def cluster_nonzero(weights: np.ndarray, bits: int) -> np.ndarray:
    """``weights`` clustered as the cluster pass does it (linear init + Lloyd, zeros stay zero)."""
    from mconv.passes.cluster import cluster_array

    return cluster_array(np.asarray(weights), bits, "linear")


# --------------------------------------------------------------------------- analysis


def _metric(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
    if outputs.ndim == 2 and outputs.shape[1] >= 2:
        target = labels if labels is not None else reference.argmax(1)
        return float(np.mean(outputs.argmax(1) == target))
    a, b = outputs.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == nb == 0 else float(a @ b / max(float(na * nb), 1e-300))


def analyze_sensitivity(
    model: ir.Model,
    data: Mapping[str, np.ndarray],
    *,
    sweep: Sequence[float] = (0.5, 0.7, 0.9),
    bits: Sequence[int] = (),
    max_drop: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    batch: int = 512,
    engine: str = "reference",
    device: str = "cpu",
    workers: int = 0,
    ray_address: str | None = None,
) -> SensitivityReport:
    """Prune (and cluster) one layer at a time and measure the metric drop; see the module rules.
    ``engine="xla"`` runs every sweep point on the model lowered to jax (one compiled program,
    the layer's weight swapped as an argument; ``device`` cpu or cuda); the reference is the
    numpy executor. ``workers`` / ``ray_address`` run the layers' sweeps on Ray (rule 5)."""
    from mconv.edit.rewrite import name_of
    from mconv.edit.weights import weight_refs

    sparsities = sorted({0.0, *(float(s) for s in sweep)})
    if any(not 0.0 <= s < 1.0 for s in sparsities):
        raise InputError(f"sparsities must be in [0, 1), got {list(sweep)}", hint="e.g. --sweep 0.5,0.7,0.9")
    bit_list = sorted({int(b) for b in bits}, reverse=True)
    if any(not 1 <= b <= 8 for b in bit_list):
        raise InputError(f"bits must be in 1..8, got {list(bits)}", hint="e.g. --bits 8,6,5,4")
    if max_drop is not None and not 0.0 <= max_drop <= 1.0:
        raise InputError(
            f"max drop {max_drop} is not a fraction", hint="give it as a fraction: 0.01 is one point"
        )

    names = [name_of(v) for v in real_inputs(model.graph)]
    missing = [n for n in names if n not in data]
    if missing:
        raise InputError(
            f"data has no array for input(s) {', '.join(missing)}",
            hint=f"the .npz needs arrays named {', '.join(names)} (+ optional 'labels')",
        )
    feeds = {n: np.asarray(data[n]) for n in names}
    labels = data.get("labels")
    labels = None if labels is None else np.asarray(labels).reshape(-1)
    samples = len(next(iter(feeds.values())))

    from mconv.drivers.parallel import check_workers, map_trials, new_token, uses_ray
    from mconv.engines.xla.engine import check_engine

    check_engine(engine, device)
    check_workers(workers, ray_address)
    if labels is not None and len(labels) != samples:
        raise InputError(f"'labels' has {len(labels)} entries for {samples} samples")
    shared: dict[str, Any] = {
        "token": new_token(),
        "feeds": feeds,
        "labels": labels,
        "engine": engine,
        "device": device,
        "batch": batch,
        "sparsities": sparsities,
        "bits": bit_list,
    }
    if uses_ray(workers, ray_address):
        shared["onnx"] = self_contained_bytes(model)  # rule 5: bytes, not objects
    else:
        shared["model"] = model
    state = _SweepState(shared)
    report = SensitivityReport(state.baseline, state.metric_name, samples, max_drop=max_drop)

    refs = weight_refs(model)
    points = len(sparsities) * (1 + len(bit_list))
    total = len(refs) * points
    named = [ref for ref in refs if ref.node.name]
    for ref in refs:
        if not ref.node.name:
            report.notes.append(f"skipped {ref.node.op_type} with weight {ref.name}: the node has no name")
    if uses_ray(workers, ray_address):
        shared["reference"] = state.reference  # computed once here, not per worker

        def tick(done: int, count: int) -> None:
            if progress is not None:
                progress(f"analyze: {done}/{count} layers on Ray", done * points, len(named) * points)

        curves = map_trials(
            _sweep_trial, shared, [r.name for r in named], workers=workers, address=ray_address, progress=tick
        )
    else:
        curves = []
        done = (len(refs) - len(named)) * points
        for ref in named:

            def step(
                s: float, b: int | None, done_before: int = done, name: str = ref.node.name or ""
            ) -> None:
                if progress is not None:
                    i = sparsities.index(s) * (1 + len(bit_list)) + (
                        0 if b is None else 1 + bit_list.index(b)
                    )
                    progress(f"analyze {name} s={s:g}" + (f" {b}b" if b else ""), done_before + i + 1, total)

            curves.append(state.sweep(ref.name, step))
            done += points
    for ref, curve in zip(named, curves):
        layer = LayerSensitivity(
            ref.node.name or "", ref.node.op_type, ref.name, int(state.originals[ref.name].size)
        )
        layer.sweep = [SweepPoint(s, b, m, state.baseline - m) for s, b, m in curve]
        if max_drop is not None:
            layer.choice = choose_setting(layer, max_drop)
        report.layers.append(layer)
    return report


class _SweepState:
    """One process's executor for a sweep (rule 5): the model, its reference outputs, and how to
    swap one layer's weight. Built in this process, or once per Ray worker from the shared object."""

    def __init__(self, shared: Mapping[str, Any]) -> None:
        from mconv.edit.rewrite import name_of, tensor_of
        from mconv.engines.reference.executor import Executor

        if "model" in shared:
            model = shared["model"]
        else:
            import onnx

            model = ir.serde.deserialize_model(onnx.load_from_string(shared["onnx"]))
        self.feeds: dict[str, np.ndarray] = shared["feeds"]
        self.labels: np.ndarray | None = shared["labels"]
        self.batch = int(shared["batch"])
        self.sparsities: list[float] = list(shared["sparsities"])
        self.bits: list[int] = list(shared["bits"])
        self.samples = len(next(iter(self.feeds.values())))
        output = name_of(model.graph.outputs[0])
        scores = [name_of(v) for v in model.graph.outputs if v.shape is not None and len(v.shape) == 2]
        self.output = scores[0] if scores else output
        self.executor: Any
        if shared["engine"] == "xla":
            from mconv.engines.xla.engine import XlaEngine

            self.executor = XlaEngine(model, [self.output], device=shared["device"])
            self.originals = {
                n: np.asarray(tensor_of(v).numpy()) for n, v in model.graph.initializers.items()
            }
            self.set_weight = self.executor.set_weight
        else:
            self.executor = Executor(model)
            self.originals = self.executor.initializers
            self.set_weight = self.executor.set_initializer
        reference = shared.get("reference")
        self.reference = self.run() if reference is None else reference
        self.is_scores = self.reference.ndim == 2 and self.reference.shape[1] >= 2
        labels = self.labels if self.is_scores else None
        self.metric_labels = labels
        has_labels = self.labels is not None
        self.metric_name = ("accuracy" if has_labels else "top1_agreement") if self.is_scores else "cosine"
        self.baseline = _metric(self.reference, self.reference, labels)

    def run(self) -> np.ndarray:
        parts = []
        for s in range(0, self.samples, self.batch):
            feeds = {k: v[s : s + self.batch] for k, v in self.feeds.items()}
            parts.append(self.executor.run(feeds, outputs=[self.output])[self.output])
        return np.concatenate(parts)

    def sweep(
        self, name: str, step: Callable[[float, int | None], None] | None = None
    ) -> list[tuple[float, int | None, float]]:
        """The layer's curve: (sparsity, bits, metric) for every point of the sweep (rule 3)."""
        original = self.originals[name]
        curve: list[tuple[float, int | None, float]] = []
        try:
            for s in self.sparsities:
                pruned = prune_smallest(original, s)
                for b in [None, *self.bits]:
                    if s == 0.0 and b is None:
                        m = self.baseline
                    else:
                        self.set_weight(name, pruned if b is None else cluster_nonzero(pruned, b))
                        m = _metric(self.run(), self.reference, self.metric_labels)
                    curve.append((s, b, m))
                    if step is not None:
                        step(s, b)
        finally:
            self.set_weight(name, original)
        return curve


def _sweep_trial(shared: Mapping[str, Any], name: str) -> list[tuple[float, int | None, float]]:
    """One layer's sweep in a Ray worker (its state built once per worker)."""
    from mconv.drivers.parallel import worker_state

    return worker_state(shared, _SweepState).sweep(name)


def choose_setting(layer: LayerSensitivity, max_drop: float) -> dict:
    """The most aggressive setting within ``max_drop`` (rule 4): ``{"sparsity", "bits"}``."""
    eps = 1e-12  # the metric is a fraction of samples: compare without float noise
    plain = [p for p in layer.sweep if p.bits is None and p.drop <= max_drop + eps]
    sparsity = max((p.sparsity for p in plain), default=0.0)
    clustered = [p for p in layer.sweep if p.bits is not None and p.sparsity == sparsity]
    ok = [p.bits for p in clustered if p.bits is not None and p.drop <= max_drop + eps]
    return {"sparsity": sparsity, "bits": min(ok) if ok else None}


# --------------------------------------------------------------------------- recipe


def _toml_key(key: str) -> str:
    if key and all((c.isascii() and c.isalnum()) or c in "_-" for c in key):
        return key
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def recipe_toml(report: SensitivityReport, *, finetune: bool = True) -> str:
    """A TOML recipe (``mconv optimize --recipe``) with each layer's chosen setting as an op_name
    override of ``prune`` (sparsity) and ``cluster`` (bits); layers not chosen stay untouched."""
    if report.max_drop is None:
        raise ValueError("recipe_toml needs a report analyzed with max_drop")
    lines = [
        f'description = "per-layer settings from mconv analyze: each layer alone drops the '
        f'{report.metric} by at most {report.max_drop:g} (baseline {report.baseline:.4f})"',
        "",
        "[[pass]]",
        'name = "prune"',
        "sparsity = 0.0",
    ]
    for layer in report.layers:
        if layer.choice and layer.choice["sparsity"] > 0:
            lines += [
                "",
                f"[pass.op_name.{_toml_key(layer.name)}]",
                f"sparsity = {layer.choice['sparsity']!r}",
            ]
    if finetune:
        lines += ["", "[[pass]]", 'name = "finetune"  # acts only when --data is given']
    clustered = [(layer, c) for layer in report.layers if (c := layer.choice) and c["bits"] is not None]
    if clustered:
        lines += ["", "[[pass]]", 'name = "cluster"', "skip = true  # only the layers named below"]
        for layer, choice in clustered:
            lines += ["", f"[pass.op_name.{_toml_key(layer.name)}]", "skip = false"]
            lines.append(f"bits = {choice['bits']}")
        if finetune:
            lines += ["", "[[pass]]", 'name = "finetune"']
    return "\n".join(lines) + "\n"


def write_recipe(report: SensitivityReport, path: str | Path, *, finetune: bool = True) -> Path:
    """Write :func:`recipe_toml` atomically; returns the path."""
    from mconv.fileio import atomic_write_bytes

    atomic_write_bytes(path, recipe_toml(report, finetune=finetune).encode("utf-8"))
    return Path(path)


def sparkline(values: Sequence[float], lo: float | None = None, hi: float | None = None) -> str:
    """Unicode bars, one per value, scaled between ``lo`` and ``hi`` (default: the values' range)."""
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    if hi <= lo:
        return SPARK[-1] * len(values)
    top = len(SPARK) - 1
    return "".join(SPARK[int(round((min(max(v, lo), hi) - lo) / (hi - lo) * top))] for v in values)
