"""Symbolic dimensions on the xla target (issue 12 item 3).

Each model is built here and exported as an xla bundle with its symbolic dimensions; the bundle
runs at two different sizes and is checked against ONNX Runtime. A model that jax cannot lower
symbolically is exported with the static shapes that ``--input-shape`` fixes (saying so on
stderr, in the manifest and in xla.json), or refused with exit 2 naming the node.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.bundle import load_bundle
from mconv.errors import InputError
from mconv.targets import get_target
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
I64 = TensorProto.INT64
INT64_MAX = np.iinfo(np.int64).max


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _out(name):
    return onnx.ValueInfoProto(name=name)


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _export(proto, out: Path, options=None):
    bundle = get_target("xla").export(ir.serde.deserialize_model(proto), out, options or {})
    return bundle, get_target("xla").load(load_bundle(out))


def _check_sizes(proto, tmp_path, make_feeds, sizes, *, rtol=1e-5, atol=1e-6):
    """Export once with symbolic dimensions, run at each size, compare with ONNX Runtime."""
    bundle, runner = _export(proto, tmp_path / "b")
    assert "static_fallback" not in bundle.manifest["options"]
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = set()
    for size in sizes:
        feeds = make_feeds(size)
        want = sess.run(None, feeds)
        got = runner.run(feeds)
        for o, w in zip(sess.get_outputs(), want):
            assert got[o.name].shape == w.shape, (o.name, size)
            np.testing.assert_allclose(got[o.name], w, rtol=rtol, atol=atol)
        shapes.add(want[0].shape)
    assert len(shapes) == len(sizes)  # the sizes really differ at the output
    return bundle


def test_slice_with_huge_ends_on_a_symbolic_axis_then_sub_with_a_batch_column(tmp_path):
    # Slice ends of INT64_MAX and 1e9 gave min(b, 1000000000), which Sub refused against (b, 1).
    nodes = [
        helper.make_node("Slice", ["x", "s0", "e_max", "ax0"], ["a"]),
        helper.make_node("Slice", ["a", "s0", "e_1e9", "ax0"], ["c"]),
        helper.make_node("Slice", ["c", "s_neg", "e_max", "ax1"], ["d"]),  # -INT64_MAX on axis 1
        helper.make_node("Sub", ["d", "z"], ["y"]),
    ]
    inits = [
        _i64("s0", [0]),
        _i64("s_neg", [-INT64_MAX]),
        _i64("e_max", [INT64_MAX]),
        _i64("e_1e9", [1_000_000_000]),
        _i64("ax0", [0]),
        _i64("ax1", [1]),
    ]
    proto = _model(nodes, [_vi("x", ["b", 512]), _vi("z", ["b", 1])], [_out("y")], inits)

    def feeds(n):
        rng = np.random.default_rng(n)
        return {
            "x": rng.standard_normal((n, 512)).astype(np.float32),
            "z": rng.standard_normal((n, 1)).astype(np.float32),
        }

    bundle = _check_sizes(proto, tmp_path, feeds, (2, 5))
    assert bundle.manifest["outputs"][0]["shape"] == ["b", 512]


def test_reverse_slices_on_a_symbolic_axis(tmp_path):
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "ax", "step"], ["y"]),
        helper.make_node("Slice", ["x", "st2", "en2", "ax", "step2"], ["w"]),
    ]
    inits = [
        _i64("st", [INT64_MAX]),
        _i64("en", [-INT64_MAX]),
        _i64("ax", [1]),
        _i64("step", [-1]),
        _i64("st2", [1]),
        _i64("en2", [INT64_MAX]),
        _i64("step2", [2]),
    ]
    proto = _model(nodes, [_vi("x", [3, "t"])], [_out("y"), _out("w")], inits)

    def feeds(n):
        return {"x": np.random.default_rng(n).standard_normal((3, n)).astype(np.float32)}

    _check_sizes(proto, tmp_path, feeds, (7, 12))


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_along_a_symbolic_axis(tmp_path, mode):
    # silero-vad's STFT pads its audio with mode=reflect along the (symbolic) sample axis.
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)]
    proto = _model(nodes, [_vi("x", [1, 2, "t"])], [_out("y")], [_i64("pads", [0, 0, 3, 0, 1, 5])])

    def feeds(n):
        return {"x": np.random.default_rng(n).standard_normal((1, 2, n)).astype(np.float32)}

    bundle = _check_sizes(proto, tmp_path, feeds, (9, 16))
    assert bundle.manifest["outputs"][0]["shape"][1:] == [3, "t + 8"]


def test_concat_of_shape_derived_sizes(tmp_path):
    # Reshape to [N, T/2, 2] with sizes from Shape arithmetic, then Concat along two axes.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Div", ["t", "two"], ["half"]),
        helper.make_node("Concat", ["n", "half", "two"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Concat", ["r", "r"], ["c2"], axis=2),
        helper.make_node("Slice", ["r", "zero", "big", "one"], ["rs"]),
        helper.make_node("Concat", ["r", "rs", "rs"], ["y"], axis=1),
    ]
    inits = [
        _i64("i0", [0]),
        _i64("i1", [1]),
        _i64("two", [2]),
        _i64("zero", [0]),
        _i64("one", [1]),
        _i64("big", [1_000_000_000]),
    ]
    proto = _model(nodes, [_vi("x", ["N", 12])], [_out("y"), _out("c2")], inits)

    def feeds(n):
        return {"x": np.random.default_rng(n).standard_normal((n, 12)).astype(np.float32)}

    _check_sizes(proto, tmp_path, feeds, (1, 3))


def test_reshape_from_shape_arithmetic(tmp_path):
    # [b, t, 4] -> [b, 4*t] with the target computed from Shape (Mul of two gathered sizes).
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Gather", ["s", "i2"], ["c"], axis=0),
        helper.make_node("Mul", ["t", "c"], ["tc"]),
        helper.make_node("Concat", ["n", "tc"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [_i64("i0", [0]), _i64("i1", [1]), _i64("i2", [2])]
    proto = _model(nodes, [_vi("x", ["b", "t", 4])], [_out("y")], inits)

    def feeds(n):
        return {"x": np.random.default_rng(n).standard_normal((2, n, 4)).astype(np.float32)}

    bundle = _check_sizes(proto, tmp_path, feeds, (3, 8))
    assert bundle.manifest["outputs"][0]["shape"] == ["b", "4*t"]


def test_range_from_a_symbolic_size(tmp_path):
    # Positions 0..T-1 (Range from Shape) added to the input; and a reverse range T-1..0 step -2.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Range", ["zero", "t", "one"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=F),
        helper.make_node("Add", ["x", "posf"], ["y"]),
        helper.make_node("Sub", ["t", "one"], ["last"]),
        helper.make_node("Range", ["last", "minus1", "minus2"], ["rev"]),
    ]
    inits = [
        numpy_helper.from_array(np.int64(1), "i1"),
        numpy_helper.from_array(np.int64(0), "zero"),
        numpy_helper.from_array(np.int64(1), "one"),
        numpy_helper.from_array(np.int64(-1), "minus1"),
        numpy_helper.from_array(np.int64(-2), "minus2"),
    ]
    proto = _model(nodes, [_vi("x", [2, "t"])], [_out("y"), _out("rev")], inits)

    def feeds(n):
        return {"x": np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)}

    _check_sizes(proto, tmp_path, feeds, (5, 8))


def test_expand_to_a_shape_taken_from_another_input(tmp_path):
    nodes = [
        helper.make_node("Shape", ["y"], ["s"]),
        helper.make_node("Expand", ["x", "s"], ["e"]),
        helper.make_node("Mul", ["e", "y"], ["out"]),
    ]
    proto = _model(nodes, [_vi("x", [4, 1, "t"]), _vi("y", [4, "c", "t"])], [_out("out")])

    def feeds(n):
        rng = np.random.default_rng(n)
        return {
            "x": rng.standard_normal((4, 1, n)).astype(np.float32),
            "y": rng.standard_normal((4, n - 1, n)).astype(np.float32),
        }

    _check_sizes(proto, tmp_path, feeds, (4, 6))


def test_pools_along_symbolic_axes(tmp_path):
    # Floor-mode pools (the pads' divisor mask built in the program) along symbolic H and W.
    nodes = [
        helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node(
            "AveragePool", ["x"], ["c"], kernel_shape=[3, 3], pads=[1, 0, 1, 2], count_include_pad=1
        ),
    ]
    proto = _model(nodes, [_vi("x", ["N", 2, "H", "W"])], [_out("a"), _out("m"), _out("c")])

    def feeds(n):
        return {"x": np.random.default_rng(n).standard_normal((1, 2, n, n + 3)).astype(np.float32)}

    _check_sizes(proto, tmp_path, feeds, (7, 10))


def _size_test_model(axis: int) -> onnx.ModelProto:
    """``if x.shape[axis] == 1: squeeze(axis)`` as torch exports it (silero-vad has one on its
    encoded length): only a static size decides it."""
    then = helper.make_graph(
        [helper.make_node("Squeeze", ["x", "ax"], ["t_out"])], "then", [], [_vi("t_out", None)]
    )
    other = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "ax"], ["e_out"], keepdims=0)], "else", [], [_vi("e_out", None)]
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i"], ["t"], axis=0),
        helper.make_node("Equal", ["t", "one"], ["cond"], name="is_one"),
        helper.make_node("If", ["cond"], ["y"], name="size_if", then_branch=then, else_branch=other),
    ]
    inits = [numpy_helper.from_array(np.int64(axis), "i"), _i64("one", [1]), _i64("ax", [axis])]
    return _model(nodes, [_vi("x", ["b", 4, "t"])], [_out("y")], inits)


def test_a_size_test_on_a_symbolic_axis_is_refused_naming_the_node_and_input_shape():
    # jax's `t == 1` answers False when it cannot decide: lowering it would pick a branch.
    with pytest.raises(InputError) as err:
        get_target("xla").export(ir.serde.deserialize_model(_size_test_model(2)), "/nonexistent/out", {})
    line = err.value.line()
    assert err.value.exit_code == 2 and "is_one" in line and "--input-shape" in line
    assert "x [?,4,?]" in line


def test_static_fallback_for_the_shapes_given(tmp_path, capsys):
    from mconv.edit.input_shapes import fix_input_shapes

    proto = _size_test_model(0)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        model = ir.serde.deserialize_model(proto)
        fix_input_shapes(model, {"x": [n, 4, 6]})
        out = tmp_path / f"n{n}"
        bundle = get_target("xla").export(model, out, {})
        x = np.random.default_rng(n).standard_normal((n, 4, 6)).astype(np.float32)
        runner = get_target("xla").load(load_bundle(out))
        np.testing.assert_allclose(runner.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-6)
        if n == 3:  # a batch of 3 is static as given: nothing symbolic, no fallback
            assert "static_fallback" not in bundle.manifest["options"]
            continue
        # batch 1 becomes the symbolic b, where `b == 1` is undecided: exported static instead.
        note = bundle.manifest["options"]["static_fallback"]
        assert note.startswith("xla: exported with static shapes x=[1,4,6]") and "is_one" in note
        assert json.loads((out / "xla.json").read_text())["static_fallback"] == note
        assert note in capsys.readouterr().err
        assert bundle.manifest["inputs"][0]["shape"] == [1, 4, 6]


def test_unnamed_and_negative_dimensions_are_separate_symbols(tmp_path):
    # '?' dim_params and -1 sizes (rapidocr's models) were one invalid symbol '_' (exit 3).
    proto = _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceMean", ["r"], ["y"], axes=[2, 3])],
        [_vi("x", [-1, 3, "?", "?"])],
        [_out("y")],
    )
    bundle, runner = _export(proto, tmp_path / "b")
    assert bundle.manifest["inputs"][0]["shape"] == ["b", 3, "d0_2", "d0_3"]
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(runner.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5)


def test_a_batch_symbol_on_another_inputs_inner_axis_is_the_batch(tmp_path):
    # silero-vad: input [batch, sequence] and state [2, batch, 128] share one batch.
    nodes = [
        helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=0),
        helper.make_node("Add", ["state", "s"], ["y"]),
    ]
    proto = _model(
        nodes,
        [_vi("x", ["batch", "sequence", 1]), _vi("state", [2, "batch", 1])],
        [_out("y")],
        [_i64("ax", [1])],
        opset=13,
    )
    bundle, _ = _export(proto, tmp_path / "b")
    assert [i["shape"] for i in bundle.manifest["inputs"]] == [["b", "sequence", 1], [2, "b", 1]]


def test_cli_export_input_shape_falls_back_and_refuses_without(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    runner = CliRunner()
    length = tmp_path / "length.onnx"
    onnx.save(_size_test_model(2), length)
    bad = runner.invoke(app, ["export", str(length), "-o", str(tmp_path / "no"), "--target", "xla"])
    assert bad.exit_code == 2, bad.output
    assert "is_one" in bad.output and "--input-shape" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "no").exists()
    batch = tmp_path / "batch.onnx"
    onnx.save(_size_test_model(0), batch)
    args = ["export", str(batch), "-o", str(tmp_path / "yes"), "--target", "xla", "--input-shape", "x=1,4,6"]
    ok = runner.invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert "exported with static shapes x=[1,4,6]" in ok.output
    manifest = json.loads((tmp_path / "yes" / "manifest.json").read_text())
    assert manifest["options"]["static_fallback"].startswith("xla: exported with static shapes")
