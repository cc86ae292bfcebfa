"""Structured sparsity in the budget search (drivers/budget rule 14, --structured auto): whole
output channels removed and the consumers rewired in a budget result, the options' bytes as the
export stores them, the recipe's rebuild, and ``off`` leaving the search as it was."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.drivers import budget as B
from mconv.drivers.budget import config as C
from mconv.drivers.budget.evaluation import _rounded_sizes
from mconv.edit.weights import weight_refs
from mconv.engines.reference.executor import Executor
from mconv.errors import InputError
from mconv.irio import load_onnx, save_onnx
from mconv.passes import PassContext, load_recipe, run_pipeline

from tests.drivers.test_budget import FAST, _subset, digits_feeds, fixture_path

ONE = {**FAST, "attempts": 1, "engine": "reference"}
TARGET = 3_000  # weights.mcw: 67x of the MLP's 200,800 B, where the search cuts channels


@pytest.fixture(scope="module")
def cut_run():
    data = _subset(320, seed=1)
    model = load_onnx(fixture_path("digits_mlp.onnx"))
    result = B.compress_to_budget(model, data, target_size=TARGET, seed=3, structured="auto", **ONE)
    return data, result


def test_the_search_removes_whole_neurons_and_rewires_their_consumers(cut_run, tmp_path):
    data, result = cut_run
    assert result.met and result.size["weights_file"] <= TARGET
    rows = {r["name"]: r for r in result.layers}
    cut = {n: r for n, r in rows.items() if r["channels_removed"]}
    assert cut, "the search chose no structured option at 67x"
    inits = result.model.graph.initializers
    shapes = {n: list(v.const_value.shape) for n, v in inits.items() if v.const_value is not None}
    original = load_onnx(fixture_path("digits_mlp.onnx"))
    before = {n: list(v.const_value.shape) for n, v in original.graph.initializers.items()}
    for name, r in cut.items():  # the producer lost whole rows, its bias as many entries
        tensor = r["tensor"]
        ref = [x for x in weight_refs(result.model) if x.node.name == name][0]
        assert shapes[tensor][ref.out_axis] == before[tensor][ref.out_axis] - r["channels_removed"]
        assert len(ref.node.inputs) < 3 or shapes[ref.node.inputs[2].name] == [shapes[tensor][ref.out_axis]]
    # the report names them, in the JSON and the text
    assert any(a["structured"] for a in result.as_dict()["attempts"] if a["chosen"])
    assert "structured: " in B.summary_text(result) and " channels" in B.summary_text(result)
    # a valid model: the checker passes, ONNX Runtime runs it and agrees with the reference executor
    path = tmp_path / "cut.onnx"
    save_onnx(result.model, path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    x = digits_feeds("test")["input"][:200]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    want = Executor(result.model).run({"input": x})
    want = want[next(iter(want))]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # still a digit classifier on digits it never saw
    labels = digits_feeds("test")["labels"][:200]
    assert float(np.mean(got.argmax(1) == labels)) >= 0.7


def test_the_recipe_of_a_cut_model_rebuilds_it_byte_for_byte(cut_run, tmp_path):
    data, result = cut_run
    a = tmp_path / "budget.onnx"
    save_onnx(result.model, a)
    specs = load_recipe(result.write_recipe(tmp_path / "chosen.toml"))
    assert any(v.get("structured") == "l2" for s in specs if s.name == "prune" for v in s.op_name.values())
    model, _ = run_pipeline(load_onnx(fixture_path("digits_mlp.onnx")), specs, PassContext(data=data, seed=3))
    b = tmp_path / "replay.onnx"
    save_onnx(model, b)
    assert a.read_bytes() == b.read_bytes()


def _layers(data):
    model = load_onnx(fixture_path("digits_mlp.onnx"))
    feeds = {"input": data["input"]}
    train, _ = B.split_indices(len(data["labels"]), 0.25, 0)
    output = B._score_value(model)
    ev0 = B._Evaluator(feeds, output, np.zeros((0,)), data["labels"])
    ev = B._Evaluator(feeds, output, ev0.outputs(model, np.arange(len(data["labels"]))), data["labels"])
    layers, _ = B._candidates(model, ev, train, "fisher", None, (0.0, 0.9), (4,), structured=(0.5,))
    return model, {layer.name: layer for layer in layers}


def test_a_structured_option_counts_the_bytes_export_stores_for_both_layers():
    model, layers = _layers(_subset(200, seed=8))
    fc1, fc2, fc3 = layers["fc1"], layers["fc2"], layers["fc3"]
    # fc3's output is the graph's: it cannot lose channels, and says why
    assert not any(len(k) > 2 for k in fc3.options) and "graph output" in (fc3.unsafe or "")
    cut = fc1.cuts[0.5]
    assert len(cut.removed) == 150 and (0.9, 4, 0.5) in fc1.options
    # the export of the model cut, pruned and clustered as the options say
    ctx = PassContext(seed=0)

    def export(cut_first: bool) -> dict:
        m = load_onnx(fixture_path("digits_mlp.onnx"))
        specs = [
            B.make_spec("prune", {"op_name": {"fc1": {"sparsity": 0.5, "structured": "l2"}}})
        ] * cut_first
        specs += [
            B.make_spec("prune", {"op_name": {"fc1": {"sparsity": 0.9}, "fc2": {"sparsity": 0.9}}}),
            B.make_spec("cluster", {"skip": True, "init": "linear", "op_name": {
                "fc1": {"skip": False, "bits": 4}, "fc2": {"skip": False, "bits": 4}}}),
        ]  # fmt: skip
        B._run_specs(m, specs, ctx)
        return _rounded_sizes(m)["stored"]

    whole, halved = export(False), export(True)
    # the kept tensor: exactly what export stores for it
    assert cut.own[(0.9, 4)] == halved[fc1.tensor]
    # the consumer's saving: fc2 lost half its input rows; the credit is within 15% of what it saved
    saved = whole[fc2.tensor] - halved[fc2.tensor]
    consumer = cut.credit[(0.9, 4)] - 150 // 2  # less fc1's bias entries (BIAS_BITS)
    assert saved > 0 and abs(consumer - saved) <= 0.15 * saved
    # the option's bytes are its own less the whole saving (here more than its own: at least 1 B)
    assert fc1.options[(0.9, 4, 0.5)][0] == max(cut.own[(0.9, 4)] - cut.credit[(0.9, 4)], 1)
    # dense float16: fc1's 9,600 kept weights (19,200 B); fc2 loses 15,000 of its 30,000 rows' weights
    assert cut.own[(0.0, None)] == 19_200 and 30_000 <= cut.credit[(0.0, None)] <= 30_000 + 150
    # and its cost: at least the unstructured option's on the kept weights, more than nothing
    assert fc1.options[(0.9, 4, 0.5)][1] > cut.removed_cost > 0.0


def _toy(name: str, options: dict) -> B._Layer:
    return B._Layer(name, "Gemm", name + ".w", 1, np.zeros(1, np.float32), options=options)


def test_the_knapsack_fits_options_of_negative_bytes():
    # fc1 cut in half keeps 19,200 B and saves 30,000 B of fc2's rows: -10,800 B in all. With
    # fc2 dense (60,000 B) that is 49,200 B, within 50,000 B at cost 3; the other allocation
    # within it (fc1 dense, fc2 pruned: 25,200 B) costs 4. A cut counted as 1 B (60,001 B) misses.
    fc1 = _toy("fc1", {(0.0, None): (19_200, 0.0), (0.9, 4): (2_000, 5.0), (0.0, None, 0.5): (-10_800, 3.0)})
    fc2 = _toy("fc2", {(0.0, None): (60_000, 0.0), (0.9, 4): (6_000, 4.0)})
    alloc = B._within([fc1, fc2], 50_000)
    assert alloc == {"fc1": (0.0, None, 0.5), "fc2": (0.0, None)}
    assert B._alloc_bytes([fc1, fc2], alloc) == 49_200
    assert B._within([fc1, fc2], 49_199) == {"fc1": (0.0, None), "fc2": (0.9, 4)}
    # random small problems with negative options: the least costly allocation that fits, as
    # every allocation enumerated finds it (bytes under 4,096 quanta: counted exactly)
    rng = np.random.default_rng(45)
    for _ in range(40):
        layers = []
        for i in range(3):
            opts = {
                (float(k), None): (int(rng.integers(-60, 200)), float(rng.uniform(0, 10))) for k in range(4)
            }
            layers.append(_toy(f"l{i}", opts))
        budget = int(rng.integers(1, 400))
        best = None
        for a in layers[0].options:
            for b in layers[1].options:
                for c in layers[2].options:
                    pick = dict(zip(["l0", "l1", "l2"], [a, b, c]))
                    if B._alloc_bytes(layers, pick) <= budget:
                        cost = B._alloc_cost(layers, pick)
                        best = cost if best is None else min(best, cost)
        got = B._within(layers, budget)
        if best is None:
            assert got is None
        else:
            assert got is not None and B._alloc_bytes(layers, got) <= budget
            assert B._alloc_cost(layers, got) == pytest.approx(best)


def test_structured_off_changes_nothing(monkeypatch, tmp_path):
    data = _subset(240, seed=4)
    off = B.compress_to_budget(
        load_onnx(fixture_path("digits_mlp.onnx")), data, target_size=6_000, seed=2, structured="off", **ONE
    )
    assert all(not r["channels_removed"] for r in off.layers)
    assert not any(s["stage"].startswith("structured") for s in off.stages)
    # auto with no fraction to offer runs the same search to the same bytes
    monkeypatch.setattr(C, "STRUCTURED", ())
    import mconv.drivers.budget.search as S

    monkeypatch.setattr(S, "STRUCTURED", ())
    auto = B.compress_to_budget(
        load_onnx(fixture_path("digits_mlp.onnx")), data, target_size=6_000, seed=2, structured="auto", **ONE
    )
    a, b = tmp_path / "off.onnx", tmp_path / "auto.onnx"
    save_onnx(off.model, a)
    save_onnx(auto.model, b)
    assert a.read_bytes() == b.read_bytes()


def test_structured_auto_is_the_default_of_the_config_the_api_and_the_cli():
    import importlib
    import inspect

    api = importlib.import_module("mconv.api.optimize")
    cli = importlib.import_module("mconv.cli.optimize")

    assert B.BudgetConfig().structured == "auto"
    assert inspect.signature(api.budget_config).parameters["structured"].default == "auto"
    assert inspect.signature(cli.optimize_cmd).parameters["structured"].default == "auto"


def test_an_unknown_structured_mode_is_an_input_error_naming_the_option():
    with pytest.raises(InputError, match="structured 'yes'") as info:
        B.BudgetConfig(target_size=9000, structured="yes")
    assert info.value.where == "--structured"
