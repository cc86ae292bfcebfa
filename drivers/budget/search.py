"""Rule 7: the search over allocations (bisection on the drop, or fitting a size)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.drivers.budget import evaluation as E
from mconv.drivers.budget import schedule as S
from mconv.drivers.budget import softshare as _softshare
from mconv.drivers.budget.allocation import _alloc_bytes, _alloc_cost, _frontier, _widest, _within
from mconv.drivers.budget.attempt import Search
from mconv.drivers.budget.config import PRE_PASSES, STRUCTURED, BudgetConfig, Progress
from mconv.drivers.budget.datafree import _data_free
from mconv.drivers.budget.evaluation import (
    _check_data,
    _Evaluator,
    _restore,
    _score_value,
    _weights_state,
    _with_validation,
    split_indices,
)
from mconv.drivers.budget.result import BudgetNotMet, BudgetResult, _result
from mconv.drivers.budget.schedule import _bias_spec, _prefix, auto_shift, default_epochs
from mconv.drivers.budget.sensitivity import _candidates, simulated
from mconv.errors import InputError
from mconv.passes.base import PassContext, PassSpec
from mconv.passes.pipeline import make_spec, snapshot_model

#: Rule 7: the search between a passing and a failing budget stops when the failing one is
#: within this share of the passing one (10%: closer than one attempt's noise in bytes)
REFINE_CLOSE = 0.1


def compress_to_budget(
    model: ir.Model,
    data: Mapping[str, np.ndarray] | None,
    config: BudgetConfig | None = None,
    *,
    progress: Progress | None = None,
    val_data: Mapping[str, np.ndarray] | None = None,
    check_gate: Callable[[int, float | None], None] | None = None,
    **options: Any,
) -> BudgetResult:
    """Deep Compression of ``model`` (mutated) under a budget; see the package's rules.

    ``config`` holds the options (:class:`BudgetConfig`); ``options`` are its fields, set on it
    (or on the defaults): ``compress_to_budget(m, data, max_drop=0.01)``.

    ``check_gate(held, max_drop)``, when given, is called once the options are checked and
    before any work, with the held-out samples the gate will measure on and the drop it gates
    (the CLI refuses too few there: :func:`too_few_samples`).

    Raises :class:`BudgetNotMet` (a GateFailed, with ``.result``) when ``max_drop`` cannot be met within
    ``target_size``; :class:`InputError` for bad options or data."""
    t_start = time.perf_counter()
    config = BudgetConfig.of(config, **options)
    if val_data is not None and data is None:
        raise InputError(
            "validation data without calibration data",
            where="--val-data",
            hint="give --data D.npz (fine-tuning) with --val-data V.npz (the gate)",
        )
    max_drop = config.max_drop
    if data is not None and max_drop is None and config.target_size is None:
        max_drop = 0.005
    say = progress or (lambda *a: None)
    history_before = model.metadata_props.get("mconv.passes")
    if check_gate is not None and data is not None:
        n_data = _check_data(model, data)[2]
        held_n = (
            _check_data(model, val_data)[2]
            if val_data is not None
            else len(split_indices(n_data, config.holdout, config.seed)[1])
        )
        check_gate(held_n, max_drop)
    pre = [make_spec(n, {}) for n in PRE_PASSES]
    say("preparing (fold, eliminate-identity, dce)", 0, None)
    ctx = PassContext(data=None if data is None else dict(data), seed=config.seed, progress=None)
    ctx.reference_model = snapshot_model(model) if data is not None else None
    E._run_specs(model, pre, ctx)
    if data is None:
        return _data_free(
            model, pre, config.target_size, config.seed, config.snr_db_min, say, t_start,
            history_before, config.sparsities, config.bits,
            workers=config.workers, ray_address=config.ray_address, measured=config.measured,
        )  # fmt: skip
    search = _prepare(model, data, val_data, config, max_drop, say, ctx, pre)
    _pretrain(search, model)
    _allocations(search, model)
    search.base = snapshot_model(model)  # every attempt starts from here
    search.base_history = history_before
    best = _fit_size(search) if max_drop is None else _bisect(search)
    return _report(search, best, t_start)


def _prepare(
    model: ir.Model,
    data: Mapping[str, np.ndarray],
    val_data: Mapping[str, np.ndarray] | None,
    config: BudgetConfig,
    max_drop: float | None,
    say: Progress,
    ctx: PassContext,
    pre: list[PassSpec],
) -> Search:
    """Rules 1, 2 and 6: the split, the reference's outputs and metric, the stages' epochs and
    shifts."""
    seed, holdout = config.seed, config.holdout
    feeds, labels, n = _check_data(model, data)
    if val_data is None:
        train, held = split_indices(n, holdout, seed)
        total = n
    else:  # rule 1: a validation set of its own; fine-tuning sees every sample of ``data``
        feeds, labels, held = _with_validation(model, feeds, labels, val_data)
        train = split_indices(n, 0.0, seed)[0]  # the finetune pass's sample order
        holdout, total = 0.0, n + len(held)
    from mconv.drivers.budget.schedule import macs_per_sample
    from mconv.engines.fast import auto_engine, engine_label

    epochs = config.epochs if config.epochs is not None else default_epochs(model, feeds, len(train))
    if config.engine == "auto":  # rule 11: the fastest engine for this much work
        engine, device = auto_engine(macs_per_sample(model, feeds) * len(train) * epochs, config.device)
        config = BudgetConfig.of(config, engine=engine, device=device)
    say(f"original outputs (engine {engine_label(config.engine, config.device)})", 0, None)
    output = _score_value(model)
    on = {"engine": config.engine, "device": config.device, "memo": ctx.memo}  # rule 11
    ev0 = _Evaluator(feeds, output, np.zeros((0,)), labels, **on)  # type: ignore[arg-type]
    reference = ctx.reference_model
    ev = _Evaluator(feeds, output, ev0.outputs(reference, np.arange(total)), labels, **on)  # type: ignore[arg-type]
    baseline = ev.metric(ev.reference[held], held)
    shift = config.shift if config.shift is not None else auto_shift(feeds)
    # Rule 6: the teacher's outputs on the moved samples once per move for the whole search (the
    # finetune pass's rule 8), when an attempt's stages train at least as many epochs as there
    # are moves; the stages' recipe says so, so a rerun makes the same choice.
    centroid_stages = S.CLUSTER_GROUPS if S.CLUSTER_GROUPS > 1 else 2
    attempt_epochs = epochs * (len(S.PRUNE_STEPS) - 1 + S.FINAL_RETRAIN + centroid_stages)
    shift_targets = "table" if shift and (2 * shift + 1) ** 2 <= attempt_epochs else "auto"
    search = Search(
        config=config, say=say, ev=ev, train=train, held=held, baseline=baseline, max_drop=max_drop,
        epochs=epochs, holdout=holdout, shift=shift, shift_targets=shift_targets,
        data=ctx.data, reference=reference, memo=ctx.memo, pre=list(pre), pre_stages=[],
        start_metric=baseline,
    )  # fmt: skip
    search.split = {
        "samples": total,
        "train": int(len(train)),
        "held_out": int(len(held)),
        "holdout": holdout,
        "validation": val_data is not None,
        "seed": seed,
        "gate_se": config.gate_se if max_drop is not None else 0.0,
    }
    return search


def _pretrain(s: Search, model: ir.Model) -> None:
    """Rule 6: L2 pre-training, so that weights the task does not use go to zero first; rolled
    back when it makes the held-out outputs worse."""
    c = s.config
    if _softshare.uses_prior(s, model):  # the mixture prior instead of L2 decay
        return _softshare.pretrain_with_prior(s, model)
    if c.decay <= 0:
        return
    spec = S._finetune_spec(
        s.epochs, 1e-3, c.seed, s.holdout, c.batch_size, weight_decay=c.decay, engine=c.engine,
        device=c.device, shift=s.shift, shift_targets=s.shift_targets, loss=s.loss,
    )  # fmt: skip
    state = _weights_state(model)
    pctx = PassContext(data=s.data, reference_model=s.reference, seed=c.seed, memo=s.memo)
    pctx.progress = _prefix(s.say, "L2 pre-training")
    t0 = time.perf_counter()
    E._run_specs(model, [spec], pctx)
    got = s.ev.outputs(model, s.held)
    m = s.ev.metric(got, s.held)
    rolled = s.ev.worse(s.ev.reference[s.held], got, s.held)
    if rolled:
        _restore(model, state)
    else:
        s.pre = [*s.pre, spec]
        s.start_metric = m
    s.pre_stages.append(
        {
            "stage": "L2 pre-training",
            "metric_before": s.baseline,
            "metric_after": m,
            "rolled_back": rolled,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )


def _allocations(s: Search, model: ir.Model) -> None:
    """Rules 3, 5 and 7: the layers' candidates, the frontier, and the allocations whose layers'
    blobs fit the room the rest of the export leaves under the target."""
    c = s.config
    s.layers, s.est = _candidates(
        model, s.ev, s.train, c.estimator, s.say, _softshare.sparsities_for(s), _softshare.bits_for(s),
        workers=c.workers, ray_address=c.ray_address,
        structured=STRUCTURED if c.structured == "auto" else (),
    )  # fmt: skip
    if not s.layers:
        raise InputError(
            "no named Conv/Gemm/MatMul weights to compress", hint="the model has no weight layers"
        )
    frontier = _frontier(s.layers)
    s.est["layers"] = len(s.layers)
    s.est["frontier"] = len(frontier)
    # the frontier's points for the report's chart (a convex hull: a few dozen at most)
    s.est["frontier_points"] = [
        {"predicted_bytes": _alloc_bytes(s.layers, a), "estimated_cost": _alloc_cost(s.layers, a)}
        for a in frontier
    ]
    target = c.target_size
    if target is None:
        s.fitting = frontier
        return
    # rule 7: what the weights' blobs have room for: the target less the rest of the export (the
    # index, the biases clustered as the schedule clusters them, for a bundle target its other
    # files and the schedule's history), measured on the model before the search
    estimate = snapshot_model(model)
    E._run_specs(estimate, [_bias_spec()], PassContext(seed=c.seed))
    s.room = target - s.nonlayer_now(estimate, list(s.pre), s.plan_for(_widest(s.layers)))
    fitting = [a for a in frontier if _alloc_bytes(s.layers, a) <= s.room]
    packed = _within(s.layers, s.room)
    if packed is not None and packed not in fitting:
        # the least costly allocation that fits, found between the frontier's points
        fitting = sorted(
            [*fitting, packed], key=lambda a: (_alloc_bytes(s.layers, a), _alloc_cost(s.layers, a))
        )
    s.fitting = fitting or frontier[:1]


def _fit_size(s: Search) -> dict:
    """Rule 7, a target size alone: the least costly allocation that fits, then the budget cut
    by an overshoot or grown (once) by what an attempt left unspent."""
    target, layers, fitting = s.config.target_size, s.layers, s.fitting
    assert target is not None  # data with neither asks for max_drop 0.005
    measured = s.config.measured
    grow_over = max(16, target // 25)  # rule 7: what an attempt may leave unspent without a bigger one
    k = min(range(len(fitting)), key=lambda i: (_alloc_cost(layers, fitting[i]), -i))
    r = s.run(k)
    grown = False
    while len(s.tried) < s.config.attempts:
        fits = [t["budget"] for t in s.tried.values() if t["ok_size"]]
        overs = [t["budget"] for t in s.tried.values() if not t["ok_size"]]
        if not r["ok_size"]:
            # the export overshot the prediction: the least costly allocation of a budget cut by
            # the overshoot (and 2% more), else the next smaller frontier point; never one below
            # a budget that already fits (that attempt is the answer)
            over = r["sizes"][measured] - target
            cut = _within(layers, _alloc_bytes(layers, fitting[k]) - over - (s.room + 49) // 50)
            if fits and (cut is None or _alloc_bytes(layers, cut) <= max(fits)):
                break
            if cut is not None and cut not in fitting:
                fitting.append(cut)
                k = len(fitting) - 1
            elif k > 0:
                k = max(k - max(1, len(fitting) // 8), 0)
            else:
                break
        else:
            # rule 7: the export left more than 1% of the target unspent (the biases and the index
            # cost less than their estimate): once, the least costly allocation of the budget grown
            # by what was left (less 1%), and at most halfway to a budget that overshot (between
            # the two, the prediction's error decides)
            slack = target - r["sizes"][measured]
            one = (target + 99) // 100
            if grown or slack <= grow_over:
                break
            grown = True
            grow_to = r["budget"] + slack - one
            if overs:
                grow_to = min(grow_to, (r["budget"] + min(overs)) // 2)
            if grow_to <= r["budget"] + one:
                break
            bigger = _within(layers, grow_to)
            if bigger is None or _alloc_bytes(layers, bigger) <= r["budget"]:
                break
            if bigger not in fitting:
                fitting.append(bigger)
            k = fitting.index(bigger)
            if k in s.tried:
                break
        r = s.run(k)
    return min(
        s.tried.values(),
        key=lambda r: (not r["ok_size"], r["drop"], -(r["agreement"] or 0.0), r["sizes"]["weights_file"]),
    )


def _bisect(s: Search) -> dict:
    """Rule 7, a max drop: from :func:`_start_index`, a bisection in bytes (geometric) between
    the largest failing budget and the smallest passing one, each try the least costly
    allocation of its budget (:func:`_next_budget`); the smallest passing attempt, else the
    one nearest to passing."""
    assert s.max_drop is not None and s.base is not None
    k: int | None = _start_index(s.fitting, s.layers, s.base, s.ev, s.train, s.max_drop)
    while k is not None and len(s.tried) < s.config.attempts:
        s.run(k)
        k = _next_budget(s)
    passing = [r for r in s.tried.values() if r["ok"]]
    if passing:
        return min(passing, key=lambda r: (r["sizes"]["weights_file"], r["drop"]))
    return min(s.tried.values(), key=lambda r: (not r["ok_size"], r["drop"], r["sizes"]["weights_file"]))


def _next_budget(s: Search) -> int | None:
    """Rule 7: the next attempt's index in ``fitting``, or None when the search is done.

    The bounds are budgets (predicted bytes): ``ok`` the smallest that passed, ``fail`` the
    largest that failed below it (the smallest allocation when none has: the search goes on
    toward smaller after a pass); before any pass, ``fail`` the largest failure and ``ok`` the
    largest allocation that fits. The next budget is their geometric mean, tried as the least
    costly allocation within it (:func:`_within`, which reaches between the frontier's points:
    those are a convex hull, on LeNet-5 54 KB, 79 KB, 99 KB, 116 KB apart), until the two
    bounds are within :data:`REFINE_CLOSE` of each other or no allocation lies between them.
    Bisecting the frontier's indices instead spent LeNet-5's attempts above 99 KB: one failure
    there (the gate's noise: a few of 1,000 digits) stopped it at 116 KB."""
    layers, fitting = s.layers, s.fitting
    passing = [r["budget"] for r in s.tried.values() if r["ok"]]
    top = len(fitting) - 1
    if passing:
        ok = min(passing)
        below = [r["budget"] for r in s.tried.values() if not r["ok"] and r["budget"] < ok]
        if not below:  # nothing smaller failed yet: toward the smallest allocation
            smallest = _alloc_bytes(layers, fitting[0])
            if 0 in s.tried or smallest >= ok:
                return None
            fail = smallest
            if fail >= ok * (1 - REFINE_CLOSE):
                return 0
        else:
            fail = max(below)
    else:
        fail = max(r["budget"] for r in s.tried.values())
        ok = _alloc_bytes(layers, fitting[top])
        if top in s.tried or fail >= ok:
            return None
        if fail >= ok * (1 - REFINE_CLOSE):
            return top
    if fail >= ok * (1 - REFINE_CLOSE):
        return None
    alloc = _within(layers, int(round((ok * max(fail, 1)) ** 0.5)))
    if alloc is None or not fail < _alloc_bytes(layers, alloc) < ok:
        return None if passing else top  # nothing strictly between: before any pass, the largest
    if alloc not in fitting:
        fitting.append(alloc)
    k = fitting.index(alloc)
    return None if k in s.tried else k


def _report(s: Search, best: dict, t_start: float) -> BudgetResult:
    """The result of the best attempt with the split's notes; :class:`BudgetNotMet` when it
    missed the drop or the size."""
    c, split, max_drop, target = s.config, s.split, s.max_drop, s.config.target_size
    result = _result(
        best, s.layers, model_metric=s.ev.metric_name, baseline=s.baseline, max_drop=max_drop,
        target=target, split=split, est=s.est, seed=c.seed, tried=s.tried,
    )  # fmt: skip
    result.notes.append(
        f"{split['train']} samples for fine-tuning, {split['held_out']} validation samples (a file of their own) for the gate"
        if split["validation"]
        else f"{split['train']} samples for fine-tuning, {split['held_out']} held out for the gate (seed {c.seed})"
    )
    se = result.held_out_drop_se
    step = 1.0 / max(split["held_out"], 1)  # one sample's share of the drop
    if se is not None and max_drop is not None and max(se, step) > max_drop:
        why = (
            f"one sample moves the drop by {step:.4f}, and the held-out drop "
            f"{result.held_out_drop:+.4f} has a standard error of {se:.4f}"
        )
        result.notes.append(
            f"the gate's {split['held_out']} samples cannot tell a drop of {max_drop}: {why}; give "
            "more validation samples (--val-data) for a gate that can"
        )
    result.seconds = time.perf_counter() - t_start
    from mconv.engines.fast import engine_label

    result.engine = engine_label(c.engine, c.device)
    if not result.met:
        bound = best.get("drop_bound")
        gated = f" + {c.gate_se:g} se = {bound:.4f}" if bound is not None and c.gate_se and max_drop else ""
        raise BudgetNotMet(
            f"budget not met: held-out {s.ev.metric_name} drop {best['drop']:.4f}{gated} (max {max_drop}), "
            f"{c.target_of} {best['sizes'][c.measured]:,} B (target {target if target else '-'})",
            result,
            hint="allow a larger --max-drop or --target-size",
        )
    return result


def _start_index(fitting, layers, base, ev: _Evaluator, train, max_drop: float) -> int:
    """Rule 7: the smallest allocation whose drop before fine-tuning is at most
    max(10 * max_drop, 0.05) on (at most 512) training samples; bisection over the frontier."""
    from mconv.engines.reference.executor import Executor

    sample = train[:512]
    ex: Any = Executor(base)
    set_weight = ex.set_initializer
    if ev.engine == "xla":  # rule 11
        from mconv.engines.fast import xla_engine

        ex = xla_engine(base, [ev.output], ev.device, ev.memo, role="start")
        set_weight = ex.set_weight
    base_metric = ev.metric(ev.reference[sample], sample)
    limit = max(10 * max_drop, 0.05)
    cache: dict = {}

    def drop(k: int) -> float:
        for layer in layers:
            key = (layer.name, *fitting[k][layer.name])
            if key not in cache:  # rule 14: a cut channel zeroed (its bias stays: an estimate)
                cache[key] = simulated(layer, key[1:])
            set_weight(layer.tensor, cache[key])
        return base_metric - ev.metric(ev.outputs(ex, sample), sample)

    lo, hi = 0, len(fitting) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if drop(mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return lo
