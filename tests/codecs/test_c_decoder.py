"""The portable C99 decoder (decoder.c + mcw_decode.c) agrees bit for bit with the Python one."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import mconv.container as container
import numpy as np
import pytest
from mconv.codecs import decode, encode
from mconv.errors import InputError

SRC = Path(__file__).resolve().parents[2] / "core" / "codecs"
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on PATH")


@pytest.fixture(scope="module")
def mcw_decode(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("cbuild") / "mcw_decode"
    cmd = [
        CC,
        "-std=c99",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-o",
        str(exe),
        str(SRC / "mcw_decode.c"),
        str(SRC / "decoder.c"),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    return exe


def clustered(shape, n_values, sparsity, seed, fp16=False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(n_values).astype(np.float32)
    pool[0] = -0.0
    if fp16:
        pool = pool.astype(np.float16).astype(np.float32)
    w = pool[rng.integers(0, n_values, shape)]
    w[rng.random(shape) < sparsity] = 0
    return w


def blockwise(shape, block, per_block, seed, fp16=False) -> np.ndarray:
    """Every run of ``block`` values (C order) drawn from ``per_block`` values of its own, and
    some -0.0 and +0.0."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    nblocks = -(-n // block)
    books = rng.standard_normal((nblocks, per_block)).astype(np.float32)
    if fp16:
        books = books.astype(np.float16).astype(np.float32)
    w = books[np.arange(nblocks * block) // block, rng.integers(0, per_block, nblocks * block)][:n]
    w[rng.random(n) < 0.1] = -0.0
    w[rng.random(n) < 0.1] = 0.0
    return w.reshape(shape)


CASES = [
    ("raw", clustered((3, 5, 2, 2), 1000, 0.0, 1), {"codec": "raw"}),
    ("fp16", clustered((40,), 50, 0.3, 2, fp16=True), {"codec": "fp16"}),
    ("palette3", clustered((17, 9), 8, 0.0, 3), {"codec": "palette", "bits": 3}),
    ("palette_huff_f16", clustered((64, 33), 32, 0.5, 4, fp16=True), {"codec": "palette", "huffman": True}),
    ("palette_groups", clustered((10, 3, 3), 30, 0.2, 5), {"codec": "palette", "groups": 4, "huffman": True}),
    ("sparse_raw", clustered((50, 40), 500, 0.9, 6), {"codec": "sparse", "index_bits": 2}),
    (
        "sparse_fp16",
        clustered((50, 40), 20, 0.95, 7, fp16=True),
        {"codec": "sparse", "index_bits": 5, "values": "fp16", "huffman": True},
    ),
    (
        "sparse_pal_huff",
        clustered((120, 100), 31, 0.91, 8),
        {"codec": "sparse", "index_bits": 4, "values": "palette", "bits": 5, "huffman": True},
    ),
    (
        "sparse_pal_8",
        clustered((9000,), 200, 0.6, 9),
        {"codec": "sparse", "index_bits": 8, "values": "palette"},
    ),
    ("empty", np.zeros((0, 4), np.float32), {"codec": "sparse", "values": "palette", "huffman": True}),
    ("scalar", np.array(-0.0, np.float32), {"codec": "palette", "huffman": True}),
    ("all_zero", np.zeros((7, 7), np.float32), {"codec": "sparse", "index_bits": 3, "huffman": True}),
    ("half_tensor", clustered((8, 8), 4, 0.5, 10, fp16=True).astype(np.float16), {"codec": "palette"}),
    # rANS (issue 14 item 6): one lane, several lanes (numpy path), partial last step, edge cases
    ("palette_rans", clustered((64, 33), 32, 0.5, 11, fp16=True), {"codec": "palette", "rans": True}),
    (
        "sparse_pal_rans_lanes",
        clustered((300, 331), 31, 0.7, 12),
        {"codec": "sparse", "index_bits": 5, "values": "palette", "bits": 5, "rans": True},
    ),
    (
        "palette_groups_rans",
        clustered((10, 3, 3), 30, 0.2, 13),
        {"codec": "palette", "groups": 4, "rans": True},
    ),
    (
        "sparse_raw_rans",
        clustered((50, 40), 500, 0.9, 14),
        {"codec": "sparse", "index_bits": 3, "rans": True},
    ),
    ("empty_rans", np.zeros((0, 4), np.float32), {"codec": "sparse", "values": "palette", "rans": True}),
    ("scalar_rans", np.array(-0.0, np.float32), {"codec": "palette", "rans": True}),
    ("all_zero_rans", np.zeros((7, 7), np.float32), {"codec": "sparse", "index_bits": 3, "rans": True}),
    ("one_value_rans", np.full((20000,), 0.5, np.float32), {"codec": "palette", "bits": 2, "rans": True}),
    # per-block palettes (palette rule 7): rows of blocks, a shorter last block, every coder
    ("block_f32", blockwise((16, 64), 32, 7, 15), {"codec": "palette", "block": 32}),
    (
        "block_f32_book",
        blockwise((16, 64), 32, 7, 16),
        {"codec": "palette", "block": 32, "codebook_dtype": "float32"},
    ),
    (
        "block_f16_huff",
        blockwise((9, 50), 64, 12, 17, fp16=True),
        {"codec": "palette", "block": 64, "huffman": True},
    ),
    (
        "block_f16_rans",
        blockwise((40, 333), 100, 5, 18, fp16=True),
        {"codec": "palette", "block": 100, "rans": True},
    ),
    (
        "block_half_tensor",
        blockwise((6, 7), 5, 3, 19, fp16=True).astype(np.float16),
        {"codec": "palette", "block": 5},
    ),
    ("block_one", blockwise((3, 4), 1, 1, 20), {"codec": "palette", "block": 1, "huffman": True}),
    ("block_whole", blockwise((5, 5), 25, 9, 21), {"codec": "palette", "block": 1000, "rans": True}),
]


@pytest.fixture(
    scope="module",
    params=[1, 2, 3, 4, 5],
    ids=["v1-json-index", "v2-binary-index", "v3-compact-index", "v4-slim-index", "v5-short-records"],
)
def weights(tmp_path_factory, request) -> Path:
    path = tmp_path_factory.mktemp("mcw") / "weights.mcw"
    container.write_container(path, [(name, w, spec) for name, w, spec in CASES], version=request.param)
    return path


@pytest.mark.parametrize("name,w,spec", CASES, ids=[c[0] for c in CASES])
def test_c_decoder_matches_python_bit_for_bit(mcw_decode, weights, name, w, spec):
    out = subprocess.run([str(mcw_decode), str(weights), name], capture_output=True, check=True).stdout
    blob, record = encode(w, spec)
    expected = decode(blob, record).astype(np.float32)  # float16 widens exactly
    assert np.array_equal(np.frombuffer(out, "<u4"), expected.ravel().view("<u4"))


def test_c_decoder_writes_one_file_per_tensor(mcw_decode, weights, tmp_path):
    subprocess.run([str(mcw_decode), str(weights), "-o", str(tmp_path)], check=True)
    for name, w, _ in CASES:
        got = np.fromfile(tmp_path / f"{name}.f32", "<f4")
        assert np.array_equal(got.view("<u4"), w.astype(np.float32).ravel().view("<u4"))


def test_c_decoder_reports_truncated_files_with_exit_2(mcw_decode, weights, tmp_path):
    data = weights.read_bytes()
    for cut in (3, 20, len(data) - 100):
        bad = tmp_path / f"cut{cut}.mcw"
        bad.write_bytes(data[:cut])
        proc = subprocess.run([str(mcw_decode), str(bad)], capture_output=True, timeout=30)
        assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1


def test_c_decoder_rejects_damaged_blobs_without_crashing(mcw_decode, weights, tmp_path):
    data = bytearray(weights.read_bytes())
    info = container.read_container(weights)
    entry = info._entry("sparse_pal_huff")
    info.close()
    rng = np.random.default_rng(0)
    for trial in range(20):
        damaged = bytearray(data)
        at = entry.offset + int(rng.integers(0, entry.nbytes))
        damaged[at] ^= int(rng.integers(1, 256))
        bad = tmp_path / f"flip{trial}.mcw"
        bad.write_bytes(bytes(damaged))
        proc = subprocess.run([str(mcw_decode), str(bad), "sparse_pal_huff"], capture_output=True, timeout=30)
        assert proc.returncode in (0, 2)  # never a signal (negative return code)


def test_c_decoder_rejects_damaged_rans_blobs_like_python(mcw_decode, weights, tmp_path):
    """A flipped byte in a rANS blob: C exits 0 or 2 (never a signal); where it decodes, it agrees
    with Python's decoder, and a stream Python refuses C refuses too."""
    name = "sparse_pal_rans_lanes"
    data = bytearray(weights.read_bytes())
    info = container.read_container(weights)
    entry = info._entry(name)
    info.close()
    rng = np.random.default_rng(3)
    for trial in range(20):
        damaged = bytearray(data)
        at = entry.offset + int(rng.integers(0, entry.nbytes))
        damaged[at] ^= int(rng.integers(1, 256))
        bad = tmp_path / f"rflip{trial}.mcw"
        bad.write_bytes(bytes(damaged))
        proc = subprocess.run([str(mcw_decode), str(bad), name], capture_output=True, timeout=30)
        assert proc.returncode in (0, 2), proc.stderr
        try:
            py = decode(bytes(damaged[entry.offset : entry.offset + entry.nbytes]), entry.record)
        except InputError:
            assert proc.returncode == 2, f"trial {trial}: Python refuses, C decoded"
            continue
        assert proc.returncode == 0, f"trial {trial}: Python decoded, C refused: {proc.stderr!r}"
        assert np.array_equal(np.frombuffer(proc.stdout, "<u4"), py.astype(np.float32).ravel().view("<u4"))


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_c_decoder_refuses_damaged_binary_indexes_with_one_line(mcw_decode, tmp_path, version):
    """Version 2 to 5 index bytes flipped, cut or lengthened: exit 2 and one line, never a crash."""
    path = tmp_path / "v2.mcw"
    container.write_container(path, [(name, w, spec) for name, w, spec in CASES], version=version)
    data = path.read_bytes()
    (index_len,) = struct.unpack_from("<Q", data, 8)
    rng = np.random.default_rng(2)
    for trial in range(40):
        damaged = bytearray(data)
        at = 16 + int(rng.integers(0, index_len))
        damaged[at] ^= int(rng.integers(1, 256))
        bad = tmp_path / f"idx{trial}.mcw"
        bad.write_bytes(bytes(damaged))
        proc = subprocess.run([str(mcw_decode), str(bad), "-l"], capture_output=True, timeout=30)
        assert proc.returncode in (0, 2), proc.stderr  # never a signal
        if proc.returncode == 2:
            assert proc.stderr.count(b"\n") == 1 and str(bad).encode() in proc.stderr
    longer = bytearray(data)
    struct.pack_into("<Q", longer, 8, index_len + 1)  # the index claims one byte of the blobs
    (tmp_path / "long.mcw").write_bytes(bytes(longer))
    proc = subprocess.run([str(mcw_decode), str(tmp_path / "long.mcw")], capture_output=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1
    v6 = bytearray(data)
    v6[4] = 6
    (tmp_path / "v6.mcw").write_bytes(bytes(v6))
    proc = subprocess.run([str(mcw_decode), str(tmp_path / "v6.mcw")], capture_output=True, timeout=30)
    assert proc.returncode == 2 and b"unsupported container version" in proc.stderr


def test_c_decoder_refuses_damaged_block_records_like_python(mcw_decode, tmp_path):
    """A block record whose block or groups no longer agree with the tensor: C exits 2 with one
    line, Python raises InputError; a decoder that ignores "block" (the key renamed) meets
    groups > rows and refuses too."""
    w = blockwise((10, 30), 16, 5, 22)  # 300 values: 19 blocks of 16 (the last of 12)
    path = tmp_path / "block.mcw"
    container.write_container(path, [("b", w, {"codec": "palette", "block": 16, "huffman": True})], version=1)
    raw = path.read_bytes()
    assert raw.count(b'"block":16') == 1 and raw.count(b'"groups":19') == 1
    proc = subprocess.run([str(mcw_decode), str(path), "b"], capture_output=True, timeout=30)
    assert proc.returncode == 0 and np.array_equal(np.frombuffer(proc.stdout, "<u4"), w.ravel().view("<u4"))
    for old, new in [
        (b'"block":16', b'"block":15'),  # 20 blocks, groups says 19
        (b'"block":16', b'"block":99'),
        (b'"groups":19', b'"groups":18'),
        (b'"groups":19', b'"groups":90'),
        (b'"block":16', b'"blocc":16'),  # no block: 19 groups of 10 rows
    ]:
        bad = tmp_path / "bad.mcw"
        bad.write_bytes(raw.replace(old, new))
        with container.read_container(bad) as c, pytest.raises(InputError):
            c.array("b")
        proc = subprocess.run([str(mcw_decode), str(bad), "b"], capture_output=True, timeout=30)
        assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1, (new, proc.stderr)
    # block 0 and a block longer than the tensor, on a record with one-value blocks
    one = tmp_path / "one.mcw"
    container.write_container(one, [("b", w[:1, :5], {"codec": "palette", "block": 1})], version=1)
    raw = one.read_bytes()
    for old, new in [(b'"block":1', b'"block":0'), (b'"block":1', b'"block":6')]:
        assert raw.count(old) == 1
        bad = tmp_path / "bad1.mcw"
        bad.write_bytes(raw.replace(old, new))
        with container.read_container(bad) as c, pytest.raises(InputError):
            c.array("b")
        proc = subprocess.run([str(mcw_decode), str(bad), "b"], capture_output=True, timeout=30)
        assert proc.returncode == 2 and b"block" in proc.stderr, (new, proc.stderr)
