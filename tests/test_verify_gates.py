"""verify's gates: defaults when none is given, ranges checked, honest samples, localize notes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.cli.app import app
from mconv.errors import InputError
from mconv.metrics import Gates, compare, plan_random_feeds
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line_exit_2(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    assert "internal error" not in r.output and "Traceback" not in r.output
    return lines[0]


def _mlp(path: Path, *, seed: int = 0, noise: float = 0.0, batch="N", hidden: str = "h") -> Path:
    """x [batch, 8] -> Gemm -> Relu -> Gemm -> y [batch, 5]; ``noise`` perturbs the weights."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((16, 8)).astype(np.float32)
    w2 = rng.standard_normal((5, 16)).astype(np.float32)
    if noise:
        w1 = w1 + noise * np.random.default_rng(seed + 1).standard_normal(w1.shape).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1"], [hidden], name="fc1", transB=1),
        helper.make_node("Relu", [hidden], ["r"], name="act"),
        helper.make_node("Gemm", ["r", "w2"], ["y"], name="fc2", transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_no_gate_given_applies_the_defaults_and_a_drifting_model_fails(tmp_path):
    ref = _mlp(tmp_path / "ref.onnx")
    cand = _mlp(tmp_path / "cand.onnx", noise=3.0)  # weights swamped by noise
    r = _cli("verify", str(ref), str(cand), "--samples", "16", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["passed"] is False
    assert doc["gates"] == {"min_cosine": 0.99, "min_top1": 0.99, "max_rel_l2": 0.03}
    assert doc["gates_source"] == "default"
    assert doc["outputs"]["y"]["cosine"] < 0.99 and "y" in doc["failures"]
    assert doc["outputs"]["y"]["rel_l2"] > 0.03 and any("rel_l2" in f for f in doc["failures"]["y"])

    r = _cli("verify", str(ref), str(ref))  # the same model passes, the gates are on stderr
    assert r.exit_code == 0, r.output
    assert "gates (default): min_cosine 0.99, min_top1 0.99, max_rel_l2 0.03" in r.output


def test_a_user_gate_replaces_the_defaults(tmp_path):
    ref = _mlp(tmp_path / "ref.onnx")
    cand = _mlp(tmp_path / "cand.onnx", noise=3.0)
    r = _cli("verify", str(ref), str(cand), "--min-cosine", "-1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["passed"] is True and doc["gates"] == {"min_cosine": -1.0} and doc["gates_source"] == "user"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--samples", "0"], "--samples 0"),
        (["--samples", "-3"], "--samples -3"),
        (["--min-top1", "1.5"], "--min-top1 1.5"),
        (["--min-cosine", "2"], "--min-cosine 2"),
        (["--atol", "-1e-3"], "--atol"),
        (["--rtol", "-0.5"], "--rtol"),
        (["--min-cosine", "nan"], "--min-cosine"),
        (["--max-rel-l2", "-0.1"], "--max-rel-l2"),
        (["--max-rel-l2", "nan"], "--max-rel-l2"),
    ],
)
def test_meaningless_gates_and_sample_counts_are_refused(tmp_path, args, needle):
    m = _mlp(tmp_path / "m.onnx")
    _one_line_exit_2(_cli("verify", str(m), str(m), *args), needle)


def test_gates_check_refuses_out_of_range_values():
    with pytest.raises(InputError, match="min-top1"):
        Gates(min_top1=-0.1).check()
    assert Gates(atol=0.0, rtol=0.0, min_cosine=-1.0, min_top1=1.0).check().any()


def test_fixed_batch_runs_the_samples_as_batches_of_that_size(tmp_path):
    m = _mlp(tmp_path / "m.onnx", batch=1)
    r = _cli("verify", str(m), str(m), "--samples", "3", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["samples"] == 3
    assert (
        doc["batching"]["mode"] == "fixed" and doc["batching"]["runs"] == 3 and doc["batching"]["batch"] == 1
    )

    m2 = _mlp(tmp_path / "m2.onnx", batch=2)
    line = _one_line_exit_2(_cli("verify", str(m2), str(m2), "--samples", "3"), "fixed batch size 2")
    assert "use --samples 2 or 4" in line
    doc = json.loads(_cli("verify", str(m2), str(m2), "--json").stdout)  # default: 4 = 2 runs of 2
    assert doc["samples"] == 4 and doc["batching"]["runs"] == 2


def test_random_feeds_of_runs_differ_and_repeat_with_the_seed(tmp_path):
    from mconv.bundle import TensorSpec

    spec = [TensorSpec("x", "float32", (1, 8))]
    a = plan_random_feeds(spec, samples=3, seed=5)
    b = plan_random_feeds(spec, samples=3, seed=5)
    assert len(a.feeds) == 3 and a.samples == 3
    for fa, fb in zip(a.feeds, b.feeds):
        np.testing.assert_array_equal(fa["x"], fb["x"])
    assert not np.array_equal(a.feeds[0]["x"], a.feeds[1]["x"])


def test_top1_applies_to_2d_class_scores_only():
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((6, 4))
    assert "top1_agreement" in compare(scores, scores)
    assert "top1_agreement" not in compare(scores.reshape(6, 4, 1), scores.reshape(6, 4, 1))
    assert "top1_agreement" not in compare(scores[:, :1], scores[:, :1])  # one column: no classes


def test_localize_names_the_first_shared_value_that_drifts(tmp_path):
    ref = _mlp(tmp_path / "ref.onnx")
    cand = _mlp(tmp_path / "cand.onnx", noise=3.0, hidden="renamed")  # fc1's output not shared
    r = _cli("verify", str(ref), str(cand), "--localize", "--json")
    assert r.exit_code == 1, r.output
    loc = json.loads(r.stdout)["localized"]
    assert loc["node"] == "act" and loc["value"] == "r" and loc["compared"] == 1


def test_localize_says_plainly_when_nothing_drifts_or_nothing_is_shared(tmp_path):
    from mconv.api.localize import localize

    ref = _mlp(tmp_path / "ref.onnx")
    same = _mlp(tmp_path / "same.onnx", hidden="renamed")
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)}
    loc = localize(ref, same, feeds, Gates())
    assert loc["node"] is None and loc["compared"] == 2  # r and y, both equal
    assert "none of the 2 values" in loc["note"] and loc["worst"]["value"] in ("r", "y")

    model = onnx.load(_mlp(tmp_path / "cand.onnx", noise=3.0))
    for node in model.graph.node:  # every value renamed: nothing to compare by name
        node.output[:] = ["q_" + o for o in node.output]
        node.input[:] = ["q_" + i if i in ("h", "r") else i for i in node.input]
    model.graph.output[0].name = "q_y"
    onnx.save(model, tmp_path / "cand.onnx")
    loc = localize(ref, tmp_path / "cand.onnx", feeds, Gates())
    assert loc["node"] is None and loc["compared"] == 0
    assert loc["note"].startswith("no intermediate value could be compared: ")


def test_render_of_an_unnamed_localization_is_its_note(tmp_path):
    from mconv.cli.app import render_verify
    from mconv.cli.output import Out
    from mconv.metrics import VerifyReport

    report = VerifyReport(passed=False, outputs={}, gates={"min_cosine": 0.99})
    report.localized = {"node": None, "compared": 0, "note": "no intermediate value could be compared: why"}
    lines = []

    class _Out(Out):
        def print(self, *args, **kw):
            lines.append(str(args[0]))

    render_verify(_Out(json=False, quiet=False, debug=False), report)
    assert any(ln == "localize: no intermediate value could be compared: why" for ln in lines)
    assert not any("None" in ln for ln in lines if isinstance(ln, str))


def test_weight_only_verify_has_a_default_snr_gate(tmp_path):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    np.savez(tmp_path / "ref.npz", w=w)
    np.savez(tmp_path / "close.npz", w=w + 0.01 * rng.standard_normal(w.shape).astype(np.float32))
    np.savez(tmp_path / "far.npz", w=w + 1.0 * rng.standard_normal(w.shape).astype(np.float32))
    r = _cli("verify", str(tmp_path / "ref.npz"), str(tmp_path / "close.npz"), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["gates"] == {"min_snr_db": 10.0} and doc["gates_source"] == "default" and doc["samples"] == 0
    r = _cli("verify", str(tmp_path / "ref.npz"), str(tmp_path / "far.npz"), "--json")
    assert r.exit_code == 1, r.output
    assert "snr_db" in json.loads(r.stdout)["failures"]["w"][0]
    r = _cli("verify", str(tmp_path / "ref.npz"), str(tmp_path / "far.npz"), "--min-snr-db", "-20")
    assert r.exit_code == 0, r.output


def test_run_draws_random_inputs_with_samples_and_seed(tmp_path):
    m = _mlp(tmp_path / "m.onnx")
    outs = []
    for seed in ("1", "1", "2"):
        o = tmp_path / f"o{len(outs)}.npz"
        r = _cli("run", str(m), "--samples", "3", "--seed", seed, "-o", str(o), "--json")
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["samples"] == 3 and doc["outputs"]["y"]["shape"] == [3, 5]
        outs.append(np.load(o)["y"])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])
    _one_line_exit_2(_cli("run", str(m), "--samples", "0"), "--samples 0")
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 8), np.float32))
    _one_line_exit_2(_cli("run", str(m), "--samples", "2", "-i", f"x={x}"), "--samples")


def test_nan_in_the_candidate_fails_every_gate():
    from mconv.metrics import Gates, compare, gate_failures

    rng = np.random.default_rng(5)
    ref = rng.standard_normal((8, 10)).astype(np.float32)
    cand = ref.copy()
    cand[0, 3] = np.nan
    m = compare(ref, cand)
    for gates in (
        Gates(min_cosine=0.99),
        Gates(atol=1e-3),
        Gates(atol=1e-3, rtol=1e-3),
        Gates(min_snr_db=10),
        Gates(max_rel_l2=0.5),
    ):
        assert gate_failures(m, gates, ref, cand), gates
    same = ref.copy()
    same[0, 3] = np.nan  # NaN in the same place on both sides is agreement for atol/rtol
    assert not gate_failures(compare(same, same.copy()), Gates(atol=1e-6), same, same.copy())
