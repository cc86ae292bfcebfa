"""Histograms known without counting (palette rule 8, choose rule 8): the cluster pass's counts
reach the predicted account and export exactly, and nothing stale is ever trusted."""

from __future__ import annotations

import gc

import numpy as np
import onnx_ir as ir
import pytest
from mconv import codecs
from mconv.codecs.choose import TensorStats, best_spec
from mconv.codecs.palette import known_histogram, remember_histogram, value_histogram
from mconv.irio import spilling, weight_tensor
from mconv.passes.cluster import cluster_array


def _counted(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The histogram by sorting: a writable copy has nothing remembered."""
    copy = np.array(a)
    assert known_histogram(copy) is None
    return value_histogram(copy)


def _cases():
    rng = np.random.default_rng(20261203)
    big = rng.standard_t(3, (300, 400)).astype(np.float32)  # 120,000 values: the bins' path
    pruned = big.copy()
    pruned[rng.random(big.shape) < 0.7] = 0.0
    signed = pruned.copy()
    signed[0, :7] = -0.0
    tiny = big.copy()
    tiny[1, 1] = 1e-42  # a subnormal shares the zero code
    tiny_pruned = pruned.copy()
    tiny_pruned[1, 1] = 1e-42  # ... beside exact zeros: the nonzero values are clustered alone
    small = rng.standard_normal((20, 30)).astype(np.float32)  # one bin per distinct value
    small_zeros = small.copy()
    small_zeros[:5] = 0.0
    return [
        (big, {"bits": 4}),
        (big, {"bits": 4, "init": "optimal"}),
        (big, {"bits": 5, "init": "density"}),
        (pruned, {"bits": 3}),
        (signed, {"bits": 3}),
        (tiny, {"bits": 4}),
        (tiny_pruned, {"bits": 3}),
        (big, {"bits": 4, "groups": 4}),
        (pruned, {"bits": 2, "groups": 3, "axis": 1}),
        (small, {"bits": 3}),
        (small_zeros, {"bits": 3}),
        (small.astype(np.float64), {"bits": 3}),
        (rng.standard_normal((300, 300)).astype(np.float16), {"bits": 4}),
        (np.zeros((10, 10), np.float32), {"bits": 2}),
        (np.full((70_000,), 0.25, np.float32), {"bits": 1}),
    ]


@pytest.mark.parametrize("case", range(len(_cases())))
def test_the_cluster_pass_remembers_the_histogram_a_sort_finds(case):
    array, kw = _cases()[case]
    out = cluster_array(array, **kw)
    known = known_histogram(out)
    assert known is not None
    book, counts = _counted(out)
    assert np.array_equal(codecs.palette.bit_view(known[0]), codecs.palette.bit_view(book))
    assert np.array_equal(known[1], counts) and int(counts.sum()) == out.size
    # and the specs and sizes chosen from it are those chosen by counting
    assert best_spec(out, {"bits": kw["bits"]}) == best_spec(np.array(out), {"bits": kw["bits"]})
    stats, scanned = TensorStats.of(out), TensorStats._scan(np.array(out), None)
    assert stats.fp16_exact == scanned.fp16_exact and stats.nonzeros == scanned.nonzeros
    assert np.array_equal(stats.small_gaps, scanned.small_gaps)
    assert np.array_equal(stats.large_gaps, scanned.large_gaps)


def test_a_remembered_array_is_read_only_and_forgotten_when_made_writable_again():
    a = cluster_array(np.random.default_rng(3).standard_normal(80_000).astype(np.float32), 3)
    with pytest.raises(ValueError):
        a[0] = 1.0
    assert known_histogram(a) is not None
    b = np.array(a)
    remember_histogram(b, *value_histogram(a))
    b.flags.writeable = True  # someone may now change it under the histogram
    assert known_histogram(b) is None
    b[0] = 99.0
    assert 99.0 in value_histogram(b)[0]


def test_a_histogram_is_forgotten_with_its_array():
    from mconv.codecs import palette

    before = len(palette._KNOWN)
    a = cluster_array(np.random.default_rng(4).standard_normal(70_000).astype(np.float32), 4)
    assert len(palette._KNOWN) > before and known_histogram(a) is not None
    del a
    gc.collect()
    assert len(palette._KNOWN) == before


def test_a_histogram_that_does_not_add_up_to_the_array_is_not_used():
    a = np.arange(12, dtype=np.float32)
    stats = TensorStats.of(a, known=(np.array([1.0], np.float32), np.array([5])))
    assert stats.nonzeros == 11 and stats.dense_histogram()[1].sum() == 12


def test_weight_tensor_carries_the_histogram_in_memory_and_spilled(tmp_path):
    a = cluster_array(np.random.default_rng(5).standard_t(3, (256, 512)).astype(np.float32), 4)
    t = weight_tensor(a, "W")
    assert isinstance(t, ir.Tensor) and known_histogram(t) is not None
    with spilling(tmp_path, min_bytes=1):
        spilled = weight_tensor(a, "W")
        assert isinstance(spilled, ir.ExternalTensor)
        assert known_histogram(spilled) is not None
        assert np.array_equal(known_histogram(spilled)[1], known_histogram(a)[1])


def _clustered_model(tmp, zeros: bool, output: bool = True):
    from mconv.api import optimize
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(6)
    w = (rng.standard_t(3, (512, 640)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W"], ["y"], transB=1, name="fc")],
        "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 640])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])],
        [numpy_helper.from_array(w, "W")],
    )
    src = tmp / "fc.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    passes = "prune(sparsity=0.6),cluster(bits=4)" if zeros else "cluster(bits=4,init='optimal')"
    return optimize(str(src), passes=passes, output=str(tmp / "out.onnx") if output else None)


@pytest.mark.parametrize("zeros", [False, True])
def test_the_predicted_account_from_the_pass_is_what_export_stores(tmp_path, zeros, monkeypatch):
    import mconv.account as account
    import mconv.irio as irio
    from mconv.irio import load_onnx
    from mconv.targets import get_target

    monkeypatch.setattr(irio, "SPILL_MIN_BYTES", 1)  # every rewritten weight to the scratch folder
    result = _clustered_model(tmp_path, zeros)
    predicted = {row["name"]: row for row in result.account["layers"]}
    bundle = get_target("cpu").export(load_onnx(tmp_path / "out.onnx"), tmp_path / "bundle", {})
    stored = {row["name"]: row for row in bundle.account["layers"]}
    assert predicted["W"]["bytes"] == stored["W"]["bytes"]
    assert predicted["W"]["codec"] == stored["W"]["codec"]
    assert predicted["W"]["kept"] == pytest.approx(0.4 if zeros else 1.0, abs=0.01)
    # the same account counted from the saved model, nothing remembered
    again = account.predicted_account(load_onnx(tmp_path / "out.onnx"))
    assert again["layers"][0]["bytes"] == predicted["W"]["bytes"]
    assert again["layers"][0]["kept"] == predicted["W"]["kept"]
    # with no output the weight stays in the scratch folder when the account runs; one without
    # zeros is sized without reading it
    if not zeros:
        monkeypatch.setattr(account, "owned_array", lambda t: pytest.fail("read a spilled tensor"))
    unsaved = _clustered_model(tmp_path, zeros, output=False)
    assert unsaved.account["layers"][0]["bytes"] == predicted["W"]["bytes"]
    assert unsaved.account["layers"][0]["kept"] == predicted["W"]["kept"]
