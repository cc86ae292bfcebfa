"""The budget search's entropy-constrained clustering choice (drivers/budget rule 13, --cluster
entropy): each bit width may be clustered by ECSQ where export codes it to no more bytes at less
Fisher-weighted error, and the search still meets its byte budget (measured, as export writes)."""

from __future__ import annotations

import numpy as np
from mconv.drivers import budget as B
from mconv.drivers.budget.allocation import _entropy_choice
from mconv.drivers.budget.sensitivity import _compressed, _stored_bytes
from mconv.irio import load_onnx
from mconv.targets import get_target

from tests.drivers.test_budget import FAST, _subset, fixture_path


def test_the_entropy_choice_never_costs_more_bytes_or_error_than_kmeans_and_wins_on_lenet(shared):
    from tests.passes.test_cluster_entropy import _pruned_ip1

    w = _pruned_ip1(shared)
    f = np.ones(w.shape)  # uniform weight: the cost is the squared error
    for bits in (3, 4):
        c = _compressed(w, 0.0, bits)
        nbytes = _stored_bytes(c, 0.9, bits)
        cost = 0.5 * float(np.sum(np.square(c.astype(np.float64) - w)))
        got_bytes, got_cost, plan = _entropy_choice(w, w, f, 0.9, bits, nbytes, cost)
        assert got_bytes <= nbytes and got_cost <= cost
        if bits == 3:  # measured in tests/passes/test_cluster_entropy.py: ECSQ at 4 bits wins here
            assert plan["method"] == "entropy" and plan["bits"] == 4 and got_cost < 0.8 * cost
            # the plan re-run through the pass's function codes to the bytes it was chosen for
            from mconv.passes.cluster import cluster_array

            again = cluster_array(w, plan["bits"], lam=plan["lam"])
            assert _stored_bytes(again, 0.9, plan["bits"]) == got_bytes


def test_the_budget_with_entropy_clustering_meets_a_byte_budget(tmp_path):
    data = _subset(240, seed=4)
    target = 7_000
    model = load_onnx(fixture_path("digits_mlp.onnx"))
    result = B.compress_to_budget(
        model, data, target_size=target, seed=1, cluster="entropy", structured="off", **FAST
    )  # rule 13 alone: without structured options the allocation's bits are the entropy choice
    assert result.met and result.size["weights_file"] <= target
    out = tmp_path / "bundle"
    get_target("cpu").export(result.model, out, {})
    assert (out / "weights.mcw").stat().st_size == result.size["weights_file"]  # measured = written
    clusters = [s for s in result.as_dict()["recipe"] if s["name"] == "cluster"]
    chosen = [v for s in clusters for v in s["config"].get("op_name", {}).values()]
    assert any(v.get("method") == "entropy" and v["lam"] > 0 for v in chosen)
    assert result.baseline - result.final <= 0.25  # a size-only target: still a working classifier


def test_an_unknown_cluster_method_is_an_input_error_naming_the_option():
    import pytest
    from mconv.errors import InputError

    with pytest.raises(InputError, match="cluster 'bogus'") as info:
        B.BudgetConfig(target_size=9000, cluster="bogus")
    assert info.value.where == "--cluster"
