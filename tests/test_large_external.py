"""Every pass and every export target on a real-sized model whose weights are external data.

The model is onnx's light AlexNet with its 61M parameters filled with random values (244 MB in
``alexnet.onnx.data`` beside a 4 KB ``alexnet.onnx``), built once per module (per xdist worker)
and deleted after it. Each command runs as its own ``python -m mconv`` process from a working
folder other than the model's (an external tensor read relative to the working folder fails
there), and must exit 0: a written model must load in ONNX Runtime and, for a lossless pass,
compute what the source computes; a bundle must open with every file's size and hash checked.
The peak RSS of each command (``wait4``) is printed at the end of the module (``pytest -s``):
the weights stay on disk until a pass or an exporter needs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort  # noqa: E402
import pytest
from mconv.passes import PASSES  # noqa: E402

MIN_WEIGHT_BYTES = 64 << 20  # the model must be larger than this (the lazy-load threshold)
INPUT = "data_0"
OUTPUT = "prob_1"

# Every registered pass, with the options that keep it to seconds on 61M parameters.
# A test below fails when a pass is registered that this table does not list.
PASS_SPECS: dict[str, str] = {
    "shape-inference": "shape-inference",
    "fold": "fold",
    "dce": "dce",
    "eliminate-identity": "eliminate-identity",
    "fuse-bn": "fuse-bn",
    "inline-if": "inline-if",
    "dynamic-batch": "dynamic-batch",
    "fp16": "fp16",
    "round-fp16": "round-fp16",
    "quantize": "quantize",
    "prune": "prune",
    "cluster": "cluster",
    # DequantizeLinear's block_size needs opset 21: run on the opset-21 twin (same data file)
    "blockwise": "blockwise",
    # one epoch on one sample, only the last classifier layer trained
    "finetune": "finetune(epochs=1,freeze=True,op_name={'n22':{'freeze':False}})",
    # no training steps: the mixture's initial components, each weight snapped to its nearest mean
    "soft-share": "soft-share(epochs=0,components=3)",
}
NEEDS_DATA = {"finetune", "soft-share"}
NEEDS_OPSET_21 = {"blockwise"}
TARGETS = ("cpu", "xla", "metal", "webgpu", "weights")

PEAKS: dict[str, tuple[int, float, float]] = {}  # command -> (exit code, seconds, peak RSS in MB)


def _fill(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """N(0, 0.01) weights, biases 0.1 (the ReLUs stay alive), as bench/alexnet_speed.py fills."""
    if name.endswith("_b_0"):
        return np.full(shape, 0.1, np.float32)
    return rng.normal(0.0, 0.01, shape).astype(np.float32)


class Large:
    """The module's model: ``path`` (opset 9), ``path21`` (opset 21, the same data file), one
    calibration sample ``data`` (.npz with labels), and ONNX Runtime's outputs of the source."""

    def __init__(self, folder: Path):
        from mconv.fixtures.light import light_model
        from mconv.irio import to_proto

        folder.mkdir()
        self.folder = folder
        self.path = folder / "alexnet.onnx"
        proto = to_proto(light_model("bvlc_alexnet", _fill, 0))
        onnx.save(
            proto,
            self.path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="alexnet.onnx.data",
            size_threshold=1024,
        )
        del proto
        self.weight_bytes = (folder / "alexnet.onnx.data").stat().st_size
        # the same graph at opset 21, reading the same data file (nothing copied)
        self.path21 = folder / "alexnet21.onnx"
        light = onnx.load(self.path, load_external_data=False)
        onnx.save(onnx.version_converter.convert_version(light, 21), self.path21)
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
        self.data = folder / "data.npz"
        np.savez(self.data, **{INPUT: self.x[:1], "labels": np.array([3])})
        session = ort.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
        self.want = np.concatenate([session.run([OUTPUT], {INPUT: self.x[i : i + 1]})[0] for i in range(2)])
        del session
        self.work = folder / "work"  # the commands' working folder: not the model's
        self.work.mkdir()


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    folder = tmp_path_factory.mktemp("large") / "model"
    model = Large(folder)
    yield model
    shutil.rmtree(folder, ignore_errors=True)
    if PEAKS:
        print("\ncommand | exit | seconds | peak RSS (MB)")
        for cmd, (rc, secs, mb) in PEAKS.items():
            print(f"{cmd} | {rc} | {secs:.1f} | {mb:.0f}")


# ``python -m mconv`` that writes its own peak RSS (VmHWM: this process image's high-water mark;
# getrusage's ru_maxrss of a child also counts the forking test process's own size) on exit.
_LAUNCH = """
import atexit, sys
def _peak(path=sys.argv.pop(1)):
    with open("/proc/self/status") as f:
        kb = [ln.split()[1] for ln in f if ln.startswith("VmHWM:")]
    with open(path, "w") as f:
        f.write(kb[0] if kb else "0")
atexit.register(_peak)
sys.argv[0] = "mconv"
from mconv.cli.app import main
main()
"""


def _mconv(large: Large, label: str, *args: str) -> tuple[int, str]:
    """``python -m mconv ARGS`` in the working folder; its exit code and stderr. Records its
    time and peak RSS in PEAKS."""
    out, err, peak = (large.work / n for n in ("stdout.txt", "stderr.txt", "peak.txt"))
    env = {**os.environ, "COLUMNS": "200"}
    t0 = time.perf_counter()
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.run(
            [sys.executable, "-c", _LAUNCH, str(peak), *args, "-q"],
            cwd=large.work,
            stdout=fo,
            stderr=fe,
            env=env,
            timeout=600,
        )
    PEAKS[label] = (proc.returncode, time.perf_counter() - t0, int(peak.read_text() or 0) / 1024)
    return proc.returncode, err.read_text(errors="replace")


def _ok(rc: int, stderr: str) -> None:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-3000:]
    assert rc == 0, stderr[-3000:]


def _own_files_only(out: Path) -> None:
    """``out`` reads its weights from itself or its own ``.data`` file only (no reference left
    into the source, the scratch folder, or the working folder)."""
    from onnx.external_data_helper import _get_all_tensors

    assert out.is_file()
    proto = onnx.load(out, load_external_data=False)
    for tensor in _get_all_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = {e.key: e.value for e in tensor.external_data}["location"]
            assert location == out.name + ".data", (tensor.name, location)
            assert (out.parent / location).is_file()


def _run_ort(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([OUTPUT], {INPUT: x})[0]


def test_the_model_is_real_sized_with_external_data(large):
    assert large.weight_bytes > MIN_WEIGHT_BYTES
    assert large.path.stat().st_size < 1 << 16  # the graph alone: weights in the data file
    proto = onnx.load(large.path, load_external_data=False)
    assert all(
        t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer if len(t.dims) > 1
    )


def test_every_registered_pass_is_in_the_matrix():
    assert set(PASS_SPECS) == set(PASSES)


@pytest.mark.parametrize("name", sorted(PASS_SPECS))
def test_every_pass_runs_and_saves_a_large_external_model(large, name):
    source = large.path21 if name in NEEDS_OPSET_21 else large.path
    out = large.folder / f"out-{name}" / "model.onnx"
    out.parent.mkdir()
    args = ["optimize", str(source), "--passes", PASS_SPECS[name], "-o", str(out)]
    if name in NEEDS_DATA:
        args += ["--data", str(large.data)]
    try:
        _ok(*_mconv(large, f"optimize --passes {name}", *args))
        _own_files_only(out)
        batch = 2 if name == "dynamic-batch" else 1  # the symbolic batch takes two samples at once
        got = _run_ort(out, large.x[:batch])
        assert got.shape == large.want[:batch].shape and np.isfinite(got).all()
        if PASSES[name].lossless:
            tol = 1e-3 if name == "fp16" else 1e-6  # fp16: weights rounded to half, checked
            np.testing.assert_allclose(got, large.want[:batch], rtol=0, atol=tol)
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def test_blockwise_at_an_old_opset_is_one_line_exit_2(large):
    out = large.folder / "out-blockwise-9" / "model.onnx"
    args = ["optimize", str(large.path), "--passes", "blockwise", "-o", str(out)]
    rc, err = _mconv(large, "optimize --passes blockwise (opset 9)", *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "opset 21" in lines[0]
    assert not out.parent.exists()


@pytest.mark.parametrize("target", TARGETS)
def test_every_export_target_writes_a_bundle_of_a_large_external_model(large, target):
    from mconv.bundle import load_bundle

    out = large.folder / f"bundle-{target}"
    try:
        args = ["export", str(large.path), "--target", target, "-o", str(out)]
        _ok(*_mconv(large, f"export --target {target}", *args))
        bundle = load_bundle(out, verify=True)  # every file's size and sha256
        assert bundle.target == target
        stored = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        assert stored > large.weight_bytes // 3  # the weights are in it (float16 at the least)
    finally:
        shutil.rmtree(out, ignore_errors=True)


# --- the same failures on a small model (no large fixture) ------------------------------------


def _small_external(folder: Path) -> Path:
    """Reshape(x[1, 64], [1, 64]) -> MatMul by a 64x64 weight -> Add a 64 bias, weights in
    ``small.onnx.data`` (the bias under 1 KB, the weight over; the shape inside)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([1, 64], np.int64), "shape")
    g = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("MatMul", ["r", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["y"]),
        ],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [w, b, shape],
    )
    path = folder / "small.onnx"
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, location="small.onnx.data", size_threshold=64)
    return path


@pytest.mark.parametrize("threshold", [0, 1 << 40], ids=["data-file", "self-contained"])
def test_saving_while_views_of_mapped_weights_are_alive(tmp_path, threshold):
    """Something still holds arrays read through the weights' memory maps (an executor waiting
    for the garbage collector): the save neither closes those maps nor leaves a reference to
    the source's data file in the output."""
    from mconv.irio import load_onnx, save_onnx

    model = load_onnx(_small_external(tmp_path))
    views = [v.const_value.numpy() for v in model.graph.initializers.values()]
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    save_onnx(model, out, external_threshold=threshold)
    _own_files_only(out)
    assert (out.parent / "model.onnx.data").is_file() == (threshold == 0)
    x = np.ones((1, 64), np.float32)
    want = _run_ort_small(tmp_path / "small.onnx", x)
    np.testing.assert_array_equal(_run_ort_small(out, x), want)
    assert views[0].sum() == views[0].sum()  # still readable


def _run_ort_small(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def test_dynamic_batch_reads_external_weights_from_the_model_folder(tmp_path, monkeypatch):
    """The pass's check runs a copy of the model: the copy reads the weights from the model's
    folder, not from the working folder."""
    from mconv.cli.app import app
    from typer.testing import CliRunner

    source = _small_external(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(
        app, ["optimize", str(source), "--passes", "dynamic-batch", "-o", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    x = np.ones((3, 64), np.float32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(["y"], {"x": x})[0]
    want = _run_ort_small(source, x[:1])
    np.testing.assert_allclose(got, np.repeat(want, 3, axis=0), rtol=1e-6)
