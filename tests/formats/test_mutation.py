"""Hypothesis-driven mutation of valid files for the formats without a hostile suite of their own.

Every mutated file (a flipped byte, a truncation, inserted junk) must either import or raise one
``InputError`` (exit 2 at the CLI): never another exception type, never a crash. Keras, Caffe,
TFLite and TF checkpoints have their own mutation tests beside their corpora.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mconv.errors import InputError
from mconv.formats import import_model
from onnx import TensorProto, helper, numpy_helper


def _onnx_bytes() -> bytes:
    w = np.arange(2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3) / 10
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
            helper.make_node("Relu", ["c"], ["y"], name="r"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _dlk_bytes() -> bytes:
    doc = {
        "name": "tiny",
        "layer": [
            {"name": "data", "type": "Input", "input_param": {"shape": [{"dim": [1, 1, 6, 6]}]}},
            {
                "name": "conv1",
                "type": "Convolution",
                "bottom": ["data"],
                "top": ["conv1"],
                "convolution_param": {"num_output": 2, "kernel_size": [3], "stride": [1], "pad": [0]},
                "blobs": [
                    {"shape": {"dim": [2, 1, 3, 3]}, "data": [0.1 * i for i in range(18)]},
                    {"shape": {"dim": [2]}, "data": [0.0, 0.5]},
                ],
            },
            {"name": "relu1", "type": "ReLU", "bottom": ["conv1"], "top": ["conv1"]},
            {
                "name": "pool1",
                "type": "Pooling",
                "bottom": ["conv1"],
                "top": ["pool1"],
                "pooling_param": {"pool": 0, "kernel_size": 2, "stride": 2},
            },
        ],
    }
    return json.dumps(doc).encode()


def _safetensors_bytes() -> bytes:
    from safetensors.numpy import save

    return save({"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.float16)})


def _npz_bytes(tmp: Path) -> bytes:
    np.savez(tmp / "w.npz", a=np.arange(12, dtype=np.float32).reshape(3, 4), b=np.ones(5, np.int64))
    return (tmp / "w.npz").read_bytes()


@pytest.mark.parametrize(
    "fmt,suffix", [("onnx", ".onnx"), ("dlk-json", ".json"), ("safetensors", ".safetensors"), ("npz", ".npz")]
)
def test_mutated_files_import_or_raise_one_input_error(tmp_path_factory, fmt, suffix):
    base = tmp_path_factory.mktemp("base")
    good = {"onnx": _onnx_bytes, "dlk-json": _dlk_bytes, "safetensors": _safetensors_bytes}.get(fmt)
    data = good() if good else _npz_bytes(base)
    (base / f"ok{suffix}").write_bytes(data)
    import_model([base / f"ok{suffix}"])  # the unmutated file imports

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        kind=st.sampled_from(["flip", "cut", "insert"]),
        pos=st.integers(0, 10**6),
        junk=st.binary(min_size=1, max_size=8),
    )
    def check(kind, pos, junk):
        b = bytearray(data)
        p = pos % len(b)
        if kind == "flip":
            b[p] ^= junk[0] or 0xFF
        elif kind == "cut":
            del b[p:]
        else:
            b[p:p] = junk
        path = tmp_path_factory.mktemp("m") / f"mutant{suffix}"
        path.write_bytes(bytes(b))
        try:
            import_model([path])
        except InputError as exc:
            assert "\n" not in exc.line()

    check()


def test_mutated_torchscript_archives_import_or_raise_one_input_error(tmp_path_factory):
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.relu(self.fc(x))

    base = tmp_path_factory.mktemp("torch")
    torch.jit.save(torch.jit.script(Tiny()), base / "m.pt")
    data = (base / "m.pt").read_bytes()
    options = {"input_shapes": {"x": [1, 4]}}

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(cut=st.booleans(), pos=st.integers(0, 10**6), byte=st.integers(1, 255))
    def check(cut, pos, byte):
        b = bytearray(data)
        p = pos % len(b)
        if cut:
            del b[p:]
        else:
            b[p] ^= byte
        path = tmp_path_factory.mktemp("m") / "mutant.pt"
        path.write_bytes(bytes(b))
        try:
            import_model([path], options=options)
        except InputError as exc:
            assert "\n" not in exc.line()

    check()
