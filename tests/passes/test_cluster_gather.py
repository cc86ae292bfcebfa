"""cluster rule 9: embedding tables (a Gather's rank-2 float ``data`` along axis 0) are weights."""

from __future__ import annotations

import json

import numpy as np
import onnx
from mconv import api
from mconv.container import read_container
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _model(path, rng, *, axis=0, shared=False):
    """ids -> Gather(table) -> MatMul(w) -> y; ``shared``: the MatMul's weight is the table itself
    (a [64, 64] table), ``axis=1`` gathers columns (not an embedding)."""
    table = rng.standard_normal((64, 64 if shared else 32)).astype(np.float32)
    w = rng.standard_normal((64 if shared else 32, 16)).astype(np.float32)
    nodes = [
        h.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=axis),
        h.make_node("MatMul", ["e", "table" if shared else "w"], ["y"], name="head"),
    ]
    inits = [nh.from_array(table, "table")] + ([] if shared else [nh.from_array(w, "w")])
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("ids", T.INT64, [4, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        inits,
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]), path)
    return rng.integers(0, 32, size=(4, 6), dtype=np.int64)


def _distinct(path, name):
    m = onnx.load(str(path))
    return np.unique(next(nh.to_array(t) for t in m.graph.initializer if t.name == name)).size


def test_the_embedding_table_is_clustered_and_exported_as_a_palette(tmp_path):
    rng = np.random.default_rng(21)
    ids = _model(tmp_path / "m.onnx", rng)
    res = api.optimize(tmp_path / "m.onnx", passes="cluster(bits=4)", output=tmp_path / "c.onnx")
    rows = {t["name"]: t for t in res.reports[0].tensors}
    assert set(rows) == {"table", "w"} and rows["table"]["op"] == "Gather"
    assert (
        _distinct(tmp_path / "c.onnx", "table") <= 16 and _distinct(tmp_path / "m.onnx", "table") == 64 * 32
    )
    facts = json.loads(
        dict((p.key, p.value) for p in onnx.load(str(tmp_path / "c.onnx")).metadata_props)[
            "mconv.compression"
        ]
    )
    assert facts["table"]["bits"] == 4 and facts["table"]["axis"] == 0
    api.export(tmp_path / "c.onnx", "cpu", tmp_path / "b")
    with read_container(tmp_path / "b" / "weights.mcw") as c:
        rec = c.entries["table"].record
    assert rec["codec"] == "palette" and rec["bits"] == 4, rec
    got = next(iter(api.open(tmp_path / "b").run({"ids": ids}).values()))
    want = next(iter(api.open(tmp_path / "c.onnx").run({"ids": ids}).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_op_types_without_gather_and_non_embedding_gathers_leave_the_table(tmp_path):
    rng = np.random.default_rng(22)
    _model(tmp_path / "m.onnx", rng)
    api.optimize(
        tmp_path / "m.onnx", passes="cluster(bits=4,op_types=['MatMul'])", output=tmp_path / "c.onnx"
    )
    assert _distinct(tmp_path / "c.onnx", "table") == 64 * 32 and _distinct(tmp_path / "c.onnx", "w") <= 16
    _model(tmp_path / "cols.onnx", np.random.default_rng(22), axis=1)
    res = api.optimize(tmp_path / "cols.onnx", passes="cluster(bits=4)", output=tmp_path / "c2.onnx")
    assert [t["name"] for t in res.reports[0].tensors] == ["w"]


def test_a_table_that_is_also_a_weight_is_clustered_once_as_that_weight(tmp_path):
    rng = np.random.default_rng(23)
    _model(tmp_path / "m.onnx", rng, shared=True)
    res = api.optimize(tmp_path / "m.onnx", passes="cluster(bits=4,groups=4)", output=tmp_path / "c.onnx")
    rows = res.reports[0].tensors
    assert [(t["name"], t["op"]) for t in rows] == [("table", "MatMul")]
