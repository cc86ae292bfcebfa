"""Deep Compression under a budget: per-layer sparsity and bits chosen from sensitivity, the
paper's schedule, a held-out gate and back-off.

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
   original model's class scores; for per-position class probabilities ``[N, T, C]`` (a CTC
   recognizer's softmax) the share of positions whose top-1 class agrees with the original's;
   for other outputs that are not class scores the cosine, channel-balanced on three or more
   dimensions (:func:`mconv.metrics.balanced_cosine`: a detector's box coordinates in pixels
   would otherwise outweigh its scores), and retraining distils those with the
   channel-balanced MSE, not the KL (``Search.loss``). ``drop = baseline - metric`` on the
   held-out samples (0.005 = half a point).
3. **Sensitivity.** Per layer (weights of Conv/ConvTranspose/Gemm/MatMul with a node name) and
   per candidate setting (sparsity in :data:`SPARSITIES`, bits in :data:`BITS`), the cost of
   the setting is estimated in nats of loss:
   - ``fisher`` (default): the diagonal empirical Fisher ``F`` of the cross-entropy (labels, or
     the original's top-1 class; for per-position probabilities ``[N, T, C]``, rule 2, at every
     position against the original's top-1 class there), from batch gradients of the reference executor over at most
     256 training samples, and ``cost = 0.5 * sum(F * (w - w')**2)`` (an OBD / Taylor estimate);
   - ``sweep``: the measured mean KL divergence between the original's outputs and the outputs
     with that one layer compressed (``analyze``'s one-layer-at-a-time sweep, continuous).
   :func:`compare_estimators` puts both against the measured one-layer drop. Either way the
   share of an option's cost that comes from the weights it prunes counts
   :data:`PRUNE_RECOVERY` (0.1) times, its clustering cost in full: masked retraining has every
   kept weight free and wins back nearly all of a pruning loss, centroid fine-tuning only the
   codebook, so counting the two alike would spend bytes on sparsity that retraining makes
   cheap anyway (the measurements: bench/deep_compression.py, bench/RESULTS.md).
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
   rounded up), which reaches the allocations between the hull's points: a hull point can
   leave much of a byte budget unspent.
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
   up for it (a smaller step for each group leaves the rest more room to adapt:
   bench/deep_compression.py); with one group, the paper's one clustering and
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
   original's metric minus the result's, what "within half a point" means) plus ``gate_se``
   (default 1) of its standard errors is within ``max_drop``. The measured drop alone would
   let the search pass an attempt whose held-out gain and loss cancel by chance: a search that
   tries several attempts on one validation set keeps the luckiest, and on data it never saw
   that model then loses more than the budget (magika on 385 validation files: drop 0.26 pt at
   the gate, 2.6 pt on 391 other files). With the bound, a model that disagrees with the
   original on many samples passes only where the samples can tell its drop from noise;
   ``gate_se = 0`` gates on the measured drop alone (CLI ``--gate-se``). The fraction of held-out samples the original gets right and the result gets
   wrong is reported (``held_out_lost``), not gated: a sample lost and another gained are a
   net drop of zero, not a loss counted once in the drop and again on its own. The drop's
   standard error (``held_out_drop_se``, from the paired samples) is reported, and a note says
   when it or one sample's share of the drop exceeds ``max_drop``: the gate's samples are then
   too few to tell. The
   first attempt is the smallest allocation whose uncompressed-to-compressed drop *before any
   fine-tuning* is at most ``max(10 * max_drop, 0.05)`` on the training samples. Then a
   bisection in bytes (geometric mean) between the largest budget that failed and the smallest
   that passed (before any pass: the largest allocation that fits; after a pass with no failure
   below it: the smallest allocation, so the search goes on toward smaller), each try the least
   costly allocation within its budget (the knapsack of rule 5, which reaches between the
   frontier's points), until the two are within ``REFINE_CLOSE`` (10%) of each other, no
   allocation lies between them, or ``attempts`` are spent. A failed gate so backs off towards
   the original (the layers that cost most per byte get their bytes back first). Bisecting the
   frontier's indices instead ended LeNet-5 at 116 KB: the hull's points are far apart in bytes
   there, and one failure at 99 KB (a few of 1,000 digits) kept every later try above it. ``target_size`` alone: the least costly allocation whose predicted
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
    saved recipe), and the original's outputs, the held-out gate, the start's bisection and
    the Fisher on it too, each program compiled once per graph structure and batch shape for
    the whole search (:mod:`mconv.engines.fast`); ``engine="auto"`` (the default) is xla
    when jax imports, else the reference executor. The report names it
    (:attr:`BudgetResult.engine`: ``xla-cpu``, ``xla-cuda`` or ``reference``).
12. **Trials on Ray.** Each layer's candidate settings (bytes, estimated cost, SNR) are one
    independent trial: ``workers=N`` (a local Ray of N processes) or ``ray_address`` (a
    cluster) runs them through :func:`mconv.drivers.parallel.map_trials`, the layers' weights,
    the Fisher, and for ``sweep`` the model (as ONNX bytes) and the data put in Ray's object
    store once; the result is the in-process run's, value for value. The Fisher itself, the
    first attempt's bisection and the attempts (each one decides the next) stay in this
    process.
13. **Entropy-constrained clustering** (``cluster="entropy"``, ``--cluster entropy``; default
    ``kmeans``). Export entropy-codes palette indices, so a layer's bits need not be a whole
    number. Where the clustering stage decides the bit widths again on the current weights
    (rules 6 and 7, each ``bits_only`` reallocation), each option of ``b`` bits is also tried
    as the cluster pass's ``method="entropy"`` with at most ``b`` or ``b + 1`` bits and each
    lam of :data:`~mconv.drivers.budget.allocation.ENTROPY_LAMS`; the one with the least
    Fisher-weighted error among those export codes to no more bytes than k-means at ``b``
    (k-means included) becomes the option, with its coded bytes, measured by the codec choice
    export makes. The allocation (the knapsack of rule 5) then picks among the improved options
    and the schedule's cluster stages run each layer's choice (the saved recipe names
    ``method``/``lam``). The first estimate (rule 3) stays k-means'.
14. **Structured sparsity** (``structured="auto"``, ``--structured auto``, the default; ``off``
    offers unstructured options only).
    Each Conv/Gemm layer whose output channels :mod:`mconv.edit.channels` can remove safely
    (its plan made on a copy, never applied) also has options ``(s, b, f)``: the fraction ``f``
    of :data:`~mconv.drivers.budget.config.STRUCTURED` of its channels with the smallest L2
    norms removed, then ``(s, b)`` on the kept weights. Bytes: the kept tensor's (rule 4) less
    what the cut saves downstream, the consumers' rows at their own ``(s, b)`` and the sliced
    biases at :data:`BIAS_BITS` (at least 1 B: the knapsack takes no negative bytes). Cost: the
    removed channels' Fisher-weighted loss counted :data:`PRUNE_RECOVERY` times, as a pruning
    that masked retraining follows, plus ``(s, b)``'s cost on the kept weights; with the
    ``sweep`` estimator or no data there are no structured options. An attempt that cuts runs
    the ``prune(structured="l2")`` stage and a masked retraining before the prune steps; the
    layers and allocation then follow the cut graph (:func:`~mconv.drivers.budget.sensitivity.after_cut`)
    and every re-estimate of rule 6 measures the smaller tensors. Rule 7's start estimate
    zeroes a cut's channels. The report names each layer's channels removed. It is the default
    because it helped or tied on every model measured (docs/passes.md).

Layout
------
``config`` (defaults, :func:`parse_size`), ``evaluation`` (split, metric, gate, export sizes),
``sensitivity`` (per-layer candidates), ``allocation`` (frontier and byte fitting),
``schedule`` (the fine-tuning stages), ``attempt`` (one allocation scheduled and gated),
``search`` (:func:`compress_to_budget`), ``datafree`` (rule 8), ``result`` (the result, its
recipe and report). The ``round-fp16`` pass is :mod:`mconv.passes.round_fp16`.
"""

from __future__ import annotations

from mconv.drivers.budget import allocation, attempt, config, evaluation, schedule, search, sensitivity  # noqa: F401  (tests patch a rule's constant)
from mconv.drivers.budget.allocation import (  # noqa: F401  (tests reach the rules' parts)
    _alloc_bytes,
    _alloc_cost,
    _alloc_table,
    _byte_scale,
    _frontier,
    _reallocate,
    _recosted,
    _widest,
    _within,
)
from mconv.drivers.budget.config import (
    BITS,
    PALETTE_RECORD,
    PRE_PASSES,
    PRUNE_RECOVERY,
    SPARSITIES,
    BudgetConfig,
    Progress,
    parse_size,
)
from mconv.drivers.budget.datafree import (  # noqa: F401  (tests reach the rules' parts)
    DATAFREE_NOTE,
    DATAFREE_SNR_DB,
    LIMITED_PASSES,
    DataFreePlan,
    _data_free,
    _snr_db,
    datafree_setting,
    datafree_snr_db,
    limit_datafree,
)
from mconv.drivers.budget.evaluation import (  # noqa: F401  (tests reach the rules' parts)
    MIN_HELD_OUT,
    _attempt_sizes,
    _check_data,
    _Evaluator,
    _export_sizes,
    _logsm,
    _restore,
    _rounded_sizes,
    _run_specs,
    _score_value,
    _softmax,
    _weights_state,
    _with_validation,
    split_indices,
    too_few_samples,
)
from mconv.drivers.budget.result import (  # noqa: F401  (tests reach the rules' parts)
    BudgetNotMet,
    BudgetResult,
    _result,
    _toml_str,
    _toml_value,
    compare_estimators,
    summary_text,
)
from mconv.drivers.budget.schedule import (  # noqa: F401  (tests reach the rules' parts)
    BIAS_BITS,
    CLUSTER_GROUPS,
    DECAY,
    EPOCHS_RANGE,
    FINAL_RETRAIN,
    PRUNE_STEPS,
    RELEASE_LR,
    RELEASE_STEPS,
    STAGE_MACS,
    _bias_spec,
    _cluster_spec,
    _clustered_names,
    _finetune_spec,
    _prefix,
    _schedule,
    auto_shift,
    cluster_groups,
    default_epochs,
    macs_per_sample,
)
from mconv.drivers.budget.search import (
    _start_index,  # noqa: F401  (tests reach the rules' parts)
    compress_to_budget,
)
from mconv.drivers.budget.sensitivity import (  # noqa: F401  (tests reach the rules' parts)
    _candidates,
    _compressed,
    _fisher,
    _Layer,
    _options_trial,
    _OptionsState,
    _stored_bytes,
)
from mconv.edit.weights import compression_info  # noqa: F401  (tests read records through here)
from mconv.passes.pipeline import make_spec  # noqa: F401  (tests build specs through here)
from mconv.passes.round_fp16 import RoundFp16

__all__ = [
    "BudgetConfig",
    "auto_shift",
    "BIAS_BITS",
    "BITS",
    "BudgetNotMet",
    "BudgetResult",
    "CLUSTER_GROUPS",
    "cluster_groups",
    "compare_estimators",
    "compress_to_budget",
    "DATAFREE_NOTE",
    "datafree_setting",
    "DATAFREE_SNR_DB",
    "datafree_snr_db",
    "DataFreePlan",
    "DECAY",
    "default_epochs",
    "EPOCHS_RANGE",
    "FINAL_RETRAIN",
    "limit_datafree",
    "LIMITED_PASSES",
    "macs_per_sample",
    "MIN_HELD_OUT",
    "PALETTE_RECORD",
    "parse_size",
    "PRE_PASSES",
    "Progress",
    "PRUNE_RECOVERY",
    "PRUNE_STEPS",
    "RELEASE_LR",
    "RELEASE_STEPS",
    "RoundFp16",
    "SPARSITIES",
    "split_indices",
    "STAGE_MACS",
    "summary_text",
    "too_few_samples",
]
