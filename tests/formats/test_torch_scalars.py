"""PyTorch import of forward() arguments that are not tensors (issue 12 item 6): int, float and
bool values baked as constants (--input-value, or 0-d arrays in --example-inputs), example
inputs from an .npz, refusals as one line and exit 2, stateful modules, and the real silero-vad
TorchScript model from its PyPI wheel against torch on speech."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import wave
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mconv.cli.app import app
from mconv.errors import InputError
from mconv.formats import import_model
from mconv.irio import load_onnx, to_proto
from mconv.targets import get_target
from onnx import TensorProto, helper
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _wheels  # noqa: E402


class Gain(torch.nn.Module):
    """Values that decide a loop count, a branch and a scale."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, scale: float, steps: int, clip: bool = False) -> torch.Tensor:
        y = self.fc(x) * scale
        for _ in range(steps):
            y = torch.tanh(y) + y
        if clip:
            y = torch.clamp(y, -1.0, 1.0)
        return y


class Streaming(torch.nn.Module):
    """Keeps a context between calls the way silero-vad does (``if not len(self._context)``,
    attributes reassigned in forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)
        self._context = torch.zeros(0)
        self._calls = 0

    def forward(self, x: torch.Tensor, sr: int) -> torch.Tensor:
        if sr != 16000 and sr != 8000:
            raise ValueError("sr must be 8000 or 16000")
        width = 4 if sr == 16000 else 2
        if not len(self._context):
            self._context = torch.zeros(x.shape[0], width)
        x = torch.cat([self._context, x], dim=1)
        self._context = x[:, -width:]
        self._calls += 1
        return self.fc(x)


class OptionalScale(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: float | None = None, offset: float = 0.5) -> torch.Tensor:
        if scale is None:
            return x + offset
        return x * scale + offset


class TakesList(torch.nn.Module):
    def forward(self, x: torch.Tensor, dims: list[int]) -> torch.Tensor:
        return x.sum(dims)


def _script(module: torch.nn.Module, path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    for p in module.parameters():
        p.data.uniform_(-0.5, 0.5)
    torch.jit.save(torch.jit.script(module.eval()), str(path))
    return path


def _ort(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _reference(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return next(iter(get_target("reference").load_model(model).run(feeds).values()))


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line_exit_2(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    assert "internal error" not in r.output and "Traceback" not in r.output
    return lines[0]


# --- values baked as constants ----------------------------------------------------------------


@pytest.mark.parametrize(("scale", "steps", "clip"), [(2.5, 3, False), (-0.75, 0, True)])
def test_int_float_bool_values_are_baked_and_match_torch(tmp_path: Path, scale, steps, clip) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    values = {"scale": str(scale), "steps": str(steps), "clip": str(clip).lower()}
    model = import_model([path], options={"input_shapes": {"x": [2, 4]}, "input_values": values})
    assert [v.name for v in model.graph.inputs] == ["x"]  # the values are constants, not inputs
    assert f"steps={steps}" in model.metadata_props["mconv.import_notes"]
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    with torch.no_grad():
        expected = torch.jit.load(str(path))(torch.from_numpy(x), scale, steps, clip).numpy()
    np.testing.assert_allclose(_ort(model, {"x": x}), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_reference(model, {"x": x}), expected, rtol=1e-5, atol=1e-5)


def test_api_takes_python_values_and_defaults_stay(tmp_path: Path) -> None:
    path = _script(OptionalScale(), tmp_path / "opt.pt")
    x = np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32)
    plain = import_model([path], options={"input_shapes": {"x": [3, 2]}})  # scale=None, offset=0.5
    np.testing.assert_allclose(_ort(plain, {"x": x}), x + 0.5, rtol=1e-6, atol=1e-6)
    scaled = import_model([path], options={"input_shapes": {"x": [3, 2]}, "input_values": {"scale": 3}})
    np.testing.assert_allclose(_ort(scaled, {"x": x}), x * 3 + 0.5, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_reference(scaled, {"x": x}), x * 3 + 0.5, rtol=1e-6, atol=1e-6)


def test_cli_input_value_imports_and_notes_the_constant(tmp_path: Path) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    out = tmp_path / "gain.onnx"
    r = _cli("import", str(path), "-o", str(out), "--input-shape", "x=1,4", "--input-value", "scale=0.5",
             "--input-value", "steps=2", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any("baked into the graph as constants: scale=0.5, steps=2" in n for n in doc["notes"]), doc[
        "notes"
    ]
    model = load_onnx(out)
    x = np.random.default_rng(5).standard_normal((1, 4)).astype(np.float32)
    with torch.no_grad():
        expected = torch.jit.load(str(path))(torch.from_numpy(x), 0.5, 2).numpy()
    np.testing.assert_allclose(_ort(model, {"x": x}), expected, rtol=1e-5, atol=1e-5)


def test_factory_module_with_int_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "mconv_scalar_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Repeat(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = torch.nn.Linear(4, 4)

                def forward(self, x, times, gain: float = 1.0):  # times unannotated: a value given
                    for _ in range(times):
                        x = torch.relu(self.fc(x))
                    return x * gain

            def make():
                torch.manual_seed(7)
                return Repeat().eval()
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    try:
        options = {"input_shapes": {"x": [2, 4]}, "input_values": {"times": "3", "gain": "-2"}}
        model = import_model(["mconv_scalar_pkg.nets:make"], options=options)
        oracle = sys.modules["mconv_scalar_pkg.nets"].make()
    finally:
        sys.modules.pop("mconv_scalar_pkg.nets", None)
        sys.modules.pop("mconv_scalar_pkg", None)
    assert [v.name for v in model.graph.inputs] == ["x"]
    x = np.random.default_rng(6).standard_normal((2, 4)).astype(np.float32)
    with torch.no_grad():
        expected = oracle(torch.from_numpy(x), 3, -2.0).numpy()
    np.testing.assert_allclose(_ort(model, {"x": x}), expected, rtol=1e-5, atol=1e-6)


# --- refusals: one line, exit 2, the file and the argument named -------------------------------


def test_scalar_without_a_value_names_the_argument_and_its_type(tmp_path: Path) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    with pytest.raises(
        InputError, match=r"argument 'scale: float' needs a value.*--input-value scale="
    ) as err:
        import_model([path], options={"input_shapes": {"x": [1, 4]}, "input_values": {"steps": 1}})
    assert str(path) in str(err.value)
    line = _one_line_exit_2(
        _cli(
            "import",
            str(path),
            "-o",
            str(tmp_path / "o.onnx"),
            "--input-shape",
            "x=1,4",
            "--input-value",
            "scale=1",
        ),
        str(path),
        "argument 'steps: int' needs a value",
        "--input-value steps=",
    )
    assert "baked into the ONNX model" in line
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("spec", ["steps=", "steps=1,2"])
def test_input_shape_for_a_scalar_is_exit_2_not_3(tmp_path: Path, spec: str) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    _one_line_exit_2(
        _cli("import", str(path), "-o", str(tmp_path / "o.onnx"), "--input-shape", "x=1,4", "--input-shape", spec,
             "--input-value", "scale=1"),
        str(path),
        "'steps: int' is not a tensor: --input-shape does not apply",
        "--input-value steps=",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("steps=abc", "--input-value steps=abc: not an int"),
        ("steps=2.5", "--input-value steps=2.5: not an int"),
        ("steps=99999999999999999999", "outside the int64 range"),
        ("clip=maybe", "--input-value clip=maybe: not a bool"),
        ("x=3", "argument 'x: Tensor' is a tensor; --input-value gives int, float and bool"),
        ("nope=3", "forward() has no argument(s) nope"),
        ("steps", "bad --input-value 'steps'"),
    ],
)
def test_bad_input_values_are_one_line(tmp_path: Path, value: str, needle: str) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    others = [v for v in ("scale=1", "steps=1") if v.split("=")[0] != value.split("=")[0]]
    given = [a for v in [*others, value] for a in ("--input-value", v)]
    _one_line_exit_2(
        _cli("import", str(path), "-o", str(tmp_path / "o.onnx"), "--input-shape", "x=1,4", *given),
        str(path) if "=" in value else "--input-value",
        needle,
    )


def test_input_value_given_twice_with_two_values_is_refused(tmp_path: Path) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    _one_line_exit_2(
        _cli("import", str(path), "-o", str(tmp_path / "o.onnx"), "--input-shape", "x=1,4",
             "--input-value", "scale=1", "--input-value", "scale=2"),
        "--input-value scale given twice",
    )  # fmt: skip


@pytest.mark.parametrize(("shape", "needle"), [("x=1,-4", "non-negative"), ("x=100000,100000,1000", "bytes")])
def test_bad_tensor_shapes_are_exit_2(tmp_path: Path, shape: str, needle: str) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    _one_line_exit_2(
        _cli("import", str(path), "-o", str(tmp_path / "o.onnx"), "--input-shape", shape, "--input-value", "scale=1",
             "--input-value", "steps=1"),
        str(path),
        needle,
    )  # fmt: skip


def test_argument_of_another_type_is_named(tmp_path: Path) -> None:
    path = _script(TakesList(), tmp_path / "lst.pt")
    with pytest.raises(
        InputError, match=r"argument 'dims: List\[int\]' has a type mconv cannot give and no default"
    ):
        import_model([path], options={"input_shapes": {"x": [2, 3]}})
    with pytest.raises(InputError, match=r"'dims: List\[int\]' has a type mconv cannot give"):
        import_model([path], options={"input_shapes": {"x": [2, 3]}, "input_values": {"dims": "1"}})


def test_forward_refusing_the_value_is_one_line(tmp_path: Path) -> None:
    path = _script(Streaming(), tmp_path / "stream.pt")
    line = _one_line_exit_2(
        _cli(
            "import",
            str(path),
            "-o",
            str(tmp_path / "o.onnx"),
            "--input-shape",
            "x=1,4",
            "--input-value",
            "sr=44100",
        ),
        str(path),
        "forward() failed on inputs x=[1, 4], sr=44100",
    )
    assert "ValueError: sr must be 8000 or 16000" in line


def test_input_value_on_an_onnx_model_is_refused(tmp_path: Path) -> None:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    src = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    _one_line_exit_2(
        _cli("import", str(src), "-o", str(tmp_path / "o.onnx"), "--input-value", "sr=16000"),
        str(src),
        "--input-value and --example-inputs apply to PyTorch models only",
    )
    assert not (tmp_path / "o.onnx").exists()


# --- --example-inputs --------------------------------------------------------------------------


def test_example_inputs_npz_gives_tensors_and_values(tmp_path: Path) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    npz = tmp_path / "ex.npz"
    np.savez(npz, x=x, scale=np.float32(1.5), steps=np.int64(2), clip=np.array([True]))
    out = tmp_path / "gain.onnx"
    r = _cli("import", str(path), "-o", str(out), "--example-inputs", str(npz))
    assert r.exit_code == 0, r.output
    model = load_onnx(out)
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert [d for d in model.graph.inputs[0].shape] == [3, 4]
    with torch.no_grad():
        expected = torch.jit.load(str(path))(torch.from_numpy(x), 1.5, 2, True).numpy()
    np.testing.assert_allclose(_ort(model, {"x": x}), expected, rtol=1e-5, atol=1e-5)
    # The API takes the same arrays as a dict.
    api = import_model([path], options={"example_inputs": {"x": x, "scale": 1.5, "steps": 2, "clip": True}})
    np.testing.assert_allclose(_ort(api, {"x": x}), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("arrays", "extra", "needle"),
    [
        ({"x": np.zeros((1, 4), np.float32), "scale": np.float32(1), "steps": np.int64(1), "bogus": np.zeros(1)},
         [], "forward() has no argument(s) bogus (arrays of the example inputs)"),
        ({"x": np.zeros((1, 4), np.float32), "scale": np.zeros(3, np.float32), "steps": np.int64(1)},
         [], "'scale: float' takes one value, but the array holds shape [3]"),
        ({"x": np.zeros((1, 4), np.float32), "scale": np.float32(1), "steps": np.float32(1.0)},
         [], "'steps: int' takes an int, but the array's dtype is float32"),
        ({"x": np.zeros((1, 4), np.float32), "scale": np.float32(1), "steps": np.int64(1)},
         ["--input-shape", "x=2,4"], "--input-shape x=2,4 but the example input has shape [1, 4]"),
        ({"x": np.zeros((1, 4), np.float32), "scale": np.float32(1), "steps": np.int64(1)},
         ["--input-value", "steps=3"], "'steps' is 3 by --input-value but 1 in the example inputs"),
    ],
)  # fmt: skip
def test_bad_example_inputs_name_the_npz(tmp_path: Path, arrays, extra, needle) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    npz = tmp_path / "ex.npz"
    np.savez(npz, **arrays)
    _one_line_exit_2(
        _cli("import", str(path), "-o", str(tmp_path / "o.onnx"), "--example-inputs", str(npz), *extra),
        needle,
    )


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing", "object"])
def test_hostile_example_inputs_file_is_exit_2(tmp_path: Path, damage: str) -> None:
    path = _script(Gain(), tmp_path / "gain.pt")
    npz = tmp_path / "ex.npz"
    if damage == "garbage":
        npz.write_bytes(b"PK\x05\x06" + bytes(range(256)) * 4)
    elif damage == "truncated":
        np.savez(npz, x=np.random.default_rng(9).standard_normal((64, 4)).astype(np.float32))
        npz.write_bytes(npz.read_bytes()[:300])
    elif damage == "object":
        np.savez(npz, x=np.array([{"a": 1}], dtype=object))
    r = _cli("import", str(path), "-o", str(tmp_path / "o.onnx"), "--example-inputs", str(npz))
    _one_line_exit_2(r, str(npz))
    assert not (tmp_path / "o.onnx").exists()


# --- stateful modules --------------------------------------------------------------------------


def test_stateful_module_exports_its_state_as_loaded(tmp_path: Path) -> None:
    """The ONNX model is the module's first call after loading: the probe call mconv makes and
    torch's exporter's own call do not leak into the exported state."""
    path = _script(Streaming(), tmp_path / "stream.pt")
    model = import_model([path], options={"input_shapes": {"x": [2, 4]}, "input_values": {"sr": 16000}})
    notes = model.metadata_props["mconv.import_notes"]
    assert "keeps state between calls in torch (it reassigns _calls, _context)" in notes
    rng = np.random.default_rng(10)
    first, second = (rng.standard_normal((2, 4)).astype(np.float32) for _ in range(2))
    fresh = torch.jit.load(str(path))
    with torch.no_grad():
        want_first = fresh(torch.from_numpy(first), 16000).numpy()
        stream_second = fresh(torch.from_numpy(second), 16000).numpy()  # uses the first call's context
        want_second = torch.jit.load(str(path))(torch.from_numpy(second), 16000).numpy()
    assert not np.allclose(stream_second, want_second)  # the state matters in this module
    for feed, want in ((first, want_first), (second, want_second)):
        np.testing.assert_allclose(_ort(model, {"x": feed}), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_reference(model, {"x": feed}), want, rtol=1e-5, atol=1e-6)


# --- the real model: silero-vad's TorchScript file ---------------------------------------------

SILERO = ("silero-vad", "6.2.3", "silero_vad/data/silero_vad.jit",
          "e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720")  # fmt: skip


def _speech(tmp_path: Path) -> np.ndarray:
    """16 kHz mono float audio: espeak-ng's speech when it is installed, else a voiced synthetic
    signal (a glottal pulse train through three formant resonances, syllable envelopes, pauses)."""
    if shutil.which("espeak-ng"):
        wav = tmp_path / "speech.wav"
        text = (
            "Voice activity detection finds where people speak. The quick brown fox jumps over the lazy dog."
        )
        subprocess.run(
            ["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav), text], check=True, timeout=60
        )
        with wave.open(str(wav)) as w:
            rate, raw = w.getframerate(), w.readframes(w.getnframes())
        audio = np.frombuffer(raw, dtype="<i2").astype(np.float64) / 32768.0
        t = np.arange(int(len(audio) * 16000 / rate)) / 16000.0
        audio = np.interp(t, np.arange(len(audio)) / rate, audio)
    else:
        rng = np.random.default_rng(11)
        t = np.arange(int(3.0 * 16000)) / 16000.0
        f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
        phase = np.cumsum(f0) / 16000.0
        audio = np.zeros_like(t)
        for k in range(1, 30):  # harmonics shaped by formants near 700, 1200 and 2600 Hz
            f = k * f0
            gain = sum(np.exp(-(((f - c) / 150.0) ** 2)) for c in (700, 1200, 2600)) + 0.05
            audio += gain / k * np.sin(2 * np.pi * k * phase)
        syllables = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) * (np.sin(2 * np.pi * 0.4 * t) > -0.3)
        audio = 0.3 * audio * syllables / np.abs(audio).max() + 0.002 * rng.standard_normal(len(t))
    silence = np.zeros(8000)
    return np.concatenate([silence, audio, silence]).astype(np.float32)


def test_silero_vad_imports_and_matches_torch_on_speech(tmp_path: Path) -> None:
    try:
        jit = _wheels.fetch_member(*SILERO)
    except _wheels.WheelUnavailable as exc:
        pytest.skip(f"silero-vad's wheel is not reachable: {exc}")
    out = tmp_path / "vad.onnx"
    r = _cli(
        "import", str(jit), "-o", str(out), "--input-value", "sr=16000", "--input-shape", "x=1,512", "--json"
    )
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["notes"]
    assert any("baked into the graph as constants: sr=16000" in n for n in notes), notes
    assert any("keeps state between calls" in n and "_state" in n for n in notes), notes
    model = load_onnx(out)
    assert [v.name for v in model.graph.inputs] == ["x"]
    audio = _speech(tmp_path)
    chunks = audio[: len(audio) // 512 * 512].reshape(-1, 1, 512)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    vad = torch.jit.load(str(jit))
    want, got = [], []
    with torch.no_grad():
        for chunk in chunks:
            vad.reset_states()  # the ONNX model is a first call: state as loaded (empty)
            want.append(vad(torch.from_numpy(chunk), 16000).item())
            got.append(session.run(None, {"x": chunk})[0].item())
    want, got = np.array(want), np.array(got)
    assert want.std() > 0.01  # speech and silence give different probabilities
    cosine = float(want @ got / np.linalg.norm(want) / np.linalg.norm(got))
    assert cosine >= 0.99999, cosine
    np.testing.assert_allclose(got, want, atol=1e-5)
    ref = get_target("reference").load_model(model)
    picked = chunks[:: max(1, len(chunks) // 12)]
    ref_out = np.array([next(iter(ref.run({"x": c}).values())).item() for c in picked])
    np.testing.assert_allclose(ref_out, want[:: max(1, len(chunks) // 12)], atol=1e-5)


def test_silero_vad_stateless_core_streams_like_torch(tmp_path: Path) -> None:
    """The documented way to stream a stateful model: its stateless core, state in and out."""
    try:
        jit = _wheels.fetch_member(*SILERO)
    except _wheels.WheelUnavailable as exc:
        pytest.skip(f"silero-vad's wheel is not reachable: {exc}")
    vad = torch.jit.load(str(jit))
    core = tmp_path / "core.pt"
    torch.jit.save(vad._model, str(core))
    model = import_model([core], options={"input_shapes": {"x": [1, 576], "state": [2, 1, 128]}})
    assert [v.name for v in model.graph.inputs] == ["x", "state"]
    session = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    audio = _speech(tmp_path)
    chunks = audio[: len(audio) // 512 * 512].reshape(-1, 1, 512)
    context, state = np.zeros((1, 64), np.float32), np.zeros((2, 1, 128), np.float32)
    want, got = [], []
    vad.reset_states()
    with torch.no_grad():
        for chunk in chunks:
            want.append(vad(torch.from_numpy(chunk), 16000).item())  # torch keeps its state
            x = np.concatenate([context, chunk], axis=1)
            prob, state = session.run(None, {"x": x, "state": state})
            context = x[:, -64:]
            got.append(prob.item())
    want, got = np.array(want), np.array(got)
    cosine = float(want @ got / np.linalg.norm(want) / np.linalg.norm(got))
    assert cosine >= 0.99999, cosine
    np.testing.assert_allclose(got, want, atol=1e-4)
