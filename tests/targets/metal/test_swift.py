"""The Swift package in a metal bundle: what Model.swift encodes matches metal_plan.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mconv.targets.metal import TARGET
from metal_models import mobilenet_style

CODECS = Path(__file__).resolve().parents[3] / "core" / "codecs"
_ROW = re.compile(
    r'Layer\(kernel: "(\w+)", buffers: \[([\d, ]*)\], grid: MTLSize\(width: (\d+), height: (\d+), depth: (\d+)\), '
    r"threadgroup: MTLSize\(width: (\d+), height: (\d+), depth: (\d+)\)\)"
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return TARGET.export(mobilenet_style(), tmp_path_factory.mktemp("swift") / "MobileNet", {})


def test_package_swift_declares_tools_59_platforms_library_metal_resource_and_c_decoder(bundle):
    text = (bundle.root / "Package.swift").read_text()
    assert text.startswith("// swift-tools-version:5.9")
    assert "platforms: [.iOS(.v16), .macOS(.v13)]" in text
    assert '.library(name: "MobilenetStyle", targets: ["MobilenetStyle"])' in text
    assert 'resources: [.process("kernels.metal")]' in text
    assert '.target(name: "MCWDecoder", path: "Sources/MCWDecoder")' in text


def test_model_swift_layer_table_is_the_plan_in_encode_order(bundle):
    plan = json.loads((bundle.root / "metal_plan.json").read_text())
    swift = (bundle.root / "Sources/MobilenetStyle/Model.swift").read_text()
    rows = [
        (
            m[1],
            [int(b) for b in m[2].split(",")],
            [int(m[3]), int(m[4]), int(m[5])],
            [int(m[6]), int(m[7]), int(m[8])],
        )
        for m in _ROW.finditer(swift)
    ]
    expected = [(lay["kernel"], lay["bindings"], lay["grid"], lay["threadgroup"]) for lay in plan["layers"]]
    assert rows == expected and len(rows) == len(plan["layers"]) > 5
    # buffers are bound at binding index = position in the layer's list, sizes from the plan
    assert "encoder.setBuffer(buffers[index], offset: 0, index: binding)" in swift
    assert "encoder.dispatchThreads(layer.grid, threadsPerThreadgroup: layer.threadgroup)" in swift
    counts = [int(c) for c in re.findall(r"BufferSpec\(name: \"[^\"]*\", kind: \.\w+, count: (\d+)\)", swift)]
    assert counts == [b["count"] for b in plan["buffers"]]


def test_predict_makes_one_command_buffer_and_one_encoder_and_pipelines_only_in_init(bundle):
    swift = (bundle.root / "Sources/MobilenetStyle/Model.swift").read_text()
    assert swift.count("makeCommandBuffer()") == 1 and swift.count("makeComputeCommandEncoder()") == 1
    predict = swift[swift.index("public func predict(inputs") :]
    predict = predict[: predict.index("// MARK")]
    assert "makeCommandBuffer()" in predict and "commit()" in predict and "waitUntilCompleted()" in predict
    assert "makeComputePipelineState" not in predict
    assert "public func predict(_ input: [Float]) throws -> [String: [Float]]" in swift


def test_every_plan_kernel_is_defined_once_in_kernels_metal_with_plan_buffer_count(bundle):
    plan = json.loads((bundle.root / "metal_plan.json").read_text())
    metal = (bundle.root / "Sources/MobilenetStyle/kernels.metal").read_text()
    assert "threadgroup" not in metal.replace("Kernels use no threadgroup memory", "")
    for layer in plan["layers"]:
        assert metal.count(f"kernel void {layer['kernel']}(") == 1
        sig = metal[metal.index(f"kernel void {layer['kernel']}(") :].split("{", 1)[0]
        assert re.findall(r"\[\[buffer\((\d+)\)\]\]", sig) == [str(i) for i in range(len(layer["bindings"]))]


def test_c_decoder_is_shipped_verbatim_and_readme_explains_xcode_and_predict(bundle):
    assert (bundle.root / "Sources/MCWDecoder/decoder.c").read_bytes() == (CODECS / "decoder.c").read_bytes()
    assert (bundle.root / "Sources/MCWDecoder/include/decoder.h").read_bytes() == (
        CODECS / "decoder.h"
    ).read_bytes()
    readme = (bundle.root / "README.md").read_text()
    assert "File > Add Package Dependencies" in readme and "Add Local" in readme
    assert "model.predict(input)" in readme and "import MobilenetStyle" in readme
    for rel in ("Package.swift", "README.md", "metal_plan.json", "Sources/MobilenetStyle/Model.swift"):
        assert rel in bundle.manifest["files"]


def test_same_model_and_options_give_byte_identical_bundles(bundle, tmp_path):
    again = TARGET.export(mobilenet_style(), tmp_path / "MobileNet", {})
    assert again.manifest["files"] == bundle.manifest["files"]


def test_model_swift_fills_every_decoder_record_field_with_its_c_type(bundle):
    """Swift is not compiled here: read decoder.h's mcw_record and check Model.swift sets each
    field, through the Swift type the C type imports as (a uint64_t field such as ``groups`` or
    ``block`` given a UInt32 would not compile)."""
    header = (CODECS / "decoder.h").read_text()
    body = header[header.index("typedef struct {") : header.index("} mcw_record;")]
    fields = dict(
        (name, ctype)
        for ctype, name in re.findall(r"^\s*(int|uint32_t|uint64_t)\s+(\w+);", body, re.MULTILINE)
    )
    assert {"groups", "block", "count", "codebook_size"} <= set(fields)
    assert fields["groups"] == fields["block"] == "uint64_t"
    swift = (bundle.root / "Sources/MobilenetStyle/Model.swift").read_text()
    swift_type = {"int": "Int32", "uint32_t": "UInt32", "uint64_t": "UInt64"}
    for name, ctype in fields.items():
        assigned = re.findall(rf"^\s*rec\.{name} = (.+)$", swift, re.MULTILINE)
        assert len(assigned) == 1, name
        value = assigned[0]
        call = re.match(r"(Int32|UInt32|UInt64)\(", value)
        if call:
            assert call[1] == swift_type[ctype], (name, value)
        elif value.startswith("Self."):  # a helper: its declared result type
            helper = re.match(r"Self\.(\w+)\(", value)[1]
            declared = re.search(rf"static func {helper}\([^)]*\) -> (\w+)", swift)[1]
            assert declared == swift_type[ctype], (name, value)
        else:  # a conditional 1 : 0 literal
            assert re.fullmatch(r"\(.*\) \? 1 : 0", value) and ctype == "int", (name, value)
    # "block": absent -> 0 (no block), present but not a length >= 1 -> a length the decoder refuses
    helper = swift[swift.index("static func paletteBlock(") :]
    helper = helper[: helper.index("\n    }\n")]
    assert "guard let value = value else { return 0 }" in helper
    assert "guard let length = value as? Int, length >= 1 else { return UInt64.max }" in helper
    assert 'rec.block = Self.paletteBlock(record["block"])' in swift
    # "axis": absent -> 0 (axis-0 groups), present but not an axis of the shape -> -1 (refused);
    # with axis > 0 the decoder gets shape[axis] and the product of the dimensions after it
    helper = swift[swift.index("static func paletteAxis(") :]
    helper = helper[: helper.index("\n    }\n")]
    assert "guard let value = value else { return 0 }" in helper
    assert "guard let axis = value as? Int, axis >= 0, axis < rank else { return -1 }" in helper
    assert 'rec.axis = Self.paletteAxis(record["axis"], rank: shape.count)' in swift
    assert "rec.axis_len = UInt64(rec.axis > 0 ? shape[Int(rec.axis)] : 0)" in swift
    assert "rec.axis_inner = UInt64(rec.axis > 0 ? shape[(Int(rec.axis) + 1)...].reduce(1, *) : 0)" in swift
