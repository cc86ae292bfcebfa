"""ONNX files (``.onnx``, external data beside them)."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from mconv.formats import Format
from mconv.irio import load_onnx, save_onnx


def _load(paths: list[Path], options: dict) -> ir.Model:
    return load_onnx(paths[0])


def _save(model: ir.Model, dest: Path, options: dict) -> list[Path]:
    return save_onnx(model, dest)


def _sniff(head: bytes, path: Path) -> bool:
    # ModelProto starts with field 1 (ir_version, varint: 0x08) in every exporter we know of.
    return len(head) > 2 and head[0] == 0x08 and head[1] < 0x20


FORMAT = Format(
    name="onnx",
    description="ONNX model (.onnx, external data supported)",
    extensions=(".onnx",),
    load=_load,
    save=_save,
    sniff=_sniff,
)
