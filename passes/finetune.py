"""finetune: retrain a compressed model with the reference executor's gradients.

Deep Compression (Han et al. 2016) retrains after each lossy step; this pass is that step.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import name_of, tensor_of
from mconv.edit.weights import (
    CLUSTER_KEY,
    PRUNED_KEY,
    compression_info,
    layer_weights,
)
from mconv.errors import InputError, show
from mconv.irio import real_inputs
from mconv.metrics import channel_weights, check_finite, check_labels
from mconv.passes.base import MAX_COUNT, Pass, PassContext, PassReport, bounded, register_pass
from mconv.passes.cluster import assign_nearest

# Ops whose initializer inputs are the learnable parameters (weights and biases).
WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
# A bias added after a weight op (MatMul + Add, as importers and exporters often emit it).
BIAS_OPS = frozenset({"Add"})

# --------------------------------------------------------------------------- parameters


@dataclass
class Parameter:
    """One trainable initializer and how it may change.

    mode ``free``: every element trains. ``masked`` (pruned): zeros stay exactly zero, the
    gradient is masked and the weights re-zeroed after each step. ``centroid`` (clustered):
    every nonzero element keeps its cluster index; the cluster's gradient is the sum of its
    elements' gradients (the paper's eq. 3) and the weights are rewritten from the centroids.
    ``release`` (a clustered tensor under ``release = r``, :func:`release_parameter`): the
    elements of ``mask`` train as floats, every other element keeps its value (``fixed``); at
    the pass's end the trained ones take their nearest centroid (:meth:`snap`).
    """

    name: str
    value: ir.Value
    mode: Literal["free", "masked", "centroid", "release"]
    weights: np.ndarray  # float32 master copy, the tensor's shape
    mask: np.ndarray | None = None  # bool, True where the weight may be nonzero
    index: np.ndarray | None = None  # centroid mode: cluster index of each nonzero (in mask order)
    centroids: np.ndarray | None = None  # centroid mode: float64 codebook
    fixed: np.ndarray | None = None  # release mode: the tensor as clustered (kept where ~mask)

    def codebook(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(mask, index, centroids)`` of a centroid-mode parameter (set together)."""
        assert self.mask is not None and self.index is not None and self.centroids is not None, self.name
        return self.mask, self.index, self.centroids

    def kept(self) -> np.ndarray:
        """The mask of a masked or centroid-mode parameter."""
        assert self.mask is not None, self.name
        return self.mask

    @property
    def trained(self) -> np.ndarray:
        """The array the optimizer updates: the centroids, or the whole tensor."""
        return self.codebook()[2] if self.mode == "centroid" else self.weights

    def gradient(self, grad: np.ndarray) -> np.ndarray:
        """The gradient of the trained array from the gradient of the full tensor."""
        if self.mode == "centroid":
            mask, index, centroids = self.codebook()
            return cluster_gradient(grad[mask], index, len(centroids))
        if self.mode in ("masked", "release"):
            return np.where(self.kept(), grad, 0.0)
        return grad

    def commit(self) -> None:
        """Re-derive the full tensor after an optimizer step (centroids -> weights, re-zero)."""
        if self.mode == "centroid":
            mask, index, centroids = self.codebook()
            self.weights[mask] = centroids[index]
        elif self.mode == "masked":
            self.weights[~self.kept()] = 0.0
        elif self.mode == "release":
            assert self.fixed is not None, self.name
            free = self.kept()
            self.weights[~free] = self.fixed[~free]

    def snap(self) -> None:
        """Release mode: every trained element to its nearest centroid (the codebook the tensor
        had when the pass began), so its distinct nonzero values are again that codebook's."""
        if self.mode != "release":
            return
        assert self.fixed is not None and self.centroids is not None, self.name
        free = self.kept()
        self.weights[free] = self.centroids[assign_nearest(self.weights[free], self.centroids)]


def release_parameter(p: Parameter, fraction: float, seed: int) -> Parameter:
    """A centroid-mode parameter in release mode: ``ceil(fraction * nonzeros)`` of its nonzero
    elements (the first of a permutation seeded by ``seed`` and the tensor's name, so a smaller
    fraction with the same seed releases a subset: incremental quantization's nested
    partitions) train as floats; the rest keep their centroids. Other modes are returned as
    they are."""
    if p.mode != "centroid" or fraction <= 0:
        return p
    mask, _, centroids = p.codebook()
    flat = np.flatnonzero(mask)
    order = np.random.default_rng([seed, zlib.crc32(p.name.encode("utf-8"))]).permutation(len(flat))
    chosen = flat[order[: int(np.ceil(min(fraction, 1.0) * len(flat)))]]
    free = np.zeros(mask.size, dtype=bool)
    free[chosen] = True
    return Parameter(
        p.name,
        p.value,
        "release",
        p.weights,
        free.reshape(mask.shape),
        centroids=centroids,
        fixed=p.weights.copy(),
    )


def cluster_gradient(grad_nonzero: np.ndarray, index: np.ndarray, clusters: int) -> np.ndarray:
    """Eq. 3 of Deep Compression: dL/dC_k = sum over weights i with index i == k of dL/dW_i."""
    return np.bincount(index, weights=grad_nonzero.astype(np.float64), minlength=clusters)


def make_parameter(value: ir.Value, facts: Mapping[str, dict] | None = None) -> Parameter:
    """A :class:`Parameter` for an initializer. Its mode comes from the metadata the prune and
    cluster passes record (``mconv.edit.weights``): on the value, or in the model-level
    ``facts`` (``compression_info(model)``) keyed by tensor name."""
    w = np.array(tensor_of(value).numpy(), dtype=np.float32)
    name = name_of(value)
    fact = (facts or {}).get(name, {})
    if CLUSTER_KEY in value.metadata_props or fact.get("bits") is not None:
        mask = w != 0
        centroids, index = np.unique(w[mask], return_inverse=True)
        return Parameter(name, value, "centroid", w, mask, index.ravel(), centroids.astype(np.float64))
    if value.metadata_props.get(PRUNED_KEY) == "1" or fact.get("pruned"):
        return Parameter(name, value, "masked", w, w != 0)
    return Parameter(name, value, "free", w)


def trainable_values(model: ir.Model, frozen: Callable[[ir.Node], bool] | None = None) -> list[ir.Value]:
    """Float initializers that are weights or biases of Conv/ConvTranspose/Gemm/MatMul (and the
    constant operand of an Add that follows one) or embedding tables (a Gather's rank-2 ``data``
    along axis 0), in graph order; nodes where ``frozen(node)`` is true contribute none."""
    graph = model.graph
    inits = graph.initializers
    found: dict[str, ir.Value] = {}

    def take(v: ir.Value | None) -> None:
        if v is None or v.name is None or v.name not in inits or v.name in found or v.const_value is None:
            return
        if v.const_value.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
            return
        found[v.name] = v

    for node in graph:
        if frozen is not None and frozen(node):
            continue
        if node.op_type in WEIGHT_OPS and node.domain in ("", "ai.onnx"):
            for v in node.inputs[1:]:
                take(v)
        elif node.op_type == "Gather" and node.domain in ("", "ai.onnx") and node.inputs:
            table, axis = node.inputs[0], node.attributes.get("axis")
            if table is not None and table.const_value is not None and len(table.const_value.shape) == 2:
                if axis is None or int(axis.value) in (0, -2):  # an embedding (cluster rule 9)
                    take(table)
        elif node.op_type in BIAS_OPS and len(node.inputs) == 2:
            a, b = node.inputs
            for this, other in ((a, b), (b, a)):
                producer = other.producer() if other is not None else None
                if producer is not None and producer.op_type in WEIGHT_OPS:
                    take(this)
    return list(found.values())


# --------------------------------------------------------------------------- losses


def softmax(z: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = z.astype(np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(logits) against integer labels, and d loss / d logits."""
    n = len(labels)
    if n and int(labels.max()) >= logits.shape[1]:  # a graph of unstated class count
        raise InputError(
            f"array 'labels' holds {int(labels.max())}, the model scores {logits.shape[1]} classes",
            where="pass finetune",
            hint=f"labels are whole class numbers in [0, {logits.shape[1]})",
        )
    p = softmax(logits)
    rows = np.arange(n)
    loss = float(-np.log(p[rows, labels] + 1e-12).mean())
    g = p.copy()
    g[rows, labels] -= 1.0
    return loss, (g / n).astype(logits.dtype)


def distillation_kl(student: np.ndarray, teacher: np.ndarray, temperature: float) -> tuple[float, np.ndarray]:
    """Hinton et al.'s distillation loss: T^2 * mean KL(softmax(t/T) || softmax(s/T)).

    The T^2 keeps the gradient's scale independent of T; d loss / d s = T (p_s - p_t) / N.
    """
    t = temperature
    pt, ps = softmax(teacher, t), softmax(student, t)
    n = len(student)
    kl = np.sum(pt * (np.log(pt + 1e-12) - np.log(ps + 1e-12)), axis=1).mean()
    return float(t * t * kl), (t * (ps - pt) / n).astype(student.dtype)


def top1_margin_hinge(student: np.ndarray, teacher: np.ndarray, cap: float = 1.0) -> tuple[float, np.ndarray]:
    """Keeps the teacher's top-1 class ahead: mean over samples of sum over classes j of
    max(0, d - (s_a - s_j)), where a is the teacher's top-1 class and d is half the teacher's
    own top-1 minus top-2 logit margin, capped at ``cap``. Zero when the student ranks the
    teacher's top class first by at least d; d loss / d s is -1/N on a, +1/N on each violator.

    KL and MSE penalise a logit error the same whether or not it flips the top-1 class, so a
    sample the teacher finds close (margin 0.05) loses nothing when it flips; this term does.
    """
    s = student.astype(np.float64)
    n, rows = len(s), np.arange(len(s))
    a = teacher.argmax(1)
    top2 = np.sort(teacher, axis=1)[:, -2:]
    need = np.minimum(0.5 * (top2[:, 1] - top2[:, 0]), cap)
    violation = need[:, None] - (s[rows, a][:, None] - s)
    violation[rows, a] = 0.0
    active = violation > 0
    g = active.astype(np.float64)
    g[rows, a] = -active.sum(axis=1)
    return float(np.sum(violation[active]) / n), (g / n).astype(student.dtype)


def mean_squared_error(student: np.ndarray, teacher: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean squared error, channel-balanced on outputs of three or more dimensions: each
    axis-1 channel's squared errors weighted by :func:`mconv.metrics.channel_weights` of the
    batch's targets, so that a detector's class scores train beside its box coordinates."""
    d = student.astype(np.float64) - teacher
    w = channel_weights(np.asarray(teacher))
    return float(np.mean(w * d * d)), (2.0 * w * d / d.size).astype(student.dtype)


# --------------------------------------------------------------------------- optimizers


def capped_rate(lr: float, relative: float, p: np.ndarray) -> float:
    """Adam's rate for one weight tensor under ``relative_step`` (finetune rule 5): at most
    ``relative`` times the tensor's RMS (its zeros counted), ``lr`` where that is larger, where
    ``relative`` is 0 or where the tensor is all zeros. Computed in float32, as the xla engine
    computes it."""
    if relative <= 0:
        return lr
    p32 = np.asarray(p, dtype=np.float32)
    rms = np.sqrt(np.mean(p32 * p32, dtype=np.float32), dtype=np.float32)
    if not rms > 0:
        return lr
    return float(min(np.float32(lr), np.float32(relative) * rms))


class Optimizer:
    """SGD with momentum or Adam over a dict of arrays, updated in place."""

    def __init__(
        self, kind: str, lr: float, momentum: float, weight_decay: float, relative_step: float = 0.0
    ) -> None:
        self.kind, self.lr, self.momentum, self.weight_decay = kind, lr, momentum, weight_decay
        self.relative_step = relative_step
        self.state: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.steps = 0

    def step(
        self,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        capped: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """One update; Adam's rate of each tensor named in ``capped`` (weights, not codebooks)
        is :func:`capped_rate` of its values before the step."""
        self.steps += 1
        for name, p in params.items():
            g = grads[name].astype(np.float64)
            if self.weight_decay:
                g = g + self.weight_decay * p
            m, v = self.state.get(name) or (np.zeros(p.shape), np.zeros(p.shape))
            if self.kind == "sgd":
                m = self.momentum * m + g
                p -= (self.lr * m).astype(p.dtype)
            else:  # Adam, with bias correction
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                mh = m / (1 - 0.9**self.steps)
                vh = v / (1 - 0.999**self.steps)
                lr = capped_rate(self.lr, self.relative_step, p) if name in capped else self.lr
                p -= (lr * mh / (np.sqrt(vh) + 1e-8)).astype(p.dtype)
            self.state[name] = (m, v)


# --------------------------------------------------------------------------- the loop


@dataclass
class EpochStats:
    epoch: int  # 0: before training
    loss: float | None
    metric: float | None  # None: not measured after this epoch (no held-out samples, rule 5)
    metric_name: str

    def as_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "loss": self.loss,
            "metric": self.metric,
            "metric_name": self.metric_name,
        }


@dataclass
class FinetuneResult:
    epochs: list[EpochStats] = field(default_factory=list)
    tensors: list[dict] = field(default_factory=list)
    loss: str = ""
    train_samples: int = 0
    holdout_samples: int = 0
    notes: list[str] = field(default_factory=list)


def _score_output(model: ir.Model) -> tuple[str, str]:
    """(output name, name of the value the loss reads).

    The class-score output is the first 2-D graph output (else the first output). When it is ``Softmax(z)`` (or LogSoftmax), the
    loss reads ``z``: cross-entropy and distillation are then computed on logits, stably.
    """
    outs = [v for v in model.graph.outputs]
    scores = [v for v in outs if v.shape is None or len(v.shape) == 2]
    out = scores[0] if len(scores) >= 1 else outs[0]
    producer = out.producer()
    if (
        producer is not None
        and producer.op_type in ("Softmax", "LogSoftmax")
        and producer.inputs[0] is not None
    ):
        return name_of(out), name_of(producer.inputs[0])
    return name_of(out), name_of(out)


def _classes(model: ir.Model, out_name: str) -> int | None:
    """The class count of the score output (its last dimension) when the graph states it."""
    for v in model.graph.outputs:
        if name_of(v) == out_name and v.shape is not None and len(v.shape) >= 1:
            last = v.shape[-1]
            return last if isinstance(last, int) and last > 0 else None
    return None


def shift_offsets(n: int, shift: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rule 8's moves of ``n`` samples: whole pixels in ``[-shift, shift]`` along H, then along W."""
    return rng.integers(-shift, shift + 1, n), rng.integers(-shift, shift + 1, n)


def move_images(
    feeds: Mapping[str, np.ndarray], images: list[str], shift: int, dy: np.ndarray, dx: np.ndarray
) -> dict[str, np.ndarray]:
    """Each sample ``i`` of the ``images`` inputs ([N, C, H, W]) moved by ``dy[i]`` pixels along
    H and ``dx[i]`` along W (``|dy|, |dx| <= shift``), zeros shifted in; the other inputs as given."""
    out = dict(feeds)
    for k in images:
        v = feeds[k]
        h, w = v.shape[2:]
        pad = np.pad(v, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
        out[k] = np.stack(
            [
                pad[i, :, shift - dy[i] : shift - dy[i] + h, shift - dx[i] : shift - dx[i] + w]
                for i in range(len(v))
            ]
        )
    return out


def shift_images(
    feeds: Mapping[str, np.ndarray], images: list[str], shift: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Rule 8: each sample of the ``images`` inputs ([N, C, H, W]) moved by a random whole number
    of pixels in ``[-shift, shift]`` along H and along W (the same move for every input of a
    sample), zeros shifted in; the other inputs as given."""
    dy, dx = shift_offsets(len(next(iter(feeds.values()))), shift, rng)
    return move_images(feeds, images, shift, dy, dx)


# Rule 8: the teacher's outputs on every move of every sample are kept only when they take at most
# this many bytes (moves x the teacher's outputs on the unmoved samples).
TEACHER_TABLE_BYTES = 1 << 28


class _MovedTeacher:
    """Rule 8's targets: the teacher's outputs for every sample moved by ``(dy, dx)``, computed
    for one move at a time over all samples (in :func:`_run_batched`'s fixed batches), when a
    batch first needs that move. A value never depends on which batch asked for it first, so a
    saved recipe run again gets the same targets; ``memo`` (the run's
    :attr:`~mconv.passes.base.PassContext.memo`) shares ``moves`` across the run's passes."""

    def __init__(self, teacher_on: Callable, feeds: dict, images: list[str], shift: int, moves: dict) -> None:
        self.teacher_on, self.feeds, self.images, self.shift = teacher_on, feeds, images, shift
        self.moves = moves  # (dy, dx) -> the teacher's outputs on every sample moved so

    def on(self, ddy: int, ddx: int) -> np.ndarray:
        got = self.moves.get((ddy, ddx))
        if got is None:
            n = len(next(iter(self.feeds.values())))
            dy, dx = np.full(n, ddy), np.full(n, ddx)
            got = self.moves[(ddy, ddx)] = self.teacher_on(
                move_images(self.feeds, self.images, self.shift, dy, dx)
            )
        return got

    def targets(self, idx: np.ndarray, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
        first = self.on(int(dy[0]), int(dx[0]))
        out = np.empty((len(idx),) + first.shape[1:], dtype=first.dtype)
        for j, (i, a, b) in enumerate(zip(idx, dy, dx)):
            out[j] = self.on(int(a), int(b))[i]
        return out


def _batches(n: int, batch_size: int, rng: np.random.Generator):
    """One epoch's batches of a seeded permutation, every one ``batch_size`` samples (or ``n``
    when fewer): the last is completed with the epoch's first samples, so a compiled step has
    one batch shape (xla engine rule 3) and every step weighs as much as the others."""
    order = rng.permutation(n)
    for s in range(0, n, batch_size):
        b = order[s : s + batch_size]
        if len(b) < batch_size and n >= batch_size:
            b = np.concatenate([b, order[: batch_size - len(b)]])
        yield b


# What one gradient step's recorded activations may take (the reference engine keeps every
# intermediate value of the batch for the backward pass, and its VJPs about as much again): a
# batch whose estimate is larger runs as micro-batches whose gradients are summed, weighted by
# their share of the batch (every loss is a mean over the samples). A 585 KB text-orientation CNN
# on 48x192 images took 890 MB at batch 32 as one step.
GRAD_STEP_BYTES = 1 << 27
TAPE_FACTOR = 3  # the tape and the VJPs' temporaries against the forward values alone
# A model whose every node's output were this many times its input's bytes could not reach
# GRAD_STEP_BYTES: its activations are not measured (one forward pass of one sample saved).
WIDEST = 64


def activation_bytes(executor, feeds: dict) -> int:
    """Bytes of every intermediate value of one sample's forward pass (``feeds``: one sample)."""
    values = executor.run(feeds, intermediates=True)
    return int(sum(getattr(v, "nbytes", 0) for v in values.values()))


def micro_batch(per_sample: int, batch_size: int) -> int:
    """Samples per gradient micro-batch for :data:`GRAD_STEP_BYTES` (at least 1)."""
    return int(max(1, min(batch_size, GRAD_STEP_BYTES // max(TAPE_FACTOR * per_sample, 1))))


def value_and_grad_micro(executor, feeds: dict, loss_of: Callable, target, wrt: list[str], micro: int):
    """``executor.value_and_grad`` of the batch ``feeds`` in micro-batches of ``micro`` samples:
    the loss and gradients are the chunks' weighted by their share (the losses are means)."""
    n = len(next(iter(feeds.values())))
    if micro >= n:
        return executor.value_and_grad(feeds, loss_of(target), wrt)
    value, grads = 0.0, dict[str, np.ndarray]()
    for s in range(0, n, micro):
        share = min(micro, n - s) / n
        v, g = executor.value_and_grad(
            {k: a[s : s + micro] for k, a in feeds.items()}, loss_of(target[s : s + micro]), wrt
        )
        value += share * float(v)
        for k, a in g.items():
            grads[k] = grads[k] + share * a if k in grads else share * a
    return value, {
        k: a.astype(np.float32, copy=False) if a.dtype == np.float64 else a for k, a in grads.items()
    }


def _run_batched(executor, feeds: dict, names: list[str], batch: int = 256) -> dict[str, np.ndarray]:
    from mconv.engines.reference.executor import Executor

    if not isinstance(executor, Executor):  # a compiled engine: one batch shape, one program
        from mconv.engines.fast import run_batched

        return run_batched(executor, feeds, names, batch)
    n = len(next(iter(feeds.values())))
    parts: dict[str, list] = {k: [] for k in names}
    for s in range(0, n, batch):
        res = executor.run({k: v[s : s + batch] for k, v in feeds.items()}, outputs=names)
        for k in names:
            parts[k].append(res[k])
    return {k: np.concatenate(v) for k, v in parts.items()}


def finetune_model(
    model: ir.Model,
    data: Mapping[str, np.ndarray],
    config: FinetuneConfig,
    *,
    reference_model: ir.Model | None = None,
    frozen: Callable[[ir.Node], bool] | None = None,
    progress: Callable[[str, int, int | None], None] | None = None,
    seed: int = 0,
    memo: dict | None = None,
) -> FinetuneResult:
    """Retrain ``model``'s weights in place on ``data``; see :class:`Finetune` for the rules.
    ``memo`` (a run's :attr:`~mconv.passes.base.PassContext.memo`) keeps the teacher's outputs
    for the run's next fine-tuning passes with the same reference model and data."""
    result = FinetuneResult()
    feeds, labels, out_name, loss_value = _training_data(model, data)
    lifted, _ = layer_weights(model, "finetune", sorted(WEIGHT_OPS))  # rule 10
    if lifted:
        result.notes.append(f"{len(lifted)} weights stored as Constant nodes became initializers")
    params = _parameters(model, config, frozen, seed)
    if not params:
        result.notes.append("no trainable weights (Conv/Gemm/MatMul initializers) found")
        return result
    engine = getattr(config, "engine", "reference")
    device = getattr(config, "device", "cpu")
    from mconv.engines.xla.engine import check_engine

    check_engine(engine, device)
    xla, student = _student(model, params, loss_value, engine, device, memo)
    t = _Teacher.make(
        model, config, feeds, labels, out_name, loss_value, reference_model, memo, progress, result
    )
    batch_of = _batcher(config, seed, feeds, t, result)
    rng = np.random.default_rng([seed if config.seed is None else config.seed, 0x5EED])
    n = len(next(iter(feeds.values())))
    order = rng.permutation(n)
    n_hold = int(round(config.holdout * n)) if n >= 2 else 0
    n_hold = min(max(n_hold, 1 if config.holdout > 0 else 0), n - 1) if n >= 2 else 0
    hold, train = order[:n_hold], order[n_hold:]
    if n_hold == 0:
        hold = train
    result.train_samples, result.holdout_samples = len(train), n_hold
    metric = _metric(student, feeds, hold, labels, t, loss_value)
    loop = _Loop(
        config, student, xla, t.loss_kind, params, _loss_fn(t.loss_kind, loss_value, config), progress
    )
    loop.train(model, feeds, train, n_hold, rng, batch_of, metric, result)
    _write_back(params, result)
    return result


def _training_data(
    model: ir.Model, data: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], np.ndarray | None, str, str]:
    """The feeds (checked finite), the labels (checked against the classes), the scored output
    and the value the loss reads."""
    input_names = [name_of(v) for v in real_inputs(model.graph)]
    missing = [n for n in input_names if n not in data]
    if missing:
        raise InputError(
            f"fine-tuning data has no array for input(s) {', '.join(missing)}",
            where="pass finetune",
            hint=f"the .npz needs arrays named {', '.join(input_names)} (+ optional 'labels')",
        )
    feeds = {n: np.asarray(data[n]) for n in input_names}
    n = len(next(iter(feeds.values())))
    if n == 0:
        raise InputError("fine-tuning data has no samples", where="pass finetune")
    for k, v in feeds.items():
        check_finite(v, k, where="pass finetune")
    out_name, loss_value = _score_output(model)
    labels = data.get("labels")
    if labels is not None:
        labels = check_labels(labels, _classes(model, out_name), where="pass finetune")
    if labels is not None and len(labels) != n:
        raise InputError(f"'labels' has {len(labels)} entries for {n} samples", where="pass finetune")
    return feeds, labels, out_name, loss_value


def _parameters(
    model: ir.Model, config: FinetuneConfig, frozen: Callable[[ir.Node], bool] | None, seed: int
) -> list[Parameter]:
    """The trained weights (rule 9: with ``release``, part of each clustered tensor as floats)."""
    facts = compression_info(model)
    params = [make_parameter(v, facts) for v in trainable_values(model, frozen)]
    release = float(getattr(config, "release", 0.0))
    if release > 0:  # rule 9: part of each clustered tensor trains as floats, then snaps
        release_seed = seed if config.seed is None else config.seed
        params = [release_parameter(p, release, release_seed) for p in params]
    return params


def _student(
    model: ir.Model,
    params: list[Parameter],
    loss_value: str,
    engine: str,
    device: str,
    memo: dict | None = None,
) -> tuple[Any, Any]:
    """The model that trains: the xla engine (with it; compiled once per graph structure for
    the run that owns ``memo``, :mod:`mconv.engines.fast`) or the reference executor,
    holding the parameters' weights."""
    from mconv.engines.reference.executor import Executor

    if engine == "xla":  # the lowered model, jitted training step (engines/xla/engine.py)
        from mconv.engines.fast import xla_engine

        xla = xla_engine(model, [loss_value], device, memo, role="student")
        xla.check_trainable([p.name for p in params])
        for p in params:
            xla.set_weight(p.name, p.weights)
        return xla, xla
    student = Executor(model)
    student.output_names = [loss_value]  # train on the value the loss reads (pre-softmax logits)
    for p in params:
        student.set_initializer(p.name, p.weights)
    return None, student


@dataclass
class _Teacher:
    """The loss and its targets: the teacher's outputs on the feeds (the uncompressed model's,
    computed once, kept in the run's memo), ``on`` for other feeds, rule 8's moved outputs."""

    loss_kind: str
    teacher: np.ndarray | None
    on: Callable[[dict], np.ndarray] | None
    moves: dict
    per_position: bool
    targets: np.ndarray

    @classmethod
    def make(
        cls, model, config, feeds, labels, out_name, loss_value, reference_model, memo, progress, result
    ) -> _Teacher:
        from mconv.engines.reference.executor import Executor

        engine = getattr(config, "engine", "reference")
        device = getattr(config, "device", "cpu")
        teacher = None
        teacher_on = None
        moves: dict = {}
        loss_kind = config.loss
        if loss_kind == "auto":
            loss_kind = "xent" if labels is not None else "kl"
        if loss_kind == "xent" and labels is None:
            raise InputError(
                "loss 'xent' needs labels", where="pass finetune", hint="add 'labels' to the .npz"
            )
        if loss_kind != "xent" or labels is None:
            if progress is not None:
                progress("teacher outputs", 0, None)
            ref = reference_model
            if ref is None:
                result.notes.append(
                    "no reference model: distilling from the model as it is before fine-tuning"
                )
                ref = model
            ref_exec: Any = Executor(ref)
            if engine == "xla":
                from mconv.engines.fast import xla_engine

                ref_out = (
                    loss_value if loss_value in {o.name for nd in ref.graph for o in nd.outputs} else out_name
                )
                ref_exec = xla_engine(ref, [ref_out], device, memo, role="teacher")
            ref_names = {v.name for v in ref.graph.outputs} | {o.name for nd in ref.graph for o in nd.outputs}

            def teacher_on(fd: dict) -> np.ndarray:
                if loss_value in ref_names:
                    return _run_batched(ref_exec, fd, [loss_value])[loss_value].astype(np.float64)
                # the logits were renamed: log-probabilities differ from logits by a constant per row
                probs = _run_batched(ref_exec, fd, [out_name])[out_name].astype(np.float64)
                return np.log(np.maximum(probs, 1e-30))

            # The teacher's outputs (and rule 8's moved ones) are the same for every pass of a run
            # that distils from the same snapshot on the same arrays: kept in the run's memo, with
            # the objects they were computed from (so their ids stay theirs while the memo lives).
            if memo is not None and reference_model is not None:
                key = (
                    "teacher",
                    id(ref),
                    engine,
                    device,
                    loss_value,
                    tuple((k, id(v)) for k, v in feeds.items()),
                )
                moves = memo.setdefault(key, {"from": (ref, list(feeds.values())), "moves": {}})["moves"]
            if (0, 0) not in moves:
                moves[(0, 0)] = teacher_on(feeds)
            teacher = moves[(0, 0)]
        scores_2d = teacher.ndim == 2 if teacher is not None else True
        per_position = (
            config.loss == "kl" and teacher is not None and teacher.ndim > 2 and teacher.shape[-1] >= 2
        )  # rule 4: [N, ..., classes] distilled position by position
        if loss_kind == "kl" and not scores_2d and not per_position:
            loss_kind = "mse"  # not class scores: match the values themselves
        result.loss = loss_kind
        targets = labels if loss_kind == "xent" else teacher
        assert targets is not None  # xent is refused without labels; any other loss has the teacher
        return cls(loss_kind, teacher, teacher_on, moves, per_position, targets)


def _batcher(
    config: FinetuneConfig, seed: int, feeds: dict[str, np.ndarray], t: _Teacher, result: FinetuneResult
) -> Callable[[np.ndarray], tuple[dict, np.ndarray]]:
    """``batch_of(idx)``: the batch's feeds and targets, shifted (rule 8) and/or mixed (rule 6)
    and labelled by the teacher, or as given; each left off (with a note) where it cannot be."""
    teacher, teacher_on, targets = t.teacher, t.on, t.targets
    mix_alpha = float(getattr(config, "mixup", 0.0))
    if mix_alpha > 0 and (t.loss_kind == "xent" or teacher is None):
        result.notes.append("mixup left off: it needs distillation (labels cannot be mixed)")
        mix_alpha = 0.0
    if mix_alpha > 0 and any(np.asarray(v).dtype.kind != "f" for v in feeds.values()):
        result.notes.append("mixup left off: an input is not float (token ids cannot be mixed)")
        mix_alpha = 0.0
    mix_rng = np.random.default_rng([seed if config.seed is None else config.seed, 0x313C])
    shift = int(getattr(config, "shift", 0))
    if shift > 0 and (t.loss_kind == "xent" or teacher is None):
        result.notes.append("shift left off: it needs distillation (the teacher labels the shifted samples)")
        shift = 0
    images = [k for k, v in feeds.items() if np.asarray(v).dtype.kind == "f" and np.asarray(v).ndim == 4]
    if shift > 0 and (not images or any(min(feeds[k].shape[2:]) <= 2 * shift for k in images)):
        result.notes.append(
            f"shift left off: no float input of shape [N, C, H, W] with H and W above {2 * shift}"
        )
        shift = 0
    shift_rng = np.random.default_rng([seed if config.seed is None else config.seed, 0x5A1F])
    moved = None
    if shift > 0 and mix_alpha <= 0 and teacher is not None and teacher_on is not None:
        moves_n = (2 * shift + 1) ** 2
        how = getattr(config, "shift_targets", "auto")
        wanted = how == "table" or (how == "auto" and moves_n <= config.epochs)  # then it costs no more
        if wanted and moves_n * teacher.nbytes <= TEACHER_TABLE_BYTES:
            moved = _MovedTeacher(teacher_on, feeds, images, shift, t.moves)

    def batch_of(idx: np.ndarray) -> tuple[dict, np.ndarray]:
        fb = {k: v[idx] for k, v in feeds.items()}
        if shift > 0:
            dy, dx = shift_offsets(len(idx), shift, shift_rng)
            fb = move_images(fb, images, shift, dy, dx)
        if mix_alpha <= 0 or len(idx) < 2:
            if shift <= 0:
                return fb, targets[idx]
            assert teacher_on is not None  # shift is left off without the teacher
            return fb, (teacher_on(fb) if moved is None else moved.targets(idx, dy, dx))
        lam = mix_rng.beta(mix_alpha, mix_alpha, len(idx))
        perm = mix_rng.permutation(len(idx))
        mixed = {}
        for k, v in fb.items():
            w = lam.reshape((-1,) + (1,) * (v.ndim - 1)).astype(v.dtype)
            mixed[k] = (w * v + (1 - w) * v[perm]).astype(v.dtype)
        assert teacher_on is not None  # mixup is left off without the teacher
        return mixed, teacher_on(mixed)

    return batch_of


def _metric(
    student: Any, feeds: dict, hold: np.ndarray, labels: np.ndarray | None, t: _Teacher, loss_value: str
) -> Callable[[], tuple[float, str]]:
    """Rule 5's held-out metric: accuracy with labels, else top-1 agreement with the teacher,
    else the mean squared error."""
    teacher = t.teacher

    def metric() -> tuple[float, str]:
        got = _run_batched(student, {k: v[hold] for k, v in feeds.items()}, [loss_value])[loss_value]
        if labels is not None and got.ndim == 2:
            return float(np.mean(got.argmax(1) == labels[hold])), "accuracy"
        if teacher is not None and got.ndim == 2:
            return float(np.mean(got.argmax(1) == teacher[hold].argmax(1))), "top1_agreement"
        if teacher is not None and t.per_position:
            return float(np.mean(got.argmax(-1) == teacher[hold].argmax(-1))), "top1_agreement"
        if teacher is None:  # loss xent with labels: nothing to compare other than class scores
            raise InputError(
                f"loss 'xent' needs class scores [N, classes]; '{show(loss_value)}' is {got.ndim}-D",
                where="pass finetune",
                hint="use loss='mse' (matches the model's own outputs) for outputs that are not class scores",
            )
        return float(np.mean((got - teacher[hold]) ** 2)), "mse"

    return metric


def _loss_fn(loss_kind: str, loss_value: str, config: FinetuneConfig) -> Callable[[np.ndarray], Callable]:
    """``loss_fn(target)``: the loss of the outputs and its gradient (rules 3 and 4)."""

    def loss_fn(target: np.ndarray) -> Callable:
        def fn(outputs: dict) -> tuple[float, dict]:
            s = outputs[loss_value]
            if loss_kind == "xent":
                value, g = softmax_cross_entropy(s, target)
            elif loss_kind == "kl" and s.ndim > 2:  # per position over the last axis
                value, g = distillation_kl(
                    s.reshape(-1, s.shape[-1]), target.reshape(-1, s.shape[-1]), config.temperature
                )
                g = g.reshape(s.shape)
            elif loss_kind == "kl":
                value, g = distillation_kl(s, target, config.temperature)
            else:
                value, g = mean_squared_error(s, target)
            if config.margin and loss_kind == "kl" and s.ndim > 2:  # per position (rule 4)
                hinge, gh = top1_margin_hinge(s.reshape(-1, s.shape[-1]), target.reshape(-1, s.shape[-1]))
                value, g = value + config.margin * hinge, g + config.margin * gh.reshape(s.shape)
            elif config.margin and loss_kind != "xent" and s.ndim == 2:
                hinge, gh = top1_margin_hinge(s, target)  # the teacher
                value, g = value + config.margin * hinge, g + config.margin * gh
            return value, {loss_value: g}

        return fn

    return loss_fn


@dataclass
class _Loop:
    """The epochs: batches in the seeded order, the cosine schedule, a step on the engine or on
    the executor's gradients (micro-batched within :data:`GRAD_STEP_BYTES`), the held-out metric
    after each epoch (rule 5)."""

    config: FinetuneConfig
    student: Any
    xla: Any
    loss_kind: str
    params: list[Parameter]
    loss_fn: Callable
    progress: Callable[[str, int, int | None], None] | None
    trainer: Any = None

    def train(self, model, feeds, train, n_hold, rng, batch_of, metric, result) -> None:
        config, progress = self.config, self.progress
        if progress is not None:
            progress("held-out metric before training", 0, None)
        m0, metric_name = metric()
        result.epochs.append(EpochStats(0, None, m0, metric_name))
        last_metric = f", {metric_name} {m0:.4f} before training"
        opt = Optimizer(
            config.optimizer, config.lr, config.momentum, config.weight_decay, config.relative_step
        )
        wrt = [p.name for p in self.params]
        steps_per_epoch = -(-len(train) // config.batch_size)
        total = config.epochs * steps_per_epoch
        done = 0
        self.trainer = (
            None if self.xla is None else _XlaTrainer(self.xla, self.params, self.loss_kind, config)
        )
        micro = self._micro(model, feeds, train)
        last_loss = ""
        for epoch in range(1, config.epochs + 1):
            losses, sizes = [], []
            for b in _batches(len(train), config.batch_size, rng):
                idx = train[b]
                if config.schedule == "cosine":  # decays from lr to 0 over the pass's steps
                    opt.lr = 0.5 * config.lr * (1.0 + np.cos(np.pi * done / total))
                fb, target = batch_of(idx)
                losses.append(self._step(opt, fb, target, wrt, micro))
                sizes.append(len(idx))
                done += 1
                if progress is not None:  # every step: the display decides how often to show it
                    # a compiled engine's losses stay on the device until the epoch ends (reading
                    # one waits for its step: no step could then overlap the next batch's making)
                    running = (
                        f", loss {np.average(losses, weights=sizes):.4f}"
                        if self.trainer is None
                        else last_loss
                    )
                    progress(f"epoch {epoch}/{config.epochs}{running}{last_metric}", done, total)
            if self.trainer is not None:
                self.trainer.commit()  # the trained arrays back into the Parameters and the engine
            loss = float(np.average([float(v) for v in losses], weights=sizes))
            last_loss = f", loss {loss:.4f} in epoch {epoch}"
            if n_hold == 0 and epoch < config.epochs:  # rule 5: the training samples, once at the end
                result.epochs.append(EpochStats(epoch, loss, None, metric_name))
                continue
            if progress is not None:
                progress(f"epoch {epoch}/{config.epochs}: {metric_name} on held-out samples", done, total)
            m, _ = metric()
            result.epochs.append(EpochStats(epoch, loss, m, metric_name))
            last_metric = f", {metric_name} {m:.4f} after epoch {epoch}"
            if progress is not None:
                progress(f"epoch {epoch}/{config.epochs}, loss {loss:.4f}{last_metric}", done, total)

    def _micro(self, model: ir.Model, feeds: dict, train: np.ndarray) -> int:
        """Memory: the micro-batch within which a batch's recorded activations fit."""
        micro = self.config.batch_size
        if self.trainer is None and len(train):  # the batch's recorded activations (GRAD_STEP_BYTES)
            one_in = sum(int(v[:1].nbytes) for v in feeds.values())
            if one_in * max(len(model.graph), 1) * WIDEST * TAPE_FACTOR * micro > GRAD_STEP_BYTES:
                one = activation_bytes(self.student, {k: v[train[:1]] for k, v in feeds.items()})
                micro = micro_batch(one, self.config.batch_size)
        return micro

    def _step(self, opt: Optimizer, fb: dict, target: np.ndarray, wrt: list[str], micro: int) -> Any:
        if self.trainer is not None:
            return self.trainer.step(fb, target, opt.lr)
        params = self.params
        value, grads = value_and_grad_micro(self.student, fb, self.loss_fn, target, wrt, micro)
        opt.step(
            {p.name: p.trained for p in params},
            {p.name: p.gradient(grads[p.name]) for p in params},
            capped={p.name for p in params if p.mode != "centroid" and p.weights.ndim >= 2},
        )
        for p in params:
            p.commit()
            self.student.set_initializer(p.name, p.weights)
        return value


def _write_back(params: list[Parameter], result: FinetuneResult) -> None:
    """The trained weights into the model's initializers (rule 9: released elements snapped
    back on the codebook), one report row per tensor."""
    for p in params:
        p.snap()  # rule 9: the released elements back on the codebook
        old = tensor_of(p.value)
        before = np.asarray(old.numpy(), dtype=np.float32)
        p.value.const_value = ir.Tensor(p.weights.astype(old.dtype.numpy()), name=p.name)
        entry = {
            "name": p.name,
            "mode": p.mode,
            "params": int(p.weights.size),
            "kept": float(np.count_nonzero(p.weights) / max(p.weights.size, 1)),
            "max_change": float(np.max(np.abs(p.weights - before))) if p.weights.size else 0.0,
        }
        if p.mode == "centroid":
            entry["clusters"] = int(len(p.codebook()[2]))
        if p.mode == "release":
            entry["released"] = int(np.count_nonzero(p.kept()))
        result.tensors.append(entry)


class _XlaTrainer:
    """The xla engine's jitted training step over :class:`Parameter` s (engine rule 3)."""

    def __init__(self, engine, params: list[Parameter], loss_kind: str, config) -> None:
        import jax
        from mconv.engines.xla.engine import TrainedParam, codebook_slots

        self.engine, self.params, self.t = engine, params, 0
        specs = [TrainedParam(p.name, p.mode, tuple(p.weights.shape)) for p in params]
        self.fn = engine.train_step(
            specs,
            loss=loss_kind,
            optimizer=config.optimizer,
            momentum=float(config.momentum),
            weight_decay=float(config.weight_decay),
            temperature=float(config.temperature),
            margin=float(config.margin),
            relative_step=float(config.relative_step),
        )
        dev = engine.device
        trained: dict[str, dict[str, np.ndarray]] = {}
        aux: dict[str, np.ndarray] = {}
        for p in params:  # engine rule 3: one form for every mode
            w = p.weights.astype(np.float32)
            book = np.zeros(codebook_slots(len(p.codebook()[2]) if p.mode == "centroid" else 1), np.float32)
            coded = np.zeros(w.shape, bool)
            index = np.zeros(w.shape, np.int32)
            train_c = np.zeros(book.shape, bool)
            if p.mode == "centroid":
                mask, idx, centroids = p.codebook()
                book[: len(centroids)] = centroids
                coded, train_c = mask, np.arange(book.size) < len(centroids)
                index[mask] = idx
                train_w = np.zeros(w.shape, bool)
            elif p.mode in ("masked", "release"):
                train_w = p.kept()
            else:
                train_w = np.ones(w.shape, bool)
            trained[p.name] = {"w": w, "c": book}
            aux.update({f"{p.name}:coded": coded, f"{p.name}:index": index})
            aux.update({f"{p.name}:train_w": train_w, f"{p.name}:train_c": train_c})
        self.trained = jax.device_put(trained, dev)
        zeros = {
            n: {k: (np.zeros_like(a), np.zeros_like(a)) for k, a in t.items()} for n, t in trained.items()
        }
        self.state = jax.device_put(zeros, dev)
        self.aux = jax.device_put(aux, dev)
        names = set(self.trained)
        self.frozen = {n: w for n, w in engine.weights.items() if n not in names}

    def step(self, feeds: Mapping[str, np.ndarray], target: np.ndarray, lr: float) -> Any:
        """One step; its loss as a device scalar (``float()`` of it waits for the step)."""
        self.t += 1
        target = target.astype(np.int32) if target.dtype.kind in "iu" else target.astype(np.float32)
        value, self.trained, self.state = self.fn(
            self.trained,
            self.state,
            self.aux,
            self.frozen,
            self.engine._inputs(feeds),
            target,
            np.float32(lr),
            np.float32(self.t),
        )
        return value

    def commit(self) -> None:
        for p in self.params:
            arr = self.trained[p.name]
            if p.mode == "centroid":
                p.centroids = np.asarray(arr["c"])[: len(p.codebook()[2])].astype(np.float64)
                p.weights[p.mask] = p.centroids[p.index]
            else:
                p.weights[...] = np.asarray(arr["w"])
                p.commit()
            self.engine.set_weight(p.name, p.weights)


@register_pass("finetune")
class Finetune(Pass):
    """Retrain the weights on ``ctx.data`` with the reference executor's gradients.

    1. Without ``ctx.data`` the pass changes nothing and says so in a note (recipes list it
       unconditionally; it acts only when ``--data`` is given).
    2. Trainable: float initializers feeding Conv/ConvTranspose/Gemm/MatMul (weights and biases)
       and the constant operand of an Add right after one (a bias). ``freeze=true`` on a node
       (per op type / op name override) keeps its tensors fixed.
    3. Per tensor, from the metadata earlier passes recorded on the initializer's value:
       - clustered (``mconv.cluster``): **centroid fine-tuning**. Each nonzero weight keeps
         its cluster (its distinct value's index); dL/dC_k = sum of dL/dW_i over the cluster (the
         paper's eq. 3); centroids are updated and the weights rewritten from them, so the
         tensor's distinct nonzero values never grow in number and zeros stay exactly zero.
       - pruned (``mconv.pruned``): **masked retraining**. The gradient is masked and the
         weights re-zeroed after every step: pruned weights stay exactly zero.
       - otherwise every element trains.
    4. Loss (``loss="auto"``): with ``labels`` in the data, softmax cross-entropy on the class-score
       output; without, **distillation** from the uncompressed model (``ctx.reference_model``, set
       by the pipeline to the model before its first pass): Hinton's T^2 * KL(softmax(t/T) ||
       softmax(s/T)) with ``temperature`` T on class scores, MSE on other outputs
       (channel-balanced on three or more dimensions, :func:`mean_squared_error`). When the
       score output is Softmax(z), the loss reads z (logits), not the probabilities.
       ``margin = w > 0`` adds w times :func:`top1_margin_hinge` to the KL: a sample whose
       top-1 class the student ranks below another (or ahead by less than half the teacher's
       own margin) costs in proportion, so near-ties are kept on the teacher's side, which
       top-1 agreement counts and KL alone does not. ``loss = "kl"`` asked for on an output of
       more than two dimensions distils per position over its last axis (a language model's
       ``[N, T, vocab]`` logits: the KL averaged over the N x T positions, and ``margin``'s
       hinge too, so a CTC recognizer's positions near a tie between the blank and a character
       stay on the teacher's side), and the held-out metric is the top-1 agreement per position; ``auto`` keeps MSE there (a segmentation
       map's classes are not on its last axis).
    5. Optimizer ``sgd`` (with ``momentum``) or ``adam``; ``schedule = "cosine"`` decays the
       rate from ``lr`` to 0 over the pass's steps (``"constant"``, the default, keeps it).
       Adam moves every element of a tensor by about its rate on its first steps, whatever the
       tensor's scale; after ``fuse-bn`` one layer's weights may be a hundred times smaller than
       the next's (RMS 0.0026 beside 0.52 in PP-OCRv4's recognizer), and a step of 1e-3 there
       undoes the layer. So the Adam rate of each weight tensor of two or more dimensions is
       at most ``relative_step`` times its RMS at that step (:func:`capped_rate`; default 0:
       off; the budget search's stages use 0.02; biases and centroids keep ``lr``);
       ``epochs`` over a seeded shuffle in
       ``batch_size`` batches (the last one of an epoch completed with the epoch's first
       samples, so every step has one shape); ``holdout`` of the data (a seeded slice) is never trained on and
       measures accuracy (with labels) or top-1 agreement with the teacher after every epoch.
       With ``holdout = 0`` the metric is taken on the training samples before training and
       after the last epoch only (the epochs between report their loss).
       Deterministic for a given ``seed`` (default: the pipeline's seed).
    6. ``mixup = a > 0`` (distillation only: a teacher-based loss on float inputs) trains each
       batch on mixed samples instead: ``x' = l * x_i + (1 - l) * x_j`` with ``j`` a shuffle of
       the batch and ``l ~ Beta(a, a)`` per sample, and the teacher's outputs on ``x'`` as the
       targets (one teacher run per batch). The samples between the calibration samples are
       where a small calibration set says nothing and the compressed model departs from the
       teacher; labels cannot be mixed, so with ``loss = "xent"`` (or integer inputs) it is
       left off with a note. The held-out metric stays on the unmixed samples.
    7. ``engine = "xla"`` runs the same training on the model lowered to jax
       (:mod:`mconv.engines.xla.engine`): the whole step (weights rebuilt from masks or
       centroids, loss, gradient, optimizer update, re-zeroing) is one jitted program, on
       ``device = "cpu"`` or ``"cuda"``. Same batches, same rules; float32 arithmetic
       throughout (the reference optimizer keeps float64 state), so results agree to rounding.
    8. ``shift = k > 0`` (distillation only, float inputs of shape ``[N, C, H, W]`` with H and W
       above ``2k``) moves every training sample of a batch by a random whole number of pixels
       in ``[-k, k]`` along H and W (zeros shifted in; seeded) and trains on the teacher's
       outputs for the moved samples: one teacher run per batch (``shift_targets = "batch"``),
       or once per move for every sample (``"table"``, :class:`_MovedTeacher`, when the table
       takes at most :data:`TEACHER_TABLE_BYTES`), kept in the run's ``memo`` for its next
       passes: a run of many stages then pays ``(2k + 1)**2`` teacher runs per sample, not one
       per epoch. ``"auto"`` is the table when the pass has at least as many epochs as there
       are moves (``(2k + 1)**2``), so that it costs no more on its own. The choice depends on
       the pass's own settings and data only, so a saved recipe run again (without the passes
       a search rolled back) gets the same targets. It tells the compressed model
       what the original does near the calibration samples, as the original's own training
       data augmentation did; with ``mixup`` too, the moved samples are mixed. Left off with a
       note where it does not apply. The held-out metric stays on the unmoved samples.
    9. ``release = r > 0`` (incremental quantization, Zhou et al. 2017): in every clustered
       tensor a seeded ``r`` of the nonzero weights (:func:`release_parameter`; a smaller ``r``
       with the same seed releases a subset) train as floats while the others keep their
       centroids, so the released ones make up for the clustering error of the rest; at the end
       each released weight takes its nearest centroid of the codebook the tensor came with.
       The tensor then has no more distinct values than before and its zeros stay zero; weights
       may change cluster. Without ``release`` clustered tensors train their centroids (rule 3).
    10. Weights stored as ``Constant`` nodes (paddle2onnx stores every weight so) become
        initializers of the same name before training (``prune`` rule 7); when no layer's
        weight is an initializer but some are computed from constants (a Transpose, Reshape or
        DequantizeLinear of one), the pass refuses with one line naming them and what to run
        first (``fold``), rather than training nothing.
    """

    lossless = False
    uses_reference_model = True  # the pipeline snapshots the model before its first pass

    @dataclass
    class Config:
        optimizer: Literal["sgd", "adam"] = "adam"
        lr: float = bounded(3e-3, 0, None, lo_open=True)
        relative_step: float = bounded(0.0, 0, None)
        momentum: float = bounded(0.9, 0, 1)
        weight_decay: float = bounded(0.0, 0, None)
        epochs: int = bounded(5, 0, 10**5)
        batch_size: int = bounded(32, 1, MAX_COUNT)
        seed: int | None = bounded(None, 0, 2**63 - 1)
        holdout: float = bounded(0.1, 0, 1, hi_open=True)
        loss: Literal["auto", "xent", "kl", "mse"] = "auto"
        temperature: float = bounded(2.0, 0, None, lo_open=True)
        freeze: bool = False
        schedule: Literal["constant", "cosine"] = "constant"
        margin: float = bounded(0.0, 0, None)
        mixup: float = bounded(0.0, 0, None)
        shift: int = bounded(0, 0, 1 << 16)  # left off unless below half the images' height and width
        release: float = bounded(0.0, 0, 1)
        shift_targets: Literal["auto", "table", "batch"] = "auto"
        engine: Literal["reference", "xla"] = "reference"
        device: Literal["cpu", "cuda"] = "cpu"

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        if ctx.data is None:
            return self.report(False, notes=["skipped: no data (give --data to fine-tune)"])
        if (
            config.epochs < 0
            or config.batch_size < 1
            or not 0 <= config.holdout < 1
            or config.lr <= 0
            or config.margin < 0
            or config.mixup < 0
            or config.shift < 0
            or not 0 <= config.release <= 1
        ):
            raise InputError(
                f"bad finetune settings: epochs={config.epochs}, batch_size={config.batch_size}, "
                f"holdout={config.holdout}, lr={config.lr}, margin={config.margin}, mixup={config.mixup}, "
                f"shift={config.shift}, release={config.release}",
                where="pass finetune",
                hint="epochs >= 0, batch_size >= 1, 0 <= holdout < 1, lr > 0, margin >= 0, mixup >= 0, "
                "shift >= 0, 0 <= release <= 1",
            )

        def frozen(node: ir.Node) -> bool:
            return bool(ctx.config_for(node).freeze) if ctx.spec is not None else False

        res = finetune_model(
            model,
            ctx.data,
            config,
            reference_model=ctx.reference_model,
            frozen=frozen,
            progress=ctx.tick,  # shown under the pipeline's stage ("pass 3/5 finetune: epoch ...")
            seed=ctx.seed,
            memo=ctx.memo,
        )
        notes = list(res.notes)
        if res.epochs:
            notes.append(
                f"loss {res.loss}; {res.train_samples} training samples, {res.holdout_samples} held out"
            )
        for e in res.epochs:
            loss = "-" if e.loss is None else f"{e.loss:.4f}"
            measured = "" if e.metric is None else f", {e.metric_name} {e.metric:.4f}"
            notes.append(f"epoch {e.epoch}: loss {loss}{measured}")
        return self.report(bool(res.tensors), notes=notes, tensors=res.tensors)


FinetuneConfig = Finetune.Config
