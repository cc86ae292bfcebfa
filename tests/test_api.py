"""The Python API equals the CLI: for the same call, a command's --json is the API's as_dict()."""

from __future__ import annotations

import json
from pathlib import Path

import mconv
import numpy as np
import pytest
from mconv.api.demo import fixture_path
from mconv.cli.app import app
from mconv.errors import GateFailed, InputError
from typer.testing import CliRunner

MLP = fixture_path("digits_mlp.onnx")


def _cli_json(*args: str, code: int = 0) -> dict:
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


def _timeless(doc):
    """The document without wall-clock times (the only thing two identical calls may differ in)."""
    if isinstance(doc, dict):
        return {k: _timeless(v) for k, v in doc.items() if k not in ("seconds", "time")}
    if isinstance(doc, list):
        return [_timeless(v) for v in doc]
    return doc


def _same(cli_doc: dict, api_doc: dict) -> None:
    from mconv.cli.output import jsonable

    assert _timeless(cli_doc) == _timeless(json.loads(json.dumps(jsonable(api_doc))))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    with np.load(fixture_path("digits_test.npz")) as z:
        images, labels = z["images"][:64], z["labels"][:64]
    path = tmp_path_factory.mktemp("data") / "d.npz"
    np.savez(path, input=(images.reshape(len(images), -1) / 16.0).astype(np.float32), labels=labels)
    assert rng is not None
    return path


def test_the_package_root_forwards_the_api():
    assert mconv.convert is mconv.api.convert and mconv.verify is mconv.api.verify
    assert "optimize" in dir(mconv)
    with pytest.raises(AttributeError):
        mconv.no_such_function  # noqa: B018


def test_import_optimize_export_equal_their_commands(tmp_path, data):
    out = tmp_path / "m.onnx"
    _same(_cli_json("import", str(MLP), "-o", str(out)), mconv.convert(MLP, out).as_dict())

    spec = "prune(sparsity=0.8),cluster(bits=4)"
    opt = tmp_path / "o.onnx"
    cli = _cli_json("optimize", str(out), "--passes", spec, "-o", str(opt), "--seed", "3")
    res = mconv.optimize(out, passes=spec, output=opt, seed=3)
    _same(cli, res.as_dict())
    assert res.predicted_bundle_weight_bytes and res.predicted_bundle_weight_bytes < res.weight_bytes_after

    b = tmp_path / "b"
    _same(_cli_json("export", str(opt), "-o", str(b)), mconv.export(opt, "cpu", b).as_dict())
    f = tmp_path / "w.safetensors"
    _same(
        _cli_json("export", str(opt), "-o", str(f), "--format", "safetensors"),
        mconv.export(opt, out_dir=f, format="safetensors").as_dict(),
    )


def test_run_verify_inspect_analyze_equal_their_commands(tmp_path, data):
    b = tmp_path / "b"
    mconv.export(MLP, "cpu", b)
    _same(
        _cli_json("run", str(b), "--samples", "3", "--seed", "1"), mconv.run(b, samples=3, seed=1).as_dict()
    )
    _same(_cli_json("run", str(MLP), "--data", str(data)), mconv.run(MLP, data=data).as_dict())
    _same(
        _cli_json("verify", str(MLP), str(b), "--data", str(data)), mconv.verify(MLP, b, data=data).as_dict()
    )
    _same(_cli_json("inspect", str(b)), mconv.inspect(b).as_dict())
    _same(
        _cli_json("inspect", str(MLP), "--top", "2", "--input-shape", "input=5,64"),
        mconv.inspect(MLP, top=2, input_shapes={"input": [5, 64]}).as_dict(),
    )
    _same(
        _cli_json("analyze", str(MLP), "--data", str(data), "--sweep", "0.5,0.9"),
        mconv.analyze(MLP, data, sweep=[0.5, 0.9]).as_dict(),
    )


def test_demo_equals_its_command(tmp_path):
    from mconv.api.demo import demo

    cli = _cli_json("demo", "--workdir", str(tmp_path / "a"))
    _same(cli, demo(tmp_path / "a").as_dict())


def test_errors_are_the_cli_types_and_a_failed_gate_raises_on_check(tmp_path, data):
    with pytest.raises(InputError) as e:
        mconv.optimize(MLP, passes="dce", recipe="lossless")
    assert e.value.exit_code == 2
    with pytest.raises(InputError):
        mconv.load(tmp_path / "missing.onnx")
    noisy = tmp_path / "n.onnx"
    mconv.optimize(MLP, passes="prune(sparsity=0.999)", output=noisy)
    cli = _cli_json("verify", str(MLP), str(noisy), "--data", str(data), code=1)
    result = mconv.verify(MLP, noisy, data=data)
    assert not result.passed and result.failures
    _same(cli, result.as_dict())
    with pytest.raises(GateFailed) as g:
        result.check()
    assert g.value.exit_code == 1
