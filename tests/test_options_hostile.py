"""Hostile pass options, recipes, data and bundles: every one is one ``error:`` line and exit 2
(never exit 3, never gigabytes allocated first), and a command that succeeds prints no numpy
warning. Each case builds its input inside the test."""

from __future__ import annotations

import hashlib
import json
import resource
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.bundle import TensorSpec, load_bundle, write_bundle
from mconv.cli.app import app
from mconv.cli.output import out_of_memory
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "fixtures" / "digits_mlp.onnx"  # input [N, 64] -> logits [N, 10]


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "-q"])


def _one_error_line(r, *words: str) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _tiny(path: Path, w: np.ndarray | None = None) -> Path:
    if w is None:
        w = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", w.shape[1]])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _limited(args: list[str], cwd: Path, limit: int = 3 << 30) -> subprocess.CompletedProcess:
    """``python -m mconv ARGS`` with its address space limited to ``limit`` bytes."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "mconv", *args, "-q"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
    )


# --- pass options bounded by what a model can use ----------------------------------------------


@pytest.mark.parametrize(
    "spec, word",
    [
        ("cluster(bits=4, groups=100000000000)", "groups="),
        ("cluster(bits=4, max_iter=1000000000000)", "max_iter"),
        ("blockwise(bits=4, block=1048576)", "block="),
        ("finetune(epochs=1000000000000)", "epochs="),
        ("finetune(batch_size=0)", "batch_size="),
        ("finetune(seed=-1)", "seed="),
        ("prune(sparsity=1.5)", "sparsity="),
        ("prune(n=2, m=1000000000000)", "m="),
        ("fp16(mode='auto', samples=0)", "samples="),
        ("cluster(index_bits=64)", "index_bits="),
    ],
)
def test_a_count_no_model_can_use_is_refused_when_the_spec_is_read(tmp_path, spec, word):
    out = tmp_path / "o.onnx"
    r = _cli("optimize", str(_tiny(tmp_path / "m.onnx")), "--passes", spec, "-o", str(out))
    _one_error_line(r, word)
    assert not out.exists()


def test_more_cluster_groups_than_channels_stays_small(tmp_path):
    # 10**9 groups of a 4-channel weight: each channel its own palette, not 10**9 empty splits
    # (10 GB and rising before); under a 3 GiB address space the run ends, and records 4 groups.
    m = _tiny(tmp_path / "m.onnx")
    r = _limited(
        ["optimize", m.name, "--passes", "cluster(bits=4, groups=1000000000)", "-o", "o.onnx"], tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    props = {p.key: p.value for p in onnx.load(tmp_path / "o.onnx").metadata_props}
    assert json.loads(props["mconv.compression"])["w"]["groups"] == 4


def test_blockwise_block_longer_than_twice_a_row_is_refused(tmp_path):
    w = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    out = tmp_path / "o.onnx"
    r = _cli(
        "optimize",
        str(_tiny(tmp_path / "m.onnx", w)),
        "--passes",
        "blockwise(block=1024, min_elements=1)",
        "-o",
        str(out),
    )
    _one_error_line(r, "block=1024", "128")
    assert not out.exists()


def test_non_finite_option_from_a_recipe_is_refused(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[pass]]\nname = "finetune"\nlr = nan\n')
    r = _cli(
        "optimize", str(_tiny(tmp_path / "m.onnx")), "--recipe", str(recipe), "-o", str(tmp_path / "o.onnx")
    )
    _one_error_line(r, "lr=nan")


@pytest.mark.parametrize("depth", [3000, 500, 20])
def test_recipe_nested_deep_is_one_line(tmp_path, depth):
    recipe = tmp_path / "deep.toml"
    recipe.write_text('[[pass]]\nname = "prune"\nop_types = ' + "[" * depth + "]" * depth + "\n")
    out = tmp_path / "o.onnx"
    r = _cli("optimize", str(_tiny(tmp_path / "m.onnx")), "--recipe", str(recipe), "-o", str(out))
    _one_error_line(r, "deep.toml", "nested")
    assert not out.exists()


# --- labels and non-finite data --------------------------------------------------------------


def _digits_data(path: Path, **over) -> Path:
    rng = np.random.default_rng(0)
    arrays = {"input": rng.random((32, 64)).astype(np.float32), "labels": rng.integers(0, 10, 32)}
    arrays.update(over)
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "labels, shown",
    [
        (np.array([1, 2, 10**12] + [0] * 29, np.int64), "index (2,)"),
        (np.array([1, -1] + [0] * 30, np.int64), "index (1,)"),
        (np.array([0.0, 1.0, 2.0, 1.5] + [0.0] * 28), "index (3,)"),
        (np.array([0] * 31 + [10], np.int64), "[0, 10)"),
    ],
)
def test_finetune_labels_out_of_the_classes_are_refused(tmp_path, labels, shown):
    data = _digits_data(tmp_path / "d.npz", labels=labels)
    out = tmp_path / "o.onnx"
    r = _cli("optimize", str(DIGITS), "--passes", "finetune(epochs=1)", "--data", str(data), "-o", str(out))
    _one_error_line(r, "labels", shown)
    assert not out.exists()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("spec", ["finetune(epochs=1)", "blockwise(bits=4, method='gptq', min_elements=1)"])
def test_non_finite_data_is_refused_naming_array_and_index(tmp_path, bad, spec):
    x = np.random.default_rng(0).random((32, 64)).astype(np.float32)
    x[3, 14] = bad
    data = _digits_data(tmp_path / "d.npz", input=x)
    out = tmp_path / "o.onnx"
    r = _cli("optimize", str(DIGITS), "--passes", spec, "--data", str(data), "-o", str(out))
    _one_error_line(r, "array 'input'", "index (3, 14)", "d.npz")
    assert not out.exists()


def test_data_beyond_the_models_float_type_is_refused(tmp_path):
    x = np.random.default_rng(0).random((32, 64))  # float64, the model takes float32
    x[5, 7] = 1e300
    data = _digits_data(tmp_path / "d.npz", input=x)
    r = _cli("verify", str(DIGITS), str(DIGITS), "--data", str(data))
    _one_error_line(r, "array 'input'", "index (5, 7)")


# --- zip bundles inflate no more than they declare ---------------------------------------------


def _write_bundle(out: Path, weights: np.ndarray) -> None:
    write_bundle(
        out,
        target="cpu",
        model_name="z",
        inputs=[TensorSpec("x", "float32", ("N", 3))],
        outputs=[TensorSpec("y", "float32", ("N", 4))],
        weights=[("w", weights, {"codec": "raw"})],
        payload={"model.onnx": b"x" * 100},
        options={},
        provenance={},
    )


def _zip(src: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(src.iterdir()):
            zf.write(f, f.name)
    return dest


def test_zip_bundle_whose_weights_inflate_far_past_their_stored_size_is_refused(tmp_path):
    _write_bundle(tmp_path / "b", np.zeros(20 << 20, np.float32))  # 80 MiB of zeros: deflates ~1000x
    z = _zip(tmp_path / "b", tmp_path / "b.zip")
    assert z.stat().st_size < 1 << 20
    digest = hashlib.sha256(z.read_bytes()).hexdigest()
    r = _cli("inspect", str(z))
    _one_error_line(r, "b.zip", "weights.mcw", "inflates")
    assert hashlib.sha256(z.read_bytes()).hexdigest() == digest


def test_zip_bundle_weights_are_mapped_or_inflated_to_disk_not_memory(tmp_path):
    w = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    _write_bundle(tmp_path / "b", w)
    deflated = load_bundle(_zip(tmp_path / "b", tmp_path / "d.zip"))
    with deflated.container() as c:
        assert np.array_equal(c.array("w"), w)
    with zipfile.ZipFile(tmp_path / "s.zip", "w", zipfile.ZIP_STORED) as zf:
        for f in sorted((tmp_path / "b").iterdir()):
            zf.write(f, f.name)
    with load_bundle(tmp_path / "s.zip").container() as c:
        assert np.array_equal(c.array("w"), w)


# --- memory that runs out ----------------------------------------------------------------------


def test_a_tensor_larger_than_the_memory_limit_is_exit_2_saying_what_it_needs(tmp_path):
    n = 2**31  # 8 GiB of float32, in a sparse file: no disk used
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[n])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", str(n * 4))):
        e = t.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        [t],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "big.onnx")
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(n * 4)
    for args in (
        ["optimize", "big.onnx", "--passes", "fp16", "-o", "o.onnx"],
        ["export", "big.onnx", "-o", "b"],
    ):
        r = _limited(args, tmp_path)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert "needs 8.00 GiB of memory" in lines[0]
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "b").exists()


def test_numpy_memory_error_says_the_size_asked_for():
    with pytest.raises(MemoryError) as info:
        np.empty(1 << 55, np.uint8)  # 32 PiB: numpy refuses at once
    err = out_of_memory(info.value)
    assert err.exit_code == 2 and "needs 32.00" not in err.line()
    assert f"needs {(1 << 55) / 2**30:.2f} GiB" in err.line()


# --- no numpy warnings on stderr ---------------------------------------------------------------


def test_verify_of_a_model_whose_outputs_overflow_prints_no_warning(tmp_path):
    w = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    w[1, 1] = 3e38  # float16 makes it inf: outputs inf and NaN
    src = _tiny(tmp_path / "m.onnx", w)
    half = tmp_path / "h.onnx"
    r = _cli("optimize", str(src), "--passes", "fp16(mode=all)", "-o", str(half))
    assert r.exit_code == 0 and r.output.strip() == "", r.output
    r = _cli("verify", str(src), str(half))
    assert r.exit_code == 1, r.output  # a failed gate, not exit 3 (math domain error before)
    assert "Warning" not in r.output and "encountered" not in r.output, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cosine" in lines[0], r.output
