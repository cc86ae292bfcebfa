"""Keras ops called with Python numbers (found by the corpus on keras.applications.MobileNetV3Small:
its hard sigmoid is ``ReLU(6)(x + 3.0) * (1 / 6)``, saved as ``keras.src.ops.numpy`` layers whose
number arguments the importer dropped: 'Add got 1 input(s)', exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402
import onnxruntime as ort  # noqa: E402
from keras import layers as L  # noqa: E402


def test_op_layers_with_number_arguments_match_keras(tmp_path):
    keras.utils.set_random_seed(3)
    x = keras.Input((8, 8, 3))
    c = L.Conv2D(4, 3, padding="same")(x)  # channels-first inside mconv's graph
    hs = c * (L.ReLU(6.0)(c + 3.0) * (1.0 / 6.0))  # hard swish as MobileNetV3 writes it
    d = 2.0 - hs  # a number first: the order of the arguments matters
    y = L.Dense(2)(L.GlobalAveragePooling2D()(d))
    model = keras.Model(x, y)
    path = tmp_path / "m.keras"
    model.save(path)
    out = tmp_path / "m.onnx"
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run(
        [sys.executable, "-m", "mconv", "import", str(path), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    feed = np.random.default_rng(4).standard_normal((2, 8, 8, 3)).astype(np.float32) * 2
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: feed})[0]
    want = np.asarray(model(feed, training=False))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
