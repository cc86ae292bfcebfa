"""A traced ``nn.TransformerEncoder`` records PyTorch's fused fast path
(``aten::_transformer_encoder_layer_fwd``), which torch's ONNX exporter has no symbolic for; the
TorchScript import decomposes it (formats/torch_format._encoder_layer_symbolic) for the export
only. Each case is checked against torch on the model's inputs, in ORT and the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from mconv.cli.app import app
from mconv.formats import import_model
from mconv.irio import to_proto
from mconv.targets import get_target
from typer.testing import CliRunner

FUSED = "aten::_transformer_encoder_layer_fwd"


class Encoder(torch.nn.Module):
    def __init__(self, norm_first: bool, activation: str, mask: str) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first, activation=activation
        )
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = torch.nn.Linear(32, 5)
        self.mask = mask

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        if self.mask == "padding":  # [B, S] key padding mask (mask_type 1)
            y = self.enc(x, src_key_padding_mask=pad)
        elif self.mask == "causal":  # [S, S] attention mask (mask_type 0)
            causal = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            y = self.enc(x, mask=causal, is_causal=True)
        else:
            y = self.enc(x)
        return self.fc(y)


def _traced(tmp_path: Path, seed: int, **kw) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    torch.manual_seed(seed)
    net = Encoder(**kw).eval()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 7, 32)).astype(np.float32)
    pad = np.zeros((2, 7), dtype=bool)
    pad[1, 5:] = True
    with torch.no_grad():
        traced = torch.jit.trace(net, (torch.from_numpy(x), torch.from_numpy(pad)))
        expected = traced(torch.from_numpy(x), torch.from_numpy(pad)).numpy()
    assert FUSED in str(traced.inlined_graph)  # the case under test: the fast path was traced
    path = tmp_path / "encoder.pt"
    traced.save(str(path))
    return path, {"x": x, "pad": pad}, expected


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize(
    ("norm_first", "activation", "mask"),
    [(False, "relu", "none"), (True, "gelu", "none"), (False, "gelu", "padding"), (True, "relu", "causal")],
)
def test_fused_encoder_layer_imports_and_matches_torch(tmp_path: Path, norm_first, activation, mask) -> None:
    path, feeds, expected = _traced(tmp_path, 7, norm_first=norm_first, activation=activation, mask=mask)
    model = import_model([path], options={"example_inputs": feeds})
    assert not any("transformer" in n.op_type.lower() for n in model.graph)
    names = [v.name for v in model.graph.inputs]
    run = {n: feeds[n] for n in names}  # a mask the trace does not read is no input
    session = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, run)[0]
    assert got.shape == expected.shape
    assert _cosine(got, expected) >= 0.99999
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    ref = next(iter(get_target("reference").load_model(model).run(run).values()))
    assert _cosine(ref, expected) >= 0.99999
    np.testing.assert_allclose(ref, expected, rtol=1e-4, atol=1e-5)


def test_symbolic_is_scoped_to_the_export(tmp_path: Path) -> None:
    from torch.onnx._internal.torchscript_exporter import registration

    path, feeds, _ = _traced(tmp_path, 3, norm_first=False, activation="relu", mask="none")
    import_model([path], options={"example_inputs": feeds})
    assert not registration.registry.is_registered_op(FUSED, 99)  # removed after the export


def test_cli_imports_the_traced_encoder(tmp_path: Path) -> None:
    path, feeds, expected = _traced(tmp_path, 5, norm_first=True, activation="gelu", mask="padding")
    np.savez(tmp_path / "inputs.npz", **feeds)
    out = tmp_path / "enc.onnx"
    r = CliRunner().invoke(
        app, ["import", str(path), "-o", str(out), "--example-inputs", str(tmp_path / "inputs.npz")]
    )
    assert r.exit_code == 0, r.output
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)[0]
    assert _cosine(got, expected) >= 0.99999
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)  # cosine misses a scale error
