"""Rule 6's pre-training with a mixture prior (soft weight-sharing) instead of L2 decay.

With ``prior = "gmm"`` (``--prior gmm``) the search's one pre-training stage is the
``soft-share`` pass (Ullrich et al. 2017) with ``quantize = false``: the weights retrain under a
learned Gaussian-mixture prior whose zero component holds most of them, so they gather on zero
and on a few means. Every later step of the search is unchanged, and each gains from it: the
Fisher costs of magnitude pruning (the near-zero weights) and of k-means clustering (weights
already near the means) are small, so the allocation buys far higher sparsities and fewer bits
for the same estimated loss, and the masked retraining and centroid fine-tuning start closer to
where they end. The sparsities the layers may take then reach :data:`PRIOR_SPARSITIES` (a prior
with ``pi_zero`` 0.99 leaves about 1% of the weights off zero). Rolled back, as the L2 stage is,
when the held-out metric gets worse by more than the change's standard error; the widened
options then go too (on the original weights they let the allocation price 99.5% sparsity and 2
bits as nearly free: LeNet-5 lost 34 points that way).
"""

from __future__ import annotations

import time

import onnx_ir as ir
from mconv.drivers.budget import evaluation as E
from mconv.drivers.budget.attempt import Search
from mconv.drivers.budget.evaluation import _restore, _weights_state
from mconv.drivers.budget.schedule import _prefix
from mconv.passes.base import PassContext, PassSpec
from mconv.passes.pipeline import make_spec

# The sparsities and bit widths a layer may take after the mixture prior (added to the
# configured ones): a prior whose zero component holds most weights and whose few other
# components hold the rest leaves layers that prune past 97% and code in 2 bits.
PRIOR_SPARSITIES = (0.98, 0.99, 0.995)
PRIOR_BITS = (2,)


# The soft-share settings of the pre-training stage (the pass's defaults otherwise); epochs are
# this many times the search's stage epochs (the prior needs long to gather the weights).
PRIOR_EPOCH_FACTOR = 4
PRIOR_TAU = 0.05


def prior_spec(epochs: int, seed: int, device: str, tau: float = PRIOR_TAU) -> PassSpec:
    """The soft-share stage the search runs (and its saved recipe records)."""
    return make_spec(
        "soft-share",
        {"epochs": int(epochs), "seed": int(seed), "device": device, "tau": float(tau), "quantize": False},
    )


def pretrain_with_prior(s: Search, model: ir.Model) -> None:
    """The module's stage on ``model`` (mutated), recorded in ``s.pre`` and ``s.pre_stages``."""
    c = s.config
    spec = prior_spec(max(s.epochs * PRIOR_EPOCH_FACTOR, 1), c.seed, c.device)
    state = _weights_state(model)
    pctx = PassContext(data=s.data, reference_model=s.reference, seed=c.seed, memo=s.memo)
    pctx.progress = _prefix(s.say, "mixture-prior pre-training")
    t0 = time.perf_counter()
    E._run_specs(model, [spec], pctx)
    got = s.ev.outputs(model, s.held)
    m = s.ev.metric(got, s.held)
    rolled = s.ev.worse(s.ev.reference[s.held], got, s.held)
    if rolled:  # the weights are the original's again: the widened options are not for them
        _restore(model, state)
        s.memo[_MEMO_KEY] = False
    else:
        s.pre = [*s.pre, spec]
        s.start_metric = m
    s.pre_stages.append(
        {
            "stage": "mixture-prior pre-training",
            "metric_before": s.baseline,
            "metric_after": m,
            "rolled_back": rolled,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )


def widened(sparsities: tuple[float, ...]) -> tuple[float, ...]:
    """The configured sparsities with :data:`PRIOR_SPARSITIES`."""
    return tuple(sorted({*sparsities, *PRIOR_SPARSITIES}))


# ``prior = "auto"`` takes the mixture prior when the target asks for more than this ratio of
# the layers' float32 bytes: L2 pre-training and magnitude pruning reach Deep Compression's
# figures (about 40x on LeNet-5), the prior is what goes past them.
AUTO_RATIO = 50.0


_MEMO_KEY = "budget.prior"


def uses_prior(s: Search, model: ir.Model) -> bool:
    """Whether the search pre-trains with the mixture prior (recorded in ``s.memo`` for
    :func:`sparsities_for`): ``prior = "gmm"``; with ``"auto"``, when a target size is set and
    the layers' float32 bytes are over :data:`AUTO_RATIO` times it."""
    from mconv.edit.weights import weight_refs

    c = s.config
    if c.prior == "auto":
        layer_bytes = sum(4 * int(r.array().size) for r in weight_refs(model))
        on = c.target_size is not None and layer_bytes > AUTO_RATIO * c.target_size
    else:
        on = c.prior == "gmm"
    s.memo[_MEMO_KEY] = on
    return on


def bits_for(s: Search) -> tuple[int, ...]:
    """The bit widths the layers may take: the configured ones, widened after the prior."""
    base = tuple(s.config.bits)
    return tuple(sorted({*base, *PRIOR_BITS}, reverse=True)) if s.memo.get(_MEMO_KEY) else base


def sparsities_for(s: Search) -> tuple[float, ...]:
    """The sparsities the layers may take: the configured ones, widened after the prior."""
    base = tuple(s.config.sparsities)
    return widened(base) if s.memo.get(_MEMO_KEY) else base
