"""Streaming weight-only compression of safetensors checkpoints (formats/weights_stream.py)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from mconv.errors import InputError
from mconv.formats.weights_stream import Scheme, compress_checkpoint, dequantized, open_checkpoint
from mconv.passes._weights import snr_db
from safetensors.numpy import save_file


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = {
        "layers.0.q.weight": (rng.standard_normal((96, 200)) * 0.02).astype(np.float16),
        "layers.0.norm.weight": np.ones(200, np.float16),
        "layers.0.mlp.weight": rng.standard_normal((64, 128)).astype(np.float32),
        "step": np.array([3], np.int64),
    }
    t["layers.0.q.weight"][5, :17] = 0
    return t


def _sharded(tmp_path, seed: int = 0):
    t = _tensors(seed)
    names = list(t)
    save_file({n: t[n] for n in names[:2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({n: t[n] for n in names[2:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    wmap = {n: f"model-0000{1 + (i >= 2)}-of-00002.safetensors" for i, n in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return t


SCHEMES = [
    Scheme("blockwise", 4, 32, True),
    Scheme("blockwise", 4, 64, False, "hqq"),
    Scheme("blockwise", 8, 128),
    Scheme("cluster", 4),
    Scheme("cluster", 3, groups=4),
    Scheme("cluster", 1),
]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"{s.kind}{s.bits}")
def test_single_file_round_trip(scheme, tmp_path):
    t = _tensors(1)
    save_file(t, str(tmp_path / "w.safetensors"))
    r = compress_checkpoint(tmp_path / "w.safetensors", tmp_path / "o.safetensors", scheme, chunk_bytes=4096)
    d = dequantized(tmp_path / "o.safetensors")
    assert set(d) == set(t)
    assert np.array_equal(d["layers.0.norm.weight"], t["layers.0.norm.weight"])  # copied
    assert np.array_equal(d["step"], t["step"])
    # 1 bit on a tensor with zeros: zero plus one centroid (cluster rule 1), SNR near 0
    floor = {1: -1, 3: 10, 4: 15, 8: 38}[scheme.bits]
    for row in r.tensors:
        name = row["name"]
        assert d[name].dtype == t[name].dtype and d[name].shape == t[name].shape
        got = snr_db(t[name].astype(np.float32), d[name].astype(np.float32))
        assert got > floor
        assert abs(got - row["snr_db"]) < 0.05  # the report is the file's real error (float16 rounding aside)
    if scheme.kind == "cluster":  # exact zeros stay zero (cluster rule 1)
        assert np.all(d["layers.0.q.weight"][5, :17] == 0)
    assert r.bytes_out < r.bytes_in


def test_chunking_does_not_change_the_output(tmp_path):
    t = _tensors(2)
    save_file(t, str(tmp_path / "w.safetensors"))
    for scheme in (SCHEMES[0], SCHEMES[3]):
        compress_checkpoint(tmp_path / "w.safetensors", tmp_path / "a.safetensors", scheme, chunk_bytes=1000)
        compress_checkpoint(
            tmp_path / "w.safetensors", tmp_path / "b.safetensors", scheme, chunk_bytes=1 << 24
        )
        assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_sharded_checkpoint_is_one_model(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    t = _sharded(src)
    r = compress_checkpoint(src, tmp_path / "out", Scheme("blockwise", 4, 32))
    idx = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert idx["weight_map"]["layers.0.q.weight.qweight"] == "model-00001-of-00002.safetensors"
    assert idx["weight_map"]["step"] == "model-00002-of-00002.safetensors"
    assert len(r.tensors) == 2
    d = {}
    for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        d.update(dequantized(tmp_path / "out" / f))
    assert set(d) == set(t)


def _index(tmp_path, wmap):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    return tmp_path / "model.safetensors.index.json"


def test_hostile_indexes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _sharded(src)
    idx = src / "model.safetensors.index.json"
    doc = json.loads(idx.read_text())
    cases = {
        "../escape.safetensors": "not a file name",
        "sub/x.safetensors": "not a file name",
        "missing.safetensors": "missing",
    }
    for shard, msg in cases.items():
        bad = dict(doc["weight_map"])
        bad["layers.0.q.weight"] = shard
        idx.write_text(json.dumps({"weight_map": bad}))
        with pytest.raises(InputError, match=msg) as e:
            open_checkpoint(idx)
        assert "model.safetensors.index.json" in str(e.value.line())
    # a tensor the map puts in the other shard
    bad = dict(doc["weight_map"])
    bad["step"] = "model-00001-of-00002.safetensors"
    idx.write_text(json.dumps({"weight_map": bad}))
    with pytest.raises(InputError, match="weight map puts it"):
        open_checkpoint(idx)
    # a tensor in the map that no shard holds
    bad = dict(doc["weight_map"], ghost="model-00001-of-00002.safetensors")
    idx.write_text(json.dumps({"weight_map": bad}))
    with pytest.raises(InputError, match="ghost"):
        open_checkpoint(idx)
    for text in ("[1]", '{"weight_map": {}}', '{"weight_map": 3}', "[" * 100000):
        idx.write_text(text)
        with pytest.raises(InputError) as e:
            open_checkpoint(idx)
        assert "index" in str(e.value.line())


def test_truncated_shard_refused_before_any_output(tmp_path):
    t = _tensors(3)
    save_file(t, str(tmp_path / "w.safetensors"))
    raw = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(raw[:-100])
    with pytest.raises(InputError) as e:
        compress_checkpoint(tmp_path / "w.safetensors", tmp_path / "o.safetensors", Scheme())
    assert "w.safetensors" in e.value.line()
    assert not (tmp_path / "o.safetensors").exists()
    # a header that declares more than the file holds
    (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(InputError, match="runs past the end"):
        compress_checkpoint(tmp_path / "h.safetensors", tmp_path / "o.safetensors", Scheme())


def test_bad_schemes_are_input_errors(tmp_path):
    save_file(_tensors(4), str(tmp_path / "w.safetensors"))
    for scheme in (
        Scheme("blockwise", 3),
        Scheme("blockwise", method="gptq"),
        Scheme("cluster", 9),
        Scheme("x"),
    ):
        with pytest.raises(InputError):
            compress_checkpoint(tmp_path / "w.safetensors", tmp_path / "o.safetensors", scheme)
