"""The webgpu bundle's web page: mcw.js decodes weights.mcw bit for bit as the Python decoder
does (under node), and index.html runs the model with the browser's WebGPU in headless Chromium
(SwiftShader's Vulkan), outputs compared with the reference executor, a screenshot in tmp_path.

Every model and container is built here. A page without a WebGPU adapter skips with the exact
reason the page reports; a missing Chromium or node skips with that reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from mconv.container import read_container, write_container
from mconv.errors import InputError
from mconv.targets import get_target
from mconv.targets.webgpu import browser

sys.path.insert(0, str(Path(__file__).parents[1] / "metal"))
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))
from _gates import assert_close  # noqa: E402
from _system import can_install_system_packages  # noqa: E402
from metal_models import mobilenet_style  # noqa: E402

NODE = shutil.which("node")
MCW_JS = browser.WEB / "mcw.js"


# -- mcw.js against the Python decoder (node) ---------------------------------------------------


def _node_decode(path: Path, tmp_path: Path) -> dict:
    """{name: hex of the decoded elements} or {name: {"error": message}} from mcw.js."""
    script = tmp_path / "decode.mjs"
    script.write_text(
        f"""
import {{ readFileSync }} from "node:fs";
import {{ webcrypto }} from "node:crypto";
globalThis.crypto ??= webcrypto; // node 18 has no global WebCrypto
import {{ readContainer }} from {json.dumps(MCW_JS.as_uri())};
const out = {{}};
let c;
try {{
  const b = readFileSync(process.argv[2]);
  c = readContainer(b.buffer.slice(b.byteOffset, b.byteOffset + b.length), process.argv[2]);
}} catch (e) {{
  console.log(JSON.stringify({{"__container__": {{ error: e.message, kind: e.constructor.name }} }}));
  process.exit(0);
}}
for (const name of c.entries.keys()) {{
  try {{
    await c.checkSha256(name);
    out[name] = Buffer.from(c.tensorBytes(name)).toString("hex");
    out[name + "#f32"] = Buffer.from(c.float32(name).buffer).toString("hex");
  }} catch (e) {{ out[name] = {{ error: e.message, kind: e.constructor.name }}; }}
}}
console.log(JSON.stringify(out));
"""
    )
    got = subprocess.run([NODE, str(script), str(path)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    return json.loads(got.stdout)


def _codec_zoo(seed: int) -> list[tuple[str, np.ndarray, dict]]:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((7, 5, 3)).astype(np.float32)
    dense.ravel()[:3] = [0.0, -0.0, 6.5e-8]  # signed zero and a float16 subnormal survive
    halfable = rng.standard_normal((33,)).astype(np.float16).astype(np.float32)
    book = (rng.standard_normal(11) * 0.1).astype(np.float32)
    clustered = rng.choice(book, size=(9, 4, 3)).astype(np.float32)
    halfbook = rng.choice(book.astype(np.float16).astype(np.float32), size=(10, 6))
    pruned = clustered.copy()
    pruned[rng.random(pruned.shape) < 0.8] = 0.0
    pruned.ravel()[-1] = 0.0
    very_sparse = np.zeros(600, np.float32)
    very_sparse[[3, 250, 599]] = [1.5, -2.25, 0.125]  # gaps beyond 2**index_bits: fillers
    f16_tensor = rng.standard_normal((4, 4)).astype(np.float16)
    # per-block palettes (palette rule 7): 8 values per block of 16, a shorter last block
    per_block = rng.standard_normal((13, 8)).astype(np.float32)
    blocky = per_block[np.arange(208) // 16, rng.integers(0, 8, 208)][:200].reshape(8, 25)
    blocky.ravel()[::7] = -0.0
    blocky_half = blocky.astype(np.float16)
    # grouped palettes along axis 1 and 3 (palette rule 5): groups of columns, not dividing them
    col_books = rng.standard_normal((3, 6)).astype(np.float32)
    cols = np.repeat(np.arange(3), [4, 3, 3])
    axis1 = col_books[cols[None, :], rng.integers(0, 6, (9, 10))]
    axis1[::4, ::3] = -0.0
    last_books = rng.standard_normal((4, 5)).astype(np.float16)
    axis3 = last_books[
        np.repeat(np.arange(4), [3, 3, 3, 2])[None, None, None, :], rng.integers(0, 5, (2, 3, 4, 11))
    ]
    return [
        ("raw", dense, {"codec": "raw"}),
        ("raw_f16_dtype", f16_tensor, {"codec": "raw"}),
        ("fp16", halfable, {"codec": "fp16"}),
        ("palette4", clustered, {"codec": "palette", "bits": 4}),
        ("palette_f16book", halfbook, {"codec": "palette"}),
        ("palette_f32book", clustered, {"codec": "palette", "codebook_dtype": "float32"}),
        ("palette_groups_huff", clustered, {"codec": "palette", "bits": 5, "groups": 4, "huffman": True}),
        ("sparse_raw", pruned, {"codec": "sparse", "index_bits": 3, "values": "raw"}),
        (
            "sparse_fp16_huff",
            pruned,
            {"codec": "sparse", "index_bits": 4, "values": "palette", "huffman": True},
        ),
        (
            "sparse_fillers",
            very_sparse,
            {"codec": "sparse", "index_bits": 5, "values": "fp16", "huffman": True},
        ),
        ("sparse_palette", pruned, {"codec": "sparse", "index_bits": 2, "values": "palette", "bits": 4}),
        ("empty", np.zeros((0, 3), np.float32), {"codec": "raw"}),
        ("palette_groups_rans", clustered, {"codec": "palette", "bits": 5, "groups": 4, "rans": True}),
        ("sparse_rans", very_sparse, {"codec": "sparse", "index_bits": 5, "values": "fp16", "rans": True}),
        (
            "sparse_palette_rans",
            pruned,
            {"codec": "sparse", "index_bits": 3, "values": "palette", "rans": True},
        ),
        ("empty_rans", np.zeros((0, 3), np.float32), {"codec": "palette", "rans": True}),
        ("palette_block", blocky, {"codec": "palette", "block": 16}),
        ("palette_block_f32book", blocky, {"codec": "palette", "block": 16, "codebook_dtype": "float32"}),
        ("palette_block_huff", blocky, {"codec": "palette", "block": 16, "bits": 4, "huffman": True}),
        ("palette_block_rans", blocky_half, {"codec": "palette", "block": 16, "rans": True}),
        ("palette_block_one", blocky[:2], {"codec": "palette", "block": 1}),
        ("palette_block_whole", blocky, {"codec": "palette", "block": 10**6, "huffman": True}),
        ("palette_block_empty", np.zeros((0, 4), np.float32), {"codec": "palette", "block": 16}),
        ("palette_axis1", axis1, {"codec": "palette", "groups": 3, "axis": 1}),
        (
            "palette_axis1_f32book",
            axis1,
            {"codec": "palette", "groups": 3, "axis": 1, "codebook_dtype": "float32"},
        ),
        (
            "palette_axis1_huff",
            axis1,
            {"codec": "palette", "groups": 3, "axis": 1, "bits": 4, "huffman": True},
        ),
        ("palette_axis3_rans", axis3, {"codec": "palette", "groups": 4, "axis": 3, "rans": True}),
        ("palette_axis2_ones", axis3, {"codec": "palette", "groups": 4, "axis": 2}),
        ("palette_axis_empty", np.zeros((0, 6), np.float32), {"codec": "palette", "groups": 3, "axis": 1}),
    ]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_mcw_js_decodes_every_codec_bit_for_bit(tmp_path):
    tensors = _codec_zoo(0)
    path = tmp_path / "zoo.mcw"
    write_container(path, tensors)
    got = _node_decode(path, tmp_path)
    with read_container(path) as c:
        for name, array, spec in tensors:
            assert c.record(name)["codec"] == spec["codec"]
            want = c.array(name)
            assert want.dtype == array.dtype and want.tobytes() == np.ascontiguousarray(array).tobytes()
            assert (
                got[name] == np.ascontiguousarray(want).astype(want.dtype.newbyteorder("<")).tobytes().hex()
            ), name
            as_f32 = np.ascontiguousarray(want, dtype=np.float32)
            assert got[name + "#f32"] == as_f32.tobytes().hex(), name
    # one Huffman stream long enough for several sync chunks
    rng = np.random.default_rng(1)
    long = rng.choice(np.array([0.5, -0.25, 1.0, 2.0], np.float32), size=20000, p=[0.7, 0.2, 0.05, 0.05])
    path2 = tmp_path / "long.mcw"
    write_container(path2, [("long", long, {"codec": "palette", "huffman": True})])
    got2 = _node_decode(path2, tmp_path)
    assert got2["long"] == long.tobytes().hex()
    # rANS streams of three lanes and of nine (a partial last step)
    wide = rng.choice(np.array([0.5, -0.25, 1.0, 2.0, 0.0], np.float32), size=(70, 999))
    path3 = tmp_path / "rans.mcw"
    specs = [
        ("long", long, {"codec": "palette", "rans": True}),
        ("wide", wide, {"codec": "palette", "rans": True}),
    ]
    write_container(path3, specs)
    got3 = _node_decode(path3, tmp_path)
    assert got3["long"] == long.tobytes().hex() and got3["wide"] == wide.tobytes().hex()


def _damage(path: Path, out: Path, at: int, data: bytes) -> Path:
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_mcw_js_refuses_damaged_containers(tmp_path):
    rng = np.random.default_rng(2)
    book = np.array([0.5, -0.25, 1.0, 2.0], np.float32)
    arr = rng.choice(book, size=5000)
    path = tmp_path / "w.mcw"
    info = write_container(path, [("w.conv", arr, {"codec": "palette", "huffman": True})])
    entry = info.entry("w.conv")
    # the Huffman payload flipped: the sha256 check names the tensor and the offset
    bad = _damage(path, tmp_path / "flip.mcw", entry.offset + entry.nbytes - 3, b"\xff\x00\xff")
    got = _node_decode(bad, tmp_path)["w.conv"]
    assert got["kind"] == "McwError" and "sha256 mismatch" in got["error"]
    assert "w.conv" in got["error"] and str(entry.offset) in got["error"] and "flip.mcw" in got["error"]
    # a header whose index runs past the file
    short = tmp_path / "short.mcw"
    short.write_bytes(path.read_bytes()[:40])
    got = _node_decode(short, tmp_path)["__container__"]
    assert got["kind"] == "McwError" and "runs past the end" in got["error"] and "short.mcw" in got["error"]
    # bad magic
    got = _node_decode(_damage(path, tmp_path / "magic.mcw", 0, b"XXXX"), tmp_path)["__container__"]
    assert "bad magic" in got["error"]
    # a record that no longer fits its blob (bits 2 -> 3, same index length): the codec's
    # bounded reader says so, in Python and in JS alike
    packed = tmp_path / "packed.mcw"
    write_container(packed, [("cut", arr, {"codec": "palette", "bits": 2})])
    raw = packed.read_bytes()
    assert raw.count(b'"bits":2') == 1
    cut = tmp_path / "cut.mcw"
    cut.write_bytes(raw.replace(b'"bits":2', b'"bits":3'))
    with read_container(cut) as c, pytest.raises(InputError, match="truncated") as exc:
        c.array("cut")
    assert "cut.mcw" in exc.value.line()
    got = _node_decode(cut, tmp_path)["cut"]
    assert got["kind"] == "McwError" and "truncated" in got["error"] and "'cut'" in got["error"]
    assert "cut.mcw" in got["error"]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_mcw_js_refuses_damaged_block_records_like_python(tmp_path):
    """A per-block palette record whose block or groups no longer fit the tensor: mcw.js throws
    McwError as Python raises InputError; with "block" renamed (a decoder that ignores it) the
    19 groups of a 10-row tensor are refused too."""
    rng = np.random.default_rng(4)
    books = rng.standard_normal((19, 5)).astype(np.float32)
    w = books[np.arange(304) // 16, rng.integers(0, 5, 304)][:300].reshape(10, 30)
    path = tmp_path / "block.mcw"
    write_container(path, [("b", w, {"codec": "palette", "block": 16, "rans": True})])
    raw = path.read_bytes()
    assert raw.count(b'"block":16') == 1 and raw.count(b'"groups":19') == 1
    assert _node_decode(path, tmp_path)["b"] == w.tobytes().hex()
    for old, new in [
        (b'"block":16', b'"block":15'),
        (b'"block":16', b'"block":99'),
        (b'"groups":19', b'"groups":18'),
        (b'"block":16', b'"blocc":16'),
        (b'"block":16', b'"block":-1'),
    ]:
        bad = tmp_path / "bad.mcw"
        bad.write_bytes(raw.replace(old, new))
        with read_container(bad) as c, pytest.raises(InputError):
            c.array("b")
        got = _node_decode(bad, tmp_path)["b"]
        assert isinstance(got, dict) and got["kind"] == "McwError", (new, got)
        assert "groups" in got["error"] or "block" in got["error"], (new, got)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_mcw_js_refuses_damaged_axis_records_like_python(tmp_path):
    """A grouped palette record along axis 1 (palette rule 5) whose axis or groups no longer fit
    the tensor, or that also has a block: mcw.js throws McwError as Python raises InputError.
    With "axis" renamed (a decoder that predates it) the record reads as axis-0 groups: values
    come out, wrong ones, in both."""
    rng = np.random.default_rng(5)
    books = rng.standard_normal((3, 4)).astype(np.float32)
    w = books[np.repeat(np.arange(3), [2, 2, 1])[None, :], rng.integers(0, 4, (40, 5))]
    path = tmp_path / "axis.mcw"
    write_container(path, [("a", w, {"codec": "palette", "groups": 3, "axis": 1, "rans": True})])
    raw = path.read_bytes()
    assert raw.count(b'"axis":1') == 1 and raw.count(b'"groups":3') == 1 and raw.count(b'"rans":true') == 1
    assert _node_decode(path, tmp_path)["a"] == w.tobytes().hex()
    for old, new in [
        (b'"axis":1', b'"axis":2'),  # not an axis of a 2-d tensor
        (b'"groups":3', b'"groups":6'),  # more groups than the 5 columns
        (b'"groups":3', b'"groups":0'),
        (b'"rans":true', b'"block":999'),  # a block and an axis
    ]:
        bad = tmp_path / "bad.mcw"
        bad.write_bytes(raw.replace(old, new))
        with read_container(bad) as c, pytest.raises(InputError):
            c.array("a")
        got = _node_decode(bad, tmp_path)["a"]
        assert isinstance(got, dict) and got["kind"] == "McwError", (new, got)
        assert "groups" in got["error"] or "axis" in got["error"], (new, got)
    old_reader = tmp_path / "old.mcw"
    old_reader.write_bytes(raw.replace(b'"axis":1', b'"axiz":1'))
    with read_container(old_reader) as c:
        misread = c.array("a")
    assert not np.array_equal(misread, w)
    assert _node_decode(old_reader, tmp_path)["a"] == misread.tobytes().hex()


# -- the page in headless Chromium ----------------------------------------------------------------

CHROMIUM = browser.find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")


ADAPTER_TRIES = 3


def _run_page(bundle_dir: Path, feeds, **options) -> dict:
    """``browser.run_page`` in a fresh browser up to :data:`ADAPTER_TRIES` times while Chromium
    hands the page no WebGPU adapter (SwiftShader's GPU process can fail to start on a loaded
    machine). Still none: a failure where the suite installs its system packages (there Chromium
    has SwiftShader), a skip elsewhere."""
    for _ in range(ADAPTER_TRIES):
        result = browser.run_page(bundle_dir, feeds, **options)
        if not str(result.get("error", "")).startswith("no WebGPU adapter"):
            return result
    if can_install_system_packages():
        pytest.fail(f"{result['error']} in {ADAPTER_TRIES} fresh browsers")
    pytest.skip(result["error"])  # the page's own words: Chromium has no WebGPU adapter here


def _page(bundle_dir: Path, feeds, tmp_path: Path, tag: str) -> dict:
    shot = tmp_path / f"page_{tag}.png"
    result = _run_page(bundle_dir, feeds, screenshot=shot, runs=2)
    assert "error" not in result, result["error"]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert result["median_ms"] > 0 and result["layers"] >= 1
    return result


def _compare(model, result, feeds, min_cos):
    """Cosine >= ``min_cos`` and the error relative to the scale: fp32's bounds at the fp32
    cosine 0.9999, fp16's below it."""
    ref = get_target("reference").load_model(model).run(feeds)
    precision = "fp32" if min_cos >= 0.9999 else "fp16"
    cosines = {}
    for name, want in ref.items():
        got = result["outputs"][name]
        assert got.shape == want.shape, name
        cosines[name] = assert_close(want, got, precision, min_cos=min_cos, what=name).cosine
    return cosines


@needs_chromium
def test_page_runs_lenet_in_chromium(tmp_path):
    from test_webgpu import lenet  # the LeNet-5 of issue 5 (conv, LRN, pools, fused fc activations)

    model = lenet(0)
    bundle = get_target("webgpu").export(model, tmp_path / "lenet", {})
    assert {"index.html", "mconv_webgpu.js", "mcw.js"} <= set(bundle.files)
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((1, 1, 28, 28)).astype(np.float32)}
    result = _page(bundle.root, feeds, tmp_path, "lenet")
    assert result["storage"] == "f32"
    assert result["sha256_checked"] == len(bundle.weights)
    _compare(model, result, feeds, 0.9999)


@needs_chromium
def test_page_runs_pruned_clustered_mobilenet_fp16(tmp_path):
    """Clustered + pruned weights make export pick palette/sparse codecs (with Huffman where it
    pays), so the page's decoder runs on them; fp16 storage where the adapter has shader-f16."""
    model = mobilenet_style(3)
    rng = np.random.default_rng(6)
    for init in model.graph.initializers.values():
        arr = init.const_value.numpy()
        if arr.dtype == np.float32 and arr.ndim >= 2 and arr.size >= 64:
            book = np.quantile(arr, np.linspace(0.02, 0.98, 8)).astype(np.float16).astype(np.float32)
            clustered = book[np.abs(arr.ravel()[:, None] - book[None]).argmin(1)].reshape(arr.shape)
            clustered[rng.random(arr.shape) < 0.5] = 0.0
            init.const_value = ir.tensor(clustered.astype(np.float32), name=init.name)
    feeds = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    for precision, min_cos in (("fp32", 0.9999), ("fp16", 0.999)):
        bundle = get_target("webgpu").export(model, tmp_path / precision, {"precision": precision})
        codecs = {w["codec"] for w in bundle.weights}
        assert codecs & {"palette", "sparse"}, codecs
        result = _page(bundle.root, feeds, tmp_path, precision)
        _compare(model, result, feeds, min_cos)
        if precision == "fp32":
            assert result["storage"] == "f32"


def _mulberry32(seed: int, n: int) -> np.ndarray:
    """The page's default inputs (mconv_webgpu.js uniformInputs), in Python."""
    a, out, m = seed & 0xFFFFFFFF, np.empty(n, np.float32), 0xFFFFFFFF

    def imul(x: int, y: int) -> int:
        return (x * y) & m

    for i in range(n):
        a = (a + 0x6D2B79F5) & m
        t = imul(a ^ (a >> 15), a | 1)
        t ^= (t + imul(t ^ (t >> 7), t | 61)) & m
        out[i] = np.float32(((t ^ (t >> 14)) & m) / 4294967296 * 2 - 1)
    return out


@needs_chromium
def test_page_without_feed_uses_seeded_inputs(tmp_path):
    """No feed: the page draws its inputs from its seeded generator (seed 0 for the first
    input), which this test reproduces, so the outputs match the reference on those inputs."""
    from mconv.irio import load_onnx

    model = load_onnx(Path(__file__).parents[3] / "fixtures" / "digits_mlp.onnx")
    bundle = get_target("webgpu").export(model, tmp_path / "mlp", {})
    result = _page(bundle.root, None, tmp_path, "mlp")
    (spec,) = json.loads((bundle.root / "webgpu_plan.json").read_text())["inputs"]
    x = _mulberry32(0, int(np.prod(spec["shape"]))).reshape(spec["shape"])
    assert x.min() >= -1 and x.max() < 1 and x.std() > 0.5
    _compare(model, result, {spec["name"]: x}, 0.9999)


# Makes GPUAdapter.requestDevice reject the first N times on this page, as Dawn does when the GPU
# process loses its instance ("A valid external Instance reference no longer exists").
_FAIL_DEVICE = """
(() => {
  let left = %d;
  const real = GPUAdapter.prototype.requestDevice;
  GPUAdapter.prototype.requestDevice = function (...args) {
    if (left-- > 0) return Promise.reject(new DOMException(
      "A valid external Instance reference no longer exists.", "OperationError"));
    return real.apply(this, args);
  };
})();
"""


@needs_chromium
def test_page_retries_a_lost_device(tmp_path, monkeypatch):
    from mconv.irio import load_onnx

    model = load_onnx(Path(__file__).parents[3] / "fixtures" / "digits_mlp.onnx")
    bundle = get_target("webgpu").export(model, tmp_path / "mlp", {})
    rng = np.random.default_rng(8)
    (spec,) = json.loads((bundle.root / "webgpu_plan.json").read_text())["inputs"]
    feeds = {spec["name"]: rng.standard_normal(spec["shape"]).astype(np.float32)}
    result = _run_page(bundle.root, feeds, runs=1, init_script=_FAIL_DEVICE % 2)
    assert "error" not in result, result["error"]
    assert result["device_attempts"] == 3
    _compare(model, result, feeds, 0.9999)
    # every try in every browser fails: one line naming the cause, after the browser retry
    calls = []
    real_once = browser._run_page_once

    def counted(*args):
        calls.append(1)
        return real_once(*args)

    monkeypatch.setattr(browser, "_run_page_once", counted)
    failed = browser.run_page(bundle.root, feeds, runs=1, init_script=_FAIL_DEVICE % 99)
    assert len(calls) == browser.BROWSER_TRIES == 2
    assert failed == {"error": failed["error"]}
    assert failed["error"].startswith("requestDevice failed 3 times: OperationError: A valid external")


@needs_chromium
def test_page_profiles_layer_by_layer(tmp_path):
    """``profile=True`` (the page's ?profile=1): one wall time per layer of the plan, and the
    timed runs' outputs unchanged."""
    from mconv.irio import load_onnx

    model = load_onnx(Path(__file__).parents[3] / "fixtures" / "digits_mlp.onnx")
    bundle = get_target("webgpu").export(model, tmp_path / "mlp", {})
    plan = json.loads((bundle.root / "webgpu_plan.json").read_text())
    rng = np.random.default_rng(9)
    (spec,) = plan["inputs"]
    feeds = {spec["name"]: rng.standard_normal(spec["shape"]).astype(np.float32)}
    result = _run_page(bundle.root, feeds, runs=1, profile=True)
    assert "error" not in result, result["error"]
    assert len(result["layer_ms"]) == len(plan["layers"]) >= 2
    assert all(t >= 0 for t in result["layer_ms"])
    _compare(model, result, feeds, 0.9999)


def test_run_page_refuses_a_folder_that_is_not_a_bundle(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "index.html").write_text("<p>a page that is not mconv's</p>\n")
    with pytest.raises(InputError, match="not a bundle") as exc:
        browser.run_page(tmp_path / "b")
    assert str(tmp_path / "b") in exc.value.line()


def _integer_io_model():
    """x float [1, 12], k int32 [1, 12] -> y = x * float(k) (float), r = int32(x * 4)
    (truncated, int32), pos = x > 0 (bool): integer and bool I/O on the page."""
    from mconv.irio import from_proto
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "kf"], ["y"]),
            helper.make_node("Mul", ["x", "four"], ["x4"]),
            helper.make_node("Cast", ["x4"], ["r"], to=TensorProto.INT32),
            helper.make_node("Greater", ["x", "zero"], ["pos"]),
        ],
        "ints",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12]),
            helper.make_tensor_value_info("k", TensorProto.INT32, [1, 12]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12]),
            helper.make_tensor_value_info("r", TensorProto.INT32, [1, 12]),
            helper.make_tensor_value_info("pos", TensorProto.BOOL, [1, 12]),
        ],
        [
            helper.make_tensor("four", TensorProto.FLOAT, [], [4.0]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        ],
    )
    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@needs_chromium
def test_page_takes_integer_inputs_and_gives_typed_outputs(tmp_path):
    """Integer inputs from a feed and, without one, from the page's generator (0..7); integer
    and bool outputs come back in the model's types, equal to the reference executor's."""
    model = _integer_io_model()
    bundle = get_target("webgpu").export(model, tmp_path / "ints", {})
    rng = np.random.default_rng(8)
    feeds = {
        "x": rng.standard_normal((1, 12)).astype(np.float32),
        "k": rng.integers(-300, 300, (1, 12)).astype(np.int32),
    }
    for tag, given in (("ints", feeds), ("ints_default", None)):
        result = _page(bundle.root, given, tmp_path, tag)
        if given is None:  # x uniform from seed 0, k floor((u + 1) * 4) from seed 1
            plan = json.loads((bundle.root / "webgpu_plan.json").read_text())
            u = {
                s["name"]: _mulberry32(i, int(np.prod(s["shape"]))).reshape(s["shape"])
                for i, s in enumerate(plan["inputs"])
            }
            given = {"x": u["x"], "k": np.floor((u["k"].astype(np.float64) + 1) * 4).astype(np.int32)}
            assert given["k"].min() >= 0 and given["k"].max() <= 7 and len(np.unique(given["k"])) > 3
        ref = get_target("reference").load_model(model).run(given)
        assert result["outputs"]["r"].dtype == np.int32 and result["outputs"]["pos"].dtype == np.bool_
        np.testing.assert_array_equal(result["outputs"]["r"], ref["r"])
        np.testing.assert_array_equal(result["outputs"]["pos"], ref["pos"])
        np.testing.assert_allclose(result["outputs"]["y"], ref["y"], rtol=1e-6)
