"""Full-integer int8 side by side: mconv's LiteRT export vs ``onnxruntime.quantization.quantize_static``.

    python3 bench/tflite_vs_ort_quant.py [--model lenet|rapidocr-cls] [--calib 300] [--test 1000]
        [--reps 3] [--sets DIR]

``lenet``: the Caffe LeNet-5 (../shared/models/caffe) on real MNIST digits
(../shared/data/mnist5k.npz, pixels / 256 as the net was trained). ``rapidocr-cls``: PP-OCR's
text-direction classifier on bench/real_compress.py's rendered text lines (upright and turned 180
degrees, labels free; ``--sets`` is its ``--work`` folder, CAL calibrates and TEST scores). Both
quantizers calibrate on the same first ``--calib`` samples (min-max, per-channel weights), both
are scored on the same ``--test`` held-out samples
(accuracy, top-1 agreement with the float model), and both run one digit per forward pass in
their own runtime (LiteRT for the .tflite, ONNX Runtime for the QDQ model), timed whole, in one
process, as ratios to the float model in the same runtime. mconv goes through its public API
with user options (``mconv.api.export(..., "tflite", precision="int8", data=...)``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))


def _time(fn, xs: np.ndarray, reps: int) -> tuple[np.ndarray, float]:
    """Outputs of one forward pass per digit, and the best of ``reps`` passes over all (s/digit)."""
    best = float("inf")
    outs: list[np.ndarray] = []
    for _ in range(reps):
        outs = []
        t0 = time.perf_counter()
        for i in range(len(xs)):
            outs.append(fn(xs[i : i + 1]))
        best = min(best, (time.perf_counter() - t0) / len(xs))
    return np.concatenate(outs), best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calib", type=int, default=300)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default="lenet", choices=["lenet", "rapidocr-cls"])
    ap.add_argument("--sets", type=Path, default=Path("/tmp/real_compress"))
    a = ap.parse_args()

    import onnx
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter
    from mconv import api
    from mconv.formats import import_model
    from mconv.irio import to_proto
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    work = Path(tempfile.mkdtemp(prefix="tflite_vs_ort_"))
    src = work / "model.onnx"
    if a.model == "lenet":
        caffe = SHARED / "models" / "caffe"
        model = import_model([caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"])
        d = np.load(SHARED / "data" / "mnist5k.npz")
        x = d["images"][:, None].astype(np.float32) / 256
        y = d["labels"]
        calib, test = x[: a.calib], x[2000 : 2000 + a.test]
        labels = y[2000 : 2000 + a.test]
        onnx.save(to_proto(model), src)
    else:
        sys.path.insert(0, str(ROOT / "bench"))
        import real_compress as rc

        spec = rc.SPECS[a.model]
        src.write_bytes(rc.model_path(spec, a.sets).read_bytes())
        sets = rc.sets_of(spec, a.sets, 0)
        calib, test, labels = (
            sets["cal"]["x"][: a.calib],
            sets["test"]["x"][: a.test],
            sets["test"]["labels"][: a.test],
        )
    name = onnx.load(src).graph.input[0].name
    np.savez(work / "calib.npz", **{name: calib})
    shapes = {name: [1, *calib.shape[1:]]}  # one sample a forward pass, as timed

    rows = []
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    float_ort = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    ref, t_ort = _time(lambda b: float_ort.run(None, {name: b})[0], test, a.reps)

    # mconv: export through the public API, run in LiteRT
    t0 = time.perf_counter()
    api.export(src, "tflite", work / "f32", precision="fp32", input_shapes=shapes)
    t_f32_export = time.perf_counter() - t0
    t0 = time.perf_counter()
    api.export(
        src, "tflite", work / "int8", precision="int8", data=str(work / "calib.npz"), input_shapes=shapes
    )
    t_int8_export = time.perf_counter() - t0

    def litert(path: Path):
        it = Interpreter(model_path=str(path), num_threads=1)
        it.allocate_tensors()
        i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]

        def run(b):
            it.set_tensor(i, b)
            it.invoke()
            return it.get_tensor(o).copy()

        return run

    lf, t_lf = _time(litert(work / "f32" / "model.tflite"), test, a.reps)
    li, t_li = _time(litert(work / "int8" / "model.tflite"), test, a.reps)

    # ONNX Runtime's static quantizer on the same model and digits
    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{name: calib[i : i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.it, None)

    qdq = work / "model.qdq.onnx"
    t0 = time.perf_counter()
    quantize_static(
        str(src), str(qdq), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    t_ortq_export = time.perf_counter() - t0
    q_ort = ort.InferenceSession(str(qdq), so, providers=["CPUExecutionProvider"])
    oq, t_oq = _time(lambda b: q_ort.run(None, {name: b})[0], test, a.reps)

    # mconv's own static pass (QDQ for the cpu target), same digits, run by ONNX Runtime
    mq = work / "model.mconv-qdq.onnx"
    t0 = time.perf_counter()
    api.optimize(src, passes="quantize(mode=static)", data=str(work / "calib.npz"), output=mq)
    t_mq_export = time.perf_counter() - t0
    m_ort = ort.InferenceSession(str(mq), so, providers=["CPUExecutionProvider"])
    om, t_om = _time(lambda b: m_ort.run(None, {name: b})[0], test, a.reps)

    def acc(p):
        return float((p.argmax(1) == labels).mean())

    def agree(p):
        return float((p.argmax(1) == ref.argmax(1)).mean())

    size = {
        "onnx": src.stat().st_size,
        "f32": (work / "f32" / "model.tflite").stat().st_size,
        "int8": (work / "int8" / "model.tflite").stat().st_size,
        "qdq": qdq.stat().st_size,
        "mq": mq.stat().st_size,
    }
    rows = [
        ("float, ONNX Runtime", acc(ref), 1.0, size["onnx"], t_ort, t_ort / t_ort, None),
        ("mconv tflite fp32, LiteRT", acc(lf), agree(lf), size["f32"], t_lf, t_lf / t_ort, t_f32_export),
        ("mconv tflite int8, LiteRT", acc(li), agree(li), size["int8"], t_li, t_li / t_ort, t_int8_export),
        (
            "ORT quantize_static QDQ int8, ORT",
            acc(oq),
            agree(oq),
            size["qdq"],
            t_oq,
            t_oq / t_ort,
            t_ortq_export,
        ),
        (
            "mconv quantize(mode=static) QDQ int8, ORT",
            acc(om),
            agree(om),
            size["mq"],
            t_om,
            t_om / t_ort,
            t_mq_export,
        ),
    ]
    print(
        f"{a.model}, calibration {len(calib)} samples, test {len(test)} held-out samples, 1 thread, batch 1"
    )
    print(
        "| model, runtime | accuracy | top-1 agreement with float | file bytes | time / sample | vs float ORT | conversion s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ac, ag, nbytes, t, ratio, conv in rows:
        conv_s = f"{conv:.2f}" if conv is not None else "-"
        print(f"| {name} | {ac:.4f} | {ag:.4f} | {nbytes:,} | {t * 1e6:.1f} us | {ratio:.2f}x | {conv_s} |")
    print(
        f"int8 LiteRT vs ORT QDQ: {t_li / t_oq:.2f}x the time per sample, {size['int8'] / size['qdq']:.2f}x the bytes"
    )


if __name__ == "__main__":
    sys.exit(main())
