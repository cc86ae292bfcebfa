"""Weight files (formats/weights.py safetensors, formats/npz_format.py) as weight-only models, the
weights bundle (targets/weights/), and the weight-only CLI pipeline (optimize, verify)."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from mconv.bundle import load_bundle
from mconv.errors import InputError
from mconv.formats import get_format, import_model
from mconv.formats.weights import is_weight_only, model_arrays
from mconv.irio import load_onnx, save_onnx
from safetensors.numpy import load_file, save_file


def mconv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "conv1.weight": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "fc.weight": rng.standard_normal((10, 24)).astype(np.float32),
        "norm.scale": rng.standard_normal(32).astype(np.float16),
        "steps": np.array([7, -3], dtype=np.int64),
        "mask": np.array([True, False, True]),
    }


# --- safetensors ---------------------------------------------------------------------------------


def test_safetensors_written_by_the_official_writer_imports_every_tensor(tmp_path: Path) -> None:
    src = _tensors()
    path = tmp_path / "w.safetensors"
    save_file(src, str(path), metadata={"framework": "test"})
    model = import_model([path])
    assert is_weight_only(model) and len(model.graph) == 0
    got = model_arrays(model)
    assert set(got) == set(src)
    for name, array in src.items():
        assert got[name].dtype == array.dtype
        np.testing.assert_array_equal(got[name], array)
    assert json.loads(model.metadata_props["mconv.safetensors_metadata"]) == {"framework": "test"}


def test_safetensors_save_is_read_back_by_the_official_reader(tmp_path: Path) -> None:
    src = _tensors()
    save_file(src, str(tmp_path / "in.safetensors"))
    model = import_model([tmp_path / "in.safetensors"])
    written = get_format("safetensors").save(model, tmp_path / "out.safetensors", {})
    assert written == [tmp_path / "out.safetensors"]
    back = load_file(str(tmp_path / "out.safetensors"))
    assert set(back) == set(src)
    for name, array in src.items():
        np.testing.assert_array_equal(back[name], array)


def test_safetensors_save_of_a_graph_model_writes_every_initializer(tmp_path: Path) -> None:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([0.5, -1.0], dtype=np.float32)
    x = ir.Value(name="x", shape=ir.Shape([1, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    wv = ir.Value(name="W", const_value=ir.tensor(w, name="W"))
    bv = ir.Value(name="B", const_value=ir.tensor(b, name="B"))
    node = ir.Node("", "Gemm", [x, wv, bv], attributes=[ir.AttrInt64("transB", 1)], name="fc")
    graph = ir.Graph([x], node.outputs, nodes=[node], initializers=[wv, bv], opset_imports={"": 17})
    get_format("safetensors").save(ir.Model(graph, ir_version=10), tmp_path / "g.safetensors", {})
    back = load_file(str(tmp_path / "g.safetensors"))
    np.testing.assert_array_equal(back["W"], w)
    np.testing.assert_array_equal(back["B"], b)


def _header_file(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_safetensors_header_length_beyond_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 10_000) + b'{"a": 1}')
    with pytest.raises(InputError, match=r"header length 10000 runs past the end of the 16-byte file") as err:
        import_model([path])
    assert "byte offset 0" in str(err.value) and "\n" not in str(err.value)


def test_truncated_safetensors_names_the_tensor_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "full.safetensors"
    save_file(_tensors(), str(path))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(InputError, match=r"tensor '.+' data \[\d+, \d+\) lies outside") as err:
        import_model([cut])
    assert "byte offset" in str(err.value)


def test_safetensors_absurd_shape_is_refused_before_any_allocation(tmp_path: Path) -> None:
    header = {"huge": {"dtype": "F32", "shape": [1 << 40, 1 << 20], "data_offsets": [0, 16]}}
    path = _header_file(tmp_path / "absurd.safetensors", header, b"\0" * 16)
    with pytest.raises(InputError, match=r"tensor 'huge' holds 16 bytes but shape .* needs"):
        import_model([path])


def test_safetensors_bad_json_and_bad_dtype_are_one_line_errors(tmp_path: Path) -> None:
    path = tmp_path / "j.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(InputError, match="header is not valid JSON"):
        import_model([path])
    header = {"t": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}
    with pytest.raises(InputError, match="unsupported dtype 'C64'"):
        import_model([_header_file(tmp_path / "d.safetensors", header, b"\0" * 8)])


# --- npz -----------------------------------------------------------------------------------------


def test_npz_round_trip_matches_numpy(tmp_path: Path) -> None:
    src = _tensors()
    np.savez(tmp_path / "w.npz", **src)
    model = import_model([tmp_path / "w.npz"])
    assert is_weight_only(model)
    got = model_arrays(model)
    assert list(got) == list(src)
    get_format("npz").save(model, tmp_path / "out.npz", {})
    with np.load(tmp_path / "out.npz", allow_pickle=False) as back:
        for name, array in src.items():
            np.testing.assert_array_equal(got[name], array)
            np.testing.assert_array_equal(back[name], array)


def test_npz_with_an_absurd_header_shape_is_refused(tmp_path: Path) -> None:
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1024), }"
    header += " " * (118 - len(header)) + "\n"
    member = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 64
    path = tmp_path / "absurd.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("w.npy", member)
    with pytest.raises(InputError, match=r"member 'w.npy'.*header claims shape"):
        import_model([path])


def test_npz_with_an_object_array_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "obj.npz"
    np.savez(path, w=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match="pickled array"):
        import_model([path])


def test_truncated_npz_is_a_one_line_error(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", **_tensors())
    cut = tmp_path / "cut.npz"
    cut.write_bytes((tmp_path / "w.npz").read_bytes()[:300])
    with pytest.raises(InputError) as err:
        import_model([cut])
    assert "\n" not in str(err.value)


# --- weight-only models through .onnx and the pipeline ---------------------------------------------


def test_weight_only_model_survives_onnx_save_and_load(tmp_path: Path) -> None:
    src = _tensors()
    np.savez(tmp_path / "w.npz", **src)
    save_onnx(import_model([tmp_path / "w.npz"]), tmp_path / "w.onnx")
    back = load_onnx(tmp_path / "w.onnx")
    assert is_weight_only(back)
    for name, array in src.items():
        np.testing.assert_array_equal(model_arrays(back)[name], array)


def _snr_db(ref: np.ndarray, cand: np.ndarray) -> float:
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    return 10 * math.log10(float(np.sum(r**2)) / float(np.sum((r - c) ** 2)))


def test_cli_cluster_of_a_safetensors_file_writes_a_palette_weights_bundle_and_verify_reports_snr(
    tmp_path: Path,
) -> None:
    src = _tensors()
    save_file(src, str(tmp_path / "w.safetensors"))
    proc = mconv(
        "optimize", "w.safetensors", "--passes", "cluster(bits=4)", "-o", "out", "--json", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    bundle = load_bundle(tmp_path / "out")
    assert bundle.target == "weights" and bundle.inputs == [] and bundle.outputs == []
    codecs = {w["name"]: w["codec"] for w in bundle.weights}
    assert codecs["conv1.weight"] == "palette" and codecs["fc.weight"] == "palette"
    with bundle.container() as c:
        got = {n: np.array(c.array(n)) for n in c.names}
    assert set(got) == set(src)
    for name in ("conv1.weight", "fc.weight", "norm.scale"):  # every float tensor, ndim >= 1
        assert np.unique(got[name]).size <= 16 < np.unique(src[name]).size
    np.testing.assert_array_equal(got["steps"], src["steps"])

    proc = mconv("verify", "w.safetensors", "out", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc["outputs"]) == set(src)
    for name in ("conv1.weight", "fc.weight"):
        assert doc["outputs"][name]["snr_db"] == pytest.approx(_snr_db(src[name], got[name]), rel=1e-9)
        assert "top1_agreement" not in doc["outputs"][name]
    assert doc["outputs"]["steps"]["max_abs"] == 0.0

    proc = mconv("verify", "w.safetensors", "out", "--min-cosine", "0.9999", cwd=tmp_path)
    assert proc.returncode == 1
    assert "conv1.weight" in proc.stderr


def test_cli_optimize_to_a_safetensors_path_writes_safetensors(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", **_tensors())
    proc = mconv("optimize", "w.npz", "--passes", "cluster(bits=3)", "-o", "c.safetensors", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    back = load_file(str(tmp_path / "c.safetensors"))
    assert np.unique(back["fc.weight"]).size <= 8
    proc = mconv("verify", "w.npz", "c.safetensors", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outputs"]["fc.weight"]["snr_db"] == pytest.approx(
        _snr_db(_tensors()["fc.weight"], back["fc.weight"]), rel=1e-9
    )


def test_weights_bundle_cannot_be_run(tmp_path: Path) -> None:
    from mconv.api.runtime import open_runner
    from mconv.targets.weights import export_weights

    np.savez(tmp_path / "w.npz", **_tensors())
    export_weights(import_model([tmp_path / "w.npz"]), tmp_path / "b", {})
    with pytest.raises(InputError, match="nothing to run"):
        open_runner(tmp_path / "b")


def test_lossless_recipe_keeps_every_tensor_of_a_weight_only_model(tmp_path: Path) -> None:
    from mconv import passes as P

    src = _tensors()
    np.savez(tmp_path / "w.npz", **src)
    model, _ = P.run_pipeline(import_model([tmp_path / "w.npz"]), P.parse_spec("lossless"), P.PassContext())
    got = model_arrays(model)
    assert set(got) == set(src)  # dce must not see unused tensors as dead
    for name, array in src.items():
        np.testing.assert_array_equal(got[name], array)


def test_weight_pair_matches_weight_files_bundles_and_weight_only_onnx_but_not_graphs(tmp_path: Path) -> None:
    from mconv.targets.weights import export_weights, weight_pair

    src = _tensors()
    save_file(src, str(tmp_path / "w.safetensors"))
    model = import_model([tmp_path / "w.safetensors"])
    save_onnx(model, tmp_path / "w.onnx")
    export_weights(model, tmp_path / "bundle", {})
    for a, b in (("w.safetensors", "w.onnx"), ("w.onnx", "bundle"), ("bundle", "w.safetensors")):
        ref, cand = weight_pair(tmp_path / a, tmp_path / b)
        for name, array in src.items():
            np.testing.assert_array_equal(ref[name], array)
            np.testing.assert_array_equal(cand[name], array)
    x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.Node("", "Relu", [x], name="relu")
    graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 17})
    node.outputs[0].name = "y"
    save_onnx(ir.Model(graph, ir_version=10), tmp_path / "g.onnx")
    assert weight_pair(tmp_path / "g.onnx", tmp_path / "g.onnx") is None
    assert weight_pair(tmp_path / "w.safetensors", tmp_path / "g.onnx") is None


def test_cli_export_of_a_weight_file_needs_the_weights_target(tmp_path: Path) -> None:
    src = _tensors()
    save_file(src, str(tmp_path / "w.safetensors"))
    proc = mconv("export", "w.safetensors", "-o", "cpu_bundle", cwd=tmp_path)
    assert proc.returncode == 2 and "--target weights" in proc.stderr
    assert not (tmp_path / "cpu_bundle").exists()
    proc = mconv("export", "w.safetensors", "--target", "weights", "-o", "wb", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with load_bundle(tmp_path / "wb").container() as c:
        for name, array in src.items():
            np.testing.assert_array_equal(c.array(name), array)  # uncompressed: stored losslessly
