"""torch.export archives (.pt2) and factory specs through the dynamo exporter (issue 16 item 5)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
from mconv.errors import InputError  # noqa: E402
from mconv.formats import import_model  # noqa: E402
from mconv.targets import get_target  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.ln = torch.nn.LayerNorm(4 * 6 * 6)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)
        self.register_buffer("shift", torch.linspace(-1, 1, 5))

    def forward(self, x):
        return self.fc(self.ln(torch.relu(self.conv(x)).flatten(1))) + self.shift


def _save(tmp_path: Path, seed: int) -> tuple[Path, np.ndarray, np.ndarray]:
    torch.manual_seed(seed)
    net = Net().eval()
    x = np.random.default_rng(seed).standard_normal((2, 3, 6, 6)).astype(np.float32)
    ep = torch.export.export(net, (torch.from_numpy(x),))
    path = tmp_path / "net.pt2"
    torch.export.save(ep, str(path))
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    return path, x, expected


def _rewrite(src: Path, dst: Path, change) -> None:
    """Copy the archive, ``change(name, bytes) -> bytes | None`` per member (None drops it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)


def _run(model, x):
    runner = get_target("reference").load_model(model)
    return next(iter(runner.run({runner.inputs[0].name: x}).values()))


def test_pt2_imports_and_matches_torch(tmp_path, monkeypatch):
    path, x, expected = _save(tmp_path, seed=0)
    # nothing unpickles: torch.load, pickle.loads and torch.export.load all refuse to run
    import pickle

    def boom(*a, **k):
        raise AssertionError("unpickling called")

    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(torch.export, "load", boom)
    model = import_model([path])
    assert "LayerNormalization" in {n.op_type for n in model.graph}
    assert "no pickle read" in model.metadata_props["mconv.import_notes"]
    got = _run(model, x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_pt2_pickled_weight_is_refused(tmp_path):
    path, _, _ = _save(tmp_path, seed=1)

    def change(name, data):
        if name.endswith("model_weights_config.json"):
            cfg = json.loads(data)
            first = next(iter(cfg["config"]))
            cfg["config"][first]["use_pickle"] = True
            return json.dumps(cfg).encode()
        return data

    bad = tmp_path / "pickled.pt2"
    _rewrite(path, bad, change)
    with pytest.raises(InputError) as err:
        import_model([bad])
    line = err.value.line()
    assert "stored as a pickle" in line and "pickled.pt2" in line and "conv.weight" in line


def test_pt2_foreign_target_is_refused(tmp_path):
    path, _, _ = _save(tmp_path, seed=2)

    def change(name, data):
        if name.endswith("models/model.json"):
            return data.replace(b'"torch.ops.aten.relu.default"', b'"torch.load"')
        return data

    bad = tmp_path / "target.pt2"
    _rewrite(path, bad, change)
    with pytest.raises(InputError) as err:
        import_model([bad])
    line = err.value.line()
    assert "torch.load" in line and "not an ATen/prims operator" in line and "target.pt2" in line


def test_pt2_short_weight_member_is_refused(tmp_path):
    path, _, _ = _save(tmp_path, seed=3)

    def change(name, data):
        return data[:8] if name.endswith("data/weights/weight_0") else data

    bad = tmp_path / "short.pt2"
    _rewrite(path, bad, change)
    with pytest.raises(InputError) as err:
        import_model([bad])
    line = err.value.line()
    assert "needs 432 bytes but its member holds 8" in line and "short.pt2" in line


def test_pt2_missing_member_and_bad_json(tmp_path):
    path, _, _ = _save(tmp_path, seed=4)
    bad = tmp_path / "missing.pt2"
    _rewrite(path, bad, lambda n, d: None if n.endswith("data/weights/weight_1") else d)
    with pytest.raises(InputError, match="has no member") as err:
        import_model([bad])
    assert "missing.pt2" in err.value.line()
    bad2 = tmp_path / "json.pt2"
    _rewrite(path, bad2, lambda n, d: b"[" * 100000 if n.endswith("models/model.json") else d)
    with pytest.raises(InputError, match="not JSON") as err:
        import_model([bad2])
    assert "json.pt2" in err.value.line()


def test_pt2_aoti_is_refused(tmp_path):
    path, _, _ = _save(tmp_path, seed=5)
    root = zipfile.ZipFile(path).namelist()[0].split("/")[0]
    bad = tmp_path / "aoti.pt2"
    _rewrite(path, bad, lambda n, d: d)
    with zipfile.ZipFile(bad, "a") as z:
        z.writestr(f"{root}/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(InputError, match="AOTInductor") as err:
        import_model([bad])
    assert "aoti.pt2" in err.value.line()


def test_cli_pt2_and_factory_through_dynamo(tmp_path, monkeypatch):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    path, x, expected = _save(tmp_path, seed=6)
    r = CliRunner().invoke(app, ["import", str(path), "-o", str(tmp_path / "a.onnx"), "--json"])
    assert r.exit_code == 0, r.output
    pkg = tmp_path / "mconv_dynamo_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(
        textwrap.dedent(
            """
            import torch

            def tiny():
                torch.manual_seed(3)
                return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 2))
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    try:
        r = CliRunner().invoke(
            app,
            ["import", "mconv_dynamo_pkg.models:tiny", "--input-shape", "input=3,4", "--option", "exporter=dynamo",
             "-o", str(tmp_path / "f.onnx"), "--json"],
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        from mconv.irio import load_onnx

        model = load_onnx(tmp_path / "f.onnx")
        assert "LayerNormalization" in {n.op_type for n in model.graph}
        assert "dynamo" in model.metadata_props["mconv.import_notes"]
        from mconv_dynamo_pkg.models import tiny

        xi = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
        with torch.no_grad():
            want = tiny().eval()(torch.from_numpy(xi)).numpy()
        np.testing.assert_allclose(_run(model, xi), want, rtol=1e-4, atol=1e-5)
    finally:
        sys.modules.pop("mconv_dynamo_pkg.models", None)
        sys.modules.pop("mconv_dynamo_pkg", None)
    # a bad archive through the CLI: one line, exit 2
    bad = tmp_path / "t.pt2"
    _rewrite(path, bad, lambda n, d: d.replace(b'"torch.ops.aten.relu.default"', b'"builtins.eval"'))
    r = CliRunner().invoke(app, ["import", str(bad), "-o", str(tmp_path / "b.onnx")])
    assert r.exit_code == 2 and "builtins.eval" in r.output and "t.pt2" in r.output


# --- one line means one line: torch's logging, warnings and terminal escapes stay off stderr ------


def _mconv(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A real process: torch's loggers keep handlers of their own, which CliRunner would not see."""
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_pt2_claiming_a_huge_shape_is_one_line_without_escapes(tmp_path):
    """A weight claimed 2**40 rows in the program: fake-tensor propagation fails. Before, torch
    logged its 24-line traceback to stderr and the error carried \\x1b[96m colour codes."""
    path, _, _ = _save(tmp_path, seed=8)

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("models/model.json"):
            program = json.loads(data)
            program["graph_module"]["graph"]["tensor_values"]["p_fc_weight"]["sizes"][0] = {"as_int": 2**40}
            return json.dumps(program).encode()
        return data

    bad = tmp_path / "huge.pt2"
    _rewrite(path, bad, change)
    r = _mconv("import", str(bad), "-o", str(tmp_path / "h.onnx"), "--quiet", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "huge.pt2" in lines[0] and "1099511627776" in lines[0]
    assert "\x1b" not in lines[0] and "\\x1b" not in lines[0]
    assert not (tmp_path / "h.onnx").exists()


def test_quiet_dynamo_export_prints_nothing_on_stderr(tmp_path):
    """torch.onnx's registration logs "torchvision is not installed" four times on the first
    dynamo export; mconv's calls into torch run with logging and warnings off."""
    path, _, _ = _save(tmp_path, seed=9)
    r = _mconv("import", str(path), "-o", str(tmp_path / "q.onnx"), "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert (tmp_path / "q.onnx").exists()


def test_exporter_messages_lose_terminal_escapes_and_name_their_cause():
    from mconv.formats.pytorch import _describe

    class ConversionError(RuntimeError):
        pass

    ConversionError.__module__ = "torch.onnx._internal.exporter._errors"
    try:
        try:
            raise ValueError("\x1b[31mshape mismatch\x1b[0m at dim 0\nmore")
        except ValueError as cause:
            raise ConversionError("Failed to decompose. \x1b[96mThis is step 2/3\x1b[0m of it") from cause
    except ConversionError as exc:
        text = _describe(exc)
    assert text == "ConversionError: Failed to decompose; caused by ValueError: shape mismatch at dim 0"
