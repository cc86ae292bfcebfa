"""ai.onnx.ml on the reference: real scikit-learn pipelines, trained on the datasets scikit-learn
ships, converted by skl2onnx, imported by mconv and run by the reference and by ONNX Runtime.
Labels must be equal, scores within 1e-5 relative; the cpu bundle passes ``mconv verify``."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import skl2onnx
from mconv.cli.app import app
from mconv.engines.reference.executor import Executor
from mconv.irio import load_onnx
from sklearn import datasets
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.ensemble import (  # noqa: E402
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.impute import SimpleImputer  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import Binarizer, Normalizer, OneHotEncoder, StandardScaler  # noqa: E402
from sklearn.svm import SVC, SVR  # noqa: E402
from typer.testing import CliRunner


def _iris():
    x, y = datasets.load_iris(return_X_y=True)
    return x.astype(np.float32), y


def _diabetes():
    x, y = datasets.load_diabetes(return_X_y=True)
    return x.astype(np.float32), y


def _digits():
    x, y = datasets.load_digits(return_X_y=True)
    return x.astype(np.float32), y


def _cancer():
    x, y = datasets.load_breast_cancer(return_X_y=True)
    return x.astype(np.float32), y


def _onehot_data():
    """Iris with two integer category columns derived from it (binned petal length and width)."""
    x, y = _iris()
    cats = np.stack([np.digitize(x[:, 2], [2.5, 5.0]), np.digitize(x[:, 3], [0.8, 1.7])], axis=1)
    return np.concatenate([x[:, :2], cats.astype(np.float32)], axis=1), y


def _onehot_pipeline():
    pre = ColumnTransformer(
        [("num", StandardScaler(), [0, 1]), ("cat", OneHotEncoder(handle_unknown="ignore"), [2, 3])]
    )
    return make_pipeline(pre, LogisticRegression(max_iter=1000))


PIPELINES = {
    "scaler_logreg": (_iris, lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))),
    "random_forest": (_iris, lambda: RandomForestClassifier(n_estimators=12, max_depth=6, random_state=0)),
    "gbr_diabetes": (_diabetes, lambda: GradientBoostingRegressor(n_estimators=30, random_state=0)),
    "svc_prob": (_iris, lambda: make_pipeline(StandardScaler(), SVC(probability=True, random_state=0))),
    "svc_digits": (_digits, lambda: SVC(kernel="rbf", gamma=0.001)),
    "svr": (_diabetes, lambda: SVR(C=10.0)),
    "onehot_logreg": (_onehot_data, _onehot_pipeline),
    "logreg_binary": (_cancer, lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))),
    "gbc_binary": (_cancer, lambda: GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=0)),
    "svc_binary": (_cancer, lambda: make_pipeline(StandardScaler(), SVC(kernel="rbf"))),
    "forest_regressor": (
        _diabetes,
        lambda: RandomForestRegressor(n_estimators=8, max_depth=5, random_state=0),
    ),
    "impute_normalize_linreg": (
        _diabetes,
        lambda: make_pipeline(
            SimpleImputer(), Normalizer(norm="l2"), Binarizer(threshold=0.01), LinearRegression()
        ),
    ),
}


def _build(name, tmp_path):
    data, make = PIPELINES[name]
    x, y = data()
    model = make().fit(x, y)
    proto = skl2onnx.to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(proto.SerializeToString())
    return path, proto, x


def _rows(v):
    """A sequence of maps (ZipMap) as a [N, K] array keyed in sorted order; tensors as they are."""
    if isinstance(v, list) and v and isinstance(v[0], dict):
        keys = sorted(v[0])
        assert all(sorted(r) == keys for r in v)
        return np.array([[r[k] for k in keys] for r in v], dtype=np.float64)
    return np.asarray(v)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_matches_onnxruntime(name, tmp_path):
    path, proto, x = _build(name, tmp_path)
    feeds = {proto.graph.input[0].name: x[:64]}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    model = load_onnx(path)  # map and sequence types load (onnx_ir has no map type of its own)
    got = Executor(model).run(feeds)
    for out, w in zip(proto.graph.output, want, strict=True):
        g = got[out.name]
        if isinstance(w, list):  # ZipMap: a sequence of maps, kept as one
            assert isinstance(g, list) and len(g) == len(w) and all(isinstance(r, dict) for r in g)
            assert [sorted(r) for r in g] == [sorted(r) for r in w]
        w, g = _rows(w), _rows(g)
        assert g.shape == w.shape, out.name
        if w.dtype.kind in "iuSUO" or out.name.endswith("label"):
            np.testing.assert_array_equal(g, w, err_msg=out.name)
        else:
            np.testing.assert_allclose(
                g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max() or 1), err_msg=out.name
            )


def test_map_types_survive_import_and_save(tmp_path):
    path, proto, _ = _build("scaler_logreg", tmp_path)
    out = tmp_path / "imported.onnx"
    r = CliRunner().invoke(app, ["import", str(path), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    saved = onnx.load(out)
    prob = {o.name: o for o in saved.graph.output}["output_probability"]
    assert prob.type == {o.name: o for o in proto.graph.output}["output_probability"].type
    assert prob.type.sequence_type.elem_type.map_type.key_type == onnx.TensorProto.INT64
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "name", ["scaler_logreg", "random_forest", "gbr_diabetes", "svc_prob", "onehot_logreg"]
)
def test_cpu_bundle_verifies(name, tmp_path):
    path, _, _ = _build(name, tmp_path)
    bundle = tmp_path / "bundle"
    runner = CliRunner()
    r = runner.invoke(app, ["export", str(path), "--target", "cpu", "-o", str(bundle), "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["verify", str(path), str(bundle), "-q"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("target", ["xla", "metal", "webgpu"])
def test_other_targets_refuse_ml_by_name(target, tmp_path):
    path, _, _ = _build("scaler_logreg", tmp_path)
    r = CliRunner().invoke(app, ["export", str(path), "--target", target, "-o", str(tmp_path / "b"), "-q"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert "Scaler" in lines[0] or "ai.onnx.ml" in lines[0], lines[0]
    assert not (tmp_path / "b").exists()


def test_tree_ensemble_opset5_matches_onnxruntime():
    """ai.onnx.ml 5's unified TreeEnsemble (skl2onnx still writes the older ops): two trees over
    LEQ, LT and GT splits, summed, on the iris features."""
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(
        "TreeEnsemble",
        ["x"],
        ["y"],
        domain="ai.onnx.ml",
        nodes_featureids=[2, 3, 0],
        nodes_splits=numpy_helper.from_array(np.array([2.5, 1.7, 5.8], np.float32)),
        nodes_modes=numpy_helper.from_array(np.array([0, 1, 3], np.uint8)),
        nodes_truenodeids=[0, 1, 3],
        nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 2, 4],
        nodes_falseleafs=[0, 1, 1],
        tree_roots=[0, 2],
        leaf_targetids=[0, 0, 0, 0, 0],
        leaf_weights=numpy_helper.from_array(np.array([1.0, 2.0, 3.0, 10.0, 20.0], np.float32)),
        aggregate_function=1,
        post_transform=0,
        n_targets=1,
    )
    graph = helper.make_graph(
        [node],
        "trees",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
    )
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)],
        ir_version=10,
    )
    x, _ = _iris()
    (want,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    from mconv.irio import from_proto

    got = Executor(from_proto(proto)).run({"x": x})["y"]
    assert len(np.unique(want)) >= 3  # every path is taken
    np.testing.assert_array_equal(got, want)
