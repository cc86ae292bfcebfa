"""The palette codec's grouped palettes along an axis other than 0 (palette rule 5, ``axis``):
a MatMul weight ``[in, out]`` clustered per group of output columns keeps its compression at
export, bit for bit in Python, decoder.c / mcw_decode and (tests/targets/webgpu) mcw.js."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
from pathlib import Path

import mconv.api as api
import mconv.codecs.palette as palette
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mconv.codecs import best_spec, choose_spec, decode, encode, predict_bytes
from mconv.codecs.choose import _AXIS_EXTRA, _specs_and_sizes, record_extra
from mconv.codecs.palette import distinct_values, group_palettes
from mconv.container import read_container, write_container
from mconv.errors import InputError
from mconv.targets import get_target
from onnx import TensorProto, helper, numpy_helper

SRC = Path(__file__).resolve().parents[2] / "core" / "codecs"
CC = shutil.which("cc") or shutil.which("gcc")
CODERS = [{}, {"huffman": True}, {"rans": True}]


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}"))


def grouped(shape, axis, groups, per_group, seed, dtype=np.float32, zeros=True) -> np.ndarray:
    """Positions along ``axis`` split like np.array_split into ``groups`` groups, each drawing
    from ``per_group`` values of its own (some -0.0 and +0.0 among them with ``zeros``)."""
    rng = np.random.default_rng(seed)
    books = rng.standard_normal((groups, per_group)).astype(dtype)
    if zeros:
        books[:, 0] = 0.0
        books[::2, -1] = -0.0
    sizes = [len(p) for p in np.array_split(np.arange(shape[axis]), groups)]
    at = [1] * len(shape)
    at[axis] = shape[axis]
    group = np.repeat(np.arange(groups), sizes).reshape(at)
    return books[np.broadcast_to(group, shape), rng.integers(0, per_group, shape)]


def oracle(w: np.ndarray, groups: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Rule 5 the slow way: the axis moved to the front, np.array_split, rule 2's distinct values
    per group; each element's index looked up one group at a time."""
    moved = np.moveaxis(w, axis, 0)
    books = [distinct_values(part) for part in np.array_split(moved, groups)]
    table = np.zeros((groups, max(b.size for b in books)), w.dtype)
    index = np.zeros(moved.shape, np.uint8)
    start = 0
    for g, (book, part) in enumerate(zip(books, np.array_split(moved, groups))):
        table[g, : book.size] = book
        lookup = {int(k): i for i, k in enumerate(bits_of(book))}
        index[start : start + part.shape[0]] = np.vectorize(lookup.__getitem__)(bits_of(part))
        start += part.shape[0]
    return table, np.ascontiguousarray(np.moveaxis(index, 0, axis)).ravel()


def assert_roundtrip(w: np.ndarray, spec: dict) -> tuple[bytes, dict]:
    blob, record = encode(w, spec)
    back = decode(blob, record)
    assert back.dtype == w.dtype and back.shape == w.shape
    assert np.array_equal(bits_of(back), bits_of(w))
    assert predict_bytes(w, spec) == len(blob)
    assert sum(record["streams"].values()) == len(blob)
    return blob, record


# -- axis 0 stays byte-identical -------------------------------------------------------------


def _golden_tensor(shape, nvals, dtype, mult=7) -> np.ndarray:
    """Deterministic without a random generator: rows choose from shifted pools, -0.0 included."""
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.int64)
    pool = (np.arange(nvals * 64, dtype=np.float64) * 0.37 - 3.0).astype(np.float32)
    pool[0] = -0.0
    rows = i // max(1, n // shape[0])
    return pool[(i * mult % nvals) + (rows % 5) * nvals].reshape(shape).astype(dtype)


# sha256 of blob + json.dumps(record) (key order included) that encode gave before ``axis``
GOLDEN = [
    ("g1", (12, 10), 6, np.float32, {"codec": "palette"}, "3f0a7f5a207019708cd84543eb941cc4"),
    ("g4", (10, 3, 3), 5, np.float32, {"codec": "palette", "groups": 4}, "7c584241723cfa10821fac8d4a9af15f"),
    (
        "g4h",
        (10, 3, 3),
        5,
        np.float32,
        {"codec": "palette", "groups": 4, "huffman": True},
        "446f83105c695fa2acd1883c77963c02",
    ),
    (
        "g3r16",
        (7, 40),
        9,
        np.float16,
        {"codec": "palette", "groups": 3, "rans": True},
        "76cce5d0097e6ab68396c01fe8aa6a5e",
    ),
    (
        "g5b",
        (20, 8),
        3,
        np.float32,
        {"codec": "palette", "groups": 5, "bits": 4, "codebook_dtype": "float32"},
        "0531dd390374937526c6d52e7fb82848",
    ),
    ("blk", (8, 25), 4, np.float32, {"codec": "palette", "block": 16}, "e3501e50682aceda4ac0f2a769dab763"),
]


@pytest.mark.parametrize("name,shape,nvals,dtype,spec,digest", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_axis0_records_and_blobs_are_byte_identical_to_before(name, shape, nvals, dtype, spec, digest):
    w = _golden_tensor(shape, nvals, dtype)
    blob, record = encode(w, spec)
    assert "axis" not in record
    assert hashlib.sha256(bytes(blob) + json.dumps(record).encode()).hexdigest()[:32] == digest
    if "groups" in spec:  # axis=0 given, or axis with one group: the same record and blob
        assert encode(w, {**spec, "axis": 0}) == (blob, record)
        one = {k: v for k, v in spec.items() if k != "groups"}
        assert encode(w, {**one, "axis": 1}) == encode(w, one)
    assert np.array_equal(bits_of(decode(blob, record)), bits_of(w))


# -- roundtrips ------------------------------------------------------------------------------

ROUNDTRIPS = [
    # (shape, axis, groups, values per group): groups not dividing the axis, a group of one
    ((37, 50), 1, 6, 9),
    ((64, 96), 1, 4, 16),
    ((5, 7), 1, 7, 3),
    ((3, 5, 4, 11), 1, 2, 7),
    ((3, 5, 4, 11), 3, 4, 6),
    ((3, 5, 4, 11), 2, 3, 5),
    ((2, 9, 1, 6), 1, 4, 12),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("coder", CODERS, ids=["packed", "huffman", "rans"])
@pytest.mark.parametrize(
    "shape,axis,groups,per", ROUNDTRIPS, ids=[f"{r[0]}-a{r[1]}-g{r[2]}" for r in ROUNDTRIPS]
)
def test_axis_roundtrip_is_bit_exact_and_sized_exactly(shape, axis, groups, per, coder, dtype):
    w = grouped(shape, axis, groups, per, seed=sum(shape) + axis, dtype=dtype)
    spec = {"codec": "palette", "groups": groups, "axis": axis, **coder}
    blob, record = assert_roundtrip(w, spec)
    assert record["axis"] == axis and record["groups"] == groups
    assert record["codebook_size"] <= per  # each group's own values, not all of them
    table, indices = oracle(w, groups, axis)
    assert record["codebook_size"] == table.shape[1]
    found = group_palettes(w, groups, axis)
    assert np.array_equal(bits_of(found.table), bits_of(table)) and np.array_equal(found.indices, indices)
    # the codebook is the blob's head, in the table's order
    store = np.dtype(record["codebook_dtype"])
    head = np.frombuffer(blob[: record["streams"]["codebook"]], store.newbyteorder("<"))
    assert np.array_equal(bits_of(head.astype(w.dtype)), bits_of(table.ravel()))


def test_the_table_and_sorting_paths_give_the_same_blob(monkeypatch):
    """float16 groups large enough are counted in a table (no sort); small ones, and every
    float32 group, are sorted: one result either way."""
    w = grouped((300, 260), 1, 5, 13, seed=3, dtype=np.float16)
    w[::7, ::5] = np.float16(np.nan)
    w[1::9, ::3] = -np.float16(np.inf)
    w32 = grouped((40, 3, 70), 2, 6, 20, seed=4)
    cases = [(w, {"codec": "palette", "groups": 5, "axis": 1, **coder}) for coder in CODERS]
    cases += [(w32, {"codec": "palette", "groups": 6, "axis": 2, "rans": True})]
    want = [assert_roundtrip(a, spec) for a, spec in cases]
    for name, value in [("_TABLE_BITS", 0), ("HISTOGRAM_CHUNK", 1000)]:  # sort; many pieces a group
        monkeypatch.setattr(palette, name, value)
        assert [encode(a, spec) for a, spec in cases] == want, name
        monkeypatch.undo()


def test_empty_and_degenerate_tensors():
    for shape, axis, groups in [((0, 6), 1, 3), ((4, 0), 0, 2), ((2, 0, 5), 2, 5), ((3, 4, 0), 1, 4)]:
        w = np.zeros(shape, np.float32)
        blob, record = assert_roundtrip(w, {"codec": "palette", "groups": groups, "axis": axis})
        assert record["codebook_size"] == 0 and record["groups"] == groups
        assert record.get("axis", 0) == axis
    one = grouped((1, 8), 1, 8, 1, seed=5)  # one value per column
    _, record = assert_roundtrip(one, {"codec": "palette", "groups": 8, "axis": 1})
    assert (record["bits"], record["codebook_size"]) == (1, 1)


def test_more_values_than_a_palette_holds_is_refused_naming_the_group():
    w = grouped((30, 12), 1, 3, 9, seed=6)
    with pytest.raises(InputError, match="group 0 of axis 1"):
        encode(w, {"codec": "palette", "groups": 3, "axis": 1, "bits": 2})
    wide = np.arange(600, dtype=np.float32).reshape(300, 2)
    for spec in [
        {"codec": "palette", "groups": 2, "axis": 1},
        {"codec": "palette", "groups": 2},
        {"codec": "palette"},  # formerly a 10-bit record its own decoder refused
    ]:
        with pytest.raises(InputError, match="at most 256"):
            encode(wide, spec)


# -- bad parameters and damaged records --------------------------------------------------------


def test_bad_axis_parameters_are_refused():
    w = grouped((6, 8), 1, 2, 4, seed=7)
    book = distinct_values(w)
    for spec in [
        {"groups": 2, "axis": 2},
        {"groups": 2, "axis": -1},
        {"groups": 2, "axis": True},
        {"groups": 2, "axis": 1.0},
        {"groups": 2, "axis": "1"},
        {"groups": 9, "axis": 1},  # more groups than the 8 columns
        {"groups": 2, "axis": 1, "block": 4},
        {"axis": 1, "block": 4},
        {"axis": 0, "block": 4},
        {"axis": 1, "codebook": book.tolist()},
        {"groups": 2, "axis": 1, "codebook": book.tolist()},
    ]:
        with pytest.raises(InputError):
            encode(w, {"codec": "palette", **spec})
        with pytest.raises(InputError):
            predict_bytes(w, {"codec": "palette", **spec})
    with pytest.raises(InputError, match="0-d"):
        encode(np.array(1.5, np.float32), {"codec": "palette", "axis": 0})
    assert encode(w, {"codec": "palette", "groups": 8, "axis": np.int64(1)})[1]["axis"] == 1


def test_damaged_axis_records_are_refused_with_input_error():
    w = grouped((40, 5), 1, 3, 4, seed=8)
    blob, record = encode(w, {"codec": "palette", "groups": 3, "axis": 1, "huffman": True})
    for change in [
        {"axis": 2},
        {"axis": -1},
        {"axis": True},
        {"axis": 1.0},
        {"axis": "1"},
        {"axis": None},
        {"groups": 6},
        {"groups": 0},
        {"block": 16},
        {"shape": [200]},  # a 1-d tensor has no axis 1
        {"shape": []},
    ]:
        with pytest.raises(InputError):
            decode(blob, {**record, **change})
    # axis 0 in a record is the same as none: 3 groups of rows
    as_rows = decode(blob, {**record, "axis": 0})
    assert np.array_equal(as_rows, decode(blob, {k: v for k, v in record.items() if k != "axis"}))
    assert not np.array_equal(as_rows, w)  # what a decoder that predates axis reads
    rng = np.random.default_rng(9)
    for _ in range(60):  # flipped blob bytes: an InputError or some tensor, never another error
        damaged = bytearray(blob)
        damaged[int(rng.integers(0, len(blob)))] ^= int(rng.integers(1, 256))
        try:
            decode(bytes(damaged), record)
        except InputError:
            pass


# -- property ----------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    shape=st.lists(st.integers(0, 7), min_size=1, max_size=4),
    axis_pick=st.integers(0, 3),
    groups_pick=st.integers(1, 7),
    per_group=st.integers(1, 12),
    coder=st.sampled_from(CODERS),
    half=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_axis_palette_roundtrip_property(shape, axis_pick, groups_pick, per_group, coder, half, seed):
    shape = tuple(shape)
    axis = axis_pick % len(shape)
    groups = max(1, min(groups_pick, shape[axis]))
    dtype = np.float16 if half else np.float32
    if shape[axis] == 0:
        w = np.zeros(shape, dtype)
    else:
        w = grouped(shape, axis, groups, per_group, seed, dtype)
    rng = np.random.default_rng(seed)
    if w.size:
        w.ravel()[rng.integers(0, w.size, max(1, w.size // 5))] = 0  # pruned zeros
    _, record = assert_roundtrip(w, {"codec": "palette", "groups": groups, "axis": axis, **coder})
    assert record.get("axis", 0) == (axis if groups > 1 else 0)
    if w.size and groups > 1:
        table, indices = oracle(w, groups, axis)
        found = group_palettes(w, groups, axis)
        assert np.array_equal(bits_of(found.table), bits_of(table)) and np.array_equal(found.indices, indices)


# -- choose_spec: the grouped palette of a MatMul weight ------------------------------------------


def matmul_clustered(rows: int, cols: int, groups: int, bits: int, seed: int) -> np.ndarray:
    """A MatMul weight ``[in, out]`` clustered per group of output columns, as cluster(groups=G)
    leaves it: 2**bits values per group, 16 * G in all (more than any single palette)."""
    return grouped((rows, cols), 1, groups, 1 << bits, seed, zeros=False)


def test_choose_spec_picks_the_axis_1_grouped_palette_for_a_matmul_weight():
    w = matmul_clustered(256, 384, 32, 4, seed=10)  # 32 x 16 = 512 distinct values in all
    assert best_spec(w) == ({"codec": "raw"}, w.nbytes)  # no hint: no palette holds 512 values
    hints = {"bits": 4, "groups": 32, "axis": 1, "init": "linear"}
    spec, size = best_spec(w, hints)
    assert spec["codec"] == "palette" and spec["groups"] == 32 and spec["axis"] == 1 and spec["bits"] == 4
    assert size < 0.3 * w.size * 2  # about 4 bits a weight against fp16's 16
    blob, record = encode(w, spec)
    assert len(blob) == size and record["axis"] == 1
    assert np.array_equal(bits_of(decode(blob, record)), bits_of(w))
    assert choose_spec(w, hints) == spec
    # every candidate is sized exactly; the grouped ones carry the axis
    candidates = _specs_and_sizes(w, hints)
    grouped_specs = [s for s, _ in candidates if s.get("groups")]
    base = {"codec": "palette", "bits": 4, "groups": 32, "axis": 1}
    assert grouped_specs == [
        {**base, "huffman": False},
        {**base, "huffman": True},
        {**base, "huffman": False, "rans": True},
    ]
    for s, predicted in candidates:
        assert predicted == len(encode(w, s)[0]), s
    # the hint along axis 0 finds rows that hold every column group's values: no candidate
    assert not [s for s, _ in _specs_and_sizes(w, {**hints, "axis": 0}) if s.get("groups")]


def test_a_4d_grouped_palette_along_the_last_axis_is_chosen():
    w = grouped((3, 3, 16, 64), 3, 8, 16, seed=11)  # HWIO-like: output channels last
    spec, size = best_spec(w, {"bits": 4, "groups": 8, "axis": 3})
    assert spec["codec"] == "palette" and spec["axis"] == 3 and spec["groups"] == 8
    blob, record = encode(w, spec)
    assert len(blob) == size and np.array_equal(bits_of(decode(blob, record)), bits_of(w))


def test_damaged_axis_hints_are_ignored():
    w = matmul_clustered(64, 96, 8, 3, seed=12)
    want = best_spec(w)
    for hints in [
        {"groups": 8, "axis": 2},
        {"groups": 8, "axis": -1},
        {"groups": 8, "axis": True},
        {"groups": 8, "axis": "1"},
        {"groups": 8, "axis": 1.0},
        {"groups": 8, "axis": [1]},
        {"groups": 97, "axis": 1},  # more groups than columns
    ]:
        assert best_spec(w, hints) == want, hints
    assert best_spec(w, {"groups": 8, "axis": 1})[0].get("axis") == 1


def test_record_extra_counts_the_axis_field_of_a_version_3_record(tmp_path):
    rng = np.random.default_rng(13)
    spec = {"codec": "palette", "groups": 3, "rans": True}
    assert record_extra({**spec, "axis": 1}) - record_extra(spec) == _AXIS_EXTRA
    assert record_extra({**spec, "axis": 0}) == record_extra(spec)
    assert record_extra({"codec": "palette", "axis": 1}) == record_extra({"codec": "palette"})  # one group
    for shape, axis in [((64, 64), 1), ((300, 1000), 1), ((3, 5, 7, 9), 3)]:
        w = rng.choice(np.arange(16, dtype=np.float32) * 0.1, size=shape)
        lengths = []
        for s in (spec, {**spec, "axis": axis}):
            path = tmp_path / "x.mcw"
            write_container(path, [("W", w, s)], version=3)
            lengths.append(struct.unpack_from("<Q", path.read_bytes(), 8)[0])
        assert lengths[1] - lengths[0] == _AXIS_EXTRA, shape


def test_a_large_float16_matmul_weight_round_trips():
    # 4096 x 4096 float16, 64 groups of 64 columns with 16 values each
    rng = np.random.default_rng(14)
    books = (rng.standard_normal((64, 16)) * 0.05).astype(np.float16)
    w = books[np.repeat(np.arange(64), 64)[None, :], rng.integers(0, 16, (4096, 4096))]
    blob, record = encode(w, {"codec": "palette", "groups": 64, "axis": 1})
    assert (record["bits"], record["groups"], record["axis"], record["codebook_size"]) == (4, 64, 1, 16)
    assert len(blob) == 64 * 16 * 2 + w.size // 2
    assert np.array_equal(decode(blob, record).view(np.uint16), w.view(np.uint16))
    assert predict_bytes(w, {"codec": "palette", "groups": 64, "axis": 1}) == len(blob)


# -- the C decoder -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcw_decode(tmp_path_factory) -> Path:
    if CC is None:
        pytest.skip("no C compiler on PATH")
    exe = tmp_path_factory.mktemp("cbuild") / "mcw_decode"
    cmd = [CC, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", "-o", str(exe)]
    subprocess.run([*cmd, str(SRC / "mcw_decode.c"), str(SRC / "decoder.c")], check=True, capture_output=True)
    return exe


C_CASES = [
    ("a1", grouped((37, 50), 1, 6, 9, 20), {"codec": "palette", "groups": 6, "axis": 1}),
    (
        "a1_huff",
        grouped((64, 33), 1, 5, 16, 21),
        {"codec": "palette", "groups": 5, "axis": 1, "huffman": True},
    ),
    (
        "a1_f16book_rans",
        grouped((300, 331), 1, 7, 31, 22, np.float16).astype(np.float32),
        {"codec": "palette", "groups": 7, "axis": 1, "rans": True},
    ),
    ("a1_half", grouped((9, 40), 1, 3, 6, 23, np.float16), {"codec": "palette", "groups": 3, "axis": 1}),
    (
        "a3",
        grouped((3, 5, 4, 11), 3, 4, 6, 24),
        {"codec": "palette", "groups": 4, "axis": 3, "huffman": True},
    ),
    (
        "a1_4d",
        grouped((3, 5, 4, 11), 1, 2, 7, 25),
        {"codec": "palette", "groups": 2, "axis": 1, "rans": True},
    ),
    (
        "a2_signed_zeros",
        grouped((2, 3, 9), 2, 9, 1, 26),
        {"codec": "palette", "groups": 9, "axis": 2, "bits": 3},
    ),
    ("a1_empty", np.zeros((0, 6), np.float32), {"codec": "palette", "groups": 3, "axis": 1}),
    ("a0_groups", grouped((10, 3, 3), 0, 4, 5, 27), {"codec": "palette", "groups": 4, "huffman": True}),
]


@pytest.mark.parametrize("version", [1, 2, 3, 5])
def test_c_decoder_decodes_axis_records_bit_for_bit(mcw_decode, tmp_path, version):
    path = tmp_path / "axis.mcw"
    write_container(path, C_CASES, version=version)
    with read_container(path) as c:
        assert [c.record(n).get("axis", 0) for n, _, _ in C_CASES] == [1, 1, 1, 1, 3, 1, 2, 1, 0]
    for name, w, spec in C_CASES:
        proc = subprocess.run([str(mcw_decode), str(path), name], capture_output=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        blob, record = encode(w, spec)
        want = decode(blob, record).astype(np.float32)
        assert np.array_equal(np.frombuffer(proc.stdout, "<u4"), want.ravel().view("<u4")), name
        assert np.array_equal(want.view(np.uint32), w.astype(np.float32).view(np.uint32))


def test_c_decoder_refuses_damaged_axis_records_like_python(mcw_decode, tmp_path):
    """An axis that is not an axis of the shape, groups beyond the axis, an axis with a block,
    a non-integer axis: C exits 2 with one line, Python raises InputError. "axis" renamed (a
    decoder that predates it) reads as axis-0 groups, wrong values in both, identically."""
    w = grouped((40, 5), 1, 3, 4, seed=28)
    path = tmp_path / "axis.mcw"
    write_container(path, [("a", w, {"codec": "palette", "groups": 3, "axis": 1, "rans": True})], version=1)
    raw = path.read_bytes()
    assert raw.count(b'"axis":1') == 1 and raw.count(b'"groups":3') == 1 and raw.count(b'"rans":true') == 1
    proc = subprocess.run([str(mcw_decode), str(path), "a"], capture_output=True, timeout=30)
    assert proc.returncode == 0 and np.array_equal(np.frombuffer(proc.stdout, "<u4"), w.ravel().view("<u4"))
    for old, new in [
        (b'"axis":1', b'"axis":2'),
        (b'"axis":1', b'"axis":9'),
        (b'"groups":3', b'"groups":6'),
        (b'"groups":3', b'"groups":0'),
        (b'"rans":true', b'"block":999'),
        (b'"axis":1,', b'"axis":-1'),  # JSON no longer parses: the container is refused
        (b'"axis":1', b'"axis":t'),
    ]:
        bad = tmp_path / "bad.mcw"
        bad.write_bytes(raw.replace(old, new))
        with pytest.raises(InputError):
            with read_container(bad) as c:
                c.array("a")
        proc = subprocess.run([str(mcw_decode), str(bad), "a"], capture_output=True, timeout=30)
        assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1, (new, proc.stderr)
    old_reader = tmp_path / "old.mcw"
    old_reader.write_bytes(raw.replace(b'"axis":1', b'"axiz":1'))
    with read_container(old_reader) as c:
        misread = c.array("a")
    assert not np.array_equal(misread, w)
    proc = subprocess.run([str(mcw_decode), str(old_reader), "a"], capture_output=True, timeout=30)
    assert proc.returncode == 0 and np.frombuffer(proc.stdout, "<f4").tobytes() == misread.tobytes()
    # version 3: the literal word "axis", tag 0, varint 1 -> an axis out of range
    v3 = tmp_path / "v3.mcw"
    write_container(v3, [("a", w, {"codec": "palette", "groups": 3, "axis": 1})], version=3)
    data = v3.read_bytes()
    assert data.count(b"axis\x00\x01") == 1
    for value in (b"\x02", b"\x7f"):
        bad = tmp_path / "bad3.mcw"
        bad.write_bytes(data.replace(b"axis\x00\x01", b"axis\x00" + value))
        with pytest.raises(InputError):
            with read_container(bad) as c:
                c.array("a")
        proc = subprocess.run([str(mcw_decode), str(bad), "a"], capture_output=True, timeout=30)
        assert proc.returncode == 2 and b"axis" in proc.stderr, proc.stderr
    bad = tmp_path / "bad3.mcw"  # the value a word instead of an integer (same length)
    bad.write_bytes(data.replace(b"axis\x00\x01", b"axis\x01\x00"))
    with pytest.raises(InputError):
        with read_container(bad) as c:
            c.array("a")
    proc = subprocess.run([str(mcw_decode), str(bad), "a"], capture_output=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1, proc.stderr


# -- end to end: cluster a MatMul per column group, export, run ------------------------------------


def test_clustered_matmul_weight_exports_as_an_axis_1_grouped_palette(tmp_path):
    rng = np.random.default_rng(15)
    k, n = 64, 96
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    b = (rng.standard_normal(n) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="fc"),
            helper.make_node("Add", ["h", "B"], ["y"], name="bias"),
        ],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    q = tmp_path / "q.onnx"
    api.optimize(str(tmp_path / "m.onnx"), passes="cluster(bits=4,groups=4)", output=q)
    clustered = numpy_helper.to_array(next(t for t in onnx.load(str(q)).graph.initializer if t.name == "W"))
    assert clustered.shape == (k, n)
    per_group = [np.unique(part).size for part in np.array_split(clustered, 4, axis=1)]
    assert max(per_group) <= 16 < np.unique(clustered).size  # no single 4-bit palette holds it
    out = tmp_path / "cpu"
    api.export(q, "cpu", out)
    with read_container(out / "weights.mcw") as c:
        record = c.record("W")
        assert record["codec"] == "palette" and record["groups"] == 4 and record["axis"] == 1
        assert record["bits"] == 4
        assert np.array_equal(c.array("W").view(np.uint32), clustered.view(np.uint32))
        assert c._entry("W").nbytes < 0.3 * clustered.size * 2  # well below fp16
    runner = get_target("cpu").load(out)
    x = rng.standard_normal((2, k)).astype(np.float32)
    got = runner.run({"x": x})["y"]
    want = x @ clustered + b
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)
