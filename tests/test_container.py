"""weights.mcw: round trips, the byte layout, determinism, and refusal of corrupt files."""

from __future__ import annotations

import hashlib
import json
import struct
import tempfile
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from mconv import container
from mconv.container import choose_codec, container_from_bytes, read_container, write_container
from mconv.errors import InputError, IntegrityError

RAW_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_]


def _roundtrip(tensors):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "weights.mcw"
        write_container(path, tensors)
        with read_container(path) as c:
            return {name: c.array(name) for name in c.names}, c.names


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        hnp.arrays(
            st.sampled_from(RAW_DTYPES), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
        ),
        min_size=1,
        max_size=4,
    )
)
def test_raw_roundtrip_is_bit_identical_for_any_shape_and_dtype(arrays):
    tensors = [(f"t{i}", a, {"codec": "raw"}) for i, a in enumerate(arrays)]
    decoded, names = _roundtrip(tensors)
    assert names == [t[0] for t in tensors]
    for name, a, _ in tensors:
        out = decoded[name]
        assert out.dtype == a.dtype and out.shape == a.shape
        assert out.tobytes() == a.tobytes()


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float16, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)))
def test_fp16_roundtrip_restores_float32_values_exactly(half):
    a = half.astype(np.float32)  # every value fp16-representable, NaN and inf included
    decoded, _ = _roundtrip([("w", a, {"codec": "fp16"})])
    out = decoded["w"]
    assert out.dtype == np.float32 and out.shape == a.shape
    assert out.tobytes() == a.tobytes()


def test_layout_matches_the_documented_header_index_and_aligned_blobs(tmp_path):
    a = np.arange(10, dtype=np.float32) * 0.5
    b = np.arange(-3, 4, dtype=np.int64).reshape(7, 1)
    path = tmp_path / "w.mcw"
    info = write_container(path, [("a", a, {"codec": "fp16"}), ("b", b, None)])
    data = path.read_bytes()
    magic, version, index_len = struct.unpack_from("<4sIQ", data, 0)
    assert (magic, version) == (b"MCW1", 1)
    index = json.loads(data[16 : 16 + index_len])
    assert index["version"] == 1 and [t["name"] for t in index["tensors"]] == ["a", "b"]
    assert data[16 : 16 + index_len] == json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    ta, tb = index["tensors"]
    for t in (ta, tb):
        assert t["offset"] % 64 == 0 and t["offset"] >= 16 + index_len
    # blobs hold exactly what numpy writes for these dtypes
    assert data[ta["offset"] : ta["offset"] + ta["nbytes"]] == a.astype("<f2").tobytes()
    assert data[tb["offset"] : tb["offset"] + tb["nbytes"]] == b.astype("<i8").tobytes()
    assert tb["sha256"] == hashlib.sha256(b.astype("<i8").tobytes()).hexdigest()
    assert ta["record"]["codec"] == "fp16" and ta["record"]["shape"] == [10]
    assert ta["record"]["dtype"] == "float32" and tb["record"]["shape"] == [7, 1]
    assert info.total_bytes == len(data) and len(data) % 64 == 0
    assert info.blob_bytes == 20 + 56


def test_identical_input_gives_identical_bytes(tmp_path):
    rng = np.random.default_rng(0)
    tensors = [
        ("conv.w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32), None),
        ("fc.b", rng.standard_normal(10).astype(np.float16), {"codec": "raw"}),
    ]
    write_container(tmp_path / "one.mcw", tensors)
    write_container(tmp_path / "two.mcw", list(reversed(list(reversed(tensors)))))
    assert (tmp_path / "one.mcw").read_bytes() == (tmp_path / "two.mcw").read_bytes()


def test_blob_is_a_memoryview_of_the_stored_bytes_and_items_keep_order(tmp_path):
    a = np.linspace(0, 1, 7, dtype=np.float32)
    path = tmp_path / "w.mcw"
    write_container(path, [("z", a, None), ("a", a[:3], None)])
    with read_container(path) as c:
        blob = c.blob("z")
        assert isinstance(blob, memoryview) and bytes(blob) == a.tobytes()
        del blob
        assert [n for n, _ in c.items()] == ["z", "a"]
        assert c.record("a")["shape"] == [3]
        with pytest.raises(InputError, match="no tensor named 'q'"):
            c.array("q")


def test_container_from_bytes_reads_the_same_tensors(tmp_path):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    write_container(tmp_path / "w.mcw", [("a", a, None)])
    c = container_from_bytes((tmp_path / "w.mcw").read_bytes(), "bundle.zip!weights.mcw")
    assert np.array_equal(c.array("a"), a)


def test_duplicate_tensor_names_are_refused(tmp_path):
    a = np.zeros(2, np.float32)
    with pytest.raises(InputError, match="given twice"):
        write_container(tmp_path / "w.mcw", [("a", a, None), ("a", a, None)])
    assert not (tmp_path / "w.mcw").exists()


def test_fp16_codec_refuses_values_it_would_change(tmp_path):
    with pytest.raises(InputError, match="fp16"):
        write_container(tmp_path / "w.mcw", [("a", np.array([0.1], np.float32), {"codec": "fp16"})])
    assert not (tmp_path / "w.mcw").exists()


# -- corrupt files -------------------------------------------------------------------------------


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "weights.mcw"
    write_container(
        path, [("a", np.arange(100, dtype=np.float32), None), ("b", np.ones((4, 4), np.float32), None)]
    )
    return path


def _index(path: Path) -> tuple[dict, int]:
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 8)
    return json.loads(data[16 : 16 + n]), n


def test_truncated_file_names_the_tensor_and_byte_offset(good):
    index, _ = _index(good)
    last = index["tensors"][-1]
    data = good.read_bytes()
    good.write_bytes(data[: last["offset"] + 10])
    with pytest.raises(InputError) as exc:
        read_container(good)
    line = str(exc.value)
    assert str(good) in line and f"byte offset {last['offset']}" in line and "'b'" in line


def test_file_shorter_than_header_is_refused(good):
    good.write_bytes(good.read_bytes()[:10])
    with pytest.raises(InputError, match="shorter than the 16-byte header") as exc:
        read_container(good)
    assert "byte offset 0" in str(exc.value)


def test_empty_file_is_refused(tmp_path):
    (tmp_path / "w.mcw").write_bytes(b"")
    with pytest.raises(InputError, match="0 bytes"):
        read_container(tmp_path / "w.mcw")


def test_bad_magic_is_refused(good):
    data = bytearray(good.read_bytes())
    data[:4] = b"PK\x03\x04"
    good.write_bytes(bytes(data))
    with pytest.raises(InputError, match="bad magic") as exc:
        read_container(good)
    assert "byte offset 0" in str(exc.value)


def test_index_length_beyond_file_size_is_refused_before_reading(good):
    data = bytearray(good.read_bytes())
    struct.pack_into("<Q", data, 8, 1 << 60)  # claims an exabyte-sized index
    good.write_bytes(bytes(data))
    with pytest.raises(InputError, match="runs past the end") as exc:
        read_container(good)
    assert "byte offset 8" in str(exc.value)


def _with_index(path: Path, mutate) -> None:
    """Rewrite the index (same layout rules) after ``mutate`` changed it."""
    data = path.read_bytes()
    index, n = _index(path)
    mutate(index)
    new = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    new = new + b" " * (n - len(new))  # JSON allows trailing blanks; keep the blob offsets valid
    assert len(new) == n
    path.write_bytes(data[:16] + new + data[16 + n :])


def test_blob_offset_beyond_file_size_is_refused(good):
    size = good.stat().st_size

    def far(index):
        index["tensors"][0]["offset"] = 999  # same digit count as the real one

    _with_index(good, far)
    with pytest.raises(InputError, match="outside the data area") as exc:
        read_container(good)
    assert "byte offset 999" in str(exc.value) and f"{size})" in str(exc.value)


def test_blob_overlapping_the_index_is_refused(good):
    def inside(index):
        index["tensors"][0]["offset"] = 0

    _with_index(good, inside)
    with pytest.raises(InputError, match="outside the data area"):
        read_container(good)


def test_invalid_index_json_is_refused(good):
    data = bytearray(good.read_bytes())
    data[16] = ord("#")
    good.write_bytes(bytes(data))
    with pytest.raises(InputError, match="index is not valid") as exc:
        read_container(good)
    assert "byte offset 16" in str(exc.value)


def test_flipped_blob_byte_fails_the_tensor_sha256(good):
    index, _ = _index(good)
    off = index["tensors"][1]["offset"]
    data = bytearray(good.read_bytes())
    data[off] ^= 0xFF
    good.write_bytes(bytes(data))
    with read_container(good) as c:
        assert np.array_equal(c.array("a"), np.arange(100, dtype=np.float32))
        with pytest.raises(IntegrityError, match="tensor 'b': sha256 mismatch"):
            c.array("b")


# -- codec choice --------------------------------------------------------------------------------


def test_choose_codec_picks_fp16_only_for_exactly_representable_float32():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    assert choose_codec(w, {}) == {"codec": "raw"}
    assert choose_codec(w.astype(np.float16).astype(np.float32), {}) == {"codec": "fp16"}
    # already half: stored as it is
    assert choose_codec(w.astype(np.float16), {}) == {"codec": "raw"}
    # 70000 overflows fp16; 1e-8 underflows to zero
    assert choose_codec(np.array([70000.0], np.float32), {}) == {"codec": "raw"}
    assert choose_codec(np.array([1e-8], np.float32), {}) == {"codec": "raw"}
    # integers are never fp16 (distinct nonzero values: nothing smaller than raw either)
    assert choose_codec(np.arange(1, 6, dtype=np.int64), {}) == {"codec": "raw"}
    assert choose_codec(np.arange(5, dtype=np.int64), {})["codec"] != "fp16"


def test_choose_codec_is_the_weights_targets_choice_and_every_targets(tmp_path):
    """One choice (issue 13 item 4): a tensor without hints gets palette/sparse when smaller,
    in a cpu bundle as in a weights bundle, byte for byte the same container."""
    import onnx_ir as ir
    from mconv import codecs
    from mconv.codecs import best_spec, choose_spec
    from mconv.targets import get_target

    rng = np.random.default_rng(7)
    w = np.round(rng.standard_normal((32, 24)), 1).astype(np.float32)
    w[rng.random(w.shape) < 0.7] = 0.0  # 70 % zeros, ~60 distinct values: not fp16-exact
    spec, size = best_spec(w)
    assert spec["codec"] in ("palette", "sparse") and size == len(codecs.encode(w, spec)[0])
    assert choose_codec(w, {"mconv.compression": "{}"}, "W") == choose_spec(w) == spec

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 32]))
    wv = ir.Value(name="W", const_value=ir.Tensor(w, name="W"))
    graph = ir.Graph([x], [], nodes=[], name="g", opset_imports={"": 17})
    graph.register_initializer(wv)
    node = ir.Node("", "MatMul", [x, wv], name="mm")
    graph.append(node)
    node.outputs[0].name = "y"
    node.outputs[0].type, node.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([1, 24])
    graph.outputs.append(node.outputs[0])
    model = ir.Model(graph, ir_version=8)
    blobs = {}
    for target in ("cpu", "weights"):
        bundle = get_target(target).export(model, tmp_path / target, {})
        (entry,) = [e for e in bundle.weights if e["name"] == "W"]
        assert entry["codec"] == spec["codec"] and entry["bytes"] == size
        with read_container(tmp_path / target / "weights.mcw") as c:
            blobs[target] = bytes(c.blob("W"))
            np.testing.assert_array_equal(c.array("W"), w)
    assert blobs["cpu"] == blobs["weights"]


# --- hostile index records (issue 11, items 8 and 10): one InputError naming the file and tensor


def _set(key, value):
    def mutate(index):
        index["tensors"][1]["sha256"] = ""  # room in the same index length for longer values
        t = index["tensors"][0]
        target = t["record"] if key in ("dtype", "shape", "codec", "streams") else t
        target[key] = value

    return mutate


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("dtype", "object", "not a numeric dtype"),
        ("dtype", "O", "not a numeric dtype"),
        ("dtype", "<U4", "not a numeric dtype"),
        ("dtype", "V8", "not a numeric dtype"),
        ("dtype", "float32, int32", "not a numeric dtype"),
        ("dtype", "floaty", "not a numeric dtype"),
        ("dtype", 7, "not a numeric dtype"),
        ("shape", [-1], "not a list of non-negative integers"),
        ("shape", [1.5], "not a list of non-negative integers"),
        ("shape", "100", "not a list of non-negative integers"),
        ("shape", [True], "not a list of non-negative integers"),
        ("shape", [1 << 40, 1 << 40], "more than 2\\*\\*62 elements"),
        ("codec", 3, "codec is an integer"),
        ("codec", "zstd", "unknown codec"),
        ("streams", {"data": -4}, "streams"),
        ("offset", "64", "'offset' is a string"),
        ("offset", True, "'offset' is a boolean"),
        ("nbytes", None, "'nbytes' is null"),
        ("nbytes", 1 << 70, "'nbytes' is an integer"),
        ("sha256", [1], "'sha256' is a list"),
        ("record", "raw", "'record' is a string"),
    ],
)
def test_index_fields_of_the_wrong_type_are_one_input_error(good, key, value, match):
    _with_index(good, _set(key, value))
    with pytest.raises(InputError, match=match) as exc:
        read_container(good)
    line = str(exc.value)
    assert str(good) in line and "\n" not in line
    if key not in ("offset", "nbytes", "record", "sha256"):
        assert "tensor 'a'" in line


@pytest.mark.parametrize(
    "index",
    [[], 7, {"tensors": 7}, {"tensors": [7]}, {"tensors": [{"name": 3}]}, {"tensors": [{"name": "a"}]}],
)
def test_index_that_is_not_the_documented_shape_is_refused(good, index):
    data = good.read_bytes()
    _, n = _index(good)
    new = json.dumps(index).encode()
    good.write_bytes(data[:8] + struct.pack("<Q", len(new)) + new + data[16 + n :])
    with pytest.raises(InputError) as exc:
        read_container(good)
    assert str(good) in str(exc.value) and "index" in str(exc.value)


def test_deeply_nested_index_is_refused_without_recursion_error(good):
    data = good.read_bytes()
    _, n = _index(good)
    new = b"[" * 100_000 + b"]" * 100_000
    good.write_bytes(data[:8] + struct.pack("<Q", len(new)) + new + data[16 + n :])
    with pytest.raises(InputError, match="nested too deeply") as exc:
        read_container(good)
    assert str(good) in str(exc.value)


def test_codec_error_names_the_file_the_tensor_and_the_offset(good):
    # A record whose shape does not match its blob: the codec's own error gets the place.
    _with_index(good, _set("shape", [99]))
    with read_container(good) as c:
        with pytest.raises(InputError) as exc:
            c.array("a")
    line = str(exc.value)
    assert str(good) in line and "tensor 'a'" in line and "byte offset" in line


def test_hostile_tensor_names_are_escaped_in_errors(good):
    with read_container(good) as c:
        with pytest.raises(InputError) as exc:
            c.array("missing\x07name\n" + "x" * 500)
    line = exc.value.line()
    assert "\x07" not in line and "\\x07" in line and "\n" not in line and len(line) < 1200


def test_hostile_name_in_a_refused_index_is_one_escaped_line(good):
    name = "w\n\x1b" + "y" * 300
    data = good.read_bytes()
    index, n = _index(good)
    index["tensors"][0]["name"] = name  # the index grows: blob offsets now point into it
    new = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    good.write_bytes(data[:8] + struct.pack("<Q", len(new)) + new + data[16 + n :])
    with pytest.raises(InputError, match="outside the data area") as exc:
        read_container(good)
    line = exc.value.line()
    assert str(good) in line and "\n" not in line and "\x1b" not in line and len(line) < 1200


# --- version 2: the binary index (issue 14 item 5: small bundles stay small) ----------------


def _small_model_tensors(seed: int) -> list:
    """An MLP-sized set: three pruned, clustered weights and three raw biases."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (rows, cols) in enumerate([(300, 64), (100, 300), (10, 100)]):
        book = np.sort(rng.standard_normal(20)).astype(np.float32)
        w = book[rng.integers(0, 20, (rows, cols))]
        w[rng.random((rows, cols)) < 0.9] = 0.0
        out.append((f"fc{i + 1}.weight", w, choose_codec(w)))
        out.append((f"fc{i + 1}.bias", rng.standard_normal(rows).astype(np.float32), None))
    return out


def test_v2_round_trips_and_is_deterministic_and_small(tmp_path):
    tensors = _small_model_tensors(0)
    info = write_container(tmp_path / "a.mcw", tensors, version=2)
    again = write_container(tmp_path / "b.mcw", tensors, version=2)
    assert (tmp_path / "a.mcw").read_bytes() == (tmp_path / "b.mcw").read_bytes()
    assert info.total_bytes == again.total_bytes
    v1 = write_container(tmp_path / "v1.mcw", tensors, version=1)
    overhead = info.total_bytes - info.blob_bytes
    assert overhead <= max(512, 0.02 * info.blob_bytes), overhead  # the budget
    assert v1.total_bytes - v1.blob_bytes > 3 * overhead  # what it was
    with read_container(tmp_path / "a.mcw") as c, read_container(tmp_path / "v1.mcw") as old:
        assert c.names == old.names == [t[0] for t in tensors]
        for name, a, _ in tensors:
            assert c.array(name).tobytes() == a.tobytes() == old.array(name).tobytes()
            assert c.record(name) == old.record(name)
            assert c.entries[name].sha256 == old.entries[name].sha256
            assert c.entries[name].offset % 8 == 0


def test_v2_checks_every_blob_sha256(tmp_path):
    path = tmp_path / "w.mcw"
    info = write_container(path, _small_model_tensors(1), version=2)
    data = bytearray(path.read_bytes())
    e = info.entry("fc2.weight")
    data[e.offset + e.nbytes // 2] ^= 0x10
    with container_from_bytes(bytes(data), "w.mcw") as c:
        c.array("fc1.weight")  # the others still decode
        with pytest.raises(IntegrityError, match="sha256 mismatch") as exc:
            c.array("fc2.weight")
    assert "w.mcw" in exc.value.line()


def _v2_bytes(index: bytes, blobs: bytes = b"") -> bytes:
    return struct.pack("<4sIQ", b"MCW1", 2, len(index)) + index + blobs


def test_v2_refuses_hostile_indexes_with_one_line_naming_the_file(tmp_path):
    good_path = tmp_path / "good.mcw"
    write_container(good_path, _small_model_tensors(2), version=2)
    good = good_path.read_bytes()
    (index_len,) = struct.unpack_from("<Q", good, 8)
    sha = hashlib.sha256(b"\0" * 4).digest()
    record = b"\x03" + b"\x00\x01\x0e" + b"\x01\x01\x12" + b"\x02\x04\x01\x01"  # raw float32 [1]
    entry = b"\x01a\x04" + sha + record
    cases = {
        "truncated index": good[: 16 + index_len // 2] + b"\0" * 0,
        "varint past 2**63": _v2_bytes(b"\xff" * 10),
        "count beyond the index": _v2_bytes(b"\xff\x7f"),
        "unknown value tag": _v2_bytes(b"\x01\x01a\x04" + sha + b"\x01\x00\x09", b"\0" * 8),
        "name not UTF-8": _v2_bytes(b"\x01\x01\xff\x04" + sha + record, b"\0" * 8),
        "duplicate tensor": _v2_bytes(b"\x02" + entry + entry, b"\0" * 16),
        "duplicate field": _v2_bytes(b"\x01\x01a\x04" + sha + b"\x02\x00\x01\x0e\x00\x01\x0e", b"\0" * 8),
        "blob past the end": _v2_bytes(b"\x01" + entry, b"\0" * 2),
        "trailing index bytes": _v2_bytes(b"\x01" + entry + b"\x00", b"\0" * 8),
        "record lacks shape": _v2_bytes(b"\x01\x01a\x04" + sha + b"\x02\x00\x01\x0e\x01\x01\x12", b"\0" * 8),
        "huge list length": _v2_bytes(b"\x01\x01a\x04" + sha + b"\x01\x02\x04\xff\xff\xff\x7f"),
    }
    for what, data in cases.items():
        bad = tmp_path / "bad.mcw"
        bad.write_bytes(data)
        with pytest.raises(InputError) as exc:
            read_container(bad).array("a")
        line = exc.value.line()
        assert "bad.mcw" in line and "\n" not in line, (what, line)
        assert type(exc.value) is InputError, what
    # the well-formed one of those entries decodes (the cases above are one change each)
    with container_from_bytes(_v2_bytes(b"\x01" + entry, b"\0" * 8), "ok.mcw") as c:
        assert c.array("a").tolist() == [0.0]


def test_unknown_container_versions_are_refused_clearly(tmp_path):
    path = tmp_path / "w.mcw"
    write_container(path, _small_model_tensors(3), version=2)
    data = bytearray(path.read_bytes())
    data[4] = 6
    with pytest.raises(InputError, match="container version 6 is not supported") as exc:
        container_from_bytes(bytes(data), "w.mcw")
    assert "upgrade mconv" in exc.value.line()
    with pytest.raises(InputError, match="container version"):
        write_container(tmp_path / "x.mcw", [], version=6)


# --- version 3: front-coded names, CRC-32, repeated records, natural alignment ---------------


def _many_small_tensors(seed: int) -> list:
    """A quantized-TFLite-like set: many small tensors with shared name prefixes and records."""
    rng = np.random.default_rng(seed)
    out = _small_model_tensors(seed)
    for i in range(30):
        out.append((f"block{i}/conv/scale", rng.standard_normal(16).astype(np.float32), None))
        out.append((f"block{i}/conv/zero_point", np.zeros(16, np.int8), None))
        out.append((f"block{i}/one", np.array(1.0, np.float32), {"codec": "fp16"}))
        out.append((f"block{i}/qmin", np.array(-128.0, np.float32), {"codec": "fp16"}))
        out.append((f"block{i}/codes", rng.integers(-128, 128, 40).astype(np.int8), None))
    return out


def test_v3_round_trips_deterministically_and_is_smaller_than_v2(tmp_path):
    tensors = _many_small_tensors(0)
    v3 = write_container(tmp_path / "a.mcw", tensors, version=3)
    write_container(tmp_path / "b.mcw", tensors, version=3)
    assert (tmp_path / "a.mcw").read_bytes() == (tmp_path / "b.mcw").read_bytes()
    v2 = write_container(tmp_path / "v2.mcw", tensors, version=2)
    assert v3.blob_bytes == v2.blob_bytes
    assert v3.total_bytes - v3.blob_bytes < 0.6 * (v2.total_bytes - v2.blob_bytes)
    with read_container(tmp_path / "a.mcw") as c, read_container(tmp_path / "v2.mcw") as old:
        assert c.names == [t[0] for t in tensors]
        for name, a, _ in tensors:
            assert c.array(name).tobytes() == np.asarray(a).tobytes()
            assert c.record(name) == old.record(name)
            e = c.entries[name]
            if e.record["codec"] in ("raw", "fp16"):  # viewable in place
                assert (
                    e.offset % (2 if e.record["codec"] == "fp16" else np.dtype(e.record["dtype"]).itemsize)
                    == 0
                )
    small = write_container(tmp_path / "mlp.mcw", _small_model_tensors(0), version=3)
    assert small.total_bytes - small.blob_bytes <= max(512, 0.02 * small.blob_bytes)


def test_v3_checks_every_blob_crc32(tmp_path):
    path = tmp_path / "w.mcw"
    info = write_container(path, _many_small_tensors(1), version=3)
    data = bytearray(path.read_bytes())
    e = info.entry("fc2.weight")
    data[e.offset + e.nbytes // 2] ^= 0x10
    with container_from_bytes(bytes(data), "w.mcw") as c:
        c.array("fc1.weight")
        with pytest.raises(IntegrityError, match="CRC-32 mismatch") as exc:
            c.array("fc2.weight")
    assert "w.mcw" in exc.value.line()


def _v3_bytes(index: bytes, blobs: bytes = b"") -> bytes:
    return struct.pack("<4sIQ", b"MCW1", 3, len(index)) + index + blobs


def test_v3_refuses_hostile_indexes_with_one_line_naming_the_file(tmp_path):
    crc = zlib.crc32(b"\0" * 4).to_bytes(4, "little")
    record = b"\x00\x03" + b"\x00\x01\x0e" + b"\x01\x01\x12" + b"\x02\x04\x01\x01"  # new: raw float32 [1]
    entry = b"\x00\x01a\x04" + crc + record
    cases = {
        "shared prefix beyond the previous name": _v3_bytes(b"\x01\x02\x01a\x04" + crc + record, b"\0" * 4),
        "record reference beyond the recent ones": _v3_bytes(b"\x01\x00\x01a\x04" + crc + b"\x01", b"\0" * 4),
        "name not UTF-8": _v3_bytes(b"\x01\x00\x01\xff\x04" + crc + record, b"\0" * 4),
        "duplicate tensor": _v3_bytes(b"\x02" + entry + b"\x01\x00\x04" + crc + b"\x01", b"\0" * 8),
        "blob past the end": _v3_bytes(b"\x01" + entry, b"\0" * 2),
        "trailing index bytes": _v3_bytes(b"\x01" + entry + b"\x00", b"\0" * 4),
        "count beyond the index": _v3_bytes(b"\xff\x7f"),
    }
    for what, data in cases.items():
        bad = tmp_path / "bad.mcw"
        bad.write_bytes(data)
        with pytest.raises(InputError) as exc:
            read_container(bad).array("a")
        line = exc.value.line()
        assert "bad.mcw" in line and "\n" not in line, (what, line)
        assert type(exc.value) is InputError, what
    # the well-formed ones: one tensor, and a second that shares the name prefix and the record
    two = b"\x02" + entry + b"\x01\x01b\x04" + crc + b"\x01"
    with container_from_bytes(_v3_bytes(two, b"\0" * 10), "ok.mcw") as c:  # 2 bytes of alignment
        assert c.names == ["a", "ab"] and c.array("ab").tolist() == [0.0]
        assert c.record("ab") == c.record("a") and c.record("a") is not c.record("ab")


# --- version 4: small blobs share one CRC-32, slim records ------------------------------------


def _codec_zoo(seed: int) -> list:
    """One tensor per record shape a bundle stores: raw and fp16 of several dtypes, palettes
    (grouped, per block, float32 and bfloat16 codebooks, Huffman, rANS) and sparse ones."""
    rng = np.random.default_rng(seed)
    book = np.sort(rng.standard_normal(12)).astype(np.float32)
    w = book[rng.integers(0, 12, (24, 40))]
    sparse = w.copy()
    sparse[rng.random(sparse.shape) < 0.8] = 0.0
    half = book.astype(np.float16).astype(np.float32)[rng.integers(0, 12, (16, 16))]
    return [
        ("a/raw_f32", rng.standard_normal(7).astype(np.float32), None),
        ("a/raw_i8", rng.integers(-128, 128, 40).astype(np.int8), None),
        ("a/scalar", np.array(0.5, np.float32), None),
        ("a/fp16", half, {"codec": "fp16"}),
        ("b/palette", w, {"codec": "palette"}),
        ("b/palette_f16", half, {"codec": "palette"}),
        ("b/palette_f32_book", w, {"codec": "palette", "codebook_dtype": "float32"}),
        ("a/raw_bf16", w.astype(ml_dtypes.bfloat16), None),
        ("b/palette_groups", w, {"codec": "palette", "groups": 4}),
        ("b/palette_block", w, {"codec": "palette", "block": 64}),
        ("b/palette_huffman", w, {"codec": "palette", "huffman": True}),
        ("b/palette_rans", w, {"codec": "palette", "rans": True}),
        ("c/sparse_raw", sparse, {"codec": "sparse"}),
        ("c/sparse_palette", sparse, {"codec": "sparse", "values": "palette", "rans": True}),
        ("c/sparse_fp16", half * (rng.random(half.shape) < 0.3), {"codec": "sparse", "values": "fp16"}),
        ("d/tiny_f64", np.array([1.0], np.float64), None),
    ]


def test_v4_reads_back_every_record_and_array_as_written_and_is_smaller(tmp_path):
    tensors = _codec_zoo(0) + _many_small_tensors(0)
    v4 = write_container(tmp_path / "a.mcw", tensors, version=4)
    write_container(tmp_path / "b.mcw", tensors, version=4)
    assert (tmp_path / "a.mcw").read_bytes() == (tmp_path / "b.mcw").read_bytes()
    v3 = write_container(tmp_path / "v3.mcw", tensors, version=3)
    v2 = write_container(tmp_path / "v2.mcw", tensors, version=2)
    assert v4.blob_bytes == v3.blob_bytes == v2.blob_bytes
    # the small blobs' CRCs and the slim records: 12% of version 3's own bytes here (the names
    # of 166 tensors are the rest), 30% on a clustered CNN's 12 tensors
    assert v4.total_bytes - v4.blob_bytes < 0.9 * (v3.total_bytes - v3.blob_bytes)
    with read_container(tmp_path / "a.mcw") as c, read_container(tmp_path / "v2.mcw") as old:
        assert c.names == [t[0] for t in tensors]
        for name, a, _ in tensors:
            assert c.array(name).tobytes() == np.asarray(a).tobytes(), name
            assert c.record(name) == old.record(name), name  # the derived fields put back exactly
        slim = sum(1 for e in c.entries.values() if e.nbytes < 16)
        assert slim >= 60  # the scalars and 16-value fp16 constants: no CRC of their own


def test_v4_record_without_a_default_field_is_written_whole():
    """A record that lacks a field the reader would derive (an older writer's palette without
    codebook_dtype, which meant the tensor's own dtype) is never marked slim: reading it back
    must not add the field."""
    record = {"codec": "palette", "bits": 3, "codebook_size": 8, "groups": 1, "huffman": False,
              "dtype": "float32", "shape": [4, 4], "streams": {"codebook": 32, "indices": 6}}  # fmt: skip
    assert container._slim_v4(record, 38) == (record, False)
    full = {**record, "codebook_dtype": "float16", "streams": {"codebook": 16, "indices": 6}}
    slim, is_slim = container._slim_v4(full, 22)
    assert is_slim and slim == {"codec": "palette", "bits": 3, "codebook_size": 8, "shape": [4, 4]}
    assert container._restore_v4(slim, 22) == full
    odd = {**full, "streams": {"codebook": 16, "indices": 5, "pad": 1}}  # not derivable: kept
    slim, _ = container._slim_v4(odd, 22)
    assert slim["streams"] == odd["streams"] and container._restore_v4(slim, 22) == odd


def test_v4_checks_the_small_blobs_crc_and_every_large_blobs_own(tmp_path):
    path = tmp_path / "w.mcw"
    info = write_container(path, _codec_zoo(1) + _many_small_tensors(1), version=4)
    data = path.read_bytes()
    small = info.entry("block3/one")  # 2 bytes of fp16
    large = info.entry("b/palette")
    assert small.nbytes < 16 <= large.nbytes
    for e, match in ((small, "blobs under 16 bytes does not match"), (large, "CRC-32 mismatch")):
        damaged = bytearray(data)
        damaged[e.offset] ^= 0x04
        with container_from_bytes(bytes(damaged), "w.mcw") as c:
            c.array("fc1.weight")  # another large blob is fine
            with pytest.raises(IntegrityError, match=match) as exc:
                c.array(e.name)
            assert "w.mcw" in exc.value.line()
            if e is small:  # any small blob's decode checks them all
                with pytest.raises(IntegrityError):
                    c.array("block0/qmin")
        with container_from_bytes(bytes(damaged), "w.mcw") as c:
            c.array(e.name, verify=False)  # the check is the CRC's, not the decoder's


@pytest.mark.parametrize("version, seed", [(4, 4), (5, 6)])
def test_v4_and_v5_refuse_damaged_indexes_with_one_line(tmp_path, version, seed):
    """Index bytes flipped at random: the file reads (every tensor as written or a CRC error)
    or is refused with one InputError line naming it; never another exception."""
    path = tmp_path / "w.mcw"
    write_container(path, _codec_zoo(2) + _many_small_tensors(2), version=version)
    data = path.read_bytes()
    (index_len,) = struct.unpack_from("<Q", data, 8)
    rng = np.random.default_rng(seed)
    for trial in range(200):
        damaged = bytearray(data)
        damaged[16 + int(rng.integers(0, index_len))] ^= int(rng.integers(1, 256))
        try:
            with container_from_bytes(bytes(damaged), "bad.mcw") as c:
                for name in c.names:
                    c.array(name)
        except InputError as exc:  # IntegrityError is one too
            line = exc.line()
            assert "bad.mcw" in line and "\n" not in line, (trial, line)


def test_v4_refuses_an_index_cut_before_the_small_blobs_crc(tmp_path):
    path = tmp_path / "w.mcw"
    write_container(path, _codec_zoo(2) + _many_small_tensors(2), version=4)
    data = path.read_bytes()
    (index_len,) = struct.unpack_from("<Q", data, 8)
    cut = data[: 16 + index_len - 4]  # the small blobs' CRC cut off the index
    with pytest.raises(InputError):
        container_from_bytes(struct.pack("<4sIQ", b"MCW1", 4, index_len - 4) + cut[16:], "cut.mcw")


# --- version 5: short records, blobs under 1 KiB share one CRC-32 -----------------------------


def _index_bytes(info) -> int:
    return info.total_bytes - info.blob_bytes


def test_v5_reads_back_every_record_and_array_as_written_and_is_smaller(tmp_path):
    tensors = _codec_zoo(0) + _many_small_tensors(0)
    v5 = write_container(tmp_path / "a.mcw", tensors, version=5)
    write_container(tmp_path / "b.mcw", tensors, version=5)
    assert (tmp_path / "a.mcw").read_bytes() == (tmp_path / "b.mcw").read_bytes()
    v4 = write_container(tmp_path / "v4.mcw", tensors, version=4)
    v2 = write_container(tmp_path / "v2.mcw", tensors, version=2)
    assert v5.blob_bytes == v4.blob_bytes == v2.blob_bytes
    assert _index_bytes(v5) < _index_bytes(v4)
    with read_container(tmp_path / "a.mcw") as c, read_container(tmp_path / "v2.mcw") as old:
        assert c.names == [t[0] for t in tensors]
        for name, a, _ in tensors:
            assert c.array(name).tobytes() == np.asarray(a).tobytes(), name
            assert c.record(name) == old.record(name), name  # short forms read back exactly
        own = [e.name for e in c.entries.values() if e.crc32 is not None]
        assert own and all(c.entries[n].nbytes >= container.SMALL_BLOB_V5 for n in own)


def test_v5_short_forms_stand_only_for_the_records_they_restore():
    """A palette, fp16 or raw float32 record with the derived fields only takes a few bytes; a
    record with anything else (groups, Huffman, a float32 codebook, another dtype, rans written
    false) keeps the version 4 form."""
    short = {"codec": "palette", "bits": 3, "codebook_size": 8, "shape": [128, 64, 1, 1], "dtype": "float32",
             "groups": 1, "huffman": False, "codebook_dtype": "float16", "rans": True,
             "streams": {"codebook": 16, "indices": 451}}  # fmt: skip
    got = container._short_v5(short, 467)
    assert got is not None and len(got) == 10  # head, 4 + 4 dims, bits, size, flags
    assert container._short_v5({**short, "rans": False}, 467) is None
    assert container._short_v5({**short, "groups": 2}, 467) is None
    assert (
        container._short_v5(
            {**short, "codebook_dtype": "float32", "streams": {"codebook": 32, "indices": 451}}, 483
        )
        is None
    )
    fp16 = {"codec": "fp16", "shape": [10], "dtype": "float32", "streams": {"data": 20}}
    assert container._short_v5(fp16, 20) == bytes([2, 1, 10])
    assert container._short_v5({**fp16, "dtype": "float16"}, 20) is None
    raw = {"codec": "raw", "shape": [], "dtype": "float32", "streams": {"data": 4}}
    assert container._short_v5(raw, 4) == bytes([3, 0])


def test_v5_checks_the_small_blobs_crc_and_every_large_blobs_own(tmp_path):
    rng = np.random.default_rng(5)
    big = rng.standard_normal(600).astype(np.float32)  # 2,400 bytes raw: a CRC of its own
    path = tmp_path / "w.mcw"
    info = write_container(path, [("big", big, None), *_codec_zoo(1)], version=5)
    data = path.read_bytes()
    small, large = info.entry("b/palette"), info.entry("big")
    assert small.nbytes < container.SMALL_BLOB_V5 <= large.nbytes
    for e, match in ((small, "does not match"), (large, "CRC-32 mismatch")):
        damaged = bytearray(data)
        damaged[e.offset] ^= 0x04
        with container_from_bytes(bytes(damaged), "w.mcw") as c:
            if e is small:
                c.array("big")  # the large blob has its own CRC
            else:
                c.array("b/palette")
            with pytest.raises(IntegrityError, match=match) as exc:
                c.array(e.name)
            assert "w.mcw" in exc.value.line()


def test_cpu_bundles_write_version_5_with_a_smaller_index(tmp_path):
    from mconv import api

    model = api.load(Path(__file__).resolve().parents[1] / "fixtures" / "digits_mlp.onnx")
    api.optimize(model, passes="prune(sparsity=0.9),cluster(bits=4)")
    api.export(model, "cpu", tmp_path / "b")
    data = (tmp_path / "b" / "weights.mcw").read_bytes()
    assert struct.unpack_from("<4sI", data, 0) == (b"MCW1", 5)
    with read_container(tmp_path / "b" / "weights.mcw") as c:
        tensors = [(n, c.array(n), None) for n in c.names]
        records = {n: c.record(n) for n in c.names}
    assert all(r["codec"] == "palette" for n, r in records.items() if n.endswith("weight"))
    # the same blobs in a version 4 file: its index is the larger
    spec = {n: {k: records[n][k] for k in ("codec", "rans") if k in records[n]} for n in records}
    blobs = [(n, a, spec[n]) for n, a, _ in tensors]
    v4 = write_container(tmp_path / "v4.mcw", blobs, version=4)
    same = write_container(tmp_path / "v5.mcw", blobs, version=5)
    assert same.blob_bytes == v4.blob_bytes and _index_bytes(same) < _index_bytes(v4)
