"""Hostile and invalid ONNX files: each is refused at load with one InputError naming the model file
(exit 2 on the CLI), before any weight is read; valid models (onnx's bundled ones) still load."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.cli.app import app
from mconv.errors import InputError
from mconv.irio import load_onnx
from mconv.onnx_check import check_model
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

F = TensorProto.FLOAT


def _vi(name: str, dtype: int = F, shape=(4,)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _model(nodes, inputs, outputs, inits=(), *, functions=(), opsets=(("", 17),)) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], functions=list(functions)
    )
    return m


def _add_model(w: TensorProto) -> onnx.ModelProto:
    """y = x + w, with ``w`` the initializer under test."""
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x")], [_vi("y")], [w])


def _external(name: str, location: str, *, dims=(4,), dtype: int = F, **entries) -> TensorProto:
    t = TensorProto(name=name, data_type=dtype, dims=list(dims), data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), *entries.items()):
        e = t.external_data.add()
        e.key, e.value = key, str(value)
    return t


def _write(path: Path, model: onnx.ModelProto | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


def _refused(path: Path, *needles: str, **kwargs) -> str:
    with pytest.raises(InputError) as e:
        load_onnx(path, **kwargs)
    line = e.value.line()
    assert path.name in line and "\n" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


def _cli(*args: str):
    r = CliRunner().invoke(app, list(args))
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    return r.exit_code, lines


def _data(seed: int, n: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# ------------------------------------------------------------------------ 1. external data locations


@pytest.mark.parametrize(
    "location", ["../secret.bin", "../../../../../../../../etc/passwd", "sub/../../secret.bin"]
)
def test_a_location_outside_the_models_folder_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"s" * 64)
    m = _write(tmp_path / "model" / "m.onnx", _add_model(_external("w", location)))
    _refused(m, "tensor 'w'", "outside the model's folder", f"'{location}'")


def test_an_absolute_location_is_refused_even_inside_the_folder(tmp_path):
    (tmp_path / "w.bin").write_bytes(_data(0).tobytes())
    m = _write(tmp_path / "m.onnx", _add_model(_external("w", str(tmp_path / "w.bin"))))
    _refused(m, "tensor 'w'", "is an absolute path")


def test_a_symlink_resolving_outside_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"s" * 16)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").symlink_to(tmp_path / "secret.bin")
    m = _write(tmp_path / "model" / "m.onnx", _add_model(_external("w", "w.bin")))
    _refused(m, "'w.bin'", "outside the model's folder")


def test_a_symlinked_folder_leading_outside_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(_data(1).tobytes())
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "sub").symlink_to(tmp_path / "elsewhere")
    m = _write(tmp_path / "model" / "m.onnx", _add_model(_external("w", "sub/w.bin")))
    _refused(m, "'sub/w.bin'", "outside the model's folder")


def test_a_symlink_inside_the_folder_loads_and_reads_the_file_it_named_at_load(tmp_path):
    want = _data(2)
    (tmp_path / "secret.bin").write_bytes(b"\x7f" * 16)
    (tmp_path / "model" / "weights").mkdir(parents=True)
    (tmp_path / "model" / "weights" / "real.bin").write_bytes(want.tobytes())
    link = tmp_path / "model" / "w.bin"
    link.symlink_to(tmp_path / "model" / "weights" / "real.bin")
    m = _write(tmp_path / "model" / "m.onnx", _add_model(_external("w", "w.bin", length=16)))
    model = load_onnx(m)
    link.unlink()  # swapped after the check: the load already resolved the location
    link.symlink_to(tmp_path / "secret.bin")
    np.testing.assert_array_equal(model.graph.initializers["w"].const_value.numpy(), want)


def test_valid_external_data_with_offsets_loads_and_imports(tmp_path):
    rng = np.random.default_rng(3)
    arrays = {f"w{i}": rng.standard_normal((8, 8)).astype(np.float32) for i in range(3)}
    nodes = [
        helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(3)
    ]
    proto = _model(
        nodes,
        [_vi("x", shape=(1, 8))],
        [_vi("h3", shape=(1, 8))],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )
    src = tmp_path / "m.onnx"
    onnx.save(proto, src, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    model = load_onnx(src)
    for name, a in arrays.items():
        np.testing.assert_array_equal(model.graph.initializers[name].const_value.numpy(), a)
    code, lines = _cli("import", str(src), "-o", str(tmp_path / "out" / "o.onnx"))
    assert code == 0, lines
    got = onnx.load(tmp_path / "out" / "o.onnx")
    assert {t.name: numpy_helper.to_array(t).tolist() for t in got.graph.initializer} == {
        n: a.tolist() for n, a in arrays.items()
    }


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ({"offset": 64}, "runs past the end of the file: offset 64"),
        ({"offset": 8, "length": 16}, "runs past the end of the file"),
        ({"length": 1 << 40}, "runs past the end of the file"),
        ({"offset": -4}, "offset '-4' is not a non-negative integer"),
        ({"offset": "1.5"}, "offset '1.5' is not a non-negative integer"),
        ({"length": "sixteen"}, "length 'sixteen' is not a non-negative integer"),
        ({"offset": "9" * 5000}, "is not a non-negative integer"),
        ({"length": 12}, "needs 16 bytes but its external data length is 12"),
    ],
)
def test_bad_offsets_and_lengths_are_refused(tmp_path, entries, needle):
    (tmp_path / "w.bin").write_bytes(_data(4).tobytes())  # 16 bytes
    m = _write(tmp_path / "m.onnx", _add_model(_external("w", "w.bin", **entries)))
    _refused(m, "tensor 'w'", needle)


def test_huge_dims_over_a_small_external_file_are_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    m = _write(tmp_path / "m.onnx", _add_model(_external("w", "w.bin", dims=(1 << 40,))))
    _refused(m, "tensor 'w'", "runs past the end of the file")


@pytest.mark.parametrize(
    ("location", "needle"), [("sub", "is a directory"), (".", "is a directory"), ("a\0b", "NUL")]
)
def test_directory_and_nul_locations_are_refused(tmp_path, location, needle):
    (tmp_path / "sub").mkdir()
    m = _write(tmp_path / "m.onnx", _add_model(_external("w", location)))
    line = _refused(m, "tensor 'w'", needle)
    assert "\0" not in line


def test_a_location_that_is_not_utf8_is_refused(tmp_path):
    data = _add_model(_external("w", "LOCATIONX")).SerializeToString()
    m = _write(tmp_path / "m.onnx", data.replace(b"LOCATIONX", b"LOC\xff\xfeIONX"))
    _refused(m, "tensor 'w'", "not valid UTF-8", "LOC\\xff\\xfeIONX")


def test_missing_truncated_and_empty_location_files_are_refused(tmp_path):
    m = _write(tmp_path / "a" / "m.onnx", _add_model(_external("w", "gone.bin")))
    _refused(m, "'gone.bin'", "does not exist")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "w.bin").write_bytes(b"\0" * 10)  # 16 needed
    m = _write(tmp_path / "b" / "m.onnx", _add_model(_external("w", "w.bin")))
    _refused(m, "'w.bin'", "runs past the end of the file")
    m = _write(tmp_path / "c" / "m.onnx", _add_model(_external("w", "")))
    _refused(m, "tensor 'w'", "no location")


def test_an_unreadable_external_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "w.bin").write_bytes(_data(5).tobytes())
    m = _write(tmp_path / "m.onnx", _add_model(_external("w", "w.bin")))
    real_open = os.open

    def denying_open(path, flags, *args, **kwargs):
        if os.fspath(path).endswith("w.bin"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denying_open)
    _refused(m, "'w.bin'", "cannot be read (Permission denied)")


def test_a_fifo_as_external_data_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "w.bin")
    m = _write(tmp_path / "m.onnx", _add_model(_external("w", "w.bin")))
    r = subprocess.run(
        [sys.executable, "-m", "mconv", "import", str(m), "-o", str(tmp_path / "o.onnx")],
        capture_output=True,
        text=True,
        timeout=120,  # generous: a blocking open of the FIFO would never return
    )
    assert r.returncode == 2, r.stderr
    assert "m.onnx" in r.stderr and "is not a regular file" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_a_hard_linked_external_file_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(_data(6).tobytes())
    os.link(tmp_path / "w.bin", tmp_path / "w2.bin")
    m = _write(tmp_path / "m.onnx", _add_model(_external("w", "w.bin")))
    _refused(m, "'w.bin'", "2 hard links")


def test_a_repeated_external_data_key_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(_data(7).tobytes())
    t = _external("w", "w.bin")
    e = t.external_data.add()
    e.key, e.value = "location", "../../etc/passwd"
    m = _write(tmp_path / "m.onnx", _add_model(t))
    _refused(m, "tensor 'w'", "key 'location' twice")


def test_external_and_inline_data_at_once_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(_data(8).tobytes())
    t = _external("w", "w.bin")
    t.raw_data = _data(8).tobytes()
    m = _write(tmp_path / "m.onnx", _add_model(t))
    _refused(m, "tensor 'w'", "also holds data in the model file")


def _if_model(then_init: TensorProto | None = None, then_nodes=None) -> onnx.ModelProto:
    then_nodes = then_nodes or [helper.make_node("Identity", ["wt"], ["t_out"])]
    then_g = helper.make_graph(then_nodes, "then", [], [_vi("t_out")], [then_init] if then_init else [])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e_out"])], "else", [], [_vi("e_out")])
    node = helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)
    return _model([node], [_vi("cond", TensorProto.BOOL, ()), _vi("x")], [_vi("y")])


def _loop_model(value: TensorProto) -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Constant", [], ["k"], name="const", value=value),
            helper.make_node("Add", ["k", "x"], ["v"]),  # x from the outer graph
        ],
        "body",
        [_vi("i", TensorProto.INT64, ()), _vi("c_in", TensorProto.BOOL, ())],
        [_vi("c_out", TensorProto.BOOL, ()), _vi("v")],
    )
    node = helper.make_node("Loop", ["n", "c"], ["y"], name="loop", body=body)
    inputs = [_vi("n", TensorProto.INT64, ()), _vi("c", TensorProto.BOOL, ()), _vi("x")]
    return _model([node], inputs, [_vi("y", shape=(None, 4))])


def test_external_data_in_subgraphs_constants_functions_and_sparse_tensors_is_checked(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"s" * 64)
    bad = "../secret.bin"
    cases = {
        "if": _if_model(_external("wt", bad)),
        "loop": _loop_model(_external("kv", bad)),
        "constant": _model(
            [
                helper.make_node("Constant", [], ["w"], value=_external("cv", bad)),
                helper.make_node("Add", ["x", "w"], ["y"]),
            ],
            [_vi("x")],
            [_vi("y")],
        ),
    }
    func = helper.make_function(
        "local",
        "F",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["k"], value=_external("fv", bad)),
            helper.make_node("Add", ["a", "k"], ["b"]),
        ],
        [helper.make_opsetid("", 17)],
    )
    cases["function"] = _model(
        [helper.make_node("F", ["x"], ["y"], domain="local")],
        [_vi("x")],
        [_vi("y")],
        functions=[func],
        opsets=(("", 17), ("local", 1)),
    )
    sparse = helper.make_sparse_tensor(
        _external("sv", bad, dims=(2,)), numpy_helper.from_array(np.array([0, 3], np.int64), "si"), [4]
    )
    m = _add_model(numpy_helper.from_array(_data(9), "w"))
    m.graph.sparse_initializer.append(sparse)
    cases["sparse"] = m
    for kind, proto in cases.items():
        path = _write(tmp_path / kind / "m.onnx", proto)
        _refused(path, "outside the model's folder", "'../secret.bin'")


def test_external_constant_in_a_loop_body_inside_the_folder_loads(tmp_path):
    want = _data(10)
    (tmp_path / "k.bin").write_bytes(want.tobytes())
    m = _write(tmp_path / "m.onnx", _loop_model(_external("kv", "k.bin")))
    model = load_onnx(m)
    body = model.graph.node(0).attributes["body"].value
    const = next(n for n in body if n.op_type == "Constant")
    np.testing.assert_array_equal(const.attributes["value"].value.numpy(), want)


def test_cli_import_and_optimize_refuse_an_escaping_location_and_write_nothing(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"root:x:0:0" + b"\0" * 6)
    m = _write(tmp_path / "model" / "m.onnx", _add_model(_external("w\x1b[31m", "../secret.bin")))
    for args in (["import", str(m)], ["optimize", str(m), "--passes", "fold"]):
        out = tmp_path / "out.onnx"
        code, lines = _cli(*args, "-o", str(out))
        assert code == 2 and len(lines) == 1, lines
        assert "m.onnx" in lines[0] and "'../secret.bin'" in lines[0] and "w\\x1b[31m" in lines[0], lines
        assert not out.exists()


# ---------------------------------------------------------------- 8. text and dtypes that crashed


def _relu_model(out: str = "yyyy") -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], [out], name="act")], [_vi("x")], [_vi(out)])


def test_names_that_are_not_utf8_are_refused_on_the_cli(tmp_path):
    data = _relu_model().SerializeToString()
    assert data.count(b"yyyy") == 2
    m = _write(tmp_path / "m.onnx", data.replace(b"yyyy", b"y\xff\xfey"))
    _refused(m, "not valid UTF-8", "y\\xff\\xfey", "node 'act'")
    code, lines = _cli("import", str(m), "-o", str(tmp_path / "o.onnx"))
    assert code == 2 and len(lines) == 1 and "m.onnx" in lines[0], lines


def test_an_initializer_name_that_is_not_utf8_is_refused(tmp_path):
    w = numpy_helper.from_array(_data(11), "WWWW")
    proto = _model([helper.make_node("Add", ["x", "WWWW"], ["y"])], [_vi("x")], [_vi("y")], [w])
    data = proto.SerializeToString()
    assert data.count(b"\x42\x04WWWW") == 1  # TensorProto.name (field 8): only the tensor's name is bad
    m = _write(tmp_path / "m.onnx", data.replace(b"\x42\x04WWWW", b"\x42\x04W\xc3(W"))
    _refused(m, "not valid UTF-8", "W\\xc3(W")


def test_dtype_undefined_and_unknown_numbers_are_refused(tmp_path):
    undefined = TensorProto(name="w", data_type=0, dims=[4], raw_data=b"\0" * 16)
    _refused(_write(tmp_path / "a" / "m.onnx", _add_model(undefined)), "tensor 'w'", "dtype UNDEFINED (0)")
    unknown = TensorProto(name="w", data_type=99, dims=[4], raw_data=b"\0" * 16)
    _refused(_write(tmp_path / "b" / "m.onnx", _add_model(unknown)), "tensor 'w'", "unknown dtype number 99")
    m = _relu_model()
    m.graph.input[0].type.tensor_type.elem_type = 0
    _refused(_write(tmp_path / "c" / "m.onnx", m), "graph input 'x'", "dtype UNDEFINED (0)")
    m = _relu_model()
    m.graph.input[0].type.tensor_type.elem_type = 77
    _refused(_write(tmp_path / "d" / "m.onnx", m), "'x'", "unknown dtype number 77")
    m = _relu_model()
    m.graph.input[0].type.ClearField("tensor_type")
    _refused(_write(tmp_path / "e" / "m.onnx", m), "graph input 'x'", "has no type")
    code, lines = _cli("import", str(tmp_path / "a" / "m.onnx"), "-o", str(tmp_path / "o.onnx"))
    assert code == 2 and len(lines) == 1 and "m.onnx" in lines[0], lines


# --------------------------------------------------------------------- 9. invalid graph structure


def test_a_cycle_is_refused_naming_the_file_and_the_nodes(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x", "b"], ["a"], name="first"),  # Relu has one input; structure only
        helper.make_node("Neg", ["a"], ["b"], name="second"),
        helper.make_node("Identity", ["a"], ["y"], name="out"),
    ]
    m = _write(tmp_path / "m.onnx", _model(nodes, [_vi("x")], [_vi("y")]))
    _refused(m, "cycle", "node 'first' (Relu)", "node 'second' (Neg)")
    for args in (["import", str(m)], ["optimize", str(m), "--passes", "fold"]):
        code, lines = _cli(*args, "-o", str(tmp_path / "o.onnx"))
        assert code == 2 and len(lines) == 1 and "m.onnx" in lines[0] and "cycle" in lines[0], lines


def test_a_node_reading_its_own_output_is_a_cycle(tmp_path):
    m = _write(
        tmp_path / "m.onnx",
        _model([helper.make_node("Add", ["x", "y"], ["y"], name="loop")], [_vi("x")], [_vi("y")]),
    )
    _refused(m, "cycle", "node 'loop' (Add)")


def test_a_cycle_through_a_subgraph_is_refused(tmp_path):
    then_nodes = [helper.make_node("Identity", ["z"], ["t_out"])]  # z is produced after the If, from it
    m = _if_model(then_nodes=then_nodes)
    m.graph.node.append(helper.make_node("Neg", ["y"], ["z"], name="after"))
    m.graph.output.append(_vi("z"))
    _refused(_write(tmp_path / "m.onnx", m), "cycle", "node 'branch' (If)", "node 'after' (Neg)")


def test_outer_names_in_subgraphs_unsorted_nodes_optional_inputs_and_custom_ops_load(tmp_path):
    want = _data(12)
    m = _if_model(numpy_helper.from_array(want, "wt"))  # the else branch reads x from outside
    load_onnx(_write(tmp_path / "a" / "m.onnx", m))
    nodes = [  # consumers before producers: acyclic, so fine
        helper.make_node("Identity", ["h"], ["y"]),
        helper.make_node("Clip", ["x", "", "hi"], ["h"]),  # "" = the absent optional min
        helper.make_node("MyOp", ["x"], ["hi0"], domain="vendor.custom"),
        helper.make_node("ReduceMax", ["hi0"], ["hi"], keepdims=0),
    ]
    m = _model(nodes, [_vi("x")], [_vi("y")], opsets=(("", 17), ("vendor.custom", 1)))
    model = load_onnx(_write(tmp_path / "b" / "m.onnx", m))
    assert [n.op_type for n in model.graph] == ["Identity", "Clip", "MyOp", "ReduceMax"]


def test_undefined_inputs_and_outputs_are_refused(tmp_path):
    m = _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")], [_vi("x")], [_vi("y")])
    _refused(_write(tmp_path / "a" / "m.onnx", m), "input 'ghost' of node 'add' (Add) is not defined")
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y"), _vi("nowhere")])
    _refused(_write(tmp_path / "b" / "m.onnx", m), "graph output 'nowhere' is not produced")
    then_nodes = [helper.make_node("Identity", ["ghost"], ["t_out"], name="inner")]
    _refused(
        _write(tmp_path / "c" / "m.onnx", _if_model(then_nodes=then_nodes)),
        "input 'ghost' of node 'inner'",
        "graph 'then'",
    )


def test_duplicate_names_are_refused(tmp_path):
    w = numpy_helper.from_array(_data(13), "w")
    m = _add_model(w)
    m.graph.initializer.append(numpy_helper.from_array(_data(14), "w"))
    _refused(_write(tmp_path / "a" / "m.onnx", m), "initializer 'w' is defined twice")
    m = _relu_model()
    m.graph.input.append(_vi("x"))
    _refused(_write(tmp_path / "b" / "m.onnx", m), "graph input 'x' is listed twice")
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="one"),
        helper.make_node("Neg", ["x"], ["y"], name="two"),
    ]
    _refused(
        _write(tmp_path / "c" / "m.onnx", _model(nodes, [_vi("x")], [_vi("y")])),
        "value 'y' is defined twice",
        "'two'",
        "'one'",
    )
    nodes = [helper.make_node("Relu", ["x"], ["x"], name="over")]
    _refused(
        _write(tmp_path / "d" / "m.onnx", _model(nodes, [_vi("x")], [_vi("x")])), "value 'x' is defined twice"
    )
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="n", alpha=1.0)]
    nodes[0].attribute.extend([helper.make_attribute("alpha", 2.0)])
    _refused(
        _write(tmp_path / "e" / "m.onnx", _model(nodes, [_vi("x")], [_vi("y")])), "attribute 'alpha' twice"
    )


def test_an_initializer_listed_as_an_input_still_loads(tmp_path):
    m = _add_model(numpy_helper.from_array(_data(15), "w"))
    m.graph.input.append(_vi("w"))  # the old ONNX way of listing weights
    model = load_onnx(_write(tmp_path / "m.onnx", m))
    assert "w" in model.graph.initializers


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (
            lambda: TensorProto(name="w", data_type=F, dims=[1 << 40], raw_data=b"\0" * 16),
            "needs 4398046511104 bytes",
        ),
        (lambda: TensorProto(name="w", data_type=F, dims=[-4], raw_data=b"\0" * 16), "negative dimension"),
        (
            lambda: TensorProto(name="w", data_type=F, dims=[4], raw_data=b"\0" * 15),
            "needs 16 bytes but its raw_data holds 15",
        ),
        (
            lambda: TensorProto(name="w", data_type=F, dims=[4], float_data=[1, 2, 3]),
            "needs 4 values in float_data but holds 3",
        ),
        (lambda: TensorProto(name="w", data_type=TensorProto.INT64, dims=[4], int64_data=[1] * 5), "holds 5"),
        (
            lambda: TensorProto(name="w", data_type=F, dims=[4], int64_data=[1] * 4),
            "FLOAT data in int64_data",
        ),
        (
            lambda: TensorProto(name="w", data_type=F, dims=[2], raw_data=b"\0" * 8, float_data=[1, 2]),
            "more than one field",
        ),
        (lambda: TensorProto(name="w", data_type=F, dims=[4]), "has no data"),
        (
            lambda: TensorProto(name="w", data_type=TensorProto.STRING, dims=[2], string_data=[b"a"]),
            "holds 1",
        ),
        (
            lambda: TensorProto(name="w", data_type=TensorProto.INT4, dims=[5], int32_data=[1, 2]),
            "needs 3 values",
        ),
    ],
)
def test_tensor_sizes_that_do_not_match_their_dims_are_refused(tmp_path, build, needle):
    m = _write(tmp_path / "m.onnx", _add_model(build()))
    _refused(m, "tensor 'w'", needle)


def test_a_bad_tensor_in_a_constant_inside_a_subgraph_is_refused(tmp_path):
    value = TensorProto(name="kv", data_type=F, dims=[1 << 40], raw_data=b"\0" * 16)
    _refused(
        _write(tmp_path / "m.onnx", _loop_model(value)),
        "tensor 'kv'",
        "needs 4398046511104 bytes",
        "node 'const'",
    )


def test_lazy_load_checks_sizes_of_the_references_it_makes(tmp_path, monkeypatch):
    import mconv.irio as irio

    monkeypatch.setattr(irio, "LAZY_TENSOR_BYTES", 8)
    w = TensorProto(name="w", data_type=F, dims=[1 << 40], raw_data=_data(16).tobytes())
    _refused(
        _write(tmp_path / "a" / "m.onnx", _add_model(w)),
        "tensor 'w'",
        "needs 4398046511104 bytes but its raw_data holds 16",
        lazy=True,
    )
    w = TensorProto(name="w", data_type=F, dims=[4], raw_data=_data(16).tobytes() + b"\0" * 4)
    _refused(
        _write(tmp_path / "b" / "m.onnx", _add_model(w)),
        "tensor 'w'",
        "needs 16 bytes but its raw_data holds 20",
        lazy=True,
    )
    want = _data(17)
    model = load_onnx(
        _write(tmp_path / "c" / "m.onnx", _add_model(numpy_helper.from_array(want, "w"))), lazy=True
    )
    np.testing.assert_array_equal(model.graph.initializers["w"].const_value.numpy(), want)


def test_a_sparse_initializer_is_refused_as_unsupported(tmp_path):
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(_data(18, 2), "sv"),
        numpy_helper.from_array(np.array([0, 3], np.int64), "si"),
        [4],
    )
    m = _add_model(numpy_helper.from_array(_data(19), "w"))
    m.graph.sparse_initializer.append(sparse)
    _refused(_write(tmp_path / "m.onnx", m), "sparse initializer 'sv' is not supported")


# ------------------------------------------------------------------ valid models keep loading


def _bundled_files() -> list[str]:
    import onnx.backend.test

    data = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data")
    files = glob.glob(f"{data}/*/*/model.onnx") + glob.glob(f"{data}/light/*.onnx")
    return sorted(files) + [str(Path(__file__).resolve().parents[2] / "fixtures" / "digits_mlp.onnx")]


def test_every_bundled_onnx_model_still_loads():
    files = _bundled_files()
    assert len(files) > 100
    for f in files:
        load_onnx(f)


def test_every_onnx_node_test_model_passes_the_checks(tmp_path):
    import onnx.backend.test.loader as loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = loader.load_node_model_tests()
    assert len(cases) > 1000
    for case in cases:
        check_model(case.model, path=f"{case.name}.onnx", folder=tmp_path)


def test_inspect_reads_a_bundles_weightless_graph_quietly(tmp_path):
    """A cpu bundle's model.onnx uses weights that live in weights.mcw: the structure check takes
    them as provided, and onnx_ir's undefined-input warnings stay off stderr."""
    from mconv.cli.app import app
    from typer.testing import CliRunner

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "digits_mlp.onnx"
    runner = CliRunner()
    r = runner.invoke(app, ["export", str(fixture), "--target", "cpu", "-o", str(tmp_path / "b"), "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["inspect", str(tmp_path / "b"), "--json"])
    assert r.exit_code == 0, r.output
    assert "cannot be found" not in r.output
    assert '"nodes": 5' in r.stdout
