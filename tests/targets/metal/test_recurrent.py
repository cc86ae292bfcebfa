"""LSTM, GRU and RNN on the metal target (issue 12 item 4), through the C++ harness.

Each configuration is one onnx.helper node with random weights, exported at fp32 and checked
against ONNX Runtime (layout=0) or mconv's reference executor (layout=1, which ORT refuses),
within 1e-5; a few run at fp16 storage too (cosine >= 0.999, max error within 2% of the scale).
The configurations are the corpus's (silero-vad's forward LSTM with initial states, a 2-layer
GRU) plus every direction, layout 1, constant sequence_lens, peepholes, clip, input_forget,
linear_before_reset and non-default activations.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from mconv.errors import UnsupportedError
from mconv.irio import to_proto
from mconv.targets.metal import TARGET
from mconv.targets.reference import ReferenceRunner
from metal_models import assert_fp16_close, make_model, needs_cxx, run_ort
from onnx import helper

pytestmark = needs_cxx
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def recurrent_node(
    op: str,
    rng: np.random.Generator,
    prefix: str,
    *,
    T: int = 5,
    B: int = 2,
    I: int = 3,
    H: int = 4,
    direction: str = "forward",
    layout: int = 0,
    init: bool = True,
    bias: bool = True,
    peep: bool = False,
    lens: list[int] | None = None,
    outputs: tuple[str, ...] | None = None,
    **attrs,
):
    """One recurrent node with random weights, its names under ``prefix``; returns
    (node, [(input, shape)], [output names], {weight: array})."""
    G, D = GATES[op], 2 if direction == "bidirectional" else 1
    p = prefix
    w = {
        f"{p}W": (0.5 * rng.standard_normal((D, G * H, I))).astype(np.float32),
        f"{p}R": (0.5 * rng.standard_normal((D, G * H, H))).astype(np.float32),
    }
    ins = [f"{p}x", f"{p}W", f"{p}R", ""]
    if bias:
        w[f"{p}B"], ins[3] = (0.3 * rng.standard_normal((D, 2 * G * H))).astype(np.float32), f"{p}B"
    ins.append("")
    if lens is not None:
        w[f"{p}lens"], ins[4] = np.array(lens, np.int32), f"{p}lens"
    state = [B, D, H] if layout else [D, B, H]
    inputs = [(f"{p}x", [B, T, I] if layout else [T, B, I])]
    for s in ["h0", "c0"] if op == "LSTM" else ["h0"]:
        ins.append(f"{p}{s}" if init else "")
        if init:
            inputs.append((f"{p}{s}", state))
    if peep:
        w[f"{p}P"] = (0.3 * rng.standard_normal((D, 3 * H))).astype(np.float32)
        ins.append(f"{p}P")
    while ins[-1] == "":
        ins.pop()
    names = outputs or (("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h"))
    outs = [f"{p}{o}" if o else "" for o in names]
    node = helper.make_node(
        op, ins, outs, name=f"{p}{op.lower()}", hidden_size=H, direction=direction, layout=layout, **attrs
    )
    return node, inputs, [o for o in outs if o], w


def recurrent_model(cases, seed: int):
    """One graph holding a node per (op, options) of ``cases``; returns (model, feeds)."""
    rng = np.random.default_rng(seed)
    nodes, inputs, outs, w = [], [], [], {}
    for i, (op, kw) in enumerate(cases):
        node, ins, o, ws = recurrent_node(op, rng, f"c{i}_", **kw)
        nodes.append(node)
        inputs += ins
        outs += o
        w.update(ws)
    model = make_model(nodes, inputs, outs, w, opset=14)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs}
    return model, feeds


# ORT runs layout 0 only: those cases are checked against it, layout 1 against the reference.
ORT_CASES = [
    ("LSTM", {}),  # silero-vad: forward, initial states, bias
    ("LSTM", {"direction": "bidirectional", "lens": [3, 5]}),
    ("LSTM", {"peep": True, "init": False, "bias": False}),
    ("LSTM", {"clip": 0.7, "input_forget": 1, "direction": "reverse"}),
    (
        "LSTM",
        {
            "activations": ["HardSigmoid", "Softsign", "Relu", "Sigmoid", "Tanh", "ScaledTanh"],
            "activation_alpha": [0.3, 0.8],
            "activation_beta": [0.4, 1.5],
            "direction": "bidirectional",
        },
    ),
    ("LSTM", {"outputs": ("", "Y_h")}),  # only Y_h used: one kernel
    ("GRU", {"init": False, "linear_before_reset": 1}),  # the corpus's GRU (torch writes lbr=1)
    ("GRU", {"direction": "bidirectional"}),
    ("GRU", {"lens": [2, 5], "direction": "reverse", "clip": 1.0}),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
    ("RNN", {"activations": ["LeakyRelu"], "activation_alpha": [0.2], "init": False}),
]
LAYOUT1_CASES = [
    ("LSTM", {"direction": "reverse", "layout": 1}),
    ("GRU", {"layout": 1, "lens": [2, 5], "direction": "bidirectional"}),
    ("RNN", {"layout": 1}),
]


def _check_fp32(tmp_path, cases, seed, oracle):
    model, feeds = recurrent_model(cases, seed)
    runner = TARGET.load(TARGET.export(model, tmp_path / "b", {"precision": "fp32"}))
    got = runner.run(feeds)
    want = oracle(model, feeds)
    assert set(got) == set(want) and len(want) >= 2 * len(cases) - 1
    for name, ref in want.items():
        assert got[name].shape == ref.shape, name
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)
    return runner


def test_recurrent_cells_match_ort_at_fp32(tmp_path):
    runner = _check_fp32(tmp_path, ORT_CASES, 1, run_ort)
    only_yh = [layer.kernel for layer in runner.plan.layers if layer.nodes == ["c5_lstm"]]
    assert len(only_yh) == 1 and only_yh[0].endswith("_lstm_yh")
    assert {layer.op for layer in runner.plan.layers} == {"LSTM", "GRU", "RNN"}


def test_recurrent_cells_with_layout_1_match_the_reference(tmp_path):
    _check_fp32(tmp_path, LAYOUT1_CASES, 2, lambda m, f: ReferenceRunner(m).run(f))


def test_recurrent_cells_at_fp16_storage(tmp_path):
    cases = [(op, {"T": 12, "H": 16, "I": 8, "direction": "bidirectional"}) for op in ("LSTM", "GRU")]
    model, feeds = recurrent_model(cases, 3)
    got = TARGET.load(TARGET.export(model, tmp_path / "b", {"precision": "fp16"})).run(feeds)
    want = run_ort(model, feeds)
    assert len(want) == 5
    for name, ref in want.items():
        assert_fp16_close(ref, got[name])


def _runtime_lens_model(path):
    """An LSTM whose sequence_lens is a graph input (int32): refused by the metal target."""
    model, _ = recurrent_model([("LSTM", {})], 5)
    proto = to_proto(model)
    node = proto.graph.node[0]
    node.input[4] = "seq_lens"  # the node has x, W, R, B, "", h0, c0
    proto.graph.input.append(helper.make_tensor_value_info("seq_lens", onnx.TensorProto.INT32, [2]))
    onnx.save(proto, path)
    return path


def test_runtime_sequence_lens_is_refused_with_the_node_named(tmp_path):
    from mconv.irio import load_onnx

    model = load_onnx(_runtime_lens_model(tmp_path / "lens.onnx"))
    with pytest.raises(UnsupportedError) as info:
        TARGET.export(model, tmp_path / "b", {})
    assert "c0_lstm" in str(info.value) and "int32" in str(info.value)


def test_cli_refusal_is_one_line_exit_2(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    path = _runtime_lens_model(tmp_path / "lens.onnx")
    r = CliRunner().invoke(app, ["export", str(path), "--target", "metal", "-o", str(tmp_path / "b")])
    assert r.exit_code == 2, r.output
    assert "lens.onnx" in r.output and "c0_lstm" in r.output
    assert not (tmp_path / "b").exists()
