"""Entropy-constrained clustering (cluster method="entropy", passes/cluster.py rule 10) against
plain k-means on the Caffe LeNet-5, through the CLI: import, ``optimize --passes
"prune(...),cluster(...)"``, ``export --target cpu``; bytes are the bundle's ``weights.mcw`` as
written, accuracy ONNX Runtime's on the 5,000 real MNIST digits of mnist5k.npz (from MNIST's
training split: the post-training comparison needs no held-out split, nothing is trained).

    python3 bench/ecsq_lenet.py [--shared ../shared] [--sparsity 0.9]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def mconv(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "mconv", *args], check=True, capture_output=True)


def accuracy(model: Path, x: np.ndarray, y: np.ndarray) -> float:
    import onnxruntime as ort

    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    out = np.concatenate([s.run(None, {name: x[i : i + 500]})[0] for i in range(0, len(x), 500)])
    return float(np.mean(out.argmax(1) == y))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.environ.get("MCONV_SHARED", "../shared"))
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument(
        "--rows",
        default="kmeans:3,kmeans:4,kmeans:5,entropy:4:0.003,entropy:5:0.002,entropy:5:0.001,entropy:6:0.001",
    )
    a = ap.parse_args()
    shared = Path(a.shared)
    with np.load(shared / "data" / "mnist5k.npz") as z:
        x = (z["images"].astype(np.float32) / 256.0)[:, None]
        y = z["labels"]
    caffe = shared / "models" / "caffe"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        mconv(
            "import",
            str(caffe / "lenet.prototxt"),
            str(caffe / "lenet_iter_10000.caffemodel"),
            "-o",
            str(t / "lenet.onnx"),
        )
        print(f"original: accuracy {accuracy(t / 'lenet.onnx', x, y):.4f}")
        print("| passes | weights.mcw B | accuracy (5,000 digits) |\n|---|---|---|")
        for row in a.rows.split(","):
            parts = row.split(":")
            cl = (
                f"cluster(bits={parts[1]})"
                if parts[0] == "kmeans"
                else f"cluster(bits={parts[1]},method='entropy',lam={parts[2]})"
            )
            spec = f"prune(sparsity={a.sparsity}),{cl},round-fp16(compressed=True)"
            out, bundle = t / f"{len(os.listdir(t))}.onnx", t / f"b{len(os.listdir(t))}"
            mconv("optimize", str(t / "lenet.onnx"), "--passes", spec, "-o", str(out))
            mconv("export", str(out), "--target", "cpu", "-o", str(bundle))
            print(
                f"| `{spec}` | {(bundle / 'weights.mcw').stat().st_size:,} | {accuracy(out, x, y):.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
