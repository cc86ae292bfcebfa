"""soft-share: soft weight-sharing retraining (Ullrich, Meeds and Welling, ICLR 2017).

A Gaussian-mixture prior over the layers' weights is learned together with the weights: the
training loss is the task's (distillation from the original, or cross-entropy on labels) plus
``tau`` times the mixture's negative log density of every weight (and the precisions' gamma
hyper-priors), per training sample. One component sits at zero with a fixed, high mixing
weight, so most weights are pulled to zero (pruning); the other components' means move to where
the remaining weights gather and become the codebook (quantization). At the end each weight
takes its nearest component's mean (zero for the zero component), components whose
means are within ``merge`` of each other become one, and the tensor is recorded as pruned and
clustered: later ``finetune`` passes train its centroids, export stores it as a palette or
sparse tensor.

Rules
-----
1. Needs ``ctx.data`` (without it the pass changes nothing and says so). Loss ``auto``: with
   ``ctx.reference_model`` (the pipeline's snapshot, the budget search's original), T^2 KL
   distillation from it plus the top-1 margin hinge (``margin``), as ``finetune``; without one,
   cross-entropy on ``labels``.
2. The prior covers the weights of ``op_types`` layers (not biases, which train freely); a weight
   already clustered is left as it is (frozen), a pruned one keeps its zeros (masked) and its
   nonzeros join the prior.
3. The mixture: ``components`` nonzero components, means spread evenly over the weights' range
   (the paper's initialisation), zero component fixed at mean 0 with mixing weight ``pi_zero``;
   the others share ``1 - pi_zero`` through a learned softmax. Precisions are learned in log
   space with gamma hyper-priors (``gamma_zero`` for the zero component, ``gamma`` for the
   rest, each ``(alpha, beta)``), which keep a component from collapsing onto one weight.
4. ``tau`` grows linearly from 0 over the first ``ramp`` share of the steps (the task settles
   the weights' assignment before the prior collapses them on its components). Adam for
   everything, with separate rates: ``lr`` for the weights, ``lr_means``,
   ``lr_precisions``, ``lr_mixing`` (the paper's 5e-4, 1e-4, 3e-3, 3e-3); the rate of the
   weights decays on a cosine.
5. ``quantize = true`` (default) ends with the hard assignment above; ``false`` leaves the
   retrained float weights (a later ``prune``/``cluster`` then loses little: the weights already
   sit near the zero component and the means).
6. Seeded (``seed``, default the pipeline's); runs on the xla engine (jax), ``device`` cpu or cuda.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.edit.weights import (
    CLUSTER_KEY,
    WEIGHT_OPS,
    compression_info,
    record_compression,
    weight_refs,
)
from mconv.errors import InputError
from mconv.passes.base import MAX_COUNT, Pass, PassContext, PassReport, bounded, register_pass


@dataclass
class MixturePrior:
    """A Gaussian mixture over scalars with a zero component (index 0) of fixed mean and mixing."""

    means: np.ndarray  # [J], means[0] == 0
    log_precisions: np.ndarray  # [J]
    mixing: np.ndarray  # [J], sums to 1, mixing[0] == pi_zero

    def responsibilities(self, w: np.ndarray) -> np.ndarray:
        """``[n, J]`` posterior of each component for each value of ``w`` (flat)."""
        lam = np.exp(self.log_precisions)
        d = w.reshape(-1, 1).astype(np.float64) - self.means[None, :]
        logp = np.log(self.mixing)[None, :] + 0.5 * self.log_precisions[None, :] - 0.5 * lam[None, :] * d * d
        logp -= logp.max(axis=1, keepdims=True)
        p = np.exp(logp)
        return p / p.sum(axis=1, keepdims=True)

    def merged(self, merge: float) -> MixturePrior:
        """Components whose means are within ``merge`` of each other (or of zero, for the zero
        component) become one: mixing summed, mean and precision the mixing-weighted average."""
        order = np.argsort(self.means)
        groups: list[list[int]] = []
        for j in order:
            if groups and abs(self.means[j] - self.means[groups[-1][-1]]) < merge:
                groups[-1].append(int(j))
            else:
                groups.append([int(j)])
        zero_rows: list[tuple[float, float, float]] = []
        rows: list[tuple[float, float, float]] = []
        for g in groups:
            pi = self.mixing[g]
            total = float(pi.sum())
            mean = 0.0 if 0 in g else float(np.sum(pi * self.means[g]) / total)
            item = (mean, float(np.sum(pi * self.log_precisions[g]) / total), total)
            (zero_rows if 0 in g else rows).append(item)
        rows = zero_rows + rows
        return MixturePrior(
            np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
        )

    def quantize(self, w: np.ndarray) -> np.ndarray:
        """Each value to its nearest mean (0 for the zero component). Once the retraining has
        collapsed the weights onto the components, the nearest is the one whose basin holds the
        weight; the most responsible one is not: a narrow component's weights sit in its own
        local optimum of the prior while the broad, heavy zero component can out-weigh it there."""
        order = np.argsort(self.means)
        sorted_means = self.means[order]
        flat = w.reshape(-1).astype(np.float64)
        hi = (
            np.clip(np.searchsorted(sorted_means, flat), 1, len(sorted_means) - 1)
            if len(sorted_means) > 1
            else None
        )
        if hi is None:
            return np.full(w.shape, self.means[0], dtype=np.float32)
        lo = hi - 1
        pick = np.where(np.abs(flat - sorted_means[lo]) <= np.abs(flat - sorted_means[hi]), lo, hi)
        return sorted_means[pick].astype(np.float32).reshape(w.shape)


def initial_prior(
    weights: list[np.ndarray], components: int, pi_zero: float, std: float, sparsity: float = 0.0
) -> MixturePrior:
    """Rule 3: the zero component first; ``components`` means spread evenly over the weights'
    range outside ``t``, the ``sparsity`` quantile of their magnitudes (the range's negative and
    positive sides sharing them by length), so that the zero component starts out holding that
    share of the weights (its standard deviation ``t / 2``, at least ``std``); every other
    precision ``1 / std**2``, their mixing equal."""
    flat = np.concatenate([w.reshape(-1) for w in weights]) if weights else np.zeros(1)
    flat = flat[flat != 0] if np.any(flat != 0) else flat
    lo, hi = float(min(flat.min(), 0.0)), float(max(flat.max(), 0.0))
    t = float(np.quantile(np.abs(flat), sparsity)) if sparsity > 0 else 0.0
    neg, pos = max(-t - lo, 0.0), max(hi - t, 0.0)
    k_neg = int(round(components * neg / max(neg + pos, 1e-30)))
    k_neg = min(max(k_neg, 1 if neg > 0 and components > 1 else 0), components)
    k_pos = components - k_neg
    grid_neg = np.linspace(lo, -t, k_neg + 1)[:-1] if k_neg else np.zeros(0)
    grid_pos = np.linspace(t, hi, k_pos + 1)[1:] if k_pos else np.zeros(0)
    grid = np.concatenate([grid_neg, grid_pos])
    means = np.concatenate([[0.0], grid[np.abs(grid) > 1e-8]])
    logl = np.full(len(means), np.log(1.0 / std**2))
    logl[0] = np.log(1.0 / max(t / 2, std) ** 2)
    rest = np.full(len(means) - 1, (1.0 - pi_zero) / max(len(means) - 1, 1))
    return MixturePrior(means, logl, np.concatenate([[pi_zero], rest]))


def mixture_nll(w: Any, means: Any, log_precisions: Any, log_mixing: Any) -> Any:
    """``-sum log p(w)`` under the mixture (jnp): a stable log-sum-exp over components."""
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    d = w.reshape(-1, 1) - means[None, :]
    lam = jnp.exp(log_precisions)
    logp = log_mixing[None, :] + 0.5 * log_precisions[None, :] - 0.5 * np.log(2 * np.pi) - 0.5 * lam * d * d
    return -jnp.sum(logsumexp(logp, axis=1))


def gamma_nll(log_precisions: Any, alpha: Any, beta: Any) -> Any:
    """``-sum log Gamma(lambda; alpha, beta)`` over the precisions, up to a constant (jnp)."""
    import jax.numpy as jnp

    lam = jnp.exp(log_precisions)
    return -jnp.sum((alpha - 1.0) * log_precisions - beta * lam)


@register_pass("soft-share")
class SoftShare(Pass):
    """Soft weight-sharing retraining: see the module's rules."""

    lossless = False
    uses_reference_model = True

    @dataclass
    class Config:
        components: int = bounded(15, 1, 255)
        tau: float = bounded(5e-3, 0, None)
        epochs: int = bounded(10, 0, 10**5)
        batch_size: int = bounded(64, 1, MAX_COUNT)
        lr: float = bounded(2e-3, 0, None, lo_open=True)
        lr_means: float = bounded(5e-4, 0, None)
        lr_precisions: float = bounded(1e-2, 0, None)
        lr_mixing: float = bounded(3e-3, 0, None)
        pi_zero: float = bounded(0.99, 0, 1, lo_open=True, hi_open=True)
        init_std: float = bounded(0.02, 0, None, lo_open=True)
        sparsity: float = bounded(0.9, 0, 1, hi_open=True)
        gamma: list[float] = field(default_factory=lambda: [250.0, 0.1])
        gamma_zero: list[float] = field(default_factory=lambda: [5000.0, 2.0])
        merge: float = bounded(1e-3, 0, None)
        ramp: float = bounded(0.5, 0, 1)
        quantize: bool = True
        temperature: float = bounded(2.0, 0, None, lo_open=True)
        margin: float = bounded(0.3, 0, None)
        loss: str = "auto"  # auto | kl | xent
        seed: int | None = bounded(None, 0, 2**63 - 1)
        device: str = "cpu"
        op_types: list[str] = field(default_factory=lambda: list(WEIGHT_OPS))

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        if ctx.data is None:
            return self.report(False, notes=["skipped: no data (give --data to retrain with the prior)"])
        if config.loss not in ("auto", "kl", "xent") or config.device not in ("cpu", "cuda"):
            raise InputError(
                f"loss {config.loss!r}, device {config.device!r}",
                where="pass soft-share",
                hint="loss auto, kl or xent; device cpu or cuda",
            )
        for key in ("gamma", "gamma_zero"):
            g = getattr(config, key)
            if len(g) != 2 or not all(float(x) > 0 for x in g):
                raise InputError(f"{key}={g!r}", where="pass soft-share", hint="[alpha, beta], both positive")
        out = soft_share(model, ctx.data, config, reference=ctx.reference_model, seed=ctx.seed, ctx=ctx)
        notes = [
            f"{out['tensors_count']} tensors under the prior; {out['components']} components "
            f"after merging; {100 * out['kept']:.2f}% of their weights nonzero",
            f"loss {out['loss']}: {out['first_loss']:.4f} -> {out['last_loss']:.4f} in {out['seconds']:.1f} s",
        ]
        return self.report(bool(out["tensors"]), notes=notes, tensors=out["tensors"])


SoftShareConfig = SoftShare.Config


def soft_share(
    model: ir.Model,
    data: dict[str, np.ndarray],
    config: SoftShareConfig,
    *,
    reference: ir.Model | None = None,
    seed: int = 0,
    ctx: PassContext | None = None,
) -> dict[str, Any]:
    """Rules 1-6 on ``model`` (mutated); the report's facts."""
    import jax
    import jax.numpy as jnp
    from mconv.engines.xla.engine import XlaEngine, loss_value
    from mconv.engines.xla.jit import jit
    from mconv.passes.finetune import _training_data, trainable_values

    t0 = time.perf_counter()
    feeds, labels, _out, read = _training_data(model, data)
    n = len(next(iter(feeds.values())))
    kind = config.loss
    if kind == "auto":
        kind = "kl" if reference is not None else "xent"
    if kind == "xent" and labels is None:
        raise InputError(
            "soft-share without a reference model needs 'labels' in the data", where="pass soft-share"
        )
    if kind == "kl" and reference is None:
        raise InputError("loss 'kl' needs the original model", where="pass soft-share")
    facts = compression_info(model)
    refs = [
        r
        for r in weight_refs(model, tuple(config.op_types))
        if CLUSTER_KEY not in r.value.metadata_props and facts.get(r.name, {}).get("bits") is None
    ]
    prior_names = [r.name for r in refs]
    free = [v.name for v in trainable_values(model) if v.name and v.name not in prior_names]
    if not refs:
        return {"tensors": [], "tensors_count": 0, "components": 0, "kept": 1.0, "loss": kind,
                "first_loss": 0.0, "last_loss": 0.0, "seconds": 0.0}  # fmt: skip
    masks = {r.name: (r.array() != 0) for r in refs if facts.get(r.name, {}).get("pruned")}
    engine = XlaEngine(model, [read], device=config.device)
    engine.check_trainable(prior_names + free)
    if kind == "kl":
        assert reference is not None
        teacher_engine = XlaEngine(reference, [_read_of(reference)], device=config.device)
        target_all = np.concatenate(
            [
                teacher_engine.run({k: v[i : i + 256] for k, v in feeds.items()})[_read_of(reference)]
                for i in range(0, n, 256)
            ]
        ).astype(np.float32)
    else:
        assert labels is not None
        target_all = labels.astype(np.int32)

    def layer_config(name: str) -> Any:
        ref = next(r for r in refs if r.name == name)
        return ctx.config_for(ref.node) if ctx is not None and ctx.spec is not None else config

    priors = {
        r.name: initial_prior(
            [r.array()], int(layer_config(r.name).components), config.pi_zero, config.init_std,
            float(layer_config(r.name).sparsity),
        )
        for r in refs
    }  # fmt: skip
    dev = engine.device
    trained = {name: engine.weights[name] for name in prior_names + free}
    gmm = {}
    for name, prior in priors.items():
        mix_free = np.log(prior.mixing[1:] / prior.mixing[1:].sum()) if len(prior.means) > 1 else np.zeros(0)
        gmm[name] = {
            "means": jnp.asarray(prior.means[1:], jnp.float32),
            "logl": jnp.asarray(prior.log_precisions, jnp.float32),
            "mix": jnp.asarray(mix_free, jnp.float32),
        }
    gmm = jax.device_put(gmm, dev)
    mask_arrays = jax.device_put({k: jnp.asarray(m) for k, m in masks.items()}, dev)
    frozen = {k: w for k, w in engine.weights.items() if k not in trained}
    dtypes = {k: engine.weights[k].dtype for k in trained}
    pi0 = float(config.pi_zero)
    a_rest, b_rest = (float(x) for x in config.gamma)
    a_zero, b_zero = (float(x) for x in config.gamma_zero)
    scale = float(config.tau) / max(n, 1)

    def full_gmm(g: dict) -> tuple[Any, Any, Any]:
        means = jnp.concatenate([jnp.zeros((1,), jnp.float32), g["means"]])
        log_mix = jnp.concatenate(
            [jnp.full((1,), np.log(pi0), jnp.float32), np.log(1.0 - pi0) + jax.nn.log_softmax(g["mix"])]
        )
        return means, g["logl"], log_mix

    def objective(
        params: dict, g: dict, frozen: dict, inputs: tuple, target: Any, ramp: Any
    ) -> tuple[Any, Any]:
        weights = dict(frozen)
        for k, a in params.items():
            if k in mask_arrays:
                a = jnp.where(mask_arrays[k], a, jnp.zeros_like(a))
            weights[k] = a.astype(dtypes[k])
        s = engine._call(inputs, weights)[0]
        task = loss_value(s, target, kind, config.temperature, config.margin if kind == "kl" else 0.0)
        complexity = 0.0
        for k in prior_names:
            w = params[k].astype(jnp.float32)
            if k in mask_arrays:  # a pruned weight's zeros are not the prior's to place
                w = w[np.asarray(masks[k])]
            means, logl, log_mix = full_gmm(g[k])
            complexity = complexity + mixture_nll(w, means, logl, log_mix)
            complexity = (
                complexity + gamma_nll(logl[:1], a_zero, b_zero) + gamma_nll(logl[1:], a_rest, b_rest)
            )
        return task + ramp * scale * complexity, task

    rates = {
        "means": float(config.lr_means),
        "logl": float(config.lr_precisions),
        "mix": float(config.lr_mixing),
    }

    def adam(p: Any, g: Any, m: Any, v: Any, lr: Any, t: Any) -> tuple[Any, Any, Any]:
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        p = p - lr * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8)
        return p, m, v

    def step(
        params: dict,
        g: dict,
        state: dict,
        frozen: dict,
        inputs: tuple,
        target: Any,
        lr: Any,
        t: Any,
        ramp: Any,
    ):
        (value, task), (gp, gg) = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
            params, g, frozen, inputs, target, ramp
        )
        new_p: dict = {}
        new_g: dict = {}
        new_state: dict = {}
        for k in params:
            m0, v0 = state[k]
            new_p[k], m, v = adam(params[k], gp[k], m0, v0, lr, t)
            new_state[k] = (m, v)
        for layer in g:
            new_g[layer] = {}
            for k in g[layer]:
                key = f"gmm:{layer}:{k}"
                m0, v0 = state[key]
                new_g[layer][k], m, v = adam(g[layer][k], gg[layer][k], m0, v0, rates[k], t)
                new_state[key] = (m, v)
        return value, task, new_p, new_g, new_state

    step_fn = jit(step, donate_argnums=(0, 1, 2))
    zeros = {
        k: (jnp.zeros_like(a, dtype=jnp.float32), jnp.zeros_like(a, dtype=jnp.float32))
        for k, a in trained.items()
    }
    for layer, parts in gmm.items():
        for k, a in parts.items():
            zeros[f"gmm:{layer}:{k}"] = (jnp.zeros_like(a), jnp.zeros_like(a))
    state = jax.device_put(zeros, dev)
    params = {k: jnp.asarray(a, jnp.float32) for k, a in trained.items()}
    rng = np.random.default_rng([seed if config.seed is None else int(config.seed), 0x5507])
    batch = min(int(config.batch_size), n)
    steps_per_epoch = max(n // batch, 1)
    total = max(int(config.epochs) * steps_per_epoch, 1)
    first = last = 0.0
    t = 0
    for epoch in range(int(config.epochs)):
        order = rng.permutation(n)
        losses = []
        for b in range(steps_per_epoch):
            idx = order[b * batch : (b + 1) * batch]
            t += 1
            lr = 0.5 * float(config.lr) * (1.0 + np.cos(np.pi * (t - 1) / total))
            inputs = engine._inputs({k: v[idx] for k, v in feeds.items()})
            ramp = min(1.0, t / max(float(config.ramp) * total, 1.0)) if config.ramp > 0 else 1.0
            value, task, params, gmm, state = step_fn(
                params,
                gmm,
                state,
                frozen,
                inputs,
                target_all[idx],
                np.float32(lr),
                np.float32(t),
                np.float32(ramp),
            )
            losses.append(float(task))
        if epoch == 0:
            first = float(np.mean(losses))
        last = float(np.mean(losses))
        if ctx is not None:
            ctx.tick(
                f"soft-share epoch {epoch + 1}/{config.epochs}: task loss {last:.4f}",
                epoch + 1,
                config.epochs,
            )
    final: dict[str, MixturePrior] = {}
    for layer, parts in gmm.items():
        means_all, logl_all, log_mix_all = (np.asarray(a, np.float64) for a in full_gmm(parts))
        learned = MixturePrior(means_all, logl_all, np.exp(log_mix_all))
        final[layer] = learned.merged(float(config.merge)) if config.merge > 0 else learned
    out_tensors = []
    kept_n = total_n = 0
    inits = model.graph.initializers
    for k, a in params.items():
        w = np.asarray(a, np.float32)
        if k in masks:
            w = np.where(masks[k], w, 0.0).astype(np.float32)
        if k in prior_names:
            ref = next(r for r in refs if r.name == k)
            if config.quantize:
                w = final[k].quantize(w)
                if k in masks:
                    w = np.where(masks[k], w, 0.0).astype(np.float32)
            w = w.astype(ref.array().dtype)
            ref.set_array(w)
            kept = float(np.count_nonzero(w)) / max(w.size, 1)
            kept_n += int(np.count_nonzero(w))
            total_n += int(w.size)
            distinct = int(np.unique(w[w != 0]).size)
            if config.quantize:
                bits = max(1, int(np.ceil(np.log2(distinct + 1))))
                record_compression(model, ref.value, pruned=True, kept=round(kept, 6), bits=bits, init="gmm")
            out_tensors.append({"name": k, "node": ref.node.name, "op": ref.node.op_type,
                                "shape": list(w.shape), "kept": kept, "distinct": distinct,
                                "components": int(len(final[k].means))})  # fmt: skip
        else:
            value = inits[k]
            old = value.const_value
            assert old is not None
            value.const_value = ir.tensor(w.astype(old.numpy().dtype), name=k)
    return {
        "tensors": out_tensors,
        "tensors_count": len(out_tensors),
        "components": max((len(p.means) for p in final.values()), default=0),
        "kept": kept_n / max(total_n, 1),
        "loss": kind,
        "first_loss": first,
        "last_loss": last,
        "seconds": time.perf_counter() - t0,
        "priors": final,
    }


def _read_of(model: ir.Model) -> str:
    from mconv.passes.finetune import _score_output

    return _score_output(model)[1]
