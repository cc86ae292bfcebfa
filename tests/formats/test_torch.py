"""PyTorch import (formats/pytorch/__init__.py): TorchScript archives and factory specs against torch
itself, run by ONNX Runtime and the reference executor; refusal of state dicts and pickles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from mconv.errors import InputError  # noqa: E402
from mconv.formats import import_model  # noqa: E402
from mconv.irio import load_onnx, to_proto  # noqa: E402
from mconv.targets import get_target  # noqa: E402


class ConvBnReluLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(image)))
        return self.fc(torch.flatten(y, 1))


class LstmHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(5, 7, batch_first=True)
        self.fc = torch.nn.Linear(7, 3)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(seq)
        return self.fc(out[:, -1])


def _trained_bn(module: torch.nn.Module) -> torch.nn.Module:
    """Give BatchNorm non-trivial running statistics, then freeze for inference."""
    torch.manual_seed(0)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return module.eval()


def _run_both(model, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    ort_out = session.run(None, feeds)[0]
    ref_out = next(iter(get_target("reference").load_model(model).run(feeds).values()))
    return ort_out, ref_out


def test_scripted_conv_bn_relu_linear_matches_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = _trained_bn(ConvBnReluLinear())
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(module), str(path))
    model = import_model([path], options={"input_shapes": {"image": [2, 3, 6, 6]}})
    assert model.metadata_props["mconv.source_format"] == "torch"
    assert [v.name for v in model.graph.inputs] == ["image"]
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    ort_out, ref_out = _run_both(model, {"image": x})
    np.testing.assert_allclose(ort_out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref_out, expected, rtol=1e-5, atol=1e-5)


def test_traced_lstm_matches_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = LstmHead().eval()
    example = torch.randn(2, 4, 5)
    path = tmp_path / "lstm.pt"
    torch.jit.save(torch.jit.trace(module, example), str(path))
    model = import_model([path], options={"input_shapes": {"seq": [2, 4, 5]}})
    assert "LSTM" in {n.op_type for n in model.graph}
    x = np.random.default_rng(2).standard_normal((2, 4, 5)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    ort_out, ref_out = _run_both(model, {"seq": x})
    np.testing.assert_allclose(ort_out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref_out, expected, rtol=1e-5, atol=1e-5)


def _write_factory_package(root: Path) -> None:
    pkg = root / "mconv_factory_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(
        textwrap.dedent(
            """
            import torch

            def tiny():
                torch.manual_seed(3)
                return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
            """
        )
    )


def test_factory_spec_is_imported_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_factory_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    model = import_model(["mconv_factory_pkg.models:tiny"], options={"input_shapes": {"input": [3, 4]}})
    sys.modules.pop("mconv_factory_pkg.models", None)
    sys.modules.pop("mconv_factory_pkg", None)
    torch.manual_seed(3)
    oracle = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)).eval()
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    with torch.no_grad():
        expected = oracle(torch.from_numpy(x)).numpy()
    ort_out, ref_out = _run_both(model, {"input": x})
    np.testing.assert_allclose(ort_out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref_out, expected, rtol=1e-5, atol=1e-6)
    assert model.metadata_props["mconv.source_sha256"] == ""


def test_cli_imports_a_factory_spec(tmp_path: Path) -> None:
    _write_factory_package(tmp_path)
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "mconv", "import", "mconv_factory_pkg.models:tiny", "--input-shape",
         "input=1,4", "-o", "r.onnx", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    model = load_onnx(tmp_path / "r.onnx")
    assert {n.op_type for n in model.graph} >= {"Gemm", "Tanh"}


def test_state_dict_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "weights.pth"
    torch.save(ConvBnReluLinear().state_dict(), path)
    with pytest.raises(InputError) as err:
        import_model([path], options={"input_shapes": {"image": [1, 3, 6, 6]}})
    line = str(err.value)
    assert "holds weights but no architecture" in line
    assert "package.module:factory" in line and "\n" not in line


def test_pickled_module_is_refused_without_unpickling(tmp_path: Path) -> None:
    path = tmp_path / "whole.pt"
    torch.save(ConvBnReluLinear(), path)
    with pytest.raises(InputError, match="pickled Python objects"):
        import_model([path], options={"input_shapes": {"image": [1, 3, 6, 6]}})


def test_torch_load_is_only_called_with_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    torch.save(ConvBnReluLinear().state_dict(), tmp_path / "sd.pt")
    torch.save(ConvBnReluLinear(), tmp_path / "whole.pt")
    torch.jit.save(torch.jit.script(ConvBnReluLinear().eval()), str(tmp_path / "script.pt"))
    for name in ("sd.pt", "whole.pt", "script.pt"):
        try:
            import_model([tmp_path / name], options={"input_shapes": {"image": [1, 3, 6, 6]}})
        except InputError:
            pass
    assert len(calls) == 2  # the two non-TorchScript files; TorchScript goes through torch.jit.load
    assert all(c.get("weights_only") is True for c in calls)


def test_missing_input_shape_names_the_forward_arguments(tmp_path: Path) -> None:
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(ConvBnReluLinear().eval()), str(path))
    with pytest.raises(InputError, match=r"needs a shape for input\(s\) image.*--input-shape image="):
        import_model([path])
    with pytest.raises(InputError, match=r"no argument\(s\) x .*forward's arguments: image"):
        import_model([path], options={"input_shapes": {"x": [1, 3, 6, 6], "image": [1, 3, 6, 6]}})


def test_garbage_pt_file_is_one_line_input_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.pt"
    path.write_bytes(b"PK\x03\x04 definitely not a zip" * 4)
    with pytest.raises(InputError) as err:
        import_model([path], options={"input_shapes": {"x": [1]}})
    assert "\n" not in str(err.value)


class EmbedMean(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(ids).mean(dim=1))


def test_integer_inputs_follow_input_dtypes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = EmbedMean().eval()
    path = tmp_path / "embed.pt"
    torch.jit.save(torch.jit.script(module), str(path))
    model = import_model([path], options={"input_shapes": {"ids": [2, 5]}, "input_dtypes": {"ids": "int64"}})
    ids = np.random.default_rng(5).integers(0, 11, (2, 5)).astype(np.int64)
    with torch.no_grad():
        expected = module(torch.from_numpy(ids)).numpy()
    ort_out, ref_out = _run_both(model, {"ids": ids})
    np.testing.assert_allclose(ort_out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref_out, expected, rtol=1e-5, atol=1e-6)
