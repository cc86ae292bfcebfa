"""DLK JSON under hostile input (issue 11, item 10): every refusal is one line, exit 2, names the
file (the model given to ``mconv export --format dlk-json`` included) and quotes names from the
file escaped and shortened."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from mconv.cli.app import app
from mconv.errors import InputError, UnsupportedError
from mconv.formats import import_model
from mconv.formats.dlk_json import FORMAT, model_to_dlk
from mconv.irio import from_proto
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _one_line(exc: InputError) -> str:
    line = exc.line()
    assert "\n" not in line and "\x1b" not in line and len(line) <= 700, line
    for part in (exc.message, exc.where or ""):  # show() at the source, not only line()'s backstop
        assert "\n" not in part and "\x1b" not in part and len(part) <= 600, part
    return line


def _cli(*args: str) -> tuple[int, list[str]]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, [ln for ln in r.output.splitlines() if ln.strip()]


def _doc(seed: int, **conv_fields) -> dict:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    conv = {
        "name": "conv1",
        "type": "Convolution",
        "convolution_param": {"pad": 1, "kernel_size": 3, "stride": 1},
        "blobs": [
            {"shape": {"dim": [2, 1, 3, 3]}, "data": w.ravel().tolist()},
            {"shape": {"dim": [2]}, "data": [0.0, 0.0]},
        ],
        **conv_fields,
    }
    return {"input": ["data"], "input_shape": [{"dim": [1, 1, 5, 5]}], "layer": [conv]}


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"layer": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests too deeply"),
        ('{"layer": [' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "]}", "nests too deeply"),
        ('{"layer": [], "input_dim": [' + "9" * 5000 + "]}", "out of range"),
    ],
    ids=["deep-list", "deep-object", "5000-digit-int"],
)
def test_json_the_decoder_cannot_hold_is_one_line_exit_2(tmp_path, text, match):
    p = tmp_path / "net.json"
    p.write_text(text)
    with pytest.raises(InputError, match=match) as err:
        import_model([p], format="dlk-json")
    assert _one_line(err.value).startswith(str(p))
    code, lines = _cli("import", str(p), "--format", "dlk-json", "-o", str(tmp_path / "o.onnx"))
    assert code == 2 and len(lines) == 1 and "net.json" in lines[0]


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"top": 5}, "'top' must be a blob name"),
        ({"top": {"a": 1}}, "'top' must be a blob name"),
        ({"bottom": [1, 2]}, "'bottom' must be a blob name"),
        ({"name": {"x": 1}}, "layer name is a JSON dict"),
    ],
)
def test_wrongly_typed_layer_fields_are_input_errors(tmp_path, fields, match):
    p = tmp_path / "net.json"
    p.write_text(json.dumps(_doc(7, **fields)))
    with pytest.raises(InputError, match=match) as err:
        import_model([p])
    assert _one_line(err.value).startswith(str(p))


def test_hostile_names_are_escaped_and_shortened(tmp_path):
    name = "evil\n\x1b[2J" + "q" * 4000
    doc = _doc(8)
    doc["layer"].append(
        {"name": name, "type": "Pooling", "bottom": ["conv1"], "pooling_param": {"kernel_size": [2, 3]}}
    )
    p = tmp_path / "net.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="must be one number") as err:
        import_model([p])
    assert "layer 'evil\\x0a\\x1b[2J" in _one_line(err.value)
    doc["layer"][-1] = {"name": name, "type": "Warp\nDrive", "bottom": ["conv1"]}
    p.write_text(json.dumps(doc))
    with pytest.raises(UnsupportedError) as err:
        import_model([p])
    assert "Warp\\x0aDrive" in _one_line(err.value)


# --- the writer ------------------------------------------------------------------------------------


def _onnx(path, nodes, inits=(), out="y") -> object:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
    proto = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], list(inits)), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(proto, path)
    return from_proto(proto)


def test_export_refusals_name_the_model_file(tmp_path):
    src = tmp_path / "model.onnx"
    model = _onnx(
        src,
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Sigmoid", ["r"], ["y"], name="sig\nmoid"),
        ],
    )
    with pytest.raises(UnsupportedError) as err:
        model_to_dlk(model, str(src))
    assert _one_line(err.value).startswith(f"{src}: 1 unsupported node(s): sig\\x0amoid (Sigmoid)")
    with pytest.raises(UnsupportedError) as err:
        FORMAT.save(model, tmp_path / "x.json", {"source": str(src)})
    assert _one_line(err.value).startswith(str(src))


def test_cli_export_refusal_names_the_model_file(tmp_path):
    src = tmp_path / "model.onnx"
    _onnx(src, [helper.make_node("Sigmoid", ["x"], ["y"], name="sig")])
    out = tmp_path / "x.json"
    code, lines = _cli("export", str(src), "--format", "dlk-json", "-o", str(out))
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {src}: "), lines
    assert "sig (Sigmoid)" in lines[0] and not out.exists()


def test_export_of_a_model_without_a_chain_end_names_the_file(tmp_path):
    src = tmp_path / "two.onnx"
    model = _onnx(
        src,
        [helper.make_node("Relu", ["x"], ["r"], name="a"), helper.make_node("Relu", ["r"], ["y"], name="b")],
        out="r",
    )
    with pytest.raises(InputError, match="not the end of the layer chain") as err:
        model_to_dlk(model, str(src))
    assert _one_line(err.value).startswith(str(src))


@pytest.mark.parametrize("op", ["Conv", "MaxPool"])
def test_malformed_pool_and_conv_attributes_are_named_not_internal_errors(tmp_path, op):
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3)).astype(np.float32), "w")
    if op == "Conv":  # one kernel size and one stride for two spatial axes
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="bad", kernel_shape=[3], strides=[1])
    else:  # one pad for four sides
        node = helper.make_node("MaxPool", ["x"], ["y"], name="bad", kernel_shape=[2, 2], pads=[1])
    model = _onnx(tmp_path / "m.onnx", [node], [w] if op == "Conv" else [])
    with pytest.raises(UnsupportedError) as err:
        model_to_dlk(model, "m.onnx")
    assert err.value.items == [("bad", f"{op} (malformed attributes: IndexError)")]
