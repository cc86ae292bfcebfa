"""Bundles: manifest contents, integrity checks on load, atomic writes, zips."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from mconv import bundle as bundle_mod
from mconv.bundle import (
    TensorSpec,
    is_bundle,
    load_bundle,
    provenance_from_model,
    write_bundle,
    zip_bundle,
)
from mconv.container import read_container
from mconv.errors import InputError, IntegrityError

RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 3)).astype(np.float32)
W16 = RNG.standard_normal((8,)).astype(np.float16).astype(np.float32)


def _write(out: Path, **over) -> bundle_mod.Bundle:
    kwargs = dict(
        target="cpu",
        model_name="tiny",
        inputs=[TensorSpec("x", "float32", ("N", 3))],
        outputs=[TensorSpec("y", "float32", ("N", 4))],
        weights=[("w", W, {"codec": "raw"}), ("b", W16, {"codec": "fp16"})],
        payload={"model.onnx": b"graph bytes", "extra/notes.txt": b"hello"},
        options={"dense": False, "out": Path("/x/y")},
        provenance={"source_name": "tiny.onnx", "mconv_version": "0.1.0", "passes": []},
    )
    kwargs.update(over)
    return write_bundle(out, **kwargs)


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    b = _write(tmp_path / "b")
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["format"] == "mconv-bundle" and m["format_version"] == 1
    assert m["target"] == "cpu" and m["model_name"] == "tiny"
    assert m["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["N", 3]}]
    assert m["outputs"] == [{"name": "y", "dtype": "float32", "shape": ["N", 4]}]
    assert sorted(m["files"]) == ["extra/notes.txt", "model.onnx", "weights.mcw"]
    for rel, meta in m["files"].items():
        data = (tmp_path / "b" / rel).read_bytes()
        assert meta == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert m["weights"] == []  # issue 14 item 5: weights.mcw's index lists them, not the manifest
    assert b.weights == [  # in weights.mcw's order: sorted by name (front-coded names)
        {
            "name": "b",
            "codec": "fp16",
            "bytes": 16,
            "streams": {"data": 16},
            "shape": [8],
            "dtype": "float32",
        },
        {
            "name": "w",
            "codec": "raw",
            "bytes": 48,
            "streams": {"data": 48},
            "shape": [4, 3],
            "dtype": "float32",
        },
    ]
    assert m["verification"] is None and m["options"] == {"dense": False, "out": "/x/y"}
    assert m["provenance"]["source_name"] == "tiny.onnx"
    assert b.manifest == m


def test_manifest_is_sorted_compact_and_has_no_timestamps(tmp_path):
    _write(tmp_path / "b")
    text = (tmp_path / "b" / "manifest.json").read_text()
    # compact separators (issue 14 item 5: indentation was a third of a small bundle's manifest)
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")) + "\n"
    assert "time" not in text and "date" not in text
    # the account's summary only; the per-tensor rows are weights.mcw's index
    m = json.loads(text)
    assert "layers" not in m["account"]
    assert m["account"]["codecs"] == {
        "fp16": {"bytes": 16, "elements": 8, "original_bytes": 32, "tensors": 1},
        "raw": {"bytes": 48, "elements": 12, "original_bytes": 48, "tensors": 1},
    }
    rows = {r["name"]: r for r in load_bundle(tmp_path / "b").account["layers"]}
    assert rows["w"]["bytes"] == 48 and rows["w"]["codec"] == "raw" and rows["w"]["elements"] == 12
    assert rows["b"]["bytes"] == 16 and rows["b"]["codec"] == "fp16" and rows["b"]["weight_bits"] == 16
    assert rows["b"]["kept"] is None  # not known without decoding


def test_same_input_gives_byte_identical_bundles(tmp_path):
    _write(tmp_path / "one")
    _write(tmp_path / "two")
    for rel in ("manifest.json", "weights.mcw", "model.onnx", "extra/notes.txt"):
        assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "two" / rel).read_bytes()


def test_load_returns_specs_and_decodes_weights(tmp_path):
    _write(tmp_path / "b")
    b = load_bundle(tmp_path / "b")
    assert b.target == "cpu" and b.model_name == "tiny"
    assert b.inputs == [TensorSpec("x", "float32", ("N", 3))]
    assert [o.name for o in b.outputs] == ["y"]
    assert b.path("model.onnx").read_bytes() == b"graph bytes"
    assert b.extra_files == []
    with b.container() as c:
        assert np.array_equal(c.array("w"), W) and np.array_equal(c.array("b"), W16)


def test_one_flipped_byte_is_an_integrity_error_naming_the_file(tmp_path):
    _write(tmp_path / "b")
    f = tmp_path / "b" / "weights.mcw"
    expected = hashlib.sha256(f.read_bytes()).hexdigest()
    data = bytearray(f.read_bytes())
    data[-70] ^= 0x01
    f.write_bytes(bytes(data))
    got = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(IntegrityError) as exc:
        load_bundle(tmp_path / "b")
    line = str(exc.value)
    assert f"weights.mcw: sha256 mismatch (expected {expected[:12]}..., got {got[:12]}...)" in line
    assert "re-export it" in line


def test_truncated_file_is_a_size_mismatch(tmp_path):
    _write(tmp_path / "b")
    f = tmp_path / "b" / "model.onnx"
    f.write_bytes(f.read_bytes()[:5])
    with pytest.raises(IntegrityError, match=r"model.onnx: size mismatch \(expected 11 bytes, got 5\)"):
        load_bundle(tmp_path / "b")


def test_missing_file_is_an_integrity_error(tmp_path):
    _write(tmp_path / "b")
    (tmp_path / "b" / "extra" / "notes.txt").unlink()
    with pytest.raises(IntegrityError, match="extra/notes.txt: listed in manifest.json but missing"):
        load_bundle(tmp_path / "b")


def test_unlisted_files_are_ignored_and_reported(tmp_path):
    _write(tmp_path / "b")
    (tmp_path / "b" / "README.txt").write_text("added by a deployer")
    b = load_bundle(tmp_path / "b")
    assert b.extra_files == ["README.txt"]


def test_manifest_with_a_path_outside_the_bundle_is_refused(tmp_path):
    _write(tmp_path / "b")
    mpath = tmp_path / "b" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["files"]["../secret"] = {"bytes": 1, "sha256": "0" * 64}
    mpath.write_text(json.dumps(m))
    with pytest.raises(InputError, match="not a plain relative path"):
        load_bundle(tmp_path / "b")


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "not valid JSON"),
        ('{"format": "other"}', "not an mconv-bundle manifest"),
        (
            '{"format": "mconv-bundle", "format_version": 99, "target": "cpu", "files": {}}',
            "format_version 99",
        ),
    ],
)
def test_bad_manifest_is_an_input_error(tmp_path, text, match):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifest.json").write_text(text)
    with pytest.raises(InputError, match=match):
        load_bundle(tmp_path / "b")


def test_not_a_bundle_paths_are_input_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no manifest.json"):
        load_bundle(tmp_path / "empty")
    with pytest.raises(InputError, match="not found"):
        load_bundle(tmp_path / "nothing")
    (tmp_path / "f.bin").write_bytes(b"abc")
    with pytest.raises(InputError, match="not a bundle"):
        load_bundle(tmp_path / "f.bin")


def test_failed_write_leaves_nothing_and_keeps_an_existing_bundle(tmp_path, monkeypatch):
    out = tmp_path / "b"

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bundle_mod, "write_container", boom)
    with pytest.raises(RuntimeError):
        _write(out)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    _write(out)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(bundle_mod, "write_container", boom)
    with pytest.raises(RuntimeError):
        _write(out, model_name="other")
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_payload_may_not_escape_or_replace_bundle_files(tmp_path):
    with pytest.raises(InputError, match="not a plain relative path"):
        _write(tmp_path / "b", payload={"../evil": b"x"})
    with pytest.raises(InputError, match="may not contain 'manifest.json'"):
        _write(tmp_path / "b", payload={"manifest.json": b"x"})
    assert not (tmp_path / "b").exists()


def test_dense_weights_are_listed_but_not_stored(tmp_path):
    b = _write(tmp_path / "b", weights=[("w", W, {"codec": "dense"})])
    assert not (tmp_path / "b" / "weights.mcw").exists()
    assert b.weights == [
        {
            "name": "w",
            "codec": "dense",
            "bytes": 48,
            "streams": {"data": 48},
            "shape": [4, 3],
            "dtype": "float32",
        }
    ]
    assert "weights.mcw" not in load_bundle(tmp_path / "b").files


def test_is_bundle_recognizes_directories_and_zips(tmp_path):
    _write(tmp_path / "b")
    (tmp_path / "plain").mkdir()
    (tmp_path / "f.txt").write_text("x")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("a.txt", "x")
    zip_bundle(tmp_path / "b", tmp_path / "b.zip")
    assert is_bundle(tmp_path / "b") and is_bundle(tmp_path / "b.zip")
    assert not is_bundle(tmp_path / "plain") and not is_bundle(tmp_path / "f.txt")
    assert not is_bundle(tmp_path / "other.zip") and not is_bundle(tmp_path / "missing")


def test_zip_bundle_is_deterministic_and_loads(tmp_path):
    _write(tmp_path / "b")
    zip_bundle(tmp_path / "b", tmp_path / "one.zip")
    zip_bundle(tmp_path / "b", tmp_path / "two.zip")
    assert (tmp_path / "one.zip").read_bytes() == (tmp_path / "two.zip").read_bytes()
    b = load_bundle(tmp_path / "one.zip")
    assert b.is_zip and b.target == "cpu"
    assert b.read_bytes("extra/notes.txt") == b"hello"
    with b.container() as c:
        assert np.array_equal(c.array("w"), W)


def test_zip_of_the_bundle_folder_loads(tmp_path):
    _write(tmp_path / "b")
    archive = shutil.make_archive(str(tmp_path / "packed"), "zip", root_dir=tmp_path, base_dir="b")
    b = load_bundle(archive)
    assert b.zip_prefix == "b/" and b.read_bytes("model.onnx") == b"graph bytes"


def test_tampered_zip_member_is_an_integrity_error(tmp_path):
    _write(tmp_path / "b")
    (tmp_path / "b" / "model.onnx").write_bytes(b"graph bytez")  # same size, other content
    with zipfile.ZipFile(tmp_path / "t.zip", "w") as zf:
        for f in sorted((tmp_path / "b").rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(tmp_path / "b").as_posix())
    with pytest.raises(IntegrityError, match="model.onnx: sha256 mismatch"):
        load_bundle(tmp_path / "t.zip")


def test_provenance_comes_from_metadata_props():
    model = ir.Model(ir.Graph([], [], nodes=[], name="g"), ir_version=10)
    model.metadata_props["mconv.source_name"] = "lenet.caffemodel"
    model.metadata_props["mconv.source_sha256"] = "ab" * 32
    model.metadata_props["mconv.source_format"] = "caffe"
    model.metadata_props["mconv.passes"] = json.dumps([{"name": "fp16", "config": {}}])
    p = provenance_from_model(model)
    assert p["source_name"] == "lenet.caffemodel" and p["source_format"] == "caffe"
    assert p["source_sha256"] == "ab" * 32 and p["passes"] == [{"name": "fp16", "config": {}}]
    assert p["mconv_version"]


def test_weights_container_of_a_bundle_reads_standalone(tmp_path):
    _write(tmp_path / "b")
    with read_container(tmp_path / "b" / "weights.mcw") as c:
        assert c.names == ["b", "w"]  # sorted by name


# --- hostile manifests and members (issue 11, item 8): one InputError naming the bundle


def _edit_manifest(root: Path, mutate) -> None:
    mpath = root / "manifest.json"
    m = json.loads(mpath.read_text())
    mutate(m)
    mpath.write_text(json.dumps(m))


def _assign(path: str, value):
    """Set ``m[path]`` where path is 'a/b/0/c' (list indices as integers)."""

    def mutate(m):
        keys = [int(k) if k.isdigit() else k for k in path.split("/")]
        cur = m
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        ("inputs", 7, "'inputs' is an integer, expected a list"),
        ("inputs/0", "x", "'inputs\\[0\\]' is a string, expected an object"),
        ("inputs/0/name", 5, "'inputs\\[0\\].name' is an integer"),
        ("inputs/0/shape", "N,3", "'inputs\\[0\\].shape' is a string"),
        ("inputs/0/shape/1", -3, "'inputs\\[0\\].shape\\[1\\]'"),
        ("outputs", {"y": 1}, "'outputs' is an object, expected a list"),
        ("files/model.onnx", 7, "is an integer, expected an object"),
        ("files/model.onnx", [], "is a list, expected an object"),
        ("files/model.onnx/bytes", "11", "bytes' is a string"),
        ("files/model.onnx/bytes", True, "bytes' is true"),
        ("files/model.onnx/sha256", 1, "not a sha256 hex digest"),
        ("target", ["cpu"], "'target' is a list, expected a string"),
        ("model_name", 3.5, "'model_name' is a number"),
        ("weights", {}, "'weights' is an object, expected a list"),
        ("weights/0", None, "'weights\\[0\\]' is null"),
        ("weights/0/shape", [4, "3"], "'weights\\[0\\].shape\\[1\\]' is a string"),
        ("weights/0/shape", [1 << 40, 1 << 40], "more than 2\\*\\*63 elements"),
        ("weights/0/bytes", -1, "'weights\\[0\\].bytes' is -1"),
        ("weights/0/dtype", 32, "'weights\\[0\\].dtype' is an integer"),
        ("weights/0/streams", [], "'weights\\[0\\].streams' is a list"),
        ("weights/0/streams/data", "48", "streams.data' is a string"),
        ("options", "fast", "'options' is a string, expected an object"),
        ("provenance", [], "'provenance' is a list"),
        ("account", 1, "'account' is an integer"),
        ("account/layers/0/bytes", "x", "'account.layers\\[0\\].bytes' is a string"),
        ("account/layers/0", 1, "'account.layers\\[0\\]' is an integer"),
        ("account/total/bytes", [], "'account.total.bytes' is a list"),
    ],
)
def test_manifest_fields_of_the_wrong_type_are_one_input_error(tmp_path, path, value, match):
    _write(tmp_path / "b")
    if path.startswith("weights/"):  # an older bundle's manifest lists the container's tensors too
        entry = {
            "name": "w",
            "codec": "raw",
            "bytes": 48,
            "streams": {"data": 48},
            "shape": [4, 3],
            "dtype": "float32",
        }
        _edit_manifest(tmp_path / "b", _assign("weights", [entry]))
    if path.startswith("account/layers/"):  # an older manifest lists the per-tensor rows too
        row = {"name": "w", "codec": "raw", "bytes": 48, "original_bytes": 48}
        _edit_manifest(tmp_path / "b", _assign("account/layers", [row]))
    _edit_manifest(tmp_path / "b", _assign(path, value))
    with pytest.raises(InputError, match=match) as exc:
        load_bundle(tmp_path / "b")
    line = exc.value.line()
    assert line.startswith(str(tmp_path / "b")) and "manifest.json" in line and "\n" not in line


def test_manifest_nested_100k_deep_is_one_input_error(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested too deeply") as exc:
        load_bundle(tmp_path / "b")
    assert str(tmp_path / "b") in exc.value.line()


def test_manifest_nesting_below_the_recursion_limit_is_refused_too(tmp_path):
    _write(tmp_path / "b")
    deep: list = []
    for _ in range(200):  # parses, but would crash a recursive walk later (JSON output, inspect)
        deep = [deep]
    _edit_manifest(tmp_path / "b", _assign("options", {"x": deep}))
    with pytest.raises(InputError, match="levels deep"):
        load_bundle(tmp_path / "b")


def test_a_directory_in_place_of_a_listed_file_is_one_input_error(tmp_path):
    _write(tmp_path / "b")
    (tmp_path / "b" / "model.onnx").unlink()
    (tmp_path / "b" / "model.onnx").mkdir()
    with pytest.raises(InputError, match="model.onnx is not a regular file") as exc:
        load_bundle(tmp_path / "b")
    assert str(tmp_path / "b") in exc.value.line()


def test_a_fifo_in_place_of_weights_is_refused_without_blocking(tmp_path):
    import os

    _write(tmp_path / "b")
    (tmp_path / "b" / "weights.mcw").unlink()
    os.mkfifo(tmp_path / "b" / "weights.mcw")
    with pytest.raises(InputError, match="weights.mcw is not a regular file") as exc:
        load_bundle(tmp_path / "b")
    assert str(tmp_path / "b") in exc.value.line()
    with pytest.raises(InputError, match="not a regular file"):
        load_bundle(tmp_path / "b", verify=False)


def test_a_listed_file_linking_outside_the_bundle_is_refused(tmp_path):
    _write(tmp_path / "b")
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"graph bytes")
    (tmp_path / "b" / "model.onnx").unlink()
    (tmp_path / "b" / "model.onnx").symlink_to(outside)
    with pytest.raises(InputError, match="points outside the bundle"):
        load_bundle(tmp_path / "b")


def test_an_unreadable_member_names_the_bundle_and_the_member(tmp_path, monkeypatch):
    _write(tmp_path / "b")

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(bundle_mod, "sha256_file", denied)
    with pytest.raises(InputError, match="cannot read") as exc:
        load_bundle(tmp_path / "b")
    assert str(tmp_path / "b") in exc.value.line() and "Permission denied" in exc.value.line()
    monkeypatch.undo()
    b = load_bundle(tmp_path / "b")
    real_open = open

    def open_denied(path, *a, **k):
        if str(path).endswith("model.onnx"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", open_denied)
    with pytest.raises(InputError, match="cannot read model.onnx") as exc:
        b.read_bytes("model.onnx")
    assert str(tmp_path / "b") in exc.value.line()


def test_a_directory_in_place_of_weights_fails_container_with_the_bundle_named(tmp_path):
    b = _write(tmp_path / "b")
    (tmp_path / "b" / "weights.mcw").unlink()
    (tmp_path / "b" / "weights.mcw").mkdir()
    with pytest.raises(InputError, match="weights.mcw is not a regular file") as exc:
        b.container()
    assert str(tmp_path / "b") in exc.value.line()


@pytest.mark.parametrize(
    "manifest",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"format": "mconv-bundle", "format_version": 1, "target": "cpu", "files": {"model.onnx": 3}}',
    ],
)
def test_hostile_manifest_inside_a_zip_is_one_input_error(tmp_path, manifest):
    _write(tmp_path / "b")
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as zf:
        for f in sorted((tmp_path / "b").iterdir()):
            if f.is_file():
                zf.writestr(f.name, manifest if f.name == "manifest.json" else f.read_bytes())
    with pytest.raises(InputError) as exc:
        load_bundle(tmp_path / "bad.zip")
    assert exc.value.line().startswith(str(tmp_path / "bad.zip"))
