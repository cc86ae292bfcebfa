"""xla target: 4-bit DequantizeLinear codes are weight arguments stored by the container (a
16-value palette), not constants serialised a byte each into both program files."""

from __future__ import annotations

import json
import os

import mconv.api as api
import numpy as np
import onnx
import pytest
from mconv.container import Container
from onnx import TensorProto, helper, numpy_helper


@pytest.mark.parametrize("sym", [True, False])
def test_int4_codes_are_stored_packed_in_the_container_and_run_exactly(tmp_path, sym):
    rng = np.random.default_rng(60)
    w = (rng.standard_normal((256, 512)) * 0.05).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 512])],
        [numpy_helper.from_array(w, "W")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    q = str(tmp_path / "q.onnx")
    api.optimize(
        str(tmp_path / "m.onnx"), passes=f"blockwise(bits=4,block=32,sym={str(sym).lower()})", output=q
    )
    out = tmp_path / "xla"
    api.export(q, "xla", str(out))
    files = {f: os.path.getsize(out / f) for f in os.listdir(out)}
    # the codes: 131,072 of them, at most 4 bits each in the container; the programs hold none
    assert files["model.jax_export"] < 20_000 and files["model.mlirbc"] < 20_000, files
    assert sum(files.values()) < 131_072 * 0.5 + 16_384 + 40_000, files
    conv = json.loads((out / "xla.json").read_text())
    codes = [a for a in conv["weight_args"] if a["dtype"] in ("int8", "uint8") and a["shape"] == [256, 512]]
    assert len(codes) == 1  # (asymmetric: the 4-bit zero points are arguments too)
    container = Container((out / "weights.mcw").read_bytes(), "weights.mcw")
    assert container.record(codes[0]["name"])["codec"] == "palette"
    x = rng.standard_normal((3, 256)).astype(np.float32)
    got = api.run(str(out), {"x": x}).outputs["y"]
    want = api.run(q, {"x": x}, target="reference").outputs["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
