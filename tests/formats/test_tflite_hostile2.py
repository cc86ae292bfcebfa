"""TFLite names from the file in messages (issue 11, items 10 and 15): escaped and shortened with
``mconv.errors.show``, so an error is one line however the file spells (or corrupts) a name; fresh
value names are found in linear time."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.cli.app import app
from mconv.errors import InputError, UnsupportedError
from mconv.formats.tflite.reader import load_tflite_bytes, read_tflite
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tflite_builder import TflBuilder  # noqa: E402

HOSTILE = "evil\n\x1b[2J\r" + "z" * 5000


def _one_line(exc: InputError) -> str:
    line = exc.line()
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and len(line) <= 700, line
    for part in (exc.message, exc.where or ""):  # show() at the source, not only line()'s backstop
        assert "\n" not in part and "\x1b" not in part and len(part) <= 600, part
    return line


def _fc_model(name: str = "y", weight_rows: int = 3, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    w = b.tensor(name, [3, 4], data=rng.standard_normal(weight_rows * 4).astype(np.float32))
    y = b.tensor("y_out", [1, 3])
    b.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    return b.build([x], [y])


def test_hostile_tensor_name_in_a_reader_error_is_escaped_and_short():
    data = _fc_model(HOSTILE, weight_rows=2)  # 32 bytes of data for a [3, 4] float tensor
    with pytest.raises(InputError, match="needs 48 bytes") as err:
        load_tflite_bytes(data, "m.tflite")
    line = _one_line(err.value)
    assert line.startswith("m.tflite") and "evil\\x0a\\x1b[2J\\x0d" in line and "\u2026" in line


def test_hostile_tensor_name_in_an_unsupported_op_is_escaped():
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    y = b.tensor(HOSTILE, [1, 4])
    b.op("SVDF", [x], [y])
    with pytest.raises(UnsupportedError) as err:
        load_tflite_bytes(b.build([x], [y]), "m.tflite")
    _one_line(err.value)
    (name, kind), *_ = err.value.items
    assert name.startswith("evil\\x0a") and len(name) <= 60 and kind == "SVDF"


def test_hostile_tensor_name_read_before_written_is_escaped():
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    a = b.tensor("a", [1, 4])
    c = b.tensor(HOSTILE, [1, 4])
    b.op("ADD", [x, c], [a], "AddOptions")
    b.op("RELU", [a], [c])
    with pytest.raises(InputError, match="before any operator writes it") as err:
        load_tflite_bytes(b.build([x], [c]), "m.tflite")
    assert "'evil\\x0a" in _one_line(err.value)


def _name_length_slot(data: bytes, tensor: int) -> int:
    import tflite

    t = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0).Tensors(tensor)
    o = t._tab.Offset(10)  # Tensor.name (field 3: vtable slot 4 + 2 * 3)
    return t._tab.Indirect(t._tab.Pos + o)  # the string's uint32 length prefix


def test_corrupt_name_length_reads_kilobytes_of_binary_but_the_message_stays_one_line():
    # The case hypothesis found: a mutated string length makes a tensor's name run on over the
    # rest of the file (newlines, NULs, float bytes) and into the message.
    data = bytearray(_fc_model("w", weight_rows=2))
    slot = _name_length_slot(bytes(data), 1)
    struct.pack_into("<I", data, slot, len(data) - slot - 8)
    with pytest.raises(InputError) as err:
        load_tflite_bytes(bytes(data), "m.tflite")
    line = _one_line(err.value)
    assert "needs 48 bytes" in line and "tensor 'w\\x00" in line and "\u2026" in line
    # The name itself is kept whole for the graph; only messages shorten it.
    model = read_tflite(bytes(_fc_model("w")), "m.tflite")
    assert model.tensors[1].name == "w"


def test_cli_import_of_hostile_name_is_one_line_exit_2(tmp_path):
    p = tmp_path / "m.tflite"
    p.write_bytes(_fc_model(HOSTILE, weight_rows=2))
    r = CliRunner().invoke(app, ["import", str(p), "-o", str(tmp_path / "o.onnx")])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "m.tflite" in lines[0] and "\x1b" not in r.output
    assert not (tmp_path / "o.onnx").exists()


def test_fresh_names_resume_their_suffix_search():
    from mconv.formats.tflite.reader import TflModel, _Converter

    c = _Converter(TflModel(3, [], [], [], []), "m.tflite", {})
    c.used_names.update({"a/2", "a/3"})
    assert [c.fresh("a") for _ in range(4)] == ["a", "a/1", "a/4", "a/5"]
    # 200,000 names from one base (an unrolled LSTM's step values, a shared constant's name):
    # linear is well under a second, quadratic would not finish.
    script = (
        "from mconv.formats.tflite.reader import TflModel, _Converter\n"
        "c = _Converter(TflModel(3, [], [], [], []), 'm', {})\n"
        "names = [c.fresh('clip_lo') for _ in range(200_000)]\n"
        "assert names[-1] == 'clip_lo/199999' and len(set(names)) == 200_000\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
