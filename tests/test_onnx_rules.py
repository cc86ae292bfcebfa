"""ONNX semantics read from one place (mconv.onnx_rules): the defaults are onnx.defs', the
softmax axis rule is the opset-13 one."""

from __future__ import annotations

import onnx.defs
import pytest
from mconv.onnx_rules import DEFAULTS, attr, softmax_axes


@pytest.mark.parametrize(("op", "name"), sorted(DEFAULTS))
def test_every_default_is_the_one_onnx_defs_declares(op, name):
    declared = onnx.defs.get_schema(op).attributes[name].default_value
    assert DEFAULTS[op, name] == pytest.approx(declared.f, rel=1e-7)


def test_attr_reads_the_node_then_the_default():
    assert attr({"alpha": 0.3}, "LeakyRelu", "alpha") == 0.3
    assert attr({}, "LeakyRelu", "alpha") == 0.01


def test_softmax_axes_before_and_from_opset_13():
    assert softmax_axes(4, None, 11) == (1, 2, 3)
    assert softmax_axes(4, -1, 11) == (3,)
    assert softmax_axes(4, None, 13) == (3,)
    assert softmax_axes(4, 1, 13) == (1,)
