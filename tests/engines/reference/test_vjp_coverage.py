"""Every registered VJP meets the finite-difference check.

Most ops are checked beside their forwards (test_<family>.py); the ops here had none there. The
last test holds the suite to it: every op with a registered VJP is named in a test that uses
``check_vjp`` (or, for control flow, the executor's gradient tests), so a new VJP without a check
fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from gradcheck import check_vjp
from mconv.engines.reference.ops import REGISTRY, OpContext, lookup

RNG = np.random.default_rng(41)
HERE = Path(__file__).resolve().parent


def test_det():
    # well-conditioned batches: the determinant's gradient is det * inv(A)^T
    a = RNG.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    check_vjp("Det", [a], {})


@pytest.mark.parametrize("like", [np.float32, np.float64])
def test_castlike(like):
    check_vjp("CastLike", [RNG.standard_normal((3, 4)), np.zeros(1, like)], {}, wrt=[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("scale_shape", "attrs"),
    [((), {}), ((3,), {"axis": 1}), ((4,), {"axis": 0}), ((2, 3), {"axis": 0, "block_size": 2})],
)
def test_dequantize_linear_scale(scale_shape, attrs):
    # the forward computes in float32: a wider step and tolerance than float64 ops take
    x = RNG.integers(-100, 100, (4, 3)).astype(np.int8)
    scale = RNG.uniform(0.01, 0.1, scale_shape)
    zero = RNG.integers(-3, 3, scale_shape).astype(np.int8)
    check_vjp("DequantizeLinear", [x, scale, zero], attrs, wrt=[1], opset=21, eps=1e-3, rtol=1e-3, atol=1e-4)


def test_dropout_in_inference_is_identity():
    x = RNG.standard_normal((3, 5))
    check_vjp("Dropout", [x], {}, outputs=[0])


def test_identity():
    check_vjp("Identity", [RNG.standard_normal((2, 3, 4))], {})


def test_scatter():
    data = RNG.standard_normal((3, 4))
    idx = np.array([[1, 0, 2, 3], [0, 2, 3, 1]], np.int64)  # no duplicates: ONNX leaves their order open
    upd = RNG.standard_normal((2, 4))
    check_vjp("Scatter", [data, idx, upd], {"axis": 1}, opset=9, wrt=[0, 2])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(mode):
    x = RNG.standard_normal((1, 2, 3, 4))
    scales = np.array([1.0, 1.0, 2.0, 1.5])
    check_vjp("Upsample", [x, scales], {"mode": mode}, opset=9, wrt=[0])


def _fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for j in range(x.size):
        e = np.zeros(x.size)
        e[j] = eps
        g.reshape(-1)[j] = (f(x + e.reshape(x.shape)) - f(x - e.reshape(x.shape))) / (2 * eps)
    return g


@pytest.mark.parametrize("position", [0, 2, -1])
def test_sequence_construct_then_at(position):
    """SequenceConstruct's and SequenceAt's VJPs, chained as the executor chains them, against
    central differences of <cot, SequenceAt(SequenceConstruct(a, b, c), position)>."""
    construct, at = lookup("SequenceConstruct"), lookup("SequenceAt")
    xs = [RNG.standard_normal((2, 3)) for _ in range(3)]
    pos = np.array(position, np.int64)
    cot = RNG.standard_normal((2, 3))

    def forward(parts):
        ctx = OpContext(opset=17, rng=np.random.default_rng(0))
        (seq,) = construct.forward(list(parts), {}, ctx)
        (out,) = at.forward([seq, pos], {}, ctx)
        return seq, out

    ctx = OpContext(opset=17, rng=np.random.default_rng(0))
    seq, out = forward(xs)
    g_seq = at.vjp([seq, pos], {}, [out], [cot], ctx)[0]
    grads = construct.vjp(list(xs), {}, [seq], [g_seq], ctx)
    for k in range(3):

        def loss(xk, k=k):
            parts = list(xs)
            parts[k] = xk
            return float(np.sum(forward(parts)[1] * cot))

        want = _fd(loss, xs[k])
        got = np.zeros_like(xs[k]) if grads[k] is None else np.asarray(grads[k], np.float64)
        assert np.allclose(got, want, rtol=1e-6, atol=1e-8), (k, got, want)


def test_every_registered_vjp_is_checked():
    vjps = sorted(op for (op, _), d in REGISTRY.items() if d.vjp is not None)
    named: set[str] = set()
    for path in HERE.parent.parent.rglob("test_*.py"):
        text = path.read_text()
        if "check_vjp" not in text and "grad" not in text:
            continue
        named |= {
            n.value
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
    assert [op for op in vjps if op not in named] == []
