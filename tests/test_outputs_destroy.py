"""No command destroys the user's files (mconv.fileio rules 5-7): an output replaces only what
mconv wrote there, never an input of the command (by path, link or inode, or inside the output
folder), a sharded checkpoint is swapped in whole (a killed run leaves the old folder or the new
one), and no reader waits on a FIFO or follows a link out of the folder the user named."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import mconv
import numpy as np
import onnx
import pytest
from mconv import fileio
from mconv.cli.app import app
from mconv.errors import InputError
from safetensors.numpy import save_file
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "fixtures" / "digits_mlp.onnx"
INDEX = "model.safetensors.index.json"
CLUSTER = "cluster(bits=4)"


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "-q"])


def _one_error(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _hashes(root: Path) -> dict[str, str]:
    """Every entry under ``root``: files by sha256, folders and links by kind and target."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _user_folder(tmp_path: Path) -> Path:
    """The issue's folder: a thesis, photos and the model itself."""
    models = tmp_path / "models"
    (models / "photos").mkdir(parents=True)
    (models / "thesis.txt").write_text("five years of work\n")
    (models / "photos" / "a.jpg").write_bytes(os.urandom(2000))
    (models / "model.onnx").write_bytes(DIGITS.read_bytes())
    return models


def _weights(seed: int = 0, n: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"l{i}.weight": rng.standard_normal((64, 64)).astype(np.float32) for i in range(n)}


def _sharded(folder: Path, seed: int = 0, shards: int = 2, prefix: str = "model") -> Path:
    """A sharded checkpoint of ``2 * shards`` tensors, two per shard."""
    folder.mkdir(parents=True, exist_ok=True)
    t = _weights(seed, 2 * shards)
    names = list(t)
    wmap = {}
    for k in range(shards):
        shard = f"{prefix}-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: t[n] for n in names[2 * k : 2 * k + 2]}, str(folder / shard))
        wmap |= {n: shard for n in names[2 * k : 2 * k + 2]}
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return folder


# --- an existing folder mconv did not write is never replaced ---------------------------------


@pytest.mark.parametrize("target", ["cpu", "weights", "xla", "metal", "webgpu"])
def test_export_into_a_folder_mconv_did_not_write_is_refused(tmp_path, target):
    models = _user_folder(tmp_path)
    src = tmp_path / "m.onnx"
    src.write_bytes(DIGITS.read_bytes())
    before = _hashes(models)
    for model in (src, models / "model.onnx"):  # the model elsewhere, and the model inside it
        r = _cli("export", str(model), "--target", target, "-o", str(models))
        _one_error(r, str(models))
        assert _hashes(models) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "models"]


def test_streamed_optimize_into_a_folder_mconv_did_not_write_is_refused(tmp_path):
    models = _user_folder(tmp_path)
    save_file(_weights(), str(tmp_path / "w.safetensors"))
    _sharded(tmp_path / "ckpt")
    before = _hashes(models)
    for src in ("w.safetensors", "ckpt", f"ckpt/{INDEX}"):  # a bundle streamed; sharded folders
        r = _cli("optimize", str(tmp_path / src), "--passes", CLUSTER, "-o", str(models))
        _one_error(r, "not one mconv wrote", "remove")
        assert _hashes(models) == before


def test_the_api_and_the_demo_refuse_a_folder_mconv_did_not_write(tmp_path):
    models = _user_folder(tmp_path)
    before = _hashes(models)
    with pytest.raises(InputError, match="not one mconv wrote"):
        mconv.export(DIGITS, "cpu", models)
    with pytest.raises(InputError, match="not one mconv wrote"):
        mconv.export(mconv.load(DIGITS), "weights", models)
    save_file(_weights(), str(tmp_path / "w.safetensors"))
    with pytest.raises(InputError, match="not one mconv wrote"):
        mconv.optimize(tmp_path / "w.safetensors", passes=CLUSTER, output=models)
    _one_error(_cli("demo", "--workdir", str(models)), "not one mconv wrote")
    assert _hashes(models) == before


def test_a_bundle_folder_holding_a_file_of_the_users_is_not_replaced(tmp_path):
    out = tmp_path / "b"
    assert _cli("export", str(DIGITS), "-o", str(out)).exit_code == 0
    (out / "notes.txt").write_text("mine")
    before = _hashes(out)
    _one_error(_cli("export", str(DIGITS), "-o", str(out)), "notes.txt")
    assert _hashes(out) == before


def test_a_file_is_never_replaced_by_a_folder_nor_a_folder_by_a_file(tmp_path):
    (tmp_path / "afile").write_text("keep")
    bundle = tmp_path / "b"
    assert _cli("export", str(DIGITS), "-o", str(bundle)).exit_code == 0
    before = _hashes(bundle)
    _sharded(tmp_path / "ckpt")
    _one_error(_cli("export", str(DIGITS), "-o", str(tmp_path / "afile")), "not a folder")
    _one_error(
        _cli("optimize", str(tmp_path / "ckpt"), "--passes", CLUSTER, "-o", str(tmp_path / "afile")),
        "not a folder",
    )
    _one_error(_cli("import", str(DIGITS), "-o", str(bundle)), "folder")
    _one_error(_cli("export", str(DIGITS), "--format", "onnx", "-o", str(bundle)), "folder")
    assert (tmp_path / "afile").read_text() == "keep" and _hashes(bundle) == before


def test_reruns_replace_what_mconv_wrote(tmp_path):
    """Makefile reruns: a bundle, a streamed bundle, a sharded checkpoint, a demo folder and a
    single file are replaced by the next run; an empty folder is filled."""
    (tmp_path / "empty").mkdir()
    save_file(_weights(1), str(tmp_path / "w.safetensors"))
    _sharded(tmp_path / "ckpt", seed=1)
    runs = [
        ["export", str(DIGITS), "-o", str(tmp_path / "b")],
        ["export", str(DIGITS), "--target", "weights", "-o", str(tmp_path / "empty")],
        ["optimize", str(tmp_path / "w.safetensors"), "--passes", CLUSTER, "-o", str(tmp_path / "wb")],
        ["optimize", str(tmp_path / "ckpt"), "--passes", CLUSTER, "-o", str(tmp_path / "sharded")],
        ["optimize", str(DIGITS), "--passes", "fold", "-o", str(tmp_path / "o.onnx")],
    ]
    for args in runs:
        for _ in range(2):
            r = _cli(*args)
            assert r.exit_code == 0, (args, r.output)
    assert (tmp_path / "empty" / "manifest.json").is_file()
    # a rerun from a checkpoint with other shard names leaves none of the earlier ones
    _sharded(tmp_path / "ckpt2", seed=2, shards=3, prefix="part")
    r = _cli("optimize", str(tmp_path / "ckpt2"), "--passes", CLUSTER, "-o", str(tmp_path / "sharded"))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == sorted(
        [*(f"part-{k:05d}-of-00003.safetensors" for k in (1, 2, 3)), INDEX]
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# --- -o naming an input is refused, in every form ---------------------------------------------


def _forms(tmp_path: Path) -> list[tuple[list[str], Path]]:
    """(command, what must stay unchanged): -o is an input, through a link, or holds one."""
    m = tmp_path / "m.onnx"
    m.write_bytes(DIGITS.read_bytes())
    (tmp_path / "link.onnx").symlink_to(m)
    os.link(m, tmp_path / "hard.onnx")
    save_file(_weights(), str(tmp_path / "w.safetensors"))
    ckpt = _sharded(tmp_path / "ckpt")
    (tmp_path / "ckptlink").symlink_to(ckpt)
    bundle = tmp_path / "b"
    assert _cli("export", str(DIGITS), "-o", str(bundle)).exit_code == 0
    data = tmp_path / "d.npz"
    np.savez(data, input=np.zeros((4, 64), np.float32))
    opt = ["--passes", "fold"]
    return [
        (["optimize", str(m), *opt, "-o", str(m)], m),
        (["import", str(m), "-o", str(m)], m),
        (["optimize", str(tmp_path / "link.onnx"), *opt, "-o", str(m)], m),
        (["optimize", str(m), *opt, "-o", str(tmp_path / "link.onnx")], m),
        (["optimize", str(tmp_path / "hard.onnx"), *opt, "-o", str(m)], m),
        (
            [
                "optimize",
                str(tmp_path / "w.safetensors"),
                "--passes",
                CLUSTER,
                "-o",
                str(tmp_path / "w.safetensors"),
            ],
            tmp_path / "w.safetensors",
        ),
        (["optimize", str(ckpt), "--passes", CLUSTER, "-o", str(ckpt)], ckpt),
        (["optimize", str(ckpt / INDEX), "--passes", CLUSTER, "-o", str(ckpt)], ckpt),
        (["optimize", str(tmp_path / "ckptlink"), "--passes", CLUSTER, "-o", str(ckpt)], ckpt),
        (["export", str(bundle / "model.onnx"), "-o", str(bundle)], bundle),
        (["run", str(m), "--data", str(data), "-o", str(data)], data),
    ]


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path):
    for args, keep in _forms(tmp_path):
        before = _hashes(keep) if keep.is_dir() else hashlib.sha256(keep.read_bytes()).hexdigest()
        _one_error(_cli(*args), "input")
        after = _hashes(keep) if keep.is_dir() else hashlib.sha256(keep.read_bytes()).hexdigest()
        assert after == before, args
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_api_refuses_an_output_that_is_an_input(tmp_path):
    m = tmp_path / "m.onnx"
    m.write_bytes(DIGITS.read_bytes())
    with pytest.raises(InputError, match="the output is the input"):
        mconv.optimize(m, passes="fold", output=m)
    with pytest.raises(InputError, match="the output is the input"):
        mconv.convert(m, m)
    w = tmp_path / "w.safetensors"
    save_file(_weights(), str(w))
    digest = hashlib.sha256(w.read_bytes()).hexdigest()
    with pytest.raises(InputError, match="the output is the input"):
        mconv.optimize(w, passes=CLUSTER, output=w)
    assert hashlib.sha256(w.read_bytes()).hexdigest() == digest
    assert m.read_bytes() == DIGITS.read_bytes()
    onnx.checker.check_model(onnx.load(m))


# --- a sharded checkpoint is swapped in whole: a killed run leaves old or new ------------------

_KILLER = r"""
import os, signal, sys
from mconv import fileio
from mconv.drivers import weights_stream as ws

src, dest, point = sys.argv[1], sys.argv[2], sys.argv[3]
real_shard, real_exchange = ws._stream_shard, fileio.exchange
done = [0]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def shard(*a, **k):
    n = real_shard(*a, **k)
    done[0] += 1
    if point == f"shard{done[0]}":
        die()
    return n

def exchange(a, b):
    if point == "before-swap":
        die()
    ok = real_exchange(a, b)
    if point == "after-swap":
        die()
    return ok

ws._stream_shard, fileio.exchange = shard, exchange
ws.compress_checkpoint(src, dest, ws.Scheme("cluster", 4))
"""


def test_killed_sharded_writes_leave_the_old_or_the_new_folder(tmp_path):
    if not fileio.exchange(tmp_path, tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    from mconv.drivers.weights_stream import Scheme, compress_checkpoint

    srcs = {tag: _sharded(tmp_path / f"src{tag}", seed=seed, shards=3) for tag, seed in (("A", 1), ("B", 2))}
    expected = {}
    for tag, src in srcs.items():
        compress_checkpoint(src, tmp_path / f"ref{tag}", Scheme("cluster", 4))
        expected[tag] = _hashes(tmp_path / f"ref{tag}")
    dest = tmp_path / "out" / "ckpt"
    dest.parent.mkdir()
    compress_checkpoint(srcs["A"], dest, Scheme("cluster", 4))
    points = ["shard1", "shard2", "shard3", "before-swap", "after-swap"]
    rng = np.random.default_rng(41)
    seen: list[str] = []
    current = "A"
    for i in range(10):
        point = points[i % len(points)] if i < len(points) else str(rng.choice(points))
        new = "B" if current == "A" else "A"
        p = subprocess.run(
            [sys.executable, "-c", _KILLER, str(srcs[new]), str(dest), point],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == -9, p.stderr
        got = _hashes(dest)
        assert got in (expected["A"], expected["B"]), (point, sorted(got))
        current = new if point == "after-swap" else current  # killed before the swap: the old one
        assert got == expected[current], point
        seen.append(current)
    compress_checkpoint(srcs["A"], dest, Scheme("cluster", 4))  # the next run clears the debris
    assert _hashes(dest) == expected["A"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["ckpt"]


# --- readers: no FIFO waited on, no link out of the folder the user named ---------------------


def _mconv(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A real process: a reader that opens a FIFO would block here, and the timeout fails it."""
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args, "-q"], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_fifos_are_refused_without_waiting(tmp_path):
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / INDEX)
    for name in ("m.onnx", "d.npz", "r.toml", "w.safetensors"):
        os.mkfifo(tmp_path / name)
    cases = [
        ["optimize", "fifo", "--passes", CLUSTER, "-o", "out"],
        ["optimize", f"fifo/{INDEX}", "--passes", CLUSTER, "-o", "out"],
        ["optimize", "m.onnx", "--passes", "fold", "-o", "o.onnx"],
        ["optimize", str(DIGITS), "--passes", "fold", "--data", "d.npz", "-o", "o.onnx"],
        ["optimize", str(DIGITS), "--recipe", "r.toml", "-o", "o.onnx"],
        ["optimize", "w.safetensors", "--passes", CLUSTER, "-o", "o.safetensors"],
        ["export", "m.onnx", "-o", "b"],
        ["inspect", "m.onnx"],
    ]
    for args in cases:
        p = _mconv(*args, cwd=tmp_path)
        assert p.returncode == 2 and p.stdout == "", (args, p.stderr)
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "FIFO" in lines[0], (args, p.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "d.npz",
        "fifo",
        "m.onnx",
        "r.toml",
        "w.safetensors",
    ]


def test_links_out_of_a_named_folder_are_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _sharded(elsewhere)
    save_file(_weights(), str(elsewhere / "w.safetensors"))
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "w.safetensors").symlink_to(elsewhere / "w.safetensors")
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / INDEX).symlink_to(elsewhere / INDEX)
    for folder, out in (("one", "o.safetensors"), ("idx", "o")):
        r = _cli("optimize", str(tmp_path / folder), "--passes", CLUSTER, "-o", str(tmp_path / out))
        _one_error(r, "link to a file outside the folder", str(tmp_path / folder))
        assert not (tmp_path / out).exists()
    # a link that stays inside the folder is the folder's own file
    (tmp_path / "inside").mkdir()
    save_file(_weights(), str(tmp_path / "inside" / "real.bin"))
    (tmp_path / "inside" / "w.safetensors").symlink_to("real.bin")
    r = _cli(
        "optimize", str(tmp_path / "inside"), "--passes", CLUSTER, "-o", str(tmp_path / "ok.safetensors")
    )
    assert r.exit_code == 0, r.output


# --- an output on a read-only file system -----------------------------------------------------


def _read_only_mount_available() -> bool:
    import shutil

    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None


@pytest.mark.skipif(
    not _read_only_mount_available(), reason="needs root and unshare(1) to mount a read-only tmpfs"
)
@pytest.mark.parametrize("source", ["sharded", "model"])
def test_an_output_on_a_read_only_file_system_is_one_line(tmp_path, source):
    """The command runs in its own mount namespace (the mount is private to it) with the output's
    folder a read-only tmpfs: every writer fails at its first write, and says so in one line."""
    if source == "sharded":
        src, out, passes = _sharded(tmp_path / "ckpt"), "ro/ck", "cluster(bits=4)"
    else:
        src, out, passes = Path(mconv.__file__).parent / "fixtures" / "digits_mlp.onnx", "ro/m.onnx", "fold"
    (tmp_path / "ro").mkdir()
    before = _hashes(tmp_path)
    script = (
        f"mount -t tmpfs -o ro,size=1m tmpfs {tmp_path / 'ro'} || exit 97; "
        f'exec "{sys.executable}" -m mconv optimize "{src}" --passes "{passes}" -o "{tmp_path / out}" -q'
    )
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode == 97:
        pytest.skip(f"this machine refuses a tmpfs mount: {r.stderr.strip()[:120]}")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and "read-only" in lines[0].lower(), lines[0]
    assert _hashes(tmp_path) == before
