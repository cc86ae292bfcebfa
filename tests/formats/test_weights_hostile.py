"""Hostile weight files: safetensors (formats/weights.py) and .npz (formats/npz_format.py).

Every file is built inside its test. Each bad file must give one InputError (exit 2 at the CLI)
that names the file; memory bombs run in a subprocess under a 4 GB address-space limit, so a
reader that inflated or allocated first would fail there with MemoryError instead. Mutation
tests (seeded truncations, bit flips and 5-byte overwrites at fixed offsets) accept only success
or one InputError. TF checkpoints have theirs in test_tf_checkpoint.py.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from mconv.errors import InputError
from mconv.formats import import_model
from mconv.formats.weights import model_arrays


def _one_line(err: pytest.ExceptionInfo, path: Path) -> str:
    text = str(err.value)
    assert "\n" not in text and str(path) in text, text
    return text


def _assert_cli_refuses(path: Path, *needles: str) -> None:
    from mconv.cli.app import app
    from typer.testing import CliRunner

    for args in (
        ["import", str(path), "-o", str(path.parent / "w.onnx")],
        ["optimize", str(path), "--passes", "cluster(bits=4)", "-o", str(path.parent / "out")],
    ):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.exit_code, r.output)
        lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in r.output, r.output
        assert path.name in lines[0], lines[0]
        for n in needles:
            assert n in lines[0], lines[0]
        assert not (path.parent / "w.onnx").exists() and not (path.parent / "out").exists()


# --- safetensors ---------------------------------------------------------------------------------


def _st(path: Path, header: dict | bytes, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _t(dtype: str = "F32", shape=(2,), offsets=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


ST_CASES = {
    # name: (header, data, message pattern)
    "deep_nesting": (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", r"nests 100001 levels deep"),
    "deep_nesting_in_objects": (b'{"a":' + b'{"b":' * 5000 + b"1" + b"}" * 5001, b"", r"nests 5001 levels"),
    "container_bomb": (b'{"a":[' + b"{}," * 20_000 + b"{}]}", b"", r"holds 20003 JSON arrays/objects"),
    "bool_dim": ({"a": _t(shape=[True, 2])}, b"\0" * 8, r"tensor 'a' has an invalid shape \[True, 2\]"),
    "negative_dim": ({"a": _t(shape=[-1, -2])}, b"\0" * 8, r"tensor 'a' has an invalid shape \[-1, -2\]"),
    "float_dim": ({"a": _t(shape=[2.0])}, b"\0" * 8, r"tensor 'a' has an invalid shape"),
    "shape_not_a_list": ({"a": _t(shape="2")}, b"\0" * 8, r"tensor 'a' has an invalid shape"),
    "huge_dim_of_empty": ({"a": _t(shape=[2**64, 0], offsets=(0, 0))}, b"", r"too large for any array"),
    "too_many_dims": ({"a": _t(shape=[1] * 65, offsets=(0, 4))}, b"\0" * 4, r"65 dimensions, more than 64"),
    "unknown_dtype": ({"a": _t(dtype="Q99")}, b"\0" * 8, r"unsupported dtype 'Q99'"),
    "dtype_not_a_string": ({"a": _t(dtype=["F32"])}, b"\0" * 8, r"unsupported dtype .* \(not a string\)"),
    "entry_not_an_object": ({"a": [1, 2]}, b"", r"tensor 'a' entry lacks dtype/shape/data_offsets"),
    "not_utf8": (b'{"\xff": 1}', b"", r"header is not UTF-8"),
    "not_an_object": (b"[1, 2]", b"", r"header is not a JSON object"),
    "string_header": (b'"abc"', b"", r"header is not a JSON object"),
    "bad_json": (b"{nope", b"", r"header is not valid JSON"),
    "nan": (b'{"a": NaN}', b"", r"NaN is not JSON"),
    "duplicate_key": (
        b'{"a": ' + json.dumps(_t()).encode() + b', "a": ' + json.dumps(_t()).encode() + b"}",
        b"\0" * 8,
        r"key 'a' appears twice",
    ),
    "lone_surrogate_name": (
        b'{"\\ud800": ' + json.dumps(_t()).encode() + b"}",
        b"\0" * 8,
        r"not valid Unicode",
    ),
    "metadata_not_a_map": ({"__metadata__": "x", "a": _t()}, b"\0" * 8, r"__metadata__ is a JSON str"),
    "metadata_value_not_a_string": (
        {"__metadata__": {"k": [1]}, "a": _t()},
        b"\0" * 8,
        r"__metadata__ value of 'k' is a JSON list",
    ),
    "offsets_float": (
        {"a": _t(offsets=[0.0, 8])},
        b"\0" * 8,
        r"data_offsets \[0.0, 8\] are not two integers",
    ),
    "offsets_three": ({"a": _t(offsets=[0, 8, 9])}, b"\0" * 8, r"are not two integers"),
    "offsets_bool": ({"a": _t(offsets=[False, 8])}, b"\0" * 8, r"are not two integers"),
    "offsets_negative": ({"a": _t(offsets=[-8, 0])}, b"\0" * 8, r"negative or run backwards"),
    "offsets_backwards": ({"a": _t(offsets=[8, 0])}, b"\0" * 8, r"\[8, 0\] are negative or run backwards"),
    "past_the_end": (
        {"a": _t(offsets=[0, 8])},
        b"\0" * 4,
        r"data \[0, 8\) lies outside the 4-byte data area",
    ),
    "extent_mismatch": (
        {"a": _t(shape=[3], offsets=[0, 8])},
        b"\0" * 8,
        r"tensor 'a' holds 8 bytes but shape \[3\] of F32 needs 12",
    ),
    "overlap": (
        {"a": _t(offsets=[0, 8]), "b": _t(offsets=[4, 12])},
        b"\0" * 12,
        r"tensor 'b' data \[4, 12\) overlaps tensor 'a' \(which ends at 8\)",
    ),
    "same_offsets": (
        {"a": _t(offsets=[0, 8]), "b": _t(offsets=[0, 8])},
        b"\0" * 8,
        r"data \[0, 8\) overlaps tensor '(a|b)'",
    ),
    "hole": (
        {"a": _t(offsets=[0, 8]), "b": _t(offsets=[12, 20])},
        b"\0" * 20,
        r"data area bytes \[8, 12\) belong to no tensor \(before tensor 'b'\)",
    ),
    "hole_at_start": ({"a": _t(offsets=[4, 12])}, b"\0" * 12, r"bytes \[0, 4\) belong to no tensor"),
    "trailing_bytes": ({"a": _t()}, b"\0" * 16, r"data area bytes \[8, 16\) after the last tensor"),
    "empty_inside_another": (
        {"a": _t(offsets=[0, 8]), "b": _t(shape=[0], offsets=[4, 4])},
        b"\0" * 8,
        r"overlaps tensor 'a'",
    ),
    "control_chars_in_name": ({"x\x1b[2J\ny": _t(dtype="Q")}, b"\0" * 8, r"tensor 'x\\x1b\[2J\\x0ay'"),
}


@pytest.mark.parametrize("case", sorted(ST_CASES))
def test_hostile_safetensors_header_is_one_input_error(tmp_path: Path, case: str) -> None:
    header, data, pattern = ST_CASES[case]
    path = _st(tmp_path / f"{case}.safetensors", header, data)
    with pytest.raises(InputError, match=pattern) as err:
        import_model([path])
    text = _one_line(err, path)
    assert "(hint: " in text


def test_safetensors_header_length_checks_come_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "long.safetensors"
    path.write_bytes(struct.pack("<Q", 2**64 - 1) + b"{}")
    with pytest.raises(InputError, match=r"header length 18446744073709551615 runs past the end") as err:
        import_model([path])
    assert "byte offset 0" in _one_line(err, path)
    # Over the reference reader's 100 MB cap: a sparse file, so nothing of it is ever written.
    big = tmp_path / "big.safetensors"
    with open(big, "wb") as f:
        f.write(struct.pack("<Q", 100_000_001) + b"{")
        f.truncate(100_000_100)
    with pytest.raises(
        InputError, match=r"header length 100000001 exceeds the 100,000,000-byte limit"
    ) as err:
        import_model([big])
    _one_line(err, big)


def test_hostile_safetensors_fail_the_same_way_at_the_cli(tmp_path: Path) -> None:
    for case in ("deep_nesting", "bool_dim", "overlap", "unknown_dtype", "metadata_not_a_map"):
        header, data, _ = ST_CASES[case]
        d = tmp_path / case
        d.mkdir()
        _assert_cli_refuses(_st(d / "w.safetensors", header, data))


def test_safetensors_edge_cases_the_spec_allows_still_import(tmp_path: Path) -> None:
    from safetensors.numpy import save

    rng = np.random.default_rng(3)
    src = {
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "w": rng.standard_normal((4, 5)).astype(np.float32),
        "b": rng.integers(-5, 5, 7).astype(np.int8),
    }
    raw = save(src, metadata={"k": "v"})  # the official writer pads its header with spaces
    (tmp_path / "ok.safetensors").write_bytes(raw)
    got = model_arrays(import_model([tmp_path / "ok.safetensors"]))
    for name, array in src.items():
        assert got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
    # __metadata__ null, unknown extra keys in an entry, a zero-size tensor at the very end
    header = {"__metadata__": None, "a": {**_t(), "extra": 1}, "z": _t(shape=[0], offsets=[8, 8])}
    got = model_arrays(import_model([_st(tmp_path / "e.safetensors", header, b"\0" * 8)]))
    assert got["a"].shape == (2,) and got["z"].shape == (0,)


def test_mutated_safetensors_import_or_raise_one_input_error(tmp_path: Path) -> None:
    from safetensors.numpy import save

    rng = np.random.default_rng(11)
    base = save(
        {
            "a": rng.standard_normal((3, 4)).astype(np.float32),
            "b": np.ones(5, np.float16),
            "c": np.arange(6, dtype=np.int64),
        },
        metadata={"framework": "test"},
    )
    header_end = 8 + struct.unpack("<Q", base[:8])[0]
    outcomes = _mutate_and_import(tmp_path, base, ".safetensors", rng, fixed=range(0, header_end + 16, 4))
    assert outcomes["InputError"] > 0  # the mutations do reach the checks


# --- npz: builders -------------------------------------------------------------------------------


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _zip(path: Path, members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names some tests want
        with zipfile.ZipFile(path, "w", method) as zf:
            for name, data in members:
                zf.writestr(name, data)
    return path


def _zeros_deflate(head: bytes, mib: int) -> bytes:
    """A raw deflate stream of ``head`` then ``mib`` MiB of zeros, built in milliseconds: after a
    full flush the compressor's output for the next MiB of zeros is the same block every time."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    return first + block * mib + c.flush()


def _raw_zip(path: Path, name: str, stream: bytes, *, crc: int, size: int, method: int = 8) -> Path:
    """One-member zip written field by field, so its directory can claim any ``size``/``crc``."""
    fname = name.encode()
    local = struct.pack(
        "<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, method, 0, 0x21, crc, len(stream), size, len(fname), 0
    )
    central = struct.pack(
        "<4s4B4HL2L5H2L",
        b"PK\x01\x02",
        20,
        0,
        20,
        0,
        0,
        method,
        0,
        0x21,
        crc,
        len(stream),
        size,
        len(fname),
        0,
        0,
        0,
        0,
        0,
        0,
    )
    cd_offset = len(local) + len(fname) + len(stream)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central) + len(fname), cd_offset, 0)
    path.write_bytes(local + fname + stream + central + fname + end)
    return path


def _patch(path: Path, offset: int, data: bytes) -> Path:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))
    return path


def _cd_entry(path: Path, index: int = 0) -> int:
    raw = path.read_bytes()
    at = raw.index(b"PK\x01\x02")
    for _ in range(index):
        at = raw.index(b"PK\x01\x02", at + 1)
    return at


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.integers(0, 9, 5).astype(np.int64),
        "m": rng.integers(0, 2, 6).astype(bool),
    }


# --- npz: the directory ----------------------------------------------------------------------------


def test_npz_deflate_bomb_is_refused_from_the_directory(tmp_path: Path) -> None:
    mib = 64
    head = _npy_header(((mib << 20) // 4,))
    stream = _zeros_deflate(head, mib)
    path = _raw_zip(tmp_path / "bomb.npz", "w.npy", stream, crc=0, size=len(head) + (mib << 20))
    with pytest.raises(
        InputError, match=r"member 'w.npy'.*inflate \d+ bytes to \d+ \(more than 1000x\)"
    ) as err:
        import_model([path])
    _one_line(err, path)
    _assert_cli_refuses(path, "decompression bomb")


def _zip_with_flag(tmp_path: Path, name: str, flag: int) -> Path:
    path = _zip(tmp_path / name, [("w.npy", _npy(np.ones(3, np.float32)))])
    raw = path.read_bytes()
    _patch(path, 6, struct.pack("<H", flag))  # local header flags
    return _patch(path, raw.index(b"PK\x01\x02") + 8, struct.pack("<H", flag))  # directory flags


NPZ_CASES = {
    "encrypted": (lambda d: _zip_with_flag(d, "enc.npz", 0x1), r"member 'w.npy'.*member is encrypted"),
    "strong_encryption": (lambda d: _zip_with_flag(d, "senc.npz", 0x41), r"member is encrypted"),
    "dotdot_name": (lambda d: _zip(d / "dd.npz", [("../evil.npy", _npy(np.ones(2)))]), r"climbs out"),
    "dotdot_inside": (lambda d: _zip(d / "di.npz", [("a/../../b.npy", _npy(np.ones(2)))]), r"climbs out"),
    "absolute_name": (lambda d: _zip(d / "abs.npz", [("/etc/w.npy", _npy(np.ones(2)))]), r"is absolute"),
    "backslash_absolute": (lambda d: _zip(d / "bs.npz", [("\\w.npy", _npy(np.ones(2)))]), r"is absolute"),
    "drive_name": (lambda d: _zip(d / "drv.npz", [("C:w.npy", _npy(np.ones(2)))]), r"is absolute"),
    "duplicate": (
        lambda d: _zip(d / "dup.npz", [("w.npy", _npy(np.ones(2))), ("w.npy", _npy(np.zeros(3)))]),
        r"member 'w.npy'.*appears twice",
    ),
    "bzip2_member": (
        lambda d: _zip(d / "bz.npz", [("w.npy", _npy(np.ones(2)))], zipfile.ZIP_BZIP2),
        r"compression method 12",
    ),
    "lzma_member": (
        lambda d: _zip(d / "lz.npz", [("w.npy", _npy(np.ones(2)))], zipfile.ZIP_LZMA),
        r"compression method 14",
    ),
    "multi_disk_end_record": (
        lambda d: _patch(
            p := _zip(d / "md.npz", [("w.npy", _npy(np.ones(2)))]),
            p.read_bytes().rindex(b"PK\x05\x06") + 4,
            b"\x02\x00",
        ),
        r"span several disks",
    ),
    "entries_on_other_disks": (
        lambda d: _patch(
            p := _zip(d / "md2.npz", [("w.npy", _npy(np.ones(2)))]),
            p.read_bytes().rindex(b"PK\x05\x06") + 8,
            b"\x00\x00",
        ),
        r"span several disks",
    ),
    "member_on_disk_3": (
        lambda d: _patch(
            p := _zip(d / "vol.npz", [("w.npy", _npy(np.ones(2)))]), _cd_entry(p) + 34, b"\x03\x00"
        ),
        r"start on disk 3",
    ),
    "stored_sizes_disagree": (
        lambda d: _patch(
            p := _zip(d / "ss.npz", [("w.npy", _npy(np.ones(2)))]), _cd_entry(p) + 24, b"\xff\xff\x00\x00"
        ),
        r"stored member claims \d+ bytes stored but 65535",
    ),
    "data_past_the_directory": (
        lambda d: _patch(
            p := _zip(d / "past.npz", [("w.npy", _npy(np.ones(2)))]),
            _cd_entry(p) + 20,
            b"\x00\x10\x00\x00" * 2,
        ),
        r"runs past the central directory",
    ),
    "overlapping_members": (lambda d: _overlapping(d / "ov.npz"), r"overlaps the data of member"),
    "not_npy": (lambda d: _zip(d / "txt.npz", [("readme.txt", b"hello")]), r"member is not a .npy array"),
}


def _overlapping(path: Path) -> Path:
    """Two directory entries that point at the same local file (the overlapping-files bomb)."""
    _zip(path, [("a.npy", _npy(np.ones(2))), ("b.npy", _npy(np.ones(2)))])
    second = _cd_entry(path, 1)
    return _patch(path, second + 42, struct.pack("<L", 0))  # b's local header offset := a's


@pytest.mark.parametrize("case", sorted(NPZ_CASES))
def test_hostile_npz_directory_is_one_input_error(tmp_path: Path, case: str) -> None:
    build, pattern = NPZ_CASES[case]
    path = build(tmp_path)
    with pytest.raises(InputError, match=pattern) as err:
        import_model([path], format="npz")
    _one_line(err, path)


def test_hostile_npz_fail_the_same_way_at_the_cli(tmp_path: Path) -> None:
    for case in ("encrypted", "dotdot_name", "duplicate", "multi_disk_end_record", "bzip2_member"):
        d = tmp_path / case
        d.mkdir()
        path = NPZ_CASES[case][0](d)
        _assert_cli_refuses(path.rename(d / "w.npz"))


# --- npz: members ----------------------------------------------------------------------------------


def _member(path: Path, data: bytes, method: int = zipfile.ZIP_STORED) -> Path:
    return _zip(path, [("w.npy", data)], method)


def test_npz_members_of_objects_structs_strings_or_long_floats_are_refused(tmp_path: Path) -> None:
    cases = {
        "obj": (_npy_header((1,), "|O") + b"\0" * 8, r"pickled array"),
        "struct": (_npy(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")])), r"not a numeric array"),
        "unicode": (_npy(np.array(["ab", "c"])), r"holds dtype <U2, not a numeric array"),
        "longdouble": (_npy_header((2,), "<f16") + b"\0" * 32, r"not a numeric array"),
        "datetime": (_npy(np.array(["2020-01-01"], dtype="M8[D]")), r"not a numeric array"),
    }
    for name, (data, pattern) in cases.items():
        path = _member(tmp_path / f"{name}.npz", data)
        with pytest.raises(InputError, match=pattern) as err:
            import_model([path])
        _one_line(err, path)


def test_npz_member_headers_that_lie_are_refused_before_allocating(tmp_path: Path) -> None:
    cases = {
        "absurd": (_npy_header((1 << 40, 1 << 20)) + b"\0" * 64, r"header claims shape"),
        "huge_of_empty": (_npy_header((0, 1 << 62)), r"too large for any array"),
        "negative": (_npy_header((-4,)) + b"\0" * 16, r"invalid shape"),
        "version_9": (
            b"\x93NUMPY\x09\x00" + _npy_header((1,))[8:] + b"\0" * 4,
            r"unknown .npy format version 9",
        ),
        "bad_magic": (b"\x93NUMPX" + _npy(np.ones(2))[6:], r"not a valid .npy member"),
        "deep_header": (
            b"\x93NUMPY\x01\x00" + struct.pack("<H", 4000) + b"(" * 1999 + b")" * 2000 + b"\n",
            r"not a valid .npy member",
        ),
    }
    for name, (data, pattern) in cases.items():
        path = _member(tmp_path / f"{name}.npz", data, zipfile.ZIP_DEFLATED)
        with pytest.raises(InputError, match=pattern) as err:
            import_model([path])
        _one_line(err, path)


def test_npz_deflate_stream_shorter_than_the_directory_claims_is_refused(tmp_path: Path) -> None:
    head = _npy_header(((2 << 20) // 4,))
    data = np.random.default_rng(9).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = c.compress(head + data) + c.flush()  # 1 MiB of data; directory and header claim 2 MiB
    path = _raw_zip(tmp_path / "short.npz", "w.npy", stream, crc=0, size=len(head) + (2 << 20))
    with pytest.raises(InputError, match=r"member 'w.npy'.*(ends after \d+ of its \d+ bytes|damaged)") as err:
        import_model([path])
    _one_line(err, path)


def test_npz_crc_mismatch_is_refused(tmp_path: Path) -> None:
    path = _member(tmp_path / "crc.npz", _npy(np.arange(8, dtype=np.float32)))
    _patch(path, _cd_entry(path) + 16, b"\0\0\0\0")
    with pytest.raises(InputError, match=r"member 'w.npy'.*Bad CRC-32") as err:
        import_model([path])
    _one_line(err, path)


def test_npz_big_endian_and_fortran_members_read_as_numpy_reads_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    be = rng.standard_normal((3, 4)).astype(">f8")
    fo = np.asfortranarray(rng.standard_normal((2, 5)).astype(np.float32))
    path = tmp_path / "mixed.npz"
    np.savez_compressed(path, be=be, fo=fo)
    got = model_arrays(import_model([path]))
    np.testing.assert_array_equal(got["be"], be)
    assert got["be"].dtype == np.float64 and got["be"].dtype.isnative
    np.testing.assert_array_equal(got["fo"], fo)


# --- memory: bombs under an address-space limit ------------------------------------------------------

_LIMITED = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    from mconv.errors import InputError
    from mconv.formats import import_model
    from mconv.formats.weights import model_arrays
    bad = 0
    for path in sys.argv[1:]:
        try:
            model = import_model([path])
            print(path, "ok", {k: v.shape for k, v in model_arrays(model).items()})
        except InputError as exc:
            print(path, "InputError", exc.line())
        except BaseException as exc:
            print(path, "FAILED", type(exc).__name__, exc)
            bad += 1
    sys.exit(1 if bad else 0)
    """
)


def _run_limited(paths: list[Path]) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _LIMITED, *map(str, paths)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line.split(" ", 1)[0]: line.split(" ", 2)[1] for line in proc.stdout.splitlines()}


def test_weight_bombs_stay_within_4_gb_of_address_space(tmp_path: Path) -> None:
    paths = []
    # 1. a deflated member claiming 3.9 GiB (about 4 MB of file): refused from the directory
    head = _npy_header(((3900 << 20) // 4,))
    paths.append(
        _raw_zip(
            tmp_path / "big.npz", "w.npy", _zeros_deflate(head, 3900), crc=0, size=len(head) + (3900 << 20)
        )
    )
    # 2. a directory that lies small: 1 MiB declared (header agrees, CRC of that MiB), 3 GiB inflatable
    head = _npy_header(((1 << 20) // 4,))
    crc = zlib.crc32(bytes(1 << 20), zlib.crc32(head))
    paths.append(
        _raw_zip(
            tmp_path / "lie.npz", "w.npy", _zeros_deflate(head, 3072), crc=crc, size=len(head) + (1 << 20)
        )
    )
    # 3. safetensors headers made to blow up a JSON parser
    paths.append(_st(tmp_path / "deep.safetensors", b'{"a":' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}"))
    paths.append(_st(tmp_path / "many.safetensors", b'{"a":[' + b"{}," * 3_000_000 + b"{}]}"))
    paths.append(_st(tmp_path / "zero.safetensors", {"a": _t(shape=[0, 2**40, 2**40], offsets=[0, 0])}))
    # 4. 5-byte overwrites of the directory and the end record of a deflated .npz
    base = tmp_path / "base.npz"
    np.savez_compressed(base, **_weights(2), z=np.zeros(300_000, np.float32))
    raw = base.read_bytes()
    start = raw.index(b"PK\x01\x02")
    for k, offset in enumerate(range(start, len(raw) - 4, 3)):
        mutant = tmp_path / f"ow{k}.npz"
        mutant.write_bytes(raw[:offset] + b"\xff\xff\xff\x7f\x01" + raw[offset + 5 :])
        paths.append(mutant)
    got = _run_limited(paths)
    assert got[str(tmp_path / "big.npz")] == "InputError"
    assert got[str(tmp_path / "lie.npz")] == "ok"  # read up to the declared MiB and no further
    for name in ("deep", "many", "zero"):
        assert got[str(tmp_path / f"{name}.safetensors")] == "InputError", name
    assert set(got.values()) <= {"ok", "InputError"}


def test_lying_directory_yields_exactly_the_declared_array(tmp_path: Path) -> None:
    head = _npy_header(((1 << 20) // 4,))
    crc = zlib.crc32(bytes(1 << 20), zlib.crc32(head))
    path = _raw_zip(
        tmp_path / "lie.npz", "w.npy", _zeros_deflate(head, 64), crc=crc, size=len(head) + (1 << 20)
    )
    got = model_arrays(import_model([path]))
    assert got["w"].shape == ((1 << 20) // 4,) and not got["w"].any()


# --- mutation ----------------------------------------------------------------------------------------


def _mutate_and_import(tmp_path: Path, base: bytes, suffix: str, rng, *, fixed) -> dict[str, int]:
    """Seeded truncations, bit flips and 5-byte overwrites at fixed offsets of ``base``: each mutant
    must import or raise one InputError naming it."""
    mutants = []
    for pos in sorted({int(p) for p in rng.integers(0, len(base), 25)}):
        mutants.append(base[:pos])
    for pos in rng.integers(0, len(base), 60):
        b = bytearray(base)
        b[int(pos)] ^= 1 << int(rng.integers(0, 8))
        mutants.append(bytes(b))
    for pos in fixed:
        for junk in (b"\xff\xff\xff\xff\x7f", b"\x00\x00\x00\x00\x00", b"[[[[["):
            mutants.append(base[:pos] + junk + base[pos + 5 :])
    outcomes = {"ok": 0, "InputError": 0}
    for k, data in enumerate(mutants):
        path = tmp_path / f"m{k}{suffix}"
        path.write_bytes(data)
        try:
            import_model([path])
            outcomes["ok"] += 1
        except InputError as exc:
            assert "\n" not in exc.line() and str(path) in exc.line(), exc.line()
            outcomes["InputError"] += 1
        path.unlink()
    return outcomes


@pytest.mark.parametrize("compressed", [False, True])
def test_mutated_npz_import_or_raise_one_input_error(tmp_path: Path, compressed: bool) -> None:
    rng = np.random.default_rng(7 + compressed)
    base = tmp_path / "base.npz"
    (np.savez_compressed if compressed else np.savez)(base, **_weights(1))
    raw = base.read_bytes()
    # every 4th byte of the first local header and .npy header, the directory and the end record
    fixed = [*range(0, 140, 4), *range(raw.index(b"PK\x01\x02"), len(raw) - 4, 4)]
    outcomes = _mutate_and_import(tmp_path, raw, ".npz", rng, fixed=fixed)
    assert outcomes["InputError"] > 0
