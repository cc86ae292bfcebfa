"""The budget search on a per-position classifier ``[N, T, classes]`` (a CTC text recognizer's
softmax, issue 45 item 3): the Fisher of rule 3 is the cross-entropy at every position against
the original's top-1 class there, on either engine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mconv.drivers.budget.evaluation import _Evaluator
from mconv.drivers.budget.sensitivity import _fisher

from tests.engines.xla.test_engine import blobs, tagger


def _by_hand(model, x, ref, batch):
    """B * mean(g_B**2) of the per-position cross-entropy against ``ref``'s top-1, with the
    tagger's forward written out in jnp (not the engine under test)."""
    w = {n: jnp.asarray(v.const_value.numpy()) for n, v in model.graph.initializers.items()}
    target = ref.argmax(-1)

    def loss(w2, xb, tb):
        h = jax.nn.relu(xb @ w["w1"] + w["b1"])
        logp = jax.nn.log_softmax(h @ w2 + w["b2"], axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tb[..., None], axis=-1))

    acc, steps = np.zeros(w["w2"].shape), 0
    for s in range(0, len(x), batch):
        g = np.asarray(jax.grad(loss)(w["w2"], x[s : s + batch], target[s : s + batch]), np.float64)
        acc += np.square(g) * len(x[s : s + batch])
        steps += 1
    return acc / steps


@pytest.mark.parametrize("engine", ["reference", "xla"])
def test_the_fisher_of_a_per_position_output_is_the_cross_entropy_at_every_position(engine):
    rng = np.random.default_rng(41)
    x, _ = blobs(rng, 24 * 6)
    x = x.reshape(24, 6, 4)
    model = tagger(np.random.default_rng(7))
    probe = _Evaluator({"x": x}, "probs", np.zeros((0,)), None)
    ev = _Evaluator({"x": x}, "probs", probe.outputs(model, np.arange(24)), None, engine=engine, memo={})
    assert ev.is_sequence
    got = _fisher(model, ev, np.arange(24), ["w2"], batch=8)["w2"]
    want = _by_hand(model, x, ev.reference, 8)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-9 * float(want.max()))
