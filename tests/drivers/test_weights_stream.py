"""Streaming weight-only compression of safetensors checkpoints (drivers/weights_stream.py)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.drivers.weights_stream import Scheme, compress_checkpoint, dequantized, open_checkpoint
from mconv.edit.weights import snr_db
from mconv.errors import InputError
from safetensors.numpy import load_file, save_file


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
    Scheme("cluster", 3, block=64),
]


@pytest.mark.parametrize(
    "scheme",
    SCHEMES,
    ids=lambda s: f"{s.kind}{s.bits}" + (f"b{s.block}" if s.kind == "cluster" and s.block else ""),
)
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


# --- the fast kernels against straightforward references written here ----------------------


def _f16_scale(s: np.ndarray) -> np.ndarray:
    mag = np.clip(np.abs(s), 2.0**-24, 65504.0).astype(np.float16).astype(np.float32)
    return np.where(s < 0, -mag, mag)


def _reference_rtn(w: np.ndarray, bits: int, block: int, sym: bool):
    """Blockwise RTN as the module doc states it, block by block: codes as stored (symmetric
    offset by 2**(bits-1)), float16 scales and uint8 zero points, the codes packed LSB first."""
    x = w.astype(np.float32)
    r, k = x.shape
    nb = k // block
    codes = np.zeros((r, k), np.uint8)
    scales = np.zeros((r, nb), np.float32)
    zeros = np.zeros((r, nb), np.uint8)
    qmax = (1 << bits) - 1
    for i in range(r):
        for j in range(nb):
            b = x[i, j * block : (j + 1) * block]
            if sym:
                m = b[int(np.argmax(np.abs(b)))]  # the first value of largest magnitude
                s = _f16_scale(np.float32(1.0) if m == 0 else m / np.float32(-(1 << (bits - 1))))
                q = np.clip(np.rint(b / s), -(1 << (bits - 1)), (1 << (bits - 1)) - 1) + (1 << (bits - 1))
            else:
                lo, hi = min(b.min(), np.float32(0)), max(b.max(), np.float32(0))
                s = _f16_scale(np.float32(1.0) if hi <= lo else (hi - lo) / np.float32(qmax))
                z = np.clip(np.rint(-lo / s), 0, qmax)
                zeros[i, j] = z
                q = np.clip(np.rint(b / s) + z, 0, qmax)
            scales[i, j] = s
            codes[i, j * block : (j + 1) * block] = q
    if bits == 4:
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    else:
        packed = codes
    return packed, scales.astype(np.float16), zeros


def _awkward(rng: np.random.Generator, rows: int, cols: int, block: int) -> np.ndarray:
    """fp16 weights with the cases a fast kernel gets wrong: +a and -a tying for the largest
    magnitude (both orders), all-zero and -0.0 blocks, one-sided blocks, huge and tiny values."""
    w = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16)
    w[0, :block] = 0
    w[0, block : 2 * block] = np.float16(-0.0)
    w[1, :block] = np.abs(w[1, :block])
    w[1, block : 2 * block] = -np.abs(w[1, block : 2 * block])
    w[2, 3], w[2, 9] = 0.5, -0.5  # tie, + first
    w[3, 4], w[3, 7] = -0.25, 0.25  # tie, - first
    w[4, :block] = np.float16(3e-8)  # subnormal scales clip to 2**-24
    w[5, :block] = 60000.0
    return w


@pytest.mark.parametrize("bits,block,sym", [(4, 32, True), (4, 128, False), (8, 64, True), (4, 16, False)])
def test_blockwise_codes_equal_a_block_by_block_reference(bits, block, sym, tmp_path):
    rng = np.random.default_rng(bits * block + sym)
    w = _awkward(rng, 24, 4 * block, block)
    save_file({"w": w}, str(tmp_path / "w.safetensors"))
    compress_checkpoint(
        tmp_path / "w.safetensors",
        tmp_path / "o.safetensors",
        Scheme("blockwise", bits, block, sym, min_elements=1),
        chunk_bytes=3 * w.shape[1] * 2,  # several chunks, rows split between the threads
    )
    got = load_file(str(tmp_path / "o.safetensors"))
    packed, scales, zeros = _reference_rtn(w, bits, block, sym)
    np.testing.assert_array_equal(got["w.qweight"], packed)
    np.testing.assert_array_equal(got["w.scales"].view(np.uint16), scales.view(np.uint16))
    if not sym:
        np.testing.assert_array_equal(got["w.zeros"], zeros)


def test_blockwise_refuses_inf_and_nan(tmp_path):
    for bad in (np.inf, np.nan):
        w = np.ones((8, 64), np.float16)
        w[3, 5] = bad
        save_file({"w": w}, str(tmp_path / "w.safetensors"))
        with pytest.raises(InputError, match="inf or nan"):
            compress_checkpoint(
                tmp_path / "w.safetensors", tmp_path / "o.safetensors", Scheme(min_elements=1)
            )
        assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cluster_codes_are_the_nearest_centroid_and_no_worse_than_the_graph_pass(dtype, tmp_path):
    import ml_dtypes
    from mconv.passes.cluster import cluster_array

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(7)
    w = (rng.standard_t(5, size=(64, 300)) * 0.02).astype(dt)
    w[7, :40] = 0
    save_file({"w": w}, str(tmp_path / "w.safetensors"))
    r = compress_checkpoint(
        tmp_path / "w.safetensors", tmp_path / "o.safetensors", Scheme("cluster", 4), chunk_bytes=5000
    )
    got = load_file(str(tmp_path / "o.safetensors"))
    lut = got["w.lut"][0]
    codes = np.stack([got["w.indices"] & 15, got["w.indices"] >> 4], axis=-1).reshape(64, 300)
    x = w.astype(np.float64)
    assert lut[0] == 0 and np.all(codes[x == 0] == 0)  # zero is code 0 and stays exact
    nz = x != 0
    # brute force: the nearest nonzero centroid, the lower one on a tie (argmin's first)
    near = np.abs(x[nz][:, None] - lut[None, 1:].astype(np.float64)).argmin(axis=1) + 1
    np.testing.assert_array_equal(codes[nz], near)
    mse = float(np.mean((lut[codes].astype(np.float64) - x) ** 2))
    assert r.tensors[0]["mse"] == pytest.approx(mse, rel=1e-9)  # the report, from the histogram
    graph = cluster_array(w.astype(np.float32), 4).astype(np.float64)
    assert mse <= float(np.mean((graph - x) ** 2)) * (1 + 1e-9)


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("mconv"))
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)


def test_cli_optimize_streams_a_checkpoint_with_the_same_bytes(tmp_path):
    save_file(_tensors(5), str(tmp_path / "w.safetensors"))
    for spec, scheme in (
        ("blockwise(bits=4, block=32)", Scheme("blockwise", 4, 32)),
        ("blockwise(bits=4, block=64, sym=false)", Scheme("blockwise", 4, 64, False)),
        ("cluster(bits=3, groups=4)", Scheme("cluster", 3, groups=4)),
        ("cluster(bits=2, block=96)", Scheme("cluster", 2, block=96)),
    ):
        p = _cli("optimize", "w.safetensors", "--passes", spec, "-o", "c.safetensors", "--json", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["passes"][0]["name"] == scheme.kind and len(doc["passes"][0]["tensors"]) == 2
        compress_checkpoint(tmp_path / "w.safetensors", tmp_path / "ref.safetensors", scheme)
        assert (tmp_path / "c.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    # a sharded checkpoint: the folder (or its index) in, a folder out
    src = tmp_path / "src"
    src.mkdir()
    _sharded(src, 6)
    for arg in ("src", "src/model.safetensors.index.json"):
        p = _cli("optimize", arg, "--passes", "cluster(bits=4)", "-o", "out", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        idx = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
        assert idx["weight_map"]["layers.0.q.weight.indices"] == "model-00001-of-00002.safetensors"
    # blockwise to a name that is no .safetensors: one line, exit 2
    p = _cli("optimize", "w.safetensors", "--passes", "blockwise", "-o", "out2", cwd=tmp_path)
    assert p.returncode == 2 and "OUT.safetensors" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_cluster_blocks_within_each_row_equal_the_graph_pass_per_block(dtype, tmp_path):
    """``cluster(block=B)`` streamed: each row's blocks (the last one shorter, 200 = 64 * 3 + 8)
    are the graph pass's per-block palettes of that row's values (cluster rule 8), whatever the
    chunking; the palettes are stored in the tensor's dtype."""
    from mconv.passes.cluster import cluster_blocks

    rng = np.random.default_rng(31)
    w = (rng.standard_normal((40, 200)) * 0.02).astype(dtype)
    w[3, :70] = 0
    save_file({"w": w}, str(tmp_path / "w.safetensors"))
    for chunk in (800, 1 << 20):
        r = compress_checkpoint(
            tmp_path / "w.safetensors",
            tmp_path / "o.safetensors",
            Scheme("cluster", 3, block=64),
            chunk_bytes=chunk,
        )
        got = load_file(str(tmp_path / "o.safetensors"))
        assert got["w.lut"].shape == (40, 4, 8) and got["w.lut"].dtype == np.dtype(dtype)
        d = dequantized(tmp_path / "o.safetensors")["w"]
        for row in (0, 3, 39):
            x = w[row]
            want = np.concatenate([cluster_blocks(x[:192], 3, 64), cluster_blocks(x[192:], 3, 8)])
            assert len(np.unique(d[row][:64])) <= 8
            np.testing.assert_array_equal(d[row], want.astype(dtype))
        assert np.all(d[3, :70] == 0)
        bpw = (got["w.lut"].nbytes + got["w.indices"].nbytes) * 8 / w.size
        assert r.tensors[0]["bits_per_weight"] == pytest.approx(bpw, abs=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("bits", [1, 3, 4])
def test_batched_linear_palettes_are_the_per_group_palettes_bit_for_bit(dtype, bits):
    """The groups' palettes of a batch at once (``_palettes_linear``) against the per-group
    code (``_palette_for``, Lloyd on one histogram), on awkward groups: with zeros, a single
    value, all zeros, fewer values than centroids, ties with a midpoint."""
    import ml_dtypes
    from mconv.drivers import stream_kernels as K
    from mconv.drivers.weights_stream import _palette_for, _palettes_linear

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(50 + bits)
    hists = []
    for g in range(10):
        w = (rng.standard_t(4, size=int(rng.integers(50, 3000))) * 0.02).astype(dt)
        if g % 3 == 0:
            w[:10] = 0
        if g == 4:
            w[:] = w[0]
        if g == 5:
            w[:] = 0
        if g == 6:
            w = w[:5]
        if g == 7:
            w[:] = 0
            w[:3] = 1.5
        hists.append(K.hist16(w.view(np.uint16)))
    luts, tables = _palettes_linear(np.stack(hists), dt, bits)
    for g, h in enumerate(hists):
        lut, table = _palette_for(h, dt, bits, "linear")
        assert np.array_equal(lut.view(np.uint32), luts[g].view(np.uint32)), g
        assert np.array_equal(table, tables[g]), g
