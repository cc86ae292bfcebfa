"""The xla engine (issue 15 item 1): loss and gradients equal the reference executor's VJPs, the
jitted training step equals the reference step (masked, centroid, distillation), and a fine-tune
on either engine reaches the same held-out metric."""

from __future__ import annotations

import json

import jax
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from mconv import passes as P
from mconv.engines.reference.executor import Executor
from mconv.engines.xla.engine import XlaEngine, loss_value
from mconv.errors import InputError
from mconv.irio import from_proto
from mconv.passes.finetune import (
    FinetuneConfig,
    distillation_kl,
    finetune_model,
    mean_squared_error,
    softmax_cross_entropy,
    top1_margin_hinge,
)
from onnx import TensorProto, helper

F = TensorProto.FLOAT
FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[3] / "fixtures"


def _build(nodes, inputs, outputs, inits):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [onnx.numpy_helper.from_array(np.asarray(a), name) for name, a in inits],
    )
    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def mlp(rng):
    """x[N,4] -> MatMul -> Add -> Relu -> Gemm(transB) -> logits[N,3] (test_finetune's model)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("Gemm", ["h2", "w2", "b2"], ["logits"], name="fc2", transB=1),
    ]
    inits = [
        ("w1", (0.5 * rng.standard_normal((4, 16))).astype(np.float32)),
        ("b1", (0.1 * rng.standard_normal(16)).astype(np.float32)),
        ("w2", (0.5 * rng.standard_normal((3, 16))).astype(np.float32)),
        ("b2", np.zeros(3, np.float32)),
    ]
    return _build(nodes, [("x", F, ["N", 4])], [("logits", F, ["N", 3])], inits)


def blobs(rng, n=240):
    centres = np.array([[2, 0, 0, 1], [0, 2, 0, -1], [0, 0, 2, 0]], np.float32)
    labels = rng.integers(0, 3, n)
    x = (centres[labels] + 0.6 * rng.standard_normal((n, 4))).astype(np.float32)
    return x, labels.astype(np.int64)


def _losses(kind, s, target, temperature=2.0, margin=0.0):
    """The reference loss (numpy, with its hand-written gradient) for the same definitions."""
    if kind == "xent":
        v, g = softmax_cross_entropy(s, target)
    elif kind == "kl":
        v, g = distillation_kl(s, target, temperature)
    else:
        v, g = mean_squared_error(s, target)
    if margin:
        h, gh = top1_margin_hinge(s, target)
        v, g = v + margin * h, g + margin * gh
    return v, g


def _compare(model, feeds, out, kind, target, margin=0.0):
    wrt = [n for n, v in model.graph.initializers.items() if v.const_value.dtype == onnx_ir_float()]
    ref = Executor(model)
    ref.output_names = [out]
    v_ref, g_ref = ref.value_and_grad(
        feeds, lambda o: (lambda v, g: (v, {out: g}))(*_losses(kind, o[out], target, margin=margin)), wrt
    )
    eng = XlaEngine(model, [out])
    v_x, g_x = eng.value_and_grad(feeds, lambda o: loss_value(o[out], target, kind, 2.0, margin), wrt)
    np.testing.assert_allclose(v_x, v_ref, rtol=1e-4, atol=1e-6)
    for name in wrt:
        scale = max(float(np.max(np.abs(g_ref[name]))), 1e-6)
        np.testing.assert_allclose(g_x[name], g_ref[name], rtol=1e-4, atol=1e-5 * scale, err_msg=name)


def onnx_ir_float():
    import onnx_ir as ir

    return ir.DataType.FLOAT


@pytest.mark.parametrize("kind,margin", [("xent", 0.0), ("kl", 0.5), ("mse", 0.0)])
def test_mlp_loss_and_gradients_equal_the_reference_vjps(kind, margin):
    rng = np.random.default_rng(11)
    model = mlp(rng)
    x, y = blobs(rng, 32)
    target = y if kind == "xent" else rng.standard_normal((32, 3)).astype(np.float64)
    _compare(model, {"x": x}, "logits", kind, target, margin)


def test_dwcnn_fixture_gradients_equal_the_reference_vjps():
    """The fine-tuning fixture with depthwise convolutions and BatchNorm, on digits."""
    model = from_proto(onnx.load(FIXTURES / "digits_dwcnn.onnx"))
    data = np.load(FIXTURES / "digits_train.npz")
    rng = np.random.default_rng(3)
    idx = rng.choice(len(data["labels"]), 16, replace=False)
    name = model.graph.inputs[0].name
    x = data["images"][idx].reshape(16, 1, 8, 8).astype(np.float32)
    from mconv.passes.finetune import _score_output

    _, out = _score_output(model)
    _compare(model, {name: x}, out, "xent", data["labels"][idx].astype(np.int64))


def _clustered_pruned(rng):
    model = mlp(rng)
    w1 = model.graph.initializers["w1"]
    a = w1.const_value.numpy().copy()
    a[np.abs(a) < np.quantile(np.abs(a), 0.6)] = 0.0
    import onnx_ir as ir

    w1.const_value = ir.Tensor(a, name="w1")
    w1.metadata_props["mconv.pruned"] = "1"
    w2 = model.graph.initializers["w2"]
    book = np.array([-0.6, -0.2, 0.3, 0.7], np.float32)
    b = book[np.argmin(np.abs(w2.const_value.numpy()[..., None] - book), axis=-1)]
    b[:, :3] = 0.0
    w2.const_value = ir.Tensor(b, name="w2")
    w2.metadata_props.update({"mconv.pruned": "1", "mconv.cluster": json.dumps({"bits": 2})})
    return model


def _weights(model):
    return {n: v.const_value.numpy().copy() for n, v in model.graph.initializers.items()}


@pytest.mark.parametrize(
    "optimizer,loss,margin", [("sgd", "xent", 0.0), ("adam", "kl", 0.5)], ids=["sgd-xent", "adam-kl-margin"]
)
def test_training_steps_equal_the_reference_steps(optimizer, loss, margin):
    """Two epochs of masked (w1) and centroid (w2) fine-tuning: the same weights on both engines,
    pruned weights exactly zero, the codebook never grows."""
    results = {}
    for engine in ("reference", "xla"):
        rng = np.random.default_rng(5)
        model = _clustered_pruned(rng)
        teacher = mlp(np.random.default_rng(6))
        x, y = blobs(rng, 64)
        data = {"x": x} if loss == "kl" else {"x": x, "labels": y}
        config = FinetuneConfig(
            optimizer=optimizer,
            lr=0.02,
            epochs=2,
            batch_size=16,
            holdout=0.25,
            loss=loss,
            margin=margin,
            weight_decay=1e-3,
            engine=engine,
        )
        res = finetune_model(model, data, config, reference_model=teacher, seed=1)
        results[engine] = (_weights(model), [e.metric for e in res.epochs], [e.loss for e in res.epochs])
    (w_ref, m_ref, l_ref), (w_x, m_x, l_x) = results["reference"], results["xla"]
    for name in w_ref:
        np.testing.assert_allclose(w_x[name], w_ref[name], rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(l_x[1:], l_ref[1:], rtol=1e-4)
    assert m_x == m_ref
    start = _weights(_clustered_pruned(np.random.default_rng(5)))
    assert np.array_equal(w_x["w1"] == 0, start["w1"] == 0)
    assert np.array_equal(w_x["w2"] == 0, start["w2"] == 0)
    assert len(np.unique(w_x["w2"][w_x["w2"] != 0])) <= 4
    assert not np.allclose(w_x["w2"], start["w2"])  # the centroids moved


def test_release_steps_equal_the_reference_steps():
    """finetune rule 9 on both engines: half of w2's weights train as floats, the rest keep
    their centroids; the same snapped weights, zeros kept, the codebook never grows."""
    results = {}
    for engine in ("reference", "xla"):
        rng = np.random.default_rng(5)
        model = _clustered_pruned(rng)
        teacher = mlp(np.random.default_rng(6))
        x, _ = blobs(rng, 64)
        config = FinetuneConfig(
            lr=0.1, epochs=6, batch_size=16, holdout=0.25, loss="kl", release=0.5, engine=engine
        )
        res = finetune_model(model, {"x": x}, config, reference_model=teacher, seed=1)
        results[engine] = _weights(model)
        assert {t["name"]: t["mode"] for t in res.tensors}["w2"] == "release"
    start = _weights(_clustered_pruned(np.random.default_rng(5)))
    for name in results["reference"]:
        np.testing.assert_allclose(results["xla"][name], results["reference"][name], rtol=1e-4, atol=1e-5)
    w2 = results["xla"]["w2"]
    assert np.array_equal(w2 == 0, start["w2"] == 0)
    assert set(np.unique(w2[w2 != 0]).tolist()) <= set(np.unique(start["w2"][start["w2"] != 0]).tolist())
    assert not np.array_equal(w2, start["w2"])  # released weights changed cluster


def tagger(rng, scale=0.5):
    """x[N,T,4] -> MatMul -> Add -> Relu -> MatMul -> Add -> Softmax(last axis) -> probs[N,T,3]:
    a per-position classifier (a CTC recognizer's head, a tagger's), class scores on the last
    axis and positions on axis 1."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["z0"], name="fc2"),
        helper.make_node("Add", ["z0", "b2"], ["logits"], name="fc2_bias"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    inits = [
        ("w1", (scale * rng.standard_normal((4, 16))).astype(np.float32)),
        ("b1", (0.1 * rng.standard_normal(16)).astype(np.float32)),
        ("w2", (scale * rng.standard_normal((16, 3))).astype(np.float32)),
        ("b2", np.zeros(3, np.float32)),
    ]
    return _build(nodes, [("x", F, ["N", 6, 4])], [("probs", F, ["N", 6, 3])], inits)


@pytest.mark.parametrize("margin", [0.0, 0.3])
def test_per_position_distillation_steps_equal_the_reference_steps_and_restore_agreement(margin):
    """finetune rule 4 on [N, T, classes] outputs: the KL is over the classes (the last axis) at
    every position on both engines. The xla loss once took its softmax over axis 1 (the
    positions): its steps then left the reference's, and the per-position top-1 agreement
    with the teacher fell instead of rising (the budget search's collapse on PP-OCRv4)."""
    rng = np.random.default_rng(31)
    x, _ = blobs(rng, 64 * 6)
    x = x.reshape(64, 6, 4)
    results = {}
    for engine in ("reference", "xla"):
        teacher = tagger(np.random.default_rng(7))
        student = tagger(np.random.default_rng(7))
        for name in ("w1", "w2"):  # the student: the teacher's weights, disturbed (seeded)
            v = student.graph.initializers[name]
            a = v.const_value.numpy()
            noise = 0.6 * np.random.default_rng(8).standard_normal(a.shape) * np.abs(a).mean()
            v.const_value = ir.Tensor((a + noise).astype(np.float32), name=name)
        config = FinetuneConfig(
            lr=0.02, epochs=8, batch_size=16, holdout=0.25, loss="kl", margin=margin, engine=engine
        )
        res = finetune_model(student, {"x": x}, config, reference_model=teacher, seed=1)
        assert res.loss == "kl" and res.epochs[-1].metric_name == "top1_agreement"
        results[engine] = (_weights(student), [e.metric for e in res.epochs], [e.loss for e in res.epochs])
    (w_ref, m_ref, l_ref), (w_x, m_x, l_x) = results["reference"], results["xla"]
    for name in w_ref:
        np.testing.assert_allclose(w_x[name], w_ref[name], rtol=1e-3, atol=1e-4, err_msg=name)
    np.testing.assert_allclose(l_x[1:], l_ref[1:], rtol=1e-3)
    print(
        f"per-position agreement: reference {m_ref[0]:.3f} -> {m_ref[-1]:.3f}, xla {m_x[0]:.3f} -> {m_x[-1]:.3f}"
    )
    assert m_x[0] <= 0.9 and m_x[-1] >= m_x[0] + 0.05  # the disturbed student comes back


def test_pipeline_finetune_on_either_engine_reaches_the_same_held_out_accuracy():
    metrics = {}
    for engine in ("reference", "xla"):
        rng = np.random.default_rng(21)
        model = mlp(rng)
        x, y = blobs(rng, 240)
        ctx = P.PassContext(data={"x": x, "labels": y})
        spec = P.parse_spec(f"finetune(epochs=3,lr=0.01,engine={engine})")
        _, (report,) = P.run_pipeline(model, spec, ctx)
        last = [n for n in report.notes if n.startswith("epoch 3")][0]
        metrics[engine] = float(last.rsplit(" ", 1)[1])
    assert metrics["reference"] >= 0.85
    assert abs(metrics["xla"] - metrics["reference"]) <= 0.05  # one or two of 24 held-out samples


def test_unknown_engine_and_missing_device_are_input_errors():
    rng = np.random.default_rng(2)
    model = mlp(rng)
    x, y = blobs(rng, 16)
    with pytest.raises(InputError, match="unknown engine"):
        finetune_model(model, {"x": x, "labels": y}, FinetuneConfig(epochs=1, engine="tpu"))  # type: ignore[arg-type]
    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(InputError, match="no cuda device"):
            finetune_model(
                model, {"x": x, "labels": y}, FinetuneConfig(epochs=1, engine="xla", device="cuda")
            )


# --------------------------------------------------------------------------- export (items 2, 3)


def _pinned_cnn(rng):
    """x[1,2,6,6] -> Conv(OIHW) -> Relu -> Reshape [1, 4*4*4] -> Gemm(transB) -> y[1,5]: the
    batch-1 exporter habit of light AlexNet (its Reshape [1, 9216])."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name="flatten_pinned"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    inits = [
        ("w", (0.3 * rng.standard_normal((4, 2, 3, 3))).astype(np.float32)),
        ("b", (0.1 * rng.standard_normal(4)).astype(np.float32)),
        ("shape", np.array([1, 64], np.int64)),
        ("fw", (0.2 * rng.standard_normal((5, 64))).astype(np.float32)),
        ("fb", (0.1 * rng.standard_normal(5)).astype(np.float32)),
    ]
    return _build(nodes, [("x", F, [1, 2, 6, 6])], [("y", F, [1, 5])], inits)


def test_a_model_that_pins_its_batch_exports_at_that_batch_and_says_so(tmp_path):
    """A symbolic batch would change what the model computes: the export keeps batch 1."""
    import json

    from mconv.targets import get_target

    model = _pinned_cnn(np.random.default_rng(8))
    get_target("xla").export(model, tmp_path / "b", {"platforms": ["cpu"]})
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"][0] == 1
    note = json.dumps(manifest)
    assert "flatten_pinned" in note and "dynamic-batch" in note


def test_cli_export_of_a_pinned_batch_says_what_it_kept(tmp_path):
    from mconv.cli.app import app
    from mconv.irio import save_onnx
    from typer.testing import CliRunner

    path = tmp_path / "pinned.onnx"
    save_onnx(_pinned_cnn(np.random.default_rng(9)), path)
    r = CliRunner().invoke(app, ["export", str(path), "--target", "xla", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "flatten_pinned" in r.output and "dynamic-batch" in r.output and "batch 1" in r.output
    r = CliRunner().invoke(app, ["run", str(tmp_path / "out"), "--samples", "3"])
    assert r.exit_code == 0, r.output  # the bundle keeps batch 1: three runs of one sample
    assert "3 run(s) of the fixed batch size 1" in r.output


def test_after_the_dynamic_batch_pass_the_bundle_runs_any_batch_like_the_samples_alone(tmp_path):
    """And the weight arguments take the layouts XLA wants (HWIO kernel, [K, N] matrix)."""
    from mconv.targets import get_target

    rng = np.random.default_rng(10)
    model = _pinned_cnn(rng)
    original = Executor(_pinned_cnn(np.random.default_rng(10)))
    model, _ = P.run_pipeline(model, P.parse_spec("dynamic-batch"), P.PassContext())
    get_target("xla").export(model, tmp_path / "b", {"platforms": ["cpu"]})
    conv = json.loads((tmp_path / "b" / "xla.json").read_text())
    layouts = {w["name"]: w.get("layout") for w in conv["weight_args"]}
    assert layouts == {"w": [2, 3, 1, 0], "b": None, "fw": [1, 0], "fb": None}
    runner = get_target("xla").load(tmp_path / "b")
    x = rng.standard_normal((3, 2, 6, 6)).astype(np.float32)
    got = runner.run({"x": x})["y"]
    want = np.concatenate([original.run({"x": x[i : i + 1]})["y"] for i in range(3)])
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    in_memory = get_target("xla").load_model(model).run({"x": x})["y"]  # no bundle: same layouts
    np.testing.assert_allclose(in_memory, want, rtol=1e-5, atol=1e-6)


def test_sensitivity_sweep_on_either_engine_gives_the_same_curves():
    from mconv.drivers.analyze import analyze_sensitivity

    curves = {}
    for engine in ("reference", "xla"):
        rng = np.random.default_rng(31)
        model = mlp(rng)
        x, y = blobs(rng, 120)
        report = analyze_sensitivity(model, {"x": x, "labels": y}, sweep=(0.5, 0.9), bits=(2,), engine=engine)
        curves[engine] = [
            (layer.name, [(p.sparsity, p.bits, p.metric) for p in layer.sweep]) for layer in report.layers
        ]
    names = [n for n, _ in curves["reference"]]
    assert names == [n for n, _ in curves["xla"]] and len(names) == 2
    for (_, ref), (_, got) in zip(curves["reference"], curves["xla"]):
        assert [p[:2] for p in ref] == [p[:2] for p in got]
        np.testing.assert_allclose([p[2] for p in got], [p[2] for p in ref], atol=1.5 / 120)  # a tie may flip
    with pytest.raises(InputError, match="unknown engine"):
        analyze_sensitivity(mlp(np.random.default_rng(1)), {"x": x}, engine="numpy")


@pytest.mark.parametrize(
    "group,channels", [(2, 4), (3, 6), (6, 6)], ids=["2-groups", "3-groups", "depthwise"]
)
def test_grouped_conv_split_into_ordinary_convs_equals_the_reference(group, channels):
    """Conv lowering rule 6 (few groups: one conv per channel slice) against the reference."""
    rng = np.random.default_rng(group)
    w = (0.3 * rng.standard_normal((channels * 2, channels // group, 3, 3))).astype(np.float32)
    b = rng.standard_normal(channels * 2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="c", group=group, pads=[1, 1, 1, 1])]
    model = _build(
        nodes, [("x", F, ["N", channels, 5, 5])], [("y", F, ["N", channels * 2, 5, 5])], [("w", w), ("b", b)]
    )
    x = rng.standard_normal((2, channels, 5, 5)).astype(np.float32)
    got = XlaEngine(model).run({"x": x})["y"]
    np.testing.assert_allclose(got, Executor(model).run({"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_cli_run_and_analyze_take_engine_xla(tmp_path):
    from mconv.cli.app import app
    from mconv.irio import save_onnx
    from typer.testing import CliRunner

    rng = np.random.default_rng(41)
    model = mlp(rng)
    path = tmp_path / "mlp.onnx"
    save_onnx(model, path)
    x, y = blobs(rng, 40)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "d.npz", x=x, labels=y)
    cli = CliRunner()
    outs = {}
    for engine in ("reference", "xla"):
        out = tmp_path / f"{engine}.npz"
        r = cli.invoke(
            app, ["run", str(path), "--engine", engine, "-i", f"x={tmp_path / 'x.npy'}", "-o", str(out)]
        )
        assert r.exit_code == 0, r.output
        outs[engine] = np.load(out)["logits"]
    np.testing.assert_allclose(outs["xla"], outs["reference"], rtol=1e-5, atol=1e-5)
    r = cli.invoke(
        app, ["analyze", str(path), "--data", str(tmp_path / "d.npz"), "--engine", "xla", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert [layer["name"] for layer in json.loads(r.stdout)["layers"]] == ["fc1", "fc2"]
    for args in (
        ["run", str(path), "--engine", "numpy"],
        ["analyze", str(path), "--data", str(tmp_path / "d.npz"), "--engine", "xla", "--device", "tpu"],
    ):
        r = cli.invoke(app, args)
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert "engine" in r.output or "device" in r.output


def _recluster(model, book, cut):
    """w2 on the codebook ``book``, its ``cut`` first columns pruned (another search state)."""
    import onnx_ir as ir

    w2 = model.graph.initializers["w2"]
    b = book[np.argmin(np.abs(w2.const_value.numpy()[..., None] - book), axis=-1)].astype(np.float32)
    b[:, :cut] = 0.0
    w2.const_value = ir.Tensor(b, name="w2")
    w2.metadata_props.update({"mconv.pruned": "1", "mconv.cluster": json.dumps({"bits": 4})})


def test_one_step_program_across_codebook_sizes_and_sparsities():
    """Rule 3: stages that differ only in codebook size and pruned fraction (a budget search
    clustering layer after layer) train on the one compiled step, and still train (the
    centroids move, the codebook keeps its size, zeros stay zero)."""
    from mconv.engines.fast import _MEMO_KEY

    rng = np.random.default_rng(5)
    model = _clustered_pruned(rng)
    x, y = blobs(rng, 64)
    memo: dict = {}
    config = FinetuneConfig(lr=0.05, epochs=1, batch_size=16, holdout=0.25, loss="xent", engine="xla")
    for book, cut in [(np.array([-0.6, -0.2, 0.3, 0.7]), 3), (np.linspace(-0.8, 0.8, 13), 1)]:
        _recluster(model, book, cut)
        before = model.graph.initializers["w2"].const_value.numpy().copy()
        finetune_model(model, {"x": x, "labels": y}, config, seed=1, memo=memo)
        after = model.graph.initializers["w2"].const_value.numpy()
        assert np.array_equal(after == 0, before == 0)
        assert len(np.unique(after[after != 0])) == len(np.unique(before[before != 0]))
        assert not np.array_equal(after, before)
    (engine,) = [e for (role, *_), e in memo[_MEMO_KEY].items() if role == "student"]
    (step,) = engine._steps.values()
    assert step._cache_size() == 1


def test_relative_step_caps_adams_first_step_by_hand_and_on_both_engines():
    """finetune rule 5: a weight tensor a hundred times smaller than the other moves, on Adam's
    first step, by relative_step x its RMS (each element by that much: the first bias-corrected
    Adam step is the gradient's sign), the larger one by lr; biases by lr; both engines alike."""
    rng = np.random.default_rng(3)
    model = mlp(np.random.default_rng(6))
    w1 = next(v for v in model.graph.initializers.values() if v.name == "w1")
    small = w1.const_value.numpy() * np.float32(0.01)
    w1.const_value = ir.tensor(small, name="w1")
    start = _weights(model)
    rms = {n: float(np.sqrt(np.mean(start[n].astype(np.float32) ** 2))) for n in ("w1", "w2")}
    lr, rel = 0.005, 0.02
    assert rel * rms["w1"] < lr < rel * rms["w2"]  # w1 capped, w2 not
    x, _ = blobs(rng, 32)
    moved = {}
    for engine in ("reference", "xla"):
        m = mlp(np.random.default_rng(6))
        next(v for v in m.graph.initializers.values() if v.name == "w1").const_value = ir.tensor(
            small, name="w1"
        )
        config = FinetuneConfig(
            lr=lr, epochs=1, batch_size=32, holdout=0.0, loss="mse", relative_step=rel, engine=engine
        )
        finetune_model(m, {"x": x}, config, reference_model=mlp(np.random.default_rng(7)), seed=1)
        moved[engine] = {n: np.abs(a - start[n]) for n, a in _weights(m).items()}
    for engine, d in moved.items():
        cap = rel * rms["w1"]
        assert np.max(d["w1"]) <= cap * (1 + 1e-3), engine
        assert np.median(d["w1"][d["w1"] > 0]) == pytest.approx(cap, rel=1e-3), engine
        assert np.max(d["w2"]) > 0.5 * lr and np.max(d["w2"]) <= lr * (1 + 1e-3), engine
        assert np.max(d["b1"]) > 0.5 * lr, engine  # a bias keeps lr
    for name in moved["reference"]:
        np.testing.assert_allclose(moved["xla"][name], moved["reference"][name], rtol=1e-3, atol=1e-7)
