"""prune pass: magnitude, global, N:M and structured channel pruning (passes/prune.py)."""

from __future__ import annotations

import mconv.passes as P
import numpy as np
import pytest
from mconv.edit.weights import PRUNED_KEY, compression_info
from mconv.errors import InputError
from onnx import TensorProto, helper

F = TensorProto.FLOAT


def _mlp(build, seed=0):
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((16, 20)).astype(np.float32)
    w2 = rng.standard_normal((20, 8)).astype(np.float32)
    model = build(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "W2"], ["y"], name="fc2"),
        ],
        [("x", F, [2, 16])],
        [("y", F, [2, 8])],
        [("W1", w1), ("W2", w2)],
    )
    return model, w1, w2


def _w(model, name):
    return model.graph.initializers[name].const_value.numpy()


def test_sparsity_zeroes_exactly_that_fraction_of_smallest_weights_per_layer(build):
    model, w1, w2 = _mlp(build)
    model, reports = P.run_pipeline(model, P.parse_spec("prune(sparsity=0.75)"))
    for name, w in (("W1", w1), ("W2", w2)):
        out = _w(model, name)
        assert np.count_nonzero(out == 0) == round(0.75 * w.size)
        # every survivor is at least as large as every pruned weight (hand check, no code reuse)
        assert np.abs(w[out != 0]).min() >= np.abs(w[out == 0]).max()
        np.testing.assert_array_equal(out[out != 0], w[out != 0])
        assert model.graph.initializers[name].metadata_props[PRUNED_KEY] == "1"
    assert {t["name"]: t["kept"] for t in reports[0].tensors} == {"W1": 0.25, "W2": 0.25}


def test_threshold_std_prunes_below_k_standard_deviations(build):
    model, w1, _ = _mlp(build)
    model, _ = P.run_pipeline(model, P.parse_spec("prune(threshold_std=0.5)"))
    expected = np.where(np.abs(w1) < 0.5 * w1.std(), 0.0, w1)
    np.testing.assert_array_equal(_w(model, "W1"), expected)


def test_global_scope_uses_one_threshold_across_tensors(build):
    model, w1, w2 = _mlp(build)
    w2 *= 10  # fc2's weights are larger, so a global threshold prunes fc1 much more
    model.graph.initializers["W2"].const_value = __import__("onnx_ir").tensor(w2, name="W2")
    model, _ = P.run_pipeline(model, P.parse_spec("prune(sparsity=0.5,scope='global')"))
    a, b = _w(model, "W1"), _w(model, "W2")
    both = np.abs(np.concatenate([w1.ravel(), w2.ravel()]))
    t = np.sort(both)[both.size // 2 - 1]
    assert np.count_nonzero(a == 0) + np.count_nonzero(b == 0) == both.size // 2
    assert np.all(np.abs(a[a != 0]) > t) and np.all(np.abs(w1[a == 0]) <= t)
    assert np.count_nonzero(a == 0) / a.size > 0.7 and np.count_nonzero(b == 0) / b.size < 0.1


def test_n_m_keeps_the_n_largest_of_every_m_along_the_input_axis(build):
    model, w1, _ = _mlp(build)
    model, _ = P.run_pipeline(model, P.parse_spec("prune(n=2,m=4,op_name={'fc2': {'m': 0, 'n': 0}})"))
    out = _w(model, "W1")  # MatMul [K=16, N=20]: input axis 0
    for col in range(out.shape[1]):
        for g in range(0, 16, 4):
            block, orig = out[g : g + 4, col], w1[g : g + 4, col]
            assert np.count_nonzero(block) == 2
            assert set(np.flatnonzero(block)) == set(np.argsort(-np.abs(orig))[:2])
    assert np.count_nonzero(_w(model, "W2") == 0) == 0  # excluded by name


def test_n_m_refuses_channels_not_divisible_by_m(build):
    model, _, _ = _mlp(build)
    with pytest.raises(InputError, match="not a multiple of m=3"):
        P.run_pipeline(model, P.parse_spec("prune(n=1,m=3)"))


def test_override_precedence_name_beats_type_beats_global(build):
    rng = np.random.default_rng(1)
    model = build(
        [
            helper.make_node("Gemm", ["x", "A"], ["h"], name="g1", transB=1),
            helper.make_node("Gemm", ["h", "B"], ["h2"], name="g2", transB=1),
            helper.make_node("MatMul", ["h2", "C"], ["y"], name="m1"),
        ],
        [("x", F, [1, 10])],
        [("y", F, [1, 10])],
        [(n, rng.standard_normal((10, 10)).astype(np.float32)) for n in "ABC"],
    )
    spec = "prune(sparsity=0.2,op_type={'Gemm': {'sparsity': 0.5}},op_name={'g2': {'sparsity': 0.9}})"
    model, _ = P.run_pipeline(model, P.parse_spec(spec))
    zeros = {n: int(np.count_nonzero(_w(model, n) == 0)) for n in "ABC"}
    assert zeros == {"A": 50, "B": 90, "C": 20}
    assert compression_info(model)["B"]["kept"] == pytest.approx(0.1)


def test_bad_sparsity_is_an_input_error(build):
    model, _, _ = _mlp(build)
    with pytest.raises(InputError, match="sparsity"):
        P.run_pipeline(model, P.parse_spec("prune(sparsity=1.5)"))


# --- structured ---------------------------------------------------------------------------


def _silenced(weights: dict, removed: dict) -> dict:
    """The original weights with the removed output channels silenced (hand-written oracle)."""
    out = {k: v.copy() for k, v in weights.items()}
    for name, (channels, extra) in removed.items():
        out[name][channels] = 0.0
        for e in extra:
            out[e][channels] = 0.0
    return out


def _conv_bn_model(build, weights):
    nodes = [
        helper.make_node("Conv", ["x", "W1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "beta", "mean", "var"], ["n1"], name="bn"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "W3", "b3"], ["y"], name="fc", transB=1),
    ]
    return build(nodes, [("x", F, [2, 3, 6, 6])], [("y", F, [2, 5])], list(weights.items()))


def test_structured_pruning_rewires_bn_conv_flatten_gemm_and_matches_silenced_original(build, run_ort):
    rng = np.random.default_rng(2)
    weights = {
        "W1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "s": rng.uniform(0.5, 2, 8).astype(np.float32),
        "beta": rng.standard_normal(8).astype(np.float32),
        "mean": rng.standard_normal(8).astype(np.float32),
        "var": rng.uniform(0.5, 2, 8).astype(np.float32),
        "W2": rng.standard_normal((6, 8, 3, 3)).astype(np.float32),
        "b2": rng.standard_normal(6).astype(np.float32),
        "W3": rng.standard_normal((5, 6 * 2 * 2)).astype(np.float32),
        "b3": rng.standard_normal(5).astype(np.float32),
    }
    model = _conv_bn_model(build, weights)
    spec = "prune(structured='l1',sparsity=0.5,op_name={'fc': {'sparsity': 0.0}})"
    model, reports = P.run_pipeline(model, P.parse_spec(spec))
    rows = {t["node"]: t for t in reports[0].tensors}
    r1, r2 = rows["conv1"]["channels_removed"], rows["conv2"]["channels_removed"]
    l1 = np.abs(weights["W1"]).reshape(8, -1).sum(1)
    assert sorted(r1) == sorted(np.argsort(l1)[:4].tolist())
    assert _w(model, "W1").shape == (4, 3, 3, 3) and _w(model, "W2").shape == (3, 4, 3, 3)
    assert _w(model, "W3").shape == (5, 3 * 4) and _w(model, "s").shape == (4,)
    # oracle: the original with the removed channels producing exact zeros (BN shift zeroed too)
    silent = _silenced(weights, {"W1": (r1, ["b1", "beta", "mean"]), "W2": (r2, ["b2"])})
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    expected = run_ort(_conv_bn_model(build, silent), {"x": x})["y"]
    np.testing.assert_allclose(run_ort(model, {"x": x})["y"], expected, rtol=1e-5, atol=1e-5)


def test_structured_pruning_through_concat_moves_channels_by_offset(build, run_ort):
    rng = np.random.default_rng(3)
    weights = {
        "Wa": rng.standard_normal((4, 2, 1, 1)).astype(np.float32),
        "Wb": rng.standard_normal((6, 2, 1, 1)).astype(np.float32),
        "Wc": rng.standard_normal((3, 10, 1, 1)).astype(np.float32),
    }

    def make(w):
        nodes = [
            helper.make_node("Conv", ["x", "Wa"], ["a"], name="ca"),
            helper.make_node("Conv", ["x", "Wb"], ["b"], name="cb"),
            helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=1),
            helper.make_node("Relu", ["cat"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "Wc"], ["y"], name="cc"),
        ]
        return build(nodes, [("x", F, [1, 2, 4, 4])], [("y", F, [1, 3, 4, 4])], list(w.items()))

    spec = "prune(structured='l2',sparsity=0.5,op_name={'cc': {'sparsity': 0.0}})"
    model, reports = P.run_pipeline(make(weights), P.parse_spec(spec))
    rows = {t["node"]: t["channels_removed"] for t in reports[0].tensors}
    assert _w(model, "Wc").shape == (3, 5, 1, 1)
    silent = _silenced(weights, {"Wa": (rows["ca"], []), "Wb": (rows["cb"], [])})
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(
        run_ort(model, {"x": x})["y"], run_ort(make(silent), {"x": x})["y"], rtol=1e-5, atol=1e-5
    )


def test_structured_pruning_continues_through_a_depthwise_convolution(build, run_ort):
    rng = np.random.default_rng(4)
    weights = {
        "W1": rng.standard_normal((6, 3, 1, 1)).astype(np.float32),
        "Wd": rng.standard_normal((6, 1, 3, 3)).astype(np.float32),
        "bd": rng.standard_normal(6).astype(np.float32),
        "W2": rng.standard_normal((4, 6, 1, 1)).astype(np.float32),
    }

    def make(w):
        nodes = [
            helper.make_node("Conv", ["x", "W1"], ["c1"], name="conv1"),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "Wd", "bd"], ["d"], name="dw", group=6, pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["d"], ["r2"], name="relu2"),
            helper.make_node("Conv", ["r2", "W2"], ["y"], name="conv2"),
        ]
        return build(nodes, [("x", F, [1, 3, 5, 5])], [("y", F, [1, 4, 5, 5])], list(w.items()))

    spec = "prune(structured='l1',sparsity=0.5,op_name={'conv2': {'sparsity': 0.0}})"
    model, reports = P.run_pipeline(make(weights), P.parse_spec(spec))
    removed = reports[0].tensors[0]["channels_removed"]
    dw = next(n for n in model.graph if n.name == "dw")
    assert dw.attributes["group"].value == 3 and _w(model, "Wd").shape == (3, 1, 3, 3)
    # silence conv1's channels and the depthwise bias of the same channels
    silent = _silenced(weights, {"W1": (removed, ["bd"])})
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(
        run_ort(model, {"x": x})["y"], run_ort(make(silent), {"x": x})["y"], rtol=1e-5, atol=1e-5
    )


def _residual(build):
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Add", ["r1", "x"], ["s"], name="residual_add"),
        helper.make_node("Conv", ["s", "W2"], ["y"], name="conv2"),
    ]
    weights = [
        ("W1", rng.standard_normal((4, 4, 1, 1)).astype(np.float32)),
        ("W2", rng.standard_normal((2, 4, 1, 1)).astype(np.float32)),
    ]
    return build(nodes, [("x", F, [1, 4, 3, 3])], [("y", F, [1, 2, 3, 3])], weights)


def test_structured_pruning_refuses_a_residual_add_and_changes_nothing(build):
    model = _residual(build)
    before = _w(model, "W1").copy()
    with pytest.raises(InputError, match="residual_add") as info:
        P.run_pipeline(
            model, P.parse_spec("prune(structured='l1',sparsity=0.5,op_name={'conv2': {'sparsity': 0.0}})")
        )
    assert "residual Add" in str(info.value)
    np.testing.assert_array_equal(_w(model, "W1"), before)


def test_structured_pruning_skips_unsafe_layers_with_a_note_when_asked(build):
    model = _residual(build)
    model, reports = P.run_pipeline(
        model, P.parse_spec("prune(structured='l1',sparsity=0.5,on_unsafe='skip')")
    )
    assert _w(model, "W1").shape == (4, 4, 1, 1)
    assert any("conv1: skipped" in n for n in reports[0].notes)
    assert any("conv2: skipped" in n and "graph output" in n for n in reports[0].notes)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_magnitude_mask_radix_selection_matches_a_full_sort(dtype):
    """Oracle: a stable argsort of |w| zeroes the k smallest, ties broken by position."""
    from mconv.passes.prune import magnitude_mask

    rng = np.random.default_rng(3)
    for trial in range(40):
        n = int(rng.integers(1, 2000))
        w = (rng.standard_normal(n) * rng.choice([1.0, 1e-3])).astype(dtype)
        if trial % 3 == 0:
            w = (np.round(w * 4) / 4).astype(dtype)  # many ties at the threshold
        if trial % 4 == 0:
            w[rng.integers(0, n, 5)] = -0.0
        sparsity = float(rng.uniform(0, 1))
        k = int(round(sparsity * n))
        keep, threshold = magnitude_mask(w, sparsity, chunk=int(rng.integers(1, 300)))
        want = np.ones(n, dtype=bool)
        order = np.argsort(np.abs(w.astype(np.float64)), kind="stable")
        want[order[:k]] = False
        np.testing.assert_array_equal(keep, want)
        if k:
            assert threshold == float(np.abs(w.astype(np.float64))[order[k - 1]])
