"""The webgpu bundles' WGSL kernels through naga (wgpu's shader translator, npm naga-wasm).

naga-wasm is installed once per cache with npm (the test skips only when node/npm are missing
or the registry cannot be reached); every kernel of the issue's test models must parse,
validate and translate to MSL and SPIR-V.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.errors import InputError
from mconv.targets import get_target
from mconv.targets.webgpu import naga as nagamod

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "metal"))
from metal_models import mobilenet_style  # noqa: E402
from test_webgpu import lenet, op_zoo  # noqa: E402

_OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET", "ENETUNREACH")


@pytest.fixture(scope="module")
def naga() -> Path:
    found = nagamod.find_naga()
    if found is not None:
        return found
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm not installed (apt-get install nodejs npm)")
    nagamod.cache_dir().mkdir(parents=True, exist_ok=True)
    with open(nagamod.cache_dir() / ".install.lock", "w") as lock:  # xdist workers install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = nagamod.find_naga()
        if found is not None:
            return found
        proc = subprocess.run(nagamod.install_command(), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and any(code in proc.stdout + proc.stderr for code in _OFFLINE):
        pytest.skip(f"npm registry not reachable for {nagamod.NAGA_PACKAGE}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = nagamod.find_naga()
    assert found is not None
    return found


def _pruned_clustered_lenet(seed: int):
    from mconv.passes import parse_spec, run_pipeline

    model, _ = run_pipeline(lenet(seed), parse_spec("prune(sparsity=0.8),cluster(bits=5)"))
    return model


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """(target, model, precision) -> the exported bundle, exported once per module."""
    made = {}

    def get(target: str, name: str, precision: str):
        key = (target, name, precision)
        if key not in made:
            out = tmp_path_factory.mktemp(f"{target}-{name}-{precision}") / "b"
            made[key] = get_target(target).export(MODELS[name](), out, {"precision": precision})
        return made[key]

    return get


MODELS = {
    "lenet": lambda: lenet(0),
    "mobilenet_style": lambda: mobilenet_style(2),
    "pruned_clustered_lenet": lambda: _pruned_clustered_lenet(1),
    "op_zoo": lambda: op_zoo(3),
}


@pytest.mark.parametrize(
    "name,precision", [(m, "fp32") for m in sorted(MODELS)] + [("mobilenet_style", "fp16"), ("lenet", "fp16")]
)
def test_every_kernel_validates_and_translates(naga, bundles, name, precision):
    bundle = bundles("webgpu", name, precision)
    results = nagamod.check_bundle(bundle, naga)
    assert len(results) >= 3
    bad = {k: f"{r.stage}: {r.error[:300]}" for k, r in results.items() if not r.ok}
    assert not bad, bad
    for kernel, r in results.items():
        # naga's namer appends "_" to a name that ends in a digit
        assert re.search(rf"kernel void {kernel}_?\(", r.msl), kernel
        assert r.spirv_words > 100
        assert r.naga_version.startswith("30.")
    if precision == "fp16":
        assert any("half" in r.msl for r in results.values())


def test_naga_reports_the_failing_step(naga):
    rng = np.random.default_rng(0)
    n = int(rng.integers(2, 9))
    good = f"@compute @workgroup_size({n}) fn ok(@builtin(global_invocation_id) id: vec3<u32>) {{}}"
    results = nagamod.check_sources(
        {
            "ok": good,
            "syntax": "fn broken( {",
            "types": "@compute @workgroup_size(1) fn types() { let a: f32 = 1u; }",
            "f16_without_enable": "@compute @workgroup_size(1) fn h() { let a: f16 = 1.0h; }",
        },
        naga,
    )
    assert results["ok"].ok and "kernel void ok(" in results["ok"].msl
    assert (results["syntax"].ok, results["syntax"].stage) == (False, "parse")
    assert not results["types"].ok and results["types"].stage in ("parse", "validation")
    assert not results["f16_without_enable"].ok
    assert all(r.error for k, r in results.items() if k != "ok")


def test_a_tampered_kernel_in_a_bundle_is_named(naga, tmp_path):
    bundle = get_target("webgpu").export(lenet(5), tmp_path / "b", {})
    kernels = sorted((tmp_path / "b" / "kernels").glob("*.wgsl"))
    victim = kernels[1]
    victim.write_text(victim.read_text().replace("let ", "let let ", 1))
    results = nagamod.check_sources({p.stem: p.read_text() for p in kernels}, naga, label=str(bundle.root))
    assert [k for k, r in results.items() if not r.ok] == [victim.stem]


def test_without_naga_it_is_one_line_naming_the_bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("MCONV_CACHE", str(tmp_path / "empty-cache"))
    bundle = get_target("webgpu").export(lenet(6), tmp_path / "b", {})
    with pytest.raises(InputError) as err:
        nagamod.check_bundle(bundle)
    text = str(err.value)
    assert "naga-wasm is not installed" in text and str(tmp_path / "b") in text
    assert "\n" not in text


def test_a_bundle_for_another_target_is_refused(tmp_path):
    bundle = get_target("metal").export(lenet(7), tmp_path / "m", {})
    with pytest.raises(InputError) as err:
        nagamod.check_bundle(bundle, Path("/nonexistent"))
    assert "not 'webgpu'" in str(err.value) and str(tmp_path / "m") in str(err.value)


needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("clang++") is None,
    reason="no C++ compiler (apt-get install g++)",
)


@needs_cxx
@pytest.mark.parametrize(
    "name,precision",
    [
        ("lenet", "fp32"),
        ("pruned_clustered_lenet", "fp32"),
        ("mobilenet_style", "fp16"),
        ("op_zoo", "fp16"),  # half literals (0.0h) in naga's MSL
    ],
)
def test_nagas_msl_agrees_with_the_metal_targets_msl_layer_by_layer(naga, bundles, name, precision):
    web = bundles("webgpu", name, precision)
    metal = bundles("metal", name, precision)
    rng = np.random.default_rng(11)
    feeds = {
        s.name: rng.random([d if isinstance(d, int) else 1 for d in s.shape]).astype(np.float32)
        for s in web.inputs
    }
    got = nagamod.msl_runner(web, naga, probe=True).run(feeds)
    want = nagamod.metal_runner(metal, probe=True).run(feeds)
    layers = len(nagamod.every_layer(nagamod.read_webgpu_plan(web)).outputs)
    assert set(got) == set(want) and len(got) == layers >= 8
    tol = 1e-5 if precision == "fp32" else 2e-3
    for buffer, ref in want.items():
        scale = float(np.abs(ref).max()) or 1.0
        err = float(np.abs(got[buffer] - ref).max())
        assert err <= tol * scale, (buffer, err, scale)
    # the model's outputs are among the layers compared
    plan = nagamod.read_webgpu_plan(web)
    assert {plan.buffers[o["buffer"]].name for o in plan.outputs} <= set(got)


def test_msl_runner_refuses_a_tampered_kernel_in_one_line(naga, tmp_path):
    # the bundle's own integrity check refuses it before naga runs
    get_target("webgpu").export(lenet(8), tmp_path / "b", {})
    victim = sorted((tmp_path / "b" / "kernels").glob("*.wgsl"))[2]
    victim.write_text(victim.read_text().replace("let ", "let let ", 1))
    with pytest.raises(InputError) as err:
        nagamod.msl_runner(tmp_path / "b", naga)
    text = str(err.value)
    assert f"kernels/{victim.name}" in text and str(tmp_path / "b") in text and "\n" not in text
