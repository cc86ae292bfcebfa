"""Verification: compare a candidate's outputs with a reference's, metric by metric, and gate.

Metrics per output (stable names, scripts read them): ``max_abs``, ``max_rel``, ``mean_abs``,
``cosine``, ``rel_l2`` (``||cand - ref|| / ||ref||``), ``snr_db``; ``top1_agreement`` and
``top5_agreement`` where the output looks like class scores (2-D, batch x classes, classes >= 2);
with labels, ``accuracy_reference`` and ``accuracy_candidate``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from mconv.errors import InputError, show

# Relative errors are measured against max(|ref|, REL_FLOOR * max|ref|) so near-zero reference
# values do not turn rounding noise into huge relative errors.
REL_FLOOR = 1e-3


# Gates in force when the user gives none (as Polygraphy checks by default): the candidate's
# outputs point the same way as the reference's, are as large (cosine is blind to a uniform scale
# error: outputs 6% low keep it at 1.0), and class scores pick the same class.
DEFAULT_MIN_COSINE = 0.99
DEFAULT_MIN_TOP1 = 0.99
# The relative L2 error ||cand - ref|| / ||ref|| per output. fp32 bundles differ from the
# reference by ~1e-7, float16 storage (metal's default, the fp16 recipe) by ~1e-3, int8 weights
# (quantize) by ~1e-2 on the digits models; a uniform 6% scale error is 0.06.
DEFAULT_MAX_REL_L2 = 0.03
# Weight-only verify (tensors compared by name, no inference): signal-to-noise per tensor.
DEFAULT_MIN_SNR_DB = 10.0


@dataclass
class Gates:
    """Thresholds an output must meet; None: not checked.

    ``min_top1`` applies only to outputs that look like class scores (:func:`looks_like_scores`:
    2-D ``[N, C]`` floating outputs with ``C >= 2``, one row per sample); other outputs have no
    top-1 metric and are gated by the rest. ``min_snr_db`` gates the SNR (weight-only verify).
    ``max_rel_l2`` bounds the error relative to the output's scale, ``||cand - ref|| / ||ref||``:
    what cosine cannot see (a uniform scale error).
    """

    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    min_top1: float | None = None
    min_snr_db: float | None = None
    max_rel_l2: float | None = None

    def any(self) -> bool:
        return any(v is not None for v in asdict(self).values())

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def defaults(cls) -> Gates:
        return cls(min_cosine=DEFAULT_MIN_COSINE, min_top1=DEFAULT_MIN_TOP1, max_rel_l2=DEFAULT_MAX_REL_L2)

    @classmethod
    def weight_defaults(cls) -> Gates:
        return cls(min_snr_db=DEFAULT_MIN_SNR_DB)

    def check(self) -> Gates:
        """Refuse thresholds that mean nothing (exit 2, one line); returns self."""
        ranges = {
            "atol": (0.0, math.inf, "an absolute tolerance >= 0, e.g. --atol 1e-4"),
            "rtol": (0.0, math.inf, "a relative tolerance >= 0, e.g. --rtol 1e-3"),
            "min_cosine": (-1.0, 1.0, "a cosine similarity in [-1, 1], e.g. --min-cosine 0.99"),
            "min_top1": (0.0, 1.0, "a fraction of samples in [0, 1], e.g. --min-top1 0.99"),
            "min_snr_db": (-math.inf, math.inf, "decibels, e.g. --min-snr-db 20"),
            "max_rel_l2": (0.0, math.inf, "a relative error >= 0, e.g. --max-rel-l2 0.01"),
        }
        for key, (lo, hi, hint) in ranges.items():
            v = getattr(self, key)
            if v is None:
                continue
            option = "--" + key.replace("_", "-")
            if not math.isfinite(v) and not (key in ("atol", "rtol", "max_rel_l2") and v == math.inf):
                raise InputError(f"{option} {v} is not a number", hint=f"give {hint}")
            if not lo <= v <= hi:
                raise InputError(f"{option} {v:g} is out of range", hint=f"give {hint}")
        return self


def channel_weights(ref: np.ndarray) -> np.ndarray:
    """Per-channel weights of a raw output of three or more dimensions (channels on axis 1, a
    detector's ``[N, 4 + classes, anchors]``, a feature map's ``[N, C, H, W]``), broadcastable
    to ``ref``: each channel's weight is the mean over channels of the mean square of ``ref``,
    over that channel's mean square (at least 1e-6 of the mean: a channel that is zero
    throughout weighs 1e6, not infinity). Weighted, every channel of ``ref`` carries the same
    energy, so a comparison is not decided by the channel with the largest unit (box
    coordinates in pixels beside scores in [0, 1]). All ones below three dimensions."""
    if ref.ndim < 3:
        return np.ones((1,) * ref.ndim)
    axes = (0, *range(2, ref.ndim))
    ms = np.mean(np.square(ref, dtype=np.float64), axis=axes, keepdims=True)
    mean = float(np.mean(ms))
    if mean == 0.0:
        return np.ones_like(ms)
    return mean / np.maximum(ms, 1e-6 * mean)


def balanced_cosine(got: np.ndarray, ref: np.ndarray) -> float:
    """The cosine of ``got`` and ``ref`` with every axis-1 channel scaled by the square root of
    :func:`channel_weights` of ``ref`` (the plain cosine below three dimensions). A plain cosine
    of a detector's output is the cosine of its box coordinates: class scores that no longer
    pass the detection threshold leave it at 0.99."""
    scale = np.sqrt(channel_weights(ref))
    a = (got.astype(np.float64) * scale).ravel()
    b = (ref.astype(np.float64) * scale).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == nb == 0 else float(a @ b / max(na * nb, 1e-300))


def looks_like_scores(a: np.ndarray) -> bool:
    return a.ndim == 2 and a.shape[1] >= 2 and np.issubdtype(a.dtype, np.floating)


# ml_dtypes' numbers (numpy kind "V"): bfloat16 checkpoints, float8 and int4 tensors compare
# as numbers, not as opaque bytes
_ML_NUMBERS = frozenset(
    (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float4_e2m1fn",
        "int4",
        "uint4",
    )
)


def _map_rows(a) -> np.ndarray:
    """A sequence of maps with one key set (ai.onnx.ml ZipMap's output: one ``{label: score}`` per
    sample) as a ``[N, K]`` float array, keys sorted; anything else as it is."""
    a = np.asarray(a) if not isinstance(a, list) else a
    rows = list(a.ravel()) if isinstance(a, np.ndarray) and a.dtype == object else a
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return np.asarray(a)
    keys = sorted(rows[0], key=repr)
    if any(sorted(r, key=repr) != keys for r in rows):
        return np.asarray(a)
    return np.array([[float(r[k]) for k in keys] for r in rows], dtype=np.float64)


def map_keys(a) -> np.ndarray | None:
    """The sorted keys of a sequence of maps that :func:`_map_rows` turns into columns (as an
    array of their own type), else None."""
    rows = list(a.ravel()) if isinstance(a, np.ndarray) and a.dtype == object else a
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return None
    keys = sorted(rows[0], key=repr)
    if any(sorted(r, key=repr) != keys for r in rows):
        return None
    return np.asarray(keys) if all(isinstance(k, str) for k in keys) else np.asarray(keys, np.int64)


def savable(name: str, value) -> list[tuple[str, np.ndarray]]:
    """An output as arrays an ``.npz`` holds without pickling: numbers as they are; strings as a
    unicode array; a sequence of maps with one key set (ai.onnx.ml ZipMap's) as ``[N, K]`` float
    scores under ``name`` and its sorted keys under ``name.keys``. Anything else is refused by
    name."""
    keys = map_keys(value)
    if keys is not None:
        return [(name, _map_rows(value)), (f"{name}.keys", keys)]
    a = np.asarray(value) if not isinstance(value, list) else np.asarray(value, dtype=object)
    if a.dtype != object:
        return [(name, a)]
    if all(isinstance(v, str) for v in a.ravel()):
        return [(name, a.astype(str))]
    raise InputError(
        f"output '{show(name)}' holds values an .npz cannot store without pickling",
        hint="read it through the Python API (mconv.run) instead of -o",
    )


def compare(ref: np.ndarray, cand: np.ndarray, labels: np.ndarray | None = None) -> dict:
    """All metrics for one output pair."""
    ref = _map_rows(ref)
    cand = _map_rows(cand)
    if ref.shape != cand.shape:
        raise InputError(
            f"output shapes differ: reference {ref.shape} vs candidate {cand.shape}",
            hint="compare models with the same outputs",
        )
    if not (np.issubdtype(ref.dtype, np.number) or ref.dtype == bool or ref.dtype.name in _ML_NUMBERS):
        equal = bool(np.array_equal(ref, cand))
        return {
            "max_abs": 0.0 if equal else math.inf,
            "max_rel": 0.0 if equal else math.inf,
            "mean_abs": 0.0 if equal else math.inf,
            "cosine": 1.0 if equal else 0.0,
            "rel_l2": 0.0 if equal else math.inf,
            "snr_db": math.inf if equal else -math.inf,
        }
    r = ref.astype(np.float64).ravel()
    c = cand.astype(np.float64).ravel()
    out: dict = {}
    if r.size == 0:
        return {
            "max_abs": 0.0,
            "max_rel": 0.0,
            "mean_abs": 0.0,
            "cosine": 1.0,
            "rel_l2": 0.0,
            "snr_db": math.inf,
        }
    # inf or NaN in an output (a weight past float16's range) makes the metrics inf or the worst
    # value, never NaN (which every gate would pass) and never a warning
    with np.errstate(all="ignore"):
        same = (r == c) | (np.isnan(r) & np.isnan(c))
        diff = np.where(same, 0.0, np.abs(r - c))
        diff[np.isnan(diff)] = np.inf
        out["max_abs"] = float(diff.max())
        finite = np.abs(r[np.isfinite(r)])
        floor = REL_FLOOR * float(finite.max() if finite.size else 0.0) or 1e-30
        out["max_rel"] = float((diff / np.maximum(np.abs(np.nan_to_num(r)), floor)).max())
        out["mean_abs"] = float(diff.mean())
        nr, nc = float(np.linalg.norm(r)), float(np.linalg.norm(c))
        if nr == 0 and nc == 0:
            out["cosine"] = 1.0
        elif nr == 0 or nc == 0:
            out["cosine"] = 0.0
        else:
            out["cosine"] = float(np.dot(r, c) / (nr * nc))
        noise = float(np.sum(diff**2))
        signal = float(np.sum(r**2))
        # ||cand - ref|| / ||ref||: 0 where they are equal (zeros too), inf for any error on a zero
        # reference or any inf/NaN difference (never NaN, which no gate would catch)
        if noise == 0:
            out["rel_l2"] = 0.0
        elif math.isfinite(noise) and nr > 0 and math.isfinite(nr):
            out["rel_l2"] = math.sqrt(noise) / nr
        else:
            out["rel_l2"] = math.inf
    if not math.isfinite(out["cosine"]):
        out["cosine"] = 1.0 if bool(same.all()) else 0.0
    if noise == 0:
        out["snr_db"] = math.inf
    elif math.isfinite(noise) and math.isfinite(signal) and signal > 0:
        out["snr_db"] = 10 * math.log10(signal / noise)
    else:
        out["snr_db"] = -math.inf
    if looks_like_scores(ref):
        top_r = np.argsort(-ref, axis=1, kind="stable")
        top_c = np.argsort(-cand, axis=1, kind="stable")
        out["top1_agreement"] = float(np.mean(top_r[:, 0] == top_c[:, 0]))
        k = min(5, ref.shape[1])
        # top-5 agreement: the candidate's top-1 is among the reference's top-5.
        out["top5_agreement"] = float(np.mean([top_c[i, 0] in top_r[i, :k] for i in range(ref.shape[0])]))
        if labels is not None:
            lab = np.asarray(labels).reshape(-1)
            if lab.shape[0] == ref.shape[0]:
                lab = check_labels(lab, ref.shape[1])
                out["accuracy_reference"] = float(np.mean(top_r[:, 0] == lab))
                out["accuracy_candidate"] = float(np.mean(top_c[:, 0] == lab))
    return out


def gate_failures(
    metrics: dict, gates: Gates, ref: np.ndarray | None = None, cand: np.ndarray | None = None
) -> list[str]:
    """Which gates this output fails (empty list: passes)."""
    fails = []
    if gates.atol is not None or gates.rtol is not None:
        atol = gates.atol or 0.0
        rtol = gates.rtol or 0.0
        if ref is not None and cand is not None and np.issubdtype(np.asarray(ref).dtype, np.number):
            r = np.asarray(ref, dtype=np.float64)
            c = np.asarray(cand, dtype=np.float64)
            with np.errstate(invalid="ignore"):
                close = (np.abs(r - c) <= atol + rtol * np.abs(r)) | (r == c)  # equal infs too
            bad = ~close & ~(np.isnan(r) & np.isnan(c))  # NaN where the reference has NaN: equal
            if bad.any():
                fails.append(
                    f"{int(bad.sum())} of {bad.size} values beyond atol={atol:g} rtol={rtol:g} "
                    f"(max_abs {metrics['max_abs']:.3g})"
                )
        elif not metrics["max_abs"] <= atol:  # NaN fails
            fails.append(f"max_abs {metrics['max_abs']:.3g} > atol {atol:g}")
    # A NaN metric (a NaN or inf in the outputs) fails a gate: "not >=", never "<".
    if gates.min_cosine is not None and not metrics["cosine"] >= gates.min_cosine:
        fails.append(f"cosine {metrics['cosine']:.6f} < {gates.min_cosine}")
    if (
        gates.min_top1 is not None
        and "top1_agreement" in metrics
        and not metrics["top1_agreement"] >= gates.min_top1
    ):
        fails.append(f"top1_agreement {metrics['top1_agreement']:.4f} < {gates.min_top1}")
    if gates.max_rel_l2 is not None and not metrics.get("rel_l2", math.inf) <= gates.max_rel_l2:
        fails.append(f"rel_l2 {metrics.get('rel_l2', math.inf):.3g} > {gates.max_rel_l2:g}")
    if gates.min_snr_db is not None and not metrics["snr_db"] >= gates.min_snr_db:
        fails.append(f"snr_db {metrics['snr_db']:.2f} < {gates.min_snr_db:g}")
    return fails


@dataclass
class VerifyReport:
    passed: bool
    outputs: dict[str, dict]
    failures: dict[str, list[str]] = field(default_factory=dict)
    samples: int = 0
    localized: dict | None = None
    gates: dict = field(default_factory=dict)  # the gates in force (defaults or the user's)
    gates_source: str = "user"  # "user" or "default"
    batching: dict | None = None  # how the samples were fed: batch size per run, runs

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "outputs": self.outputs,
            "failures": self.failures,
            "samples": self.samples,
            "batching": self.batching,
            "gates": self.gates,
            "gates_source": self.gates_source,
            "localized": self.localized,
        }


def verify_outputs(
    ref_out: dict[str, np.ndarray],
    cand_out: dict[str, np.ndarray],
    gates: Gates,
    labels: np.ndarray | None = None,
    *,
    samples: int | None = None,
) -> VerifyReport:
    """Metrics and gate failures per output. ``samples``: how many samples were fed (the caller
    knows; without it, the leading dimension of the first batched output, a guess)."""
    outputs, failures = {}, {}
    for name, r in ref_out.items():
        if name not in cand_out:
            raise InputError(
                f"candidate has no output '{name}'", hint=f"candidate outputs: {', '.join(cand_out)}"
            )
        m = compare(r, cand_out[name], labels)
        outputs[name] = m
        f = gate_failures(m, gates, r, cand_out[name])
        if f:
            failures[name] = f
    if samples is None:
        samples = next((int(np.asarray(v).shape[0]) for v in ref_out.values() if np.ndim(v) > 0), 1)
    return VerifyReport(
        passed=not failures, outputs=outputs, failures=failures, samples=samples, gates=gates.as_dict()
    )


# --- feeds -------------------------------------------------------------------------------------


def parse_input_shapes(specs: list[str] | None) -> dict[str, list[int]]:
    """``NAME=1,3,224,224`` strings -> {name: [dims]}."""
    shapes: dict[str, list[int]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition("=")
        if not sep or not name:
            raise InputError(f"bad --input-shape '{spec}'", hint="use NAME=1,3,224,224")
        try:
            shapes[name] = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise InputError(
                f"bad --input-shape '{spec}': dimensions must be integers", hint="use NAME=1,3,224,224"
            ) from None
    return shapes


def resolve_shape(name: str, shape, given: dict[str, list[int]]) -> list[int]:
    """Concrete shape for an input: ``--input-shape`` wins; a symbolic first dim is batch 1."""
    if name in given:
        return list(given[name])
    if shape is None:
        raise InputError(f"input '{name}' has no shape in the model", hint=f"pass --input-shape {name}=...")
    dims = []
    for i, d in enumerate(shape):
        if isinstance(d, int) and d >= 0:
            dims.append(d)
        elif i == 0:
            dims.append(1)  # a batch-like leading dimension
        else:
            raise InputError(
                f"input '{name}' has symbolic dimension {i} ('{d}')",
                hint=f"pass --input-shape {name}="
                + ",".join(str(x) if isinstance(x, int) else "N" for x in shape),
            )
    return dims


_NP_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "float64": np.float64,
    "int64": np.int64,
    "int32": np.int32,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}


def _batch_dim(spec, given: dict[str, list[int]]):
    """The input's leading dimension: ('free', None) symbolic, ('fixed', B), or (None, None) rank 0."""
    if spec.name in given:
        return ("fixed", given[spec.name][0]) if given[spec.name] else (None, None)
    if spec.shape is None or len(spec.shape) == 0:
        return (None, None)
    d = spec.shape[0]
    if isinstance(d, int) and d >= 0:
        return ("fixed", d)
    return ("free", None)


@dataclass
class FeedPlan:
    """Random feeds for ``samples`` samples: one run when the batch dimension is free (symbolic),
    else ``runs`` runs of the fixed batch (``samples`` = ``runs`` x ``batch``)."""

    feeds: list[dict[str, np.ndarray]]
    samples: int
    batch: int
    mode: str  # "symbolic" (one run), "fixed" (runs of the fixed batch), "unbatched" (no batch dim)

    def as_dict(self) -> dict:
        runs = len(self.feeds)
        how = {
            "symbolic": f"one run with the symbolic batch dimension set to {self.batch}",
            "fixed": f"{runs} run(s) of the fixed batch size {self.batch}",
            "unbatched": f"{runs} run(s), one sample each (no input has a batch dimension)",
        }[self.mode]
        return {"mode": self.mode, "batch": self.batch, "runs": runs, "how": how}


# Random feeds (run, verify without --data) are drawn in memory, every run at once: at most this
# many bytes in all, counted as drawn (8 bytes a value). A declared input shape is no allocation, so a model may import with an input
# of [2**40, 64]; drawing random values for it is refused by name instead.
MAX_RANDOM_BYTES = 1 << 30


def _check_random_size(inputs, given, free_batch, runs: int) -> None:
    """Refuse random feeds that would not fit ``MAX_RANDOM_BYTES`` (or no array at all)."""
    from mconv.fileio import check_shape

    hint = "give real inputs (--data FILE.npz), fewer --samples or a smaller --input-shape NAME=1,..."
    total = 0
    largest: tuple[str, list[int], int] = ("", [], 0)
    for spec in inputs:
        dims = resolve_shape(spec.name, spec.shape, given)
        if free_batch is not None and _batch_dim(spec, given)[0] == "free":
            dims[0] = free_batch
        itemsize = 8  # every value is drawn as a float64 or int64, then cast (_draw)
        what = f"random input '{show(spec.name)}'"
        need = check_shape(dims, itemsize, what=what, path=None, where=None, hint=hint) * runs
        total += need
        if need > largest[2]:
            largest = (what, dims, need)
    if total > MAX_RANDOM_BYTES:
        what, dims, need = largest
        raise InputError(
            f"{what} of shape {show(repr(dims), 80)} needs {need} bytes over {runs} run(s), random "
            f"inputs {total} bytes in all (limit {MAX_RANDOM_BYTES})",
            hint=hint,
        )


def check_samples(samples: int | None) -> None:
    if samples is not None and samples < 1:
        raise InputError(f"--samples {samples} must be at least 1", hint="e.g. --samples 4")


def plan_random_feeds(
    inputs,
    *,
    samples: int | None = None,
    seed: int = 0,
    input_shapes: dict[str, list[int]] | None = None,
    default_samples: int = 4,
) -> FeedPlan:
    """Random feeds for ``samples`` samples (``None``: ``default_samples``, rounded up to whole
    fixed batches). The leading dimension of each input is its batch: a symbolic one is set to
    the sample count (one run); a fixed one (in the model or by ``--input-shape``) is kept and the
    samples are fed as several runs of that batch; an explicit ``--samples`` that is not a
    multiple of the fixed batch is refused."""
    check_samples(samples)
    inputs = list(inputs)
    given = dict(input_shapes or {})
    kinds = [_batch_dim(s, given) for s in inputs]
    free = any(k == "free" for k, _ in kinds)
    fixed = next((b for k, b in kinds if k == "fixed"), None)
    if free or fixed is None:
        n = samples if samples is not None else default_samples
        if not free:  # no batched input at all (scalars): each run is one sample
            n_runs, batch = n, 1
        else:
            n_runs, batch = 1, n
    else:
        batch = max(int(fixed), 1)
        if samples is None:
            n_runs = -(-default_samples // batch)
        else:
            if samples % batch:
                raise InputError(
                    f"--samples {samples} is not a multiple of the model's fixed batch size {batch}",
                    hint=f"use --samples {max(batch, samples // batch * batch)} or "
                    f"{-(-samples // batch) * batch} (runs of {batch}), or make the batch "
                    "dimension symbolic",
                )
            n_runs = samples // batch
    _check_random_size(inputs, given, batch if free else None, n_runs)
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n_runs):
        feeds.append(_draw(inputs, rng, given, batch if free else None))
    mode = "symbolic" if free else ("unbatched" if fixed is None else "fixed")
    return FeedPlan(feeds=feeds, samples=n_runs * batch, batch=batch, mode=mode)


def _draw(inputs, rng, given, free_batch) -> dict[str, np.ndarray]:
    out = {}
    for spec in inputs:
        dims = resolve_shape(spec.name, spec.shape, given)
        if free_batch is not None and _batch_dim(spec, given)[0] == "free":
            dims[0] = free_batch
        dtype = _NP_DTYPES.get(str(spec.dtype), np.float32)
        if np.issubdtype(dtype, np.floating):
            out[spec.name] = rng.standard_normal(dims).astype(dtype)
        elif dtype == np.bool_:
            out[spec.name] = rng.integers(0, 2, dims).astype(bool)
        else:
            out[spec.name] = rng.integers(0, 10, dims).astype(dtype)
    return out


def run_feeds(runner, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Run every feed dict and join each output over the runs (along the batch axis; outputs of
    rank 0 are stacked; outputs whose shape changes between runs are flattened and joined)."""
    results = [runner.run(f) for f in feeds]
    if len(results) == 1:
        return dict(results[0])
    joined = {}
    for name in results[0]:
        parts = [np.asarray(r[name]) for r in results if name in r]
        if len(parts) != len(results):
            continue
        if parts[0].ndim == 0:
            joined[name] = np.stack(parts)
        elif all(p.shape[1:] == parts[0].shape[1:] for p in parts):
            joined[name] = np.concatenate(parts, axis=0)
        else:
            joined[name] = np.concatenate([p.ravel() for p in parts])
    return joined


_FINITE_CHUNK = 1 << 20  # elements checked at a time: a copy of at most this many booleans


def _first_where(array: np.ndarray, test) -> tuple[int, ...] | None:
    """The multi-index of the first element (C order) where ``test(chunk)`` is True, reading
    ``array`` in chunks of :data:`_FINITE_CHUNK` elements (never a whole-array temporary)."""
    flat = array.reshape(-1)  # a view for any contiguous array; a copy only for a strided one
    for start in range(0, flat.size, _FINITE_CHUNK):
        hit = np.flatnonzero(test(flat[start : start + _FINITE_CHUNK]))
        if hit.size:
            return tuple(int(i) for i in np.unravel_index(start + int(hit[0]), array.shape))
    return None


def check_finite(
    array: np.ndarray, name: str, path: str | Path | None = None, where: str | None = None
) -> None:
    """Calibration and training data hold no NaN or inf: one would spread into every weight a
    pass fits to it. Floating arrays only (integers are always finite); checked in chunks."""
    a = np.asarray(array)
    if a.dtype.kind not in "fc" or a.size == 0:
        return
    at = _first_where(a, lambda c: ~np.isfinite(c))
    if at is None:
        return
    bad = a[at]
    what = "NaN" if np.isnan(bad) else "inf"
    raise InputError(
        f"array '{show(name)}' holds {what} at index {at}",
        path=None if path is None else str(path),
        where=where,
        hint="calibration and training data must be finite numbers",
    )


def check_labels(
    labels: np.ndarray, classes: int | None = None, path: str | Path | None = None, where: str | None = None
) -> np.ndarray:
    """``labels`` as int64 class indices: whole numbers in ``[0, classes)`` (``classes`` None:
    only ``>= 0``), else an InputError naming the first bad index."""
    lab = np.asarray(labels).reshape(-1)
    p = None if path is None else str(path)
    if lab.dtype.kind not in "iuf":
        raise InputError(
            f"array 'labels' is {lab.dtype}", path=p, where=where, hint="labels: one integer class per sample"
        )
    top = (1 << 62) if classes is None else classes
    if lab.dtype.kind == "f":
        at = _first_where(lab, lambda c: ~np.isfinite(c) | (c != np.floor(c)) | (c < 0) | (c >= top))
    else:
        at = _first_where(lab, lambda c: (c < 0) | (c >= top))
    if at is not None:
        value = lab[at]
        scope = "[0, 2**62)" if classes is None else f"[0, {classes})"
        raise InputError(
            f"array 'labels' holds {value!r} at index {at}",
            path=p,
            where=where,
            hint=f"labels are whole class numbers in {scope}",
        )
    return lab.astype(np.int64)


def _check_shape(spec, a: np.ndarray, path, skip: int = 0) -> None:
    """Refuse an array whose shape contradicts the input's declared one (from dimension ``skip``)."""
    if spec.shape is None:
        return
    if len(spec.shape) != a.ndim or any(
        isinstance(d, int) and d >= 0 and d != s for d, s in zip(spec.shape[skip:], a.shape[skip:])
    ):
        raise InputError(
            f"array '{show(spec.name)}' has shape {list(a.shape)}, the model expects {list(spec.shape)}",
            path=None if path is None else str(path),
            hint="reshape the data or the model input",
        )


def check_shapes(feeds: Mapping[str, np.ndarray], inputs, path=None) -> None:
    """Refuse feeds whose shapes contradict the inputs' declared ones (every dimension)."""
    for spec in inputs:
        if spec.name in feeds:
            _check_shape(spec, np.asarray(feeds[spec.name]), path)


def load_npz_feeds(
    path: str | Path, inputs, *, free_leading: bool = False
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Feeds from an ``.npz`` keyed by input name (optional ``labels``), checked against the inputs.

    ``free_leading``: an input declared ``[1, ...]`` takes any number of samples (the caller runs
    them one by one or frees the model's batch: :mod:`mconv.edit.batch`)."""
    from mconv.fileio import require_file
    from mconv.npzio import read_npz  # bounded: sizes checked before inflating

    p = require_file(path, "data file (.npz)")
    arrays = dict(read_npz(p))
    labels = arrays.pop("labels", None)
    if labels is not None:
        labels = check_labels(labels, path=p)
    names = [s.name for s in inputs]
    missing = [n for n in names if n not in arrays]
    if missing:
        if len(names) == 1 and len(arrays) == 1:
            arrays = {names[0]: next(iter(arrays.values()))}
        else:
            raise InputError(
                f"no array for input(s) {', '.join(missing)}; the file has "
                f"{', '.join(sorted(arrays)) or 'no arrays'}",
                path=str(p),
                hint="key the arrays by the model's input names",
            )
    feeds = {}
    for spec in inputs:
        a = arrays[spec.name]
        _check_shape(spec, a, p, skip=1 if free_leading and spec.shape and spec.shape[0] == 1 else 0)
        check_finite(a, spec.name, p)
        want = _NP_DTYPES.get(str(spec.dtype))
        if want is not None and a.dtype != want:
            if np.issubdtype(want, np.floating) and np.issubdtype(a.dtype, np.number):
                with np.errstate(over="ignore"):  # a value beyond the model's float type: refused next
                    a = a.astype(want)
                at = _first_where(a, lambda c: ~np.isfinite(c))
                if at is not None:
                    raise InputError(
                        f"array '{show(spec.name)}' holds a value beyond {want.__name__} at index {at}",
                        path=str(p),
                        hint="calibration and training data must fit the model's input type",
                    )
            else:
                raise InputError(
                    f"array '{spec.name}' is {a.dtype}, the model expects {spec.dtype}",
                    path=str(p),
                    hint="convert the array's dtype",
                )
        feeds[spec.name] = a
    return feeds, labels
