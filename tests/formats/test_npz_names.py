"""An .npz is written for any array names (mconv.npzio.write_npz): numpy.savez takes the arrays as
keyword arguments, so a tensor named 'file' was an internal error (exit 3) and one named
'allow_pickle' was dropped from the archive without a word."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
from mconv.cli.app import app
from mconv.formats import get_format
from mconv.formats.weights import weight_only_model
from mconv.npzio import read_npz, write_npz
from typer.testing import CliRunner

NAMES = ("file", "allow_pickle", "args", "w")


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((2, i + 1)).astype(np.float32) for i, name in enumerate(NAMES)}


def _npz_by_hand(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, a in arrays.items():
            with zf.open(name + ".npy", "w") as f:
                np.lib.format.write_array(f, a, allow_pickle=False)


def test_write_npz_keeps_every_name_as_numpy_reads_it():
    src = _arrays(0)
    buf = io.BytesIO()
    write_npz(buf, src.items())
    buf.seek(0)
    with zipfile.ZipFile(buf) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == [f"{n}.npy" for n in NAMES]
        assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as back:
        assert list(back.keys()) == list(NAMES)
        for name, a in src.items():
            np.testing.assert_array_equal(back[name], a)


def test_npz_save_of_weights_named_like_savez_keywords(tmp_path):
    src = _arrays(1)
    model = weight_only_model(list(src.items()), name="w", path="w.npz")
    out = tmp_path / "out.npz"
    get_format("npz").save(model, out, {})
    back = dict(read_npz(out))
    assert list(back) == list(NAMES)
    for name, a in src.items():
        np.testing.assert_array_equal(back[name], a)


def test_cli_npz_to_npz_with_a_tensor_named_file(tmp_path):
    src = _arrays(2)
    _npz_by_hand(tmp_path / "w.npz", src)
    out = tmp_path / "out.npz"
    r = CliRunner().invoke(app, ["export", str(tmp_path / "w.npz"), "--format", "npz", "-o", str(out)])
    assert r.exit_code == 0, r.output
    with np.load(out, allow_pickle=False) as back:
        assert sorted(back.keys()) == sorted(NAMES)
        for name, a in src.items():
            np.testing.assert_array_equal(back[name], a)


def test_run_writes_an_output_named_file(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["file"]), helper.make_node("Neg", ["x"], ["allow_pickle"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("file", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("allow_pickle", TensorProto.FLOAT, [2, 3]),
        ],
    )
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npz"
    r = CliRunner().invoke(
        app, ["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(out), "-q"]
    )
    assert r.exit_code == 0, r.output
    with np.load(out, allow_pickle=False) as back:
        np.testing.assert_array_equal(back["file"], np.maximum(x, 0))
        np.testing.assert_array_equal(back["allow_pickle"], -x)
