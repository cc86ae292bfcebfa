"""A metal bundle is data: `mconv run` and `mconv verify` compile only kernels mconv regenerates
from the bundle's graph, never the shipped text, and the compiler reads nothing else."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.bundle import load_bundle, manifest_bytes
from mconv.cli.app import app
from mconv.errors import InputError, IntegrityError
from mconv.irio import load_onnx, to_proto
from mconv.targets.metal import GRAPH, PLAN, TARGET, kernels_path, read_plan
from mconv.targets.metal import harness as harness_mod
from metal_models import make_model, needs_cxx
from onnx import helper
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "fixtures" / "digits_mlp.onnx"
SECRET = b"MCONV-SECRET-7f3a9c"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return TARGET.export(load_onnx(DIGITS), tmp_path_factory.mktemp("metal") / "digits").root


@pytest.fixture()
def bundle(exported, tmp_path) -> Path:
    dest = tmp_path / "bundle"
    shutil.copytree(exported, dest)
    return dest


def _kernels_rel(bundle: Path) -> str:
    return kernels_path(read_plan(load_bundle(bundle)))


def _rehash(bundle: Path, rel: str) -> None:
    """What an attacker does after editing ``rel``: fix its size and sha256 in the manifest."""
    mpath = bundle / "manifest.json"
    manifest = json.loads(mpath.read_bytes())
    data = (bundle / rel).read_bytes()
    manifest["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    mpath.write_bytes(manifest_bytes(manifest))


def _edit(bundle: Path, rel: str, text: str) -> None:
    (bundle / rel).write_text(text)
    _rehash(bundle, rel)


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "-q"])


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and "Traceback" not in output
    return lines[0]


def _refused(bundle: Path, *, secret: bool = False) -> list[str]:
    """``mconv run B`` and ``mconv verify MODEL B``: exit 2, one line each; the lines."""
    lines = []
    for args in (("run", str(bundle)), ("verify", str(DIGITS), str(bundle))):
        r = _cli(*args)
        assert r.exit_code == 2, r.output
        lines.append(_one_error_line(r.output))
        if secret:
            assert SECRET.decode() not in r.output
    return lines


CANARY_CODE = """
#include <cstdlib>
static int mconv_canary = std::system("touch {canary}");
"""


def test_an_untampered_bundle_runs_and_verifies(bundle):
    for args in (("run", str(bundle)), ("verify", str(DIGITS), str(bundle))):
        r = _cli(*args)
        assert r.exit_code == 0, r.output
    assert (bundle / GRAPH).is_file()
    manifest = json.loads((bundle / "manifest.json").read_bytes())
    assert GRAPH in manifest["files"]


@needs_cxx
def test_a_static_initializer_in_kernels_metal_never_runs(bundle, tmp_path):
    canary = tmp_path / "canary"
    rel = _kernels_rel(bundle)
    tampered = (bundle / rel).read_text() + CANARY_CODE.format(canary=canary)
    plan = read_plan(load_bundle(bundle))
    _edit(bundle, rel, tampered)
    lines = _refused(bundle)
    assert all("kernels.metal is not what mconv generates" in ln and "re-export" in ln for ln in lines), lines
    assert not canary.exists()
    # the harness itself refuses the directive even when handed the text
    with pytest.raises(IntegrityError, match="preprocessor line"):
        harness_mod.compile_harness(plan, tampered)
    assert not canary.exists()


@needs_cxx
def test_the_canary_payload_is_live_when_compiled_as_plain_cpp(tmp_path):
    """Control: the same static initializer, compiled by g++ outside mconv, does create the file
    (so the tests above would see it if mconv compiled the shipped text)."""
    canary = tmp_path / "canary"
    src = tmp_path / "probe.cpp"
    src.write_text(CANARY_CODE.format(canary=canary) + "int main() { return 0; }\n")
    subprocess.run(["g++", "-o", str(tmp_path / "probe"), str(src)], check=True, cwd=tmp_path)
    subprocess.run([str(tmp_path / "probe")], check=True, cwd=tmp_path)
    assert canary.exists()


@needs_cxx
def test_an_include_of_a_secret_file_is_never_compiled_or_quoted(bundle, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET + b" is not C++\n")
    rel = _kernels_rel(bundle)
    _edit(bundle, rel, f'#include "{secret}"\n' + (bundle / rel).read_text())
    _refused(bundle, secret=True)
    # a relative include of a file planted beside the kernels is refused the same way
    (bundle / "Sources" / "evil.h").write_bytes(SECRET + b"\n")
    _edit(bundle, rel, '#include "../evil.h"\n' + (bundle / rel).read_text().split("\n", 1)[1])
    _refused(bundle, secret=True)


def test_a_tampered_plan_is_refused(bundle):
    plan = json.loads((bundle / PLAN).read_bytes())
    plan["layers"][0]["grid"] = [1, 1, 1]
    _edit(bundle, PLAN, json.dumps(plan, sort_keys=True, indent=2) + "\n")
    lines = _refused(bundle)
    assert all("metal_plan.json is not what mconv generates" in ln for ln in lines), lines


def test_a_plan_nested_50000_deep_is_one_line(bundle):
    _edit(bundle, PLAN, "[" * 50000 + "]" * 50000)
    _refused(bundle)
    with pytest.raises(InputError, match="nest"):
        read_plan(load_bundle(bundle))


def test_a_tampered_graph_is_refused(bundle):
    model = onnx.load_from_string((bundle / GRAPH).read_bytes())
    gemm = next(n for n in model.graph.node if n.op_type in ("Gemm", "MatMul"))
    gemm.name = gemm.name + "_edited"
    (bundle / GRAPH).write_bytes(model.SerializeToString())
    _rehash(bundle, GRAPH)
    _refused(bundle)


def test_a_graph_naming_external_data_is_refused(bundle, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET * 4)
    model = onnx.load_from_string((bundle / GRAPH).read_bytes())
    t = onnx.TensorProto(name="leak", data_type=onnx.TensorProto.UINT8, dims=[len(SECRET)])
    t.data_location = onnx.TensorProto.EXTERNAL
    t.external_data.add(key="location", value=str(secret))
    model.graph.initializer.append(t)
    (bundle / GRAPH).write_bytes(model.SerializeToString())
    _rehash(bundle, GRAPH)
    lines = _refused(bundle, secret=True)
    assert all("external data" in ln for ln in lines), lines


def test_a_bundle_without_its_graph_is_refused_never_compiled(bundle, tmp_path):
    canary = tmp_path / "canary"
    rel = _kernels_rel(bundle)
    _edit(bundle, rel, (bundle / rel).read_text() + CANARY_CODE.format(canary=canary))
    (bundle / GRAPH).unlink()
    mpath = bundle / "manifest.json"
    manifest = json.loads(mpath.read_bytes())
    del manifest["files"][GRAPH]
    mpath.write_bytes(manifest_bytes(manifest))
    lines = _refused(bundle)
    assert all(GRAPH in ln and "re-export" in ln for ln in lines), lines
    assert not canary.exists()


def _hostile_names_model(canary: Path):
    """Node and value names that would be C++ code if pasted into generated text raw."""
    code = f'\nstatic int c = system("touch {canary}");\n#include "/etc/hostname"\n'
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w" + code], ["h" + code], name="mm" + code),
        helper.make_node("Relu", ["h" + code], ["y"], name="relu\\" + code),
    ]
    return make_model(
        nodes,
        [("x", ["N", 4])],
        ["y"],
        {"w" + code: rng.standard_normal((4, 3)).astype(np.float32)},
        name="evil\n#include </etc/passwd>",
    )


@needs_cxx
def test_names_in_a_model_never_become_code(tmp_path):
    canary = tmp_path / "canary"
    model = _hostile_names_model(canary)
    path = tmp_path / "evil.onnx"
    onnx.save(to_proto(model), path)
    bundle = TARGET.export(model, tmp_path / "bundle", {"precision": "fp32"})
    for rel in bundle.files:
        if rel.endswith((".metal", ".swift")):
            for line in (bundle.root / rel).read_text().splitlines():
                assert not line.lstrip().startswith(("static int c", '#include "/etc', "#include </etc")), rel
                assert not line.rstrip().endswith("\\"), rel  # no comment continued onto code
    x = np.ones((2, 4), np.float32)
    got = TARGET.load(bundle).run({"x": x})["y"]
    assert got.shape == (2, 3)
    r = _cli("run", str(bundle.root))
    assert r.exit_code == 0, r.output
    assert not canary.exists()


def test_the_binary_cache_is_private_or_not_used(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    root = tmp_path / f"mconv-metal-harness-{os.getuid()}"
    assert harness_mod._private_cache() == root
    assert (root.stat().st_mode & 0o777) == 0o700
    root.chmod(0o755)  # a folder others can read (or one planted by another user) is not used
    assert harness_mod._private_cache() is None
    root.rmdir()
    elsewhere = tmp_path / "planted"
    elsewhere.mkdir(mode=0o700)
    root.symlink_to(elsewhere)
    assert harness_mod._private_cache() is None


@needs_cxx
def test_an_untrusted_cache_compiles_into_a_private_folder(monkeypatch, tmp_path, bundle):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    root = tmp_path / f"mconv-metal-harness-{os.getuid()}"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    loaded = load_bundle(bundle)
    plan, kernels, _ = TARGET.regenerate(loaded, str(bundle))
    exe = harness_mod.compile_harness(plan, kernels)
    assert root not in exe.parents and exe.is_file()
    assert (exe.parent.stat().st_mode & 0o777) == 0o700
    assert list(root.iterdir()) == []
