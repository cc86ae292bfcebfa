"""TensorFlow checkpoint v2 import (formats/tf_checkpoint.py) without TensorFlow.

TensorFlow is not installed here, so the oracle is a writer that follows the published format:
the bundle protos (tensor_bundle.proto, tensor_shape.proto) are declared with the protobuf
library and serialized by it (not by mconv's hand decoder), the SSTable is laid out as LevelDB's
table format specifies (prefix-compressed entries, restart points, masked CRC-32C block
trailers, 48-byte footer with the magic number), and CRC-32C is a bitwise implementation checked
against the standard's published check values.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from mconv.errors import InputError
from mconv.formats import import_model
from mconv.formats.tf_checkpoint import crc32c
from mconv.formats.weights import is_weight_only, model_arrays
from mconv.irio import load_onnx

MAGIC = 0xDB4775248B80FB57
F = descriptor_pb2.FieldDescriptorProto


# --- an independent writer -------------------------------------------------------------------------


def _bitwise_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _messages():
    fdp = descriptor_pb2.FileDescriptorProto(name="mconv_test_bundle.proto", package="t", syntax="proto3")

    def msg(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, num, ftype, label, type_name in fields:
            m.field.add(name=fname, number=num, type=ftype, label=label, type_name=type_name)
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("Dim", [("size", 1, F.TYPE_INT64, opt, None), ("name", 2, F.TYPE_STRING, opt, None)])
    msg(
        "TensorShapeProto",
        [("dim", 2, F.TYPE_MESSAGE, rep, ".t.Dim"), ("unknown_rank", 3, F.TYPE_BOOL, opt, None)],
    )
    msg("TensorSliceProto", [])
    msg(
        "VersionDef", [("producer", 1, F.TYPE_INT32, opt, None), ("min_consumer", 2, F.TYPE_INT32, opt, None)]
    )
    msg(
        "BundleHeaderProto",
        [
            ("num_shards", 1, F.TYPE_INT32, opt, None),
            ("endianness", 2, F.TYPE_INT32, opt, None),  # an enum: same varint wire format
            ("version", 3, F.TYPE_MESSAGE, opt, ".t.VersionDef"),
        ],
    )
    msg(
        "BundleEntryProto",
        [
            ("dtype", 1, F.TYPE_INT32, opt, None),  # DataType enum
            ("shape", 2, F.TYPE_MESSAGE, opt, ".t.TensorShapeProto"),
            ("shard_id", 3, F.TYPE_INT32, opt, None),
            ("offset", 4, F.TYPE_INT64, opt, None),
            ("size", 5, F.TYPE_INT64, opt, None),
            ("crc32c", 6, F.TYPE_FIXED32, opt, None),
            ("slices", 7, F.TYPE_MESSAGE, rep, ".t.TensorSliceProto"),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"t.{n}"))
        for n in ("BundleHeaderProto", "BundleEntryProto")
    }


PROTOS = _messages()
DTYPES = {np.dtype("float32"): 1, np.dtype("float64"): 2, np.dtype("int32"): 3, np.dtype("int64"): 9,
          np.dtype("float16"): 19, np.dtype("uint8"): 4, np.dtype("bool"): 10}  # fmt: skip


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _block(entries: list[tuple[bytes, bytes]], restart_interval: int = 4) -> bytes:
    buf, restarts, last = bytearray(), [], b""
    for i, (key, value) in enumerate(entries):
        shared = 0
        if i % restart_interval == 0:
            restarts.append(len(buf))
        else:
            while shared < min(len(last), len(key)) and last[shared] == key[shared]:
                shared += 1
        buf += _varint(shared) + _varint(len(key) - shared) + _varint(len(value)) + key[shared:] + value
        last = key
    restarts = restarts or [0]
    buf += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    return bytes(buf)


def _snappy_literals(data: bytes) -> bytes:
    """A valid raw snappy stream of literal elements only (60-byte and long-length literals)."""
    out = bytearray(_varint(len(data)))
    for i in range(0, len(data), 100):
        chunk = data[i : i + 100]
        if len(chunk) <= 60:
            out.append((len(chunk) - 1) << 2)
        else:
            out += bytes([60 << 2, len(chunk) - 1])  # tag 60: length - 1 in the next byte
        out += chunk
    return bytes(out)


def write_table(
    path: Path, items: list[tuple[bytes, bytes]], block_bytes: int = 200, snappy: bool = False
) -> None:
    """An SSTable with several data blocks, an empty metaindex block, an index block, a footer."""
    out = bytearray()

    def put(contents: bytes) -> bytes:
        kind = b"\0"
        if snappy:
            contents, kind = _snappy_literals(contents), b"\1"
        handle = _varint(len(out)) + _varint(len(contents))
        out.extend(contents + kind + struct.pack("<I", _mask(_bitwise_crc32c(contents + kind))))
        return handle

    index, chunk, size = [], [], 0
    for key, value in sorted(items):
        chunk.append((key, value))
        size += len(key) + len(value)
        if size >= block_bytes:
            index.append((chunk[-1][0], put(_block(chunk))))
            chunk, size = [], 0
    if chunk:
        index.append((chunk[-1][0], put(_block(chunk))))
    meta = put(_block([]))
    idx = put(_block(index, restart_interval=1))
    footer = (meta + idx).ljust(40, b"\0") + struct.pack("<Q", MAGIC)
    path.write_bytes(bytes(out) + footer)


def write_checkpoint(
    prefix: Path,
    tensors: dict[str, np.ndarray],
    *,
    strings: tuple[str, ...] = (),
    big_endian: bool = False,
    snappy: bool = False,
) -> None:
    header = PROTOS["BundleHeaderProto"](num_shards=1, endianness=1 if big_endian else 0)
    header.version.producer = 1
    items = [(b"", header.SerializeToString())]
    data = bytearray()
    for name, array in tensors.items():
        raw = array.astype(array.dtype.newbyteorder(">" if big_endian else "<")).tobytes()
        entry = PROTOS["BundleEntryProto"](
            dtype=DTYPES[array.dtype], shard_id=0, offset=len(data), size=len(raw),
            crc32c=_mask(_bitwise_crc32c(raw)),
        )  # fmt: skip
        for d in array.shape:
            entry.shape.dim.add(size=d)
        items.append((name.encode(), entry.SerializeToString()))
        data += raw
    for name in strings:
        items.append(
            (name.encode(), PROTOS["BundleEntryProto"](dtype=7, offset=len(data), size=3).SerializeToString())
        )
        data += b"\x01\x02\x03"
    write_table(Path(f"{prefix}.index"), items, snappy=snappy)
    Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(data))


def _tensors(n: int = 12) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for i in range(n):
        out[f"model/layer_with_weights-{i}/kernel/.ATTRIBUTES/VARIABLE_VALUE"] = rng.standard_normal(
            (3, 4 + i)
        ).astype(np.float32)
        out[f"model/layer_with_weights-{i}/bias/.ATTRIBUTES/VARIABLE_VALUE"] = rng.standard_normal(
            4 + i
        ).astype(np.float16)
    out["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] = np.array(5, dtype=np.int64)
    out["scalars/mask"] = np.array([True, False])
    out["scalars/f64"] = rng.standard_normal((2, 2))
    return out


# --- CRC -----------------------------------------------------------------------------------------


def test_crc32c_matches_the_standard_check_values() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC catalogue's check value
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720, B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    data = np.random.default_rng(0).integers(0, 256, 200_003, dtype=np.uint8).tobytes()
    assert crc32c(data) == _bitwise_crc32c(data)  # the long-input (lane) path


# --- reading -------------------------------------------------------------------------------------


def test_checkpoint_written_to_the_spec_imports_every_tensor(tmp_path: Path) -> None:
    src = _tensors()
    write_checkpoint(tmp_path / "ckpt", src, strings=("_CHECKPOINTABLE_OBJECT_GRAPH",))
    model = import_model([tmp_path / "ckpt.index"])
    assert model.metadata_props["mconv.source_format"] == "tf-checkpoint"
    assert is_weight_only(model)
    got = model_arrays(model)
    assert list(got) == sorted(src)  # the table's key order
    for name, array in src.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" in model.metadata_props["mconv.import_notes"]


def test_index_and_data_files_given_together_import(tmp_path: Path) -> None:
    src = _tensors(2)
    write_checkpoint(tmp_path / "ckpt", src)
    model = import_model([tmp_path / "ckpt.index", tmp_path / "ckpt.data-00000-of-00001"])
    assert set(model_arrays(model)) == set(src)


def test_big_endian_checkpoint_is_byte_swapped(tmp_path: Path) -> None:
    src = _tensors(1)
    write_checkpoint(tmp_path / "be", src, big_endian=True)
    got = model_arrays(import_model([tmp_path / "be.index"]))
    for name, array in src.items():
        np.testing.assert_array_equal(got[name], array)


def test_cli_imports_a_checkpoint_to_a_weight_only_onnx(tmp_path: Path) -> None:
    src = _tensors(2)
    write_checkpoint(tmp_path / "ckpt", src)
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "mconv", "import", "ckpt.index", "-o", "w.onnx", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = model_arrays(load_onnx(tmp_path / "w.onnx"))
    for name, array in src.items():
        np.testing.assert_array_equal(got[name], array)


# --- bad input -----------------------------------------------------------------------------------


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_bad_magic_and_truncated_index_are_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", _tensors(2))
    index = tmp_path / "ckpt.index"
    raw = index.read_bytes()
    index.write_bytes(raw[:-8] + b"\0" * 8)
    with pytest.raises(InputError, match="bad table magic") as err:
        import_model([index])
    assert "byte offset" in _one_line(err)
    index.write_bytes(raw[:30])
    with pytest.raises(InputError) as err:
        import_model([index], format="tf-checkpoint")
    _one_line(err)


def test_block_handle_past_the_end_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", _tensors(2))
    index = tmp_path / "ckpt.index"
    raw = index.read_bytes()
    footer = (_varint(0) + _varint(0) + _varint(len(raw)) + _varint(999)).ljust(40, b"\0") + struct.pack(
        "<Q", MAGIC
    )
    index.write_bytes(raw[:-48] + footer)
    with pytest.raises(InputError, match="index block .* runs past"):
        import_model([index])


def test_corrupt_block_fails_its_checksum(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", _tensors(2))
    index = tmp_path / "ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[5] ^= 0xFF
    index.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="block checksum does not match"):
        import_model([index])


def test_corrupt_tensor_bytes_fail_the_entry_crc(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", _tensors(2))
    data = tmp_path / "ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[10] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="checksum does not match its bytes") as err:
        import_model([tmp_path / "ckpt.index"])
    assert "byte offset" in _one_line(err)


def test_short_data_shard_names_the_tensor_and_offset(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", _tensors(2))
    data = tmp_path / "ckpt.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:20])
    with pytest.raises(InputError, match=r"tensor '.+' bytes \[\d+, \d+\) run past the 20-byte data shard"):
        import_model([tmp_path / "ckpt.index"])


def test_absurd_shape_is_refused_before_any_allocation(tmp_path: Path) -> None:
    entry = PROTOS["BundleEntryProto"](dtype=1, offset=0, size=16)
    entry.shape.dim.add(size=1 << 40)
    entry.shape.dim.add(size=1 << 20)
    header = PROTOS["BundleHeaderProto"](num_shards=1)
    write_table(
        tmp_path / "x.index", [(b"", header.SerializeToString()), (b"huge", entry.SerializeToString())]
    )
    (tmp_path / "x.data-00000-of-00001").write_bytes(b"\0" * 16)
    with pytest.raises(InputError, match=r"tensor 'huge' holds 16 bytes but shape"):
        import_model([tmp_path / "x.index"])


def test_missing_data_shard_is_named(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt", _tensors(1))
    (tmp_path / "ckpt.data-00000-of-00001").unlink()
    with pytest.raises(InputError, match="data shard not found"):
        import_model([tmp_path / "ckpt.index"])


def test_sliced_tensors_are_refused_by_name(tmp_path: Path) -> None:
    entry = PROTOS["BundleEntryProto"](dtype=1)
    entry.slices.add()
    header = PROTOS["BundleHeaderProto"](num_shards=1)
    write_table(
        tmp_path / "s.index", [(b"", header.SerializeToString()), (b"part/kernel", entry.SerializeToString())]
    )
    (tmp_path / "s.data-00000-of-00001").write_bytes(b"")
    with pytest.raises(InputError, match=r"part/kernel \(sliced tensor\)"):
        import_model([tmp_path / "s.index"])


def test_snappy_copies_follow_the_format_description() -> None:
    from mconv.formats.tf_checkpoint import snappy_decompress

    # literal "abcd"; copy-1 (length 8, offset 4, overlapping its own output); literal "X";
    # copy-2 (length 3, offset 13)
    stream = bytes([16, 0x0C]) + b"abcd" + bytes([0x11, 4, 0x00]) + b"X" + bytes([(3 - 1) << 2 | 2, 13, 0])
    assert snappy_decompress(stream) == b"abcdabcdabcdX" + b"abc"
    with pytest.raises(ValueError):
        snappy_decompress(bytes([16, 0x0C]) + b"abcd" + bytes([0x11, 9]))  # offset before the start
    with pytest.raises(ValueError):
        snappy_decompress(_varint(1 << 40) + b"\0a")  # a declared length no input can make


def test_snappy_compressed_tables_are_read(tmp_path: Path) -> None:
    src = _tensors(3)
    write_checkpoint(tmp_path / "z", src, snappy=True)
    got = model_arrays(import_model([tmp_path / "z.index"]))
    for name, array in src.items():
        np.testing.assert_array_equal(got[name], array)


def test_mutated_checkpoints_import_or_fail_with_one_input_error(tmp_path_factory) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    base = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    write_checkpoint(base, _tensors(4))
    index = Path(f"{base}.index").read_bytes()
    data = Path(f"{base}.data-00000-of-00001").read_bytes()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        which=st.sampled_from(["index", "data"]),
        pos=st.integers(0, 10**6),
        byte=st.integers(0, 255),
        cut=st.booleans(),
    )
    def check(which, pos, byte, cut):
        d = tmp_path_factory.mktemp("m")
        prefix = d / "model.ckpt"
        idx, dat = bytearray(index), bytearray(data)
        target = idx if which == "index" else dat
        p = pos % len(target)
        if cut:
            del target[p:]
        else:
            target[p] = byte
        Path(f"{prefix}.index").write_bytes(bytes(idx))
        Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(dat))
        try:
            import_model([Path(f"{prefix}.index")])
        except InputError as exc:
            assert "\n" not in exc.line()

    check()


# --- hostile checkpoints (issue 11, item 8) ----------------------------------------------------------


def _bundle(path: Path, header: bytes, entries: list[tuple[bytes, bytes]], data: bytes = b"\0" * 16) -> Path:
    write_table(Path(f"{path}.index"), [(b"", header), *entries])
    Path(f"{path}.data-00000-of-00001").write_bytes(data)
    return Path(f"{path}.index")


def _entry(**fields) -> bytes:
    shape = fields.pop("shape", (2,))
    e = PROTOS["BundleEntryProto"](**{"dtype": 1, "offset": 0, "size": 8, **fields})
    for d in shape:
        e.shape.dim.add(size=d)
    return e.SerializeToString()


def _key(num: int, wire: int) -> bytes:
    return _varint(num << 3 | wire)


HEADER = PROTOS["BundleHeaderProto"](num_shards=1).SerializeToString()
ENTRY = _entry()

TF_CASES = {
    # name: (header bytes, entry bytes, message pattern)
    "shape_as_integer": (HEADER, _key(1, 0) + b"\x01" + _key(2, 0) + b"\x05" + _key(5, 0) + b"\x08",
                         r"BundleEntryProto.shape \(field 2\) is an integer \(varint\), expected bytes"),
    "dtype_as_bytes": (HEADER, _key(1, 2) + b"\x01A" + ENTRY[2:], r"BundleEntryProto.dtype \(field 1\) is bytes"),
    "shard_id_as_bytes": (HEADER, ENTRY + _key(3, 2) + b"\x01\x00", r"BundleEntryProto.shard_id \(field 3\)"),
    "offset_as_fixed64": (HEADER, ENTRY + _key(4, 1) + b"\0" * 8, r"BundleEntryProto.offset \(field 4\) is 8 fixed"),
    "crc_as_bytes": (HEADER, ENTRY + _key(6, 2) + b"\x01\x00", r"BundleEntryProto.crc32c \(field 6\) is bytes"),
    "crc_as_varint": (HEADER, ENTRY + _key(6, 0) + b"\x01", r"crc32c \(field 6\) is an integer \(varint\), expected 4"),
    "slices_as_integer": (HEADER, ENTRY + _key(7, 0) + b"\x01", r"BundleEntryProto.slices \(field 7\)"),
    "dim_as_integer": (HEADER, _key(1, 0) + b"\x01" + _key(2, 2) + b"\x02" + _key(2, 0) + b"\x07",
                       r"TensorShapeProto.dim \(field 2\) is an integer"),
    "dim_size_as_bytes": (HEADER, _key(1, 0) + b"\x01" + _key(2, 2) + b"\x05" + _key(2, 2) + b"\x03"
                          + _key(1, 2) + b"\x01A", r"TensorShapeProto.Dim.size \(field 1\) is bytes"),
    "unknown_rank_as_bytes": (HEADER, _key(1, 0) + b"\x01" + _key(2, 2) + b"\x03" + _key(3, 2) + b"\x01\x01",
                              r"TensorShapeProto.unknown_rank \(field 3\)"),
    "group_wire_type": (HEADER, ENTRY + _key(9, 3), r"unsupported wire type 3"),
    "truncated_entry": (HEADER, ENTRY[:-1], r"BundleEntryProto is malformed"),
    "non_numeric_shard_count": (_key(1, 2) + b"\x03abc", ENTRY,
                                r"BundleHeaderProto.num_shards \(field 1\) is bytes/a message, expected an integer"),
    "shard_count_as_digit_text": (_key(1, 2) + b"\x011", ENTRY, r"num_shards \(field 1\) is bytes"),
    "endianness_as_bytes": (_key(2, 2) + b"\x00", ENTRY, r"BundleHeaderProto.endianness \(field 2\) is bytes"),
    "version_as_integer": (_key(3, 0) + b"\x01", ENTRY, r"BundleHeaderProto.version \(field 3\) is an integer"),
    "negative_shard_count": (PROTOS["BundleHeaderProto"](num_shards=-1).SerializeToString(), ENTRY,
                             r"num_shards is -1, not 1 to 99999"),
    "huge_shard_count": (_key(1, 0) + _varint(1 << 40), ENTRY, r"num_shards is 1099511627776, not 1 to 99999"),
    "endianness_7": (PROTOS["BundleHeaderProto"](num_shards=1, endianness=7).SerializeToString(), ENTRY,
                     r"endianness is 7, not 0 \(little\) or 1 \(big\)"),
    "zero_size_with_huge_dim": (HEADER, _entry(size=0, shape=(0, 1 << 62)), r"too large for any array"),
    "too_many_dims": (HEADER, _entry(size=4, shape=(1,) * 65), r"65 dimensions, more than 64"),
    "negative_shard_id": (HEADER, _entry(shard_id=-1), r"names shard -1 of 1"),
    "offset_past_the_shard": (HEADER, _entry(offset=12), r"bytes \[12, 20\) run past the 16-byte data shard"),
    "negative_offset": (HEADER, _entry(offset=-8), r"bytes \[-8, 0\) run past"),
    "crc_mismatch": (HEADER, _entry(crc32c=12345), r"checksum does not match its bytes"),
    "unknown_dtype": (HEADER, _entry(dtype=99), r"w \(DataType 99\)"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TF_CASES))
def test_hostile_bundle_protos_are_one_input_error(tmp_path: Path, case: str) -> None:
    header, entry, pattern = TF_CASES[case]
    index = _bundle(tmp_path / "ckpt", header, [(b"w", entry)])
    with pytest.raises(InputError, match=pattern) as err:
        import_model([index])
    text = _one_line(err)
    assert str(tmp_path / "ckpt") in text and "(hint: " in text


def test_hostile_checkpoints_fail_the_same_way_at_the_cli(tmp_path: Path) -> None:
    from mconv.cli.app import app
    from typer.testing import CliRunner

    for case in ("shape_as_integer", "non_numeric_shard_count", "offset_past_the_shard", "crc_mismatch"):
        header, entry, _ = TF_CASES[case]
        (tmp_path / case).mkdir()
        index = _bundle(tmp_path / case / "ckpt", header, [(b"w", entry)])
        r = CliRunner().invoke(app, ["import", str(index), "-o", str(tmp_path / case / "w.onnx")])
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and str(tmp_path / case / "ckpt") in lines[0], r.output
        assert not (tmp_path / case / "w.onnx").exists()


def test_missing_shard_of_several_is_named(tmp_path: Path) -> None:
    header = PROTOS["BundleHeaderProto"](num_shards=3).SerializeToString()
    index = _bundle(tmp_path / "ckpt", header, [(b"a", _entry()), (b"b", _entry(shard_id=2))])
    Path(f"{tmp_path}/ckpt.data-00000-of-00003").write_bytes(b"\0" * 8)
    with pytest.raises(InputError, match="data shard not found") as err:
        import_model([index])
    assert "ckpt.data-00002-of-00003" in _one_line(err)


def _raw_table(path: Path, data_block: bytes, copies: int = 1) -> Path:
    """A table whose one data block is given raw; the index may point at it ``copies`` times.
    (mconv's own CRC-32C, checked against the bitwise one above, keeps the large bombs quick.)"""
    out = bytearray()

    def put(contents: bytes) -> bytes:
        handle = _varint(len(out)) + _varint(len(contents))
        out.extend(contents + b"\0" + struct.pack("<I", _mask(crc32c(contents + b"\0"))))
        return handle

    data = put(data_block)
    meta = put(_block([]))
    idx = put(_block([(b"k%d" % i, data) for i in range(copies)], restart_interval=1))
    path.write_bytes(bytes(out) + (meta + idx).ljust(40, b"\0") + struct.pack("<Q", MAGIC))
    return path


def _prefix_bomb(entries: int) -> bytes:
    """One 60 KB key, then ``entries`` 6-byte entries that each repeat it and add a byte (each a
    new 60 KB key: shared = 60,000, non_shared = 1)."""
    key = b"k" * 60_000
    head = _varint(0) + _varint(len(key)) + _varint(0) + key
    return head + (_varint(len(key)) + _varint(1) + _varint(0) + b"x") * entries + struct.pack("<II", 0, 1)


def test_key_prefix_bomb_is_refused(tmp_path: Path) -> None:
    index = _raw_table(tmp_path / "bomb.index", _prefix_bomb(2_000))  # 120 MB of keys from 72 KB
    with pytest.raises(InputError, match=r"key of 60001 bytes exceeds what the table can hold") as err:
        import_model([index], format="tf-checkpoint")
    assert "byte offset" in _one_line(err)


def test_index_pointing_at_one_data_block_many_times_is_refused(tmp_path: Path) -> None:
    block = _block([(b"", HEADER), (b"w", ENTRY)])
    index = _raw_table(tmp_path / "rep.index", block, copies=3)
    Path(f"{tmp_path}/rep.data-00000-of-00001").write_bytes(b"\0" * 8)
    with pytest.raises(InputError, match=r"data block at byte 0 overlaps the previous data block") as err:
        import_model([index])
    _one_line(err)
    Path(f"{tmp_path}/one.data-00000-of-00001").write_bytes(b"\0" * 8)
    assert list(model_arrays(import_model([_raw_table(tmp_path / "one.index", block)]))) == ["w"]


def test_key_prefix_bomb_stays_within_4_gb_of_address_space(tmp_path: Path) -> None:
    index = _raw_table(tmp_path / "bomb.index", _prefix_bomb(100_000))  # 6 GB of keys from 660 KB
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "from mconv.errors import InputError\nfrom mconv.formats import import_model\n"
        "try:\n    import_model([sys.argv[1]], format='tf-checkpoint')\nexcept InputError as e:\n    print(e.line())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(index)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "exceeds what the table can hold" in proc.stdout


def test_seeded_mutations_of_a_checkpoint_import_or_fail_with_one_input_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    base = tmp_path / "base"
    write_checkpoint(base, _tensors(3), strings=("_CHECKPOINTABLE_OBJECT_GRAPH",))
    index = Path(f"{base}.index").read_bytes()
    data = Path(f"{base}.data-00000-of-00001").read_bytes()
    mutants = []
    for which, raw in (("index", index), ("data", data)):
        for pos in rng.integers(0, len(raw), 15):
            mutants.append((which, raw[: int(pos)]))
        for pos in rng.integers(0, len(raw), 40):
            b = bytearray(raw)
            b[int(pos)] ^= 1 << int(rng.integers(0, 8))
            mutants.append((which, bytes(b)))
    # 5-byte overwrites at fixed offsets of the index: every 7th byte, the footer's every byte
    for pos in [*range(0, len(index) - 48, 7), *range(len(index) - 48, len(index) - 4)]:
        for junk in (b"\xff\xff\xff\xff\x0f", b"\x00" * 5, b"\x12\x01A\x08\x02"):
            mutants.append(("index", index[:pos] + junk + index[pos + 5 :]))
    outcomes = {"ok": 0, "InputError": 0}
    for k, (which, raw) in enumerate(mutants):
        prefix = tmp_path / f"m{k}"
        Path(f"{prefix}.index").write_bytes(raw if which == "index" else index)
        Path(f"{prefix}.data-00000-of-00001").write_bytes(raw if which == "data" else data)
        try:
            import_model([Path(f"{prefix}.index")])
            outcomes["ok"] += 1
        except InputError as exc:
            assert "\n" not in exc.line() and str(prefix) in exc.line(), exc.line()
            outcomes["InputError"] += 1
    assert outcomes["InputError"] > len(mutants) // 2
