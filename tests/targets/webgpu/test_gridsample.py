"""GridSample on a real WebGPU device (lavapipe in CI) against the reference executor.

The cases are the Metal target's (``tests/targets/metal/test_gridsample.py``, builders in
``metal_models``): a GridSample per mode x padding_mode over one grid computed in the graph,
with pixel centres, pixel edges, far-outside points and random ones; fp32 within 1e-5.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.errors import UnsupportedError
from mconv.targets import get_target

sys.path.insert(0, str(Path(__file__).parent))
from test_webgpu import needs_adapter  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "metal"))
from metal_models import assert_f32_close, gridsample_feeds, gridsample_model, make_model  # noqa: E402
from onnx import helper  # noqa: E402


def run_both(model, feeds, tmp_path):
    target = get_target("webgpu")
    runner = target.load(target.export(model, tmp_path / "bundle", {"precision": "fp32"}))
    return runner, runner.run(feeds), get_target("reference").load_model(model).run(feeds)


@needs_adapter
@pytest.mark.parametrize("opset", [16, 20, 22])
@pytest.mark.parametrize("align", [False, True])
def test_every_mode_and_padding_matches_the_reference(tmp_path, opset, align):
    rng = np.random.default_rng(200 + opset + align)
    size, out = ([5, 9] if align else [4, 8]), [6, 7]
    model, outs = gridsample_model(opset, align, size, out)
    runner, got, ref = run_both(model, gridsample_feeds(rng, align, size, out), tmp_path)
    assert [layer.op for layer in runner.plan.layers].count("GridSample") == len(outs) == 9
    assert_f32_close(got, ref)
    assert not np.allclose(ref[outs[0]], ref[outs[1]]) and not np.allclose(ref[outs[0]], ref[outs[3]])


@needs_adapter
@pytest.mark.parametrize("size, out", [([8], [29]), ([2, 4, 8], [3, 2, 5])], ids=["3d", "5d"])
def test_3d_and_5d_inputs_match_the_reference(tmp_path, size, out):
    rng = np.random.default_rng(17 + len(size))
    model, _ = gridsample_model(20, False, size, out, batch=1)
    _, got, ref = run_both(model, gridsample_feeds(rng, False, size, out, batch=1), tmp_path)
    assert_f32_close(got, ref)


def test_a_6d_input_is_refused_by_name(tmp_path):
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], name="volume6d")
    model = make_model([node], [("x", [1, 1, 2, 2, 2, 2]), ("grid", [1, 2, 2, 2, 2, 4])], ["y"], {}, 20)
    with pytest.raises(UnsupportedError) as exc:
        get_target("webgpu").export(model, tmp_path / "b", {})
    line = exc.value.line()
    assert "\n" not in line
    assert "volume6d (GridSample: 6-D input (kernels for 3-D to 5-D))" in line
