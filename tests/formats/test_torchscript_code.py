"""TorchScript code in a .pt archive is checked before torch compiles or runs any of it
(formats/pytorch/script_check.py): hostile archives built here call ``torch.from_file`` (which
creates or overwrites a file with ``shared=True`` and reads one into a tensor with
``shared=False``) from ``forward``, ``__setstate__``, a submodule and a helper method, or reach
other operators, namespaces and syntax; ``mconv import`` and ``mconv inspect`` refuse each with
one line and exit 2, the canary file is never created and the secret's bytes appear nowhere.
Scripted CNN, LSTM and transformer encoder layers still import."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mconv.cli.app import app
from mconv.formats.pytorch import examine
from mconv.formats.pytorch import script_check as check
from typer.testing import CliRunner

SECRET = b"TOP-SECRET-4f1c2b9e-" * 4  # 80 bytes: a file of the user's that a model must not read


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line_exit_2(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _never_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.jit.load raises: a refusal must come before torch reads the archive."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch.jit.load ran on an archive the checks should have refused")

    monkeypatch.setattr(torch.jit, "load", refuse)


# --- hostile modules: each calls torch.from_file somewhere torch would run it -----------------


class WritesInForward(torch.nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.from_file(self.path, True, 16).sum()


class WritesInSetstate(torch.nn.Module):
    """``__setstate__`` runs inside torch.jit.load, before any forward."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale

    @torch.jit.export
    def __getstate__(self) -> tuple[str, float, bool]:
        return (self.path, self.scale, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, float, bool]) -> None:
        self.path = state[0]
        self.scale = state[1] + float(torch.from_file(state[0], True, 16).numel()) * 0.0
        self.training = state[2]


class Child(torch.nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - torch.from_file(self.path, True, 16).mean()


class WritesInSubmodule(torch.nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.child = Child(path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(self.fc(x))


class WritesInHelper(torch.nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def _offset(self) -> torch.Tensor:
        return torch.from_file(self.path, True, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self._offset().sum()


class BakesSecret(torch.nn.Module):
    """shared=False reads the file into a tensor that the exporter bakes into a Constant."""

    def __init__(self, path: str, n: int) -> None:
        super().__init__()
        self.path = path
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        secret = torch.from_file(self.path, False, self.n, dtype=torch.uint8)
        return x + secret.to(torch.float32).sum() * 0.0 + secret[:4].to(torch.float32)


def _save(module: torch.nn.Module, path: Path) -> Path:
    torch.jit.save(torch.jit.script(module), str(path))
    return path


HOSTILE = {
    "forward": lambda canary: WritesInForward(canary),
    "setstate": lambda canary: WritesInSetstate(canary),
    "submodule": lambda canary: WritesInSubmodule(canary),
    "helper": lambda canary: WritesInHelper(canary),
}


def test_the_hostile_archive_writes_when_torch_runs_it(tmp_path: Path) -> None:
    """Control: the threat is real. torch.jit.load of the __setstate__ archive creates the
    canary (in a child process, away from mconv), so the refusals below are not vacuous."""
    canary = tmp_path / "control.bin"
    pt = _save(WritesInSetstate(str(canary)), tmp_path / "control.pt")
    assert not canary.exists()
    subprocess.run([sys.executable, "-c", f"import torch; torch.jit.load({str(pt)!r})"], check=True)
    assert canary.exists() and canary.stat().st_size == 16 * 4


@pytest.mark.parametrize("where", sorted(HOSTILE))
@pytest.mark.parametrize("command", ["import", "inspect"])
def test_from_file_anywhere_is_refused_before_torch_loads(tmp_path, monkeypatch, where, command) -> None:
    canary = tmp_path / "canary.bin"
    pt = _save(HOSTILE[where](str(canary)), tmp_path / f"{where}.pt")
    _never_load(monkeypatch)
    out = tmp_path / "out.onnx"
    args = (
        ["import", str(pt), "-o", str(out), "--input-shape", "x=1,4"]
        if command == "import"
        else ["inspect", str(pt)]
    )
    line = _one_line_exit_2(_cli(*args), "torch.from_file", "reads or writes files", str(pt))
    assert "code/__torch__" in line
    assert not canary.exists()
    assert not out.exists()


def test_from_file_reading_a_secret_is_refused_and_the_bytes_go_nowhere(tmp_path, monkeypatch) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    pt = _save(BakesSecret(str(secret), len(SECRET)), tmp_path / "bake.pt")
    _never_load(monkeypatch)
    out = tmp_path / "out.onnx"
    r = _cli("import", str(pt), "-o", str(out), "--input-shape", "x=1,4", "--json")
    _one_line_exit_2(r, "torch.from_file")
    assert not out.exists()
    assert SECRET[:16].decode() not in r.output
    assert [p.name for p in tmp_path.iterdir() if p.name not in ("secret.txt", "bake.pt")] == []
    assert secret.read_bytes() == SECRET


# --- the same reached by other spellings, and what else is refused ----------------------------


class Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _patched(tmp_path: Path, change: Callable[[str], str], name: str = "p.pt") -> Path:
    """A scripted Plain whose forward's source (code/__torch__/...py) goes through ``change``."""
    src = _save(Plain(), tmp_path / "plain.pt")
    dst = tmp_path / name
    hit = []
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w") as zo:
        for info in zi.infolist():
            data = zi.read(info.filename)
            if info.filename.endswith(".py") and "class Plain(Module)" in data.decode():
                data = change(data.decode()).encode("utf-8")
                hit.append(info.filename)
            zo.writestr(info, data)
    assert hit
    return dst


def _inject(line: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        body = re.search(r"\n(\s+)return ", text)
        assert body is not None
        indent = body.group(1)
        return text.replace(body.group(0), f"\n{indent}{line}\n{indent}return ", 1)

    return change


CANARY = "CANARY_PATH"
SPELLINGS = {
    "method": (f'_c = torch.zeros([1]).from_file("{CANARY}", True, 16)', "from_file"),
    "ops.aten": (f'_c = ops.aten.from_file("{CANARY}", True, 16)', "ops.aten.from_file"),
    "getattr": (f'_c = getattr(x, "from_file")("{CANARY}", True, 16)', "from_file"),
    "save": (f'_c = torch.save(x, "{CANARY}")', "torch.save"),
    "print": ('print("hello")', "print"),
    "_print": ('torch._print("hello")', "torch._print"),
    "other namespace": ("_c = ops.c10d.barrier(x)", "ops.c10d.barrier"),
    "custom op": ("_c = ops.quantized.add(x, x, 1.0, 0)", "ops.quantized.add"),
    "prim Print": ('ops.prim.Print("x")', "ops.prim.Print"),
    "custom class": (f'_c = __torch__.torch.classes.dist_c10d.FileStore("{CANARY}", 1)', "torch.classes"),
    "unknown class": ("_c = __torch__.elsewhere.Thing()", "__torch__.elsewhere.Thing"),
    "fork": ("_c = fork(torch.relu, x)", "fork"),
    "unknown name": ("_c = open(x)", "open"),
    "unknown op": ("_c = torch.not_an_op(x)", "torch.not_an_op"),
    "non-literal getattr": ('_c = getattr(x, "fr" + "om_file")', "getattr"),
    "torch.ops": (f'_c = torch.ops.aten.from_file("{CANARY}", True, 16)', "torch.ops"),
}


@pytest.mark.parametrize("case", sorted(SPELLINGS))
def test_each_spelling_is_refused_by_name(tmp_path, monkeypatch, case) -> None:
    line, name = SPELLINGS[case]
    canary = tmp_path / "canary.bin"
    pt = _patched(tmp_path, _inject(line.replace(CANARY, str(canary))))
    _never_load(monkeypatch)
    out = tmp_path / "out.onnx"
    _one_line_exit_2(_cli("import", str(pt), "-o", str(out), "--input-shape", "x=1,4"), name)
    _one_line_exit_2(_cli("inspect", str(pt)), name)
    assert not canary.exists() and not out.exists()


TEXT = {
    # Python reads one string; a lexer without triple quotes would read code between the quotes.
    "triple quotes": ('_s = """\n"\n_c = torch.from_file("f", True, 1)\n"\n"""', "string literal"),
    "string prefix": ('_s = r"x"', "string literal"),
    "carriage return": ("pass # note\r_c = 1", "\\x0d"),
    "non-ASCII name": ("_ｃ = 1", "printable ASCII"),
    "backslash continuation": ("_c = 1 + \\\n      2", "printable ASCII"),
    "import": ("import os", "Import"),
    "lambda": ("_c = (lambda: 1)()", "Lambda"),
    "bytes": ('_c = b"x"', "string literal"),
    "syntax": ("_c = (", "not Python syntax"),
    "nested function": ("def inner(y: int) -> int:\n      return y", "FunctionDef"),
    "local named print": ("print = 1", "print"),
}


@pytest.mark.parametrize("case", sorted(TEXT))
def test_code_torch_could_read_otherwise_is_refused(tmp_path, monkeypatch, case) -> None:
    line, needle = TEXT[case]
    pt = _patched(tmp_path, _inject(line))
    _never_load(monkeypatch)
    _one_line_exit_2(_cli("inspect", str(pt)), needle)


def test_a_py_member_outside_code_and_in_another_case_is_checked(tmp_path, monkeypatch) -> None:
    """torch's zip reader finds members without regard to case: every .py member is checked."""
    src = _save(Plain(), tmp_path / "plain.pt")
    dst = tmp_path / "case.pt"
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w") as zo:
        for info in zi.infolist():
            zo.writestr(info, zi.read(info.filename))
        root = zi.namelist()[0].split("/")[0]
        zo.writestr(
            f"{root}/CODE/__torch__/x.PY", 'def f(x: Tensor) -> Tensor:\n  return torch.save(x, "f")\n'
        )
    _never_load(monkeypatch)
    _one_line_exit_2(_cli("inspect", str(dst)), "torch.save", "CODE/__torch__/x.PY")


def test_many_problems_are_one_line_listing_the_first(tmp_path, monkeypatch) -> None:
    lines = "\n    ".join(f'_c{i} = torch.from_file("f{i}", True, 1)\n    print({i})' for i in range(40))
    pt = _patched(tmp_path, _inject(lines))
    _never_load(monkeypatch)
    line = _one_line_exit_2(_cli("inspect", str(pt)), "torch.from_file", "print")
    assert len(line) < 1200


# --- legitimate scripted models still import ---------------------------------------------------


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        return torch.softmax(self.head(self.features(y).flatten(1)), dim=-1)


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 8, num_layers=2, batch_first=True)
        self.gru = torch.nn.GRU(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)
        z, _ = self.gru(y)
        return z


def _encoder() -> torch.nn.Module:
    return torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)


LEGIT = {"cnn": (SmallCNN, "x=1,3,8,8"), "lstm": (Recurrent, "x=1,5,4")}


@pytest.mark.parametrize("name", sorted(LEGIT))
def test_scripted_models_still_import(tmp_path: Path, name: str) -> None:
    factory, shape = LEGIT[name]
    torch.manual_seed(0)
    pt = _save(factory().eval(), tmp_path / f"{name}.pt")
    out = tmp_path / "out.onnx"
    r = _cli("import", str(pt), "-o", str(out), "--input-shape", shape)
    assert r.exit_code == 0, r.output
    assert out.exists()


def test_traced_encoder_layer_imports(tmp_path: Path) -> None:
    torch.manual_seed(0)
    pt = tmp_path / "enc.pt"
    with torch.no_grad():
        traced = torch.jit.trace(_encoder().eval(), torch.randn(1, 5, 16), check_trace=False)
    torch.jit.save(traced, str(pt))
    r = _cli("import", str(pt), "-o", str(tmp_path / "out.onnx"), "--input-shape", "src=1,5,16")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "factory",
    [_encoder, lambda: torch.nn.MultiheadAttention(16, 2), lambda: torch.nn.GRU(4, 8), SmallCNN, Recurrent],
)
def test_scripted_library_modules_pass_the_code_check(tmp_path: Path, factory) -> None:
    """torch.nn's scripted code (interpolate, multi-head attention, RNNs, no_grad...) is all
    allowed; the scripted encoder layer itself has no ONNX export (aten::is_autocast_enabled)."""
    pt = _save(factory().eval(), tmp_path / "m.pt")
    assert examine(pt).kind == "torchscript"


# --- the operator tables against this torch ---------------------------------------------------

# prim operators refused, reviewed: printing, Python calls, RPC, profiling, timing, statistics,
# awaitables and the compiler's internal graph nodes (never in saved code).
PRIM_REFUSED = set(
    """
    AddStatValue AutogradAdd AutogradAllNonZero AutogradAllZero AutogradAnyNonZero AutogradZero
    BailOut BailoutTemplate BroadcastMKLDNNTensors BroadcastSizes ChunkSizes ConstantChunk
    ConstantMKLDNNTensor DifferentiableGraph FallbackGraph FusedConcat FusionGroup Guard
    IgnoredPythonOp MKLDNNClamp MKLDNNClamp_ MKLDNNHardSigmoid MKLDNNHardSigmoid_ MKLDNNHardSwish
    MKLDNNHardSwish_ MKLDNNHardTanh MKLDNNHardTanh_ MKLDNNLayerNorm MKLDNNLayerNorm_ MKLDNNScalarMul
    MKLDNNScalarMul_ MMBatchSide MMTreeReduce Print PythonOp ReductionSizes RequiresGradCheck
    StaticRuntimeCopyOuts StaticSubgraph TensorExprDynamicGroup TensorExprDynamicGuard
    TensorExprGroup TimePoint TypeCheck VarConcat VarStack awaitable_nowait awaitable_wait
    mkldnn_convolution oneDNNFusionGroup oneDNNFusionGuard profile profile_ivalue rpc_async
    rpc_remote rpc_sync
    """.split()
)


def test_every_aten_operator_with_a_string_argument_is_classified() -> None:
    """A torch release that adds an operator taking a string (a file name, perhaps) fails here
    until it is reviewed; until then the check refuses it (fail closed)."""
    aten = check.operator_names()["aten"]
    with_str = {n for n, has in aten.items() if has}
    unclassified = sorted(with_str - check.ATEN_STR_REVIEWED - check.ATEN_IMPURE)
    assert unclassified == [], f"review these ATen operators and add them to a table: {unclassified}"
    assert not check.ATEN_STR_REVIEWED & check.ATEN_IMPURE
    assert {"from_file", "save", "_print"} <= with_str & check.ATEN_IMPURE
    assert sorted(check.ATEN_IMPURE - set(aten)) == []  # the denylist names operators that exist
    for name in sorted(with_str - check.ATEN_STR_REVIEWED - check.ATEN_IMPURE):
        assert check.aten_problem(name) is not None


def test_every_prim_operator_is_classified() -> None:
    prim = set(check.operator_names()["prim"])
    assert sorted(prim - check.PRIM_PURE - PRIM_REFUSED) == []
    assert not check.PRIM_PURE & PRIM_REFUSED


def test_path_like_string_arguments_are_all_refused() -> None:
    """Every ATen operator whose string argument is named like a path is refused."""
    names = set()
    for schema in torch._C._jit_get_all_schemas():
        ns, _, name = schema.name.partition("::")
        if ns == "aten" and any(
            "str" in str(a.type) and re.search(r"file|path|dir|fname", a.name, re.I) for a in schema.arguments
        ):
            names.add(name)
    assert names and all(check.aten_problem(n) for n in names), names


# --- what torch would run at load besides the code: C++ classes in pickles, legacy archives -------


def _copy_with(
    src: Path, dst: Path, member_change: Callable[[str, bytes], bytes], extra: dict[str, bytes]
) -> Path:
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w") as zo:
        for info in zi.infolist():
            zo.writestr(info, member_change(info.filename, zi.read(info.filename)))
        root = zi.namelist()[0].split("/")[0]
        for name, data in extra.items():
            zo.writestr(f"{root}/{name}", data)
    return dst


def test_cpp_custom_class_in_a_pickle_is_refused(tmp_path, monkeypatch) -> None:
    """A pickled object of a C++ custom class gets its C++ __setstate__ run by torch.jit.load."""
    src = _save(Plain(), tmp_path / "plain.pt")

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("/data.pkl"):
            found = re.search(rb"c__torch__(\.[\w.]+)?\nPlain\n", data)
            assert found is not None, data
            return data.replace(found.group(0), b"c__torch__.torch.classes.dist_c10d\nFileStore\n", 1)
        return data

    bad = _copy_with(src, tmp_path / "cls.pt", change, {})
    _never_load(monkeypatch)
    _one_line_exit_2(
        _cli("inspect", str(bad)), "__torch__.torch.classes.dist_c10d.FileStore", "C++ custom class"
    )


def test_legacy_archive_with_model_json_is_refused(tmp_path, monkeypatch) -> None:
    src = _save(Plain(), tmp_path / "plain.pt")
    bad = _copy_with(src, tmp_path / "legacy.pt", lambda n, d: d, {"model.json": b"{}"})
    _never_load(monkeypatch)
    _one_line_exit_2(_cli("inspect", str(bad)), "legacy format", "model.json")
