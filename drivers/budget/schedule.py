"""Rule 6: the fine-tuning schedule of an allocation (prune steps, clustering groups, epochs)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir
from mconv.drivers.budget.config import DECAY, Progress  # noqa: F401  (DECAY: the schedule's default)
from mconv.edit.weights import weight_refs
from mconv.passes.base import PassSpec
from mconv.passes.pipeline import make_spec

# Prune steps as exponents of the kept fraction: step i keeps (1 - s) ** f of the weights, so each
# step removes the same share of what is left (0.97: 41%, 17%, 7%, 3% kept; a linear schedule
# jumped from 22% to 3% in its last step, too far for masked retraining to recover).
PRUNE_STEPS = (0.25, 0.5, 0.75, 1.0)


FINAL_RETRAIN = 2  # the masked retraining after the last prune step runs this many times the epochs


# Biases (and other float tensors no layer owns) are clustered to this many bits: the size fit
# measures the room left for the layers, so what the biases save goes to the layers' bits
# (bench/deep_compression.py).
BIAS_BITS = 4


# Incremental quantization (finetune rule 9) between the two centroid fine-tuning stages: stage
# k lets this fraction of every clustered tensor's weights train as floats, then snaps them to
# the codebook. Off by default: on the depthwise CNN it did not beat the paper's schedule
# (bench/results/history.md).
RELEASE_STEPS: tuple[float, ...] = ()


RELEASE_LR = 3e-4


CLUSTER_GROUPS = 6  # rule 6: progressive clustering in at most this many groups (1: all at once)


# Rule 6's default epochs: each fine-tuning stage gets about this many multiply-adds of forward
# passes (the model's per sample times the training samples times the epochs), 3 to 80 epochs.
# LeNet-5 on 750 digits: 20 epochs; the depthwise CNN and the digits MLP on 1,347: 80.
STAGE_MACS = 3.4e10


EPOCHS_RANGE = (3, 80)


RELATIVE_STEP = 0.02  # the budget's Adam rate cap per weight tensor, times its RMS (finetune rule 5)


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
    loss: str = "kl",
) -> PassSpec:
    config: dict[str, object] = {
        "epochs": epochs,
        "lr": lr,
        "seed": seed,
        "holdout": holdout,
        "batch_size": batch,
        "schedule": "cosine",
        "loss": loss,
        "margin": 0.3,
        # finetune rule 5: no weight tensor moves by more than 2% of its RMS in a step (a
        # BN-folded layer a hundred times smaller than the next keeps what it computes)
        "relative_step": RELATIVE_STEP,
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
    plans: Mapping | None = None,
    loss: str = "kl",
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
                loss=loss,
            )
        ]

    cuts = {n: key[2] for n, key in sorted(alloc.items()) if len(key) > 2 and key[2]}
    if cuts:  # rule 14: the output channels removed (the graph rewired), then masked retraining
        stages.append(("structured pruning", [structured_spec(cuts)]))
        stages.append(("structured retraining", tune(epochs, 2e-3)))
    for i, f in enumerate(PRUNE_STEPS):
        table = {
            n: {"sparsity": round(1.0 - (1.0 - key[0]) ** f, 4)}
            for n, key in sorted(alloc.items())
            if key[0] > 0
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
    clustered = cluster_entries(alloc, plans)
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


def cluster_entries(alloc: Mapping, plans: Mapping | None = None) -> dict[str, dict]:
    """The cluster pass's settings per clustered layer of ``alloc``: its bits, or what rule 13
    chose for the option (``plans[(name, sparsity, bits)]``: entropy-constrained clustering)."""
    out = {}
    for n, (s, b, *_) in sorted(alloc.items()):
        if b is not None:
            out[n] = {"skip": False, **((plans or {}).get((n, s, b)) or {"bits": b})}
    return out


def _clustered_names(alloc: Mapping) -> list[str]:
    return [n for n, key in sorted(alloc.items()) if key[1] is not None]


def structured_spec(cuts: Mapping[str, float]) -> PassSpec:
    """Rule 14's stage: per layer the fraction of its output channels removed (L2 norm), the
    consumers rewired (prune rule 4)."""
    return make_spec(
        "prune", {"op_name": {n: {"sparsity": f, "structured": "l2"} for n, f in sorted(cuts.items())}}
    )


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
    from mconv.engines.reference.executor import Executor

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
