"""Keras importer against real Keras 3 (the oracle) and the shared Keras 2 files."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
import h5py
import keras
import onnxruntime as ort
from keras import layers as L  # noqa: E402
from mconv.errors import InputError, UnsupportedError  # noqa: E402
from mconv.formats import import_model  # noqa: E402
from mconv.irio import to_proto  # noqa: E402

RTOL = ATOL = 1e-5
HAVE_EXECUTOR = importlib.util.find_spec("mconv.engines.reference.executor") is not None


def _randomize(model: keras.Model, seed: int) -> None:
    """Random weights; variances positive so BatchNormalization stays finite."""
    rng = np.random.default_rng(seed)
    new = []
    for w in model.weights:
        a = rng.normal(0, 0.5, size=tuple(w.shape)).astype(np.float32)
        if "variance" in w.path:
            a = np.abs(a) + 0.5
        if "count" in w.path:
            a = np.zeros(tuple(w.shape), dtype=w.dtype)
        new.append(a)
    model.set_weights(new)
    for layer in model.layers:
        if isinstance(layer, L.Normalization):
            layer.finalize_state()  # Normalization caches mean/variance from its variables


def _feeds(model: keras.Model, seed: int, batch: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    out = []
    for t in model.inputs:
        shape = (batch, *t.shape[1:])
        if "int" in str(t.dtype):
            out.append(rng.integers(0, 10, size=shape).astype(np.int32))
        else:
            out.append(rng.normal(0, 1, size=shape).astype(np.float32))
    return out


def _run_onnx(onnx_model, feeds: list[np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(to_proto(onnx_model).SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, feeds, strict=True)))


def _expect(model: keras.Model, feeds) -> list[np.ndarray]:
    y = model(feeds if len(feeds) > 1 else feeds[0], training=False)
    ys = y if isinstance(y, list | tuple) else [y]
    return [np.asarray(v) for v in ys]


def _check_built(build, tmp_path: Path, seed: int, saves=(".keras",)) -> dict:
    """Build a fixture model and check its imports with onnxruntime, then the .keras import with
    the reference executor too (when it exists), so each Keras model is built only once."""
    results = _check(build(), tmp_path, seed, saves)
    if HAVE_EXECUTOR:
        from mconv.engines.reference.executor import Executor

        imported, feeds, want = results[".keras"]
        names = [v.name for v in imported.graph.inputs]
        got = Executor(imported).run(dict(zip(names, feeds, strict=True)))
        got = list(got.values()) if isinstance(got, dict) else list(got)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=RTOL, atol=ATOL, err_msg="reference executor")
    return results


def _check(model: keras.Model, tmp_path: Path, seed: int = 0, saves=(".keras",)) -> dict:
    _randomize(model, seed)
    feeds = _feeds(model, seed)
    want = _expect(model, feeds)
    results = {}
    for ext in saves:
        paths = []
        if ext == "json":
            (tmp_path / "m.json").write_text(model.to_json())
            model.save_weights(tmp_path / "m.weights.h5")
            paths = [tmp_path / "m.weights.h5", tmp_path / "m.json"]  # weights first: order is free
        else:
            model.save(tmp_path / f"m{ext}")
            paths = [tmp_path / f"m{ext}"]
        imported = import_model(paths)
        got = _run_onnx(imported, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape, ext
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"saved as {ext}")
        results[ext] = (imported, feeds, want)
    return results


# ------------------------------------------------------------------------------ fixture models


def _dense_activations_model() -> keras.Model:
    x = inp = keras.Input((6,), name="x")
    for act in (
        "relu",
        "elu",
        "selu",
        "gelu",
        "swish",
        "silu",
        "hard_sigmoid",
        "tanh",
        "softplus",
        "sigmoid",
        "linear",
        "softsign",
        "relu6",
    ):
        x = L.Dense(6, activation=act, name=f"d_{act}")(x)
    x = L.ReLU(max_value=1.5, negative_slope=0.1, threshold=0.2, name="relu_full")(x)
    x = L.Dense(6, name="d2")(x)
    x = L.ReLU(max_value=0.8, name="relu_max")(x)
    x = L.LeakyReLU(negative_slope=0.25, name="leaky")(x)
    x = L.Dropout(0.5, name="drop")(x)
    x = L.BatchNormalization(name="bn")(x)
    x = L.LayerNormalization(name="ln")(x)
    x = L.Activation("softmax", name="act_softmax")(x)
    return keras.Model(inp, x)


def _conv2d_model() -> keras.Model:
    inp = keras.Input((9, 9, 3), name="img")
    x = L.Conv2D(4, 3, strides=2, padding="same", activation="relu", name="conv_s2")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.MaxPooling2D(3, strides=2, padding="same", name="maxpool_same")(x)
    x = L.UpSampling2D(3, name="up_nearest")(x)
    x = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="dw")(x)
    x = L.SeparableConv2D(5, 3, padding="valid", depth_multiplier=2, name="sep")(x)
    x = L.Conv2DTranspose(3, 3, strides=2, padding="same", name="deconv_same")(x)
    x = L.Conv2DTranspose(2, 2, strides=3, padding="valid", name="deconv_valid")(x)
    x = L.AveragePooling2D(3, strides=2, padding="same", name="avgpool_same")(x)
    x = L.ZeroPadding2D(((1, 0), (2, 1)), name="zpad")(x)
    x = L.Cropping2D(((0, 1), (1, 0)), name="crop")(x)
    x = L.UpSampling2D(2, interpolation="bilinear", name="up_bilinear")(x)
    x = L.Conv2D(3, (2, 3), dilation_rate=(1, 2), name="conv_dil")(x)
    x = L.AveragePooling2D(2, name="avgpool_valid")(x)
    g = L.GlobalAveragePooling2D(keepdims=True, name="gap_keep")(x)
    m = L.GlobalMaxPooling2D(name="gmp")(x)
    f = L.Flatten(name="flat")(x)
    out = L.Dense(3, activation="softmax", name="head")(f)
    d = L.Conv2DTranspose(2, 4, strides=3, padding="same", output_padding=2, name="deconv_outpad")(inp)
    return keras.Model(inp, [out, g, m, d])


def _conv1d_3d_model() -> keras.Model:
    a = keras.Input((11, 3), name="seq")
    x = L.Conv1D(4, 3, strides=2, padding="same", name="c1")(a)
    x = L.MaxPooling1D(2, padding="same", name="mp1")(x)
    x = L.ZeroPadding1D((2, 1), name="zp1")(x)
    x = L.Conv1D(4, 2, padding="causal", name="c1_causal")(x)
    x = L.AveragePooling1D(2, name="ap1")(x)
    x = L.Cropping1D((1, 0), name="cr1")(x)
    x = L.UpSampling1D(2, name="up1")(x)
    y1 = L.GlobalAveragePooling1D(name="gap1")(x)
    b = keras.Input((5, 4, 6, 2), name="vol")
    v = L.Conv3D(3, (2, 3, 3), strides=(1, 2, 1), padding="same", name="c3")(b)
    v = L.Conv3D(2, 2, groups=1, name="c3b")(v)
    y2 = L.GlobalMaxPooling3D(name="gmp3")(v)
    return keras.Model([a, b], [y1, y2])


def _functional_model() -> keras.Model:
    a = keras.Input((5,), name="a")
    b = keras.Input((5,), name="b")
    shared = L.Dense(5, activation="tanh", name="shared")
    sa, sb = shared(a), shared(b)  # one layer, two calls
    merged = [
        L.Add(name="add")([sa, sb]),
        L.Subtract(name="sub")([sa, sb]),
        L.Multiply(name="mul")([sa, sb]),
        L.Average(name="avg")([sa, sb, a]),
        L.Maximum(name="max")([sa, sb]),
        L.Minimum(name="min")([sa, sb]),
    ]
    c = L.Concatenate(name="cat")(merged)
    inner = keras.Sequential(
        [keras.Input((30,)), L.Dense(12, activation="relu", name="in_d"), L.BatchNormalization(name="in_bn")],
        name="inner",
    )
    h = inner(c)
    r = L.Reshape((3, 4), name="rs")(h)
    p = L.Permute((2, 1), name="perm")(r)
    f = L.Flatten(name="fl")(p)
    return keras.Model([a, b], [f, shared(sa)])


def _rnn_model() -> keras.Model:
    x = keras.Input((6, 4), name="seq")
    y = L.LSTM(5, return_sequences=True, name="lstm")(x)
    y = L.GRU(3, return_sequences=True, reset_after=True, name="gru_after")(y)
    y = L.GRU(4, return_sequences=True, reset_after=False, name="gru_before")(y)
    y = L.SimpleRNN(3, return_sequences=True, name="srnn")(y)
    y = L.LSTM(
        3, return_sequences=True, go_backwards=True, recurrent_activation="hard_sigmoid", name="lstm_back"
    )(y)
    b1 = L.Bidirectional(L.LSTM(2, return_sequences=True), merge_mode="concat", name="bi_cat")(y)
    b2 = L.Bidirectional(L.GRU(3), merge_mode="sum", name="bi_sum")(b1)
    b3 = L.Bidirectional(L.SimpleRNN(2), merge_mode="mul", name="bi_mul")(y)
    b4 = L.Bidirectional(L.GRU(2, return_sequences=True), merge_mode="ave", name="bi_ave")(y)
    t = L.TimeDistributed(L.Dense(3, activation="relu"), name="td_dense")(b4)
    last, h, c = L.LSTM(3, return_state=True, name="lstm_state")(t)
    img = keras.Input((3, 6, 6, 2), name="frames")
    tc = L.TimeDistributed(L.Conv2D(2, 3, padding="same"), name="td_conv")(img)
    return keras.Model([x, img], [b2, b3, last, h, c, tc])


def _embedding_model() -> keras.Model:
    ids = keras.Input((4,), dtype="int32", name="ids")
    e = L.Embedding(10, 3, name="emb")(ids)
    e = L.Flatten(name="fl")(e)
    v = keras.Input((3,), name="v")
    r = L.Rescaling(0.5, offset=-1.0, name="rescale")(v)
    n1 = L.Normalization(mean=[1.0, 2.0, 3.0], variance=[4.0, 0.25, 1.0], name="norm_fixed")(r)
    norm = L.Normalization(name="norm_adapted")
    norm.adapt(np.random.default_rng(3).normal(2.0, 3.0, size=(50, 3)).astype(np.float32))
    n2 = norm(n1)
    n3 = L.Normalization(mean=[0.5], variance=[2.0], invert=True, name="norm_invert")(n2)
    return keras.Model([ids, v], [e, n3])


# ---------------------------------------------------------------------------------------- tests


def test_dense_and_every_activation_match_keras_in_keras_and_h5_files(tmp_path):
    _check_built(_dense_activations_model, tmp_path, seed=1, saves=(".keras", ".h5", "json"))


def test_conv2d_family_padding_pools_upsampling_match_keras(tmp_path):
    res = _check_built(_conv2d_model, tmp_path, seed=2, saves=(".keras", ".h5"))
    model = res[".keras"][0]
    ops = [n.op_type for n in model.graph]
    # one Transpose into channels-first at the input, one back before Flatten, and one per
    # channels-first graph output (gap_keep, deconv_outpad): none between consecutive convs and pools
    assert ops.count("Transpose") == 4, ops


def test_conv1d_conv3d_causal_and_multiple_inputs_match_keras(tmp_path):
    _check_built(_conv1d_3d_model, tmp_path, seed=3, saves=(".keras", ".h5"))


def test_shared_layers_merges_nested_sequential_reshape_permute_match_keras(tmp_path):
    res = _check_built(_functional_model, tmp_path, seed=4, saves=(".keras", ".h5", "json"))
    model = res[".keras"][0]
    names = {n.name for n in model.graph}
    assert {"shared", "shared_1", "shared_2", "inner/in_d", "inner/in_bn"} <= names
    assert [v.name for v in model.graph.inputs] == ["a", "b"]


def test_recurrent_bidirectional_time_distributed_match_keras(tmp_path):
    _check_built(_rnn_model, tmp_path, seed=5, saves=(".keras", ".h5"))


def test_embedding_rescaling_normalization_match_keras(tmp_path):
    _check_built(_embedding_model, tmp_path, seed=6, saves=(".keras", ".h5"))


def test_flatten_after_conv_uses_keras_channels_last_order(tmp_path):
    """A Dense after Flatten sees features in (h, w, c) order: a kernel that picks one feature proves it."""
    inp = keras.Input((2, 3, 4))
    x = L.Conv2D(4, 1, use_bias=False, name="conv")(inp)
    x = L.Flatten(name="flat")(x)
    out = L.Dense(1, use_bias=False, name="pick")(x)
    model = keras.Model(inp, out)
    model.get_layer("conv").set_weights([np.eye(4, dtype=np.float32).reshape(1, 1, 4, 4)])
    kernel = np.zeros((24, 1), np.float32)
    kernel[(1 * 3 + 2) * 4 + 3, 0] = 1.0  # pixel (h=1, w=2), channel 3 in NHWC flattening
    model.get_layer("pick").set_weights([kernel])
    model.save(tmp_path / "m.keras")
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    (got,) = _run_onnx(import_model([tmp_path / "m.keras"]), [x])
    assert got[0, 0] == x[0, 1, 2, 3]


def test_keras2_hard_sigmoid_uses_slope_0_2(tmp_path):
    """Keras 2 hard_sigmoid is clip(0.2x + 0.5, 0, 1); Keras 3's is relu6(x + 3) / 6."""
    cfg = {
        "class_name": "Sequential",
        "keras_version": "2.4.0",
        "backend": "tensorflow",
        "config": {
            "name": "s",
            "layers": [
                {
                    "class_name": "Activation",
                    "config": {"name": "hs", "activation": "hard_sigmoid", "batch_input_shape": [None, 5]},
                }
            ],
        },
    }
    (tmp_path / "m.json").write_text(json.dumps(cfg))
    with h5py.File(tmp_path / "w.h5", "w") as f:
        f.attrs["layer_names"] = [b"hs"]
        f.attrs["keras_version"] = b"2.4.0"
        f.create_group("hs").attrs["weight_names"] = np.array([], dtype="S1")
    x = np.array([[-3.0, -1.0, 0.0, 1.5, 4.0]], np.float32)
    (got,) = _run_onnx(import_model([tmp_path / "m.json", tmp_path / "w.h5"]), [x])
    np.testing.assert_allclose(got, np.clip(0.2 * x + 0.5, 0, 1), rtol=1e-6)


def test_unsupported_layers_are_all_named_in_one_error(tmp_path):
    inp = keras.Input((4,))
    x = L.Dense(3, name="ok")(inp)
    x = L.UnitNormalization(name="un1")(x)
    x = L.ActivityRegularization(name="areg")(x)
    x = L.UnitNormalization(name="un2")(x)
    model = keras.Model(inp, x)
    model.save(tmp_path / "m.keras")
    with pytest.raises(UnsupportedError) as err:
        import_model([tmp_path / "m.keras"])
    assert err.value.items == [("un1", "UnitNormalization"), ("un2", "UnitNormalization")]


def test_weights_only_h5_alone_is_refused_with_hint(tmp_path):
    model = keras.Sequential([keras.Input((3,)), L.Dense(2)])
    model.save_weights(tmp_path / "m.weights.h5")
    with pytest.raises(InputError, match="architecture JSON"):
        import_model([tmp_path / "m.weights.h5"])


# ------------------------------------------------------------------- shared Keras 2 model files

SHARED_CASES = {
    "keras_3layer.h5": ("keras_3layer.h5", None),
    "KERAS_3layer": ("KERAS_3layer.json", "KERAS_3layer_weights.h5"),
    "KERAS_3layer_95pruned": ("KERAS_3layer.json", "KERAS_3layer_95pruned_retrained_weights.h5"),
    "KERAS_conv2d_model": ("KERAS_conv2d_model.json", "KERAS_conv2d_model_weights.h5"),
    "jetTagger_Conv2D_Small": ("jetTagger_Conv2D_Small.json", "jetTagger_Conv2D_Small_weights.h5"),
    "KERAS_conv1d_small": ("KERAS_conv1d_small.json", "KERAS_conv1d_small_weights.h5"),
}


def keras3_oracle(config: dict, weights_group) -> keras.Model:
    """Rebuild a Keras 2 layer chain with Keras 3 layers, load weights with h5py by layer name.
    Keras 3 cannot read these Keras 2 configs itself (model_from_json fails on 'Model' and on the
    list-form Sequential config), so the layers are made from their config values here."""
    cfg = config["config"]
    layers = cfg if isinstance(cfg, list) else cfg["layers"]
    first = layers[0]["config"]
    model = keras.Sequential([keras.Input(tuple(first["batch_input_shape"][1:]))])
    for lay in layers:
        c, cls = lay["config"], lay["class_name"]
        if cls == "InputLayer":
            continue
        if cls == "Dense":
            new = L.Dense(c["units"], activation=c["activation"], name=c["name"])
        elif cls in ("Conv1D", "Conv2D"):
            new = getattr(L, cls)(
                c["filters"],
                c["kernel_size"],
                strides=c["strides"],
                padding=c["padding"],
                activation=c["activation"],
                name=c["name"],
            )
        elif cls == "BatchNormalization":
            new = L.BatchNormalization(
                axis=c["axis"], epsilon=c["epsilon"], center=c["center"], scale=c["scale"], name=c["name"]
            )
        elif cls == "Dropout":
            new = L.Dropout(c["rate"], name=c["name"])
        elif cls == "Flatten":
            new = L.Flatten(name=c["name"])
        else:
            raise AssertionError(f"oracle has no {cls}")
        model.add(new)
        g = weights_group[c["name"]]
        names = [n.decode() for n in g.attrs["weight_names"]]
        if names:
            new.set_weights([np.asarray(g[n]) for n in names])
    return model


@pytest.mark.parametrize("case", sorted(SHARED_CASES))
def test_shared_keras2_files_match_keras3_rebuild(shared, case):
    first, second = SHARED_CASES[case]
    folder = shared / "models" / "keras"
    paths = [folder / first] + ([folder / second] if second else [])
    imported = import_model(paths)
    with h5py.File(folder / (second or first), "r") as f:
        if second is None:
            config = json.loads(f.attrs["model_config"])
            group = f["model_weights"]
        else:
            config = json.loads((folder / first).read_text())
            group = f
        oracle = keras3_oracle(config, group)
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, size=(4, *oracle.inputs[0].shape[1:])).astype(np.float32)
    (got,) = _run_onnx(imported, [x])
    want = np.asarray(oracle(x, training=False))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_json_and_weights_import_in_either_order(shared):
    folder = shared / "models" / "keras"
    a = to_proto(import_model([folder / "KERAS_3layer.json", folder / "KERAS_3layer_weights.h5"]))
    b = to_proto(import_model([folder / "KERAS_3layer_weights.h5", folder / "KERAS_3layer.json"]))
    assert a.graph == b.graph
