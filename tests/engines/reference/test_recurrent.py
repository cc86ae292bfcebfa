"""RNN, GRU, LSTM: forward against onnxruntime, VJPs (backpropagation through time) by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from onenode import oracle, ours

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


# --------------------------------------------------------------------------- real sizes, float16, ONNX cases


def _ort(op, inputs, attrs, n_out):
    return oracle(op, inputs, attrs, n_out=n_out)


def _inputs(op, seed, *, T, B, I, H, direction, dtype, init, lens, bias=True, peep=False, layout=0):
    r = np.random.default_rng(seed)
    nd, G = (2 if direction == "bidirectional" else 1), GATES[op]

    def u(*shape):
        return r.uniform(-0.5, 0.5, shape).astype(dtype)

    x = u(B, T, I) if layout else u(T, B, I)
    ins = [x, u(nd, G * H, I), u(nd, G * H, H), u(nd, 2 * G * H) if bias else None]
    ins.append(r.integers(1, T + 1, B).astype(np.int32) if lens else None)
    st = (B, nd, H) if layout else (nd, B, H)
    ins.append(u(*st) if init else None)
    if op == "LSTM":
        ins += [u(*st) if init else None, u(nd, 3 * H) if peep else None]
    while ins[-1] is None:
        ins.pop()
    return ins


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("init,lens", [(False, False), (True, False), (True, True)])
def test_real_sizes_and_float16_match_onnxruntime(op, dtype, direction, init, lens):
    """Hidden 128, batch 4 (the silero-vad LSTM's sizes) and a longer sequence, in float32 and
    float16, every direction, with and without initial states and sequence_lens."""
    n_out = 3 if op == "LSTM" else 2
    for k, (T, B, I, H) in enumerate([(1, 4, 64, 128), (7, 3, 5, 6)]):
        ins = _inputs(
            op,
            k,
            T=T,
            B=B,
            I=I,
            H=H,
            direction=direction,
            dtype=dtype,
            init=init,
            lens=lens,
            peep=op == "LSTM",
        )
        attrs = {"hidden_size": H, "direction": direction}
        want, got = _ort(op, ins, attrs, n_out), ours(op, ins, attrs)
        for w, g in zip(want, got):
            assert g.dtype == w.dtype == dtype and g.shape == w.shape
            tol = 2e-3 if dtype == np.float16 else 1e-5  # float16: one unit in the last place
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_float16_cells_are_rounded_once_from_a_wide_computation(op):
    """ONNX Runtime's float16 cells compute in float32 and round at the end; the reference must be
    at least as exact: within half a float16 unit of the float64 computation on the same inputs."""
    ins16 = _inputs(op, 3, T=9, B=4, I=32, H=64, direction="forward", dtype=np.float16, init=True, lens=False)
    ins64 = [None if a is None else a.astype(np.float64) for a in ins16]
    attrs = {"hidden_size": 64}
    n_out = 3 if op == "LSTM" else 2
    for t, g, w in zip(ours(op, ins64, attrs), ours(op, ins16, attrs), _ort(op, ins16, attrs, n_out)):
        ours_err = np.abs(g.astype(np.float64) - t)
        ort_err = np.abs(w.astype(np.float64) - t)
        half_ulp = np.spacing(np.abs(t).astype(np.float16)).astype(np.float64) / 2
        assert np.all(ours_err <= half_ulp * 1.0001), float((ours_err / half_ulp).max())
        assert ours_err.max() <= ort_err.max()


@pytest.mark.parametrize(
    "k,shape,expect",
    [
        (0, (1, 1, 4, 8), "input 0 (X) has shape [1, 1, 4, 8], expected [?, ?, ?]"),
        (1, (1, 16, 5), "input 1 (W) has shape [1, 16, 5], expected [1, 16, 8]"),
        (2, (1, 16, 3), "input 2 (R) has shape [1, 16, 3], expected [1, 16, 4]"),
        (3, (1, 16), "input 3 (B) has shape [1, 16], expected [1, 32]"),
        (5, (1, 1, 2, 4), "input 5 (initial_h) has shape [1, 1, 2, 4], expected [1, 2, 4]"),
        (7, (1, 4), "input 7 (P) has shape [1, 4], expected [1, 12]"),
    ],
)
def test_wrong_input_shapes_are_named_as_onnxruntime_refuses_them(k, shape, expect):
    """A rank-4 X (the silero-vad LSTM fed a wrong-sized chunk) gave numpy's broadcast error; now
    one line naming the input, its shape and the expected one (ONNX Runtime refuses it too)."""
    from mconv.errors import InputError

    r = np.random.default_rng(5)
    H, I, B = 4, 8, 2
    ins = [r.standard_normal(s).astype(np.float32) for s in [(3, B, I), (1, 16, I), (1, 16, H), (1, 32)]]
    ins += [
        None,
        np.zeros((1, B, H), np.float32),
        np.zeros((1, B, H), np.float32),
        np.zeros((1, 12), np.float32),
    ]
    ins[k] = r.standard_normal(shape).astype(np.float32)
    with pytest.raises(InputError) as err:
        ours("LSTM", ins, {"hidden_size": H})
    assert expect in str(err.value)
    import onnxruntime as ort

    with pytest.raises(
        (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidArgument)
    ):
        # the oracle refuses the same tensors
        oracle("LSTM", ins, {"hidden_size": H}, n_out=3)


def test_wrong_shape_inside_a_graph_names_the_node():
    import onnx_ir as ir
    from mconv.engines.reference.executor import Executor
    from mconv.errors import InputError
    from onnx import TensorProto, helper

    r = np.random.default_rng(6)
    W = helper.make_tensor("W", TensorProto.FLOAT, (1, 16, 8), r.standard_normal(128).astype(np.float32))
    R = helper.make_tensor("R", TensorProto.FLOAT, (1, 16, 4), r.standard_normal(64).astype(np.float32))
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="enc/rnn/LSTM\n", hidden_size=4)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [W, R],
    )
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))
    with pytest.raises(InputError) as err:
        Executor(model).run({"x": np.zeros((1, 1, 2, 8), np.float32)})
    line = err.value.line()
    assert "node enc/rnn/LSTM\\x0a (LSTM): LSTM input 0 (X) has shape [1, 1, 2, 8]" in line
    assert "\n" not in line


@pytest.fixture(scope="module")
def onnx_recurrent_cases():
    """onnx's own backend node cases for LSTM, GRU and RNN (expected outputs from its numpy model)."""
    import onnx.backend.test.case.node as node_cases
    from onnx.backend.test.case.node.gru import GRU
    from onnx.backend.test.case.node.lstm import LSTM
    from onnx.backend.test.case.node.rnn import RNN

    for cls in (LSTM, GRU, RNN):
        for name in sorted(dir(cls)):
            if name.startswith("export"):
                try:
                    getattr(cls, name)()
                except ValueError:  # already collected in this process
                    pass
    prefixes = ("test_lstm_", "test_gru_", "test_rnn_", "test_simple_rnn_")
    cases = {c.name: c for c in node_cases._NodeTestCases if c.name.startswith(prefixes)}
    assert len(cases) >= 18, sorted(cases)
    return cases


def test_onnx_backend_node_cases_pass_on_the_reference_and_onnxruntime(onnx_recurrent_cases):
    import onnx_ir as ir
    import onnxruntime as ort
    from mconv.engines.reference.executor import Executor

    for name, case in sorted(onnx_recurrent_cases.items()):
        model = case.model
        ex = Executor(ir.serde.deserialize_model(model), dtype_check=False)
        ins = [i.name for i in model.graph.input]
        for inputs, outputs in case.data_sets:
            feeds = dict(zip(ins, inputs))
            got = ex.run(feeds)
            for want, out in zip(outputs, model.graph.output):
                np.testing.assert_allclose(got[out.name], want, rtol=case.rtol, atol=case.atol, err_msg=name)
            if "batchwise" in name:  # ONNX Runtime has no layout=1 recurrent kernels
                continue
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            for want, o in zip(outputs, sess.run(None, feeds)):
                np.testing.assert_allclose(o, want, rtol=case.rtol, atol=case.atol, err_msg=name)
