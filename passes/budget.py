"""Deep Compression under a budget: per-layer sparsity and bits chosen from sensitivity, the
paper's schedule, a held-out gate and back-off (issue 14).

:func:`compress_to_budget` is the library call behind ``mconv optimize MODEL --recipe
deep-compression --data D.npz --max-drop F [--target-size SIZE] [--save-recipe FILE.toml]``.

Rules
-----
1. **Split.** The samples are split once, seeded (``seed``): a fraction ``holdout`` (default
   0.25) is held out and never trained on; fine-tuning sees only the rest. The split is the
   ``finetune`` pass's own (``holdout``/``seed`` options), so the saved recipe splits the same
   way. The report names both counts. With ``val_data`` (``--val-data``: a validation set of
   its own, e.g. when ``data`` is the set the model was trained on, where the original is
   right on nearly every sample and a held-out slice of it overstates every loss), nothing is
   split: fine-tuning sees all of ``data`` (its passes' ``holdout`` is 0, so the saved recipe
   rebuilds the model from ``data`` alone) and the gate measures ``val_data``. Both have
   ``labels`` or neither.
2. **Metric.** With ``labels`` in the data, top-1 accuracy; without, top-1 agreement with the
   original model's class scores; cosine similarity for outputs that are not class scores (as
   ``mconv analyze``). ``drop = baseline - metric`` on the held-out samples (0.005 = half a
   point).
3. **Sensitivity.** Per layer (weights of Conv/ConvTranspose/Gemm/MatMul with a node name) and
   per candidate setting (sparsity in :data:`SPARSITIES`, bits in :data:`BITS`), the cost of
   the setting is estimated in nats of loss:
   - ``fisher`` (default): the diagonal empirical Fisher ``F`` of the cross-entropy (labels, or
     the original's top-1 class), from batch gradients of the reference executor over at most
     256 training samples, and ``cost = 0.5 * sum(F * (w - w')**2)`` (an OBD / Taylor estimate);
   - ``sweep``: the measured mean KL divergence between the original's outputs and the outputs
     with that one layer compressed (``analyze``'s one-layer-at-a-time sweep, continuous).
   :func:`compare_estimators` puts both against the measured one-layer drop. Either way the
   share of an option's cost that comes from the weights it prunes counts
   :data:`PRUNE_RECOVERY` (0.1) times, its clustering cost in full: masked retraining has every
   kept weight free and wins back nearly all of a pruning loss, centroid fine-tuning only the
   codebook. On the depthwise CNN at 20x, seed 0, masked retraining won back about 250 times
   what a prune step lost, centroid fine-tuning about 15 times what clustering lost
   (bench/RESULTS.md, stop 28); counted alike, the extra bytes of a 17% larger target went to
   sparsity and bought nothing, weighted those of an 8% larger one went to bits and halved the
   KL to the original (at 20x itself the two came out alike).
4. **Bytes.** Each candidate's bytes are what export would store for it: the tensor pruned and
   clustered as the passes do, then :func:`mconv.codecs.choose.best_spec` (sparse relative
   indices, palettes, Huffman), with its values rounded to float16 as the schedule's last
   stage rounds them (a palette's codebook is stored as float16: counting it in float32 put
   16 B too many on every layer).
5. **Global allocation.** For a trade-off ``lam``, each layer takes the setting minimising
   ``bytes + lam * cost``; sweeping ``lam`` gives the frontier of allocations, from the smallest
   to the original. Bytes go where they buy the most metric per byte, across layers. The
   frontier holds only the convex hull's points; for a byte budget (``target_size``, and each
   reallocation of rule 6) the least costly allocation within it is also found exactly, by a
   knapsack over the layers' options (:func:`_within`: bytes in 4,096 quanta of the budget,
   rounded up), which reaches the allocations between the hull's points (P2 at 34.5 KB: the
   hull's best fit used 25 KB of it).
6. **Schedule** (the paper's). Once, before the sensitivities: L2 pre-training (a fine-tuning
   stage with weight decay :data:`DECAY`, so weights the task does not use shrink and magnitude
   pruning takes them first; rolled back if it costs held-out metric). Then per attempt from
   that model: prune in steps (:data:`PRUNE_STEPS`, exponents of the kept fraction: each step
   removes the same share of what is left) with masked retraining after each (the last one
   :data:`FINAL_RETRAIN` times as long); cluster (k-means, linear init) the biases
   (:data:`BIAS_BITS`, rolled back if it costs metric), then the chosen layers (their bits
   decided on what the biases really take) progressively: in at most :data:`CLUSTER_GROUPS`
   (6) groups of near-equal count (one layer each on a model of six layers or fewer), the
   layers with the most weights first (:func:`cluster_groups`), each group clustered and then
   a centroid fine-tuning stage in which the layers not yet clustered train as floats and make
   up for it (on the depthwise CNN at 20x the KL to the original on unseen digits was lower
   than with three groups on most seeds, and the drop within half a point on more of them:
   bench/RESULTS.md, stop 28); with one group, the paper's one clustering and
   two centroid fine-tuning stages (:data:`RELEASE_STEPS`, empty by default, puts incremental
   quantization stages between them: finetune rule 9). Every stage distils from the original (T^2 KL plus the top-1
   margin hinge, so the compressed model keeps agreeing with the original rather than being
   retrained on the labels; for an image input ``[N, C, H, W]`` on samples moved by up to ``shift`` pixels,
   :func:`auto_shift` unless given: 2 on 28x28, the finetune pass's rule 8, which raised P2's
   agreement on unseen digits; the original's outputs on the moved samples are computed once
   per move for the whole search, ``shift_targets = "table"``, when an attempt's stages train
   at least as many epochs as there are moves, and shared by its stages through the run's
   memo; for ``epochs`` each, :func:`default_epochs` unless given: about
   :data:`STAGE_MACS` multiply-adds of forward passes per stage, so a cheap model on few
   samples trains longer, 3 to 80 epochs); every value rounded to float16 (``round-fp16`` with ``compressed=true``: palettes
   stored as float16). Every fine-tuning stage (and the rounding) is measured on the held-out
   split before and after, and rolled back (values and compression records) when it makes the
   metric worse: for class scores by more than the paired standard error of the change (from
   the held-out samples one of the two gets right and the other wrong; one flipped sample of
   a 250-sample split is not evidence, and undoing a retraining for it kept P2's agreement at
   0.94), for cosine by anything. The allocation follows the model as retraining leaves it (``reestimate``,
   default on): an attempt's budget is its frontier allocation's predicted bytes, and before
   every prune step after the first and before clustering the layers' costs are measured again
   (:func:`_reallocate`: the Fisher of the current weights; a sparsity a layer already has
   costs nothing) and the least costly allocation within that budget decides the step (its
   sparsities, and at clustering the bit widths). The first estimate, on the dense model,
   overrates the first layer, which retraining then frees; the attempts report each
   reallocation (``reallocated``).
7. **Search.** ``max_drop``: the frontier is searched (bisection, at most ``attempts`` full
   schedules) for the smallest allocation that passes the gate: the held-out drop (net: the
   original's metric minus the result's, what "within half a point" means) is within
   ``max_drop``. The fraction of held-out samples the original gets right and the result gets
   wrong is reported (``held_out_lost``), not gated: a sample lost and another gained are a
   net drop of zero, not a loss counted once in the drop and again on its own. The drop's
   standard error (``held_out_drop_se``, from the paired samples) is reported, and a note says
   when it or one sample's share of the drop exceeds ``max_drop``: the gate's samples are then
   too few to tell. The
   first attempt is the smallest allocation whose uncompressed-to-compressed drop *before any
   fine-tuning* is at most ``max(10 * max_drop, 0.05)`` on the training samples. A failed
   gate backs off towards the original (larger ``lam``: the layers that cost most per byte get
   their bytes back first). ``target_size`` alone: the least costly allocation whose predicted
   weight file fits. The weights' room is the target less the rest of the export, measured:
   the model before the search exported with its biases clustered as the schedule clusters
   them and rounded to float16, less the layers' blobs, plus :data:`PALETTE_RECORD` index
   bytes a layer (``target_of="bundle"``, ``--target-of bundle``: the whole cpu bundle
   directory fits instead, ``weights.mcw`` plus the graph and the manifest, with the planned
   passes' history that the manifest's provenance will carry). At clustering (with
   ``reestimate``) the room is measured again on the attempt's model, the bit widths chosen on
   the bytes the retrained weights code to, and the model's export with every layer
   clustered (what the result will be: later stages move centroids, not indices) checked:
   the bits are chosen again for the bytes it missed the target by (over: below the bytes the
   allocation that went over was predicted to take), up to four times, until it is within 1%
   of the target; the largest that fits is kept (``reallocated[].fitted``: budget and size of
   each). With progressive groups the later groups are clustered in their own stages after
   fine-tuning has moved their weights, which moves the file by a few bytes; when the last
   group's clustering leaves the export over the target, that group's bits are chosen again
   for the bytes it went over by (``reallocated[]`` entries with ``overshoot``). The search then checks the export (when it overshoots: the least costly
   allocation of the budget cut by the overshoot and 2% more, else a smaller one, unless an
   attempt already fits at that budget or above: it is the answer; when it leaves more than
   4% of the target unspent, once the least costly allocation of the budget grown by what was
   left, less 1%, but at most halfway to a budget that overshot, and not for less than 1%
   more; the result is the attempt that fits with the smallest gate drop, then the highest
   agreement). Both: only
   allocations that fit are searched; when none passes the gate, :class:`BudgetNotMet` (a
   :class:`GateFailed`, exit 1) carries the best result found (:attr:`BudgetNotMet.result`).
8. **No data.** Only a data-free check: per layer the smallest setting whose weight SNR is at
   least ``snr_db_min`` (default :func:`datafree_snr_db`: :data:`DATAFREE_SNR_DB` plus
   ``10 log10(layers)``, calibrated by ``bench/datafree_check.py`` on the corpus's trained models
   to keep top-1 agreement >= 0.99 on their real inputs); no fine-tuning; ``accuracy_measured``
   is False and the report says so. A recipe run without data (``optimize --recipe``, no budget
   option) takes the same check through :func:`limit_datafree`: each ``prune`` and ``cluster``
   is backed off per layer (less sparsity, more bits, or float) until it holds.
9. **Reproducible.** :attr:`BudgetResult.specs` are the passes that made the model (rolled-back
   stages left out, every finetune with its seed and holdout); :meth:`BudgetResult.recipe_toml`
   writes them, and ``mconv optimize MODEL --recipe FILE.toml --data D.npz`` rebuilds the same
   model byte for byte (the model's ``mconv.passes`` provenance lists exactly those passes).
10. **Memory.** Everything runs batch by batch (evaluation, gradients, fine-tuning): memory
    grows with the batch, not with the number of samples (beyond the inputs and the original's
    outputs, and its outputs on the moved samples: at most
    :data:`~mconv.passes.finetune.TEACHER_TABLE_BYTES`).
11. **Engine.** ``engine="xla"`` (``device`` cpu or cuda) runs every fine-tuning stage on the
    model lowered to jax (the finetune pass's ``engine``/``device`` options, written into the
    saved recipe); the sensitivities and the held-out gate stay on the reference executor.
12. **Trials on Ray.** Each layer's candidate settings (bytes, estimated cost, SNR) are one
    independent trial: ``workers=N`` (a local Ray of N processes) or ``ray_address`` (a
    cluster) runs them through :func:`mconv.passes.parallel.map_trials`, the layers' weights,
    the Fisher, and for ``sweep`` the model (as ONNX bytes) and the data put in Ray's object
    store once; the result is the in-process run's, value for value. The Fisher itself, the
    first attempt's bisection and the attempts (each one decides the next) stay in this
    process.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.errors import GateFailed, InputError, show
from mconv.irio import real_inputs, self_contained_bytes
from mconv.passes._weights import compression_info, weight_refs
from mconv.passes.base import Pass, PassContext, PassReport, PassSpec, register_pass
from mconv.passes.pipeline import _record_provenance, make_spec, snapshot_model
from mconv.passes.rewrite import name_of

SPARSITIES = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97)
BITS = (8, 6, 5, 4, 3)
# Prune steps as exponents of the kept fraction: step i keeps (1 - s) ** f of the weights, so each
# step removes the same share of what is left (0.97: 41%, 17%, 7%, 3% kept; a linear schedule
# jumped from 22% to 3% in its last step, too far for masked retraining to recover).
PRUNE_STEPS = (0.25, 0.5, 0.75, 1.0)
FINAL_RETRAIN = 2  # the masked retraining after the last prune step runs this many times the epochs
DECAY = 1e-3  # L2 weight decay of the pre-training stage (0: none)
# Biases (and other float tensors no layer owns) are clustered to this many bits. 4, not 5, since
# the room for the layers is measured (stop 22): what the biases save goes to the layers' bits.
# The depthwise CNN at 20x: 12 of 16 seeds within half a point, 8 of the 12 that finished at 5
# bits; paired, 0.26 pt less drop, within the noise of 225 samples (bench/RESULTS.md, stop 23).
BIAS_BITS = 4
# Incremental quantization (finetune rule 9) between the two centroid fine-tuning stages: stage
# k lets this fraction of every clustered tensor's weights train as floats, then snaps them to
# the codebook. Off: with (0.5, 0.25) the depthwise CNN at 20x did worse, 3 of seeds 0-4 within
# half a point against the paper's schedule's 4 (bench/RESULTS.md, stop 26).
RELEASE_STEPS: tuple[float, ...] = ()
RELEASE_LR = 3e-4
CLUSTER_GROUPS = 6  # rule 6: progressive clustering in at most this many groups (1: all at once)
PRUNE_RECOVERY = 0.1  # rule 3: weight of an option's pruning cost against its clustering cost
PALETTE_RECORD = 8  # index bytes a layer's palette record takes beyond a float one (bits, size, rans)
PRE_PASSES = ("fold", "eliminate-identity", "fuse-bn", "dce")
# Rule 6's default epochs: each fine-tuning stage gets about this many multiply-adds of forward
# passes (the model's per sample times the training samples times the epochs), 3 to 80 epochs.
# LeNet-5 on 750 digits: 20 epochs; the depthwise CNN and the digits MLP on 1,347: 80.
STAGE_MACS = 3.4e10
EPOCHS_RANGE = (3, 80)
Progress = Callable[[str, float, float | None], None]


# --------------------------------------------------------------------------- sizes


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmg]i?b?|b)?\s*$", re.I)


def parse_size(text: str | int) -> int:
    """``44KB`` -> 45,056; ``6.9MB`` -> 7,235,174; ``5061`` -> 5,061 (KB = 1024 B, as the issue's
    "44 KB (45,056 B)"; KiB and kB read the same)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise InputError(f"size {str(text)[:40]!r} is not a size", hint="e.g. 44KB, 6.9MB or 45056")
        unit = (m.group(2) or "b").lower()[:1]
        value = int(float(m.group(1)) * {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit])
    if value <= 0:
        raise InputError(f"size {text!r} is not positive", hint="e.g. 44KB, 6.9MB or 45056")
    return value


# --------------------------------------------------------------------------- metric


@dataclass
class _Evaluator:
    """Batched evaluation of a model on fixed feeds against the original's outputs (rule 2)."""

    feeds: dict[str, np.ndarray]
    output: str
    reference: np.ndarray  # the original's outputs on every sample
    labels: np.ndarray | None
    batch: int = 256

    @property
    def is_scores(self) -> bool:
        return self.reference.ndim == 2 and self.reference.shape[1] >= 2

    @property
    def metric_name(self) -> str:
        if not self.is_scores:
            return "cosine"
        return "accuracy" if self.labels is not None else "top1_agreement"

    def outputs(self, model_or_executor, idx: np.ndarray) -> np.ndarray:
        from mconv.targets.reference.executor import Executor

        ex = model_or_executor if isinstance(model_or_executor, Executor) else Executor(model_or_executor)
        parts = []
        for s in range(0, len(idx), self.batch):
            sel = idx[s : s + self.batch]
            parts.append(
                ex.run({k: v[sel] for k, v in self.feeds.items()}, outputs=[self.output])[self.output]
            )
        return np.concatenate(parts) if parts else self.reference[:0]

    def metric(self, got: np.ndarray, idx: np.ndarray) -> float:
        ref = self.reference[idx]
        if self.is_scores:
            target = self.labels[idx] if self.labels is not None else ref.argmax(1)
            return float(np.mean(got.argmax(1) == target))
        a, b = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        return 1.0 if na == nb == 0 else float(a @ b / max(na * nb, 1e-300))

    def losses(self, got: np.ndarray, idx: np.ndarray) -> float:
        """The gate's drop (rule 7): the fraction of samples the original gets right and the
        model gets wrong; gains elsewhere do not offset them (for cosine: the plain drop)."""
        if not self.is_scores:
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
        if not self.is_scores or len(idx) == 0:
            return None
        ref = self.reference[idx]
        target = self.labels[idx] if self.labels is not None else ref.argmax(1)
        d = (ref.argmax(1) == target).astype(np.float64) - (got.argmax(1) == target)
        return float(np.sqrt(np.var(d) / len(idx)))

    def agreement(self, got: np.ndarray, idx: np.ndarray) -> float | None:
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


# --------------------------------------------------------------------------- candidates


@dataclass
class _Layer:
    name: str  # node name (recipe op_name key)
    op_type: str
    tensor: str
    params: int
    weights: np.ndarray
    # (sparsity, bits) -> (bytes, cost); bits None: not clustered
    options: dict[tuple[float, int | None], tuple[int, float]] = field(default_factory=dict)
    snr: dict[tuple[float, int | None], float] = field(default_factory=dict)


def _compressed(w: np.ndarray, sparsity: float, bits: int | None) -> np.ndarray:
    from mconv.passes.cluster import cluster_array
    from mconv.passes.prune import magnitude_mask

    out = w
    if sparsity > 0:
        keep, _ = magnitude_mask(w, sparsity)
        out = np.where(keep, w, np.zeros((), w.dtype))
    if bits is not None:
        out = cluster_array(out, bits, "linear")
    return out


def _stored_bytes(a: np.ndarray, sparsity: float, bits: int | None) -> int:
    """What export stores for ``a`` once the schedule's last stage has rounded its values (and
    a palette's codebook) to float16."""
    from mconv.codecs.choose import best_spec

    if a.dtype == np.float32:
        a = a.astype(np.float16).astype(np.float32)
    hints: dict = {}
    if sparsity > 0:
        hints["pruned"] = True
    if bits is not None:
        hints["bits"] = bits
    return int(best_spec(a, hints)[1])


def _fisher(model: ir.Model, ev: _Evaluator, idx: np.ndarray, tensors: list[str], batch: int = 8) -> dict:
    """Diagonal empirical Fisher of the cross-entropy for ``tensors`` (rule 3): B * mean(g_B**2)."""
    from mconv.passes.finetune import _score_output, softmax_cross_entropy
    from mconv.targets.reference.executor import Executor

    _, loss_value = _score_output(model)
    ex = Executor(model)
    ex.output_names = [loss_value]
    target = ev.labels if ev.labels is not None else (ev.reference.argmax(1) if ev.is_scores else None)
    acc = {t: np.zeros(ex.initializers[t].shape) for t in tensors}
    steps = 0
    for s in range(0, len(idx), batch):
        sel = idx[s : s + batch]

        def loss_fn(outputs, sel=sel):
            z = outputs[loss_value]
            if target is not None and z.ndim == 2:
                value, g = softmax_cross_entropy(z, target[sel])
            else:  # not class scores: squared error against the original
                d = z.astype(np.float64) - ev.reference[sel]
                value, g = float(np.mean(d * d)), (2 * d / d.size).astype(z.dtype)
            return value, {loss_value: g}

        _, grads = ex.value_and_grad({k: v[sel] for k, v in ev.feeds.items()}, loss_fn, tensors)
        for t in tensors:
            acc[t] += np.square(grads[t].astype(np.float64)) * len(sel)
        steps += 1
    return {t: a / max(steps, 1) for t, a in acc.items()}


def _candidates(
    model: ir.Model,
    ev: _Evaluator | None,
    train: np.ndarray | None,
    estimator: str,
    progress: Progress | None,
    sparsities=SPARSITIES,
    bits=BITS,
    *,
    workers: int = 0,
    ray_address: str | None = None,
) -> tuple[list[_Layer], dict]:
    """Every layer's options with bytes and estimated cost (rules 3, 4); and timing facts.

    Each layer's options are one independent trial (rule 12): with ``workers`` / ``ray_address``
    they run on Ray (:func:`mconv.passes.parallel.map_trials`), the weights, the Fisher and (for
    the ``sweep`` estimator) the model and data put in the object store once."""
    from mconv.passes.parallel import check_workers, map_trials, new_token, uses_ray

    check_workers(workers, ray_address)
    layers = []
    for ref in weight_refs(model):
        if not ref.node.name:
            continue
        w = ref.array()
        if w.dtype.kind != "f" or w.size < 16:
            continue
        layers.append(_Layer(ref.node.name, ref.node.op_type, ref.name, int(w.size), w))
    t0 = time.perf_counter()
    fisher = None
    sample = None if train is None else train[:256]
    if ev is not None and estimator == "fisher":
        assert sample is not None  # an evaluator comes with its training split
        fisher = _fisher(model, ev, sample, [layer.tensor for layer in layers])
    on_ray = uses_ray(workers, ray_address)
    shared: dict = {
        "token": new_token(),
        "weights": {layer.tensor: layer.weights for layer in layers},
        "fisher": fisher,
        "sparsities": tuple(sparsities),
        "bits": tuple(bits),
        "ev": ev,
        "sample": sample,
        "sweep": ev is not None and fisher is None,
    }
    if shared["sweep"]:  # the sweep estimator runs the model: ONNX bytes on Ray, never objects
        if on_ray:
            shared["onnx"] = self_contained_bytes(model)
        else:
            shared["model"] = model
    per_layer = len(sparsities) * (1 + len(bits))
    total = len(layers) * per_layer
    if on_ray:

        def tick(done: int, count: int) -> None:
            if progress is not None:
                progress(f"sensitivity ({estimator}): {done}/{count} layers on Ray", done * per_layer, total)

        results = map_trials(
            _options_trial,
            shared,
            [layer.tensor for layer in layers],
            workers=workers,
            address=ray_address,
            progress=tick,
        )
    else:
        state = _OptionsState(shared)
        results = []
        for i, layer in enumerate(layers):

            def step(j: int, name: str = layer.name, before: int = i * per_layer) -> None:
                if progress is not None:
                    progress(f"sensitivity ({estimator}) {name}", before + j, total)

            results.append(state.options(layer.tensor, step))
    for layer, (options, snr) in zip(layers, results):
        layer.options.update(options)
        layer.snr.update(snr)
    facts = {"estimator": estimator if ev is not None else "weight-snr", "seconds": time.perf_counter() - t0}
    return layers, facts


class _OptionsState:
    """One process's state for the layers' options (rule 12): built here, or once per Ray worker
    from the shared object (the model parsed from its ONNX bytes, an executor for ``sweep``)."""

    def __init__(self, shared: Mapping) -> None:
        from mconv.targets.reference.executor import Executor

        self.weights: Mapping[str, np.ndarray] = shared["weights"]
        self.fisher: Mapping[str, np.ndarray] | None = shared["fisher"]
        self.sparsities = tuple(shared["sparsities"])
        self.bits = tuple(shared["bits"])
        self.ev: _Evaluator | None = shared["ev"]
        self.sample: np.ndarray | None = shared["sample"]
        self.executor = None
        if shared["sweep"]:
            if "model" in shared:
                model = shared["model"]
            else:
                import onnx

                model = ir.serde.deserialize_model(onnx.load_from_string(shared["onnx"]))
            self.executor = Executor(model)

    def options(
        self, tensor: str, step: Callable[[int], None] | None = None
    ) -> tuple[dict[tuple[float, int | None], tuple[int, float]], dict[tuple[float, int | None], float]]:
        """``(options, snr)`` of one layer's weight: (sparsity, bits) -> (bytes, cost) and -> dB."""
        w = self.weights[tensor]
        ev, fisher, executor, sample = self.ev, self.fisher, self.executor, self.sample
        options: dict[tuple[float, int | None], tuple[int, float]] = {}
        snr: dict[tuple[float, int | None], float] = {}
        energy = float(np.sum(np.square(w, dtype=np.float64)))
        base_kl = 0.0
        pruned_kl: dict[float, float] = {}
        done = 0
        for s in self.sparsities:
            pruned = _compressed(w, s, None)
            for b in (None, *self.bits):
                a = pruned if b is None else _compressed(pruned, 0.0, b)
                nbytes = _stored_bytes(a, s, b) if (s > 0 or b is not None) else w.size * 2
                err = float(np.sum(np.square(a.astype(np.float64) - w)))
                if ev is None:
                    cost = err / max(energy, 1e-300)
                elif fisher is not None:
                    f2 = fisher[tensor] * np.square(a.astype(np.float64) - w)
                    cut = (pruned == 0) & (w != 0)
                    cost = 0.5 * float(PRUNE_RECOVERY * np.sum(f2[cut]) + np.sum(f2[~cut]))
                elif s == 0 and b is None:
                    cost = 0.0
                else:
                    assert executor is not None and sample is not None  # made above for ev
                    executor.set_initializer(tensor, a)
                    cost = ev.kl(ev.outputs(executor, sample), sample) - base_kl
                    executor.set_initializer(tensor, w)
                    if b is None:
                        pruned_kl[s] = cost
                    if PRUNE_RECOVERY != 1.0:
                        cut = pruned_kl.get(s, 0.0)
                        cost = PRUNE_RECOVERY * cut + max(cost - cut, 0.0)
                options[(s, b)] = (nbytes, max(cost, 0.0))
                snr[(s, b)] = 10 * np.log10(energy / err) if err > 0 else np.inf
                done += 1
                if step is not None:
                    step(done)
        return options, snr


def _options_trial(shared: Mapping, tensor: str) -> tuple[dict, dict]:
    """One layer's options in a Ray worker (its state built once per worker)."""
    from mconv.passes.parallel import worker_state

    return worker_state(shared, _OptionsState).options(tensor)


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
    sweep cannot reach. None when nothing fits."""
    if budget <= 0 or not layers:
        return None
    q = -(-budget // quanta)
    cap = budget // q
    inf = np.inf
    best = np.full(cap + 1, inf)
    best[0] = 0.0
    picks = []
    for layer in layers:
        new = np.full(cap + 1, inf)
        pick = np.full(cap + 1, -1, np.int64)
        keys = sorted(layer.options, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
        for i, key in enumerate(keys):
            nbytes, cost = layer.options[key]
            u = -(-int(nbytes) // q)
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
    for layer, (keys, pick) in zip(reversed(layers), reversed(picks)):
        key = keys[int(pick[at])]
        alloc[layer.name] = key
        at -= -(-int(layer.options[key][0]) // q)
    return {layer.name: alloc[layer.name] for layer in layers}


def _alloc_bytes(layers: list[_Layer], alloc: Mapping) -> int:
    return sum(layer.options[alloc[layer.name]][0] for layer in layers)


def _widest(layers: list[_Layer]) -> dict[str, tuple[float, int | None]]:
    """Every layer pruned and clustered: its schedule has every stage's slot (rule 6)."""
    out: dict[str, tuple[float, int | None]] = {}
    for layer in layers:
        s = max(k[0] for k in layer.options)
        b = min((k[1] for k in layer.options if k[1] is not None), default=None)
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
    frontier's smallest when none fits), and its bytes."""
    fresh = _recosted(model, ev, train, layers, bits_only=bits_only)
    frontier = _frontier(fresh)
    fits = [a for a in frontier if _alloc_bytes(fresh, a) <= budget] or frontier[:1]
    packed = _within(fresh, budget)
    if packed is not None:
        fits.append(packed)
    chosen = min(fits, key=lambda a: (_alloc_cost(fresh, a), _alloc_bytes(fresh, a)))
    return dict(chosen), _alloc_bytes(fresh, chosen)


def _alloc_table(alloc: Mapping) -> dict[str, dict]:
    """An allocation as the report lists it: per layer its sparsity and bits."""
    return {n: {"sparsity": s, "bits": b} for n, (s, b) in sorted(alloc.items())}


def _alloc_cost(layers: list[_Layer], alloc: Mapping) -> float:
    return sum(layer.options[alloc[layer.name]][1] for layer in layers)


def _recosted(
    model: ir.Model, ev: _Evaluator, train: np.ndarray, layers: list[_Layer], *, bits_only: bool
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
        floor = max((s for s, _ in layer.options if s <= zeros + 1e-6), default=0.0)
        f = fisher[layer.tensor]
        pruned: dict[float, tuple[np.ndarray, float]] = {}
        new = _Layer(layer.name, layer.op_type, layer.tensor, layer.params, w)
        scale = {} if bits_only else _byte_scale(layer, w, zeros)
        for s, b in list(layer.options):
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
            else:
                nbytes = int(round(nbytes * scale.get(b, 1.0)))
                if b is not None:
                    cost += max(layer.options[(se, b)][1] - layer.options[(se, None)][1], 0.0)
            new.options[(s, b)] = (nbytes, cost)
        fresh.append(new)
    return fresh


def _byte_scale(layer: _Layer, w: np.ndarray, zeros: float) -> dict[int | None, float]:
    """Per bit width, what the current weights ``w`` (``zeros`` of them zero) code to over
    what the first estimate predicted at that sparsity (interpolated between its options):
    retrained weights code to fewer bytes than the first estimate's, and a reallocation of
    the sparsities spends the difference."""
    out: dict[int | None, float] = {}
    for b in sorted({k[1] for k in layer.options}, key=lambda x: -1 if x is None else x):
        levels = sorted(s for s, bb in layer.options if bb == b)
        lo = max((s for s in levels if s <= zeros + 1e-9), default=levels[0])
        hi = min((s for s in levels if s >= zeros - 1e-9), default=levels[-1])
        first_lo, first_hi = layer.options[(lo, b)][0], layer.options[(hi, b)][0]
        t = 0.0 if hi <= lo else (zeros - lo) / (hi - lo)
        first = (1.0 - t) * first_lo + t * first_hi
        exact = _stored_bytes(_compressed(w, 0.0, b) if b is not None else w, zeros, b)
        if first > 0:
            out[b] = exact / first
    return out


# --------------------------------------------------------------------------- passes


@register_pass("round-fp16")
class RoundFp16(Pass):
    """Round float32 initializers that no compression pass recorded (biases, BatchNorm) to
    float16 values, keeping dtype float32: the graph is unchanged and export stores them with
    its lossless fp16 codec. Tensors holding values beyond float16's range are left alone.
    ``compressed=true`` rounds the pruned and clustered tensors too: zeros stay zero and a
    palette keeps at most its values, whose codebook export then stores as float16."""

    lossless = False

    @dataclass
    class Config:
        min_elements: int = 1
        compressed: bool = False

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        recorded = compression_info(model)
        done = []
        for name, value in model.graph.initializers.items():
            t = value.const_value
            if (name in recorded and not config.compressed) or t is None or t.dtype != ir.DataType.FLOAT:
                continue
            if t.size < config.min_elements:
                continue
            a = t.numpy()
            if a.size and float(np.max(np.abs(a))) > 65504.0:
                continue
            half = a.astype(np.float16).astype(np.float32)
            if np.array_equal(half, a):
                continue
            value.const_value = ir.Tensor(half, name=name)
            done.append(name)
        return self.report(
            bool(done),
            notes=[f"{len(done)} tensors rounded to float16 values"],
            tensors=[{"name": n} for n in done],
        )


# --------------------------------------------------------------------------- result


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


# --------------------------------------------------------------------------- the flow


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


def _finetune_spec(
    epochs: int,
    lr: float,
    seed: int,
    holdout: float,
    batch: int,
    weight_decay: float = 0.0,
    engine: str = "reference",
    device: str = "cpu",
    shift: int = 0,
    shift_targets: str = "auto",
    release: float = 0.0,
) -> PassSpec:
    config: dict[str, object] = {
        "epochs": epochs,
        "lr": lr,
        "seed": seed,
        "holdout": holdout,
        "batch_size": batch,
        "schedule": "cosine",
        "loss": "kl",
        "margin": 0.3,
    }
    if weight_decay:
        config["weight_decay"] = weight_decay
    if release:  # rule 6: part of each clustered tensor trains as floats, then snaps
        config["release"] = release
    if shift:  # rule 6: image inputs moved by up to this many pixels, labelled by the original
        config["shift"] = shift
        if shift_targets != "auto":  # the moved samples' targets kept for the search's stages
            config["shift_targets"] = shift_targets
    if engine != "reference":  # rule 11: where the stage trains (the recipe says so too)
        config["engine"], config["device"] = engine, device
    return make_spec("finetune", config)


def _bias_spec() -> PassSpec:
    """The stage that clusters the biases (and other float tensors no layer owns)."""
    return make_spec("cluster", {"tensors": "all", "op_types": [], "bits": BIAS_BITS, "init": "linear"})


def _schedule(
    alloc: Mapping,
    epochs: int,
    seed: int,
    holdout: float,
    batch: int,
    engine: str = "reference",
    device: str = "cpu",
    shift: int = 0,
    shift_targets: str = "auto",
    sizes: Mapping[str, int] | None = None,
) -> list[tuple[str, list[PassSpec]]]:
    """The paper's schedule for ``alloc`` (rule 6): (stage name, specs) in order; ``sizes``
    (weights per layer) orders the progressive clustering groups (:func:`cluster_groups`)."""
    stages = []

    def tune(stage_epochs: int, lr: float, release: float = 0.0) -> list[PassSpec]:  # a stage
        return [
            _finetune_spec(
                stage_epochs,
                lr,
                seed,
                holdout,
                batch,
                engine=engine,
                device=device,
                shift=shift,
                shift_targets=shift_targets,
                release=release,
            )
        ]

    for i, f in enumerate(PRUNE_STEPS):
        table = {
            n: {"sparsity": round(1.0 - (1.0 - s) ** f, 4)} for n, (s, _) in sorted(alloc.items()) if s > 0
        }
        if not table:
            break
        last = i == len(PRUNE_STEPS) - 1
        stages.append((f"prune step {i + 1}/{len(PRUNE_STEPS)}", [make_spec("prune", {"op_name": table})]))
        stages.append(
            (
                f"masked retraining {i + 1}",
                tune(epochs * (FINAL_RETRAIN if last else 1), 2e-3),
            )
        )
    clustered = {n: {"skip": False, "bits": b} for n, (_, b) in sorted(alloc.items()) if b is not None}
    if clustered:
        # the biases first: the layers' bit widths are then decided on the bytes the biases
        # really take (clustered, or float16 when that stage was rolled back)
        stages.append(("biases clustered", [_bias_spec()]))
        groups = cluster_groups(list(clustered), sizes)
        if len(groups) == 1:
            stages.append(("cluster", [_cluster_spec(clustered)]))
            stages.append(("centroid fine-tuning 1", tune(epochs, 3e-4)))
            for k, fraction in enumerate(RELEASE_STEPS):
                stages.append((f"incremental quantization {k + 1}", tune(epochs, RELEASE_LR, fraction)))
            stages.append(("centroid fine-tuning 2", tune(epochs, 1e-4)))
        else:  # progressive: each group clustered in turn, the layers not yet clustered train as floats
            for g, group in enumerate(groups):
                name = "cluster" if g == 0 else f"cluster {g + 1}"
                stages.append((name, [_cluster_spec({n: clustered[n] for n in group})]))
                stages.append((f"centroid fine-tuning {g + 1}", tune(epochs, 3e-4)))
    stages.append(("values to float16", [make_spec("round-fp16", {"compressed": True})]))
    return stages


def _clustered_names(alloc: Mapping) -> list[str]:
    return [n for n, (_, b) in sorted(alloc.items()) if b is not None]


def _cluster_spec(clustered: Mapping[str, dict]) -> PassSpec:
    """The stage that clusters the named layers (``{name: {"skip": False, "bits": b}}``)."""
    return make_spec("cluster", {"skip": True, "init": "linear", "op_name": dict(clustered)})


def cluster_groups(names: list[str], sizes: Mapping[str, int] | None = None) -> list[list[str]]:
    """Rule 6: the clustered layers in :data:`CLUSTER_GROUPS` groups of near-equal count, the
    layers with the most weights first (``sizes``: weights per layer; without it, one group);
    at most one group per layer."""
    if not names or not sizes or CLUSTER_GROUPS <= 1:
        return [list(names)] if names else []
    order = sorted(names, key=lambda n: (-int(sizes.get(n, 0)), n))
    parts = np.array_split(np.arange(len(order)), min(CLUSTER_GROUPS, len(order)))
    return [[order[i] for i in part] for part in parts if len(part)]


def macs_per_sample(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> int:
    """Multiply-adds of one forward pass on one sample (rule 6's default epochs): per
    Conv/ConvTranspose/Gemm/MatMul weight, its output's elements times the weights each one
    takes (the weight's size over its output channels), the output shapes from one sample's
    run; at least one per weight of the model (ops without a weight layer)."""
    from mconv.targets.reference.executor import Executor

    refs = [
        (r, r.node.outputs[0].name) for r in weight_refs(model) if r.node.outputs and r.node.outputs[0].name
    ]
    wanted = [name for _, name in refs]
    got = Executor(model).run({k: v[:1] for k, v in feeds.items()}, outputs=wanted) if wanted else {}
    macs = 0
    for r, name in refs:
        out = got[name]
        if np.ndim(out) < 1:
            continue
        channels = out.shape[1] if r.node.op_type.startswith("Conv") and out.ndim > 1 else out.shape[-1]
        macs += int(out.size * r.array().size // max(int(channels), 1))
    tensors = [v.const_value for v in model.graph.initializers.values() if v.const_value is not None]
    return max(macs, sum(int(t.size) for t in tensors))


def default_epochs(model: ir.Model, feeds: Mapping[str, np.ndarray], samples: int) -> int:
    """Rule 6: the epochs that give each fine-tuning stage about :data:`STAGE_MACS` multiply-adds
    on ``samples`` training samples, within :data:`EPOCHS_RANGE` (cheap models train longer)."""
    per_epoch = macs_per_sample(model, feeds) * max(samples, 1)
    return int(np.clip(np.ceil(STAGE_MACS / max(per_epoch, 1)), *EPOCHS_RANGE))


def auto_shift(feeds: Mapping[str, np.ndarray]) -> int:
    """Rule 6's translation for distillation: with a float input of shape [N, C, H, W] and H, W of
    8 or more, up to ``max(1, round(min(H, W) / 14))`` pixels (2 on MNIST's 28, 1 on 8x8
    digits, 16 on 224); 0 (none) for any other input."""
    sizes = [min(v.shape[2:]) for v in feeds.values() if v.dtype.kind == "f" and v.ndim == 4]
    if not sizes or min(sizes) < 8:
        return 0
    return max(1, int(round(min(sizes) / 14)))


def _prefix(progress: Progress | None, prefix: str) -> Progress | None:
    if progress is None:
        return None
    return lambda d, c, t: progress(f"{prefix}: {d}", c, t)


def compress_to_budget(
    model: ir.Model,
    data: Mapping[str, np.ndarray] | None,
    *,
    max_drop: float | None = None,
    target_size: int | str | None = None,
    target_of: str = "weights",
    seed: int = 0,
    progress: Progress | None = None,
    engine: str = "reference",
    device: str = "cpu",
    estimator: str = "fisher",
    holdout: float = 0.25,
    epochs: int | None = None,
    attempts: int = 8,
    batch_size: int = 32,
    snr_db_min: float | None = None,
    sparsities: tuple[float, ...] = SPARSITIES,
    bits: tuple[int, ...] = BITS,
    decay: float = DECAY,
    reestimate: bool = True,
    workers: int = 0,
    ray_address: str | None = None,
    val_data: Mapping[str, np.ndarray] | None = None,
    shift: int | None = None,
    check_gate: Callable[[int, float | None], None] | None = None,
) -> BudgetResult:
    """Deep Compression of ``model`` (mutated) under a budget; see the module rules.

    ``check_gate(held, max_drop)``, when given, is called once the options are checked and
    before any work, with the held-out samples the gate will measure on and the drop it gates
    (the CLI refuses too few there: :func:`too_few_samples`).

    Raises :class:`BudgetNotMet` (a GateFailed, with ``.result``) when ``max_drop`` cannot be met within
    ``target_size``; :class:`InputError` for bad options or data."""
    t_start = time.perf_counter()
    from mconv.targets.xla.engine import check_engine

    check_engine(engine, device)
    from mconv.passes.parallel import check_workers

    check_workers(workers, ray_address)
    if estimator not in ("fisher", "sweep"):
        raise InputError(f"estimator {estimator!r}", hint="use 'fisher' or 'sweep'")
    if max_drop is not None and (isinstance(max_drop, bool) or not 0.0 <= float(max_drop) < 1.0):
        raise InputError(f"max drop {max_drop!r} is not a fraction", hint="0.005 is half a point")
    target = None if target_size is None else parse_size(target_size)
    if target_of not in ("weights", "bundle"):
        raise InputError(f"target of {target_of!r}", where="--target-of", hint="weights or bundle")
    measured = "weights_file" if target_of == "weights" else "bundle"  # rule 7: what the size is of
    if not 0.0 < holdout < 1.0:
        raise InputError(f"holdout {holdout!r}", hint="a fraction in (0, 1), e.g. 0.25")
    if attempts < 1:
        raise InputError(f"attempts {attempts!r}", hint="1 or more")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise InputError(f"epochs {epochs!r}", where="--epochs", hint="1 or more per fine-tuning stage")
    if shift is not None and (isinstance(shift, bool) or not isinstance(shift, int) or shift < 0):
        raise InputError(f"shift {shift!r}", hint="pixels, 0 (off) or more; None: from the input's size")
    if val_data is not None and data is None:
        raise InputError(
            "validation data without calibration data",
            where="--val-data",
            hint="give --data D.npz (fine-tuning) with --val-data V.npz (the gate)",
        )
    if data is not None and max_drop is None and target is None:
        max_drop = 0.005
    say = progress or (lambda *a: None)

    history_before = model.metadata_props.get("mconv.passes")
    ctx = PassContext(data=None if data is None else dict(data), seed=seed, progress=None)
    reference = snapshot_model(model) if data is not None else None
    ctx.reference_model = reference
    if any(not 0.0 <= float(x) < 1.0 for x in sparsities) or any(not 1 <= int(b) <= 8 for b in bits):
        raise InputError(
            f"sparsities {list(sparsities)}, bits {list(bits)}", hint="sparsities in [0, 1), bits 1..8"
        )
    sparsities = tuple(sorted({0.0, *(float(x) for x in sparsities)}))
    if check_gate is not None and data is not None:
        n_data = _check_data(model, data)[2]
        held_n = (
            _check_data(model, val_data)[2]
            if val_data is not None
            else len(split_indices(n_data, holdout, seed)[1])
        )
        check_gate(held_n, max_drop)
    pre = [make_spec(n, {}) for n in PRE_PASSES]
    say("preparing (fold, eliminate-identity, dce)", 0, None)
    _run_specs(model, pre, ctx)

    if data is None:
        return _data_free(
            model,
            pre,
            target,
            seed,
            snr_db_min,
            say,
            t_start,
            history_before,
            sparsities,
            bits,
            workers=workers,
            ray_address=ray_address,
            measured=measured,
        )

    feeds, labels, n = _check_data(model, data)
    if val_data is None:
        train, held = split_indices(n, holdout, seed)
        total = n
    else:  # rule 1: a validation set of its own; fine-tuning sees every sample of ``data``
        feeds, labels, held = _with_validation(model, feeds, labels, val_data)
        train = split_indices(n, 0.0, seed)[0]  # the finetune pass's sample order
        holdout, total = 0.0, n + len(held)
    say("original outputs", 0, None)
    output = _score_value(model)
    ev0 = _Evaluator(feeds, output, np.zeros((0,)), labels)
    ev = _Evaluator(feeds, output, ev0.outputs(reference, np.arange(total)), labels)
    baseline = ev.metric(ev.reference[held], held)
    split = {
        "samples": total,
        "train": int(len(train)),
        "held_out": int(len(held)),
        "holdout": holdout,
        "validation": val_data is not None,
        "seed": seed,
    }
    if epochs is None:
        epochs = default_epochs(model, feeds, len(train))
    if shift is None:
        shift = auto_shift(feeds)
    # Rule 6: the teacher's outputs on the moved samples once per move for the whole search (the
    # finetune pass's rule 8), when an attempt's stages train at least as many epochs as there
    # are moves; the stages' recipe says so, so a rerun makes the same choice.
    centroid_stages = CLUSTER_GROUPS if CLUSTER_GROUPS > 1 else 2
    attempt_epochs = epochs * (len(PRUNE_STEPS) - 1 + FINAL_RETRAIN + centroid_stages)
    shift_targets = "table" if shift and (2 * shift + 1) ** 2 <= attempt_epochs else "auto"

    def sizes_of() -> dict[str, int]:
        return {layer.name: layer.params for layer in layers}

    def plan_for(alloc: Mapping) -> list[tuple[str, list[PassSpec]]]:
        """Rule 6's schedule for ``alloc`` with this search's fine-tuning settings."""
        return _schedule(
            alloc, epochs, seed, holdout, batch_size, engine, device, shift, shift_targets, sizes_of()
        )

    pre_stages: list[dict] = []
    start_metric = baseline
    if decay > 0:  # rule 6: L2 pre-training, so that weights the task does not use go to zero first
        spec = _finetune_spec(
            epochs,
            1e-3,
            seed,
            holdout,
            batch_size,
            weight_decay=decay,
            engine=engine,
            device=device,
            shift=shift,
            shift_targets=shift_targets,
        )
        state = _weights_state(model)
        pctx = PassContext(data=ctx.data, reference_model=reference, seed=seed, memo=ctx.memo)
        pctx.progress = _prefix(say, "L2 pre-training")
        t0 = time.perf_counter()
        _run_specs(model, [spec], pctx)
        got = ev.outputs(model, held)
        m = ev.metric(got, held)
        rolled = ev.worse(ev.reference[held], got, held)
        if rolled:
            _restore(model, state)
        else:
            pre = [*pre, spec]
            start_metric = m
        pre_stages.append(
            {
                "stage": "L2 pre-training",
                "metric_before": baseline,
                "metric_after": m,
                "rolled_back": rolled,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )

    layers, est = _candidates(
        model,
        ev,
        train,
        estimator,
        say,
        tuple(sparsities),
        tuple(bits),
        workers=workers,
        ray_address=ray_address,
    )
    if not layers:
        raise InputError(
            "no named Conv/Gemm/MatMul weights to compress", hint="the model has no weight layers"
        )
    frontier = _frontier(layers)
    est["layers"] = len(layers)
    est["frontier"] = len(frontier)
    close = 0 if target is None else max(16, target // 100)  # rule 7: a size this near the target fits it
    grow_over = max(16, (target or 0) // 25)  # rule 7: what an attempt may leave unspent without a bigger one

    def history_bytes(specs: list[PassSpec], stages: list[tuple[str, list[PassSpec]]]) -> int:
        """The bundle's provenance of ``specs`` and the ``stages`` still to come (an attempt's
        history, at most: a rolled-back stage leaves its specs out), when the target is the
        bundle's; 0 when it is the weight file's."""
        if target_of != "bundle":
            return 0
        history = [spec.as_dict() for spec in specs] + [spec.as_dict() for _, ss in stages for spec in ss]
        return len(json.dumps(history, sort_keys=True, separators=(",", ":")))

    def nonlayer_now(work: ir.Model, specs: list[PassSpec], stages: list) -> int:
        """Rule 7: the measured size less the layers' blobs, with their palette records."""
        sizes = _rounded_sizes(work)
        blobs = sum(sizes["stored"].get(layer.tensor, 0) for layer in layers)
        nonlayer = sizes[measured] - blobs + PALETTE_RECORD * len(layers)
        return nonlayer + history_bytes(specs, stages)

    def final_size(work: ir.Model, specs: list[PassSpec], stages: list) -> int:
        return _rounded_sizes(work)[measured] + history_bytes(specs, stages)

    if target is not None:
        # rule 7: what the weights' blobs have room for: the target less the rest of the export
        # (the index, the biases clustered as the schedule clusters them, for a bundle target
        # its other files and the schedule's history), measured on the model before the search
        estimate = snapshot_model(model)
        _run_specs(estimate, [_bias_spec()], PassContext(seed=seed))
        room = target - nonlayer_now(estimate, list(pre), plan_for(_widest(layers)))
        fitting = [a for a in frontier if _alloc_bytes(layers, a) <= room]
        packed = _within(layers, room)
        if packed is not None and packed not in fitting:
            # the least costly allocation that fits, found between the frontier's points
            fitting = sorted(
                [*fitting, packed], key=lambda a: (_alloc_bytes(layers, a), _alloc_cost(layers, a))
            )
        if not fitting:
            fitting = frontier[:1]
    else:
        fitting = frontier

    base = snapshot_model(model)  # every attempt starts from here
    base_history = history_before

    def attempt(k: int, label: str) -> dict:
        work = snapshot_model(base)
        alloc = fitting[k]
        kept: list[PassSpec] = list(pre)
        stages = list(pre_stages)
        held_metric = start_metric
        held_got = ev.outputs(work, held)  # the outputs before the next stage (rule 6's check)
        plan = plan_for(alloc)
        budget = _alloc_bytes(layers, alloc)
        reallocated: list[dict] = []
        if reestimate:  # rule 6: every stage's slot; its settings are decided when it comes
            plan = plan_for(_widest(layers))
        actx = PassContext(data=ctx.data, reference_model=reference, seed=seed, memo=ctx.memo)
        for si, (name, specs) in enumerate(plan):
            actx.progress = _prefix(say, f"{label} [{si + 1}/{len(plan)}] {name}")
            actx.stage = None
            if reestimate:
                if (name.startswith("prune step") and si > 0) or name == "cluster":
                    say(f"{label} [{si + 1}/{len(plan)}] re-estimating the allocation", 0, None)
                    stage_budget = budget
                    if name == "cluster" and target is not None:  # rule 7: the bytes left, measured
                        stage_budget = target - nonlayer_now(work, kept, plan[si:])
                    alloc, predicted = _reallocate(
                        work, ev, train, layers, stage_budget, bits_only=name == "cluster"
                    )
                    reallocated.append(
                        {
                            "stage": name,
                            "budget_bytes": stage_budget,
                            "predicted_bytes": predicted,
                            "allocation": _alloc_table(alloc),
                        }
                    )
                current = dict(plan_for(alloc))
                if name not in current:
                    continue  # the allocation has nothing for this stage (e.g. nothing clustered)
                specs = current[name]
            before_state = _weights_state(work)
            t0 = time.perf_counter()
            fitting_now = reestimate and name == "cluster" and target is not None
            progressive = fitting_now and len(cluster_groups(_clustered_names(alloc), sizes_of())) > 1

            def sized(alloc_now: Mapping, group_specs: list[PassSpec], whole: bool = progressive) -> None:
                """Rule 7 at clustering: the attempt's model clustered for its size (with
                progressive groups, every group at once: the result's indices), else the stage."""
                if whole:
                    full = {n: {"skip": False, "bits": alloc_now[n][1]} for n in _clustered_names(alloc_now)}
                    _run_specs(work, [_cluster_spec(full)], actx)
                else:
                    _run_specs(work, group_specs, actx)

            if not fitting_now:
                _run_specs(work, specs, actx)
            else:
                sized(alloc, specs)
                # rule 7: the export after clustering is the result's size (the stages after it
                # move centroids, not indices): the bits again for the bytes it missed the
                # target by, over or under, until it fits within ``close`` of it; the largest
                # that fits is kept (else the smallest)
                assert target is not None  # fitting_now implies a target
                runs: list[dict] = []
                for _ in range(4):
                    size = final_size(work, kept + specs, plan[si + 1 :])
                    runs.append(
                        {"size": size, "state": _weights_state(work), "alloc": alloc,
                         "predicted": predicted, "specs": specs, "budget": stage_budget}
                    )  # fmt: skip
                    if 0 <= target - size <= close:
                        break
                    # over: below what the overshooting allocation was predicted to take (its
                    # budget may hold slack that the same allocation would fill again)
                    stage_budget = (
                        (min(stage_budget, predicted) if size > target else stage_budget) + target - size
                    )
                    _restore(work, before_state)
                    alloc, predicted = _reallocate(work, ev, train, layers, stage_budget, bits_only=True)
                    if any(alloc == r["alloc"] for r in runs):
                        break
                    specs = dict(plan_for(alloc)).get(name, specs)
                    sized(alloc, specs)
                fit = [r for r in runs if r["size"] <= target]
                kept_run = max(fit, key=lambda r: r["size"]) if fit else min(runs, key=lambda r: r["size"])
                alloc, predicted, specs = kept_run["alloc"], kept_run["predicted"], kept_run["specs"]
                if progressive:  # the first group alone now; the others in their own stages
                    _restore(work, before_state)
                    _run_specs(work, specs, actx)
                else:
                    _restore(work, kept_run["state"])
                reallocated[-1].update(
                    budget_bytes=kept_run["budget"],
                    predicted_bytes=predicted,
                    allocation=_alloc_table(alloc),
                    fitted=[[r["budget"], r["size"]] for r in runs],
                )
            groups = cluster_groups(_clustered_names(alloc), sizes_of())
            if reestimate and target is not None and len(groups) > 1 and name == f"cluster {len(groups)}":
                # rule 7: the last group clustered, the export is the result's size; the earlier
                # groups' fine-tuning moved their weights since the fit, so when it now overshoots
                # the last group's bits are chosen again for the bytes it went over by
                last = [layer for layer in layers if layer.name in groups[-1]]
                for _ in range(4):
                    sizes = _rounded_sizes(work)  # one export: the size and each layer's blob
                    over = sizes[measured] + history_bytes(kept + specs, plan[si + 1 :]) - target
                    if over <= 0:
                        break
                    stored = sizes["stored"]
                    room = sum(stored.get(layer.tensor, 0) for layer in last) - over
                    _restore(work, before_state)
                    part, part_bytes = _reallocate(work, ev, train, last, room, bits_only=True)
                    if all(part[n] == alloc[n] for n in part) or any(b is None for _, b in part.values()):
                        _run_specs(work, specs, actx)
                        break
                    alloc = {**alloc, **part}
                    specs = dict(plan_for(alloc)).get(name, specs)
                    _run_specs(work, specs, actx)
                    reallocated.append(
                        {
                            "stage": name,
                            "budget_bytes": room,
                            "predicted_bytes": part_bytes
                            + sum(stored.get(layer.tensor, 0) for layer in layers if layer not in last),
                            "overshoot": over,
                            "allocation": _alloc_table(alloc),
                        }
                    )
            got = ev.outputs(work, held)
            m = ev.metric(got, held)
            check = specs[0].name in ("finetune", "round-fp16") or name == "biases clustered"
            rolled = check and ev.worse(held_got, got, held)
            if rolled:
                _restore(work, before_state)
            else:
                kept += specs
            stages.append(
                {
                    "stage": name,
                    "metric_before": held_metric,
                    "metric_after": m,
                    "rolled_back": rolled,
                    "seconds": round(time.perf_counter() - t0, 3),
                }
            )
            if not rolled:
                held_metric, held_got = m, got
        got = ev.outputs(work, held)
        final = ev.metric(got, held)
        if base_history is None:
            work.metadata_props.pop("mconv.passes", None)
        else:
            work.metadata_props["mconv.passes"] = base_history
        _record_provenance(work, kept)
        sizes = _attempt_sizes(work)
        drop = baseline - final
        lost = ev.losses(got, held)
        ok_drop = max_drop is None or drop <= max_drop + 1e-12  # rule 7: the net drop
        ok_size = target is None or sizes[measured] <= target
        return {
            "index": k,
            "alloc": alloc,
            "model": work,
            "specs": kept,
            "stages": stages,
            "final": final,
            "agreement": ev.agreement(got, held),
            "drop": drop,
            "drop_se": ev.drop_se(got, held),
            "lost": lost,
            "sizes": sizes,
            "ok": ok_drop and ok_size,
            "ok_drop": ok_drop,
            "ok_size": ok_size,
            "predicted": _alloc_bytes(layers, alloc),
            "budget": budget,
            "reallocated": reallocated,
        }

    tried: dict[int, dict] = {}

    def run(k: int) -> dict:
        if k not in tried:
            tried[k] = attempt(k, f"attempt {len(tried) + 1}/{attempts}")
        return tried[k]

    if max_drop is None:  # target size alone: the least costly allocation that fits
        assert target is not None  # data with neither asks for max_drop 0.005 (above)
        k = min(range(len(fitting)), key=lambda i: (_alloc_cost(layers, fitting[i]), -i))
        r = run(k)
        grown = False
        while len(tried) < attempts:
            fits = [t["budget"] for t in tried.values() if t["ok_size"]]
            overs = [t["budget"] for t in tried.values() if not t["ok_size"]]
            if not r["ok_size"]:
                # the export overshot the prediction: the least costly allocation of a budget cut
                # by the overshoot (and 2% more), else the next smaller frontier point; never
                # one below a budget that already fits (that attempt is the answer)
                over = r["sizes"][measured] - target
                cut = _within(layers, _alloc_bytes(layers, fitting[k]) - over - (room + 49) // 50)
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
                # rule 7: the export left more than 1% of the target unspent (the biases and the
                # index cost less than their estimate): once, the least costly allocation of the
                # budget grown by what was left (less 1%), and at most halfway to a budget that
                # overshot (between the two, the prediction's error decides)
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
                if k in tried:
                    break
            r = run(k)
        best = min(
            tried.values(),
            key=lambda r: (not r["ok_size"], r["drop"], -(r["agreement"] or 0.0), r["sizes"]["weights_file"]),
        )
    else:
        start = _start_index(fitting, layers, base, ev, train, max_drop)
        lo, hi = 0, len(fitting) - 1  # the answer lies in [lo, hi]
        k = start
        while len(tried) < attempts:
            r = run(k)
            if r["ok"]:
                hi = k
            else:
                lo = k + 1
            if lo >= hi:
                break
            k = (lo + hi) // 2 if r["ok"] else max(k + 1, (k + hi + 1) // 2)
            k = min(max(k, lo), hi)
            if k in tried:
                break
        passing = [r for r in tried.values() if r["ok"]]
        if passing:
            best = min(passing, key=lambda r: (r["sizes"]["weights_file"], r["drop"]))
        else:
            best = min(
                tried.values(), key=lambda r: (not r["ok_size"], r["drop"], r["sizes"]["weights_file"])
            )

    result = _result(
        best,
        layers,
        model_metric=ev.metric_name,
        baseline=baseline,
        max_drop=max_drop,
        target=target,
        split=split,
        est=est,
        seed=seed,
        tried=tried,
    )
    result.notes.append(
        f"{split['train']} samples for fine-tuning, {split['held_out']} validation samples (a file of their own) for the gate"
        if split["validation"]
        else f"{split['train']} samples for fine-tuning, {split['held_out']} held out for the gate (seed {seed})"
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
    if not result.met:
        raise BudgetNotMet(
            f"budget not met: held-out {ev.metric_name} drop {best['drop']:.4f} (max {max_drop}), "
            f"{target_of} {best['sizes'][measured]:,} B (target {target if target else '-'})",
            result,
            hint="allow a larger --max-drop or --target-size",
        )
    return result


def _start_index(fitting, layers, base, ev: _Evaluator, train, max_drop: float) -> int:
    """Rule 7: the smallest allocation whose drop before fine-tuning is at most
    max(10 * max_drop, 0.05) on (at most 512) training samples; bisection over the frontier."""
    from mconv.targets.reference.executor import Executor

    sample = train[:512]
    ex = Executor(base)
    originals = {layer.tensor: layer.weights for layer in layers}
    base_metric = ev.metric(ev.reference[sample], sample)
    limit = max(10 * max_drop, 0.05)
    cache: dict = {}

    def drop(k: int) -> float:
        for layer in layers:
            s, b = fitting[k][layer.name]
            key = (layer.name, s, b)
            if key not in cache:
                cache[key] = (
                    _compressed(originals[layer.tensor], s, b) if (s or b) else originals[layer.tensor]
                )
            ex.set_initializer(layer.tensor, cache[key])
        return base_metric - ev.metric(ev.outputs(ex, sample), sample)

    lo, hi = 0, len(fitting) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if drop(mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _result(
    best, layers, *, model_metric, baseline, max_drop, target, split, est, seed, tried
) -> BudgetResult:
    rows = []
    for layer in layers:
        s, b = best["alloc"][layer.name]
        rows.append(
            {
                "name": layer.name,
                "tensor": layer.tensor,
                "op_type": layer.op_type,
                "params": layer.params,
                "sparsity": s,
                "bits": b,
                "estimated_cost": layer.options[(s, b)][1],
                "predicted_bytes": layer.options[(s, b)][0],
                "stored_bytes": best["sizes"]["stored"].get(layer.tensor),
                "original_bytes": 4 * layer.params,
            }
        )
    original = sum(4 * layer.params for layer in layers)
    attempts = [
        {
            "index": r["index"],
            "predicted_bytes": r["predicted"],
            "weights_file": r["sizes"]["weights_file"],
            "held_out_drop": r["drop"],
            "held_out_lost": r["lost"],
            "passed": r["ok"],
            "allocation": _alloc_table(r["alloc"]),
            "budget_bytes": r.get("budget"),
            "reallocated": r.get("reallocated", []),
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
            "ratio_weights_file": round(original / max(best["sizes"]["weights_file"], 1), 2),
        },
        estimator=est,
        specs=best["specs"],
        seed=seed,
    )


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


# --------------------------------------------------------------------------- enough data?

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


# --------------------------------------------------------------------------- data-free limit

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
    from mconv.passes.cluster import _gather_tables
    from mconv.passes.prune import _global_threshold

    prunes = [i for i, s in enumerate(specs) if s.name == "prune"]
    clusters = [i for i, s in enumerate(specs) if s.name == "cluster"]
    refs = weight_refs(model)
    refs = refs + _gather_tables(model, refs)
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


# --------------------------------------------------------------------------- estimators compared


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
    from mconv.targets.reference.executor import Executor

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
            f"(drop {result.held_out_drop:+.4f}{se}, lost {result.held_out_lost:.4f}, max {result.max_drop})"
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
    lines.append(f"{'BUDGET MET' if result.met else 'BUDGET NOT MET'} in {result.seconds:.1f}s")
    return "\n".join(lines)
