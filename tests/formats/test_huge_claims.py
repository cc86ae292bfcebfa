"""Shape claims bigger than the file (TFLite, Caffe, DLK JSON, TF checkpoints): a tensor that
declares 2**40 or 2**62 elements, a product past int64, a negative dimension or zero elements
with data is one ``error:`` line and exit 2 before anything is allocated; under a 2 GiB
address-space limit there is no MemoryError, no exit 3 and no traceback. An input shape is not
an allocation: the import succeeds, and ``run`` / ``verify`` with random inputs refuse to draw
more than their limit. The streamed blockwise pass bounds its block as the graph pass does."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_tf_checkpoint import PROTOS, write_table  # noqa: E402
from tflite_builder import TflBuilder  # noqa: E402

LIMIT = 2 << 30  # bytes of address space the child may use


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _mconv(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mconv", *map(str, args)],
        capture_output=True,
        text=True,
        preexec_fn=_limit,
        timeout=300,
        cwd=cwd,
    )


def _refused(r: subprocess.CompletedProcess, *words: str) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    assert "memory this process may use ran out" not in lines[0], lines[0]  # refused, not attempted
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _import_refused(tmp_path: Path, *paths: Path, words: tuple[str, ...] = ()) -> str:
    out = tmp_path / "out.onnx"
    r = _mconv("import", *paths, "-o", out, cwd=tmp_path)
    line = _refused(r, *words)
    assert not out.exists()
    return line


# --- TFLite: shapes are int32, so the claims are products of int32 dimensions ------------------

BIG = 2**31 - 1
TFL_CLAIMS = {
    "2**40": [2**20, 2**20],
    "2**62": [BIG, BIG],
    "overflow": [BIG, BIG, BIG, BIG],
    "negative": [-4, 4],
    "zero-with-data": [0, 4],
}


def _tfl_fc(weight_shape: list[int]) -> bytes:
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    w = b.tensor("w", weight_shape, data=np.ones(16, np.float32))  # 64 bytes in the file
    y = b.tensor("y", [1, 4])
    b.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    return b.build([x], [y])


@pytest.mark.parametrize("shape", TFL_CLAIMS.values(), ids=TFL_CLAIMS.keys())
def test_tflite_constant_claiming_more_than_its_buffer(tmp_path, shape):
    p = tmp_path / "m.tflite"
    p.write_bytes(_tfl_fc(shape))
    _import_refused(tmp_path, p, words=("m.tflite", "tensor 'w'"))


@pytest.mark.parametrize("shape", [[2**16, 2**15], [2**20, 2**10], [BIG, 3]], ids=["2**31", "2**30", "6e9"])
def test_tflite_variable_tensor_with_no_bytes_is_not_made_of_zeros(tmp_path, shape):
    # A variable tensor (an LSTM's state) without data starts at zero: the importer would make
    # those zeros. A shape far beyond the file's size is refused instead.
    b = TflBuilder()
    x = b.tensor("x", [1, 4])
    v = b.tensor("state", shape, variable=True)
    y = b.tensor("y", shape)
    b.op("ADD", [x, v], [y], "AddOptions")
    p = tmp_path / "m.tflite"
    p.write_bytes(b.build([x], [y]))
    _import_refused(tmp_path, p, words=("m.tflite", "'state'"))


def test_tflite_sparse_tensor_densifying_to_far_more_than_the_file(tmp_path):
    # One stored value, two CSR levels: dense it would be a [2**15, 2**15] float32 (4 GiB).
    n = 2**15
    sparsity = {"order": [0, 1], "dims": [("csr", [0, 1], [0]), ("csr", [0, 1], [0])]}
    b = TflBuilder()
    w = b.tensor("w", [n, n], data=np.ones(1, np.float32), sparsity=sparsity)
    x = b.tensor("x", [1, n])
    y = b.tensor("y", [1, n])
    b.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    p = tmp_path / "m.tflite"
    p.write_bytes(b.build([x], [y]))
    _import_refused(tmp_path, p, words=("m.tflite", "'w'"))


def test_tflite_sparse_dense_level_walking_more_entries_than_the_file(tmp_path):
    # A dense level of 2**15 then another: the walk would list 2**30 positions before any
    # CSR level could shrink them.
    n = 2**15
    sparsity = {"order": [0, 1], "dims": [("dense", n), ("dense", n)]}
    b = TflBuilder()
    w = b.tensor("w", [n, n], data=np.ones(1, np.float32), sparsity=sparsity)
    x = b.tensor("x", [1, n])
    y = b.tensor("y", [1, n])
    b.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    p = tmp_path / "m.tflite"
    p.write_bytes(b.build([x], [y]))
    _import_refused(tmp_path, p, words=("m.tflite", "'w'"))


# --- Caffe: a .caffemodel's blobs, a prototxt's Input / DummyData shapes -----------------------

CAFFE_CLAIMS = {
    "2**40": [2**20, 2**20],
    "2**62": [2**62],
    "overflow": [2**62, 2**62, 2**62],
    "negative": [-4, 4],
    "zero-with-data": [0, 4],
}
PROTO = (
    'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4 } } }\n'
    'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
    "inner_product_param { num_output: 4 } }\n"
)


def _caffemodel(path: Path, weight_dims: list[int]) -> Path:
    from mconv.formats.caffe import make_blob, parse_prototxt, write_caffemodel

    net = parse_prototxt(PROTO)
    ip = net.layer[1]
    blob = make_blob(np.ones(16, np.float32))
    del blob.shape.dim[:]
    blob.shape.dim.extend(weight_dims)
    ip.blobs.append(blob)
    ip.blobs.append(make_blob(np.zeros(4, np.float32)))
    return write_caffemodel(net, path)


@pytest.mark.parametrize("dims", CAFFE_CLAIMS.values(), ids=CAFFE_CLAIMS.keys())
def test_caffemodel_blob_claiming_more_than_its_data(tmp_path, dims):
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(PROTO)
    model = _caffemodel(tmp_path / "w.caffemodel", dims)
    _import_refused(tmp_path, proto, model, words=("w.caffemodel", "'ip'"))
    _import_refused(tmp_path, model, words=("w.caffemodel", "'ip'"))  # the caffemodel alone


def test_caffemodel_legacy_blob_dims_claiming_more_than_its_data(tmp_path):
    from mconv.formats.caffe import make_blob, parse_prototxt, write_caffemodel

    net = parse_prototxt(PROTO)
    blob = make_blob(np.ones(16, np.float32))
    blob.ClearField("shape")
    blob.num, blob.channels, blob.height, blob.width = 2**30, 2**30, 2**30, 2**30  # int32 fields
    net.layer[1].blobs.append(blob)
    model = write_caffemodel(net, tmp_path / "w.caffemodel")
    _import_refused(tmp_path, model, words=("w.caffemodel", "'ip'"))


INPUT_CLAIMS = {
    "2**40": [2**34, 64],
    "2**62": [2**62],
    "overflow": [2**62, 2**62],
    "negative": [1, -4],
    "zero": [0, 4],
}


@pytest.mark.parametrize("dims", INPUT_CLAIMS.values(), ids=INPUT_CLAIMS.keys())
@pytest.mark.parametrize("layer", ["Input", "DummyData", "net input_shape"])
def test_caffe_input_shape_beyond_caffes_own_count_limit(tmp_path, layer, dims):
    # Caffe counts a blob's elements in an int32: an input above 2**31 is no Caffe net.
    shape = "shape { " + " ".join(f"dim: {d}" for d in dims) + " }"
    head = {
        "Input": f'layer {{ name: "data" type: "Input" top: "data" input_param {{ {shape} }} }}\n',
        "DummyData": f'layer {{ name: "data" type: "DummyData" top: "data" dummy_data_param {{ {shape} }} }}\n',
        "net input_shape": f'input: "data"\ninput_{shape}\n',
    }[layer]
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(head + 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n')
    _import_refused(tmp_path, proto, words=("deploy.prototxt", "'data'"))


# --- DLK JSON: the same net as JSON --------------------------------------------------------------

DLK_CLAIMS = {**CAFFE_CLAIMS, "past-int64": [2**64, 2]}


def _dlk(blob_dims: list[int], input_dims: list[int] | None = None) -> dict:
    return {
        "input": ["data"],
        "input_shape": [{"dim": input_dims or [1, 1, 3, 3]}],
        "layer": [
            {
                "name": "conv1",
                "type": "Convolution",
                "convolution_param": {"num_output": 1, "kernel_size": 3},
                "blobs": [
                    {"shape": {"dim": blob_dims}, "data": [1.0] * 9},
                    {"shape": {"dim": [1]}, "data": [0.0]},
                ],
            }
        ],
    }


@pytest.mark.parametrize("dims", DLK_CLAIMS.values(), ids=DLK_CLAIMS.keys())
def test_dlk_json_blob_claiming_more_than_its_data(tmp_path, dims):
    p = tmp_path / "net.json"
    p.write_text(json.dumps(_dlk(dims)))
    _import_refused(tmp_path, p, words=("net.json",))


@pytest.mark.parametrize("dims", [*INPUT_CLAIMS.values(), [2**64, 1]], ids=[*INPUT_CLAIMS, "past-int64"])
def test_dlk_json_input_shape_claims(tmp_path, dims):
    p = tmp_path / "net.json"
    p.write_text(json.dumps(_dlk([1, 1, 3, 3], dims)))
    _import_refused(tmp_path, p, words=("net.json",))


# --- TF checkpoints: the index's shapes against the data shard's bytes ---------------------------

CKPT_CLAIMS = {
    "2**40": ([2**40], 16),
    "2**62": ([2**62], 16),
    "overflow": ([2**62, 2**62], 16),
    "product-wraps-to-16": ([2**62 + 1, 4], 16),  # the float32 bytes wrap modulo 2**64 to 16
    "negative": ([-4, 4], 16),
    "zero-with-data": ([0, 4], 16),
    "zero-past-int64": ([0, 2**62, 2**62], 0),
}


def _checkpoint(prefix: Path, dims: list[int], size: int) -> Path:
    header = PROTOS["BundleHeaderProto"](num_shards=1, endianness=0)
    header.version.producer = 1
    entry = PROTOS["BundleEntryProto"](dtype=1, shard_id=0, offset=0, size=size)
    for d in dims:
        entry.shape.dim.add(size=d)
    write_table(
        Path(f"{prefix}.index"), [(b"", header.SerializeToString()), (b"w", entry.SerializeToString())]
    )
    Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(16))
    return Path(f"{prefix}.index")


@pytest.mark.parametrize("claim", CKPT_CLAIMS.values(), ids=CKPT_CLAIMS.keys())
def test_tf_checkpoint_shape_claiming_more_than_its_bytes(tmp_path, claim):
    dims, size = claim
    index = _checkpoint(tmp_path / "ckpt", dims, size)
    _import_refused(tmp_path, index, words=("ckpt.index", "'w'"))


# --- an input shape is no allocation; random inputs are bounded ----------------------------------


def _relu_onnx(path: Path, dims: list) -> Path:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize(
    "dims", [[2**40, 64], [2**62, 2**62], ["N", 2**40]], ids=["2**46", "2**124", "N-x-2**40"]
)
def test_random_inputs_for_a_huge_declared_input_are_refused(tmp_path, dims):
    model = _relu_onnx(tmp_path / "m.onnx", dims)
    for cmd in (["run", model], ["verify", model, model]):
        line = _refused(_mconv(*cmd, cwd=tmp_path), "'x'")
        assert "random input" in line, line


def test_tflite_huge_input_imports_and_random_inputs_are_refused(tmp_path):
    b = TflBuilder()
    x = b.tensor("x", [2**15, 2**15])  # 2**30 float32 values (4 GiB): a shape, not an allocation
    y = b.tensor("y", [2**15, 2**15])
    b.op("RELU", [x], [y])
    src = tmp_path / "m.tflite"
    src.write_bytes(b.build([x], [y]))
    r = _mconv("import", src, "-o", tmp_path / "m.onnx", cwd=tmp_path)
    assert r.returncode == 0 and "error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    for cmd in (["run", src], ["run", tmp_path / "m.onnx"], ["verify", src, tmp_path / "m.onnx"]):
        line = _refused(_mconv(*cmd, cwd=tmp_path), "'x'")
        assert "random input" in line, line


def test_negative_input_shape_option_is_refused_for_random_inputs(tmp_path):
    model = _relu_onnx(tmp_path / "m.onnx", ["N", 4])
    _refused(_mconv("run", model, "--input-shape", "x=1,-4", cwd=tmp_path), "x=1,-4")


# --- the streamed blockwise pass bounds its block by the rows ------------------------------------


@pytest.mark.parametrize("block", [2**40, 2**62, 256])
def test_streamed_blockwise_block_longer_than_twice_a_row_is_refused(tmp_path, block):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    src = tmp_path / "w.safetensors"
    save_file({"w": rng.standard_normal((64, 64)).astype(np.float32)}, str(src))
    before = src.read_bytes()
    out = tmp_path / "o.safetensors"
    r = _mconv(
        "optimize",
        src,
        "--passes",
        f"blockwise(bits=4, block={block}, min_elements=16)",
        "-o",
        out,
        cwd=tmp_path,
    )
    _refused(r, "block")
    assert not out.exists() and src.read_bytes() == before


def test_streamed_blockwise_block_up_to_twice_a_row_is_kept(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    src = tmp_path / "w.safetensors"
    save_file({"w": rng.standard_normal((8, 64)).astype(np.float32)}, str(src))
    out = tmp_path / "o.safetensors"
    r = _mconv(
        "optimize", src, "--passes", "blockwise(bits=4, block=128, min_elements=16)", "-o", out, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.is_file()
