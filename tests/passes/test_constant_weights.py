"""Weights stored as Constant nodes (paddle2onnx stores every weight so: PP-OCRv4's recognizer,
issue 45 item 3): prune, cluster and finetune find them (prune rule 7, cluster rule 11, finetune
rule 10); weights computed from constants are refused with one line saying what to run first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv import passes as P
from mconv.errors import InputError
from mconv.irio import from_proto, to_proto
from onnx import helper, numpy_helper

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def digits(n: int = 300) -> dict[str, np.ndarray]:
    """Real 8x8 digits (the fixture's training split), seeded subset."""
    with np.load(FIXTURES / "digits_train.npz") as z:
        idx = np.sort(np.random.default_rng(4).permutation(len(z["labels"]))[:n])
        return {
            "input": z["images"][idx].reshape(n, 64).astype(np.float32) / 16.0,
            "labels": z["labels"][idx],
        }


def as_constants(transpose: bool = False) -> onnx.ModelProto:
    """The digits MLP with every initializer moved into a Constant node (as paddle2onnx exports);
    with ``transpose``, each Gemm weight is stored transposed behind a Transpose node instead."""
    m = onnx.load(FIXTURES / "digits_mlp.onnx")
    consts = []
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if transpose and a.ndim == 2:
            consts.append(
                helper.make_node(
                    "Constant", [], [init.name + "_t"], value=numpy_helper.from_array(a.T.copy())
                )
            )
            consts.append(helper.make_node("Transpose", [init.name + "_t"], [init.name], perm=[1, 0]))
        else:
            consts.append(
                helper.make_node("Constant", [], [init.name], value=numpy_helper.from_array(a, init.name))
            )
    del m.graph.initializer[:]
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(consts + nodes)
    onnx.checker.check_model(m)
    return m


def run_ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def test_finetune_trains_weights_stored_as_constant_nodes():
    data = digits()
    proto = as_constants()
    model = from_proto(proto)
    spec = P.parse_spec("prune(sparsity=0.8),finetune(epochs=3,lr=0.003)")
    model, (pruned, tuned) = P.run_pipeline(model, spec, P.PassContext(data=data, seed=0))
    assert [t["name"] for t in pruned.tensors] == ["fc1.weight", "fc2.weight", "fc3.weight"]
    assert {t["name"] for t in tuned.tensors} == {
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"
    }  # fmt: skip
    assert any("Constant nodes became initializers" in n for n in pruned.notes)
    notes = " ".join(tuned.notes)
    first = float(notes.split("epoch 0: loss -, accuracy ")[1].split()[0])
    last = float(notes.split("epoch 3: loss ")[1].split("accuracy ")[1].split()[0])
    print(f"held-out accuracy after 80% pruning {first:.3f} -> {last:.3f} after masked retraining")
    assert last > first  # the weights trained (before: a note, "no trainable weights", and nothing)
    out = to_proto(model)
    assert not any(n.op_type == "Constant" for n in out.graph.node if n.output[0].startswith("fc"))
    w = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    assert np.mean(w["fc1.weight"] == 0) == pytest.approx(0.8, abs=1e-3)  # the mask held


def test_lifting_constant_nodes_keeps_what_the_model_computes():
    x = digits(64)["input"]
    proto = as_constants()
    model = from_proto(proto)
    from mconv.edit.weights import lift_constant_weights

    assert sorted(lift_constant_weights(model)) == sorted(
        i.name for i in onnx.load(FIXTURES / "digits_mlp.onnx").graph.initializer
    )
    np.testing.assert_array_equal(run_ort(to_proto(model), x), run_ort(proto, x))


@pytest.mark.parametrize("spec", ["finetune(epochs=1)", "prune(sparsity=0.5)", "cluster(bits=4)"])
def test_weights_computed_from_constants_are_refused_with_what_to_run_first(spec):
    model = from_proto(as_constants(transpose=True))
    with pytest.raises(InputError) as err:
        P.run_pipeline(model, P.parse_spec(spec), P.PassContext(data=digits(64), seed=0))
    text = str(err.value) + " " + (err.value.hint or "")
    assert "Transpose" in text and "--passes fold,eliminate-identity,dce," in text and "fc1" in text


def test_the_cli_refuses_in_one_line_and_runs_after_fold(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    src, npz = tmp_path / "t.onnx", tmp_path / "d.npz"
    onnx.save(as_constants(transpose=True), src)
    np.savez(npz, **digits(96))

    def optimize(passes: str):
        args = ["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--data", str(npz), "--passes", passes]
        return CliRunner().invoke(app, args)

    r = optimize("finetune(epochs=1)")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("progress")]
    assert len(lines) == 1 and "fold" in lines[0], r.output
    r = optimize("fold,eliminate-identity,dce,finetune(epochs=1)")
    assert r.exit_code == 0, r.output


def test_weights_stored_as_float16_behind_a_cast_say_to_start_from_the_float_model():
    from mconv.passes import run_pipeline

    model, _ = run_pipeline(
        from_proto(onnx.load(FIXTURES / "digits_mlp.onnx")), P.parse_spec("fp16"), P.PassContext()
    )
    with pytest.raises(InputError) as err:
        P.run_pipeline(model, P.parse_spec("prune(sparsity=0.5)"), P.PassContext())
    assert "Cast" in str(err.value) and "float32 model" in (err.value.hint or "")
