"""Hostile and damaged TFLite files: every one imports or raises InputError, never anything else."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mconv.errors import InputError, UnsupportedError  # noqa: E402
from mconv.formats import import_model  # noqa: E402
from mconv.formats.tflite.reader import load_tflite_bytes  # noqa: E402
from tflite_builder import TflBuilder  # noqa: E402


def _small_model() -> bytes:
    b = TflBuilder()
    x = b.tensor("x", [1, 4, 4, 2])
    y = b.tensor("conv", [1, 4, 4, 3])
    w = b.const("w", np.arange(54, dtype=np.float32).reshape(3, 3, 3, 2) / 50)
    b.op(
        "CONV_2D",
        [x, w, b.const("b", np.ones(3, np.float32))],
        [y],
        "Conv2DOptions",
        Padding=0,
        StrideW=1,
        StrideH=1,
        FusedActivationFunction=1,
        DilationWFactor=1,
        DilationHFactor=1,
    )
    z = b.tensor("fc", [1, 5])
    b.op(
        "FULLY_CONNECTED", [y, b.const("fw", np.ones((5, 48), np.float32)), -1], [z], "FullyConnectedOptions"
    )
    return b.build([x], [z])


VALID = _small_model()


def _load(data: bytes):
    try:
        return load_tflite_bytes(data, "hostile.tflite")
    except InputError as exc:
        # One line, of bounded length: a mutated name length once put kilobytes of the file's
        # binary across several lines into the message.
        line = str(exc)
        assert "\n" not in line and "\r" not in line and line.startswith("hostile.tflite"), line
        assert len(line) <= 700, line
        # ... and not only thanks to line()'s backstop: the importer quotes names through show().
        for part in (exc.message, exc.where or ""):
            assert "\n" not in part and len(part) <= 600, part
        return exc


def test_valid_fixture_imports():
    assert not isinstance(_load(VALID), Exception)


@pytest.mark.parametrize("cut", [0, 3, 7, 8, 16, 64, 200, len(VALID) // 2, len(VALID) - 100, len(VALID) - 16])
def test_truncated_file_raises_input_error_with_byte_offset(cut):
    res = _load(VALID[:cut])
    assert isinstance(res, InputError)
    assert "byte offset" in str(res)


def test_wrong_identifier_is_refused_with_hint():
    res = _load(VALID[:4] + b"XXXX" + VALID[8:])
    assert isinstance(res, InputError) and "TFL3" in str(res) and "byte offset 4" in str(res)


def test_wrong_identifier_file_on_disk_gives_one_line(tmp_path):
    p = tmp_path / "m.tflite"
    p.write_bytes(b"\x00" * 64)
    with pytest.raises(InputError, match="not a TFLite model"):
        import_model([p])


def _patch_tensor_field(data: bytes, tensor: int, field: str, value: int) -> bytes:
    import tflite

    buf = bytearray(data)
    t = tflite.Model.GetRootAsModel(buf, 0).Subgraphs(0).Tensors(tensor)
    slot = {"buffer": 8}[field]
    off = t._tab.Offset(slot)
    assert off, "field not stored"
    struct.pack_into("<I", buf, t._tab.Pos + off, value)
    return bytes(buf)


def test_buffer_index_beyond_buffer_table_is_refused():
    res = _load(_patch_tensor_field(VALID, 2, "buffer", 10_000))
    assert isinstance(res, InputError) and "buffer 10000" in str(res)


def test_external_buffer_offset_beyond_file_is_refused():
    # A buffer whose data lies outside the flatbuffer (offset/size fields, >2 GB models).
    res = _load(flatbuffer_with_external_buffer(offset=1 << 40, size=216))
    assert isinstance(res, InputError) and "beyond the end of the file" in str(res)


def flatbuffer_with_external_buffer(offset: int, size: int) -> bytes:
    import tflite

    bld = TflBuilder()
    x = bld.tensor("x", [1, 6])
    w = bld.tensor("w", [9, 6])  # data given by the external buffer below
    y = bld.tensor("y", [1, 9])
    bld.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    data = bld.build([x], [y])
    # Rewrite buffer 2 (w) as an external buffer: a new table with offset/size fields.
    buf = bytearray(data)
    model = tflite.Model.GetRootAsModel(buf, 0)
    bt = model.Buffers(2)
    # the builder wrote an empty Buffer table for w; give it offset/size via an appended table
    return _append_external_buffer(bytes(buf), bt._tab.Pos, offset, size)


def _append_external_buffer(data: bytes, table_pos: int, offset: int, size: int) -> bytes:
    """Point the buffers vector entry of table ``table_pos`` at a new Buffer table appended to the
    file that carries ``offset`` and ``size`` (fields 2 and 3 of the schema's Buffer)."""
    buf = bytearray(data)
    while len(buf) % 8:
        buf += b"\0"
    vt_pos = len(buf)
    # vtable: [vt size, table size, data, offset, size]
    buf += struct.pack("<HHHHH", 10, 20, 0, 4, 12) + b"\0\0"
    tab_pos = len(buf)
    buf += struct.pack("<i", tab_pos - vt_pos) + struct.pack("<Q", offset) + struct.pack("<Q", size)
    # find the uoffset that points at the old table and redirect it
    for p in range(8, len(data) - 3, 4):
        (rel,) = struct.unpack_from("<I", data, p)
        if p + rel == table_pos:
            struct.pack_into("<I", buf, p, tab_pos - p)
            break
    return bytes(buf)


def test_absurd_tensor_shape_is_refused_before_any_allocation():
    b = TflBuilder()
    x = b.tensor("x", [1 << 20, 1 << 20, 1 << 10])
    y = b.tensor("y", [1 << 20, 1 << 20, 1 << 10])
    b.op("RELU", [x], [y])
    res = _load(b.build([x], [y]))
    assert isinstance(res, InputError) and "elements" in str(res) and "'x'" in str(res)


def test_constant_whose_bytes_do_not_match_its_shape_is_refused():
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    w = b.tensor("w", [3, 4], data=np.ones(5, np.float32))
    y = b.tensor("y", [1, 3])
    b.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    res = _load(b.build([x], [y]))
    assert isinstance(res, InputError) and "needs 48 bytes" in str(res)


def test_tensor_index_out_of_range_is_refused():
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    y = b.tensor("y", [1, 4])
    b.op("RELU", [x], [7])
    res = _load(b.build([x], [y]))
    assert isinstance(res, InputError) and "tensor 7" in str(res)


def test_cyclic_graph_is_refused():
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    a = b.tensor("a", [1, 4])
    c = b.tensor("c", [1, 4])
    b.op("ADD", [x, c], [a], "AddOptions")  # reads c, which only the next op writes
    b.op("RELU", [a], [c])
    res = _load(b.build([x], [c]))
    assert isinstance(res, InputError) and "before any operator writes it" in str(res)


def test_tensor_written_twice_is_refused():
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    a = b.tensor("a", [1, 4])
    b.op("RELU", [x], [a])
    b.op("TANH", [x], [a])
    res = _load(b.build([x], [a]))
    assert isinstance(res, InputError) and "already defined" in str(res)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_mutated_file_imports_or_raises_input_error(mutations):
    buf = bytearray(VALID)
    for pos, val in mutations:
        buf[pos] = val
    res = _load(bytes(buf))
    assert res is not None  # an ir.Model or an InputError; any other exception fails the test


@settings(max_examples=40, deadline=None)
@given(st.integers(8, len(VALID) - 1), st.binary(min_size=1, max_size=64))
def test_file_with_garbage_tail_imports_or_raises_input_error(cut, tail):
    res = _load(VALID[:cut] + tail)
    assert res is not None


def test_unsupported_error_is_an_input_error():
    assert issubclass(UnsupportedError, InputError)
