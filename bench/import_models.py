"""Import every model in ../shared/models and check it against an oracle; prints a markdown table.

Per model: format, import time, peak RSS of the importing process (each import runs in its own
subprocess; the child's own peak RSS (VmHWM), and the part above the child's RSS after ``import mconv``),
and the max abs difference against the oracle:

- TFLite: the ai-edge-litert interpreter (float outputs: absolute; int8 outputs: in output codes),
  3 random feeds, through ONNX Runtime and the reference executor (the worse of the two).
- Keras: Keras 3 rebuilding the Keras 2 layer chain (tests/formats/test_keras.py's oracle).
- Caffe: no Caffe here; LeNet-5's accuracy on the UCI digits (mconv.datasets.digits_as_mnist).

Usage: python bench/import_models.py [SHARED_DIR]
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _hwm_kb() -> int:
    """Peak RSS of this process in KiB. Linux's VmHWM belongs to the address space, so it starts
    afresh at exec; ``ru_maxrss`` would carry over the (larger) parent's peak through fork+exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child(out: str, paths: list[str]) -> None:
    """Runs in the subprocess: import one model, save it, report time and memory as JSON."""
    import mconv.formats  # noqa: F401
    from mconv.formats import import_model
    from mconv.irio import save_onnx

    base = _hwm_kb()
    t0 = time.perf_counter()
    model = import_model(paths)
    dt = time.perf_counter() - t0
    peak = _hwm_kb()
    save_onnx(model, out)
    print(json.dumps({"seconds": dt, "peak_kb": peak, "base_kb": base, "nodes": len(list(model.graph))}))


def _import(paths: list[Path]) -> tuple[dict, Path]:
    out = Path(tempfile.mkdtemp(prefix="mconv-bench-")) / "model.onnx"
    res = subprocess.run(
        [sys.executable, __file__, "--child", str(out), *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr else "import failed")
    return json.loads(res.stdout.strip().splitlines()[-1]), out


def _ort(path: Path, feeds: list[np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), feeds, strict=True)})


def _ref(path: Path, feeds: list[np.ndarray]) -> list[np.ndarray]:
    from mconv.engines.reference.executor import Executor
    from mconv.irio import load_onnx

    model = load_onnx(path)
    ex = Executor(model)
    return [np.asarray(v) for v in ex.run(dict(zip(ex.input_names, feeds, strict=True))).values()]


def _load_test_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "formats" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "tests" / "formats"))
    spec.loader.exec_module(mod)
    return mod


def _tflite_diff(src: Path, onnx_path: Path) -> str:
    t = _load_test_module("test_tflite")
    data = t._oracle_bytes(src)
    worst, quant = 0.0, False
    for seed in range(3):
        feeds = t._shared_feeds(data, seed)
        want = t._litert(data, feeds)
        for got in (_ort(onnx_path, feeds), _ref(onnx_path, feeds)):
            for g, w in zip(got, want, strict=True):
                quant = quant or w.dtype != np.float32
                worst = max(worst, float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max()))
    return f"{worst:.0f} codes (litert)" if quant else f"{worst:.2e} (litert)"


def _keras_diff(paths: list[Path], onnx_path: Path) -> str:
    import h5py

    k = _load_test_module("test_keras")
    first = paths[0]
    with h5py.File(paths[-1], "r") as f:
        if len(paths) == 1:
            config, group = json.loads(f.attrs["model_config"]), f["model_weights"]
        else:
            config, group = json.loads(first.read_text()), f
        oracle = k.keras3_oracle(config, group)
    x = np.random.default_rng(7).normal(0, 1, size=(4, *oracle.inputs[0].shape[1:])).astype(np.float32)
    want = np.asarray(oracle(x, training=False))
    worst = max(float(np.abs(g - want).max()) for g in (_ort(onnx_path, [x])[0], _ref(onnx_path, [x])[0]))
    return f"{worst:.2e} (Keras 3)"


def _caffe_accuracy(shared: Path, onnx_path: Path) -> str:
    from mconv.datasets import digits_as_mnist

    digits = np.load(shared / "data" / "digits.npz")
    x, labels = digits_as_mnist(digits["images"]), digits["labels"]
    prob = _ort(onnx_path, [x])[0]
    return f"accuracy {(prob.argmax(axis=1) == labels).mean():.4f} on {len(labels)} UCI digits"


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        _child(argv[1], argv[2:])
        return 0
    shared = Path(argv[0]) if argv else Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))
    models = shared / "models"
    keras_dir = models / "keras"
    cases: list[tuple[str, list[Path]]] = [
        ("caffe", [models / "caffe" / "lenet.prototxt", models / "caffe" / "lenet_iter_10000.caffemodel"])
    ]
    for js in sorted(keras_dir.glob("*.json")):
        cases.append(("keras", [js, keras_dir / f"{js.stem}_weights.h5"]))
    cases.append(("keras", [keras_dir / "keras_3layer.h5"]))
    cases.append(
        ("keras", [keras_dir / "KERAS_3layer.json", keras_dir / "KERAS_3layer_95pruned_retrained_weights.h5"])
    )
    cases += [("tflite", [p]) for p in sorted((models / "tflite").glob("*.tflite"))]
    print("| model | format | nodes | import s | peak RSS MB | above baseline MB | vs oracle |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for fmt, paths in cases:
        label = " + ".join(p.name for p in paths)
        try:
            stats, onnx_path = _import(paths)
        except RuntimeError as exc:
            print(f"| {label} | {fmt} | - | - | - | - | import failed: {exc} |")
            continue
        try:
            if fmt == "tflite":
                check = _tflite_diff(paths[0], onnx_path)
            elif fmt == "keras":
                check = _keras_diff(paths, onnx_path)
            else:
                check = _caffe_accuracy(shared, onnx_path)
        except Exception as exc:  # a benchmark row, not a crash: report what failed
            check = f"oracle failed: {type(exc).__name__}: {str(exc)[:80]}"
        print(
            f"| {label} | {fmt} | {stats['nodes']} | {stats['seconds']:.3f} | {stats['peak_kb'] / 1024:.0f} | "
            f"{(stats['peak_kb'] - stats['base_kb']) / 1024:.1f} | {check} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
