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
