"""Seed files and the hand-built hostile corpus for bench/fuzz.py (issue 11, item 16).

Run as a separate process (``python bench/fuzz_corpus.py ROOT``) so the heavy writers (torch,
keras, the test suites' format writers) never start thread pools in the fuzzer's forking parent.
It writes ``ROOT/seeds/<entry>/...`` and ``ROOT/corpus.json``: one record per entry,

    {"format": "onnx", "name": "digits_mlp", "kind": "seed" | "hostile",
     "files": [paths relative to the entry folder], "mutate": [indexes into files],
     "argv": [CLI arguments; "{D}" is the case folder], "resign": bool, "note": "..."}

and the canaries: ``ROOT/canary`` and ``ROOT/cases/canary`` (bytes no input holds: a marker
block repeated), ``ROOT/cases/canary.h5`` (an HDF5 file whose datasets hold the marker). Case
folders are ``ROOT/cases/<format>-<n>/``, so ``../canary`` seen from a model file is a canary.
Everything here is deterministic for a given ``--seed`` except what the frameworks' own writers
put in their files (checked by sha256 on ``--replay``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import shutil
import struct
import sys
import traceback
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # the surfaces' builders live beside this file
import fuzz_surfaces  # noqa: E402

SHARED = Path(os.environ.get("MCONV_SHARED", REPO.parent / "shared"))
MARKER_HEAD = b"MCONV-FUZZ-CANARY"  # 17 bytes; the full block adds 15 seeded random bytes


def canary_block(seed: int) -> bytes:
    rng = np.random.default_rng([seed, 0xCA4A])
    return MARKER_HEAD + rng.integers(0, 256, 15, dtype=np.uint8).tobytes()


def _load_test_module(rel: str, name: str):
    """A helper module from the test suite (the independent writers), imported by path."""
    path = REPO / rel
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Corpus:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.seed = seed
        self.entries: list[dict] = []
        self.failures: list[str] = []

    def entry_dir(self, fmt: str, name: str) -> Path:
        d = self.root / "seeds" / f"{fmt}__{name}"
        d.mkdir(parents=True, exist_ok=False)
        return d

    def add(self, fmt, name, kind, files, argv, mutate=None, resign=False, note=""):
        self.entries.append(
            {
                "format": fmt,
                "name": name,
                "kind": kind,
                "dir": f"seeds/{fmt}__{name}",
                "files": list(files),
                "mutate": list(range(len(files))) if mutate is None else list(mutate),
                "argv": list(argv),
                "resign": resign,
                "note": note,
            }
        )

    def guarded(self, label: str, fn) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - one broken builder must not stop the corpus
            self.failures.append(f"{label}: {traceback.format_exc(limit=3).strip().splitlines()[-1]}")


IMPORT = ["import", "-o", "{D}/out/out.onnx", "--json"]


def _imp(*files: str, extra: tuple[str, ...] = ()) -> list[str]:
    return ["import", *(f"{{D}}/{f}" for f in files), "-o", "{D}/out/out.onnx", "--json", *extra]


# --- canaries ------------------------------------------------------------------------------------


def plant_canaries(root: Path, block: bytes) -> None:
    import h5py

    data = block * 2048  # 64 KiB: any read of it holds whole marker blocks
    (root / "cases").mkdir(parents=True, exist_ok=True)
    for p in (root / "canary", root / "cases" / "canary", root / "cases" / "canary.bin"):
        p.write_bytes(data)
    with h5py.File(root / "cases" / "canary.h5", "w") as f:
        arr = np.frombuffer(data, np.float32).copy()
        f["data"] = arr
        f["kernel"] = arr[: 64 * 16].reshape(16, 64)
        f.attrs["secret"] = np.frombuffer(data[:256], np.uint8)


# --- seeds ---------------------------------------------------------------------------------------


def _digits_onnx() -> Path:
    return REPO / "fixtures" / "digits_mlp.onnx"


def _conv_model(n_out: int = 4):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.standard_normal((n_out, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    fc = rng.standard_normal((n_out * 9, 5)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Flatten", ["r"], ["f"], name="flat"),
            helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(fc, "fc")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), onnx


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _set_external(tensor, location: str, offset: int | None = None, length: int | None = None) -> None:
    from onnx import TensorProto

    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = tensor.external_data.add()
            e.key, e.value = k, str(v)
    tensor.ClearField("raw_data")


def build_onnx(c: Corpus) -> None:
    d = c.entry_dir("onnx", "digits_mlp")
    shutil.copyfile(_digits_onnx(), d / "digits_mlp.onnx")
    c.add("onnx", "digits_mlp", "seed", ["digits_mlp.onnx"], _imp("digits_mlp.onnx"))
    model, onnx = _conv_model()
    d = c.entry_dir("onnx", "conv")
    (d / "conv.onnx").write_bytes(model.SerializeToString())
    c.add("onnx", "conv", "seed", ["conv.onnx"], _imp("conv.onnx"))

    # external data: model.onnx + weights.bin (every initializer outside, at its own offset)
    d = c.entry_dir("onnx-extdata", "conv")
    blob = bytearray()
    for t in model.graph.initializer:
        raw = t.raw_data or onnx.numpy_helper.to_array(t).tobytes()
        while len(blob) % 16:
            blob += b"\0"
        off = len(blob)
        blob += raw
        _set_external(t, "weights.bin", off, len(raw))
    (d / "model.onnx").write_bytes(model.SerializeToString())
    (d / "weights.bin").write_bytes(bytes(blob))
    c.add("onnx-extdata", "conv", "seed", ["model.onnx", "weights.bin"], _imp("model.onnx"))


def build_onnx_hostile(c: Corpus) -> None:
    canary_abs = str(c.root / "cases" / "canary")
    variants = {
        "dotdot": ("../canary", None, None),
        "dotdot_deep": ("sub/../../canary", None, None),
        "absolute": (canary_abs, None, None),
        "offset_beyond_file": ("weights.bin", 1 << 40, 64),
        "length_huge": ("weights.bin", 0, 1 << 40),
        "negative_offset": ("weights.bin", -64, 64),
        "nul_in_location": ("weights.bin\0../canary", None, None),
        "location_is_dir": (".", None, None),
        "location_missing": ("no_such_file.bin", None, None),
        "empty_location": ("", None, None),
        "self_reference": ("model.onnx", 0, 36),
    }
    for name, (loc, off, length) in variants.items():
        model, _ = _conv_model()
        _set_external(model.graph.initializer[0], loc, off, length)
        d = c.entry_dir("onnx-extdata", f"hostile_{name}")
        (d / "model.onnx").write_bytes(model.SerializeToString())
        (d / "weights.bin").write_bytes(b"\0" * 4096)
        c.add("onnx-extdata", f"hostile_{name}", "hostile", ["model.onnx"], _imp("model.onnx"))
    # a symlink beside the model that points outside it
    model, _ = _conv_model()
    _set_external(model.graph.initializer[0], "weights.bin")
    d = c.entry_dir("onnx-extdata", "hostile_symlink_outside")
    (d / "model.onnx").write_bytes(model.SerializeToString())
    os.symlink("../canary", d / "weights.bin")
    c.add("onnx-extdata", "hostile_symlink_outside", "hostile", ["model.onnx"], _imp("model.onnx"))
    d = c.entry_dir("onnx-extdata", "hostile_symlink_dir_outside")
    _set_external(model.graph.initializer[0], "link/canary")
    (d / "model.onnx").write_bytes(model.SerializeToString())
    os.symlink("..", d / "link")
    c.add("onnx-extdata", "hostile_symlink_dir_outside", "hostile", ["model.onnx"], _imp("model.onnx"))
    # the model file itself a symlink to a model elsewhere whose external data is "canary"
    # (resolving the symlink first makes "canary" the file beside the target: ROOT/cases/canary)
    d = c.entry_dir("onnx-extdata", "hostile_model_symlink")
    model, _ = _conv_model()
    _set_external(model.graph.initializer[0], "canary", 0, 36 * 4)
    (c.root / "cases" / "elsewhere.onnx").write_bytes(model.SerializeToString())
    os.symlink("../elsewhere.onnx", d / "model.onnx")
    c.add("onnx-extdata", "hostile_model_symlink", "hostile", ["model.onnx"], _imp("model.onnx"))

    # single-file hostiles

    def put(name: str, data: bytes) -> None:
        d = c.entry_dir("onnx", f"hostile_{name}")
        (d / "m.onnx").write_bytes(data)
        c.add("onnx", f"hostile_{name}", "hostile", ["m.onnx"], _imp("m.onnx"))

    model, _ = _conv_model()
    t = model.graph.initializer[2]
    del t.dims[:]
    t.dims.extend([1 << 31, 1 << 31])  # far more elements than raw_data holds
    put("dims_overflow", model.SerializeToString())
    model, _ = _conv_model()
    model.graph.initializer[2].dims[0] = -5
    put("negative_dim", model.SerializeToString())

    # If subgraphs nested 2000 deep, written on the wire (onnx.helper copies through the parser,
    # which stops at protobuf's depth limit)
    def ld(field: int, payload: bytes) -> bytes:
        return _varint(field << 3 | 2) + _varint(len(payload)) + payload

    graph = ld(2, b"leaf")  # GraphProto.name
    for i in range(2000):
        attr = ld(1, b"then_branch") + ld(6, graph) + _varint(20 << 3) + _varint(5)  # type GRAPH
        node = ld(1, b"c") + ld(2, f"o{i}".encode()) + ld(4, b"If") + ld(5, attr)
        graph = ld(1, node) + ld(2, f"g{i}".encode())
    opset = ld(1, b"") + _varint(2 << 3) + _varint(17)
    put("nested_if_2000", _varint(1 << 3) + _varint(8) + ld(7, graph) + ld(8, opset))
    # a length-delimited field claiming 2**40 bytes
    put("field_length_huge", b"\x3a\x80\x80\x80\x80\x80\x20" + b"\0" * 64)
    put("empty", b"")


def build_keras(c: Corpus) -> None:
    k = SHARED / "models" / "keras"
    d = c.entry_dir("keras-h5", "keras_3layer")
    shutil.copyfile(k / "keras_3layer.h5", d / "keras_3layer.h5")
    c.add("keras-h5", "keras_3layer", "seed", ["keras_3layer.h5"], _imp("keras_3layer.h5"))
    for stem in ("KERAS_3layer", "KERAS_conv1d_small", "KERAS_conv2d_model", "jetTagger_Conv2D_Small"):
        d = c.entry_dir("keras-json", stem)
        shutil.copyfile(k / f"{stem}.json", d / f"{stem}.json")
        shutil.copyfile(k / f"{stem}_weights.h5", d / f"{stem}_weights.h5")
        files = [f"{stem}.json", f"{stem}_weights.h5"]
        c.add("keras-json", stem, "seed", files, _imp(*files))


def build_keras_zip(c: Corpus) -> None:
    """A .keras saved by Keras 3 (jax backend), rewritten with fixed zip dates and save date."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    keras.utils.set_random_seed(5)
    m = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(6, activation="softmax", name="dense"),
        ]
    )
    d = c.entry_dir("keras-zip", "small_cnn")
    tmp = d / "raw.keras"
    m.save(tmp)
    out = io.BytesIO()
    with zipfile.ZipFile(tmp) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in sorted(src.infolist(), key=lambda i: i.filename):
            data = src.read(info)
            if info.filename == "metadata.json":
                meta = json.loads(data)
                meta["date_saved"] = "2000-01-01@00:00:00"
                data = json.dumps(meta, sort_keys=True).encode()
            zi = zipfile.ZipInfo(info.filename, date_time=(2000, 1, 1, 0, 0, 0))
            zi.compress_type = info.compress_type
            dst.writestr(zi, data)
    tmp.unlink()
    (d / "small_cnn.keras").write_bytes(out.getvalue())
    c.add("keras-zip", "small_cnn", "seed", ["small_cnn.keras"], _imp("small_cnn.keras"))


def _h5_weights_pair(c: Corpus, name: str, fmt: str = "keras-json"):
    k = SHARED / "models" / "keras"
    d = c.entry_dir(fmt, name)
    shutil.copyfile(k / "KERAS_3layer.json", d / "m.json")
    shutil.copyfile(k / "KERAS_3layer_weights.h5", d / "w.h5")
    return d


def build_keras_hostile(c: Corpus) -> None:
    import h5py

    canary_h5_rel = "../canary.h5"
    canary_abs = str(c.root / "cases" / "canary")

    def first_kernel(f):
        found = []
        f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) and "kernel" in n else None)
        return found[0]

    def replace(path: Path, how) -> None:
        with h5py.File(path, "r+") as f:
            name = first_kernel(f)
            shape, dtype = f[name].shape, f[name].dtype
            del f[name]
            how(f, name, shape, dtype)

    nbytes = lambda shape, dtype: int(np.prod(shape)) * np.dtype(dtype).itemsize  # noqa: E731
    cases = {
        "external_storage_dotdot": lambda f, n, s, t: f.create_dataset(
            n, shape=s, dtype=t, external=[("../canary", 0, nbytes(s, t))]
        ),
        "external_storage_absolute": lambda f, n, s, t: f.create_dataset(
            n, shape=s, dtype=t, external=[(canary_abs, 0, nbytes(s, t))]
        ),
        "external_link": lambda f, n, s, t: f.__setitem__(n, h5py.ExternalLink(canary_h5_rel, "/kernel")),
        "external_link_absolute": lambda f, n, s, t: f.__setitem__(
            n, h5py.ExternalLink(str(c.root / "cases" / "canary.h5"), "/kernel")
        ),
        "soft_link_loop": lambda f, n, s, t: f.__setitem__(n, h5py.SoftLink("/" + n)),
        "huge_fill_dataset": lambda f, n, s, t: f.create_dataset(
            n, shape=(1 << 20, 1 << 20), dtype="f4", chunks=(1024, 1024)
        ),
        "huge_shape_zero_size": lambda f, n, s, t: f.create_dataset(n, shape=(0, 1 << 40), dtype="f4"),
    }

    def vds(f, n, s, t):
        layout = h5py.VirtualLayout(shape=(16, 64), dtype="f4")
        layout[:] = h5py.VirtualSource(canary_h5_rel, "kernel", shape=(16, 64))
        f.create_virtual_dataset(n, layout, fillvalue=0)

    cases["virtual_dataset"] = vds
    for name, how in cases.items():
        d = _h5_weights_pair(c, f"hostile_{name}")
        replace(d / "w.h5", how)
        c.add("keras-json", f"hostile_{name}", "hostile", ["m.json", "w.h5"], _imp("m.json", "w.h5"))
        # the same inside a whole-model file
        k = SHARED / "models" / "keras"
        d = c.entry_dir("keras-h5", f"hostile_{name}")
        shutil.copyfile(k / "keras_3layer.h5", d / "m.h5")
        replace(d / "m.h5", how)
        c.add("keras-h5", f"hostile_{name}", "hostile", ["m.h5"], _imp("m.h5"))
    # deeply nested architecture JSON
    d = _h5_weights_pair(c, "hostile_nested_json")
    (d / "m.json").write_text("[" * 100000 + "]" * 100000)
    c.add("keras-json", "hostile_nested_json", "hostile", ["m.json", "w.h5"], _imp("m.json", "w.h5"))
    d = _h5_weights_pair(c, "hostile_nested_config")
    depth = 5000  # Sequential models nested in Sequential models (json.dumps cannot write it)
    (d / "m.json").write_text('{"class_name": "Sequential", "config": {"layers": [' * depth + "]}}" * depth)
    c.add("keras-json", "hostile_nested_config", "hostile", ["m.json", "w.h5"], _imp("m.json", "w.h5"))
    d = _h5_weights_pair(c, "hostile_lambda_layer")
    cfg = json.loads((d / "m.json").read_text())
    cfg["config"]["layers"].insert(
        1,
        {
            "class_name": "Lambda",
            "config": {
                "name": "evil",
                "function": ["open('PWNED','w')", None, None],
                "function_type": "lambda",
            },
        },
    )
    (d / "m.json").write_text(json.dumps(cfg))
    c.add("keras-json", "hostile_lambda_layer", "hostile", ["m.json", "w.h5"], _imp("m.json", "w.h5"))


def _bomb_member(zf: zipfile.ZipFile, name: str, total: int, prefix: bytes = b"") -> None:
    zi = zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0))
    zi.compress_type = zipfile.ZIP_DEFLATED
    with zf.open(zi, "w", force_zip64=True) as f:
        f.write(prefix)
        chunk = b"\0" * (1 << 22)
        left = total - len(prefix)
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)


def build_keras_zip_hostile(c: Corpus) -> None:
    base = c.root / "seeds" / "keras-zip__small_cnn" / "small_cnn.keras"
    with zipfile.ZipFile(base) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}

    def write(name: str, edit) -> None:
        d = c.entry_dir("keras-zip", f"hostile_{name}")
        with zipfile.ZipFile(d / "m.keras", "w", zipfile.ZIP_DEFLATED) as zf:
            edit(zf, dict(members))
        c.add("keras-zip", f"hostile_{name}", "hostile", ["m.keras"], _imp("m.keras"))

    def bomb(zf, m):
        for k, v in m.items():
            if k != "model.weights.h5":
                zf.writestr(zipfile.ZipInfo(k, (2000, 1, 1, 0, 0, 0)), v)
        _bomb_member(zf, "model.weights.h5", 1 << 30, m["model.weights.h5"])

    def traversal(zf, m):
        for k, v in m.items():
            zf.writestr(zipfile.ZipInfo(k, (2000, 1, 1, 0, 0, 0)), v)
        zf.writestr(zipfile.ZipInfo("../../PWNED", (2000, 1, 1, 0, 0, 0)), b"x")
        zf.writestr(zipfile.ZipInfo("/tmp/PWNED_abs", (2000, 1, 1, 0, 0, 0)), b"x")

    def nested_config(zf, m):
        for k, v in m.items():
            if k == "config.json":
                v = b"{" + b'"a":{' * 50000 + b"}" * 50001
            zf.writestr(zipfile.ZipInfo(k, (2000, 1, 1, 0, 0, 0)), v)

    def external_link(zf, m):
        import h5py

        buf = io.BytesIO(m["model.weights.h5"])
        with h5py.File(buf, "r+") as f:
            found = []
            f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) else None)
            del f[found[0]]
            f[found[0]] = h5py.ExternalLink("../canary.h5", "/kernel")
        m["model.weights.h5"] = buf.getvalue()
        for k, v in m.items():
            zf.writestr(zipfile.ZipInfo(k, (2000, 1, 1, 0, 0, 0)), v)

    for name, fn in (
        ("zip_bomb", bomb),
        ("path_traversal", traversal),
        ("nested_config", nested_config),
        ("external_link", external_link),
    ):
        c.guarded(f"keras-zip {name}", lambda n=name, f=fn: write(n, f))


def build_caffe(c: Corpus) -> None:
    k = SHARED / "models" / "caffe"
    d = c.entry_dir("caffe", "lenet")
    shutil.copyfile(k / "lenet.prototxt", d / "lenet.prototxt")
    shutil.copyfile(k / "lenet_iter_10000.caffemodel", d / "lenet.caffemodel")
    files = ["lenet.prototxt", "lenet.caffemodel"]
    c.add("caffe", "lenet", "seed", files, _imp(*files))
    proto = (k / "lenet.prototxt").read_text()
    # hostiles: nested text messages, absurd blob shape, a huge repeated field count
    hostile = {
        "nested_prototxt": "layer { " * 20000 + "}" * 20000,
        "huge_num_output": proto.replace("num_output: 500", "num_output: 2000000000"),
        "huge_input_dim": proto.replace("dim: 64", "dim: 4000000000")
        if "dim: 64" in proto
        else proto.replace("input_dim: 1", "input_dim: 4000000000", 1),
        "long_name": proto.replace('name: "LeNet"', 'name: "' + "\\x1b[31m" * 5000 + '"'),
    }
    for name, text in hostile.items():
        d = c.entry_dir("caffe", f"hostile_{name}")
        (d / "lenet.prototxt").write_text(text)
        shutil.copyfile(k / "lenet_iter_10000.caffemodel", d / "lenet.caffemodel")
        c.add("caffe", f"hostile_{name}", "hostile", files, _imp(*files))
    # a caffemodel whose first length-delimited field claims 2**40 bytes
    d = c.entry_dir("caffe", "hostile_caffemodel_length_huge")
    shutil.copyfile(k / "lenet.prototxt", d / "lenet.prototxt")
    (d / "lenet.caffemodel").write_bytes(b"\x0a\x80\x80\x80\x80\x80\x20LeNet")
    c.add("caffe", "hostile_caffemodel_length_huge", "hostile", files, _imp(*files))


def build_tflite(c: Corpus) -> None:
    k = SHARED / "models" / "tflite"
    for name in (
        "hello_world_float",
        "hello_world_int8",
        "trained_lstm",
        "person_detect",
        "dtln_noise_suppression",
    ):
        d = c.entry_dir("tflite", name)
        shutil.copyfile(k / f"{name}.tflite", d / f"{name}.tflite")
        c.add("tflite", name, "seed", [f"{name}.tflite"], _imp(f"{name}.tflite"))


def build_tflite_hostile(c: Corpus) -> None:
    mod = _load_test_module("tests/formats/test_tflite_hostile.py", "_fuzz_tflite_hostile")
    cases = {
        "external_buffer_beyond_file": mod.flatbuffer_with_external_buffer(1 << 40, 216),
        "external_buffer_size_huge": mod.flatbuffer_with_external_buffer(64, 1 << 62),
        "external_buffer_wraps": mod.flatbuffer_with_external_buffer((1 << 64) - 8, 216),
    }
    valid = mod.VALID
    # every uoffset rewritten to point at itself (cycles) / past the end
    cyc = bytearray(valid)
    struct.pack_into("<I", cyc, 0, 0)
    cases["root_offset_zero"] = bytes(cyc)
    cases["root_offset_huge"] = struct.pack("<I", 0xFFFFFFF0) + valid[4:]
    for name, data in cases.items():
        d = c.entry_dir("tflite", f"hostile_{name}")
        (d / "m.tflite").write_bytes(data)
        c.add("tflite", f"hostile_{name}", "hostile", ["m.tflite"], _imp("m.tflite"))
    d = c.entry_dir("tflite", "builder_small")
    (d / "m.tflite").write_bytes(valid)
    c.add("tflite", "builder_small", "seed", ["m.tflite"], _imp("m.tflite"))


TORCH_ARGS = ("--input-shape", "x=1,1,6,6")


def build_torch(c: Corpus) -> None:
    import torch

    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, 3)
            self.fc = torch.nn.Linear(2 * 4 * 4, 3)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    d = c.entry_dir("torch", "tiny")
    torch.jit.save(torch.jit.script(Tiny().eval()), d / "tiny.pt")
    c.add("torch", "tiny", "seed", ["tiny.pt"], _imp("tiny.pt", extra=TORCH_ARGS))
    data = (d / "tiny.pt").read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = [(i, zf.read(i)) for i in zf.infolist()]

    def rewrite(name: str, edit) -> None:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for info, blob in members:
                r = edit(info.filename, blob)
                if r is not None:
                    dst.writestr(zipfile.ZipInfo(info.filename, (2000, 1, 1, 0, 0, 0)), r)
        hd = c.entry_dir("torch", f"hostile_{name}")
        (hd / "m.pt").write_bytes(out.getvalue())
        c.add("torch", f"hostile_{name}", "hostile", ["m.pt"], _imp("m.pt", extra=TORCH_ARGS))

    storages = [i.filename for i, _ in members if "/data/" in i.filename]
    first = storages[0] if storages else None
    rewrite("truncated_storage", lambda n, b: b[: len(b) // 3] if n == first else b)
    rewrite("empty_storage", lambda n, b: b"" if n == first else b)
    rewrite("missing_storage", lambda n, b: None if n == first else b)
    rewrite(
        "bad_code",
        lambda n, b: b"def forward(self, x):\n  return open('PWNED', 'w')\n" if n.endswith(".py") else b,
    )
    # pickles: a module pickle with a GLOBAL that would create a file; a state dict
    evil = b"cbuiltins\nopen\n(VPWNED\nVw\ntR."
    d = c.entry_dir("torch", "hostile_pickle_global")
    (d / "m.pt").write_bytes(evil)
    c.add("torch", "hostile_pickle_global", "hostile", ["m.pt"], _imp("m.pt", extra=TORCH_ARGS))
    d = c.entry_dir("torch", "hostile_zip_pickle_global")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("archive/data.pkl", evil)
        zf.writestr("archive/version", b"3\n")
    (d / "m.pt").write_bytes(out.getvalue())
    c.add("torch", "hostile_zip_pickle_global", "hostile", ["m.pt"], _imp("m.pt", extra=TORCH_ARGS))
    d = c.entry_dir("torch", "hostile_state_dict")
    torch.save(Tiny().state_dict(), d / "m.pt")
    c.add("torch", "hostile_state_dict", "hostile", ["m.pt"], _imp("m.pt", extra=TORCH_ARGS))


def build_dlk(c: Corpus) -> None:
    rng = np.random.default_rng(4)
    doc = {
        "name": "tiny",
        "layer": [
            {"name": "data", "type": "Input", "input_param": {"shape": [{"dim": [1, 1, 6, 6]}]}},
            {
                "name": "conv1",
                "type": "Convolution",
                "bottom": ["data"],
                "top": ["conv1"],
                "convolution_param": {"num_output": 2, "kernel_size": [3], "stride": [1], "pad": [0]},
                "blobs": [
                    {
                        "shape": {"dim": [2, 1, 3, 3]},
                        "data": [round(float(v), 4) for v in rng.standard_normal(18)],
                    },
                    {"shape": {"dim": [2]}, "data": [0.0, 0.5]},
                ],
            },
            {"name": "relu1", "type": "ReLU", "bottom": ["conv1"], "top": ["conv1"]},
            {
                "name": "pool1",
                "type": "Pooling",
                "bottom": ["conv1"],
                "top": ["pool1"],
                "pooling_param": {"pool": 0, "kernel_size": 2, "stride": 2},
            },
        ],
    }
    d = c.entry_dir("dlk-json", "tiny")
    (d / "tiny.json").write_text(json.dumps(doc, indent=1))
    c.add("dlk-json", "tiny", "seed", ["tiny.json"], _imp("tiny.json"))
    hostile = {
        "nested_lists": "[" * 200000 + "]" * 200000,
        "nested_objects": '{"layer":' * 100000 + "1" + "}" * 100000,
        "huge_number": json.dumps(doc).replace('"num_output": 2', '"num_output": 1' + "0" * 5000),
        "blob_dims_huge": json.dumps(doc).replace("[2, 1, 3, 3]", "[4000000000, 4000000000, 3, 3]"),
        "nan_data": json.dumps(doc).replace("[0.0, 0.5]", "[NaN, Infinity]"),
    }
    for name, text in hostile.items():
        d = c.entry_dir("dlk-json", f"hostile_{name}")
        (d / "m.json").write_text(text)
        c.add("dlk-json", f"hostile_{name}", "hostile", ["m.json"], _imp("m.json"))


def _st_bytes(header: dict | str, data: bytes, length: int | None = None) -> bytes:
    h = header if isinstance(header, str) else json.dumps(header)
    hb = h.encode()
    return struct.pack("<Q", len(hb) if length is None else length) + hb + data


def build_safetensors(c: Corpus) -> None:
    from safetensors.numpy import save

    rng = np.random.default_rng(6)
    arrays = {
        "fc.weight": rng.standard_normal((8, 16)).astype(np.float32),
        "fc.bias": rng.standard_normal(8).astype(np.float16),
        "emb": rng.integers(-5, 5, (4, 3)).astype(np.int64),
    }
    d = c.entry_dir("safetensors", "three")
    (d / "w.safetensors").write_bytes(save(arrays, metadata={"format": "np"}))
    c.add("safetensors", "three", "seed", ["w.safetensors"], _imp("w.safetensors"))
    a = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    hostile = {
        "header_len_huge": struct.pack("<Q", 1 << 62) + b"{}",
        "header_len_past_file": _st_bytes({"a": a}, b"\0" * 16, length=10_000),
        "nested_header": _st_bytes("[" * 100000 + "]" * 100000, b""),
        "nested_metadata": _st_bytes('{"__metadata__":' + '{"a":' * 50000 + "1" + "}" * 50001, b""),
        "offsets_past_end": _st_bytes({"a": dict(a, data_offsets=[0, 1 << 40])}, b"\0" * 16),
        "offsets_reversed": _st_bytes({"a": dict(a, data_offsets=[16, 0])}, b"\0" * 16),
        "shape_overflow": _st_bytes({"a": dict(a, shape=[1 << 32, 1 << 32, 16])}, b"\0" * 16),
        "negative_shape": _st_bytes({"a": dict(a, shape=[-1, -16])}, b"\0" * 16),
        "unknown_dtype": _st_bytes({"a": dict(a, dtype="OBJECT")}, b"\0" * 16),
        "overlapping": _st_bytes({"a": a, "b": dict(a, data_offsets=[8, 24])}, b"\0" * 24),
        "duplicate_keys": (lambda h: struct.pack("<Q", len(h)) + h + b"\0" * 16)(
            b'{"a":' + json.dumps(a).encode() + b',"a":' + json.dumps(a).encode() + b"}"
        ),
        "control_chars_in_name": _st_bytes({"a\n\x1b[31mred": a}, b"\0" * 16),
    }
    for name, data in hostile.items():
        d = c.entry_dir("safetensors", f"hostile_{name}")
        (d / "w.safetensors").write_bytes(data)
        c.add("safetensors", f"hostile_{name}", "hostile", ["w.safetensors"], _imp("w.safetensors"))


def build_npz(c: Corpus) -> None:
    rng = np.random.default_rng(7)
    arrays = {
        "dense/kernel": rng.standard_normal((6, 4)).astype(np.float32),
        "dense/bias": rng.standard_normal(4).astype(np.float32),
        "steps": np.arange(3, dtype=np.int64),
    }
    for name, saver in (("plain", np.savez), ("compressed", np.savez_compressed)):
        d = c.entry_dir("npz", name)
        buf = io.BytesIO()
        saver(buf, **arrays)
        (d / "w.npz").write_bytes(_zip_fixed_dates(buf.getvalue()))
        c.add("npz", name, "seed", ["w.npz"], _imp("w.npz"))

    def npy(arr: np.ndarray) -> bytes:
        b = io.BytesIO()
        np.save(b, arr)
        return b.getvalue()

    def z(name: str, members: list[tuple[str, bytes]], bomb: tuple[str, int] | None = None) -> None:
        d = c.entry_dir("npz", f"hostile_{name}")
        with zipfile.ZipFile(d / "w.npz", "w", zipfile.ZIP_DEFLATED) as zf:
            for n, b in members:
                zf.writestr(zipfile.ZipInfo(n, (2000, 1, 1, 0, 0, 0)), b)
            if bomb:
                # a consistent .npy header for the bomb's element count, then 1 GiB of zeros
                h = {"descr": "<f4", "fortran_order": False, "shape": (bomb[1] // 4,)}
                text = repr(h).encode()
                pad = 64 - (10 + len(text) + 1) % 64
                header = (
                    b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text) + pad + 1) + text + b" " * pad + b"\n"
                )
                _bomb_member(zf, bomb[0], bomb[1] + len(header), header)
        c.add("npz", f"hostile_{name}", "hostile", ["w.npz"], _imp("w.npz"))

    ok = npy(np.ones(3, np.float32))
    c.guarded("npz zip_bomb", lambda: z("zip_bomb", [("a.npy", ok)], bomb=("bomb.npy", 1 << 30)))
    evil_pickle = b"cbuiltins\nopen\n(VPWNED\nVw\ntR."
    h = repr({"descr": "|O", "fortran_order": False, "shape": (1,)}).encode()
    pad = 64 - (10 + len(h) + 1) % 64
    obj_npy = (
        b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h) + pad + 1) + h + b" " * pad + b"\n" + evil_pickle
    )
    z("object_pickle", [("a.npy", ok), ("evil.npy", obj_npy)])
    z("traversal_name", [("../../canary.npy", ok), ("/abs/x.npy", ok)])
    huge = npy(np.ones(1, np.float32)).replace(b"(1,)", b"(4000000000, 4000000000)")
    z("huge_shape", [("a.npy", huge)])
    z("not_npy", [("a.npy", b"\x93NUMPY\x09\x00" + b"\xff" * 64)])
    z("many_members", [(f"m{i}.npy", ok) for i in range(20000)])


def _zip_fixed_dates(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            zi = zipfile.ZipInfo(info.filename, (2000, 1, 1, 0, 0, 0))
            zi.compress_type = info.compress_type
            dst.writestr(zi, src.read(info))
    return out.getvalue()


def build_tf_checkpoint(c: Corpus) -> None:
    mod = _load_test_module("tests/formats/test_tf_checkpoint.py", "_fuzz_tf_checkpoint")
    tensors = mod._tensors(4)
    for name, kw in (("plain", {}), ("snappy", {"snappy": True}), ("big_endian", {"big_endian": True})):
        d = c.entry_dir("tf-checkpoint", name)
        mod.write_checkpoint(d / "ckpt", tensors, **kw)
        files = ["ckpt.index", "ckpt.data-00000-of-00001"]
        c.add("tf-checkpoint", name, "seed", files, _imp(*files))
    P = mod.PROTOS
    header = P["BundleHeaderProto"](num_shards=1, endianness=0)

    def ckpt(name: str, entries: list[tuple[bytes, bytes]], data: bytes = b"\0" * 64, hdr=header) -> None:
        d = c.entry_dir("tf-checkpoint", f"hostile_{name}")
        mod.write_table(d / "ckpt.index", [(b"", hdr.SerializeToString()), *entries])
        (d / "ckpt.data-00000-of-00001").write_bytes(data)
        files = ["ckpt.index", "ckpt.data-00000-of-00001"]
        c.add("tf-checkpoint", f"hostile_{name}", "hostile", files, _imp(*files))

    def entry(**kw) -> bytes:
        shape = kw.pop("shape", [4])
        e = P["BundleEntryProto"](dtype=kw.pop("dtype", 1), **kw)
        for s in shape:
            e.shape.dim.add(size=s)
        return e.SerializeToString()

    ckpt("offset_beyond_shard", [(b"w", entry(offset=1 << 40, size=16))])
    ckpt("size_huge", [(b"w", entry(offset=0, size=1 << 62, shape=[1 << 60]))])
    ckpt("shape_overflow", [(b"w", entry(offset=0, size=16, shape=[1 << 40, 1 << 40, 1 << 40]))])
    ckpt("negative_dim", [(b"w", entry(offset=0, size=16, shape=[-4]))])
    ckpt("shard_id_out_of_range", [(b"w", entry(offset=0, size=16, shard_id=7))])
    ckpt("many_shards", [(b"w", entry(offset=0, size=16))], hdr=P["BundleHeaderProto"](num_shards=1 << 30))
    ckpt("string_dtype", [(b"w", entry(offset=0, size=16, dtype=7))])
    ckpt("name_control_chars", [(b"w\n\x1b[2J", entry(offset=0, size=16))])
    # a snappy block whose declared uncompressed length is 2**32
    d = c.entry_dir("tf-checkpoint", "hostile_snappy_declares_4g")
    mod.write_checkpoint(d / "ckpt", mod._tensors(1), snappy=True)
    idx = bytearray((d / "ckpt.index").read_bytes())
    idx[0:5] = b"\x80\x80\x80\x80\x10"  # varint 2**32 as the first block's uncompressed length
    (d / "ckpt.index").write_bytes(bytes(idx))
    files = ["ckpt.index", "ckpt.data-00000-of-00001"]
    c.add("tf-checkpoint", "hostile_snappy_declares_4g", "hostile", files, _imp(*files))


def _resign(bundle: Path) -> None:
    """Rewrite the manifest's size and sha256 of every listed file that exists (after a mutation)."""
    m = json.loads((bundle / "manifest.json").read_text())
    for rel, meta in m.get("files", {}).items():
        f = bundle / rel
        if f.is_file():
            meta["bytes"] = f.stat().st_size
            meta["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(m, sort_keys=True, indent=1))


def build_bundle(c: Corpus) -> None:
    from mconv.cli.app import app

    d = c.entry_dir("bundle", "digits_cpu")
    try:
        app(
            ["export", str(_digits_onnx()), "-o", str(d / "bundle"), "--target", "cpu", "--quiet"],
            standalone_mode=False,
        )
    except SystemExit:
        pass
    man = json.loads((d / "bundle" / "manifest.json").read_text())
    spec = man["inputs"][0]
    shape = [int(s) if isinstance(s, int) else 1 for s in spec["shape"]]
    np.save(d / "x.npy", np.random.default_rng(8).standard_normal(shape).astype(spec.get("dtype", "float32")))
    files = ["bundle/" + p.name for p in sorted((d / "bundle").iterdir())]
    mutate = [i for i, f in enumerate(files) if f.endswith(("manifest.json", "weights.mcw", "model.onnx"))]
    inspect_argv = ["inspect", "{D}/bundle", "--json"]
    run_argv = ["run", "{D}/bundle", "-i", f"{spec['name']}={{D}}/x.npy", "-o", "{D}/out/y.npz", "--json"]
    c.add("bundle", "digits_cpu_inspect", "seed", files, inspect_argv, mutate=mutate, resign=True)
    c.entries[-1]["dir"] = "seeds/bundle__digits_cpu"
    c.add("bundle", "digits_cpu_run", "seed", files + ["x.npy"], run_argv, mutate=mutate, resign=True)
    c.entries[-1]["dir"] = "seeds/bundle__digits_cpu"

    canary_abs = str(c.root / "cases" / "canary")
    canary = (c.root / "cases" / "canary").read_bytes()

    def hostile(name: str, edit, argv=None) -> None:
        hd = c.entry_dir("bundle", f"hostile_{name}")
        shutil.copytree(d / "bundle", hd / "bundle")
        shutil.copyfile(d / "x.npy", hd / "x.npy")
        edit(hd / "bundle")
        hfiles = ["bundle/" + p.name for p in sorted((hd / "bundle").iterdir())]
        c.add("bundle", f"hostile_{name}", "hostile", hfiles, argv or run_argv)

    def listed(rel: str, data: bytes | None = None):
        def edit(b: Path) -> None:
            m = json.loads((b / "manifest.json").read_text())
            blob = canary if data is None else data
            m["files"][rel] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            (b / "manifest.json").write_text(json.dumps(m))

        return edit

    hostile("files_dotdot", listed("../../canary"), inspect_argv)
    hostile("files_absolute", listed(canary_abs), inspect_argv)

    def weights_dotdot(b: Path) -> None:  # the container named by a path outside the bundle
        m = json.loads((b / "manifest.json").read_text())
        text = json.dumps(m).replace('"weights.mcw"', '"../../canary"')
        (b / "manifest.json").write_text(text)

    hostile("weights_path_dotdot", weights_dotdot)

    def symlink_weights(b: Path) -> None:
        (b / "weights.mcw").unlink()
        os.symlink("../../canary", b / "weights.mcw")
        m = json.loads((b / "manifest.json").read_text())
        m["files"]["weights.mcw"] = {"bytes": len(canary), "sha256": hashlib.sha256(canary).hexdigest()}
        (b / "manifest.json").write_text(json.dumps(m))

    hostile("weights_symlink_outside", symlink_weights)

    def nested(b: Path) -> None:
        (b / "manifest.json").write_text('{"files":' + "[" * 100000 + "]" * 100000 + "}")

    hostile("nested_manifest", nested, inspect_argv)

    def huge_shape(b: Path) -> None:
        m = json.loads((b / "manifest.json").read_text())
        for w in m.get("weights", []):
            w["shape"] = [1 << 40, 1 << 40]
        (b / "manifest.json").write_text(json.dumps(m))

    hostile("manifest_huge_shape", huge_shape, inspect_argv)

    def mcw_index(edit_index):
        def edit(b: Path) -> None:
            raw = (b / "weights.mcw").read_bytes()
            magic, version, n = struct.unpack_from("<4sIQ", raw, 0)
            index = json.loads(raw[16 : 16 + n])
            edit_index(index)
            new = json.dumps(index).encode()
            body = raw[16 + n :]
            (b / "weights.mcw").write_bytes(struct.pack("<4sIQ", magic, version, len(new)) + new + body)
            _resign(b)

        return edit

    def first_record(index):
        # the index is a mapping or a list of records; find the first dict with "offset"/"shape"
        stack = [index]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                if "shape" in v:
                    return v
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
        return {}

    hostile("mcw_offset_huge", mcw_index(lambda ix: first_record(ix).update(offset=1 << 60)))
    hostile("mcw_shape_huge", mcw_index(lambda ix: first_record(ix).update(shape=[1 << 31, 1 << 31])))
    hostile("mcw_nested_index", mcw_index(lambda ix: first_record(ix).update(codec=[[[[[]]]]] * 3)))

    def mcw_index_len_huge(b: Path) -> None:
        raw = bytearray((b / "weights.mcw").read_bytes())
        struct.pack_into("<Q", raw, 8, 1 << 62)
        (b / "weights.mcw").write_bytes(bytes(raw))
        _resign(b)

    hostile("mcw_index_len_huge", mcw_index_len_huge)

    def zip_bundle() -> None:
        hd = c.entry_dir("bundle", "zip_seed")
        with zipfile.ZipFile(hd / "b.zip", "w", zipfile.ZIP_DEFLATED) as zf:
            for p in sorted((d / "bundle").iterdir()):
                zf.writestr(zipfile.ZipInfo(f"bundle/{p.name}", (2000, 1, 1, 0, 0, 0)), p.read_bytes())
        c.add("bundle", "zip_seed", "seed", ["b.zip"], ["inspect", "{D}/b.zip", "--json"])
        hd = c.entry_dir("bundle", "hostile_zip_bomb")
        with zipfile.ZipFile(hd / "b.zip", "w", zipfile.ZIP_DEFLATED) as zf:
            for p in sorted((d / "bundle").iterdir()):
                if p.name != "weights.mcw":
                    zf.writestr(zipfile.ZipInfo(f"bundle/{p.name}", (2000, 1, 1, 0, 0, 0)), p.read_bytes())
            _bomb_member(zf, "bundle/weights.mcw", 1 << 30, (d / "bundle" / "weights.mcw").read_bytes())
        c.add("bundle", "hostile_zip_bomb", "hostile", ["b.zip"], ["inspect", "{D}/b.zip", "--json"])
        hd = c.entry_dir("bundle", "hostile_zip_traversal")
        with zipfile.ZipFile(hd / "b.zip", "w") as zf:
            for p in sorted((d / "bundle").iterdir()):
                zf.writestr(zipfile.ZipInfo(f"bundle/{p.name}", (2000, 1, 1, 0, 0, 0)), p.read_bytes())
            zf.writestr(zipfile.ZipInfo("bundle/../../../PWNED", (2000, 1, 1, 0, 0, 0)), b"x")
        c.add(
            "bundle",
            "hostile_zip_traversal",
            "hostile",
            ["b.zip"],
            ["run", "{D}/b.zip", "-i", f"{spec['name']}={{D}}/x.npy", "--json"],
        )
        shutil.copyfile(d / "x.npy", hd / "x.npy")

    c.guarded("bundle zip", zip_bundle)


BUILDERS = {
    "onnx": [build_onnx, build_onnx_hostile],
    "keras": [build_keras, build_keras_hostile],
    "keras-zip": [build_keras_zip, build_keras_zip_hostile],
    "caffe": [build_caffe],
    "tflite": [build_tflite, build_tflite_hostile],
    "torch": [build_torch],
    "dlk-json": [build_dlk],
    "safetensors": [build_safetensors],
    "npz": [build_npz],
    "tf-checkpoint": [build_tf_checkpoint],
    "bundle": [build_bundle],
    **fuzz_surfaces.BUILDERS,
}
# table name -> builder group
FORMATS = {
    "onnx": "onnx",
    "onnx-extdata": "onnx",
    "keras-h5": "keras",
    "keras-json": "keras",
    "keras-zip": "keras-zip",
    "caffe": "caffe",
    "tflite": "tflite",
    "torch": "torch",
    "dlk-json": "dlk-json",
    "safetensors": "safetensors",
    "npz": "npz",
    "tf-checkpoint": "tf-checkpoint",
    "bundle": "bundle",
    **{name: name for name in fuzz_surfaces.BUILDERS},
}


def build(root: Path, seed: int, formats: list[str]) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    block = canary_block(seed)
    plant_canaries(root, block)
    c = Corpus(root, seed)
    groups = []
    for f in formats:
        g = FORMATS[f]
        if g not in groups:
            groups.append(g)
    for g in groups:
        for fn in BUILDERS[g]:
            c.guarded(fn.__name__, lambda fn=fn: fn(c))
    entries = [e for e in c.entries if e["format"] in formats]
    for e in entries:
        base = root / e["dir"]
        e["sha256"] = {
            f: hashlib.sha256((base / f).read_bytes()).hexdigest()
            for f in e["files"]
            if (base / f).is_file() and not (base / f).is_symlink()
        }
    doc = {"seed": seed, "canary_hex": block.hex(), "entries": entries, "builder_failures": c.failures}
    (root / "corpus.json").write_text(json.dumps(doc, indent=1))
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    a = ap.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    doc = build(a.root, a.seed, [f for f in a.formats.split(",") if f])
    for f in doc["builder_failures"]:
        print(f"corpus builder failed: {f}", file=sys.stderr)
    print(f"{len(doc['entries'])} corpus entries in {a.root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
