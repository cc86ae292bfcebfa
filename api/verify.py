"""``mconv verify``: a candidate's outputs against the reference's, gated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mconv.api.common import PathLike, _guards, _progress, _shapes
from mconv.api.run import open
from mconv.errors import GateFailed, InputError


class _Ticking:
    """A runner that reports each run to a progress display (verify over many batches)."""

    def __init__(self, runner, advance) -> None:
        self._runner, self._advance = runner, advance
        self.inputs = runner.inputs

    def run(self, feeds):
        result = self._runner.run(feeds)
        self._advance(1)
        return result


def _gate_failed(report) -> GateFailed:
    return GateFailed(
        "verification failed: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in report.failures.items())
    )


@dataclass
class VerifyResult:
    """``mconv verify``: the report (metrics per output, gates, batching); ``as_dict()`` is the
    ``--json`` document, ``check()`` raises ``GateFailed`` (exit 1) when a gate failed."""

    report: Any
    # per output: the distribution of |cand - ref| (``error_distribution`` in the JSON)
    errors: dict[str, Any] | None = None
    reference: str | None = None
    candidate: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.report.passed)

    @property
    def failures(self) -> dict:
        return self.report.failures

    def as_dict(self) -> dict[str, Any]:
        doc = self.report.as_dict()
        if self.errors is not None:
            doc["error_distribution"] = self.errors
        return doc

    def write_report(self, path: PathLike) -> Path:
        """The self-contained HTML report of this verify (:mod:`mconv.report`)."""
        from mconv.report import write_report

        summary = None
        if self.candidate is not None:
            from mconv.api.inspection import inspect_path

            summary = inspect_path(self.candidate)
        return write_report(
            path, "verify", self.as_dict(), inputs=[self.reference, self.candidate], summary=summary
        )

    def check(self) -> VerifyResult:
        if not self.passed:
            raise _gate_failed(self.report)
        return self


@_guards("reference", "candidate", "data")
def verify(
    reference: PathLike,
    candidate: PathLike,
    *,
    data: PathLike | None = None,
    samples: int | None = None,
    seed: int = 0,
    input_shapes=None,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    min_top1: float | None = None,
    min_snr_db: float | None = None,
    max_rel_l2: float | None = None,
    localize: bool = False,
    progress=None,
) -> VerifyResult:
    """``mconv verify REF CANDIDATE``: run both (models or bundles) on ``data`` or random inputs
    and gate the metrics; no gate given: the defaults (cosine >= 0.99, relative L2 error
    ``||cand - ref|| / ||ref||`` <= 0.03, top-1 agreement >= 0.99; weight files: SNR >= 10 dB per
    tensor). Returns the result; ``.check()`` raises on failure."""
    from mconv.edit.batch import batched_data, per_sample
    from mconv.metrics import (
        Gates,
        check_samples,
        check_shapes,
        load_npz_feeds,
        plan_random_feeds,
        run_feeds,
        verify_outputs,
    )
    from mconv.targets.weights import verify_weights, weight_pair

    check_samples(samples)
    user_gates = Gates(
        atol=atol,
        rtol=rtol,
        min_cosine=min_cosine,
        min_top1=min_top1,
        min_snr_db=min_snr_db,
        max_rel_l2=max_rel_l2,
    ).check()
    shapes = _shapes(input_shapes)
    reference, candidate = Path(reference), Path(candidate)
    pair = weight_pair(reference, candidate)
    if pair is not None:  # both sides are tensors only: compare them by name
        gates = user_gates if user_gates.any() else Gates.weight_defaults()
        report = verify_weights(*pair, gates)
        report.gates = gates.as_dict()
        report.gates_source = "user" if user_gates.any() else "default"
        return VerifyResult(report)
    ref = open(reference, None, shapes)
    cand = open(candidate, None, shapes)
    labels = None
    if data is not None:
        if samples is not None:
            raise InputError(
                "--samples draws random inputs; with --data every sample of the file is used",
                hint="drop --samples or --data",
            )
        feeds, labels = load_npz_feeds(data, ref.inputs, free_leading=True)
        split = batched_data(feeds, ref.inputs)
        if split is not None:  # the batch is fixed at 1: a run per sample
            feed_list, n_samples = per_sample(feeds, split), split
            how = f"{split} runs of one sample of {data} (the model's batch is fixed at 1)"
            batching = {"mode": "data", "batch": 1, "runs": split, "how": how}
        else:
            check_shapes(feeds, ref.inputs, data)
            feed_list = [feeds]
            first = next((a for a in feeds.values() if np.ndim(a) > 0), None)
            n_samples = int(first.shape[0]) if first is not None else 1
            batching = {"mode": "data", "batch": n_samples, "runs": 1, "how": f"one run of {data}"}
    else:
        plan = plan_random_feeds(ref.inputs, samples=samples, seed=seed, input_shapes=shapes)
        feed_list, n_samples, batching = plan.feeds, plan.samples, plan.as_dict()
    gates = user_gates if user_gates.any() else Gates.defaults()
    runs = len(feed_list)
    with _progress(progress)("verify", 2 * runs) as bar:
        bar(description=f"reference, {runs} run(s)")
        ref_out = run_feeds(_Ticking(ref, bar.advance), feed_list)
        bar(description=f"candidate, {runs} run(s)")
        cand_out = run_feeds(_Ticking(cand, bar.advance), feed_list)
    if not user_gates.any() and _is_tflite_int8(candidate):
        report = _verify_int8(ref_out, cand_out, labels, n_samples)
    else:
        report = verify_outputs(ref_out, cand_out, gates, labels, samples=n_samples)
        report.gates_source = "user" if user_gates.any() else "default"
    report.batching = batching
    errors = {n: error_distribution(ref_out[n], cand_out[n]) for n in report.outputs if n in cand_out}
    if localize:
        from mconv.api.localize import localize as do_localize

        # The first run's feeds: a drift shows in one batch as well as in all.
        report.localized = do_localize(reference, candidate, feed_list[0], user_gates, shapes)
    return VerifyResult(report, errors, str(reference), str(candidate))


def error_distribution(ref: Any, cand: Any, bins: int = 24) -> dict[str, Any]:
    """|cand - ref| of one output over every sample: quantiles and a histogram on log10 bins
    (exact zeros counted apart, non-finite places too); the report draws it."""
    r, c = np.asarray(ref), np.asarray(cand)
    if r.shape != c.shape or not (np.issubdtype(r.dtype, np.number) and np.issubdtype(c.dtype, np.number)):
        return {"values": int(r.size), "note": "not numeric or shapes differ"}
    with np.errstate(all="ignore"):
        d = np.abs(c.astype(np.float64) - r.astype(np.float64)).ravel()
    finite = d[np.isfinite(d)]
    positive = finite[finite > 0]
    doc: dict[str, Any] = {
        "values": int(d.size),
        "zeros": int(finite.size - positive.size),
        "nonfinite": int(d.size - finite.size),
        "quantiles": {
            q: float(np.quantile(finite, p)) if finite.size else None
            for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
        },
    }
    if positive.size:
        lo, hi = np.floor(np.log10(positive.min())), np.ceil(np.log10(positive.max()))
        edges = np.logspace(lo, max(hi, lo + 1), bins + 1)
        counts, _ = np.histogram(positive, edges)
        doc["log10_edges"] = [round(float(e), 4) for e in np.log10(edges)]
        doc["counts"] = [int(n) for n in counts]
    return doc


def _is_tflite_int8(path: Path) -> bool:
    """A full-integer tflite bundle, int8 or 16x8 (its manifest's target and precision option)."""
    from mconv.bundle import is_bundle, load_bundle

    if not is_bundle(path):
        return False
    b = load_bundle(path)
    return b.target == "tflite" and b.options.get("precision") in ("int8", "int16x8")


def _verify_int8(ref_out: dict, cand_out: dict, labels: Any, samples: int) -> Any:
    """The default gates of a full-int8 tflite bundle, per output
    (:mod:`mconv.targets.tflite.gate`): top-1 agreement for class probabilities of at most 256
    classes and per position for a sequence of class probabilities ``[N, T, K]``, cosine and relative L2 error for every other output; ``gate_rule`` says which."""
    import mconv.targets.tflite.gate as gate
    from mconv.metrics import Gates, VerifyReport, compare, gate_failures

    outputs, failures = {}, {}
    for name, r in ref_out.items():
        if name not in cand_out:
            raise InputError(
                f"candidate has no output '{name}'", hint=f"candidate outputs: {', '.join(cand_out)}"
            )
        c = cand_out[name]
        m = compare(r, c, labels)
        rec = gate.judge([np.asarray(c)], [np.asarray(r)])[0]
        m["gate_rule"] = rec["rule"]
        if rec["rule"] in ("top1", "top1/position"):  # per sample, or per sequence position
            m["top1_agreement"] = rec["top1"]
            g = Gates(min_top1=gate.TOP1)
        else:
            g = Gates(min_cosine=gate.COSINE, max_rel_l2=gate.REL)
        outputs[name] = m
        f = gate_failures(m, g, r, c)
        if f:
            failures[name] = f
    report = VerifyReport(
        passed=not failures,
        outputs=outputs,
        failures=failures,
        samples=samples,
        gates=Gates(min_top1=gate.TOP1, min_cosine=gate.COSINE, max_rel_l2=gate.REL).as_dict(),
    )
    report.gates_source = (
        "default for a tflite int8 bundle: top-1 on class probabilities (<= 256 classes), "
        "cosine and rel_l2 on other outputs"
    )
    return report
