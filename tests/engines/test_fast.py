"""engines/fast.py: the engine choice, programs compiled once per graph structure, and the
fixed-shape batched forward, on the digits CNN and real UCI digits."""

from __future__ import annotations

import numpy as np
from mconv.api.demo import fixture_path
from mconv.engines import fast as FE
from mconv.engines.reference.executor import Executor
from mconv.irio import load_onnx
from mconv.passes.pipeline import snapshot_model
from mconv.passes.prune import magnitude_mask


def _digits(n: int) -> dict[str, np.ndarray]:
    with np.load(fixture_path("digits_test.npz")) as z:
        return {"input": (z["images"][:n].astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)}


def _pruned_copy(model, sparsity: float):
    """The model with its largest weight tensor magnitude-pruned: same graph, other values."""
    import onnx_ir as ir

    copy = snapshot_model(model)
    name, v = max(
        ((n, v) for n, v in copy.graph.initializers.items() if v.const_value is not None),
        key=lambda nv: nv[1].const_value.size,
    )
    w = v.const_value.numpy()
    keep, _ = magnitude_mask(w, sparsity)
    v.const_value = ir.Tensor(np.where(keep, w, 0).astype(w.dtype), name=name)
    return copy


def test_auto_is_xla_when_jax_imports_and_the_label_names_the_device():
    assert FE.resolve_engine(None, None) == ("xla", "cpu")
    assert FE.resolve_engine("auto", "cuda") == ("xla", "cuda")
    assert FE.resolve_engine("reference", None) == ("reference", "cpu")
    assert [
        FE.engine_label("xla", "cpu"),
        FE.engine_label("xla", "cuda"),
        FE.engine_label("reference", "cpu"),
    ] == [
        "xla-cpu",
        "xla-cuda",
        "reference",
    ]


def test_one_program_per_structure_runs_every_weight_set_as_the_oracle_does():
    model = load_onnx(fixture_path("digits_dwcnn.onnx"))
    out = model.graph.outputs[0].name
    feeds = _digits(300)
    memo: dict = {}
    a = FE.xla_engine(model, [out], "cpu", memo, role="eval")
    pruned = _pruned_copy(model, 0.8)
    b = FE.xla_engine(pruned, [out], "cpu", memo, role="eval")
    assert b is a  # same graph, other values: the compiled engine is reused
    assert FE.xla_engine(model, [out], "cpu", memo, role="teacher") is not a  # roles hold their own weights
    got = FE.run_batched(b, feeds, [out], batch=128)[out]  # 300 = 128 + 128 + 44 (padded to 128)
    want = Executor(pruned).run(feeds, outputs=[out])[out]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    orig = Executor(model).run(feeds, outputs=[out])[out]
    assert np.mean(got.argmax(1) != orig.argmax(1)) > 0  # the pruned weights were really used
    again = FE.run_batched(FE.xla_engine(model, [out], "cpu", memo, role="eval"), feeds, [out], batch=128)[
        out
    ]
    np.testing.assert_allclose(again, orig, rtol=1e-4, atol=1e-5)  # and the original's put back


def test_a_structure_change_gets_a_program_of_its_own():
    model = load_onnx(fixture_path("digits_dwcnn.onnx"))
    out = model.graph.outputs[0].name
    memo: dict = {}
    a = FE.xla_engine(model, [out], "cpu", memo, role="eval")
    other = snapshot_model(model)
    node = next(n for n in other.graph if n.op_type in ("Relu", "Clip"))
    node.name = node.name  # unchanged name: still the same structure
    assert FE.structure_key(other) == FE.structure_key(model)
    first = next(iter(other.graph))
    first.outputs[0].name = first.outputs[0].name + "_renamed"
    assert FE.structure_key(other) != FE.structure_key(model)
    assert FE.xla_engine(other, [out], "cpu", memo, role="eval") is not a


def test_auto_for_the_budget_search_weighs_the_work_against_the_compiles():
    lenet_stage = 2.3e6 * 750 * 20  # LeNet-5's multiply-adds a sample, 750 digits, 20 epochs
    linear_stage = 640 * 225 * 80  # a 64 -> 10 classifier on 225 digits, 80 epochs
    assert FE.auto_engine(lenet_stage) == ("xla", "cpu")
    assert FE.auto_engine(linear_stage) == ("reference", "cpu")
    assert FE.auto_engine(linear_stage, "cuda") == ("xla", "cuda")  # a GPU asked for is xla's
