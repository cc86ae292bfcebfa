"""ONNX Runtime's quantized ops (dynamic, QOperator) and the com.microsoft contrib ops on the webgpu
target (wgpu on lavapipe in CI), each checked against ONNX Runtime on the metal tests' one-node
models (codes within one step, exact integer products equal, floats within a relative bound),
and ORT's own static quantized conv nets exported through the CLI and passed by ``mconv
verify``. The webgpu target has no recurrent kernels: DynamicQuantizeLSTM (and the dynamic
CRNN that carries it) is refused by name, in one line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnx
import pytest
from mconv.cli.app import app
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from test_webgpu import needs_adapter  # noqa: E402

_SPEC = importlib.util.spec_from_file_location(
    "metal_quantized_models", Path(__file__).resolve().parents[1] / "metal" / "test_quantized_models.py"
)
assert _SPEC is not None and _SPEC.loader is not None
shared = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(shared)

pytestmark = needs_adapter


@pytest.mark.parametrize("case", shared.CASES, ids=[c[0] for c in shared.CASES])
def test_one_node_matches_ort(case, tmp_path):
    shared.check_case("webgpu", case, tmp_path)


def test_integer_product_at_the_exact_bound_is_exact(tmp_path):
    import numpy as np
    from mconv.irio import from_proto
    from mconv.targets import get_target

    k = 2**24 // (255 * 128)
    model, a, want = shared.bound_case()
    got = get_target("webgpu").load_model(from_proto(model)).run({"in0": a})["out0"]
    assert got.dtype == np.int32 and int(np.abs(want).max()) == k * 255 * 128
    np.testing.assert_array_equal(got, want)


MODELS = [("dwcnn", "qdq"), ("dwcnn", "qop"), ("branchy", "qop"), ("mlp", "dynamic")]


@pytest.mark.parametrize("kind,mode", MODELS, ids=[f"{k}-{m}" for k, m in MODELS])
def test_ort_quantized_model_exports_and_verifies(kind, mode, tmp_path):
    shared.export_and_verify("webgpu", kind, mode, tmp_path)


def test_dynamic_crnn_is_refused_by_name(tmp_path):
    q = shared._ort_quantized()
    qpath = q._quantize("crnn", "dynamic", tmp_path)
    before = qpath.read_bytes()
    out = tmp_path / "bundle"
    r = CliRunner().invoke(app, ["export", str(qpath), "--target", "webgpu", "-o", str(out), "-q"])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "DynamicQuantizeLSTM" in lines[0], r.output
    # everything else of the CRNN lowered: the LSTM is the only node named
    assert "ConvInteger" not in lines[0] and "MatMulInteger" not in lines[0]
    assert not out.exists() and qpath.read_bytes() == before
    assert "DynamicQuantizeLSTM" in {n.op_type for n in onnx.load(qpath).graph.node}
