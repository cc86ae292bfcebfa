"""Outputs under hostile conditions (issue 11, items 8, 10-14): unwritable places and full disks
are one line naming the output, usage errors are one line, a killed export never leaves the
output path empty, stale temporaries of dead runs are removed, failed saves clean up without
masking their error, ``-o`` naming the input never corrupts it, and corrupted bundles never
exit 3."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv import bundle as bundle_mod
from mconv import fileio, irio
from mconv.bundle import TensorSpec, load_bundle, write_bundle
from mconv.cli.app import app
from mconv.errors import InputError
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "fixtures" / "digits_mlp.onnx"


def _bundle(out: Path, tag: str = "A", n: int = 256) -> bundle_mod.Bundle:
    w = np.full(n, 1.0 if tag == "A" else 2.0, np.float32)
    return write_bundle(
        out,
        target="cpu",
        model_name=tag,
        inputs=[TensorSpec("x", "float32", ("N", 3))],
        outputs=[TensorSpec("y", "float32", ("N", 4))],
        weights=[("w", w, {"codec": "raw"})],
        payload={"model.onnx": tag.encode() * 100},
        options={},
        provenance={},
    )


def _tiny_model(path: Path, seed: int = 0, n: int = 64) -> Path:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _leftovers(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "-q"])


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and "Traceback" not in output
    return lines[0]


# --- item 8: unwritable outputs and full disks ------------------------------------------------


def test_output_under_a_regular_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "afile").write_bytes(b"x")
    for args in (
        ["import", str(DIGITS), "-o", str(tmp_path / "afile" / "out.onnx")],
        ["export", str(DIGITS), "-o", str(tmp_path / "afile" / "b")],
        ["optimize", str(DIGITS), "--passes", "fold", "-o", str(tmp_path / "afile" / "o.onnx")],
    ):
        r = _cli(*args)
        assert r.exit_code == 2, r.output
        line = _one_error_line(r.output)
        assert str(tmp_path / "afile") in line and "not a directory" in line
    assert (tmp_path / "afile").read_bytes() == b"x"


def test_output_in_proc_is_one_line_naming_it(tmp_path):
    r = _cli("import", str(DIGITS), "-o", "/proc/mconv-no-such/out.onnx")
    assert r.exit_code == 2
    assert "/proc/mconv-no-such/out.onnx" in _one_error_line(r.output)


def test_a_device_as_output_is_refused_and_never_replaced():
    before = os.stat("/dev/full")
    r = _cli("import", str(DIGITS), "-o", "/dev/full")
    assert r.exit_code == 2
    assert "not a regular file" in _one_error_line(r.output)
    after = os.stat("/dev/full")
    assert after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (errno.ENOSPC, "free space"),
        (errno.EDQUOT, "quota"),
        (errno.EROFS, "read-only"),
        (errno.EACCES, "permission"),
        (errno.EPERM, "permission"),
        (errno.ENAMETOOLONG, "shorten"),
    ],
)
def test_a_failing_write_is_one_input_error_naming_the_output(tmp_path, monkeypatch, code, hint):
    real_open = open

    class Failing:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(bytes(data)[:3])  # part of it lands, then the device gives up
            raise OSError(code, os.strerror(code))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(
        fileio, "open", lambda p, m="r", *a, **k: Failing(real_open(p, m, *a, **k)), raising=False
    )
    dest = tmp_path / "out.bin"
    with pytest.raises(InputError) as exc:
        fileio.atomic_write_bytes(dest, b"payload")
    line = exc.value.line()
    assert line.startswith(str(dest)) and errno.errorcode[code] in line and hint in line
    assert not dest.exists() and _leftovers(tmp_path, "out.bin") == []


def test_a_full_disk_while_saving_a_model_names_the_output_and_leaves_no_temp(tmp_path, monkeypatch):
    model = irio.load_onnx(_tiny_model(tmp_path / "in.onnx"))

    def full(model, path, *a, **k):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(irio.ir, "save", full)
    dest = tmp_path / "o.onnx"
    with pytest.raises(InputError, match="ENOSPC") as exc:
        irio.save_onnx(model, dest)
    assert exc.value.path == str(dest) and "free space" in exc.value.line()
    assert not dest.exists() and _leftovers(tmp_path, "o.onnx") == []


def test_a_full_disk_while_exporting_keeps_the_old_bundle_and_names_the_output(tmp_path, monkeypatch):
    out = tmp_path / "b"
    _bundle(out, "A")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(path, tensors, **_):
        Path(path).write_bytes(b"MCW1 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bundle_mod, "write_container", full)
    with pytest.raises(InputError, match="ENOSPC") as exc:
        _bundle(out, "B")
    assert exc.value.path == str(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path, "b") == []


def test_an_unreadable_source_while_saving_names_that_file_not_the_output(tmp_path, monkeypatch):
    model = irio.load_onnx(_tiny_model(tmp_path / "in.onnx"))
    src = str(tmp_path / "in.onnx.data")

    def unreadable(model, path, *a, **k):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", src)

    monkeypatch.setattr(irio.ir, "save", unreadable)
    with pytest.raises(InputError, match="cannot read the model's external data") as exc:
        irio.save_onnx(model, tmp_path / "o.onnx")
    assert exc.value.path == src
    assert _leftovers(tmp_path, "o.onnx") == []


# --- item 11: usage errors are one line --------------------------------------------------------


def _mconv(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def _main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``mconv ARGS`` through the entry point (cli.app.main), in this process."""
    from mconv.cli.app import main

    monkeypatch.setattr(sys, "argv", ["mconv", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "needle", "command"),
    [
        (["import"], "Missing argument", "mconv import"),
        (["import", "x.onnx", "-o", "y.onnx", "--bogus"], "No such option: --bogus", "mconv import"),
        (["verify", "a.onnx", "b.onnx", "--samples", "abc"], "'--samples'", "mconv verify"),
        (["no-such-command"], "No such command", "mconv"),
    ],
)
def test_usage_errors_are_one_line_with_a_help_hint(monkeypatch, capsys, args, needle, command):
    code, out, err = _main(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    line = _one_error_line(err)
    assert needle in line and line.endswith(f"(hint: see '{command} --help')")


def test_no_args_and_help_still_print_the_help(tmp_path):
    bare = _mconv(cwd=tmp_path)
    assert (
        bare.returncode == 2
        and "Usage:" in bare.stdout + bare.stderr
        and "Commands" in bare.stdout + bare.stderr
    )
    helped = _mconv("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "Usage:" in helped.stdout and "export" in helped.stdout


def test_a_bad_pass_spec_and_a_missing_input_are_one_line(tmp_path, monkeypatch, capsys):
    code, _, err = _main(
        monkeypatch, capsys, "optimize", str(DIGITS), "-o", str(tmp_path / "o.onnx"), "--passes", "prune("
    )
    assert code == 2 and "pass spec" in _one_error_line(err)
    code, _, err = _main(
        monkeypatch, capsys, "import", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x.onnx")
    )
    assert code == 2 and "missing.onnx" in _one_error_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- item 12: a killed export leaves the old bundle or the new one -----------------------------


def _export_forever(dest: Path, sources: dict[str, Path], exchange: bool) -> None:
    """The forked child: replace ``dest`` with bundle A, B, A, ... the way write_bundle does
    (fileio.atomic_dir), until it is killed."""
    try:
        fileio.USE_EXCHANGE = exchange
        i = 0
        while True:
            src = sources["AB"[i % 2]]
            with fileio.atomic_dir(dest) as tmp:
                for f in sorted(src.iterdir()):
                    shutil.copyfile(f, tmp / f.name)
            i += 1
    finally:
        os._exit(1)


def _kill_loop(tmp_path: Path, exchange: bool, kills: int, seed: int) -> list[str]:
    dest = tmp_path / "out" / "b"
    sources = {t: _bundle(tmp_path / "src" / t, t, n=1 << 18).root for t in "AB"}
    shutil.copytree(sources["A"], dest)
    rng = np.random.default_rng(seed)
    seen = []
    for _ in range(kills):
        pid = os.fork()  # no interpreter start-up per kill: the child writes at once
        if pid == 0:
            _export_forever(dest, sources, exchange)
        time.sleep(float(rng.uniform(0.001, 0.15)))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if not exchange:
            fileio.recover_dir(dest)  # what the next write of dest does first
        b = load_bundle(dest)  # every file present with its recorded size and sha256
        assert b.model_name in ("A", "B")
        with b.container() as c:
            assert np.all(c.array("w") == (1.0 if b.model_name == "A" else 2.0))
        assert b.read_bytes("model.onnx") == b.model_name.encode() * 100
        seen.append(b.model_name)
    _bundle(dest, "A")  # the next run removes what the killed ones left
    assert _leftovers(dest.parent, "b") == []
    return seen


def test_killed_exports_leave_the_old_or_the_new_bundle_with_rename_exchange(tmp_path):
    if not fileio.exchange(tmp_path, tmp_path):  # a no-op swap tells whether renameat2 works here
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    seen = _kill_loop(tmp_path, exchange=True, kills=24, seed=12)
    assert len(seen) == 24


def test_killed_exports_on_the_two_rename_fallback_are_recovered_by_the_next_run(tmp_path):
    seen = _kill_loop(tmp_path, exchange=False, kills=24, seed=13)
    assert len(seen) == 24


def test_recover_dir_restores_a_complete_old_bundle_when_dest_is_missing(tmp_path):
    dead = _dead_pid()
    old = tmp_path / f".b.{dead}.abcd1234.old"
    _bundle(old, "A")
    (tmp_path / f".b.{dead}.efgh5678.tmp").mkdir()  # the new one, never renamed
    assert fileio.recover_dir(tmp_path / "b")
    assert load_bundle(tmp_path / "b").model_name == "A"
    _bundle(tmp_path / "b", "B")
    assert load_bundle(tmp_path / "b").model_name == "B" and _leftovers(tmp_path, "b") == []


# --- item 13: stale temporaries of dead runs are removed, live ones kept ----------------------


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=60)
    return p.pid


_LOCKER = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


def test_stale_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = _dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    locker = None
    try:
        live = sleeper.pid
        stale = [
            f".b.{dead}.abcd1234.tmp",
            f".b.{dead}.efgh5678.old",
            f".o.onnx.{dead}.ijkl9012.tmp",
            f".mconv-spill-{dead}-mnop3456",
        ]
        kept = [
            f".b.{live}.qrst7890.tmp",
            f".mconv-spill-{live}-uvwx1234",
            f".b.{dead}.locked12.tmp",
            "b.keep",
        ]
        for name in stale + kept:
            (tmp_path / name).mkdir()
            (tmp_path / name / "blob").write_bytes(b"\0" * 1000)
        (tmp_path / f".o.onnx.{dead}.file0000.tmp").write_bytes(b"partial")
        stale.append(f".o.onnx.{dead}.file0000.tmp")
        # A writer in another pid namespace: its pid means nothing here, its flock does.
        locker = subprocess.Popen(
            [sys.executable, "-c", _LOCKER, str(tmp_path / f".b.{dead}.locked12.tmp")],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert locker.stdout.readline().strip() == "locked"

        _bundle(tmp_path / "b", "A")
        irio.save_onnx(irio.load_onnx(_tiny_model(tmp_path / "in.onnx")), tmp_path / "o.onnx")
        with irio.spilling(tmp_path):
            pass
        names = {p.name for p in tmp_path.iterdir()}
        assert not names & set(stale), names & set(stale)
        assert set(kept) <= names
    finally:
        for p in (sleeper, locker):
            if p is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=60)
                if p.stdout:
                    p.stdout.close()


def test_temporaries_carry_the_writer_pid_and_are_gone_after_success(tmp_path):
    seen = []
    with fileio.atomic_path(tmp_path / "x.bin") as tmp:
        seen.append(tmp.name)
        tmp.write_bytes(b"ok")
    with fileio.atomic_dir(tmp_path / "d") as tmpd:
        seen.append(tmpd.name)
        (tmpd / "f").write_bytes(b"ok")
    with irio.spilling(tmp_path) as scratch:
        seen.append(scratch.name)
    assert seen[0].startswith(f".x.bin.{os.getpid()}.") and seen[1].startswith(f".d.{os.getpid()}.")
    assert seen[2].startswith(f".mconv-spill-{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "x.bin"]


# --- item 14: a failed save keeps its first error and leaves no temporary ----------------------


def test_a_failed_save_with_a_subfolder_in_its_temp_raises_the_original_error(tmp_path, monkeypatch):
    model = irio.load_onnx(_tiny_model(tmp_path / "in.onnx"))

    def boom(model, path, *a, **k):
        sub = Path(path).parent / "shard-dir"  # what once made cleanup raise IsADirectoryError
        sub.mkdir()
        (sub / "part").write_bytes(b"x")
        Path(path).write_bytes(b"half")
        raise ValueError("boom in the middle")

    monkeypatch.setattr(irio.ir, "save", boom)
    with pytest.raises(ValueError, match="boom in the middle"):
        irio.save_onnx(model, tmp_path / "o.onnx")
    assert _leftovers(tmp_path, "o.onnx") == [] and not (tmp_path / "o.onnx").exists()


def test_a_failed_bundle_write_raises_the_original_error_and_cleans_up(tmp_path, monkeypatch):
    def boom(path, tensors, **_):
        Path(path).parent.joinpath("deep", "er").mkdir(parents=True)
        raise KeyError("first error")

    monkeypatch.setattr(bundle_mod, "write_container", boom)
    with pytest.raises(KeyError, match="first error"):
        _bundle(tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_remove_quietly_never_raises(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "l").symlink_to(tmp_path / "d")
    for name in ("d", "f", "l", "missing"):
        fileio.remove_quietly(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


# --- -o naming the input never corrupts it ----------------------------------------------------


def test_save_over_the_input_with_external_data_is_refused_and_the_input_kept(tmp_path):
    src = tmp_path / "a.onnx"
    tiny = _tiny_model(tmp_path / "t.onnx", n=256)  # 4 KB of weights: external above 1 KB
    irio.save_onnx(irio.load_onnx(tiny), src, external_threshold=0)
    assert (tmp_path / "a.onnx.data").exists()
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (src, tmp_path / "a.onnx.data")}
    model = irio.load_onnx(src)
    with pytest.raises(InputError, match="weights are read from") as exc:
        irio.save_onnx(model, src, external_threshold=0)
    assert exc.value.path == str(src)
    assert {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (src, tmp_path / "a.onnx.data")
    } == digests
    assert _leftovers(tmp_path, "a.onnx") == []


def test_optimize_in_place_on_a_single_file_model_is_refused_and_the_input_kept(tmp_path):
    src = _tiny_model(tmp_path / "a.onnx")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    r = _cli("optimize", str(src), "--passes", "fold", "-o", str(src))
    assert r.exit_code == 2 and "the output is the input" in _one_error_line(r.output)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest
    assert _leftovers(tmp_path, "a.onnx") == []


# --- item 10: corrupted bundles through inspect / run / verify never exit 3 ---------------------

_VALUES = [None, True, -1, 2**70, 1.5, "x", [], {}, [[1]], "object", {"a": 1}, [-3], "float32", 0]


def _resign(d: Path) -> None:
    m = json.loads((d / "manifest.json").read_text())
    for rel in m["files"]:
        data = (d / rel).read_bytes()
        m["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (d / "manifest.json").write_text(json.dumps(m))


def _mutate_json(obj, rng):
    paths = []

    def walk(o, p):
        paths.append(p)
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for k, v in items:
            walk(v, [*p, k])

    walk(obj, [])
    p = paths[int(rng.integers(0, len(paths)))]
    value = _VALUES[int(rng.integers(0, len(_VALUES)))]
    if not p:
        return value
    cur = obj
    for k in p[:-1]:
        cur = cur[k]
    if isinstance(cur, dict) and rng.integers(0, 3) == 0:
        del cur[p[-1]]
    else:
        cur[p[-1]] = value
    return obj


def _corrupt(work: Path, rng) -> None:
    kind = int(rng.integers(0, 5))
    if kind == 1 and (work / "weights.mcw").read_bytes()[4] != 1:
        kind = 0  # a version 2 (binary) index has no JSON values to change: flipped bits instead
    if kind == 0:  # flipped bits in weights.mcw, mostly header and index, manifest re-signed
        b = bytearray((work / "weights.mcw").read_bytes())
        end = 16 + struct.unpack_from("<Q", b, 8)[0] + 64
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, min(len(b), end)))] ^= 1 << int(rng.integers(0, 8))
        (work / "weights.mcw").write_bytes(bytes(b))
        _resign(work)
    elif kind == 1:  # a wrong value anywhere in the container's index, manifest re-signed
        b = bytearray((work / "weights.mcw").read_bytes())
        n = struct.unpack_from("<Q", b, 8)[0]
        new = json.dumps(_mutate_json(json.loads(b[16 : 16 + n]), rng), separators=(",", ":")).encode()
        new = new.ljust(n, b" ") if len(new) <= n else new
        (work / "weights.mcw").write_bytes(bytes(b[:8] + struct.pack("<Q", len(new)) + new + b[16 + n :]))
        _resign(work)
    elif kind == 2:  # printable bytes overwritten in manifest.json
        b = bytearray((work / "manifest.json").read_bytes())
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(32, 127))
        (work / "manifest.json").write_bytes(bytes(b))
    elif kind == 3:  # a wrong value anywhere in manifest.json
        m = json.loads((work / "manifest.json").read_text())
        for _ in range(int(rng.integers(1, 3))):
            m = _mutate_json(m, rng)
        (work / "manifest.json").write_text(json.dumps(m))
    else:  # flipped bits in model.onnx, manifest re-signed
        b = bytearray((work / "model.onnx").read_bytes())
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] ^= 1 << int(rng.integers(0, 8))
        (work / "model.onnx").write_bytes(bytes(b))
        _resign(work)


def test_corrupted_bundles_never_exit_3_and_name_the_bundle(tmp_path):
    base = tmp_path / "base"
    r = _cli("export", str(DIGITS), "--target", "cpu", "-o", str(base))
    assert r.exit_code == 0, r.output
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 64), np.float32))
    rng = np.random.default_rng(2024)
    work = tmp_path / "w"
    for i in range(120):
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(base, work)
        _corrupt(work, rng)
        commands = [["run", str(work), "-i", f"input={x}"]]
        if i % 4 == 0:
            commands += [["inspect", str(work)], ["verify", str(DIGITS), str(work), "--samples", "2"]]
        for args in commands:
            r = _cli(*args)
            assert r.exit_code in (0, 1, 2), (i, args[0], r.output)
            assert "internal error" not in r.output and "Traceback" not in r.output, (i, r.output)
            if r.exit_code == 2:
                errors = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
                assert len(errors) == 1 and str(work) in errors[0], (i, args[0], r.output)
