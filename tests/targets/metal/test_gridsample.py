"""GridSample through the C++ harness against the reference executor (opsets 16, 20 and 22).

One graph per case holds a GridSample per mode x padding_mode, all reading one grid computed in
the graph (a Concat of its x and y planes, ``metal_models.gridsample_model``). The grids mix
random points in and around [-1, 1], points far outside and points exactly on pixel centres and
pixel edges (nearest's half-to-even ties); the sizes make those exact in f32 (4 and 8 without
align_corners, 5 and 9 with it). fp32 storage must agree within 1e-5; fp16 storage as the other
op tests (cosine and 2% of the scale).
"""

from __future__ import annotations

import numpy as np
import pytest
from mconv.errors import UnsupportedError
from mconv.targets.metal import TARGET
from mconv.targets.reference import ReferenceRunner
from metal_models import (
    assert_f32_close,
    assert_fp16_close,
    gridsample_feeds,
    gridsample_model,
    make_model,
    needs_cxx,
)
from onnx import helper

pytestmark = needs_cxx


def run_both(model, feeds, tmp_path, precision="fp32"):
    runner = TARGET.load(TARGET.export(model, tmp_path / f"b_{precision}", {"precision": precision}))
    return runner, runner.run(feeds), ReferenceRunner(model).run(feeds)


@pytest.mark.parametrize("opset", [16, 20, 22])
@pytest.mark.parametrize("align", [False, True])
def test_every_mode_and_padding_matches_the_reference(tmp_path, opset, align):
    rng = np.random.default_rng(100 + opset + align)
    size, out = ([5, 9] if align else [4, 8]), [6, 7]
    model, outs = gridsample_model(opset, align, size, out)
    runner, got, ref = run_both(model, gridsample_feeds(rng, align, size, out), tmp_path)
    assert [layer.op for layer in runner.plan.layers].count("GridSample") == len(outs) == 9
    assert_f32_close(got, ref)
    # the cases differ where they must: padding outside [-1, 1], and the modes
    assert not np.allclose(ref[outs[0]], ref[outs[1]]) and not np.allclose(ref[outs[0]], ref[outs[3]])


@pytest.mark.parametrize("size, out", [([8], [29]), ([2, 4, 8], [3, 2, 5])], ids=["3d", "5d"])
def test_3d_and_5d_inputs_match_the_reference(tmp_path, size, out):
    rng = np.random.default_rng(7 + len(size))
    model, _ = gridsample_model(20, False, size, out, batch=1)
    _, got, ref = run_both(model, gridsample_feeds(rng, False, size, out, batch=1), tmp_path)
    assert_f32_close(got, ref)


def test_fp16_storage_stays_close(tmp_path):
    rng = np.random.default_rng(31)
    model, outs = gridsample_model(20, True, [5, 9], [6, 6], modes=("linear", "cubic"), batch=1)
    _, got, ref = run_both(model, gridsample_feeds(rng, True, [5, 9], [6, 6], batch=1), tmp_path, "fp16")
    for name in outs:
        assert_fp16_close(ref[name], got[name])


def test_a_6d_input_is_refused_by_name(tmp_path):
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], name="volume6d")
    model = make_model([node], [("x", [1, 1, 2, 2, 2, 2]), ("grid", [1, 2, 2, 2, 2, 4])], ["y"], {}, 20)
    with pytest.raises(UnsupportedError) as exc:
        TARGET.export(model, tmp_path / "b", {"precision": "fp32"})
    line = exc.value.line()
    assert "\n" not in line
    assert "volume6d (GridSample: 6-D input (kernels for 3-D to 5-D))" in line
