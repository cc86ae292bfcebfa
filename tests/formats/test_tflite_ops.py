"""TFLite builtin ops one by one against the LiteRT interpreter (the oracle), through ONNX Runtime and
the reference executor: each case builds a one- or two-op model here (tflite_builder), runs it on
LiteRT's reference kernels and on the imported ONNX graph, and compares every output (floats within
rtol 1e-5 / atol 1e-5, integers and booleans exactly). Also: the ordering/aliasing rules of the
reader, quantized activations as Q/DQ pairs, and the real models that needed these ops."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ai_edge_litert.interpreter as litert  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from mconv.engines.reference.executor import Executor  # noqa: E402
from mconv.errors import InputError, UnsupportedError  # noqa: E402
from mconv.formats.tflite.reader import load_tflite_bytes  # noqa: E402
from mconv.irio import to_proto  # noqa: E402
from tflite_builder import TflBuilder  # noqa: E402

F32 = np.float32


def _litert(data: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    # LiteRT's builtin kernels without the XNNPACK delegate. (Its BUILTIN_REF resolver lacks CEIL
    # and BROADCAST_TO, and its reference LRN does not follow TF's formula, which the builtin does.)
    it = litert.Interpreter(
        model_content=data,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def _run_imported(data: bytes, feeds: list[np.ndarray], options: dict | None = None):
    model = load_tflite_bytes(data, "case.tflite", options)
    proto = to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    named = {i.name: x for i, x in zip(sess.get_inputs(), feeds, strict=True)}
    got_ort = sess.run(None, named)
    got_ref = [np.asarray(v) for v in Executor(model).run(named).values()]
    return model, got_ort, got_ref


def _check(data: bytes, feeds: list[np.ndarray], rtol: float = 1e-5, atol: float = 1e-5) -> None:
    expected = _litert(data, feeds)
    _, got_ort, got_ref = _run_imported(data, feeds)
    assert len(got_ort) == len(expected)
    for e, g, r in zip(expected, got_ort, got_ref, strict=True):
        for got in (g, r):
            assert got.shape == e.shape, (got.shape, e.shape)
            if e.dtype.kind == "f":
                np.testing.assert_allclose(got, e, rtol=rtol, atol=atol)
            else:
                assert got.dtype == e.dtype, (got.dtype, e.dtype)
                np.testing.assert_array_equal(got, e)


def _one_op(code, in_specs, out_specs, options=None, consts=(), **fields):
    """A model of one op: ``in_specs`` (shape, dtype) are graph inputs, ``consts`` constant inputs
    (inserted at their slot: (slot, array)), ``out_specs`` (shape, dtype) the outputs."""
    b = TflBuilder()
    ins = [b.tensor(f"in{k}", s, d) for k, (s, d) in enumerate(in_specs)]
    slots = list(ins)
    for slot, arr in consts:
        slots.insert(slot, -1 if arr is None else b.const(f"c{slot}", np.asarray(arr)))
    outs = [b.tensor(f"out{k}", s, d) for k, (s, d) in enumerate(out_specs)]
    b.op(code, slots, outs, options, **fields)
    return b.build(ins, outs)


# ------------------------------------------------------------------------------ elementwise

UNARY = [
    ("NEG", None, {}, "any"),
    ("ABS", None, {}, "any"),
    ("EXP", None, {}, "any"),
    ("LOG", None, {}, "pos"),
    ("SQRT", None, {}, "pos"),
    ("RSQRT", None, {}, "pos"),
    ("SQUARE", None, {}, "any"),
    ("SIN", None, {}, "any"),
    ("COS", None, {}, "any"),
    ("FLOOR", None, {}, "any"),
    ("CEIL", None, {}, "any"),
    ("ROUND", None, {}, "halves"),
    ("HARD_SWISH", None, {}, "wide"),
    ("ELU", None, {}, "any"),
    ("LOGISTIC", None, {}, "any"),
    ("TANH", None, {}, "any"),
    ("RELU", None, {}, "any"),
    ("RELU6", None, {}, "wide"),
    ("LEAKY_RELU", "LeakyReluOptions", {"Alpha": 0.125}, "any"),
    ("GELU", "GeluOptions", {"Approximate": False}, "wide"),
    ("GELU", "GeluOptions", {"Approximate": True}, "wide"),
    ("LOG_SOFTMAX", "LogSoftmaxOptions", {}, "wide"),
    ("L2_NORMALIZATION", "L2NormOptions", {}, "any"),
]


def _draw(rng, shape, kind: str) -> np.ndarray:
    if kind == "pos":
        return rng.uniform(0.05, 4.0, shape).astype(F32)
    if kind == "halves":  # exact .5 ties: TFLite and ONNX both round half to even
        return (rng.integers(-8, 8, shape) + 0.5 * rng.integers(0, 2, shape)).astype(F32)
    if kind == "wide":
        return rng.uniform(-8, 8, shape).astype(F32)
    return rng.normal(0, 1.5, shape).astype(F32)


@pytest.mark.parametrize("code,options,fields,kind", UNARY, ids=[f"{u[0]}-{u[2]}" for u in UNARY])
def test_unary_op_matches_litert(code, options, fields, kind):
    rng = np.random.default_rng(11)
    shape = [2, 3, 5]
    data = _one_op(code, [(shape, F32)], [(shape, F32)], options, **fields)
    _check(data, [_draw(rng, shape, kind)])


BINARY = [
    ("SQUARED_DIFFERENCE", None, F32),
    ("POW", None, F32),
    ("MAXIMUM", None, F32),
    ("MINIMUM", None, F32),
    ("FLOOR_DIV", None, F32),
    ("FLOOR_DIV", None, np.int32),
    ("FLOOR_MOD", None, F32),
    ("FLOOR_MOD", None, np.int32),
    ("ADD", "AddOptions", F32),
    ("SUB", "SubOptions", F32),
    ("MUL", "MulOptions", F32),
    ("DIV", "DivOptions", F32),
]


@pytest.mark.parametrize("code,options,dtype", BINARY, ids=[f"{c}-{np.dtype(d).name}" for c, _, d in BINARY])
def test_binary_op_with_broadcast_matches_litert(code, options, dtype):
    rng = np.random.default_rng(12)
    if dtype == np.int32:
        a = rng.integers(-20, 20, (2, 3, 4)).astype(np.int32)
        b = rng.choice([-7, -3, -2, 2, 3, 5], (1, 3, 1)).astype(np.int32)
    elif code == "POW":
        a, b = rng.uniform(0.1, 3, (2, 3, 4)).astype(F32), rng.uniform(-2, 2, (1, 3, 1)).astype(F32)
    else:
        a = rng.normal(0, 3, (2, 3, 4)).astype(F32)
        b = (rng.choice([-1, 1], (1, 3, 1)) * rng.uniform(0.5, 2, (1, 3, 1))).astype(F32)
    data = _one_op(code, [((2, 3, 4), dtype), ((1, 3, 1), dtype)], [((2, 3, 4), dtype)], options)
    _check(data, [a, b])


@pytest.mark.parametrize("code", ["EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"])
def test_comparison_matches_litert(code):
    rng = np.random.default_rng(13)
    a = rng.integers(-2, 3, (3, 4)).astype(F32)
    b = rng.integers(-2, 3, (1, 4)).astype(F32)
    _check(_one_op(code, [((3, 4), F32), ((1, 4), F32)], [((3, 4), np.bool_)]), [a, b])


@pytest.mark.parametrize("code", ["LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT"])
def test_logical_ops_match_litert(code):
    rng = np.random.default_rng(14)
    a, b = rng.integers(0, 2, (3, 4)).astype(bool), rng.integers(0, 2, (3, 4)).astype(bool)
    n = 1 if code == "LOGICAL_NOT" else 2
    data = _one_op(code, [((3, 4), np.bool_)] * n, [((3, 4), np.bool_)])
    _check(data, [a, b][:n])


@pytest.mark.parametrize("code", ["SELECT", "SELECT_V2"])
def test_select_matches_litert(code):
    rng = np.random.default_rng(15)
    cond = rng.integers(0, 2, (2, 3, 4)).astype(bool)
    x, y = rng.normal(size=(2, 3, 4)).astype(F32), rng.normal(size=(2, 3, 4)).astype(F32)
    data = _one_op(code, [((2, 3, 4), np.bool_), ((2, 3, 4), F32), ((2, 3, 4), F32)], [((2, 3, 4), F32)])
    _check(data, [cond, x, y])


def test_select_v1_with_a_vector_condition_picks_rows_like_litert():
    rng = np.random.default_rng(16)
    cond = np.array([True, False, True])
    x, y = rng.normal(size=(3, 4)).astype(F32), rng.normal(size=(3, 4)).astype(F32)
    data = _one_op("SELECT", [((3,), np.bool_), ((3, 4), F32), ((3, 4), F32)], [((3, 4), F32)])
    _check(data, [cond, x, y])


def test_add_n_prelu_and_cast_match_litert():
    rng = np.random.default_rng(17)
    xs = [rng.normal(size=(2, 4)).astype(F32) for _ in range(3)]
    _check(_one_op("ADD_N", [((2, 4), F32)] * 3, [((2, 4), F32)]), xs)
    alpha = rng.uniform(0.05, 0.5, (1, 1, 3)).astype(F32)
    data = _one_op("PRELU", [((1, 2, 2, 3), F32)], [((1, 2, 2, 3), F32)], consts=[(1, alpha)])
    _check(data, [rng.normal(size=(1, 2, 2, 3)).astype(F32)])
    x = rng.uniform(-5, 5, (2, 5)).astype(F32)
    _check(_one_op("CAST", [((2, 5), F32)], [((2, 5), np.int32)]), [x])
    _check(_one_op("CAST", [((2, 5), np.int32)], [((2, 5), F32)]), [x.astype(np.int32)])


# ------------------------------------------------------------------------------ reductions


@pytest.mark.parametrize("code", ["SUM", "MEAN", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
@pytest.mark.parametrize("keep", [False, True])
def test_reduction_matches_litert(code, keep):
    rng = np.random.default_rng(18)
    x = rng.uniform(0.5, 1.5, (2, 3, 4)).astype(F32)
    out = (2, 1, 1) if keep else (2,)
    data = _one_op(
        code,
        [((2, 3, 4), F32)],
        [(out, F32)],
        "ReducerOptions",
        consts=[(1, np.array([1, -1], np.int32))],
        KeepDims=keep,
    )
    _check(data, [x])


@pytest.mark.parametrize("code,options", [("ARG_MAX", "ArgMaxOptions"), ("ARG_MIN", "ArgMinOptions")])
def test_arg_max_min_matches_litert(code, options):
    rng = np.random.default_rng(19)
    x = rng.integers(0, 4, (3, 5)).astype(F32)  # ties: the first index wins in both
    data = _one_op(
        code,
        [((3, 5), F32)],
        [((3,), np.int32)],
        options,
        consts=[(1, np.array([1], np.int32))],
        OutputType=2,
    )
    _check(data, [x])


def test_cumsum_and_topk_match_litert():
    rng = np.random.default_rng(20)
    x = rng.normal(size=(2, 6)).astype(F32)
    for ex, rev in ((False, False), (True, True)):
        data = _one_op(
            "CUMSUM",
            [((2, 6), F32)],
            [((2, 6), F32)],
            "CumsumOptions",
            consts=[(1, np.array(1, np.int32))],
            Exclusive=ex,
            Reverse=rev,
        )
        _check(data, [x])
    data = _one_op(
        "TOPK_V2", [((2, 6), F32)], [((2, 3), F32), ((2, 3), np.int32)], consts=[(1, np.array(3, np.int32))]
    )
    _check(data, [x])


# ------------------------------------------------------------------------------ shapes and slicing

STRIDED = [
    # (input shape, begin, end, strides, masks {Begin, End, Ellipsis, NewAxis, ShrinkAxis}, out shape)
    ((4, 6, 5), [1, 0, 0], [3, 6, 5], [1, 2, 1], {}, (2, 3, 5)),
    ((4, 6, 5), [0, 1, 0], [0, -1, 0], [1, 1, 1], {"BeginMask": 0b101, "EndMask": 0b101}, (4, 4, 5)),
    ((4, 6, 5), [-1, 0, 0], [0, 0, 0], [-1, -2, 1], {"EndMask": 0b111, "BeginMask": 0b110}, (4, 3, 5)),
    ((4, 6, 5), [2, 0, 0], [3, 0, 0], [1, 1, 1], {"ShrinkAxisMask": 1, "BeginMask": 6, "EndMask": 6}, (6, 5)),
    ((4, 6, 5), [0, -1], [0, 0], [1, 1], {"BeginMask": 1, "EndMask": 1, "ShrinkAxisMask": 2}, (4, 5)),
    ((4, 6, 5), [0, 1], [0, 4], [1, 2], {"EllipsisMask": 1}, (4, 6, 2)),
    ((4, 6, 5), [1, 0, 0], [3, 0, 5], [1, 1, 1], {"EllipsisMask": 2}, (2, 6, 5)),
    (
        (4, 6, 5),
        [0, 0, 1],
        [0, 0, 3],
        [1, 1, 1],
        {"NewAxisMask": 2, "BeginMask": 1, "EndMask": 1},
        (4, 1, 2, 5),
    ),
    (
        (4, 6, 5),
        [0, 0, -1],
        [0, 0, 0],
        [1, 1, 1],
        {"EllipsisMask": 1, "NewAxisMask": 2, "ShrinkAxisMask": 4},
        (4, 6, 1),
    ),
    ((8,), [-3], [100], [1], {}, (3,)),
    ((8,), [6], [1], [-2], {}, (3,)),
]


@pytest.mark.parametrize("case", STRIDED, ids=[str(i) for i in range(len(STRIDED))])
def test_strided_slice_masks_match_litert(case):
    shape, begin, end, strides, masks, out = case
    rng = np.random.default_rng(21)
    consts = [(1, np.array(begin, np.int32)), (2, np.array(end, np.int32)), (3, np.array(strides, np.int32))]
    data = _one_op(
        "STRIDED_SLICE", [(shape, F32)], [(out, F32)], "StridedSliceOptions", consts=consts, **masks
    )
    _check(data, [rng.normal(size=shape).astype(F32)])


def test_strided_slice_offset_and_of_a_computed_shape_matches_litert():
    # basic-pitch's pattern: SHAPE -> STRIDED_SLICE (shrink) -> PACK -> RESHAPE.
    rng = np.random.default_rng(22)
    b = TflBuilder()
    x = b.tensor("x", [2, 3, 4])
    shp = b.tensor("shape", [3], np.int32)
    b.op("SHAPE", [x], [shp], "ShapeOptions", OutType=2)
    n = b.tensor("n", [], np.int32)
    cs = [b.const(f"k{i}", np.array([v], np.int32)) for i, v in enumerate((0, 1, 1))]
    b.op("STRIDED_SLICE", [shp, *cs], [n], "StridedSliceOptions", ShrinkAxisMask=1)
    minus1 = b.const("minus1", np.array(-1, np.int32))
    packed = b.tensor("packed", [2], np.int32)
    b.op("PACK", [n, minus1], [packed], "PackOptions", ValuesCount=2, Axis=0)
    y = b.tensor("y", [2, 12])
    b.op("RESHAPE", [x, packed], [y])
    z = b.tensor("z", [2, 2])
    cb, ce = b.const("ob", np.array([0, 3], np.int32)), b.const("oe", np.array([2, 2], np.int32))
    b.op(
        "STRIDED_SLICE",
        [y, cb, ce, b.const("os", np.array([1, 1], np.int32))],
        [z],
        "StridedSliceOptions",
        Offset=True,
    )
    _check(b.build([x], [y, z, packed]), [rng.normal(size=(2, 3, 4)).astype(F32)])


def test_slice_squeeze_expand_dims_and_shape_match_litert():
    rng = np.random.default_rng(23)
    x = rng.normal(size=(1, 4, 1, 6)).astype(F32)
    consts = [(1, np.array([0, 1, 0, 2], np.int32)), (2, np.array([-1, 2, 1, -1], np.int32))]
    _check(_one_op("SLICE", [((1, 4, 1, 6), F32)], [((1, 2, 1, 4), F32)], consts=consts), [x])
    _check(_one_op("SQUEEZE", [((1, 4, 1, 6), F32)], [((4, 6), F32)], "SqueezeOptions"), [x])
    data = _one_op("SQUEEZE", [((1, 4, 1, 6), F32)], [((1, 4, 6), F32)], "SqueezeOptions", SqueezeDims=[-2])
    _check(data, [x])
    for axis, out in ((0, (1, 1, 4, 1, 6)), (-1, (1, 4, 1, 6, 1)), (2, (1, 4, 1, 1, 6))):
        data = _one_op(
            "EXPAND_DIMS", [((1, 4, 1, 6), F32)], [(out, F32)], consts=[(1, np.array(axis, np.int32))]
        )
        _check(data, [x])
    _check(_one_op("SHAPE", [((1, 4, 1, 6), F32)], [((4,), np.int32)], "ShapeOptions", OutType=2), [x])


@pytest.mark.parametrize("mode", [0, 1])
def test_mirror_pad_reflect_and_symmetric_match_litert(mode):
    rng = np.random.default_rng(24)
    x = rng.normal(size=(1, 5, 4, 2)).astype(F32)
    pads = (
        np.array([[0, 0], [2, 3], [3, 1], [0, 0]], np.int32)
        if mode == 0
        else np.array([[0, 0], [4, 5], [4, 1], [0, 0]], np.int32)
    )
    out = (1, 5 + pads[1].sum(), 4 + pads[2].sum(), 2)
    data = _one_op(
        "MIRROR_PAD", [((1, 5, 4, 2), F32)], [(out, F32)], "MirrorPadOptions", consts=[(1, pads)], Mode=mode
    )
    _check(data, [x])


def test_split_split_v_pack_unpack_match_litert():
    rng = np.random.default_rng(25)
    x = rng.normal(size=(2, 6, 3)).astype(F32)
    data = _one_op(
        "SPLIT",
        [((2, 6, 3), F32)],
        [((2, 2, 3), F32)] * 3,
        "SplitOptions",
        consts=[(0, np.array(1, np.int32))],
        NumSplits=3,
    )
    _check(data, [x])
    consts = [(1, np.array([1, -1, 2], np.int32)), (2, np.array(-2, np.int32))]
    outs = [((2, 1, 3), F32), ((2, 3, 3), F32), ((2, 2, 3), F32)]
    _check(_one_op("SPLIT_V", [((2, 6, 3), F32)], outs, "SplitVOptions", consts=consts, NumSplits=3), [x])
    ys = [rng.normal(size=(2, 3)).astype(F32) for _ in range(4)]
    for axis, out in ((0, (4, 2, 3)), (1, (2, 4, 3)), (-1, (2, 3, 4))):
        _check(
            _one_op("PACK", [((2, 3), F32)] * 4, [(out, F32)], "PackOptions", ValuesCount=4, Axis=axis), ys
        )
    _check(_one_op("UNPACK", [((2, 6, 3), F32)], [((2, 6), F32)] * 3, "UnpackOptions", Num=3, Axis=-1), [x])


def test_gather_gather_nd_tile_fill_broadcast_and_likes_match_litert():
    rng = np.random.default_rng(26)
    x = rng.normal(size=(4, 5, 3)).astype(F32)
    idx = np.array([[3, 0], [1, 1]], np.int32)
    for axis, out in ((0, (2, 2, 5, 3)), (1, (4, 2, 2, 3))):
        data = _one_op(
            "GATHER", [((4, 5, 3), F32)], [(out, F32)], "GatherOptions", consts=[(1, idx)], Axis=axis
        )
        _check(data, [x])
    nd = np.array([[0, 1], [3, 4], [2, 0]], np.int32)
    _check(_one_op("GATHER_ND", [((4, 5, 3), F32)], [((3, 3), F32)], consts=[(1, nd)]), [x])
    _check(
        _one_op("TILE", [((4, 5, 3), F32)], [((8, 5, 9), F32)], consts=[(1, np.array([2, 1, 3], np.int32))]),
        [x],
    )
    data = _one_op("FILL", [((), F32)], [((2, 3), F32)], consts=[(0, np.array([2, 3], np.int32))])
    _check(data, [np.array(1.5, F32)])
    _check(
        _one_op(
            "BROADCAST_TO", [((5, 1), F32)], [((2, 5, 4), F32)], consts=[(1, np.array([2, 5, 4], np.int32))]
        ),
        [x[0, :, :1]],
    )
    _check(_one_op("ZEROS_LIKE", [((4, 5, 3), F32)], [((4, 5, 3), F32)]), [x])
    b = TflBuilder()
    out = b.tensor("r", [4], np.int32)
    start, limit, delta = (b.const(n, np.array(v, np.int32)) for n, v in (("s", 2), ("l", 10), ("d", 2)))
    b.op("RANGE", [start, limit, delta], [out])
    data = b.build([], [out])
    expected = _litert(data, [])
    _, got_ort, got_ref = _run_imported(data, [])
    np.testing.assert_array_equal(got_ort[0], expected[0])
    np.testing.assert_array_equal(got_ref[0], expected[0])


def test_transpose_reverse_depth_space_and_batch_space_match_litert():
    rng = np.random.default_rng(27)
    x = rng.normal(size=(1, 4, 6, 8)).astype(F32)
    _check(
        _one_op(
            "TRANSPOSE",
            [((1, 4, 6, 8), F32)],
            [((1, 8, 4, 6), F32)],
            consts=[(1, np.array([0, 3, 1, 2], np.int32))],
        ),
        [x],
    )
    _check(
        _one_op(
            "REVERSE_V2", [((1, 4, 6, 8), F32)], [((1, 4, 6, 8), F32)], consts=[(1, np.array([1], np.int32))]
        ),
        [x],
    )
    _check(
        _one_op(
            "DEPTH_TO_SPACE",
            [((1, 4, 6, 8), F32)],
            [((1, 8, 12, 2), F32)],
            "DepthToSpaceOptions",
            BlockSize=2,
        ),
        [x],
    )
    _check(
        _one_op(
            "SPACE_TO_DEPTH",
            [((1, 4, 6, 8), F32)],
            [((1, 2, 3, 32), F32)],
            "SpaceToDepthOptions",
            BlockSize=2,
        ),
        [x],
    )
    block, pads = np.array([2, 3], np.int32), np.array([[1, 1], [0, 3]], np.int32)
    data = _one_op(
        "SPACE_TO_BATCH_ND", [((1, 4, 6, 8), F32)], [((6, 3, 3, 8), F32)], consts=[(1, block), (2, pads)]
    )
    _check(data, [x])
    y = rng.normal(size=(6, 3, 3, 8)).astype(F32)
    data = _one_op(
        "BATCH_TO_SPACE_ND", [((6, 3, 3, 8), F32)], [((1, 4, 6, 8), F32)], consts=[(1, block), (2, pads)]
    )
    _check(data, [y])


@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True), (True, True)])
def test_batch_matmul_with_adjoints_and_broadcast_matches_litert(adj_x, adj_y):
    rng = np.random.default_rng(28)
    a_shape = (2, 3, 5, 4) if adj_x else (2, 3, 4, 5)
    b_shape = (1, 6, 5) if adj_y else (1, 5, 6)
    a, b = rng.normal(size=a_shape).astype(F32), rng.normal(size=b_shape).astype(F32)
    data = _one_op(
        "BATCH_MATMUL",
        [(a_shape, F32), (b_shape, F32)],
        [((2, 3, 4, 6), F32)],
        "BatchMatMulOptions",
        AdjX=adj_x,
        AdjY=adj_y,
    )
    _check(data, [a, b])


RESIZE = [
    (code, opts, align, half, size)
    for code, opts in (
        ("RESIZE_BILINEAR", "ResizeBilinearOptions"),
        ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions"),
    )
    for align, half in ((False, False), (True, False), (False, True))
    for size in ((10, 7), (3, 5))
]


@pytest.mark.parametrize(
    "code,options,align,half,size",
    RESIZE,
    ids=[f"{r[0][7:]}-a{int(r[2])}h{int(r[3])}-{r[4][0]}x{r[4][1]}" for r in RESIZE],
)
def test_resize_modes_match_litert(code, options, align, half, size):
    rng = np.random.default_rng(29)
    x = rng.normal(size=(1, 5, 4, 3)).astype(F32)
    data = _one_op(
        code,
        [((1, 5, 4, 3), F32)],
        [((1, *size, 3), F32)],
        options,
        consts=[(1, np.array(size, np.int32))],
        AlignCorners=align,
        HalfPixelCenters=half,
    )
    _check(data, [x])


def test_local_response_normalization_matches_litert():
    rng = np.random.default_rng(30)
    x = rng.normal(size=(1, 3, 3, 7)).astype(F32)
    data = _one_op(
        "LOCAL_RESPONSE_NORMALIZATION",
        [((1, 3, 3, 7), F32)],
        [((1, 3, 3, 7), F32)],
        "LocalResponseNormalizationOptions",
        Radius=2,
        Bias=1.5,
        Alpha=0.3,
        Beta=0.75,
    )
    _check(data, [x])


# ------------------------------------------------------------------------------ order and aliasing


def test_ops_after_an_unsupported_op_are_lowered_and_not_reported_as_read_before_computed():
    # The old reader left an unsupported op's outputs unbound, so every later reader of them was
    # refused with "tensor X is read before it is computed" (basic-pitch: 142 "unsupported" ops).
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    y = b.tensor("hashed", [1, 4])
    b.op("SVDF", [x], [y])
    z = b.tensor("padded", [1, 6])
    b.op("PAD", [y, b.const("pads", np.array([[0, 0], [1, 1]], np.int32))], [z])
    w = b.tensor("neg", [1, 6])
    b.op("NEG", [z], [w])
    with pytest.raises(UnsupportedError) as err:
        load_tflite_bytes(b.build([x], [w]), "order.tflite")
    assert err.value.items == [("hashed", "SVDF")]
    assert "read before" not in str(err.value) and str(err.value).startswith("order.tflite")


def test_many_unsupported_ops_give_one_short_line_with_a_count_and_the_first_few(tmp_path):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    prev = x
    for k in range(40):
        t = b.tensor(f"layer_{k}_" + "n" * 40, [1, 4])
        b.op("SVDF" if k % 2 else "LSH_PROJECTION", [prev], [t])
        prev = t
    src = tmp_path / "many.tflite"
    src.write_bytes(b.build([x], [prev]))
    res = CliRunner().invoke(app, ["import", str(src), "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and len(lines[0]) < 1000, res.output
    assert str(src) in lines[0] and "40 unsupported" in lines[0]
    assert "SVDF x20" in lines[0] and "LSH_PROJECTION x20" in lines[0]
    assert not (tmp_path / "m.onnx").exists()


def test_a_missing_required_input_is_bad_input_not_the_last_tensor():
    # -1 marks an omitted optional input; Python's tensors[-1] would have read the last tensor.
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    y = b.tensor("y", [1, 4])
    b.op("ADD", [x, -1], [y], "AddOptions")
    with pytest.raises(InputError, match=r"operator 0 \(ADD\) is malformed.*missing") as err:
        load_tflite_bytes(b.build([x], [y]), "missing.tflite")
    assert err.value.path == "missing.tflite"


def test_a_weight_never_takes_the_name_of_a_computed_tensor():
    # An op named 'y' asks for an initializer 'y/shape'; here 'y/shape' is also a PACK's output
    # (a graph output): two values with one name made an invalid model.
    rng = np.random.default_rng(31)
    b = TflBuilder()
    x = b.tensor("x", [2, 3, 4])
    a = b.tensor("a", [], np.int32)
    b.op(
        "STRIDED_SLICE",
        [
            b.const("shp", np.array([2, 12], np.int32)),
            *(b.const(f"k{i}", np.array([v], np.int32)) for i, v in enumerate((0, 1, 1))),
        ],
        [a],
        "StridedSliceOptions",
        ShrinkAxisMask=1,
    )
    packed = b.tensor("y/shape", [2], np.int32)
    b.op("PACK", [a, b.const("m1", np.array(-1, np.int32))], [packed], "PackOptions", ValuesCount=2)
    y = b.tensor("y", [2, 12])
    b.op("RESHAPE", [x, packed], [y])
    _check(b.build([x], [y, packed]), [rng.normal(size=(2, 3, 4)).astype(F32)])


def test_variable_tensor_read_then_written_sees_zero_first():
    # A variable tensor is read (its value starts at zero) and then overwritten by a later op.
    rng = np.random.default_rng(32)
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    v = b.tensor("state", [1, 4], variable=True)
    s = b.tensor("sum", [1, 4])
    b.op("ADD", [x, v], [s], "AddOptions")
    _check(b.build([x], [s]), [rng.normal(size=(1, 4)).astype(F32)])


# ------------------------------------------------------------------------------ int8


def _int8_cnn(rng) -> bytes:
    """A small int8 CNN as the converter writes them: per-channel int8 filters, int32 biases,
    int8 activations with their own scales, ReLU6 fused, average pooling and a softmax."""
    b = TflBuilder()
    x = b.tensor("x", [1, 8, 8, 3], np.int8, scale=[0.02], zero_point=[-5])
    w1 = rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    ws1 = rng.uniform(0.002, 0.01, 8).astype(F32)
    f1 = b.const("f1", w1, scale=ws1, zero_point=np.zeros(8, np.int64), quantized_dimension=0)
    bias1 = b.const(
        "b1",
        rng.integers(-2000, 2000, 8).astype(np.int32),
        scale=0.02 * ws1,
        zero_point=np.zeros(8, np.int64),
    )
    c1 = b.tensor("c1", [1, 4, 4, 8], np.int8, scale=[6 / 255], zero_point=[-128])
    b.op(
        "CONV_2D",
        [x, f1, bias1],
        [c1],
        "Conv2DOptions",
        Padding=0,
        StrideH=2,
        StrideW=2,
        FusedActivationFunction=3,
    )
    w2 = rng.integers(-127, 128, (1, 3, 3, 8)).astype(np.int8)
    ws2 = rng.uniform(0.005, 0.02, 8).astype(F32)
    f2 = b.const("f2", w2, scale=ws2, zero_point=np.zeros(8, np.int64), quantized_dimension=3)
    bias2 = b.const(
        "b2",
        rng.integers(-500, 500, 8).astype(np.int32),
        scale=(6 / 255) * ws2,
        zero_point=np.zeros(8, np.int64),
    )
    c2 = b.tensor("c2", [1, 4, 4, 8], np.int8, scale=[0.05], zero_point=[3])
    b.op(
        "DEPTHWISE_CONV_2D",
        [c1, f2, bias2],
        [c2],
        "DepthwiseConv2DOptions",
        Padding=0,
        StrideH=1,
        StrideW=1,
        DepthMultiplier=1,
    )
    p = b.tensor("p", [1, 1, 1, 8], np.int8, scale=[0.05], zero_point=[3])
    b.op(
        "AVERAGE_POOL_2D",
        [c2],
        [p],
        "Pool2DOptions",
        Padding=1,
        StrideH=1,
        StrideW=1,
        FilterHeight=4,
        FilterWidth=4,
    )
    r = b.tensor("r", [1, 8], np.int8, scale=[0.05], zero_point=[3])
    b.op("RESHAPE", [p, b.const("rs", np.array([1, 8], np.int32))], [r])
    w3 = rng.integers(-127, 128, (4, 8)).astype(np.int8)
    fc = b.const("fc", w3, scale=[0.01], zero_point=[0])
    bias3 = b.const("b3", rng.integers(-300, 300, 4).astype(np.int32), scale=[0.05 * 0.01], zero_point=[0])
    lo = b.tensor("logits", [1, 4], np.int8, scale=[0.1], zero_point=[0])
    b.op("FULLY_CONNECTED", [r, fc, bias3], [lo], "FullyConnectedOptions")
    sm = b.tensor("probs", [1, 4], np.int8, scale=[1 / 256], zero_point=[-128])
    b.op("SOFTMAX", [lo], [sm], "SoftmaxOptions", Beta=1.0)
    return b.build([x], [c2, sm])


def test_int8_cnn_with_qdq_activations_matches_litert_within_one_code_on_the_reference():
    rng = np.random.default_rng(33)
    data = _int8_cnn(rng)
    worst_qdq = worst_float = 0
    for seed in range(5):
        feeds = [np.random.default_rng(seed).integers(-128, 128, (1, 8, 8, 3)).astype(np.int8)]
        expected = _litert(data, feeds)
        model, got_ort, got_ref = _run_imported(data, feeds)  # default: Q/DQ activations
        assert [o.dtype for o in got_ref] == [np.int8, np.int8]
        assert any(n.op_type == "DequantizeLinear" for n in model.graph)
        worst_qdq = max(
            worst_qdq,
            *(
                int(np.abs(r.astype(int) - e.astype(int)).max())
                for r, e in zip(got_ref, expected, strict=True)
            ),
        )
        _, _, got_float = _run_imported(data, feeds, {"activations": "float"})
        worst_float = max(
            worst_float,
            *(
                int(np.abs(r.astype(int) - e.astype(int)).max())
                for r, e in zip(got_float, expected, strict=True)
            ),
        )
    assert worst_qdq <= 1
    assert worst_float >= worst_qdq  # float activations are the looser option, never the closer one


def test_activations_float_option_leaves_no_rounding_and_a_bad_value_is_refused():
    rng = np.random.default_rng(34)
    data = _int8_cnn(rng)
    model = load_tflite_bytes(data, "q.tflite", {"activations": "float"})
    # Only the graph output's QuantizeLinear remains (io="tflite"); no pair inside the graph.
    assert sum(n.op_type == "DequantizeLinear" for n in model.graph) == 0
    with pytest.raises(InputError, match="activations='fake'") as err:
        load_tflite_bytes(data, "q.tflite", {"activations": "fake"})
    assert err.value.path == "q.tflite"


# ------------------------------------------------------------------------------ real models

BASIC_PITCH = (
    "basic-pitch",
    "0.4.0",
    "basic_pitch/saved_models/icassp_2022/nmp.tflite",
    "3db297d54af8e01c6e5618245c956b1d71b6a2b978cb2dedb527173186552676",
)


def test_basic_pitch_nmp_imports_and_matches_litert():
    """Spotify's basic-pitch audio model (the 142 'unsupported ops' of issue 12): every op maps
    now. Compared with the interpreter as a user runs it (XNNPACK), which agrees with ONNX Runtime
    within 1e-6 here (LiteRT's own builtin kernels differ from both by up to 7e-5)."""
    from _wheels import WheelUnavailable, fetch_member

    try:
        path = fetch_member(*BASIC_PITCH)
    except WheelUnavailable as exc:
        pytest.skip(f"PyPI cannot be reached: {exc}")
    data = path.read_bytes()
    rng = np.random.default_rng(35)
    audio = 0.3 * np.sin(np.arange(43844) * 2 * np.pi * 440 / 22050) + 0.05 * rng.normal(size=43844)
    feeds = [audio.astype(F32).reshape(1, 43844, 1)]
    it = litert.Interpreter(model_content=data)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], feeds[0])
    it.invoke()
    expected = [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]
    _, got_ort, got_ref = _run_imported(data, feeds)
    assert len(expected) == 3
    for e, g, r in zip(expected, got_ort, got_ref, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-5)
        np.testing.assert_allclose(r, e, rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------ sparse constants


def _sparse_model(dims, values, order=(0, 1), block_map=()) -> bytes:
    b = TflBuilder()
    x = b.tensor("x", [4, 6])
    w = b.tensor(
        "w_sparse",
        [4, 6],
        F32,
        data=np.asarray(values, F32),
        sparsity={"order": list(order), "block_map": list(block_map), "dims": dims},
    )
    d = b.tensor("w", [4, 6])
    b.op("DENSIFY", [w], [d])
    y = b.tensor("y", [4, 6])
    b.op("ADD", [x, d], [y], "AddOptions")
    return b.build([x], [y])


def test_sparse_constants_csr_and_blocked_are_densified_like_litert():
    rng = np.random.default_rng(36)
    x = rng.normal(size=(4, 6)).astype(F32)
    # CSR over rows: row r holds the listed columns (mediapipe's sparse detectors store filters so).
    segs, idx = [0, 2, 2, 5, 6], [1, 4, 0, 2, 5, 3]
    _check(_sparse_model([("dense", 4), ("csr", segs, idx)], rng.normal(size=6)), [x])
    # 2x3 blocks: outer rows dense, outer columns CSR, each kept block dense.
    dims = [("dense", 2), ("csr", [0, 1, 3], [1, 0, 1]), ("dense", 2), ("dense", 3)]
    data = _sparse_model(dims, rng.normal(size=18), order=(0, 1, 2, 3), block_map=(0, 1))
    _check(data, [x])


@pytest.mark.parametrize(
    "dims,values,match",
    [
        ([("dense", 4), ("csr", [0, 2, 2, 5, 6], [1, 4, 0, 2, 9, 3])], 6, "out of range"),
        ([("dense", 4), ("csr", [0, 2, 1, 5, 6], [1, 4, 0, 2, 5, 3])], 6, "out of range"),
        ([("dense", 4), ("csr", [0, 2, 2, 5, 6], [1, 4, 0, 2, 5, 3])], 5, "holds 5 values"),
        ([("dense", 5), ("dense", 6)], 30, "dense size 5"),
    ],
)
def test_hostile_sparsity_is_refused_with_the_file_named(tmp_path, dims, values, match):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    rng = np.random.default_rng(37)
    data = _sparse_model(dims, rng.normal(size=values))
    with pytest.raises(InputError, match=match) as err:
        load_tflite_bytes(data, "sparse.tflite")
    assert err.value.path == "sparse.tflite" and "w_sparse" in str(err.value)
    src = tmp_path / "sparse.tflite"
    src.write_bytes(data)
    res = CliRunner().invoke(app, ["import", str(src), "-o", str(tmp_path / "o.onnx")])
    assert res.exit_code == 2 and str(src) in res.output and len(res.output.strip().splitlines()) == 1
