"""RNN, GRU, LSTM: forward against onnxruntime, VJPs (backpropagation through time) by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from onenode import oracle, ours

RNG = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
T, B, I, H = 3, 2, 3, 2


def make_inputs(
    op, direction="forward", *, bias=True, lens=None, init=False, peep=False, layout=0, dtype=np.float32
):
    nd = 2 if direction == "bidirectional" else 1
    G = GATES[op]
    r = np.random.default_rng(1)

    def u(*shape):
        return r.uniform(-0.7, 0.7, shape).astype(dtype)

    x = u(B, T, I) if layout else u(T, B, I)
    inputs = [x, u(nd, G * H, I), u(nd, G * H, H), u(nd, 2 * G * H) if bias else None]
    inputs.append(None if lens is None else np.array(lens, np.int32))
    st = (B, nd, H) if layout else (nd, B, H)
    inputs.append(u(*st) if init else None)
    if op == "LSTM":
        inputs.append(u(*st) if init else None)
        inputs.append(u(nd, 3 * H) if peep else None)
    while inputs[-1] is None:
        inputs.pop()
    return inputs


CASES = [
    ("forward", {}),
    ("reverse", {"init": True}),
    ("bidirectional", {"init": True}),
    ("bidirectional", {"lens": [2, 3], "init": True}),
    ("forward", {"lens": [3, 1]}),
    ("forward", {"bias": False}),
]


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction,kw", CASES)
def test_recurrent_forward_matches_onnxruntime(op, direction, kw):
    inputs = make_inputs(op, direction, **kw)
    attrs = {"hidden_size": H, "direction": direction}
    n_out = 3 if op == "LSTM" else 2
    want = oracle(op, inputs, attrs, n_out=n_out)
    got = ours(op, inputs, attrs)
    assert len(got) == n_out
    for w, g in zip(want, got):
        assert g.dtype == np.float32 and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_lstm_peepholes_and_clip_match_onnxruntime():
    inputs = make_inputs("LSTM", "bidirectional", init=True, peep=True)
    attrs = {"hidden_size": H, "direction": "bidirectional", "clip": 0.4}
    for w, g in zip(oracle("LSTM", inputs, attrs, n_out=3), ours("LSTM", inputs, attrs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_lstm_input_forget_matches_onnxruntime():
    inputs = make_inputs("LSTM", "forward", init=True, peep=True)
    attrs = {"hidden_size": H, "input_forget": 1}
    for w, g in zip(oracle("LSTM", inputs, attrs, n_out=3), ours("LSTM", inputs, attrs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_gru_linear_before_reset_matches_onnxruntime():
    inputs = make_inputs("GRU", "bidirectional", init=True, lens=[3, 2])
    attrs = {"hidden_size": H, "direction": "bidirectional", "linear_before_reset": 1}
    for w, g in zip(oracle("GRU", inputs, attrs, n_out=2), ours("GRU", inputs, attrs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "op,acts,alpha,beta",
    [
        ("RNN", ["Relu"], [], []),
        ("RNN", ["LeakyRelu", "ScaledTanh"], [0.2, 0.8], [1.3]),
        ("GRU", ["HardSigmoid", "Softsign"], [0.3], [0.4]),
        ("LSTM", ["Sigmoid", "Affine", "Elu"], [0.9, 0.5], [0.1]),
    ],
)
def test_activation_attributes_with_alpha_beta_match_onnxruntime(op, acts, alpha, beta):
    direction = "bidirectional" if op == "RNN" and len(acts) == 2 else "forward"
    inputs = make_inputs(op, direction, init=True)
    attrs = {"hidden_size": H, "direction": direction, "activations": acts}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    n_out = 3 if op == "LSTM" else 2
    for w, g in zip(oracle(op, inputs, attrs, n_out=n_out), ours(op, inputs, attrs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_is_batch_major_layout_0(op):
    """layout=1 must equal layout=0 on transposed tensors (onnxruntime only has layout 0)."""
    inputs0 = make_inputs(op, "bidirectional", init=True)
    attrs = {"hidden_size": H, "direction": "bidirectional"}
    inputs1 = [np.swapaxes(a, 0, 1) if k in (0, 5, 6) else a for k, a in enumerate(inputs0)]
    want = oracle(op, inputs0, attrs, n_out=3 if op == "LSTM" else 2)
    got = ours(op, inputs1, {**attrs, "layout": 1})
    np.testing.assert_allclose(got[0], np.transpose(want[0], (2, 0, 1, 3)), rtol=1e-5, atol=1e-6)
    for w, g in zip(want[1:], got[1:]):
        np.testing.assert_allclose(g, np.swapaxes(w, 0, 1), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- VJPs


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction,kw", CASES)
def test_recurrent_vjp_through_time(op, direction, kw):
    inputs = make_inputs(op, direction, dtype=np.float64, **kw)
    check_vjp(op, inputs, {"hidden_size": H, "direction": direction}, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "op,attrs,kw",
    [
        ("LSTM", {"clip": 0.5}, {"init": True, "peep": True}),
        ("LSTM", {"input_forget": 1}, {"init": True, "peep": True}),
        ("LSTM", {"layout": 1, "direction": "bidirectional"}, {"init": True, "peep": True, "layout": 1}),
        ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}, {"init": True, "lens": [3, 2]}),
        ("GRU", {"activations": ["HardSigmoid", "Softsign"], "activation_alpha": [0.3]}, {"init": True}),
        ("RNN", {"activations": ["ScaledTanh"], "activation_alpha": [0.8], "activation_beta": [1.3]}, {}),
        ("GRU", {"layout": 1}, {"init": True, "layout": 1, "lens": [1, 3]}),
    ],
)
def test_recurrent_vjp_attribute_variants(op, attrs, kw):
    direction = attrs.get("direction", "forward")
    inputs = make_inputs(op, direction, dtype=np.float64, **kw)
    check_vjp(op, inputs, {"hidden_size": H, **attrs}, rtol=1e-5, atol=1e-7)


def test_lstm_vjp_only_last_state_used():
    inputs = make_inputs("LSTM", "forward", dtype=np.float64, init=True)
    check_vjp("LSTM", inputs, {"hidden_size": H}, outputs=[1])
