"""The search's result, its recipe and report (rule 9), and the estimators compared."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.drivers.budget.allocation import _alloc_cost, _alloc_table
from mconv.drivers.budget.evaluation import _check_data, _Evaluator, _score_value, split_indices
from mconv.drivers.budget.sensitivity import _candidates, _compressed
from mconv.errors import GateFailed
from mconv.passes.base import PassSpec


@dataclass
class BudgetResult:
    """What :func:`compress_to_budget` did; ``as_dict()`` is the JSON report (keys in docs/passes.md)."""

    model: ir.Model
    metric: str
    accuracy_measured: bool
    met: bool
    baseline: float | None = None
    final: float | None = None
    held_out_drop: float | None = None
    held_out_lost: float | None = None  # fraction the original gets right and the result wrong
    held_out_drop_se: float | None = None  # the net drop's standard error (paired samples)
    held_out_drop_bound: float | None = None  # what the gate compared: drop + gate_se * se
    agreement: float | None = None
    max_drop: float | None = None
    target_size: int | None = None
    split: dict = field(default_factory=dict)
    layers: list[dict] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    attempts: list[dict] = field(default_factory=list)
    size: dict = field(default_factory=dict)
    estimator: dict = field(default_factory=dict)
    specs: list[PassSpec] = field(default_factory=list)
    seed: int = 0
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    engine: str = "reference"  # rule 11: where it ran (fast_engine.engine_label: "xla-cpu", ...)

    def as_dict(self) -> dict:
        return {
            "metric": self.metric,
            "accuracy_measured": self.accuracy_measured,
            "met": self.met,
            "baseline": self.baseline,
            "final": self.final,
            "held_out_drop": self.held_out_drop,
            "held_out_lost": self.held_out_lost,
            "held_out_drop_se": self.held_out_drop_se,
            "held_out_drop_bound": self.held_out_drop_bound,
            "agreement": self.agreement,
            "max_drop": self.max_drop,
            "target_size": self.target_size,
            "split": self.split,
            "layers": self.layers,
            "stages": self.stages,
            "attempts": self.attempts,
            "size": self.size,
            "estimator": self.estimator,
            "recipe": [s.as_dict() for s in self.specs],
            "seed": self.seed,
            "notes": self.notes,
            "seconds": round(self.seconds, 3),
            "engine": self.engine,
        }

    def recipe_toml(self) -> str:
        """The passes that made the model as a TOML recipe (rule 9)."""
        lines = [
            "description = "
            + _toml_str(
                f"chosen by mconv optimize --recipe deep-compression (seed {self.seed}; "
                f"{self.metric} drop {self.held_out_drop} on {self.split.get('held_out', 0)} held-out samples)"
            )
        ]
        for spec in self.specs:
            lines += ["", "[[pass]]", f"name = {_toml_str(spec.name)}"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in sorted(spec.config.items())]
            for kind, table in (("op_type", spec.op_type), ("op_name", spec.op_name)):
                for key, values in sorted(table.items()):
                    lines += ["", f"[pass.{kind}.{_toml_str(key)}]"]
                    lines += [f"{k} = {_toml_value(v)}" for k, v in sorted(values.items())]
        return "\n".join(lines) + "\n"

    def write_recipe(self, path: str | Path) -> Path:
        from mconv.fileio import atomic_write_bytes

        atomic_write_bytes(path, self.recipe_toml().encode("utf-8"))
        return Path(path)


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=True)  # a JSON string is a TOML basic string


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


class BudgetNotMet(GateFailed):
    """The budget's gate failed (exit 1); ``result`` is the best result found."""

    def __init__(self, message: str, result: BudgetResult, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result


def _result(
    best, layers, *, model_metric, baseline, max_drop, target, split, est, seed, tried
) -> BudgetResult:
    rows = []
    cuts = best.get("cuts", {})
    for layer, cur in zip(layers, best.get("layers", layers)):
        s, b = best["alloc"][layer.name][:2]
        cut = cuts.get(layer.name)
        rows.append(
            {
                "name": layer.name,
                "tensor": layer.tensor,
                "op_type": layer.op_type,
                "params": layer.params,
                "sparsity": s,
                "bits": b,
                "estimated_cost": cur.options[(s, b)][1],
                "predicted_bytes": cur.options[(s, b)][0],
                "stored_bytes": best["sizes"]["stored"].get(layer.tensor),
                "original_bytes": 4 * layer.params,
                # rule 14: output channels removed by the structured cut, of how many
                "channels_removed": cut["removed"] if cut else 0,
                "channels": cut["channels"] if cut else None,
            }
        )
    original = sum(4 * layer.params for layer in layers)
    attempts = [
        {
            "index": r["index"],
            "predicted_bytes": r["predicted"],
            "weights_file": r["sizes"]["weights_file"],
            "held_out_drop": r["drop"],
            "held_out_drop_bound": r.get("drop_bound"),
            "held_out_lost": r["lost"],
            "passed": r["ok"],
            "allocation": _alloc_table(r["alloc"]),
            "structured": r.get("cuts", {}),
            "budget_bytes": r.get("budget"),
            "reallocated": r.get("reallocated", []),
            # the allocation's summed estimated cost (the frontier's y) and whether it was chosen
            "estimated_cost": _cost_or_none(layers, r["alloc"]),
            "chosen": r is best,
        }
        for r in tried.values()
    ]
    return BudgetResult(
        model=best["model"],
        metric=model_metric,
        accuracy_measured=True,
        met=bool(best["ok"]),
        baseline=baseline,
        final=best["final"],
        held_out_drop=best["drop"],
        held_out_lost=best["lost"],
        held_out_drop_se=best.get("drop_se"),
        held_out_drop_bound=best.get("drop_bound"),
        agreement=best["agreement"],
        max_drop=max_drop,
        target_size=target,
        split=split,
        layers=rows,
        stages=best["stages"],
        attempts=attempts,
        size={
            "weights_file": best["sizes"]["weights_file"],
            "bundle": best["sizes"]["bundle"],
            "predicted_layers": best["predicted"],
            "original_layers": original,
            # rule 14: nonzero weights of the layers left (a cut's removed channels count as zeros)
            "nonzero_layers": _nonzero(best["model"], layers),
            "ratio_weights_file": round(original / max(best["sizes"]["weights_file"], 1), 2),
        },
        estimator=est,
        specs=best["specs"],
        seed=seed,
    )


def _nonzero(model: ir.Model, layers) -> int:
    inits = model.graph.initializers
    count = 0
    for layer in layers:
        value = inits[layer.tensor].const_value if layer.tensor in inits else None
        if value is not None:
            count += int(np.count_nonzero(value.numpy()))
    return count


def _cost_or_none(layers, alloc) -> float | None:
    """An allocation's summed estimated cost; None when a layer's setting has no estimate."""
    try:
        return float(_alloc_cost(layers, alloc))
    except KeyError:
        return None


def compare_estimators(
    model: ir.Model,
    data: Mapping[str, np.ndarray],
    *,
    seed: int = 0,
    holdout: float = 0.25,
    settings=((0.5, None), (0.8, None), (0.9, None), (0.8, 4), (0.9, 3)),
) -> dict:
    """Fisher vs sweep (rule 3) against the measured one-layer drop in the metric and in KL on
    the held-out split: per layer and setting, predicted cost, measured KL and drop; Spearman
    correlations and seconds for each estimator."""
    from mconv.engines.reference.executor import Executor

    feeds, labels, n = _check_data(model, data)
    train, held = split_indices(n, holdout, seed)
    output = _score_value(model)
    ev0 = _Evaluator(feeds, output, np.zeros((0,)), labels)
    ev = _Evaluator(feeds, output, ev0.outputs(model, np.arange(n)), labels)
    sp = tuple(sorted({0.0, *(s for s, _ in settings)}))
    bt = tuple(sorted({b for _, b in settings if b is not None}, reverse=True))
    out = {}
    for name in ("fisher", "sweep"):
        layers, facts = _candidates(model, ev, train, name, None, sp, bt)
        out[name] = {"seconds": facts["seconds"], "layers": layers}
    ex = Executor(model)
    base = ev.metric(ev.reference[held], held)
    rows = []
    for lf, ls in zip(out["fisher"]["layers"], out["sweep"]["layers"]):
        for s, b in settings:
            a = _compressed(lf.weights, s, b)
            ex.set_initializer(lf.tensor, a)
            got = ev.outputs(ex, held)
            ex.set_initializer(lf.tensor, lf.weights)
            rows.append(
                {
                    "layer": lf.name,
                    "sparsity": s,
                    "bits": b,
                    "fisher": lf.options[(s, b)][1],
                    "sweep": ls.options[(s, b)][1],
                    "kl_held_out": ev.kl(got, held),
                    "drop_held_out": base - ev.metric(got, held),
                }
            )

    def spearman(x, y) -> float:
        rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
        return float(np.corrcoef(rx, ry)[0, 1]) if len(x) > 2 else float("nan")

    summary = {}
    for name in ("fisher", "sweep"):
        x = [r[name] for r in rows]
        summary[name] = {
            "seconds": round(out[name]["seconds"], 3),
            "spearman_kl": spearman(x, [r["kl_held_out"] for r in rows]),
            "spearman_drop": spearman(x, [r["drop_held_out"] for r in rows]),
        }
    return {"rows": rows, "summary": summary, "metric": ev.metric_name}


def summary_text(result: BudgetResult) -> str:
    """The report's table for stderr (the CLI prints it; ``as_dict()`` is the JSON on stdout)."""
    lines = []
    if not result.accuracy_measured:
        lines.append("WARNING: " + result.notes[0])
    else:
        sp = result.split
        where = (
            f"{sp['held_out']} validation samples (--val-data)"
            if sp.get("validation")
            else f"{sp['held_out']} held out (seed {sp['seed']})"
        )
        se = "" if result.held_out_drop_se is None else f" +/- {result.held_out_drop_se:.4f}"
        lines.append(
            f"split: {sp['train']} samples for fine-tuning, {where}; "
            f"{result.metric} {result.baseline:.4f} -> {result.final:.4f} on the held-out samples "
            f"(drop {result.held_out_drop:+.4f}{se}, lost {result.held_out_lost:.4f}, max {result.max_drop}"
            + (
                f", gated on drop + {sp['gate_se']:g} se = {result.held_out_drop_bound:+.4f})"
                if result.held_out_drop_bound is not None and sp.get("gate_se")
                else ")"
            )
        )
        lines += [f"note: {n}" for n in result.notes if "cannot tell" in n]
    head = f"{'layer':<16}{'params':>9}{'sparsity':>9}{'bits':>5}{'predicted':>10}{'stored':>9}{'of f32':>8}"
    lines += [head, "-" * len(head)]
    for r in result.layers:
        stored = r["stored_bytes"]
        lines.append(
            f"{r['name'][:15]:<16}{r['params']:>9,}{r['sparsity']:>9.2f}{r['bits'] or '-'!s:>5}"
            f"{r['predicted_bytes']:>10,}{stored if stored is not None else '-'!s:>9}"
            f"{100 * (stored or 0) / max(r['original_bytes'], 1):>7.2f}%"
        )
    cut = [r for r in result.layers if r.get("channels_removed")]
    if cut:  # rule 14
        lines.append(
            "structured: "
            + ", ".join(f"{r['name']} lost {r['channels_removed']} of {r['channels']} channels" for r in cut)
        )
    s = result.size
    lines.append(
        f"weights.mcw {s['weights_file']:,} B ({s['ratio_weights_file']}x of {s['original_layers']:,} B of layer "
        f"weights), cpu bundle {s['bundle']:,} B"
    )
    for st in result.stages:
        if st.get("metric_before") is not None:
            lines.append(
                f"  {st['stage']:<24} {st['metric_before']:.4f} -> {st['metric_after']:.4f}"
                + ("  ROLLED BACK (made the held-out metric worse)" if st["rolled_back"] else "")
            )
    lines.append(
        f"{'BUDGET MET' if result.met else 'BUDGET NOT MET'} in {result.seconds:.1f}s (engine {result.engine})"
    )
    return "\n".join(lines)
