"""ONNX map types (``map(key, value)``) in ``onnx_ir``, which refuses them (NotImplementedError
wrapped as SerdeError) though they are valid ONNX: ai.onnx.ml's ``ZipMap`` outputs a sequence of
maps, and scikit-learn pipelines converted by skl2onnx end with one.

Rules:
1. :func:`install` (run when :mod:`mconv.irio` is imported) teaches ``onnx_ir.serde`` one more
   type: a ``map_type`` deserializes to :class:`MapType` (key dtype and value type, the value
   type recursive like a sequence's element, a tensor value's shape kept) and serializes back to
   the same ``TypeProto``. A map itself has no shape. Every other type goes to onnx_ir's own functions unchanged.
2. A map's ``dtype`` is its value type's (as a sequence's is its element's), so code that asks a
   value for its dtype gets an answer; code that needs tensors checks ``isinstance(type,
   ir.TensorType)``, which a map is not.
3. Installing twice is installing once.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import onnx
import onnx_ir as ir
from onnx_ir import serde


class MapType(Hashable):
    """``map(key_type, value_type)`` of the ONNX type system."""

    __slots__ = ("denotation", "key_type", "value_shape", "value_type")

    def __init__(
        self,
        key_type: ir.DataType,
        value_type: Any,
        *,
        value_shape: Any = None,
        denotation: str | None = None,
    ) -> None:
        self.key_type = key_type
        self.value_type = value_type
        self.value_shape = value_shape  # the shape of a tensor value (ZipMap's: a scalar), if given
        self.denotation = denotation

    @property
    def dtype(self) -> ir.DataType:
        return self.value_type.dtype

    @dtype.setter
    def dtype(self, value: ir.DataType) -> None:
        self.value_type.dtype = value

    @property
    def elem_type(self) -> Any:
        return self.value_type

    def __hash__(self) -> int:
        return hash(repr(self))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MapType)
            and self.key_type == other.key_type
            and self.value_type == other.value_type
            and self.value_shape == other.value_shape
        )

    def __repr__(self) -> str:
        return f"Map({self.key_type!r}, {self.value_type!r})"

    def __str__(self) -> str:
        return f"map({self.key_type}, {self.value_type})"


_INSTALLED = False


def install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    for_type = serde.deserialize_type_proto_for_type
    for_shape = serde.deserialize_type_proto_for_shape
    type_into = serde.serialize_type_into

    def deserialize_type_proto_for_type(proto: onnx.TypeProto):
        if proto.HasField("map_type"):
            m = proto.map_type
            value = serde.deserialize_type_proto_for_type(m.value_type) if m.HasField("value_type") else None
            if value is None:
                raise ValueError(f"map value type must be set: {proto}")
            shape = serde.deserialize_type_proto_for_shape(m.value_type)
            return MapType(
                ir.DataType(m.key_type), value, value_shape=shape, denotation=proto.denotation or None
            )
        return for_type(proto)

    def deserialize_type_proto_for_shape(proto: onnx.TypeProto):
        if proto.HasField("map_type"):
            return None
        return for_shape(proto)

    def serialize_type_into(type_proto: onnx.TypeProto, from_: Any) -> None:
        if isinstance(from_, MapType):
            if from_.denotation:
                type_proto.denotation = from_.denotation
            type_proto.map_type.key_type = from_.key_type.value
            serde.serialize_type_into(type_proto.map_type.value_type, from_.value_type)
            if from_.value_shape is not None:
                serde.serialize_shape_into(type_proto.map_type.value_type, from_.value_shape)
            return
        type_into(type_proto, from_)

    serde.deserialize_type_proto_for_type = deserialize_type_proto_for_type
    serde.deserialize_type_proto_for_shape = deserialize_type_proto_for_shape
    serde.serialize_type_into = serialize_type_into
