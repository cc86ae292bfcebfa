"""Rules 1 and 2: the data's split, the held-out metric and gate; rule 4: an attempt's export sizes."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import name_of
from mconv.errors import InputError, show
from mconv.irio import real_inputs
from mconv.metrics import balanced_cosine
from mconv.passes.base import PassContext, PassReport, PassSpec
from mconv.passes.pipeline import make_spec, snapshot_model


@dataclass
class _Evaluator:
    """Batched evaluation of a model on fixed feeds against the original's outputs (rule 2)."""

    feeds: dict[str, np.ndarray]
    output: str
    reference: np.ndarray  # the original's outputs on every sample
    labels: np.ndarray | None
    batch: int = 256
    # rule 11: the engine models are run on (``xla``: compiled once per structure, kept in ``memo``)
    engine: str = "reference"
    device: str = "cpu"
    memo: dict | None = None

    def __getstate__(self) -> dict:
        """Pickled (a Ray trial's copy) without the run's memo: compiled engines stay here."""
        return {**self.__dict__, "memo": None}

    @property
    def is_scores(self) -> bool:
        return self.reference.ndim == 2 and self.reference.shape[1] >= 2

    @functools.cached_property
    def is_sequence(self) -> bool:
        """Per-position class probabilities ``[N, T, C]`` without labels (a CTC text
        recognizer's softmax, a tagger's): every row along the last axis non-negative and
        summing to 1. The gate is then the share of positions whose top-1 class agrees with the
        original's: the cosine of the whole tensor is dominated by the confident positions
        (CTC blanks near 1) and lets characters flip within half a point of it. Raw 3-D
        outputs (a detector's ``[1, 4 + classes, anchors]``) are not distributions and stay on
        cosine."""
        r = self.reference
        if self.labels is not None or r.ndim != 3 or r.shape[2] < 2 or r.size == 0:
            return False
        return bool(r.min() >= 0 and np.allclose(r.sum(-1, dtype=np.float64), 1.0, atol=1e-3))

    @property
    def metric_name(self) -> str:
        if self.is_sequence:
            return "position_agreement"
        if not self.is_scores:
            return "cosine"
        return "accuracy" if self.labels is not None else "top1_agreement"

    def _position_agreement(self, got: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Per sample, the share of positions whose top-1 class is the original's."""
        return np.mean(got.argmax(-1) == self.reference[idx].argmax(-1), axis=-1)

    def outputs(self, model_or_executor, idx: np.ndarray) -> np.ndarray:
        """The outputs on samples ``idx`` of a model (on this evaluator's engine) or of a runner
        (anything with ``run(feeds, outputs=...)``: an Executor, an XlaEngine)."""
        if isinstance(model_or_executor, ir.Model):
            if self.engine == "xla":
                from mconv.engines.fast import run_batched, xla_engine

                ex = xla_engine(model_or_executor, [self.output], self.device, self.memo, role="eval")
                if not len(idx):
                    return self.reference[:0]
                return run_batched(ex, {k: v[idx] for k, v in self.feeds.items()}, [self.output], self.batch)[
                    self.output
                ]
            from mconv.engines.reference.executor import Executor

            ex = Executor(model_or_executor)
        else:
            ex = model_or_executor
        parts = []
        for s in range(0, len(idx), self.batch):
            sel = idx[s : s + self.batch]
            parts.append(
                ex.run({k: v[sel] for k, v in self.feeds.items()}, outputs=[self.output])[self.output]
            )
        return np.concatenate(parts) if parts else self.reference[:0]

    def metric(self, got: np.ndarray, idx: np.ndarray) -> float:
        if self.is_sequence:
            return float(np.mean(self._position_agreement(got, idx))) if len(idx) else 1.0
        ref = self.reference[idx]
        if self.is_scores:
            target = self.labels[idx] if self.labels is not None else ref.argmax(1)
            return float(np.mean(got.argmax(1) == target))
        return balanced_cosine(got, ref)  # a detector's scores count beside its boxes

    def losses(self, got: np.ndarray, idx: np.ndarray) -> float:
        """The gate's drop (rule 7): the fraction of samples the original gets right and the
        model gets wrong; gains elsewhere do not offset them (for cosine: the plain drop)."""
        if not self.is_scores:  # sequences too: the original agrees with itself everywhere
            return self.metric(self.reference[idx], idx) - self.metric(got, idx)
        ref = self.reference[idx]
        target = self.labels[idx] if self.labels is not None else ref.argmax(1)
        return float(np.mean((ref.argmax(1) == target) & (got.argmax(1) != target)))

    def worse(self, before: np.ndarray, after: np.ndarray, idx: np.ndarray) -> bool:
        """Whether ``after`` (a stage's outputs on ``idx``) is worse than ``before`` (rule 6):
        for class scores, a net loss of more than the standard error of the change if the
        stage did nothing, sqrt(d) / n with d the samples one gets right and the other wrong
        (McNemar's), so that one flipped sample of a small
        held-out split does not undo a stage; for cosine, any loss."""
        drop = self.metric(before, idx) - self.metric(after, idx)
        if drop <= 1e-12:
            return False
        if self.is_sequence:  # the per-sample paired change's noise: sqrt(sum e_s**2) / n
            e = self._position_agreement(after, idx) - self._position_agreement(before, idx)
            return bool(drop > np.sqrt(np.sum(e**2)) / len(idx) + 1e-12)
        if not self.is_scores:
            return True
        ref = self.reference[idx]
        target = self.labels[idx] if self.labels is not None else ref.argmax(1)
        flips = int(np.count_nonzero((before.argmax(1) == target) != (after.argmax(1) == target)))
        # the change's standard error if the stage did nothing: sqrt(discordant) / n (McNemar)
        return bool(drop > np.sqrt(flips) / len(idx) + 1e-12)  # a Python bool: it goes to --json

    def drop_se(self, got: np.ndarray, idx: np.ndarray) -> float | None:
        """The standard error of the net drop of class scores (rule 7): from the samples the
        two models disagree on (a paired difference: lost and gained), None for cosine."""
        if self.is_sequence and len(idx):
            return float(np.sqrt(np.var(1.0 - self._position_agreement(got, idx)) / len(idx)))
        if not self.is_scores or len(idx) == 0:
            return None
        ref = self.reference[idx]
        target = self.labels[idx] if self.labels is not None else ref.argmax(1)
        d = (ref.argmax(1) == target).astype(np.float64) - (got.argmax(1) == target)
        return float(np.sqrt(np.var(d) / len(idx)))

    def agreement(self, got: np.ndarray, idx: np.ndarray) -> float | None:
        if self.is_sequence:
            return self.metric(got, idx)
        if not self.is_scores:
            return None
        return float(np.mean(got.argmax(1) == self.reference[idx].argmax(1)))

    def kl(self, got: np.ndarray, idx: np.ndarray) -> float:
        """Mean KL(original || model) of softmax scores; mean squared error otherwise."""
        ref = self.reference[idx].astype(np.float64)
        if not self.is_scores:
            return float(np.mean((got.astype(np.float64) - ref) ** 2))
        return float(np.mean(np.sum(_softmax(ref) * (_logsm(ref) - _logsm(got.astype(np.float64))), axis=1)))


def _logsm(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _softmax(z: np.ndarray) -> np.ndarray:
    return np.exp(_logsm(z))


def _score_value(model: ir.Model) -> str:
    """The first 2-D graph output (class scores), else the first output (as analyze and finetune)."""
    outs = list(model.graph.outputs)
    scores = [v for v in outs if v.shape is not None and len(v.shape) == 2]
    return name_of((scores or outs)[0])


def split_indices(n: int, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) sample indices, exactly as the finetune pass splits with the same
    ``holdout`` and ``seed`` (its first draw from ``default_rng([seed, 0x5EED])``)."""
    order = np.random.default_rng([seed, 0x5EED]).permutation(n)
    n_hold = int(round(holdout * n)) if n >= 2 else 0
    n_hold = min(max(n_hold, 1 if holdout > 0 else 0), n - 1) if n >= 2 else 0
    return order[n_hold:], order[:n_hold]


def _check_data(model: ir.Model, data: Mapping[str, np.ndarray]) -> tuple[dict, np.ndarray | None, int]:
    names = [name_of(v) for v in real_inputs(model.graph)]
    missing = [n for n in names if n not in data]
    if missing:
        raise InputError(
            f"data has no array for input(s) {', '.join(missing)}",
            hint=f"the .npz needs arrays named {', '.join(names)} (+ optional 'labels')",
        )
    feeds = {n: np.asarray(data[n]) for n in names}
    counts = {len(v) if v.ndim else 0 for v in feeds.values()}
    n = min(counts) if counts else 0
    if len(counts) != 1 or n < 8:
        raise InputError(
            f"data has {sorted(counts)} samples per input",
            hint="give at least 8 samples, the same number for every input",
        )
    labels = data.get("labels")
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        if len(labels) != n or labels.dtype.kind not in "iu":
            raise InputError(
                f"'labels' has {len(labels)} entries of {labels.dtype} for {n} samples",
                hint="labels: one integer class per sample",
            )
        labels = labels.astype(np.int64)
    return feeds, labels, n


def _with_validation(
    model: ir.Model, feeds: dict, labels: np.ndarray | None, val_data: Mapping[str, np.ndarray]
) -> tuple[dict, np.ndarray | None, np.ndarray]:
    """The training feeds with the validation samples appended (rule 1), their labels, and the
    validation samples' indices. Both sets have labels or neither does (one metric for both)."""
    vfeeds, vlabels, m = _check_data(model, val_data)
    if (labels is None) != (vlabels is None):
        which = "the validation data" if vlabels is None else "the calibration data"
        raise InputError(
            f"{which} has no 'labels' and the other has",
            hint="give 'labels' in both .npz files or in neither (one metric for the gate and the training)",
        )
    for k, v in feeds.items():
        if vfeeds[k].shape[1:] != v.shape[1:] or vfeeds[k].dtype != v.dtype:
            raise InputError(
                f"validation input {show(k)} is {vfeeds[k].dtype}{list(vfeeds[k].shape[1:])} per sample, "
                f"the calibration data's {v.dtype}{list(v.shape[1:])}",
                hint="both .npz files hold samples of the same model inputs",
            )
    n = len(next(iter(feeds.values())))
    joined = {k: np.concatenate([v, vfeeds[k]]) for k, v in feeds.items()}
    both = None if labels is None or vlabels is None else np.concatenate([labels, vlabels])
    return joined, both, np.arange(n, n + m)


def _run_specs(model: ir.Model, specs: list[PassSpec], ctx: PassContext) -> list[PassReport]:
    """The pipeline's loop without provenance (recorded once at the end, rule 9)."""
    reports = []
    for spec in specs:
        ctx.spec = spec
        try:
            report = spec.pass_class().run(model, spec.resolve(), ctx)
        finally:
            ctx.spec = None
        if report.model is not None:
            raise RuntimeError(f"pass {spec.name} replaced the model; the budget flow mutates in place")
        reports.append(report)
    return reports


def _weights_state(model: ir.Model) -> tuple[dict, dict, dict]:
    """The initializers' values and compression records (a rolled-back stage leaves neither)."""
    inits = model.graph.initializers
    return (
        {name: v.const_value for name, v in inits.items()},
        {name: dict(v.metadata_props) for name, v in inits.items()},
        dict(model.metadata_props),
    )


def _restore(model: ir.Model, state: tuple[dict, dict, dict]) -> None:
    values, props, model_props = state
    for name, v in model.graph.initializers.items():
        if name in values:
            v.const_value = values[name]
            v.metadata_props.clear()
            v.metadata_props.update(props[name])
    model.metadata_props.clear()
    model.metadata_props.update(model_props)


def _export_sizes(model: ir.Model) -> dict:
    """Bytes of the cpu bundle export would write: weights.mcw, the whole directory, and the
    per-tensor account."""
    from mconv.targets import get_target

    with tempfile.TemporaryDirectory(prefix="mconv-budget-") as tmp:
        folder = Path(tmp) / "bundle"
        bundle = get_target("cpu").export(model, folder, {})
        files = [p for p in folder.rglob("*") if p.is_file()]
        account = bundle.account or {}  # the manifest keeps only a summary; the rows come from the index
        return {
            "weights_file": (folder / "weights.mcw").stat().st_size,
            "bundle": sum(p.stat().st_size for p in files),
            "stored": {row["name"]: row["bytes"] for row in account.get("layers", [])},
        }


def _attempt_sizes(model: ir.Model) -> dict:
    """The sizes the search judges an attempt's result by (its export's)."""
    return _export_sizes(model)


def _rounded_sizes(model: ir.Model) -> dict:
    """:func:`_export_sizes` of ``model`` as the schedule's last stage leaves it (values and
    palettes to float16; a small palette then takes float16 where that is fewer bytes), on a
    copy."""
    copy = snapshot_model(model)
    _run_specs(copy, [make_spec("round-fp16", {"compressed": True})], PassContext(seed=0))
    return _export_sizes(copy)


# The fewest held-out samples a gate measures on: with fewer, one sample is more than 3 points
# of the metric and a stage's roll-back, the search's gate and the reported agreement are noise
# (32 images held out 3, passed at 0.67 agreement and mapped every other image to one class).
MIN_HELD_OUT = 30


def too_few_samples(held: int, max_drop: float | None) -> str | None:
    """Why ``held`` held-out samples cannot gate ``max_drop`` (None: they can). They must be at
    least :data:`MIN_HELD_OUT`, and for ``max_drop > 0`` one sample's share (``1 / held``) must
    be within it, else a drop of a whole sample is the finest step the gate sees. ``max_drop``
    0 asks for no net loss at all, which any split of :data:`MIN_HELD_OUT` counts."""
    need = MIN_HELD_OUT
    if max_drop is not None and max_drop > 0:
        need = max(need, int(np.ceil(1.0 / max_drop - 1e-9)))
    if held >= need:
        return None
    what = f"--max-drop {max_drop:g}" if max_drop is not None else "the held-out metric"
    one = f"one sample is {1 / max(held, 1):.3f} of the metric"
    return f"{held} held-out samples cannot resolve {what} ({one}; {need} or more needed)"
