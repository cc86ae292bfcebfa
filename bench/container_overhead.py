"""Issue 14 item 5: the container's own bytes (header, index, padding) against its encoded tensors.

For each model a cpu bundle is exported through the CLI; the same tensors and codec records are
then written again as a version 1 (JSON index, 64-byte alignment) container for comparison. The
budget: overhead <= max(2% of the encoded tensors, 512 B).

    python bench/container_overhead.py [--out DIR]

Models: the digits MLP (fixtures/digits_mlp.onnx, deep-compression recipe first, as P3 does),
hello_world_int8.tflite and person_detect.tflite from /work/shared/models/tflite when present.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from mconv.api.demo import fixture_path
from mconv.container import read_container, write_container

TFLITE = Path("/work/shared/models/tflite")


def mconv(*args: str) -> None:
    subprocess.run(["mconv", *args], check=True, capture_output=True)


def measure(name: str, model: Path, work: Path) -> None:
    bundle = work / f"{name}.bundle"
    mconv("export", str(model), "--target", "cpu", "-o", str(bundle))
    mcw = bundle / "weights.mcw"
    with read_container(mcw) as c:
        entries = list(c.entries.values())
        tensors = [(e.name, c.array(e.name), _spec(e.record)) for e in entries]
    blobs = sum(e.nbytes for e in entries)
    v1 = write_container(work / f"{name}.v1.mcw", tensors, version=1)
    total = mcw.stat().st_size
    budget = max(512, 0.02 * blobs)
    manifest = (bundle / "manifest.json").stat().st_size
    print(
        f"{name:24s} tensors {len(entries):3d}  encoded {blobs:9,d} B  "
        f"v1 overhead {v1.total_bytes - v1.blob_bytes:7,d} B  v2 overhead {total - blobs:6,d} B  "
        f"budget {budget:8,.0f} B  {'ok' if total - blobs <= budget else 'OVER'}  manifest.json {manifest:,d} B"
    )


def _spec(record: dict) -> dict:
    keep = ("codec", "bits", "index_bits", "values", "huffman", "groups", "codebook_dtype")
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
        for tfl in ("hello_world_int8.tflite", "person_detect.tflite"):
            if (TFLITE / tfl).is_file():
                onnx_path = work / f"{tfl}.onnx"
                mconv("import", str(TFLITE / tfl), "-o", str(onnx_path))
                measure(tfl, onnx_path, work)


if __name__ == "__main__":
    main()
