"""Caffe at scale and under hostile input (issue 11, items 7 and 10): linear import time, bounded
nesting, errors that name the file at fault (the .caffemodel for its blobs) and quote names from
the file escaped and shortened."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mconv.cli.app import app
from mconv.errors import InputError, UnsupportedError
from mconv.formats import import_model
from mconv.formats.caffe import _Builder, make_blob, parse_prototxt, write_caffemodel
from typer.testing import CliRunner

INPUT = (
    'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 5 dim: 5 } } }\n'
)
HEAD = INPUT + (
    'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
    "convolution_param { num_output: 3 kernel_size: 3 } }\n"
)
IP = 'layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 4 } }\n'


def _weights(seed: int) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        "conv": [rng.standard_normal((3, 2, 3, 3)).astype(np.float32), np.zeros(3, np.float32)],
        "ip": [rng.standard_normal((4, 27)).astype(np.float32), np.zeros(4, np.float32)],
    }


def _caffemodel(path: Path, prototxt: str, weights: dict[str, list[np.ndarray]]) -> Path:
    net = parse_prototxt(prototxt)
    for layer in net.layer:
        for a in weights.get(layer.name, []):
            layer.blobs.append(make_blob(a))
    return write_caffemodel(net, path)


def _pair(tmp_path: Path, prototxt: str, weights, *, model_text: str | None = None) -> tuple[Path, Path]:
    """A deploy prototxt and a caffemodel (made from ``model_text``, default the same net)."""
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(prototxt)
    return proto, _caffemodel(tmp_path / "trained.caffemodel", model_text or prototxt, weights)


def _one_line(exc: InputError, limit: int = 700) -> str:
    line = exc.line()
    assert "\n" not in line and "\r" not in line and len(line) <= limit, line
    return line


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


# --- item 7: linear import time, bounded nesting --------------------------------------------------


def test_50000_in_place_layers_import_in_linear_time(tmp_path):
    # 10,000 in-place ReLUs took 17 s and 20,000 took 54 s when each fresh name probed the names
    # one at a time; linear, 50,000 take a few seconds. The bound only proves "not quadratic":
    # quadratic would take many minutes here.
    n = 50_000
    relus = "".join(
        f'layer {{ name: "relu{i}" type: "ReLU" bottom: "conv" top: "conv" }}\n' for i in range(n)
    )
    proto, model = _pair(tmp_path, HEAD + relus, _weights(1), model_text=HEAD)
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from mconv.formats import import_model
        m = import_model([Path({str(proto)!r}), Path({str(model)!r})])
        nodes = list(m.graph)
        print(len(nodes), nodes[-1].name, nodes[-1].outputs[0].name)
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(n + 1), f"relu{n - 1}", f"conv/{n}"]


def test_fresh_names_follow_the_suffix_rule_without_rescanning():
    b = _Builder(path="x")
    b.used.update({"a/2", "a/3"})
    assert [b.fresh("a") for _ in range(4)] == ["a", "a/1", "a/4", "a/5"]
    assert b.fresh("a/1") == "a/1/1"  # "a/1" is taken; its own suffixes start again at 1
    # 200,000 names from one base: linear is well under a second, quadratic never ends.
    script = (
        "from mconv.formats.caffe import _Builder\n"
        "b = _Builder(path='x')\n"
        "names = [b.fresh('conv') for _ in range(200_000)]\n"
        "assert names[-1] == 'conv/199999' and len(set(names)) == 200_000\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("depth", [65, 2_000, 200_000])
def test_deeply_nested_prototxt_is_one_line_exit_2(tmp_path, depth):
    p = tmp_path / "deep.prototxt"
    p.write_text('name: "x"\n' + "layer { " * depth + "}" * depth + "\n")
    with pytest.raises(InputError, match="nest more than 64 levels") as err:
        import_model([p])
    assert "deep.prototxt" in _one_line(err.value)
    code, out = _cli("import", str(p), "-o", str(tmp_path / "o.onnx"))
    assert code == 2 and "deep.prototxt" in out and "Traceback" not in out
    assert not (tmp_path / "o.onnx").exists()


def test_braces_inside_strings_and_comments_do_not_count_as_nesting(tmp_path):
    p = tmp_path / "ok.prototxt"
    # 70 levels of braces inside a string and a comment: not nesting.
    p.write_text(
        f'name: "{"{" * 70}"\n# {"{" * 70}\n'
        + HEAD
        + 'layer { name: "r" type: "ReLU" bottom: "conv" top: "conv" }\n'
    )
    net = parse_prototxt(p.read_text(), str(p))
    assert net.name == "{" * 70 and len(net.layer) == 3


def test_huge_repeated_dims_are_refused_quickly(tmp_path):
    # 100,000 62-bit dims: math.prod over them grows a 6-million-bit integer one multiplication at
    # a time (quadratic); Caffe's rank limit (32 axes) is checked first.
    dims = " ".join(["dim: 4611686018427387904"] * 100_000)
    p = tmp_path / "huge.prototxt"
    p.write_text(
        f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n'
        'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
    )
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from mconv.errors import InputError\n"
        "from mconv.formats import import_model\n"
        "try:\n"
        f"    import_model([Path({str(p)!r})])\n"
        "except InputError as exc:\n"
        "    print(exc.line())\n"
        "    sys.exit(2)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "huge.prototxt" in r.stdout and "unusable shape" in r.stdout and len(r.stdout) < 700


def test_blob_with_too_many_axes_names_the_caffemodel(tmp_path):
    proto, model = _pair(tmp_path, HEAD + IP, {})
    net = parse_prototxt(HEAD + IP)
    for layer in net.layer:
        for a in _weights(2).get(layer.name, []):
            layer.blobs.append(make_blob(a))
    net.layer[1].blobs[0].shape.dim.extend([1] * 100_000)
    write_caffemodel(net, model)
    with pytest.raises(InputError, match="axes") as err:
        import_model([proto, model])
    line = _one_line(err.value)
    assert line.startswith(str(model)) and "layer 'conv' blob 0" in line


# --- item 10: the file at fault is named -----------------------------------------------------------


def test_blob_count_mismatch_names_the_caffemodel_and_the_layer(tmp_path):
    weights = dict(_weights(3))
    weights["ip"] = [np.ones((4, 13), np.float32), np.zeros(4, np.float32)]
    proto, model = _pair(tmp_path, HEAD + IP, weights)
    for order in ([proto, model], [model, proto]):
        with pytest.raises(InputError, match="expected shape") as err:
            import_model(order)
        line = _one_line(err.value)
        assert line.startswith(f"{model}: layer 'ip' (InnerProduct)"), line
        assert "deploy.prototxt" not in line


def test_blob_data_not_matching_its_shape_names_the_caffemodel(tmp_path):
    proto, model = _pair(tmp_path, HEAD + IP, {})
    net = parse_prototxt(HEAD + IP)
    blob = make_blob(_weights(4)["conv"][0])
    del blob.data[-1]  # 53 values for a 3x2x3x3 shape
    net.layer[1].blobs.append(blob)
    write_caffemodel(net, model)
    with pytest.raises(InputError, match="holds 53 values") as err:
        import_model([proto, model])
    line = _one_line(err.value)
    assert line.startswith(f"{model}: layer 'conv' blob 0"), line
    code, out = _cli("import", str(proto), str(model), "-o", str(tmp_path / "o.onnx"))
    assert code == 2 and "trained.caffemodel: layer 'conv' blob 0" in out


def test_layer_missing_from_the_caffemodel_names_the_caffemodel(tmp_path):
    proto, model = _pair(tmp_path, HEAD + IP, _weights(5), model_text=HEAD)
    with pytest.raises(InputError, match="missing weight blob 0") as err:
        import_model([proto, model])
    assert _one_line(err.value).startswith(f"{model}: layer 'ip'")


def test_prototxt_without_caffemodel_still_names_the_prototxt(tmp_path):
    p = tmp_path / "deploy.prototxt"
    p.write_text(HEAD + IP)
    with pytest.raises(InputError, match="missing weight blob 0") as err:
        import_model([p])
    assert _one_line(err.value).startswith(f"{p}: layer 'conv'")


def test_v1_and_new_layers_mixed_names_the_file(tmp_path):
    net = parse_prototxt(HEAD)
    v1 = net.layers.add()
    v1.name = "old"
    path = write_caffemodel(net, tmp_path / "mixed.caffemodel")
    with pytest.raises(InputError, match="mixes V1") as err:
        import_model([path])
    assert _one_line(err.value).startswith(str(path))


# --- item 10: names from the file, escaped and shortened -----------------------------------------


def test_hostile_layer_names_in_unsupported_error_are_escaped(tmp_path):
    p = tmp_path / "net.prototxt"
    bad_name = "evil\\n\\033[31mred\\r" + "x" * 5000  # prototxt escapes: newline, ESC, CR
    p.write_text(INPUT + f'layer {{ name: "{bad_name}" type: "Warp\\nX" bottom: "data" top: "w" }}\n')
    with pytest.raises(UnsupportedError) as err:
        import_model([p], options={})
    line = _one_line(err.value)
    assert "evil\\x0a\\x1b[31mred\\x0d" in line and "Warp\\x0aX" in line and "xxxxx" in line
    assert all(len(name) <= 60 for name, _ in err.value.items)
    code, out = _cli("import", str(p), "-o", str(tmp_path / "o.onnx"))
    assert code == 2 and "\x1b" not in out and len([ln for ln in out.splitlines() if ln.strip()]) == 1


def test_hostile_missing_bottom_names_are_escaped_and_bounded(tmp_path):
    p = tmp_path / "net.prototxt"
    bottoms = " ".join(f'bottom: "b{i}\\n{"y" * 3000}"' for i in range(500))
    p.write_text(INPUT + f'layer {{ name: "cat" type: "Concat" {bottoms} top: "c" }}\n')
    with pytest.raises(InputError, match="produced by no earlier layer") as err:
        import_model([p])
    line = _one_line(err.value)
    assert "(500 in all)" in line and "b0\\x0a" in line


def test_non_utf8_layer_name_in_caffemodel_is_escaped(tmp_path):
    net = parse_prototxt(HEAD)
    raw = bytearray(net.SerializeToString())
    at = raw.index(b"conv")
    raw[at : at + 4] = b"\xff\n\x1b\xfe"  # the conv layer's name: same length, not UTF-8
    path = tmp_path / "bytes.caffemodel"
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="not UTF-8") as err:
        import_model([path])
    line = _one_line(err.value)
    assert line.startswith(str(path)) and "\\xff\\x0a\\x1b\\xfe" in line


def test_hostile_names_in_import_notes_stay_one_note_each(tmp_path):
    text = (
        HEAD
        + 'layer { name: "drop\\nout" type: "Dropout" bottom: "conv" top: "conv" }\n'
        + IP
        + 'layer { name: "ip" type: "ReLU" bottom: "ip" top: "ip" }\n'  # a repeated name: a note
    )
    proto, model = _pair(tmp_path, text, _weights(6))
    m = import_model([proto, model])
    notes = m.metadata_props["mconv.import_notes"].split("\n")
    assert "skipped train-time layer 'drop\\x0aout' (Dropout)" in notes
    assert "layer name 'ip' repeats; weights are matched by name" in notes
