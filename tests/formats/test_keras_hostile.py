"""Bad and hostile Keras files: each one imports fine or raises InputError (never anything else)."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
import h5py
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from mconv.errors import InputError  # noqa: E402
from mconv.formats import import_model  # noqa: E402
from mconv.formats.keras import load  # noqa: E402

DENSE_CONFIG = {
    "class_name": "Sequential",
    "keras_version": "2.4.0",
    "backend": "tensorflow",
    "config": {
        "name": "s",
        "layers": [
            {
                "class_name": "InputLayer",
                "config": {"name": "x", "batch_input_shape": [None, 4], "dtype": "float32"},
            },
            {
                "class_name": "Dense",
                "config": {"name": "fc", "units": 3, "activation": "relu", "use_bias": True},
            },
            {"class_name": "Dropout", "config": {"name": "drop", "rate": 0.5}},
            {
                "class_name": "Dense",
                "config": {"name": "out", "units": 2, "activation": "softmax", "use_bias": True},
            },
        ],
    },
}


def _write_weights(path: Path, layers: dict[str, list[tuple[str, np.ndarray]]], root_attrs=True) -> None:
    """A Keras 2 weights HDF5 written by hand with h5py (the legacy layout)."""
    with h5py.File(path, "w") as f:
        if root_attrs:
            f.attrs["layer_names"] = np.array([n.encode() for n in layers], dtype="S")
            f.attrs["keras_version"] = b"2.4.0"
            f.attrs["backend"] = b"tensorflow"
        for name, arrays in layers.items():
            g = f.create_group(name)
            g.attrs["weight_names"] = np.array([f"{name}/{w}:0".encode() for w, _ in arrays], dtype="S64")
            for w, a in arrays:
                g.create_dataset(f"{name}/{w}:0", data=a)


def _dense_weights():
    rng = np.random.default_rng(0)
    return {
        "x": [],
        "fc": [("kernel", rng.normal(size=(4, 3)).astype(np.float32)), ("bias", np.zeros(3, np.float32))],
        "drop": [],
        "out": [("kernel", rng.normal(size=(3, 2)).astype(np.float32)), ("bias", np.zeros(2, np.float32))],
    }


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    j, w = tmp_path / "m.json", tmp_path / "w.h5"
    j.write_text(json.dumps(DENSE_CONFIG))
    _write_weights(w, _dense_weights())
    return j, w


@pytest.fixture
def whole_h5(pair, tmp_path) -> Path:
    """Whole-model HDF5: model_config attribute plus the weights under model_weights."""
    j, w = pair
    out = tmp_path / "whole.h5"
    with h5py.File(w, "r") as src, h5py.File(out, "w") as dst:
        dst.attrs["model_config"] = j.read_text()
        dst.attrs["keras_version"] = b"2.4.0"
        g = dst.create_group("model_weights")
        for k, v in src.attrs.items():
            g.attrs[k] = v
        for name in src:
            src.copy(src[name], g, name)
    return out


@pytest.fixture
def keras_zip(pair, tmp_path) -> Path:
    """A .keras zip written by hand in Keras 3's layout (layers/<key>/vars/<i>)."""
    cfg = json.loads(json.dumps(DENSE_CONFIG))
    cfg["keras_version"] = "3.15.0"
    h5 = tmp_path / "model.weights.h5"
    ws = _dense_weights()
    with h5py.File(h5, "w") as f:
        for key, name in (("dense", "fc"), ("dropout", "drop"), ("dense_1", "out")):
            v = f.create_group(f"layers/{key}/vars")
            v.attrs["name"] = name
            for i, (_, a) in enumerate(ws[name]):
                v.create_dataset(str(i), data=a)
    out = tmp_path / "m.keras"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.15.0"}))
        z.writestr("config.json", json.dumps(cfg))
        z.write(h5, "model.weights.h5")
    return out


def _expect_input_error(paths, match: str | None = None) -> InputError:
    with pytest.raises(InputError, match=match) as err:
        import_model(paths)
    line = str(err.value)
    assert "\n" not in line
    return err.value


def _fine_or_input_error(paths) -> None:
    try:
        import_model(paths)
    except InputError as exc:
        assert "\n" not in str(exc)


# --------------------------------------------------------------------------------- the corpus


def test_valid_hand_written_files_import_and_agree(pair, whole_h5, keras_zip):
    from mconv.irio import to_proto

    a = to_proto(import_model(list(pair)))
    b = to_proto(import_model([whole_h5]))
    c = to_proto(import_model([keras_zip]))
    assert [n.op_type for n in a.graph.node] == ["Gemm", "Relu", "Identity", "Gemm", "Softmax"]
    assert a.graph.node == b.graph.node == c.graph.node


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.3, 0.5, 0.9, 0.99])
def test_truncated_files_raise_input_error(whole_h5, keras_zip, pair, tmp_path, fraction):
    for src in (whole_h5, keras_zip, pair[1]):
        data = src.read_bytes()
        bad = tmp_path / f"cut{src.suffix}"
        bad.write_bytes(data[: int(len(data) * fraction)])
        paths = [pair[0], bad] if src == pair[1] else [bad]
        _expect_input_error(paths)


def test_flipped_bytes_import_or_raise_input_error(whole_h5, keras_zip, tmp_path):
    rng = np.random.default_rng(1)
    for src in (whole_h5, keras_zip):
        data = bytearray(src.read_bytes())
        for _ in range(20):
            bad = bytearray(data)
            for pos in rng.integers(0, len(bad), size=8):
                bad[pos] ^= 0xFF
            p = tmp_path / f"flip{src.suffix}"
            p.write_bytes(bytes(bad))
            _fine_or_input_error([p])


def test_wrong_magic_is_input_error(tmp_path):
    for name, data in (
        ("m.h5", b"not hdf5 at all" * 10),
        ("m.keras", b"\x00" * 64),
        ("m.hdf5", b"PK\x05\x06" + b"\x00" * 18),
    ):
        p = tmp_path / name
        p.write_bytes(data)
        _expect_input_error([p])


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        "[1, 2]",
        '"str"',
        "{",
        '{"class_name": "Dense", "config": {}}',
        '{"class_name": "Sequential", "config": 5}',
        "\xff\xfe",
    ],
)
def test_json_that_is_not_a_keras_config_is_input_error(pair, tmp_path, text):
    j = tmp_path / "bad.json"
    j.write_bytes(text.encode("latin-1"))
    _expect_input_error([j, pair[1]])


def test_lambda_layer_is_refused_without_executing_it(pair, tmp_path):
    cfg = json.loads(json.dumps(DENSE_CONFIG))
    cfg["config"]["layers"].insert(
        2,
        {
            "class_name": "Lambda",
            "config": {"name": "evil", "function": ["4wEAAAAAAAAA", None, None], "function_type": "lambda"},
        },
    )
    j = tmp_path / "lambda.json"
    j.write_text(json.dumps(cfg))
    err = _expect_input_error([j, pair[1]], match="never executes code")
    assert "Lambda layer 'evil'" in str(err)


@pytest.mark.parametrize("member", ["../evil.h5", "/etc/passwd", "a/../../b", "C:/x"])
def test_zip_with_path_traversal_member_is_refused(keras_zip, tmp_path, member):
    bad = tmp_path / "trav.keras"
    with zipfile.ZipFile(keras_zip) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        dst.writestr(member, b"x")
    err = _expect_input_error([bad], match="escapes the archive")
    assert member in str(err)


def test_zip_bomb_declared_size_is_refused_before_reading(keras_zip, tmp_path):
    """The central directory claims 2 GiB for config.json: refused from the header alone."""
    data = bytearray(keras_zip.read_bytes())
    pos = 0
    while True:
        pos = data.find(b"PK\x01\x02", pos)
        assert pos >= 0
        name_len = struct.unpack_from("<H", data, pos + 28)[0]
        if data[pos + 46 : pos + 46 + name_len] == b"config.json":
            struct.pack_into("<I", data, pos + 24, 0x7FFFFFFF)  # uncompressed size
            break
        pos += 4
    bad = tmp_path / "bomb.keras"
    bad.write_bytes(bytes(data))
    _expect_input_error([bad], match="zip bomb")


def test_zip_missing_members_is_input_error(tmp_path):
    bad = tmp_path / "empty.keras"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("config.json", json.dumps(DENSE_CONFIG))
    _expect_input_error([bad], match="model.weights.h5")


def test_deeply_nested_json_is_refused(pair, tmp_path):
    j = tmp_path / "deep.json"
    j.write_text('{"class_name": "Sequential", "config": ' + "[" * 5000 + "]" * 5000 + "}")
    _expect_input_error([j, pair[1]], match="deeper")


def test_deeply_nested_models_are_refused(pair, tmp_path):
    model = DENSE_CONFIG
    for i in range(40):
        model = {"class_name": "Sequential", "config": {"name": f"n{i}", "layers": [model]}}
    j = tmp_path / "nest.json"
    j.write_text(json.dumps(model))
    _expect_input_error([j, pair[1]], match="nest deeper")


def test_weights_that_disagree_with_the_config_name_the_layer(pair, tmp_path):
    cfg = json.loads(json.dumps(DENSE_CONFIG))
    cfg["config"]["layers"][1]["config"]["units"] = 5
    j = tmp_path / "units.json"
    j.write_text(json.dumps(cfg))
    err = _expect_input_error([j, pair[1]], match="config implies")
    assert "layer 'fc'" in str(err)


def test_dataset_claiming_more_bytes_than_the_file_holds_is_refused(pair, tmp_path):
    w = tmp_path / "huge.h5"
    _write_weights(w, _dense_weights())
    with h5py.File(w, "a") as f:
        del f["fc/fc/kernel:0"]
        f["fc"].create_dataset("fc/kernel:0", shape=(100_000, 100_000), dtype="f4")  # never written
    err = _expect_input_error([pair[0], w], match="more than the file holds")
    assert "dataset '/fc/fc/kernel:0'" in str(err) and str(w) in str(err)


def test_missing_weights_for_a_layer_name_the_layer(pair, tmp_path):
    w = tmp_path / "missing.h5"
    ws = _dense_weights()
    del ws["out"]
    _write_weights(w, ws)
    err = _expect_input_error([pair[0], w], match="no weights")
    assert "layer 'out'" in str(err)


def test_absurd_input_shape_is_input_error(pair, tmp_path):
    cfg = json.loads(json.dumps(DENSE_CONFIG))
    cfg["config"]["layers"][0]["config"]["batch_input_shape"] = [None, -4]
    j = tmp_path / "shape.json"
    j.write_text(json.dumps(cfg))
    _expect_input_error([j, pair[1]])


def test_nothing_is_written_and_loader_raises_before_building(pair, tmp_path):
    before = sorted(p.name for p in tmp_path.iterdir())
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 100)
    with pytest.raises(InputError):
        load([pair[0], bad], {})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "bad.h5"])


# ----------------------------------------------------------------------- hypothesis mutations

_MUTATION = st.lists(
    st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6
)
_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for where, value in edits:
        buf[int(where * len(buf))] = value
    return bytes(buf)


@_SETTINGS
@given(edits=_MUTATION, cut=st.floats(0.5, 1.0))
def test_mutated_h5_imports_or_raises_input_error(whole_h5, tmp_path, edits, cut):
    data = _mutate(whole_h5.read_bytes(), edits)
    p = tmp_path / "mut.h5"
    p.write_bytes(data[: max(1, int(len(data) * cut))])
    _fine_or_input_error([p])


@_SETTINGS
@given(edits=_MUTATION)
def test_mutated_keras_zip_imports_or_raises_input_error(keras_zip, tmp_path, edits):
    p = tmp_path / "mut.keras"
    p.write_bytes(_mutate(keras_zip.read_bytes(), edits))
    _fine_or_input_error([p])


@_SETTINGS
@given(edits=_MUTATION)
def test_mutated_json_imports_or_raises_input_error(pair, tmp_path, edits):
    j = tmp_path / "mut.json"
    j.write_bytes(_mutate(pair[0].read_bytes(), edits))
    _fine_or_input_error([j, pair[1]])


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 70) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)


@_SETTINGS
@given(
    layer=st.integers(0, 3),
    key=st.sampled_from(
        ["units", "activation", "batch_input_shape", "name", "use_bias", "class_name", "config", "rate"]
    ),
    value=_VALUES,
)
def test_config_values_replaced_at_random_import_or_raise_input_error(pair, tmp_path, layer, key, value):
    cfg = json.loads(json.dumps(DENSE_CONFIG))
    entry = cfg["config"]["layers"][layer]
    if key in ("class_name", "config"):
        entry[key] = value
    else:
        entry["config"][key] = value
    j = tmp_path / "val.json"
    j.write_text(json.dumps(cfg))
    _fine_or_input_error([j, pair[1]])
