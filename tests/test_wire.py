"""The hand-read protobuf wire format against protobuf's own encoder."""

from __future__ import annotations

import numpy as np
import pytest
from mconv.wire import WireError, encode_varint, iter_fields, length_delimited, read_varint
from onnx import TensorProto, numpy_helper


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**31, 2**63 - 1])
def test_varints_match_protobuf_encoding(n):
    # Oracle: protobuf encodes an int64 field 1 as key 0x08 then the varint.
    t = TensorProto()
    t.dims.append(n)
    wire = t.SerializeToString()
    assert wire.startswith(b"\x08")
    assert encode_varint(n) == wire[1:]
    assert read_varint(wire, 1) == (n, len(wire))


def test_fields_of_a_serialized_tensor_are_found_where_protobuf_put_them():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = numpy_helper.from_array(a, "w")
    wire = t.SerializeToString()
    fields = {number: (kind, wire[p:e]) for number, kind, _, p, e in iter_fields(wire)}
    assert fields[8] == (2, b"w")  # name
    assert fields[9] == (2, a.tobytes())  # raw_data
    assert fields[2][0] == 0 and read_varint(fields[2][1], 0)[0] == TensorProto.FLOAT  # data_type
    rebuilt = TensorProto()
    rebuilt.ParseFromString(length_delimited(8, b"v") + length_delimited(9, a.tobytes()))
    assert rebuilt.name == "v" and rebuilt.raw_data == a.tobytes()


def test_truncated_data_names_the_byte_offset():
    wire = numpy_helper.from_array(np.ones(2, np.float32), "w").SerializeToString()
    with pytest.raises(WireError) as e:
        list(iter_fields(wire[:-3]))
    assert isinstance(e.value.args[0], int) and "byte" in str(e.value)
    with pytest.raises(WireError):
        read_varint(b"\xff\xff", 0)
