"""A safetensors file clustered into a weights bundle, streamed (drivers/weights_stream.py rule 7).

The oracle for the values is the packed-safetensors path (``compress_checkpoint``, itself tested
against a brute-force nearest centroid and the graph pass in test_weights_stream.py): the bundle
holds the same codes and the same palettes, stored in the tensor's own dtype. The container is
read back by mconv's reader and by the C99 decoder, built here from the shipped sources.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mconv.codecs
import ml_dtypes
import numpy as np
import pytest
from mconv.bundle import load_bundle
from mconv.container import read_container
from mconv.drivers.weights_stream import (
    Scheme,
    bundle_streamable,
    compress_checkpoint,
    compress_to_bundle,
    dequantized,
)
from mconv.targets.weights import bundle_arrays
from safetensors.numpy import save_file

SRC = Path(mconv.codecs.__file__).resolve().parent
CC = shutil.which("cc") or shutil.which("gcc")


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = {
        "layers.0.q.weight": (rng.standard_normal((96, 200)) * 0.02).astype(np.float16),
        "layers.0.k.weight": (rng.standard_normal((48, 120)) * 0.05).astype(ml_dtypes.bfloat16),
        "layers.0.norm.weight": np.ones(200, np.float16),
        "layers.0.mlp.weight": rng.standard_normal((64, 160)).astype(np.float32),
        "step": np.array([3], np.int64),
    }
    t["layers.0.q.weight"][5, :17] = 0
    return t


SCHEMES = [
    Scheme("cluster", 4),
    Scheme("cluster", 3, groups=4),
    Scheme("cluster", 1),
    Scheme("cluster", 2, groups=7, init="density"),
    Scheme("cluster", 3, block=40),
]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"bits{s.bits}g{s.groups}b{s.block}{s.init}")
def test_bundle_holds_the_streamed_codes_and_palettes(scheme, tmp_path):
    t = _tensors(2)
    save_file(t, str(tmp_path / "w.safetensors"))
    assert bundle_streamable(tmp_path / "w.safetensors", scheme)
    r = compress_to_bundle(tmp_path / "w.safetensors", tmp_path / "b", scheme, chunk_bytes=2048)
    compress_checkpoint(tmp_path / "w.safetensors", tmp_path / "ref.safetensors", scheme, chunk_bytes=2048)
    want = dequantized(tmp_path / "ref.safetensors")
    bundle = load_bundle(tmp_path / "b")  # sizes and sha256 checked
    got = bundle_arrays(bundle)  # every blob's CRC-32 checked on decode
    assert sorted(got) == sorted(t)
    for name, w in t.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape
        if name in ("layers.0.norm.weight", "step"):
            assert got[name].tobytes() == w.tobytes()  # copied byte for byte
            continue
        # the same codes; the palette rounded to the tensor's dtype (a no-op for block palettes
        # and float32 tensors, which the safetensors path stores in that dtype already)
        np.testing.assert_array_equal(got[name], want[name].astype(np.float32).astype(w.dtype))
        if not scheme.block:
            assert len(np.unique(got[name].astype(np.float32))) <= (1 << scheme.bits) * scheme.groups
    assert np.all(got["layers.0.q.weight"][5, :17] == 0)  # exact zeros stay exact
    # the report's error is the stored values' error
    for row in r.tensors:
        x, y = t[row["name"]].astype(np.float64), got[row["name"]].astype(np.float64)
        snr = 10 * np.log10(np.sum(x * x) / np.sum((x - y) ** 2))
        assert row["snr_db"] == pytest.approx(snr, abs=1e-6)
    m = bundle.manifest
    assert m["target"] == "weights" and m["provenance"]["source_name"] == "w.safetensors"
    assert m["provenance"]["passes"][0]["name"] == "cluster"
    with read_container(tmp_path / "b" / "weights.mcw") as c:
        assert m["account"]["total"]["bytes"] == sum(len(c.blob(n)) for n in c.names)
        assert c.record("layers.0.q.weight")["codebook_dtype"] == "float16"
        assert c.record("layers.0.k.weight")["codebook_dtype"] == "bfloat16"
    # deterministic: the same input and scheme give the same bytes
    compress_to_bundle(tmp_path / "w.safetensors", tmp_path / "b2", scheme, chunk_bytes=1 << 20)
    for f in ("manifest.json", "weights.mcw"):
        assert (tmp_path / "b" / f).read_bytes() == (tmp_path / "b2" / f).read_bytes()


def test_rows_that_do_not_pack_are_not_streamed_into_a_bundle(tmp_path):
    """201 values a row at 3 bits end mid-byte: the rows' packing is not the container's flat
    one, so the graph pipeline writes that bundle (the CLI test below runs it)."""
    rng = np.random.default_rng(3)
    save_file({"w": rng.standard_normal((32, 201)).astype(np.float16)}, str(tmp_path / "w.safetensors"))
    assert not bundle_streamable(tmp_path / "w.safetensors", Scheme("cluster", 3))
    assert bundle_streamable(tmp_path / "w.safetensors", Scheme("cluster", 8))
    assert not bundle_streamable(tmp_path / "w.safetensors", Scheme("cluster", 4, block=64))


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("mconv"))
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)


def test_cli_optimize_to_a_folder_streams_a_weights_bundle(tmp_path):
    """The issue's command, ``optimize w.safetensors --passes "cluster(bits=4)" -o out``: a
    weights bundle, streamed, that ``verify`` and ``inspect`` read; a file whose rows do not
    pack still gets its bundle from the graph pipeline."""
    t = _tensors(4)
    save_file(t, str(tmp_path / "w.safetensors"))
    p = _cli("optimize", "w.safetensors", "--passes", "cluster(bits=4)", "-o", "out", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rep = doc["passes"][0]
    assert any("a weights bundle" in n for n in rep["notes"]) and len(rep["tensors"]) == 4  # the norm too
    assert {Path(f).name for f in doc["files"]} == {"manifest.json", "weights.mcw"}
    got = bundle_arrays(load_bundle(tmp_path / "out"))
    compress_to_bundle(tmp_path / "w.safetensors", tmp_path / "ref", Scheme("cluster", 4, min_elements=16))
    assert (tmp_path / "out" / "weights.mcw").read_bytes() == (tmp_path / "ref" / "weights.mcw").read_bytes()
    v = _cli("verify", "w.safetensors", "out", "--json", cwd=tmp_path)
    assert v.returncode == 0, v.stderr
    rows = json.loads(v.stdout)["outputs"]
    assert got["layers.0.norm.weight"].tobytes() == t["layers.0.norm.weight"].tobytes()
    assert rows["layers.0.norm.weight"]["max_abs"] == 0
    for row in rep["tensors"]:  # the report's error is what verify measures on the bundle
        assert rows[row["name"]]["snr_db"] == pytest.approx(row["snr_db"], abs=1e-6)
    i = _cli("inspect", "out", cwd=tmp_path)
    assert i.returncode == 0 and "layers.0.q.weight" in i.stdout
    # rows that end mid-byte at 3 bits: the graph pipeline's bundle, not streamed
    rng = np.random.default_rng(5)
    save_file({"w": rng.standard_normal((32, 201)).astype(np.float16)}, str(tmp_path / "odd.safetensors"))
    p = _cli(
        "optimize", "odd.safetensors", "--passes", "cluster(bits=3)", "-o", "odd", "--json", cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    assert not any("streamed" in n for n in json.loads(p.stdout)["passes"][0]["notes"])
    assert len(np.unique(bundle_arrays(load_bundle(tmp_path / "odd"))["w"].astype(np.float32))) <= 8


@pytest.mark.skipif(CC is None, reason="no C compiler on PATH")
def test_c_decoder_reads_the_streamed_bundle_bit_for_bit(tmp_path):
    exe = tmp_path / "mcw_decode"
    subprocess.run(
        [CC, "-std=c99", "-O2", "-o", str(exe), str(SRC / "mcw_decode.c"), str(SRC / "decoder.c")],
        check=True,
        capture_output=True,
    )
    t = _tensors(6)
    del t["step"]  # (the C decoder reads float containers: int64 is refused, file and all)
    save_file(t, str(tmp_path / "w.safetensors"))
    for scheme in (Scheme("cluster", 4, groups=3), Scheme("cluster", 3, block=40)):
        compress_to_bundle(tmp_path / "w.safetensors", tmp_path / "b", scheme)
        got = bundle_arrays(load_bundle(tmp_path / "b"))
        for name in sorted(t):  # float16, bfloat16 and float32 palettes, and a raw float16 norm
            out = subprocess.run(
                [str(exe), str(tmp_path / "b" / "weights.mcw"), name], capture_output=True, check=True
            ).stdout
            want = got[name].astype(np.float32).ravel()  # float16 widens exactly
            assert np.array_equal(np.frombuffer(out, "<u4"), want.view("<u4"))
