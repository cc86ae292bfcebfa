"""bench/fuzz.py's machinery, in-process: fake readers whose outcome is known are classified as
such (exit 2, valid, exit 3, timeout, memory, leak, multi-line, signal; a MemoryError is a clean exit 2), and ~20 real mutation
cases of two formats run through the real CLI in forked children."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from mconv.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fuzzer forks and uses Linux rlimits")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_smoke_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fuzz():
    return _load("fuzz")


@pytest.fixture(scope="module")
def corpus_mod():
    return _load("fuzz_corpus")


def _weight_model(data: bytes) -> ir.Model:
    arr = np.frombuffer(data[: len(data) // 4 * 4], np.float32).copy()
    t = ir.Tensor(arr, name="w")
    v = ir.Value(name="w", const_value=t, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.FLOAT))
    g = ir.Graph([], [v], nodes=[], initializers=[v], opset_imports={"": 17}, name="g")
    return ir.Model(g, ir_version=8)


def _fake_reader(paths, options):
    """What the file says is what the reader does (each a harness outcome to recognise)."""
    text = Path(paths[0]).read_bytes()
    if text.startswith(b"exit2"):
        raise InputError("bad fake file", path=str(paths[0]), where="byte offset 0", hint="none")
    if text.startswith(b"exit3"):
        raise RuntimeError("a reader bug")
    if text.startswith(b"sleep"):
        import time

        time.sleep(60)
    if text.startswith(b"memory"):
        np.ones(8 << 30, np.uint8)  # 8 GiB under a 1 GiB address-space limit
    if text.startswith(b"twolines"):
        print("warning: something else", file=sys.stderr)
        raise InputError("bad fake file", path=str(paths[0]))
    if text.startswith(b"segv"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if text.startswith(b"killed"):  # what the kernel's OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if text.startswith(b"leak"):
        return _weight_model((Path(paths[0]).parent.parent / "canary").read_bytes())
    return _weight_model(np.arange(8, dtype=np.float32).tobytes())


@pytest.fixture
def fake_format(monkeypatch):
    from mconv.formats import Format, registry

    reg = registry()
    monkeypatch.setitem(reg, "fake", Format("fake", "test-only reader", (".fake",), load=_fake_reader))
    return "fake"


def _entry(root: Path, name: str, content: bytes) -> dict:
    d = root / "seeds" / f"fake__{name}"
    d.mkdir(parents=True)
    (d / "m.fake").write_bytes(content)
    argv = ["import", "{D}/m.fake", "-o", "{D}/out/out.onnx", "--json"]
    return {"format": "fake", "name": name, "kind": "hostile", "dir": f"seeds/fake__{name}",
            "files": ["m.fake"], "mutate": [0], "argv": argv, "resign": False}  # fmt: skip


def test_the_harness_classifies_each_outcome(fuzz, corpus_mod, fake_format, tmp_path):
    from mconv.cli.app import app

    block = corpus_mod.canary_block(3)
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "canary").write_bytes(block * 64)
    want = {
        "exit2": "exit2",
        "valid": "valid",
        "exit3": "exit3",
        "sleep": "timeout",
        "memory": "exit2",  # a MemoryError is one line, exit 2, saying how much memory it needs
        "killed": "memory",
        "leak": "leak",
        "twolines": "other",
        "segv": "other",
    }
    entries = [_entry(tmp_path, name, name.encode() + b"\n") for name in want]
    corpus = {"seed": 3, "canary_hex": block.hex(), "entries": entries}
    runner = fuzz.Runner(tmp_path, corpus, mem_limit=1 << 30, time_limit=2.0, app=app)
    cases = fuzz.hostile_cases("fake", corpus)
    results = runner.run_all(cases, jobs=2)
    got = {r.case.entry["name"]: r.cls for r in results}
    assert got == want, {r.case.entry["name"]: (r.cls, r.reason) for r in results}
    by = {r.case.entry["name"]: r for r in results}
    assert by["exit3"].code == 3 and "internal error" in by["exit3"].reason
    assert by["segv"].reason == "signal SIGSEGV"
    assert "2 lines" in by["twolines"].reason
    assert "m.fake" in by["exit2"].reason  # the file is named in the one line
    assert sorted(p.name for p in (tmp_path / "cases").iterdir()) == ["canary"]  # case folders removed
    recs = [r.record(3) for r in results]
    text = fuzz.table(recs, ["fake"], hostile=True)
    assert "| fake | 9 | 2 | 1 | 1 | 1 | 1 | 1 | 0 | 0 | 2 |" in text
    assert len(fuzz.failures(recs)) == 6


def test_mutations_are_deterministic_and_replayable(fuzz):
    data = bytes(range(256)) * 8
    for i in range(50):
        a = fuzz.plan_mutations(np.random.default_rng([1, i]), len(data))
        b = fuzz.plan_mutations(np.random.default_rng([1, i]), len(data))
        assert a == b
        assert fuzz.apply_mutations(data, a) == fuzz.apply_mutations(data, b)
    kinds = {e[0] for i in range(200) for e in fuzz.plan_mutations(np.random.default_rng([2, i]), len(data))}
    assert kinds == {"truncate", "flip", "overwrite", "insert", "duplicate"}
    assert fuzz.apply_mutations(b"abcdef", [("truncate", 2)]) == b"ab"
    assert fuzz.apply_mutations(b"abcdef", [("duplicate", 0, 2, 6)]) == b"abcdefab"
    assert fuzz.apply_mutations(b"abcdef", [("overwrite", 1, 2, "ff", 0)]) == b"a\xff\xffdef"
    assert fuzz.parse_replay("npz#17 seed=4 entry=plain w.npz flip:1:2:3") == ("npz", "17", 4)


def test_real_mutations_of_two_formats_run_through_the_cli(fuzz, corpus_mod, tmp_path):
    corpus = corpus_mod.build(tmp_path, 0, ["safetensors", "dlk-json"])
    assert not corpus["builder_failures"]
    runner = fuzz.Runner(tmp_path, corpus, app=fuzz._import_cli("safetensors"))
    outcomes = runner.warm_up()
    assert set(outcomes.values()) == {"valid"}, outcomes
    cases = [
        c
        for c in fuzz.plan(corpus, ["safetensors", "dlk-json"], 10, 0, runner.sizes())
        if c.target is not None
    ]
    assert len(cases) == 20
    again = fuzz.plan(corpus, ["safetensors", "dlk-json"], 10, 0, runner.sizes())
    assert [c.repro(0) for c in cases] == [c.repro(0) for c in again if c.target is not None]
    results = runner.run_all(cases, jobs=2)
    assert len(results) == 20
    assert {r.cls for r in results} <= set(fuzz.CLASSES)
    assert any(r.cls == "exit2" for r in results)
