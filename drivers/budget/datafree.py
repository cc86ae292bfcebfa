"""Rule 8: compression without data, backed off per layer by a calibrated weight check."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from mconv.drivers.budget.config import BITS, SPARSITIES
from mconv.drivers.budget.evaluation import _export_sizes, _run_specs
from mconv.drivers.budget.result import BudgetNotMet, BudgetResult
from mconv.drivers.budget.sensitivity import _candidates, _compressed, _stored_bytes
from mconv.edit.weights import weight_refs
from mconv.passes.base import PassContext, PassSpec
from mconv.passes.pipeline import _record_provenance, make_spec


def _data_free(
    model,
    pre,
    target,
    seed,
    snr_min,
    say,
    t_start,
    history_before,
    sparsities,
    bits,
    *,
    workers: int = 0,
    ray_address: str | None = None,
    measured: str = "weights_file",
) -> BudgetResult:
    """Rule 8: per layer the smallest setting with weight SNR >= snr_min; no fine-tuning."""
    layers, est = _candidates(
        model, None, None, "weight-snr", say, sparsities, bits, workers=workers, ray_address=ray_address
    )
    if snr_min is None:  # the calibrated data-free check, shared with recipes run without data
        snr_min = datafree_snr_db(len(layers))
    alloc = {}
    for layer in layers:
        ok = [k for k in layer.options if layer.snr[k] >= snr_min]
        alloc[layer.name] = min(ok, key=lambda k: (layer.options[k][0], -layer.snr[k])) if ok else (0.0, None)
    specs = list(pre)
    table = {n: {"sparsity": s} for n, (s, _) in sorted(alloc.items()) if s > 0}
    clustered = {n: {"skip": False, "bits": b} for n, (_, b) in sorted(alloc.items()) if b is not None}
    stages = []
    if table:
        stages.append(make_spec("prune", {"op_name": table}))
    if clustered:
        stages.append(make_spec("cluster", {"skip": True, "init": "linear", "op_name": clustered}))
    ctx = PassContext(seed=seed)
    _run_specs(model, stages, ctx)
    specs += stages
    if history_before is None:
        model.metadata_props.pop("mconv.passes", None)
    _record_provenance(model, specs)
    sizes = _export_sizes(model)
    rows = [
        {
            "name": layer.name,
            "tensor": layer.tensor,
            "op_type": layer.op_type,
            "params": layer.params,
            "sparsity": alloc[layer.name][0],
            "bits": alloc[layer.name][1],
            "weight_snr_db": round(float(layer.snr[alloc[layer.name]]), 2),
            "predicted_bytes": layer.options[alloc[layer.name]][0],
            "stored_bytes": sizes["stored"].get(layer.tensor),
            "original_bytes": 4 * layer.params,
        }
        for layer in layers
    ]
    original = sum(4 * layer.params for layer in layers)
    met = target is None or sizes[measured] <= target
    result = BudgetResult(
        model=model,
        metric="none",
        accuracy_measured=False,
        met=met,
        target_size=target,
        layers=rows,
        stages=[
            {"stage": s.name, "metric_before": None, "metric_after": None, "rolled_back": False}
            for s in stages
        ],
        size={
            "weights_file": sizes["weights_file"],
            "bundle": sizes["bundle"],
            "original_layers": original,
            "ratio_weights_file": round(original / max(sizes["weights_file"], 1), 2),
        },
        estimator={**est, "snr_db_min": snr_min},
        specs=specs,
        seed=seed,
        notes=[
            f"ACCURACY WAS NOT MEASURED: no --data, so each layer was compressed only as far as a weight "
            f"SNR of {snr_min:.1f} dB allows and nothing was fine-tuned; give --data D.npz to compress to a "
            f"measured budget"
        ],
    )
    result.seconds = time.perf_counter() - t_start
    if not met:
        raise BudgetNotMet(
            f"budget not met without data: {'weights' if measured == 'weights_file' else 'bundle'} "
            f"{sizes[measured]:,} B (target {target:,} B) at a weight "
            f"SNR of {snr_min:.1f} dB",
            result,
            hint="give --data D.npz so the budget can be measured and fine-tuned",
        )
    return result


# Rule 8's data-free check, calibrated (bench/datafree_check.py, bench/RESULTS.md): each layer's
# compressed weight keeps a weight SNR of at least ``DATAFREE_SNR_DB + 10 log10(L)`` dB on a model
# of ``L`` compressed layers. The layers' errors add up through the network (relative errors of
# independent layers add in power), so the model's share is split evenly between its layers: a
# deep model's layers each keep more of their weights than a shallow one's.
DATAFREE_SNR_DB = 25.0


DATAFREE_NOTE = (
    "ACCURACY WAS NOT MEASURED: {why}, so each layer was compressed only as far as a "
    "data-free weight check allows (weight SNR >= {snr:.1f} dB per layer, {layers} layers) and "
    "nothing was fine-tuned; give --data D.npz to compress further and measure it"
)


def datafree_snr_db(layers: int, base_db: float | None = None) -> float:
    """The per-layer weight SNR (dB) the data-free check asks of a model of ``layers`` layers."""
    base = DATAFREE_SNR_DB if base_db is None else float(base_db)
    return base + 10.0 * float(np.log10(max(int(layers), 1)))


def _snr_db(w: np.ndarray, a: np.ndarray) -> float:
    energy = float(np.sum(np.square(w, dtype=np.float64)))
    err = float(np.sum(np.square(a.astype(np.float64) - w)))
    return float(10 * np.log10(energy / err)) if err > 0 else float("inf")


def datafree_setting(
    w: np.ndarray, sparsity: float, bits: int | None, snr_min: float
) -> tuple[float, int | None, float]:
    """The setting of one weight that export stores smallest among those at most as aggressive
    as ``(sparsity, bits)`` (sparsity in :data:`SPARSITIES` below it, bits in :data:`BITS` above
    it, or float) whose weight SNR is at least ``snr_min``; ``(0.0, None, inf)`` when none is.
    For each bit width only the largest passing sparsity is a candidate (SNR falls as either
    grows), and only those candidates are encoded."""
    sps = sorted({0.0, *(x for x in SPARSITIES if x < sparsity), float(sparsity)}, reverse=True)
    widths: list[int | None] = [None]
    if bits is not None:
        widths += sorted({int(bits), *(b for b in BITS if b > bits)})
    best: tuple[int, float, int | None, float] | None = None
    for b in widths:
        for s in sps:
            if s == 0.0 and b is None:
                break
            snr = _snr_db(w, _compressed(w, s, b))
            if snr >= snr_min:
                nbytes = _stored_bytes(_compressed(w, s, b), s, b)
                if best is None or nbytes < best[0]:
                    best = (nbytes, s, b, snr)
                break
    if best is None:
        return 0.0, None, float("inf")
    return best[1], best[2], best[3]


@dataclass
class DataFreePlan:
    """What the data-free check of a recipe run without data chose (``optimize``'s JSON
    ``datafree``): the threshold and, per layer, what the recipe asked and what was kept."""

    snr_db: float
    base_db: float
    layers: list[dict] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # N:M or structured prunes, as asked

    @property
    def backed_off(self) -> int:
        return sum(
            1 for r in self.layers if (r["sparsity"], r["bits"]) != (r["asked_sparsity"], r["asked_bits"])
        )

    def note(self, why: str = "no --data") -> str:
        return DATAFREE_NOTE.format(why=why, snr=self.snr_db, layers=len(self.layers))

    def as_dict(self) -> dict:
        return {
            "check": "weight-snr",
            "snr_db_min": round(self.snr_db, 2),
            "snr_db_base": self.base_db,
            "layers_backed_off": self.backed_off,
            "layers": self.layers,
            "unchecked": self.unchecked,
        }


LIMITED_PASSES = ("prune", "cluster")


def limit_datafree(
    model: ir.Model, specs: list[PassSpec], base_db: float | None = None
) -> tuple[list[PassSpec], DataFreePlan]:
    """Rule 8 for a recipe run without data: ``specs`` with every ``prune`` and ``cluster`` pass
    backed off per layer until the layer's weight SNR (both passes together, as
    :func:`_compressed` does them) meets :func:`datafree_snr_db`; each layer's choice is written
    as an ``op_name`` override, so the provenance and a saved recipe say what ran. Nodes of the
    selected weights without a name are given one (``op_name`` needs it). Prunes by threshold or
    global scope are read as the sparsity they give each tensor; N:M and structured prunes stay
    as asked (``unchecked``)."""
    from mconv.edit.weights import gather_tables
    from mconv.passes.prune import _global_threshold

    prunes = [i for i, s in enumerate(specs) if s.name == "prune"]
    clusters = [i for i, s in enumerate(specs) if s.name == "cluster"]
    refs = weight_refs(model)
    refs = refs + gather_tables(model, refs)
    taken = {n.name for n in model.graph if n.name}
    for k, ref in enumerate(refs):
        if not ref.node.name:
            name, j = f"{ref.node.op_type}_{k}", 0
            while name in taken:
                j += 1
                name = f"{ref.node.op_type}_{k}_{j}"
            ref.node.name = name
            taken.add(name)
    globals_ = {}
    for i in prunes:
        spec = specs[i]
        chosen = [r for r in refs if r.node.op_type in spec.resolve(r.node).op_types]
        glob = [r for r in chosen if spec.resolve(r.node).scope == "global"]
        globals_[i] = _global_threshold(glob, spec.resolve()) if glob else None
    asked: list[tuple] = []  # (ref, array, sparsity, bits)
    unchecked: list[str] = []
    for ref in refs:
        w = ref.array()
        if w.dtype.kind != "f" or w.size == 0:  # prune takes small tensors too: every one is checked
            continue
        s_ask, b_ask, plain = 0.0, None, True
        for i in prunes:
            cfg = specs[i].resolve(ref.node)
            if ref.node.op_type not in cfg.op_types:
                continue
            if cfg.m or cfg.structured != "none":
                plain = False
                continue
            shared = globals_[i]
            if cfg.scope == "global" and shared is not None and (cfg.sparsity > 0 or cfg.threshold_std):
                t, strict = shared
                frac = float(np.mean(np.abs(w) < t if strict else np.abs(w) <= t))
            elif cfg.threshold_std is not None:
                frac = float(np.mean(np.abs(w) < cfg.threshold_std * np.std(w, dtype=np.float64)))
            else:
                frac = float(cfg.sparsity)
            s_ask = max(s_ask, min(frac, 0.99))
        for i in clusters:
            cfg = specs[i].resolve(ref.node)
            if cfg.skip or ref.node.op_type not in cfg.op_types or w.size < cfg.min_elements:
                continue
            b_ask = cfg.bits if b_ask is None else min(b_ask, cfg.bits)
        if not plain:
            unchecked.append(str(ref.node.name))
        if s_ask > 0 or b_ask is not None:
            asked.append((ref, w, s_ask, b_ask))
    plan = DataFreePlan(0.0, DATAFREE_SNR_DB if base_db is None else float(base_db), unchecked=unchecked)
    plan.snr_db = datafree_snr_db(len(asked), base_db)
    prune_over: dict[str, dict] = {}
    cluster_over: dict[str, dict] = {}
    for ref, w, s_ask, b_ask in asked:
        s, b, snr = datafree_setting(w, s_ask, b_ask, plan.snr_db)
        name = ref.node.name
        prune_over[name] = {"sparsity": s, "threshold_std": None, "scope": "layer"}
        cluster_over[name] = {"skip": True} if b is None else {"skip": False, "bits": b}
        plan.layers.append(
            {
                "name": name,
                "tensor": ref.name,
                "op_type": ref.node.op_type,
                "params": int(w.size),
                "asked_sparsity": round(s_ask, 6),
                "asked_bits": b_ask,
                "sparsity": round(s, 6),
                "bits": b,
                "weight_snr_db": round(snr, 2) if np.isfinite(snr) else None,
            }
        )
    out = list(specs)
    for i in prunes:
        spec = specs[i]
        table = dict(spec.op_name)
        for name, over in prune_over.items():
            if name not in unchecked:
                table[name] = {**table.get(name, {}), **over}
        out[i] = PassSpec(spec.name, dict(spec.config), dict(spec.op_type), table)
    for i in clusters:
        spec = specs[i]
        table = dict(spec.op_name)
        for name, over in cluster_over.items():
            table[name] = {**table.get(name, {}), **over}
        out[i] = PassSpec(spec.name, dict(spec.config), dict(spec.op_type), table)
    return out, plan
