"""The xla engine: the model lowered with the export rules (:mod:`mconv.engines.xla.lower`), run
and differentiated by jax, on the CPU or a GPU.

The reference executor (numpy, hand-written VJPs) stays the oracle; this engine is the fast
path for fine-tuning, sensitivity sweeps and ``mconv run --engine xla``.

Rules:

1. The graph is lowered once with weights as arguments (never baked), so swapping a weight
   (a sweep point, an optimizer step) never recompiles. A program is compiled per distinct set
   of input shapes (jit's cache); batches of one size share one program.
2. Any value of the graph may be read (``outputs``): the loss reads the pre-softmax logits.
3. :meth:`XlaEngine.value_and_grad` is ``jax.value_and_grad`` of a jnp loss of the outputs
   with respect to named weights. :meth:`XlaEngine.train_step` is one jitted program for the
   whole training step: weights rebuilt from the trained arrays (masked: ``where(mask, w, 0)``;
   clustered: each weight gathers its centroid by cluster index, so jax's gradient of the
   centroids IS the per-cluster sum of eq. 3), the loss (cross-entropy, distillation KL, MSE,
   the top-1 margin hinge), its gradient, the optimizer update (SGD with momentum or Adam,
   weight decay) and the re-zeroing of pruned weights. Arguments are donated where jax can
   reuse them (the trained arrays and optimizer state).
   Every tensor trains in one form whatever its mode: a float array ``w`` of its shape and a
   codebook ``c`` of :func:`codebook_slots` entries; the tensor is ``where(coded, c[index],
   w)``, and masks say which elements of ``w`` and which entries of ``c`` train (free: all of
   ``w``; pruned: the nonzeros of ``w``; clustered: the codebook; released: the released
   elements of ``w``). Elements that do not train keep their values. So the program depends on
   which tensors train, not on their modes, codebook sizes or sparsity, and a search that prunes
   and clusters layer by layer compiles one step per batch shape.
4. ``device``: ``cpu`` or ``cuda``; a device that is not there is an InputError (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, show

DEVICES = ("cpu", "cuda")
ENGINES = ("reference", "xla")


def check_engine(engine: str, device: str = "cpu") -> None:
    """Refuse an unknown engine or device name (one line, exit 2)."""
    if engine not in ENGINES:
        raise InputError(f"unknown engine '{show(engine)}'", where="--engine", hint="choose reference or xla")
    if device not in DEVICES:
        raise InputError(f"unknown device '{show(device)}'", where="--device", hint="choose cpu or cuda")
    if device != "cpu" and engine != "xla":
        raise InputError(f"--device {device} needs the xla engine", where="--device", hint="add --engine xla")


def jax_device(device: str = "cpu") -> Any:
    import jax

    if device not in DEVICES:
        raise InputError(f"unknown device '{show(device)}'", where="--device", hint="choose cpu or cuda")
    try:
        return jax.devices(device)[0]
    except RuntimeError:
        raise InputError(
            f"no {device} device is available to jax",
            where="--device",
            hint="use --device cpu, or install jax with CUDA support (jax[cuda12])",
        ) from None


@dataclass
class TrainedParam:
    """How one weight argument is rebuilt from the array the optimizer trains (engine rule 3)."""

    name: str
    mode: str  # "free", "masked", "centroid", "release"
    shape: tuple[int, ...]


CODEBOOK_SLOTS = 256  # a codebook of up to 8 bits fits; bigger ones round up to a power of two


def codebook_slots(k: int) -> int:
    """The padded length of a trained codebook of ``k`` centroids (rule 3)."""
    return max(CODEBOOK_SLOTS, 1 << max(k - 1, 0).bit_length())


class XlaEngine:
    """A model lowered to one jax function of (inputs, weights), with chosen ``outputs``."""

    def __init__(self, model: ir.Model, outputs: Sequence[str] | None = None, device: str = "cpu") -> None:
        import jax
        from mconv.engines.xla.jit import jit
        from mconv.engines.xla.lower import lower_graph

        self.device = jax_device(device)
        lowered = lower_graph(model)
        known = {v.name for v in model.graph.outputs} | {o.name for nd in model.graph for o in nd.outputs}
        names = list(outputs) if outputs else list(lowered.output_names)
        bad = [n for n in names if n not in known]
        if bad:
            raise InputError(
                f"model has no value named '{show(bad[0])}'", hint="name a node output of the model"
            )
        lowered.output_names = names
        self.lowered = lowered
        self.input_names = list(lowered.input_names)
        self.output_names = names
        self.weight_names = list(lowered.weight_names)
        self._fn = lowered.function()
        self.weights: dict[str, Any] = {
            n: jax.device_put(np.asarray(a), self.device) for n, a in lowered.weights()
        }
        self._forward = jit(self._call)  # runtime rule 4: the CPU compile options
        self._steps: dict[tuple, Callable] = {}

    # ----------------------------------------------------------------------------- forward

    def _call(self, inputs: tuple, weights: Mapping[str, Any]) -> tuple:
        return self._fn(*inputs, *[weights[n] for n in self.weight_names])

    def _inputs(self, feeds: Mapping[str, np.ndarray]) -> tuple:
        import jax

        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(
                f"no value for input(s) {', '.join(show(n) for n in missing)}",
                hint=f"the model's inputs are: {', '.join(show(n) for n in self.input_names)}",
            )
        return tuple(jax.device_put(np.asarray(feeds[n]), self.device) for n in self.input_names)

    def check_trainable(self, names: Sequence[str]) -> None:
        bad = [n for n in names if n not in self.weights]
        if bad:
            raise InputError(
                f"weight '{show(bad[0])}' is not a weight argument of the lowered program",
                where=f"tensor '{show(bad[0])}'",
                hint="a shape or index tensor cannot be trained; use --engine reference",
            )

    def set_weight(self, name: str, array: np.ndarray) -> None:
        import jax

        self.check_trainable([name])
        old = self.weights[name]
        self.weights[name] = jax.device_put(np.asarray(array, dtype=old.dtype), self.device)

    def get_weight(self, name: str) -> np.ndarray:
        return np.asarray(self.weights[name])

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        values = self._forward(self._inputs(feeds), self.weights)
        got = dict(zip(self.output_names, (np.asarray(v) for v in values)))
        return {n: got[n] for n in outputs} if outputs else got

    def value_and_grad(
        self, feeds: Mapping[str, np.ndarray], loss: Callable[[dict], Any], wrt: Sequence[str]
    ) -> tuple[float, dict[str, np.ndarray]]:
        """``loss(outputs) -> jnp scalar``; its value and gradients w.r.t. the weights ``wrt``."""
        import jax
        from mconv.engines.xla.jit import jit

        self.check_trainable(wrt)
        inputs = self._inputs(feeds)
        rest = {n: w for n, w in self.weights.items() if n not in wrt}

        def f(trained: dict, rest: dict, inputs: tuple) -> Any:
            values = self._call(inputs, {**rest, **trained})
            return loss(dict(zip(self.output_names, values)))

        # one program for the call (jit), not one dispatch per op
        value, grads = jit(jax.value_and_grad(f))({n: self.weights[n] for n in wrt}, rest, inputs)
        return float(value), {n: np.asarray(g) for n, g in grads.items()}

    # ----------------------------------------------------------------------------- training

    def train_step(
        self,
        params: Sequence[TrainedParam],
        *,
        loss: str,
        optimizer: str,
        momentum: float,
        weight_decay: float,
        temperature: float,
        margin: float,
        relative_step: float = 0.0,
    ) -> Callable:
        """The jitted step ``(trained, state, aux, frozen, inputs, target, lr, t) -> (loss, trained,
        state)``: ``frozen`` holds every other weight argument (arguments, not constants, so
        :meth:`set_weight` is seen without recompiling)."""
        import jax
        import jax.numpy as jnp
        from mconv.engines.xla.jit import jit

        # Rule 3: the program depends on the names trained, not on their modes or codebooks.
        key = (
            tuple(p.name for p in params),
            loss,
            optimizer,
            momentum,
            weight_decay,
            temperature,
            margin,
            relative_step,
        )
        if key in self._steps:
            return self._steps[key]
        trained_names = [p.name for p in params]
        self.check_trainable(trained_names)
        dtypes = {n: self.weights[n].dtype for n in trained_names}

        def full(name: str, arr: Mapping[str, Any], aux: Mapping[str, Any]) -> Any:
            return jnp.where(aux[name + ":coded"], arr["c"][aux[name + ":index"]], arr["w"])

        def objective(trained: dict, aux: dict, frozen: dict, inputs: tuple, target: Any) -> Any:
            weights = dict(frozen)
            for n, arr in trained.items():
                weights[n] = full(n, arr, aux).astype(dtypes[n])
            s = self._call(inputs, weights)[0]
            return loss_value(s, target, loss, temperature, margin)

        def update(p: Any, g: Any, m: Any, v: Any, lr: Any, t: Any, keep: Any, capped: bool) -> tuple:
            if weight_decay:
                g = g + weight_decay * p
            if optimizer == "sgd":
                m1, v1 = momentum * m + g, v
                p1 = p - lr * m1
            else:
                m1 = 0.9 * m + 0.1 * g
                v1 = 0.999 * v + 0.001 * g * g
                mh = m1 / (1 - 0.9**t)
                vh = v1 / (1 - 0.999**t)
                if capped and relative_step > 0:  # finetune rule 5 (capped_rate)
                    rms = jnp.sqrt(jnp.mean(p * p))
                    lr = jnp.where(rms > 0, jnp.minimum(lr, jnp.float32(relative_step) * rms), lr)
                p1 = p - lr * mh / (jnp.sqrt(vh) + 1e-8)
            # elements that do not train keep their value (pruned zeros, coded or fixed ones)
            return jnp.where(keep, p1, p), jnp.where(keep, m1, m), jnp.where(keep, v1, v)

        def step(
            trained: dict, state: dict, aux: dict, frozen: dict, inputs: tuple, target: Any, lr: Any, t: Any
        ):
            value, grads = jax.value_and_grad(objective)(trained, aux, frozen, inputs, target)
            new_trained, new_state = {}, {}
            for n, arr in trained.items():
                new_arr, new_st = {}, {}
                for part, keep in (("w", aux[n + ":train_w"]), ("c", aux[n + ":train_c"])):
                    m, v = state[n][part]
                    p, m, v = update(
                        arr[part], grads[n][part], m, v, lr, t, keep, part == "w" and arr["w"].ndim >= 2
                    )
                    new_arr[part], new_st[part] = p, (m, v)
                new_trained[n], new_state[n] = new_arr, new_st
            return value, new_trained, new_state

        fn = jit(step, donate_argnums=(0, 1))
        self._steps[key] = fn
        return fn


def loss_value(s: Any, target: Any, kind: str, temperature: float = 2.0, margin: float = 0.0) -> Any:
    """The fine-tuning losses of :mod:`mconv.passes.finetune` in jnp (same definitions).

    ``target``: integer labels (``xent``) or the teacher's values (``kl``, ``mse``). ``kl`` is
    over the last axis, averaged over every other: on ``[N, classes]`` per sample, on
    ``[N, T, classes]`` (a CTC recognizer's, a language model's logits) per position, as
    finetune rule 4 reshapes it; a softmax over axis 1 there would be over the positions, a
    distribution the model never states, and distilling it collapsed PP-OCRv4's recognizer."""
    import jax
    import jax.numpy as jnp

    s = s.astype(jnp.float32)
    if kind == "xent":
        p = jax.nn.softmax(s, axis=1)
        picked = jnp.take_along_axis(p, target.astype(jnp.int32)[:, None], axis=1)[:, 0]
        return -jnp.mean(jnp.log(picked + 1e-12))
    teacher = target.astype(jnp.float32)
    if kind == "kl":
        t = temperature
        pt = jax.nn.softmax(teacher / t, axis=-1)
        ps = jax.nn.softmax(s / t, axis=-1)
        value = t * t * jnp.mean(jnp.sum(pt * (jnp.log(pt + 1e-12) - jnp.log(ps + 1e-12)), axis=-1))
    else:  # channel-balanced on 3-D and larger (mconv.metrics.channel_weights)
        d = s - teacher
        w = 1.0
        if s.ndim >= 3:
            axes = (0, *range(2, s.ndim))
            ms = jnp.mean(jnp.square(teacher), axis=axes, keepdims=True)
            mean = jnp.mean(ms)
            w = jnp.where(mean > 0, mean / jnp.maximum(ms, 1e-6 * mean), 1.0)
        value = jnp.mean(w * d * d)
    if margin and s.ndim == 2:
        value = value + margin * margin_hinge(s, teacher)
    elif margin and kind == "kl" and s.ndim > 2:  # per position, as finetune rule 4
        value = value + margin * margin_hinge(s.reshape(-1, s.shape[-1]), teacher.reshape(-1, s.shape[-1]))
    return value


def margin_hinge(s: Any, teacher: Any, cap: float = 1.0) -> Any:
    """:func:`mconv.passes.finetune.top1_margin_hinge` in jnp."""
    import jax.numpy as jnp

    n = s.shape[0]
    rows = jnp.arange(n)
    a = jnp.argmax(teacher, axis=1)
    top2 = jnp.sort(teacher, axis=1)[:, -2:]
    need = jnp.minimum(0.5 * (top2[:, 1] - top2[:, 0]), cap)
    violation = need[:, None] - (s[rows, a][:, None] - s)
    violation = violation.at[rows, a].set(0.0)
    return jnp.sum(jnp.maximum(violation, 0.0)) / n
