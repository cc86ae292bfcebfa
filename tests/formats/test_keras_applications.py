"""Every model in ``keras.applications`` imports with ``mconv import`` and matches Keras.

Each application is built with ``weights=None`` at the smallest input it accepts (32x32, 71x71 for
Xception, 75x75 for the Inceptions), the classifier kept (1000 logits, no softmax), the
normalization statistics, biases and layer scales moved off their initial values (a batch norm of
mean 0 and variance 1, or a LayerScale of 1e-6, would hide a wrong mapping), saved as ``.keras``
and as ``.h5``, imported by the CLI, run by ONNX Runtime on one real photo (scikit-image's
astronaut, resized, through the application's own ``preprocess_input``) and compared with Keras's
inference output: cosine >= 0.9999 and max abs error <= 1e-4 of the output's largest magnitude.

The list of applications is read from ``keras.applications`` itself, so a Keras release that adds
one fails ``test_every_application_is_known`` until it is added to ``APPS``. The default suite
runs the smallest application of each family (each module of ``keras.applications``); every
application, large ones included, runs in ``bench/keras_apps.py``, which imports the helpers here.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402
import onnxruntime as ort  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

COSINE_MIN = 0.9999
REL_MAX = 1e-4


@dataclass(frozen=True)
class App:
    """How one application is built for the check: its input side and extra constructor arguments."""

    side: int = 32
    kwargs: dict = field(default_factory=dict)


# Every public model constructor of keras.applications, with the smallest input it accepts.
APPS: dict[str, App] = {
    **{
        n: App() for n in ("ConvNeXtTiny", "ConvNeXtSmall", "ConvNeXtBase", "ConvNeXtLarge", "ConvNeXtXLarge")
    },
    **{n: App() for n in ("DenseNet121", "DenseNet169", "DenseNet201")},
    **{f"EfficientNetB{i}": App() for i in range(8)},
    **{f"EfficientNetV2{v}": App() for v in ("B0", "B1", "B2", "B3", "S", "M", "L")},
    "InceptionResNetV2": App(75),
    "InceptionV3": App(75),
    "MobileNet": App(),
    "MobileNetV2": App(),
    "MobileNetV3Small": App(),
    "MobileNetV3Large": App(),
    "NASNetMobile": App(),
    "NASNetLarge": App(),
    **{n: App() for n in ("ResNet50", "ResNet101", "ResNet152", "ResNet50V2", "ResNet101V2", "ResNet152V2")},
    "VGG16": App(),
    "VGG19": App(),
    "Xception": App(71),
}

# Settings of the public constructors that bring layers the defaults do not use.
VARIANTS: dict[str, tuple[str, App]] = {
    "MobileNetV3Small-minimalistic": ("MobileNetV3Small", App(kwargs={"minimalistic": True})),
}

# The smallest application of each family: what the default suite runs.
DEFAULT = [
    "ConvNeXtTiny",
    "DenseNet121",
    "EfficientNetB0",
    "EfficientNetV2B0",
    "InceptionResNetV2",
    "InceptionV3",
    "MobileNet",
    "MobileNetV2",
    "MobileNetV3Small",
    "NASNetMobile",
    "ResNet50",
    "ResNet50V2",
    "VGG16",
    "Xception",
]


def enumerate_apps() -> dict[str, str]:
    """Every public model constructor in ``keras.applications`` -> its module's short name.

    A constructor is a public capitalized callable of ``keras.applications`` or of one of its
    submodules (``keras.applications.resnet.ResNet50``); helpers are lower case."""
    apps = keras.applications
    found: dict[str, str] = {}
    spaces = [apps, *(m for n, m in vars(apps).items() if not n.startswith("_") and inspect.ismodule(m))]
    for space in spaces:
        for n, obj in vars(space).items():
            if n.startswith("_") or not n[:1].isupper() or not callable(obj) or inspect.isclass(obj):
                continue
            found[n] = obj.__module__.rsplit(".", 1)[-1]
    return found


def family(name: str) -> str:
    return enumerate_apps()[name]


def photo(side: int) -> np.ndarray:
    """scikit-image's astronaut (a real photo), resized to side x side, RGB float32 in [0, 255]."""
    from PIL import Image
    from skimage import data

    img = Image.fromarray(data.astronaut()).resize((side, side), Image.Resampling.BILINEAR)
    return np.asarray(img, np.float32)[None]


def perturb(model: keras.Model, seed: int = 0) -> None:
    """Move statistics, biases and scales off their initial values (kernels keep Keras's init).

    A freshly built model's batch norms are the identity (mean 0, variance 1, gamma 1, beta 0),
    its biases zero and ConvNeXt's LayerScale 1e-6: a mapping that swapped or dropped any of them
    would still match. Scales stay at or below 1: with gammas up to 1.3 EfficientNetV2M's residual
    stream grew tenfold over its 57 blocks and float32 rounding (Keras's as much as ONNX
    Runtime's) grew with it, block by block, to 1e-2 of the logits."""
    rng = np.random.default_rng(seed)
    for layer in _all_layers(model):
        cls = type(layer).__name__
        news = []
        for w in layer.weights:
            shape = tuple(w.shape)
            name = w.name
            a = np.asarray(w.numpy())
            if cls == "LayerScale":
                a = rng.uniform(0.2, 1.0, shape)
            elif name in ("gamma",):
                a = rng.uniform(0.5, 1.0, shape)
            elif name in ("beta", "bias", "moving_mean", "mean"):
                a = rng.normal(0.0, 0.05, shape)
            elif name in ("moving_variance", "variance"):
                a = rng.uniform(1.0, 1.5, shape)
            news.append(np.asarray(a, dtype=w.dtype))
        if news:
            layer.set_weights(news)
        if cls == "Normalization" and layer.weights:
            layer.finalize_state()  # Normalization caches mean/variance from its variables


def _all_layers(model: keras.Model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)
        else:
            yield layer


@dataclass
class Result:
    name: str
    params: int
    side: int
    seconds: dict[str, float]
    cosine: dict[str, float]
    rel: dict[str, float]

    @property
    def ok(self) -> bool:
        return all(c >= COSINE_MIN for c in self.cosine.values()) and all(
            r <= REL_MAX for r in self.rel.values()
        )


@contextlib.contextmanager
def numpy_initializers(seed: int = 0):
    """Keras's random initializers drawn by numpy (same distributions) while a model is built.

    The JAX backend compiles its random kernel once per weight shape, about half a second each on
    a small CPU: most of the time it takes to build an application. Where Keras's internal
    module has moved, the build simply runs with JAX's own draws."""
    try:
        import keras.src.backend.jax.random as jr  # Keras's module, not Python's random
    except ImportError:
        yield
        return
    rng = np.random.default_rng(seed)

    def uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
        return rng.uniform(minval, maxval, tuple(shape)).astype(dtype or "float32")

    def normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
        return (rng.standard_normal(tuple(shape)) * stddev + mean).astype(dtype or "float32")

    def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
        z = rng.standard_normal(tuple(shape))
        while (bad := np.abs(z) > 2.0).any():
            z[bad] = rng.standard_normal(int(bad.sum()))
        return (z * stddev + mean).astype(dtype or "float32")

    saved = {n: getattr(jr, n, None) for n in ("uniform", "normal", "truncated_normal")}
    if any(f is None for f in saved.values()):
        yield
        return
    jr.uniform, jr.normal, jr.truncated_normal = uniform, normal, truncated_normal
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(jr, n, f)


def build(name: str, app: App) -> keras.Model:
    keras.utils.set_random_seed(0)
    ctor = getattr(keras.applications, name)
    side = app.side
    with numpy_initializers():
        model = ctor(weights=None, input_shape=(side, side, 3), classifier_activation=None, **app.kwargs)
    perturb(model)
    return model


def check(name: str, app: App, tmp: Path, saves=(".keras", ".h5")) -> Result:
    """Build, save, import with ``mconv import`` and compare with Keras; times each stage."""
    from mconv.cli.app import app as cli

    secs: dict[str, float] = {}
    t = time.perf_counter()
    model = build(name, app)
    secs["build"] = time.perf_counter() - t
    mod = getattr(keras.applications, family(name))
    x = mod.preprocess_input(photo(app.side).copy())
    x = np.asarray(x, np.float32)
    t = time.perf_counter()
    # predict compiles the whole model once: 10x faster than the layer-by-layer eager call here
    want = np.asarray(model.predict(x, verbose=0), np.float64)
    secs["keras"] = time.perf_counter() - t
    cos, rel = {}, {}
    for ext in saves:
        src = tmp / f"{name}{ext}"
        t = time.perf_counter()
        model.save(src)
        secs[f"save{ext}"] = time.perf_counter() - t
        out = tmp / f"{name}{ext}.onnx"
        t = time.perf_counter()
        res = CliRunner().invoke(cli, ["import", str(src), "-o", str(out), "--quiet"])
        secs[f"import{ext}"] = time.perf_counter() - t
        assert res.exit_code == 0, f"{name}{ext}: mconv import exited {res.exit_code}: {res.output}"
        t = time.perf_counter()
        sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
        secs[f"run{ext}"] = time.perf_counter() - t
        got = np.asarray(got, np.float64)
        assert got.shape == want.shape, f"{name}{ext}: output shape {got.shape}, Keras {want.shape}"
        cos[ext] = float(np.dot(got.ravel(), want.ravel()) / (np.linalg.norm(got) * np.linalg.norm(want)))
        rel[ext] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        src.unlink()
        for f in tmp.glob(f"{name}{ext}.onnx*"):
            f.unlink()
    return Result(name, model.count_params(), app.side, secs, cos, rel)


def assert_matches(r: Result) -> None:
    for ext in r.cosine:
        assert r.cosine[ext] >= COSINE_MIN and r.rel[ext] <= REL_MAX, (
            f"{r.name}{ext}: cosine {r.cosine[ext]:.7f} (>= {COSINE_MIN}), "
            f"max abs error {r.rel[ext]:.2e} of the output scale (<= {REL_MAX})"
        )


# ----------------------------------------------------------------------------------------- tests


def test_every_application_is_known():
    """A constructor Keras adds (or renames) fails here until APPS lists it with its input size."""
    found = enumerate_apps()
    assert set(found) == set(APPS), (
        f"keras.applications has {sorted(set(found) - set(APPS))} not in APPS, "
        f"APPS has {sorted(set(APPS) - set(found))} not in keras.applications"
    )
    # the default suite holds one application of every family (VGG19: VGG16's layers, deeper)
    assert {found[n] for n in DEFAULT} | {"vgg19"} == set(found.values())
    assert all(base in APPS for base, _ in VARIANTS.values())


def test_application_layers_refused_from_other_modules(tmp_path):
    """A layer named like an application's own (LayerScale) but defined elsewhere is a custom layer."""
    from keras.src.applications.convnext import LayerScale
    from mconv.errors import UnsupportedError
    from mconv.formats import import_model

    class Mine(LayerScale):
        pass

    Mine.__module__ = "my_project.layers"
    Mine.__name__ = Mine.__qualname__ = "LayerScale"
    i = keras.Input((4, 4, 3))
    m = keras.Model(i, Mine(0.5, 3, name="scale")(i))
    m.save(tmp_path / "m.keras")
    with pytest.raises(UnsupportedError, match="LayerScale"):
        import_model([tmp_path / "m.keras"])


def _application_layers_model() -> keras.Model:
    """LayerScale on a conv's output (channels-first inside mconv) and on a Dense's (channels
    last), StochasticDepth, CustomScaleLayer over one tensor of each layout, and a Rescaling
    with one scale per channel."""
    from keras.src.applications.convnext import LayerScale, StochasticDepth
    from keras.src.applications.inception_resnet_v2 import CustomScaleLayer

    keras.utils.set_random_seed(1)
    i = keras.Input((6, 6, 3))
    c = keras.layers.Conv2D(4, 3, padding="same", name="conv")(i)
    a = LayerScale(1e-6, 4, name="scale_conv")(c)
    d = keras.layers.Dense(4, name="dense")(i)
    d = LayerScale(1e-6, 4, name="scale_dense")(d)
    d = StochasticDepth(0.2, name="drop_path")(d)
    y = CustomScaleLayer(0.17, name="residual")([a, d])
    y = keras.layers.MaxPooling2D(name="pool")(y)
    # EfficientNet with ImageNet weights ends its preprocessing with a per-channel Rescaling
    y = keras.layers.Rescaling([0.5, 1.0, 2.0, -1.0], name="per_channel")(y)
    model = keras.Model(i, y)
    perturb(model, seed=3)
    return model


@pytest.mark.parametrize("ext", [".keras", ".h5"])
def test_application_layers_match_keras(tmp_path, ext):
    from mconv.formats import import_model
    from mconv.irio import to_proto

    model = _application_layers_model()
    x = np.random.default_rng(0).normal(size=(2, 6, 6, 3)).astype(np.float32)
    model.save(tmp_path / f"m{ext}")
    imported = import_model([tmp_path / f"m{ext}"])
    sess = ort.InferenceSession(to_proto(imported).SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, np.asarray(model(x, training=False)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ext", [".keras", ".h5"])
def test_ops_with_python_numbers_match_keras(tmp_path, ext):
    """MobileNetV3's hard sigmoid is ``(x + 3.0) * (1 / 6)``: Keras ops with a Python number, whose
    module legacy HDF5 does not keep."""
    from mconv.formats import import_model
    from mconv.irio import to_proto

    keras.utils.set_random_seed(2)
    i = keras.Input((5,))
    d = keras.layers.Dense(4, name="dense")(i)
    y = keras.layers.Add(name="merge")([(d + 3.0) * (1.0 / 6.0), 2.0 - d])
    model = keras.Model(i, y)
    model.save(tmp_path / f"m{ext}")
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    sess = ort.InferenceSession(
        to_proto(import_model([tmp_path / f"m{ext}"])).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, np.asarray(model(x, training=False)), rtol=1e-5, atol=1e-6)


def _rewrite_config(src: Path, dst: Path, edit) -> None:
    import json
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "config.json":
                cfg = json.loads(data)
                edit(cfg)
                data = json.dumps(cfg).encode()
            zout.writestr(info, data)


@pytest.mark.parametrize(
    ("layer", "key", "value", "needle"),
    [
        ("scale_dense", "projection_dim", 5, "projection_dim 5"),
        ("drop_path", "drop_path_rate", 1.5, "drop_path_rate 1.5"),
    ],
)
def test_application_layer_configs_that_do_not_fit_are_one_error_line(tmp_path, layer, key, value, needle):
    from mconv.cli.app import app as cli

    model = _application_layers_model()
    model.save(tmp_path / "good.keras")

    def edit(cfg):
        for lay in cfg["config"]["layers"]:
            if lay["name"] == layer:
                lay["config"][key] = value

    _rewrite_config(tmp_path / "good.keras", tmp_path / "bad.keras", edit)
    out = tmp_path / "bad.onnx"
    r = CliRunner().invoke(cli, ["import", str(tmp_path / "bad.keras"), "-o", str(out), "-q"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert needle in lines[0] and layer in lines[0] and "Traceback" not in r.output
    assert not out.exists()


@pytest.mark.parametrize("name", DEFAULT)
def test_application_matches_keras(name, tmp_path):
    assert_matches(check(name, APPS[name], tmp_path))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_application_variant_matches_keras(variant, tmp_path):
    base, app = VARIANTS[variant]
    assert_matches(check(base, app, tmp_path, saves=(".keras",)))
