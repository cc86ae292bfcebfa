"""Hostile PyTorch files (formats/pytorch/__init__.py, formats/_zipsafe.py, formats/pytorch/pickle_scan.py).

Every file is built here from a real ``torch.jit.save`` / ``torch.save`` output and then damaged:
storages cut short, tensor views past their storage, pickles naming foreign globals or
declaring lengths they do not hold, zip directories that lie about sizes, disks and names, and
files that are not PyTorch at all. Each must be one ``InputError`` (exit 2) naming the file,
raised before torch reads the archive where the damage would cost memory. The last test runs a
seeded set of truncations, bit flips and 6-byte overwrites, each in a forked process with a
4 GB address-space limit and a timeout, and bounds their exit codes and peak memory.
"""

from __future__ import annotations

import json
import pickle
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from mconv.cli.app import app
from mconv.errors import InputError
from mconv.formats import import_model
from typer.testing import CliRunner

OPTIONS = {"input_shapes": {"x": [1, 4]}}
LINEAR_CODE = "m/code/__torch__/torch/nn/modules/linear.py"  # the TorchScript source of nn.Linear
# torch names a class again (``linear/___torch_mangle_5.py``) when the process scripted another
# variant of it first (test_torch.py before this file): the helpers read either name.
_MANGLED = re.compile(r"/___torch_mangle_\d+(?=\.py)")


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _script(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(Tiny().eval()), str(path))
    return path


def _rewrite(src: Path, dst: Path, change: Callable[[str, bytes], bytes | None]) -> Path:
    """A copy of the zip ``src`` whose members go through ``change`` (None drops one)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w") as zo:
        for info in zi.infolist():
            data = change(info.filename, zi.read(info.filename))
            if data is not None:
                zo.writestr(info, data)
    return dst


def _patch_pickle(src: Path, dst: Path, old: bytes, new: bytes, member: str = "m/data.pkl") -> Path:
    def change(name: str, data: bytes) -> bytes:
        if name == member:
            assert old in data, (old, data)
            return data.replace(old, new, 1)
        return data

    return _rewrite(src, dst, change)


def _central_entries(data: bytes) -> dict[str, int]:
    """Member name -> offset of its central directory entry."""
    eocd = data.rfind(b"PK\x05\x06")
    (n, cd) = struct.unpack_from("<H4xL", data, eocd + 10)
    out, pos = {}, cd
    for _ in range(n):
        n_name, n_extra, n_comment = struct.unpack_from("<3H", data, pos + 28)
        out[_MANGLED.sub("", data[pos + 46 : pos + 46 + n_name].decode())] = pos
        pos += 46 + n_name + n_extra + n_comment
    return out


def _expect(path: Path, match: str, monkeypatch: pytest.MonkeyPatch | None = None) -> str:
    """One InputError naming ``path``; with ``monkeypatch``, torch never opened the file."""
    if monkeypatch is not None:

        def refuse(*args, **kwargs):
            raise AssertionError("torch read a file that the checks should have refused")

        monkeypatch.setattr(torch.jit, "load", refuse)
        monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(InputError, match=match) as err:
        import_model([path], options=OPTIONS)
    line = err.value.line()
    assert str(path) in line and "\n" not in line
    return line


def _cli(path: Path, tmp_path: Path):
    return CliRunner().invoke(
        app, ["import", str(path), "-o", str(tmp_path / "out.onnx"), "--input-shape", "x=1,4"]
    )


def test_the_unmutated_archive_imports(tmp_path: Path) -> None:
    model = import_model([_script(tmp_path)], options=OPTIONS)
    assert {n.op_type for n in model.graph} >= {"Gemm", "Relu"}


# --- item 3: storages shorter than their tensors ----------------------------------------------


def test_storage_cut_to_four_bytes_is_refused_before_torch_reads_it(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    bad = _rewrite(src, tmp_path / "cut.pt", lambda n, d: d[:4] if n == "m/data/0" else d)
    line = _expect(bad, r"storage '0' declares 12 x 4 = 48 bytes .* holds 4", monkeypatch)
    assert "m/data.pkl" in line  # where: the pickle that declares it


def test_storage_cut_short_is_exit_2_at_the_cli(tmp_path) -> None:
    src = _script(tmp_path)
    bad = _rewrite(src, tmp_path / "cut.pt", lambda n, d: d[:-1] if n == "m/data/1" else d)
    result = _cli(bad, tmp_path)
    assert result.exit_code == 2, result.output
    assert "storage '1'" in result.output and "cut.pt" in result.output
    assert not (tmp_path / "out.onnx").exists()


def test_missing_storage_member_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    bad = _rewrite(src, tmp_path / "gone.pt", lambda n, d: None if n == "m/data/1" else d)
    _expect(bad, r"storage '1' has no member 'm/data/1'", monkeypatch)


def test_huge_declared_numel_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    # storage 0's numel (BININT1 12) becomes BININT 2**31 - 1
    bad = _patch_pickle(src, tmp_path / "big.pt", b"cpuq\nK\x0ct", b"cpuq\nJ\xff\xff\xff\x7ft")
    _expect(bad, r"declares 2147483647 x 4 = 8589934588 bytes", monkeypatch)


def test_tensor_view_past_its_storage_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    # weight size (3, 4) -> (3, 9) over a 12-element storage with stride (4, 1)
    bad = _patch_pickle(src, tmp_path / "view.pt", b"(K\x03K\x04t", b"(K\x03K\tt")
    _expect(
        bad,
        r"tensor of size \[3, 9\], stride \[4, 1\] at offset 0 needs 68 bytes of storage '0'",
        monkeypatch,
    )


def test_tensor_offset_past_its_storage_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    # the bias's storage offset (BININT1 0 after its persistent id) becomes 200
    bad = _patch_pickle(src, tmp_path / "off.pt", b"K\x03tQq\x10K\x00(K\x03t", b"K\x03tQq\x10K\xc8(K\x03t")
    _expect(bad, r"at offset 200 needs 812 bytes of storage '1', which holds 12", monkeypatch)


def test_negative_stride_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    bad = _patch_pickle(src, tmp_path / "neg.pt", b"(K\x04K\x01t", b"(K\x04J\xff\xff\xff\xfft")
    _expect(bad, r"stride \(4, -1\) has a negative entry", monkeypatch)


# --- pickles: globals, lengths, memo -----------------------------------------------------------


def test_global_outside_the_allowlist_is_refused_without_running_it(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    bad = _patch_pickle(src, tmp_path / "g.pt", b"ccollections\nOrderedDict\n", b"cbuiltins\neval\n")
    _expect(bad, r"global 'builtins\.eval' is not one TorchScript writes", monkeypatch)


def test_torch_class_without_source_in_code_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    with zipfile.ZipFile(src) as z:
        found = re.search(
            rb"c__torch__\.torch\.nn\.modules\.linear(\.___torch_mangle_\d+)?\nLinear\n", z.read("m/data.pkl")
        )
    assert found is not None
    bad = _patch_pickle(src, tmp_path / "c.pt", found.group(0), b"c__torch__.elsewhere\nLinear\n")
    _expect(bad, r"class '__torch__\.elsewhere\.Linear' has no TorchScript source in code/", monkeypatch)


def test_string_length_past_the_pickle_is_refused_before_torch_allocates_it(tmp_path, monkeypatch) -> None:
    # Before: torch's unpickler allocated the declared 4 GB, then found the pickle too short.
    src = _script(tmp_path)
    bad = _patch_pickle(src, tmp_path / "len.pt", b"X\x08\x00\x00\x00training", b"X\xff\xff\xff\xfftraining")
    _expect(bad, r"pickle 'm/data\.pkl'.*pickle is damaged", monkeypatch)


def test_memo_index_far_ahead_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    bad = _patch_pickle(src, tmp_path / "memo.pt", b"\nTiny\nq\x00", b"\nTiny\nr\xff\xff\xff\x7f")
    _expect(bad, r"memo index 2147483647 skips ahead", monkeypatch)


def test_damaged_debug_table_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    bad = _rewrite(src, tmp_path / "dbg.pt", lambda n, d: d[: len(d) // 2] if n.endswith(".debug_pkl") else d)
    _expect(bad, r"debug_pkl'.*pickle is damaged", monkeypatch)


def test_inst_opcode_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    bad = _rewrite(
        src, tmp_path / "inst.pt", lambda n, d: b"\x80\x02(ios\nsystem\n." if n == "m/constants.pkl" else d
    )
    _expect(bad, r"opcode INST, which PyTorch never writes", monkeypatch)


# --- item 6 and 8: the zip directory -----------------------------------------------------------


def _cd_patch(src: Path, dst: Path, member: str, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, _central_entries(bytes(data))[member] + offset, value)
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize(
    "member,offset,fmt,value,match",
    [
        (LINEAR_CODE, 24, "<L", 0x7FFFFFFF, r"claims 2147483647 bytes from \d+"),  # usize
        ("m/data/0", 20, "<L", 0x7FFFFFFF, r"stored member with sizes 2147483647 and 48"),  # csize
        ("m/data/0", 20, "<Q", 0x7FFFFFFF0000FFFF, r"sizes .* differ|runs past"),  # both sizes
        ("m/data.pkl", 42, "<L", 0x7FFFFFF0, r"local header offset 2147483632 lies outside"),
        ("m/data.pkl", 42, "<L", 1, r"no local header at byte 1"),
        ("m/data/1", 42, "<L", 0, r"local header at byte 0 names a different member"),
        ("m/data.pkl", 10, "<H", 12, r"compression method 12"),
        ("m/data.pkl", 8, "<H", 0x809, r"encrypted"),
        ("m/data.pkl", 34, "<H", 2, r"starts on disk 2"),
    ],
)
def test_central_directory_lies_are_refused_before_torch_reads(
    tmp_path, monkeypatch, member, offset, fmt, value, match
) -> None:
    bad = _cd_patch(_script(tmp_path), tmp_path / "cd.pt", member, offset, fmt, value)
    line = _expect(bad, match, monkeypatch)
    assert "zip member" in line or "zip entry" in line


def test_overlapping_members_are_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    data = bytearray(src.read_bytes())
    entries = _central_entries(bytes(data))
    # data/1's directory entry points at data/0's local header and claims its name
    first = entries["m/data/0"]
    pos = entries["m/data/1"]
    data[pos + 42 : pos + 46] = data[first + 42 : first + 46]
    data[pos + 46 : pos + 54] = b"m/data/0"
    (tmp_path / "ov.pt").write_bytes(bytes(data))
    _expect(tmp_path / "ov.pt", r"appears twice|overlap", monkeypatch)


def test_member_name_that_is_not_utf8_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    data = bytearray(src.read_bytes())
    pos = _central_entries(bytes(data))["m/version"]
    data[pos + 46 + 2 : pos + 46 + 4] = b"\xff\xfe"
    (tmp_path / "name.pt").write_bytes(bytes(data))
    line = _expect(tmp_path / "name.pt", r"is not valid UTF-8", monkeypatch)
    assert "\\xff" in line


@pytest.mark.parametrize("disk,cd_disk", [(1, 0), (1, 1), (0, 3)])
def test_archive_claiming_to_span_disks_is_exit_2(tmp_path, disk, cd_disk) -> None:
    data = bytearray(_script(tmp_path).read_bytes())
    eocd = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, eocd + 4, disk, cd_disk)
    bad = tmp_path / "disks.pt"
    bad.write_bytes(bytes(data))
    result = _cli(bad, tmp_path)
    assert result.exit_code == 2, result.output
    assert "span disks" in result.output and "disks.pt" in result.output
    assert "Traceback" not in result.output


def _as_zip64(data: bytes, n_disks: int = 1) -> bytes:
    """The same archive with a ZIP64 end record (as torch writes past 4 GB) and a plain record of 0xFF.."""
    eocd = data.rfind(b"PK\x05\x06")
    _, _, n_disk, n_total, cd_size, cd_offset = struct.unpack_from("<4H2L", data, eocd + 4)
    record = b"PK\x06\x06" + struct.pack("<QHHLLQQQQ", 44, 45, 45, 0, 0, n_disk, n_total, cd_size, cd_offset)
    locator = b"PK\x06\x07" + struct.pack("<LQL", 0, eocd, n_disks)
    end = b"PK\x05\x06" + struct.pack("<4H2LH", *[0xFFFF] * 4, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return data[:eocd] + record + locator + end


def test_zip64_archive_imports_and_a_zip64_split_is_refused(tmp_path) -> None:
    data = _script(tmp_path).read_bytes()
    (tmp_path / "z64.pt").write_bytes(_as_zip64(data))
    assert {n.op_type for n in import_model([tmp_path / "z64.pt"], options=OPTIONS).graph} >= {"Gemm"}
    (tmp_path / "split.pt").write_bytes(_as_zip64(data, n_disks=2))
    _expect(tmp_path / "split.pt", r"archive spans 2 disks \(ZIP64 locator\)")


def test_entry_counts_that_disagree_are_refused(tmp_path, monkeypatch) -> None:
    data = bytearray(_script(tmp_path).read_bytes())
    eocd = data.rfind(b"PK\x05\x06")
    struct.pack_into("<H", data, eocd + 8, 3)
    (tmp_path / "n.pt").write_bytes(bytes(data))
    _expect(tmp_path / "n.pt", r"entry counts disagree \(3 on this disk, 11 in all\)", monkeypatch)


def test_central_directory_past_the_end_is_refused(tmp_path, monkeypatch) -> None:
    data = bytearray(_script(tmp_path).read_bytes())
    eocd = data.rfind(b"PK\x05\x06")
    struct.pack_into("<L", data, eocd + 12, 10**9)
    (tmp_path / "cd.pt").write_bytes(bytes(data))
    _expect(tmp_path / "cd.pt", r"central directory \(1000000000 bytes", monkeypatch)


def test_deflated_member_with_wrong_crc_is_refused(tmp_path, monkeypatch) -> None:
    src = _script(tmp_path)
    data = bytearray(src.read_bytes())
    pos = _central_entries(bytes(data))[LINEAR_CODE + ".debug_pkl"]
    data[pos + 16] ^= 0x01
    (tmp_path / "crc.pt").write_bytes(bytes(data))
    _expect(tmp_path / "crc.pt", r"fails its CRC-32 check", monkeypatch)


# --- item 10: what the file is ----------------------------------------------------------------


def test_random_bytes_are_not_called_pickled_objects(tmp_path, monkeypatch) -> None:
    path = tmp_path / "noise.pt"
    path.write_bytes(np.random.default_rng(10).integers(0, 256, 1000, dtype=np.uint8).tobytes())
    line = _expect(path, r"not a PyTorch file", monkeypatch)
    assert "pickled" not in line and "first bytes" in line


def test_zip_without_data_pkl_is_not_a_pytorch_file(tmp_path, monkeypatch) -> None:
    np.savez(tmp_path / "w.npz", a=np.random.default_rng(11).standard_normal(3))
    path = tmp_path / "w.pt"
    path.write_bytes((tmp_path / "w.npz").read_bytes())
    _expect(
        path, r"zip archive without data\.pkl \(members such as 'a\.npy'\): not a PyTorch file", monkeypatch
    )


def test_member_names_from_the_file_are_escaped(tmp_path) -> None:
    path = tmp_path / "esc.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("evil\x1b[31m\nname/x", b"junk")
    line = _expect(path, r"not a PyTorch file")
    assert "\x1b" not in line and "\\x1b" in line


def test_state_dict_archive_says_state_dict(tmp_path) -> None:
    torch.manual_seed(1)
    path = tmp_path / "sd.pt"
    torch.save(Tiny().state_dict(), path)
    _expect(path, r"a torch\.save archive that holds weights but no architecture")


def test_pickled_module_names_the_class(tmp_path) -> None:
    torch.manual_seed(2)
    path = tmp_path / "whole.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), path)
    _expect(path, r"holds pickled Python objects .*'torch\.nn\.modules\.container\.Sequential'")


def test_legacy_torch_save_is_recognised(tmp_path) -> None:
    torch.manual_seed(3)
    path = tmp_path / "legacy.pt"
    torch.save(Tiny().state_dict(), path, _use_new_zipfile_serialization=False)
    _expect(path, r"a legacy torch\.save file that holds weights but no architecture")


def test_truncated_legacy_file_is_refused_before_torch_allocates(tmp_path, monkeypatch) -> None:
    torch.manual_seed(4)
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(1000)}, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:-100])
    _expect(path, r"1 storage\(s\) declare 4008 bytes but 3908 follow the pickles", monkeypatch)


def test_plain_pickle_is_not_a_pytorch_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    _expect(path, r"a pickle without torch\.save's magic number: not a PyTorch file", monkeypatch)


def test_state_dict_with_a_short_storage_is_refused_before_torch_load(tmp_path, monkeypatch) -> None:
    torch.manual_seed(5)
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.zeros(10)}, path)
    bad = _rewrite(path, tmp_path / "sdcut.pt", lambda n, d: d[:8] if n.endswith("/data/0") else d)
    _expect(bad, r"storage '0' declares 10 x 4 = 40 bytes .* holds 8", monkeypatch)


# --- mutation: every damaged file is exit 0 or 2, bounded in time and memory -----------------

_FORK_SERVER = textwrap.dedent(
    """
    import json, os, resource, sys, time, warnings
    warnings.simplefilter("ignore")
    import torch, torch.onnx.utils, onnx  # imported once; each mutant runs in a fork
    from typer.testing import CliRunner
    from mconv.cli.app import app

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = []
    for path in sys.argv[1:]:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
            r = CliRunner().invoke(app, ["import", path, "-o", path + ".onnx", "--input-shape", "x=1,4", "-q"])
            os._exit(r.exit_code if r.exit_code in (0, 2) else 3)
        timed_out = False
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - start > 30:
                os.kill(pid, 9)
                timed_out = True
                done, status, usage = os.wait4(pid, 0)
                break
            time.sleep(0.01)
        results.append({"path": path, "rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out,
                        "rss_kb": usage.ru_maxrss})
    print(json.dumps({"base_kb": base, "results": results}))
    """
)


def _mutants(data: bytes, tmp_path: Path, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    # fixed regions: local headers and data.pkl (first ~700 bytes), the central directory (last ~850)
    cd = data.find(b"PK\x01\x02")
    offsets = sorted({*rng.integers(0, 700, 12).tolist(), *rng.integers(cd, len(data) - 6, 12).tolist()})
    paths = []
    for i, off in enumerate(offsets):
        b = bytearray(data)
        kind = ("ff6", "flip", "cut")[i % 3]
        if kind == "ff6":
            b[off : off + 6] = b"\xff" * 6
        elif kind == "flip":
            b[off] ^= 1 << int(rng.integers(0, 8))
        else:
            del b[off:]
        path = tmp_path / f"mut{i:02d}_{kind}_{off}.pt"
        path.write_bytes(bytes(b))
        paths.append(path)
    return paths


def test_mutants_exit_0_or_2_within_time_and_memory(tmp_path) -> None:
    src = _script(tmp_path)
    paths = _mutants(src.read_bytes(), tmp_path, seed=6)
    assert len(paths) >= 18
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_SERVER, *map(str, paths)],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = [r for r in report["results"] if r["timed_out"] or r["rc"] not in (0, 2)]
    assert not bad, bad
    assert any(r["rc"] == 2 for r in report["results"])
    # A refused file costs little beyond the imports the fork inherited (before: up to 4 GB).
    worst = max(r["rss_kb"] for r in report["results"] if r["rc"] == 2)
    assert worst < report["base_kb"] + (512 << 10), (worst, report["base_kb"])


def test_every_cut_through_the_end_record_is_refused_as_input(tmp_path: Path) -> None:
    """Found by bench/fuzz.py: a cut that leaves the end record's signature but not its 22 bytes
    made the directory reader index past the buffer (struct.error, exit 3)."""
    from mconv.errors import InputError
    from mconv.formats._zipsafe import read_directory

    data = _script(tmp_path).read_bytes()
    cut_file = tmp_path / "cut.pt"
    for cut in range(len(data) - 60, len(data)):
        cut_file.write_bytes(data[:cut])
        with pytest.raises(InputError, match="cut.pt"):
            read_directory(cut_file)
