"""Rules 5 and 7: allocations of sparsity and bits to layers (the frontier, fitting a byte budget)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.drivers.budget.config import PRUNE_RECOVERY
from mconv.drivers.budget.evaluation import _Evaluator
from mconv.drivers.budget.sensitivity import _compressed, _fisher, _Layer, _stored_bytes


def _frontier(layers: list[_Layer]) -> list[dict[str, tuple[float, int | None]]]:
    """Allocations minimising bytes + lam * cost for lam over a log grid (rule 5), smallest
    first, distinct; the last one is the original (lam large)."""
    out, seen = [], set()
    costs = [c for layer in layers for _, c in layer.options.values() if c > 0]
    lo = 1e-3 / max(max(costs, default=1.0), 1e-300)
    for lam in [0.0, *np.geomspace(lo, lo * 1e14, 240)]:
        alloc = {}
        for layer in layers:
            alloc[layer.name] = min(
                layer.options, key=lambda k: (layer.options[k][0] + lam * layer.options[k][1], -k[0])
            )
        key = tuple(sorted(alloc.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            out.append(alloc)
    if all((0.0, None) in layer.options for layer in layers):
        out.append({layer.name: (0.0, None) for layer in layers})
    uniq, keys = [], set()
    for a in out:
        k = tuple(sorted(a.items()))
        if k not in keys:
            keys.add(k)
            uniq.append(a)
    uniq.sort(key=lambda a: _alloc_bytes(layers, a))
    return uniq


def _within(
    layers: list[_Layer], budget: int, quanta: int = 4096
) -> dict[str, tuple[float, int | None]] | None:
    """The least costly allocation whose bytes are at most ``budget`` (rule 5), by dynamic
    programming over the layers (a multiple-choice knapsack) with bytes counted in quanta of
    ``ceil(budget / quanta)`` rounded up, so the answer always fits; between the frontier's
    points (the convex hull of each layer's options) this finds the allocations a Lagrangian
    sweep cannot reach. None when nothing fits.

    An option's bytes may be negative (a structured option of rule 14 counted as its own less
    what the cut saves downstream): each layer's bytes are counted from its smallest option (an
    offset, at most 0) and the budget raised by the offsets' total, so the table indexes no
    negative bytes and an allocation that fits the raised budget fits ``budget``."""
    offsets = [min(0, *(int(nbytes) for nbytes, _ in layer.options.values())) for layer in layers]
    room = budget - sum(offsets)
    if budget <= 0 or room <= 0 or not layers:
        return None
    q = -(-room // quanta)
    cap = room // q
    inf = np.inf
    best = np.full(cap + 1, inf)
    best[0] = 0.0
    picks = []
    for layer, offset in zip(layers, offsets):
        new = np.full(cap + 1, inf)
        pick = np.full(cap + 1, -1, np.int64)
        keys = sorted(layer.options, key=lambda k: (k[0], -1 if k[1] is None else k[1], *k[2:]))
        for i, key in enumerate(keys):
            nbytes, cost = layer.options[key]
            u = -(-(int(nbytes) - offset) // q)
            if u > cap:
                continue
            cand = np.full(cap + 1, inf)
            cand[u:] = best[: cap + 1 - u] + cost
            better = cand < new
            new[better] = cand[better]
            pick[better] = i
        picks.append((keys, pick))
        best = new
    if not np.isfinite(best).any():
        return None
    at = int(np.argmin(best))  # the least cost; on a tie the fewest quanta
    alloc: dict[str, tuple[float, int | None]] = {}
    for layer, offset, (keys, pick) in zip(reversed(layers), reversed(offsets), reversed(picks)):
        key = keys[int(pick[at])]
        alloc[layer.name] = key
        at -= -(-(int(layer.options[key][0]) - offset) // q)
    return {layer.name: alloc[layer.name] for layer in layers}


def _alloc_bytes(layers: list[_Layer], alloc: Mapping) -> int:
    return sum(layer.options[alloc[layer.name]][0] for layer in layers)


def _widest(layers: list[_Layer]) -> dict[str, tuple[float, int | None]]:
    """Every layer pruned and clustered: its schedule has every stage's slot (rule 6)."""
    out: dict[str, tuple[float, int | None]] = {}
    for layer in layers:
        plain = [k for k in layer.options if len(k) == 2]  # rule 14's cuts have stages of their own
        s = max(k[0] for k in plain)
        b = min((k[1] for k in plain if k[1] is not None), default=None)
        out[layer.name] = (s, b)
    return out


def _reallocate(
    model: ir.Model,
    ev: _Evaluator,
    train: np.ndarray,
    layers: list[_Layer],
    budget: int,
    *,
    bits_only: bool,
    plans: dict | None = None,
) -> tuple[dict[str, tuple[float, int | None]], int]:
    """Rule 6: the allocation for ``budget`` bytes decided again on ``model`` as the last
    retraining left it. The diagonal Fisher is measured on the current weights; an option's
    cost is that of pruning the current weights to its sparsity (a sparsity below what a layer
    already has costs nothing: its zeros stay), plus the clustering increment the first
    estimate measured at that sparsity (``bits_only``: at the sparsity each layer has now, the
    bit widths alone, each clustered, costed and coded on the current weights: retraining
    leaves weights whose clustered indices code to fewer bytes than the first estimate's).
    Otherwise bytes are the first estimate's (they follow the count kept and the bits). Then
    the least costly allocation within ``budget`` (the frontier's and :func:`_within`'s; the
    frontier's smallest when none fits), and its bytes. With ``plans`` (a dict, rule 13) the
    bit widths are also tried as entropy-constrained clustering and ``plans`` gets each
    option's choice."""
    fresh = _recosted(model, ev, train, layers, bits_only=bits_only, plans=plans)
    frontier = _frontier(fresh)
    fits = [a for a in frontier if _alloc_bytes(fresh, a) <= budget] or frontier[:1]
    packed = _within(fresh, budget)
    if packed is not None:
        fits.append(packed)
    chosen = min(fits, key=lambda a: (_alloc_cost(fresh, a), _alloc_bytes(fresh, a)))
    return dict(chosen), _alloc_bytes(fresh, chosen)


def _alloc_table(alloc: Mapping) -> dict[str, dict]:
    """An allocation as the report lists it: per layer its sparsity and bits (and the fraction
    of output channels a structured option removes, rule 14)."""
    out: dict[str, dict] = {}
    for n, key in sorted(alloc.items()):
        out[n] = {"sparsity": key[0], "bits": key[1]}
        if len(key) > 2 and key[2]:
            out[n]["structured"] = key[2]
    return out


def _alloc_cost(layers: list[_Layer], alloc: Mapping) -> float:
    return sum(layer.options[alloc[layer.name]][1] for layer in layers)


def _recosted(
    model: ir.Model,
    ev: _Evaluator,
    train: np.ndarray,
    layers: list[_Layer],
    *,
    bits_only: bool,
    plans: dict | None = None,
) -> list[_Layer]:
    """The layers' options costed again on ``model``'s current weights (see :func:`_reallocate`)."""
    fisher = _fisher(model, ev, train[:256], [layer.tensor for layer in layers])
    inits = model.graph.initializers
    fresh = []
    for layer in layers:
        value = inits[layer.tensor].const_value
        assert value is not None  # a layer's weight is an initializer with a value
        w = np.asarray(value.numpy())
        zeros = 1.0 - np.count_nonzero(w) / max(w.size, 1)
        floor = max((k[0] for k in layer.options if len(k) == 2 and k[0] <= zeros + 1e-6), default=0.0)
        f = fisher[layer.tensor]
        pruned: dict[float, tuple[np.ndarray, float]] = {}
        new = _Layer(layer.name, layer.op_type, layer.tensor, layer.params, w)
        scale = {} if bits_only else _byte_scale(layer, w, zeros)
        for s, b in [k for k in layer.options if len(k) == 2]:  # rule 14: the graph is cut by now
            se = max(s, floor)
            if (bits_only and s != floor) or (se, b) not in layer.options:
                continue
            if se not in pruned:
                a = _compressed(w, se, None) if se > 0 else w
                pruned[se] = (
                    a,
                    PRUNE_RECOVERY * 0.5 * float(np.sum(f * np.square(a.astype(np.float64) - w))),
                )
            a, cost = pruned[se]
            nbytes = layer.options[(se, b)][0]
            if bits_only and b is not None:
                c = _compressed(a, 0.0, b)
                cost = 0.5 * float(np.sum(f * np.square(c.astype(np.float64) - w)))
                nbytes = _stored_bytes(c, se, b)  # what the retrained weights code to (entropy)
                if plans is not None:
                    nbytes, cost, plan = _entropy_choice(a, w, f, se, b, nbytes, cost)
                    plans[(layer.name, s, b)] = plan
            else:
                nbytes = int(round(nbytes * scale.get(b, 1.0)))
                if b is not None:
                    cost += max(layer.options[(se, b)][1] - layer.options[(se, None)][1], 0.0)
            new.options[(s, b)] = (nbytes, cost)
        fresh.append(new)
    return fresh


ENTROPY_LAMS = (0.0003, 0.001, 0.003, 0.01, 0.03)  # rule 13: ECSQ's lam, unitless (cluster rule 10)


def _entropy_choice(
    a: np.ndarray, w: np.ndarray, f: np.ndarray, sparsity: float, bits: int, nbytes: int, cost: float
) -> tuple[int, float, dict]:
    """Rule 13: the clustering of ``a`` (the pruned current weights ``w``, diagonal Fisher ``f``)
    that an option of ``bits`` bits runs: plain k-means at ``bits`` (``nbytes``, ``cost``) or
    entropy-constrained clustering with at most ``bits`` or ``bits + 1`` bits of codes and a lam
    of :data:`ENTROPY_LAMS`, whichever has the least Fisher-weighted error among those whose
    indices export codes to no more bytes than k-means' (so the option's bytes never grow and
    its effective bits, the coded bytes, are fractional). Returns bytes, cost and the cluster
    pass's settings."""
    from mconv.passes.cluster import cluster_array

    best: tuple[float, int, dict[str, Any]] = (cost, nbytes, {"bits": bits})
    for cap in sorted({bits, min(bits + 1, 8)}):
        for lam in ENTROPY_LAMS:
            c = cluster_array(a, cap, "linear", lam=lam)
            got = _stored_bytes(c, sparsity, cap)
            if got > nbytes:
                continue
            err = 0.5 * float(np.sum(f * np.square(c.astype(np.float64) - w)))
            if (err, got) < best[:2]:
                best = (err, got, {"bits": cap, "method": "entropy", "lam": lam})
    return best[1], best[0], best[2]


def _byte_scale(layer: _Layer, w: np.ndarray, zeros: float) -> dict[int | None, float]:
    """Per bit width, what the current weights ``w`` (``zeros`` of them zero) code to over
    what the first estimate predicted at that sparsity (interpolated between its options):
    retrained weights code to fewer bytes than the first estimate's, and a reallocation of
    the sparsities spends the difference."""
    out: dict[int | None, float] = {}
    plain = [k for k in layer.options if len(k) == 2]
    for b in sorted({k[1] for k in plain}, key=lambda x: -1 if x is None else x):
        levels = sorted(s for s, bb in plain if bb == b)
        lo = max((s for s in levels if s <= zeros + 1e-9), default=levels[0])
        hi = min((s for s in levels if s >= zeros - 1e-9), default=levels[-1])
        first_lo, first_hi = layer.options[(lo, b)][0], layer.options[(hi, b)][0]
        t = 0.0 if hi <= lo else (zeros - lo) / (hi - lo)
        first = (1.0 - t) * first_lo + t * first_hi
        exact = _stored_bytes(_compressed(w, 0.0, b) if b is not None else w, zeros, b)
        if first > 0:
            out[b] = exact / first
    return out
