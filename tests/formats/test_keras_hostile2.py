"""Hostile Keras HDF5 and .keras files, issue 11 items 2, 4 and 5: data from other files, damaged
HDF5 structures that make libhdf5 loop or allocate, and zip archives that lie.

Every file is built inside the test with h5py / zipfile and, where needed, patched byte by byte.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from mconv.cli.app import app
from mconv.errors import InputError
from mconv.formats.keras import load
from typer.testing import CliRunner

CONFIG = {
    "class_name": "Sequential",
    "keras_version": "2.4.0",
    "backend": "tensorflow",
    "config": {
        "name": "s",
        "layers": [
            {
                "class_name": "InputLayer",
                "config": {"name": "x", "batch_input_shape": [None, 4], "dtype": "float32"},
            },
            {"class_name": "Dense", "config": {"name": "fc", "units": 3, "activation": "relu"}},
            {"class_name": "Dense", "config": {"name": "out", "units": 2, "activation": "softmax"}},
        ],
    },
}
KERNEL = "/model_weights/fc/fc/kernel:0"


def _arrays(seed: int) -> dict[str, list[tuple[str, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    return {
        "x": [],
        "fc": [
            ("kernel", rng.normal(size=(4, 3)).astype(np.float32)),
            ("bias", rng.normal(size=3).astype(np.float32)),
        ],
        "out": [("kernel", rng.normal(size=(3, 2)).astype(np.float32)), ("bias", np.zeros(2, np.float32))],
    }


def _whole_model(path: Path, seed: int = 0, replace_kernel=None) -> Path:
    """A Keras 2 whole-model HDF5 (model_config as a variable-length string, weights under
    model_weights); ``replace_kernel(group, array)`` writes fc's kernel in some other way."""
    with h5py.File(path, "w") as f:
        f.attrs["model_config"] = json.dumps(CONFIG)
        f.attrs["keras_version"] = "2.4.0"
        f.attrs["backend"] = "tensorflow"
        g = f.create_group("model_weights")
        layers = _arrays(seed)
        g.attrs["layer_names"] = np.array([n.encode() for n in layers], dtype="S")
        for name, arrays in layers.items():
            lg = g.create_group(name)
            lg.attrs["weight_names"] = np.array([f"{name}/{w}:0".encode() for w, _ in arrays], dtype="S64")
            for w, a in arrays:
                if name == "fc" and w == "kernel" and replace_kernel is not None:
                    replace_kernel(lg.require_group("fc"), a)
                else:
                    lg.create_dataset(f"{name}/{w}:0", data=a)
    return path


def _refused(path: Path, match: str) -> str:
    with pytest.raises(InputError, match=match) as err:
        load([path], {})
    line = str(err.value)
    assert "\n" not in line and str(path) in line
    return line


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "-q"])


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and "Traceback" not in output
    return lines[0]


def test_plain_whole_model_imports(tmp_path):
    model = load([_whole_model(tmp_path / "m.h5", seed=3)], {})
    weights = {v.name: v.const_value.numpy() for v in model.graph.initializers.values()}
    kernel = _arrays(3)["fc"][0][1]
    assert any(np.array_equal(w, kernel) or np.array_equal(w, kernel.T) for w in weights.values())


# --- item 2: nothing is read from other files --------------------------------------------------


def test_external_raw_storage_is_refused_and_the_other_file_is_not_read(tmp_path):
    secret = tmp_path / "secret.bin"
    np.full(12, 7.0, np.float32).tofile(secret)

    def external(g, a):
        g.create_dataset("kernel:0", shape=a.shape, dtype="f4", external=[(str(secret), 0, a.nbytes)])

    p = _whole_model(tmp_path / "ext.h5", replace_kernel=external)
    line = _refused(p, "external file")
    assert f"dataset '{KERNEL}'" in line and "secret.bin" in line
    r = _cli("import", str(p), "-o", str(tmp_path / "out.onnx"))
    assert r.exit_code == 2 and "external file" in _one_error_line(r.output)
    assert not (tmp_path / "out.onnx").exists()


def test_external_link_is_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as o:
        o["k"] = np.ones((4, 3), np.float32)
    p = _whole_model(
        tmp_path / "link.h5",
        replace_kernel=lambda g, a: g.__setitem__("kernel:0", h5py.ExternalLink(str(other), "/k")),
    )
    line = _refused(p, "external link")
    assert f"link '{KERNEL}'" in line and "other.h5" in line
    r = _cli("import", str(p), "-o", str(tmp_path / "out.onnx"))
    assert r.exit_code == 2 and "external link" in _one_error_line(r.output)


def test_virtual_dataset_is_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as o:
        o["k"] = np.ones((4, 3), np.float32)

    def virtual(g, a):
        layout = h5py.VirtualLayout(shape=a.shape, dtype="f4")
        layout[:] = h5py.VirtualSource(str(other), "k", shape=a.shape)
        g.create_virtual_dataset("kernel:0", layout)

    line = _refused(_whole_model(tmp_path / "vds.h5", replace_kernel=virtual), "virtual dataset")
    assert f"dataset '{KERNEL}'" in line


def test_soft_links_resolve_inside_the_file_and_bad_ones_are_errors(tmp_path):
    def soft_ok(g, a):
        g.create_dataset("real", data=a)
        g["kernel:0"] = h5py.SoftLink("/model_weights/fc/fc/real")

    load([_whole_model(tmp_path / "ok.h5", replace_kernel=soft_ok)], {})

    dangling = _whole_model(
        tmp_path / "dangle.h5",
        replace_kernel=lambda g, a: g.__setitem__("kernel:0", h5py.SoftLink("/nowhere")),
    )
    assert "weight 'fc/kernel:0'" in _refused(dangling, "not in the file")

    def loop(g, a):
        g["kernel:0"] = h5py.SoftLink("/model_weights/fc/fc/k2")
        g["k2"] = h5py.SoftLink("/model_weights/fc/fc/kernel:0")

    _refused(_whole_model(tmp_path / "loop.h5", replace_kernel=loop), "a loop")


def test_unknown_filter_is_refused_before_any_plugin_is_looked_up(tmp_path):
    def plugin(g, a):
        g.create_dataset("kernel:0", data=a, chunks=a.shape, compression=32123, allow_unknown_filter=True)

    p = _whole_model(tmp_path / "filter.h5", replace_kernel=plugin)
    line = _refused(p, "filter 32123")
    assert f"dataset '{KERNEL}'" in line
    r = _cli("import", str(p), "-o", str(tmp_path / "out.onnx"))
    assert r.exit_code == 2 and "filter 32123" in _one_error_line(r.output)


def test_builtin_compression_imports(tmp_path):
    def gzip(g, a):
        g.create_dataset("kernel:0", data=a, chunks=a.shape, compression="gzip", shuffle=True)

    load([_whole_model(tmp_path / "gzip.h5", replace_kernel=gzip)], {})


# --- item 4: sizes are checked before libhdf5 reads or allocates --------------------------------


def test_compressed_dataset_expanding_beyond_the_ratio_is_refused(tmp_path):
    def bomb(g, a):  # chunks never written: a few hundred bytes of index for 400 MB of values
        g.create_dataset(
            "kernel:0", shape=(10_000, 10_000), dtype="f4", chunks=(100, 100), compression="gzip"
        )

    line = _refused(_whole_model(tmp_path / "bomb.h5", replace_kernel=bomb), "expands 0 stored bytes")
    assert f"dataset '{KERNEL}'" in line


def test_unwritten_uncompressed_dataset_is_refused(tmp_path):
    def unwritten(g, a):
        g.create_dataset("kernel:0", shape=(40, 30), dtype="f4", chunks=(4, 3))

    _refused(_whole_model(tmp_path / "hole.h5", replace_kernel=unwritten), "stores 0 of its 4800 bytes")


def test_attribute_declaring_more_than_the_file_is_refused_before_reading(tmp_path):
    p = _whole_model(tmp_path / "attr.h5")
    with h5py.File(p, "a") as f:
        f["model_weights/fc"].attrs["big"] = np.zeros(4567, np.float64)
    data = bytearray(p.read_bytes())
    at = data.find(struct.pack("<QQ", 4567, 4567))  # the dataspace: size, maximum size
    assert at > 0 and data.find(struct.pack("<Q", 4567), at + 16) < 0
    struct.pack_into("<QQ", data, at, 1 << 40, 1 << 40)  # now it claims 8 TiB of doubles
    p.write_bytes(bytes(data))
    # libhdf5 2.x notices this while decoding the header; mconv checks the declared size as well
    line = _refused(p, "more than the file holds|ran off end of input buffer")
    assert "object '/model_weights/fc'" in line


def _gcol(data: bytes) -> int:
    at = data.find(b"GCOL\x01\x00\x00\x00")
    assert at >= 0
    return at


def test_damaged_global_heap_is_refused_instead_of_looping(tmp_path):
    """A free-space object of size 0 makes libhdf5's collection walk loop forever (seen with one
    5-byte overwrite of a real model): the collection is checked before any string is read."""
    p = _whole_model(tmp_path / "heap.h5")
    data = bytearray(p.read_bytes())
    at = _gcol(data)
    idx, _, _, size = struct.unpack_from("<HHIQ", data, at + 16)
    assert idx == 1
    struct.pack_into("<Q", data, at + 16 + 8, size + 8)  # object 1 now ends inside object 2's header
    bad = tmp_path / "heap_bad.h5"
    bad.write_bytes(bytes(data))
    out = _run_isolated(f"load([Path({str(bad)!r})], {{}})", timeout=120)
    assert "InputError" in out and "global heap collection" in out, out


def test_variable_length_string_claiming_gigabytes_is_bounded(tmp_path):
    """A damaged length in model_config's descriptor makes libhdf5 allocate and clear that many
    bytes before it notices; the child's memory bound turns it into one error."""
    p = _whole_model(tmp_path / "vlen.h5")
    data = bytearray(p.read_bytes())
    at = _gcol(data)
    config_len = len(json.dumps(CONFIG))
    hits = [
        i
        for idx in range(1, 8)
        for i in [data.find(struct.pack("<QI", at, idx))]
        if i >= 4 and struct.unpack_from("<I", data, i - 4)[0] == config_len
    ]
    assert len(hits) == 1
    struct.pack_into("<I", data, hits[0] - 4, 0xF0000000)
    p.write_bytes(bytes(data))
    out = _run_isolated(f"load([Path({str(p)!r})], {{}})", timeout=120)
    assert "InputError" in out and "memory allocation failed" in out, out


def _run_isolated(stmt: str, timeout: float) -> str:
    """Run ``stmt`` in a fresh interpreter limited to 4 GB of address space; its one-line outcome."""
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from pathlib import Path
        from mconv.errors import InputError
        from mconv.formats.keras import load
        try:
            {stmt}
            print("OK")
        except InputError as exc:
            print("InputError", str(exc))
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_mutated_whole_model_never_hangs_crashes_or_exits_3(tmp_path):
    """Seeded mutations of a whole-model file: every 37th byte flipped, and 5-byte 0xff windows
    over the global heap (where the loops were found). Each outcome is an import or one InputError,
    under a 4 GB address-space limit, in bounded time."""
    src = _whole_model(tmp_path / "src.h5", seed=5)
    data = src.read_bytes()
    heap = _gcol(data)
    cases = [("flip", i) for i in range(0, len(data), 37)][::6][:16]
    cases += [("ff", heap + 16 + k * 8) for k in range(8)]
    script = tmp_path / "mutate.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import resource, sys
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
            from pathlib import Path
            from mconv.errors import InputError
            from mconv.formats.keras import load
            data = Path({str(src)!r}).read_bytes()
            for kind, pos in {cases!r}:
                buf = bytearray(data)
                if kind == "flip":
                    buf[pos] ^= 0x10
                else:
                    buf[pos : pos + 5] = b"\\xff" * 5
                p = Path({str(tmp_path)!r}) / "mut.h5"
                p.write_bytes(bytes(buf))
                try:
                    load([p], {{}})
                    print(kind, pos, "ok")
                except InputError as exc:
                    assert "\\n" not in str(exc)
                    print(kind, pos, "input")
            """
        )
    )
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    outcomes = r.stdout.split()
    assert len(outcomes) == 3 * len(cases)
    assert set(outcomes[2::3]) <= {"ok", "input"}
    assert "input" in outcomes[2::3]


# --- item 5: .keras archives --------------------------------------------------------------------


def _keras_zip(tmp_path: Path, seed: int = 0, extra=()) -> Path:
    cfg = json.loads(json.dumps(CONFIG))
    cfg["keras_version"] = "3.15.0"
    h5 = tmp_path / "model.weights.h5"
    ws = _arrays(seed)
    with h5py.File(h5, "w") as f:
        for key, name in (("dense", "fc"), ("dense_1", "out")):
            v = f.create_group(f"layers/{key}/vars")
            v.attrs["name"] = name
            for i, (_, a) in enumerate(ws[name]):
                v.create_dataset(str(i), data=a)
    out = tmp_path / "m.keras"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.15.0"}))
        z.writestr("config.json", json.dumps(cfg))
        z.write(h5, "model.weights.h5")
        for name, data in extra:
            z.writestr(name, data)
    return out


def _patch_central(path: Path, member: str, offset: int, fmt: str, value: int) -> None:
    """Overwrite one field of ``member``'s central directory entry."""
    data = bytearray(path.read_bytes())
    pos = 0
    while True:
        pos = data.find(b"PK\x01\x02", pos)
        assert pos >= 0
        name_len = struct.unpack_from("<H", data, pos + 28)[0]
        if data[pos + 46 : pos + 46 + name_len] == member.encode():
            struct.pack_into(fmt, data, pos + offset, value)
            break
        pos += 4
    path.write_bytes(bytes(data))


def test_keras_zip_imports(tmp_path):
    load([_keras_zip(tmp_path)], {})


def test_zip_member_expanding_200x_is_refused_before_inflating(tmp_path):
    p = _keras_zip(tmp_path)
    with zipfile.ZipFile(p) as z:
        cs = z.getinfo("config.json").compress_size
    _patch_central(p, "config.json", 24, "<I", cs * 201 + 4097)  # uncompressed size, still < 1 MB
    line = _refused(p, "zip bomb")
    assert "member 'config.json'" in line


def test_zip_of_a_large_zero_member_is_refused(tmp_path):
    """The old 1 MB floor let 195 KB of archive declare 190 MB; now the ratio applies to every size."""
    p = _keras_zip(tmp_path, extra=[("assets/zeros.bin", bytes(3 << 20))])
    assert p.stat().st_size < 64 << 10
    line = _refused(p, "zip bomb")
    assert "member 'assets/zeros.bin'" in line


def test_zip_central_directory_that_understates_a_member_is_caught_while_inflating(tmp_path):
    p = _keras_zip(tmp_path)
    with zipfile.ZipFile(p) as z:
        size = z.getinfo("config.json").file_size
    _patch_central(p, "config.json", 24, "<I", size // 2)
    _refused(p, "not the size its header declares|cannot read member")


def test_zip_duplicate_member_names_are_refused(tmp_path):
    with pytest.warns(UserWarning, match="Duplicate name"):
        p = _keras_zip(tmp_path, extra=[("config.json", b"{}")])
    assert "two members" in _refused(p, "two members")


def test_zip_encrypted_member_is_refused(tmp_path):
    p = _keras_zip(tmp_path)
    _patch_central(p, "model.weights.h5", 8, "<H", 0x1)
    assert "member 'model.weights.h5'" in _refused(p, "encrypted")


def test_zip_member_on_another_disk_is_refused(tmp_path):
    p = _keras_zip(tmp_path)
    _patch_central(p, "config.json", 34, "<H", 3)
    _refused(p, "disk 3")


def test_multi_disk_zip_is_refused(tmp_path):
    p = _keras_zip(tmp_path)
    data = bytearray(p.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 4, 1, 1)  # this disk, disk with the central directory
    p.write_bytes(bytes(data))
    _refused(p, "spans several disks")


@pytest.mark.parametrize("name", ["../up.bin", "/abs.bin", "a/../../b", "C:/x", "..\\win", "\x1b[31m/../x"])
def test_zip_names_escaping_the_archive_are_refused_and_shown_escaped(tmp_path, name):
    p = _keras_zip(tmp_path, extra=[(name, b"x")])
    line = _refused(p, "escapes the archive")
    assert "\x1b" not in line


def test_hard_link_cycle_in_keras3_weights_is_an_error_not_a_recursion(tmp_path):
    p = _keras_zip(tmp_path)
    h5 = tmp_path / "model.weights.h5"
    with h5py.File(h5, "a") as f:
        f["layers/dense/cell"] = f["layers/dense"]  # the layer's group now contains itself
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        cfg = json.loads(json.dumps(CONFIG))
        cfg["keras_version"] = "3.15.0"
        z.writestr("config.json", json.dumps(cfg))
        z.write(h5, "model.weights.h5")
    line = _refused(p, "link back into themselves")
    assert "layer 'fc'" in line
