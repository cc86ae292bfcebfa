"""P1: AlexNet through Deep Compression: bundle size per layer beside the paper's Table 4.

Architecture: onnx's ``light_bvlc_alexnet.onnx`` (61M parameters, 244 MB of float32). Its weights
are ConstantOfShape placeholders; they are replaced by trained-like values: per layer, Student-t
with 3 degrees of freedom (heavy tails, as trained AlexNet weights have; roughly Laplacian in the
body) scaled to the He std sqrt(2 / fan_in); biases N(0, 0.01). Random weights are not trained
ones: the kept fractions and bit widths are the paper's, but the Huffman gains depend on the
real post-training distribution. With i.i.d. weights the kept positions are uniformly random,
the worst case for index coding (about 4.8 bits of position entropy per kept weight at 9%
density, where the paper's trained fc6 needed 3.2).

Relative indices: the recipe uses the widths of the paper's section 2 (8 bits for conv, 5 for
fc); Table 4 lists 4 bits. The script also prints what 4-bit indices everywhere would give,
sized with ``mconv.codecs.predict_bytes`` (exact) on the same tensors.

Then the same code path as a user: ``mconv optimize --recipe
examples/recipes/alexnet-deep-compression.toml`` (no fine-tuning data) and ``mconv export
--target cpu``, through subprocesses; the table is read from the bundle manifest's ``account``.
Budget: weights.mcw <= 6.9 MB (the paper's 6.9 MB), aim <= 6.0 MB.

    python bench/alexnet_size.py [--workdir /tmp/alexnet_dc] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "recipes" / "alexnet-deep-compression.toml"
LAYERS = ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"]
# Han et al. 2016, Table 4: weights kept (P), weight bits (P+Q), weight bits (P+Q+H), index bits
# (P+Q), index bits (P+Q+H), compression rate (P+Q), compression rate (P+Q+H).
PAPER = {
    "conv1": (84, 8, 6.3, 4, 1.2, 32.6, 20.53),
    "conv2": (38, 8, 5.5, 4, 2.3, 14.5, 9.43),
    "conv3": (35, 8, 5.1, 4, 2.6, 13.1, 8.44),
    "conv4": (37, 8, 5.2, 4, 2.5, 14.1, 9.11),
    "conv5": (37, 8, 5.6, 4, 2.5, 14.0, 9.43),
    "fc6": (9, 5, 3.9, 4, 3.2, 3.0, 2.39),
    "fc7": (9, 5, 3.6, 4, 3.7, 3.0, 2.46),
    "fc8": (25, 5, 4.0, 4, 3.2, 7.3, 5.85),
    "total": (11, 5.4, None, 4, 3.2, 3.7, 2.88),
}
BUDGET_MB, AIM_MB = 6.9, 6.0


def make_alexnet(path: Path, seed: int = 0) -> Path:
    """light_bvlc_alexnet with trained-like weights as initializers (see the module doc)."""
    from mconv.fixtures.light import light_model
    from mconv.irio import save_onnx

    def trained_like(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        if name.endswith("_w_0"):
            fan_in = int(np.prod(shape[1:]))
            t = rng.standard_t(3, size=shape) / np.sqrt(3.0)
            return (t * np.sqrt(2.0 / fan_in)).astype(np.float32)
        return (rng.standard_normal(shape) * 0.01).astype(np.float32)

    save_onnx(light_model("bvlc_alexnet", trained_like, seed), path, external_threshold=1 << 40)
    return path


def four_bit(model_path: Path, rows: dict) -> int:
    """Bytes of the compressed weight tensors with index_bits=4 (else the same choice rules)."""
    from mconv.account import choose_compressed_spec
    from mconv.codecs import predict_bytes

    model = onnx.load(model_path)
    total = 0
    for init in model.graph.initializer:
        if init.name in rows and init.name.endswith("_w_0"):
            a = numpy_helper.to_array(init)
            bits = 8 if init.name.startswith("conv") else 5
            total += predict_bytes(a, choose_compressed_spec(a, {"bits": bits, "index_bits": 4}))
    return total


def entropy_bound(model_path: Path) -> tuple[int, int, int]:
    """Bytes below which no lossless code of the compressed weights can go, for i.i.d. weights:
    per weight tensor log2 C(n, kept) for the kept positions (all placements of ``kept`` among
    ``n`` equally likely, as for i.i.d. magnitudes) plus the zero-order entropy of the kept
    values (i.i.d. cluster indices); biases counted at their fp16 size. Returns (positions,
    values, biases)."""
    from math import lgamma, log

    from mconv.irio import load_onnx

    positions = values = biases = 0.0
    for name, value in load_onnx(model_path).graph.initializers.items():
        a = value.const_value.numpy().ravel()
        if not name.endswith("_w_0"):
            biases += 2 * a.size
            continue
        nz = a[a != 0]
        n, k = a.size, nz.size
        positions += (lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1)) / log(2) / 8
        counts = np.unique(nz, return_counts=True)[1]
        values += float(-(counts * np.log2(counts / k)).sum()) / 8
    return round(positions), round(values), round(biases)


def stream_bound(mcw: Path) -> dict[str, int]:
    """Issue 14 item 6: the entropy-coded streams of a container (sparse gaps, palette indices of
    ungrouped palettes) against the zero-order bound of the symbols they hold, with what
    canonical Huffman and rANS take for the same histograms (both exact, from the counts).
    Returns byte totals: ``bound``, ``stored`` (the streams as written), ``huffman``, ``rans``."""
    from mconv.codecs import huffman, rans
    from mconv.codecs.palette import distinct_values, palette_indices
    from mconv.codecs.sparse import relative_entries
    from mconv.container import read_container

    out = dict.fromkeys(("bound", "stored", "huffman", "rans"), 0)
    with read_container(mcw) as c:
        for name, e in c.entries.items():
            rec = e.record
            if not (rec.get("huffman") or rec.get("rans")) or rec.get("groups", 1) != 1:
                continue
            flat = c.array(name).ravel()
            streams: list[tuple[str, np.ndarray, int]] = []
            if rec["codec"] == "sparse":
                gaps, values, _ = relative_entries(flat, rec["index_bits"])
                streams.append(("gaps", gaps, rec["index_bits"]))
                if rec.get("values") == "palette":
                    streams.append(("indices", palette_indices(values, distinct_values(values)), rec["bits"]))
            elif rec["codec"] == "palette":
                streams.append(("indices", palette_indices(flat, distinct_values(flat)), rec["bits"]))
            for stream, symbols, bits in streams:
                counts = np.bincount(symbols, minlength=1 << bits)
                used = counts[counts > 0]
                out["bound"] += round(float(-(used * np.log2(used / used.sum())).sum()) / 8)
                out["stored"] += rec["streams"][stream]
                out["huffman"] += huffman.encoded_nbytes(counts)
                out["rans"] += rans.encoded_nbytes(counts)
    return out


def mconv(*args: str) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mconv", *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"mconv {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="where to write the models (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="alexnet_dc_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        src = make_alexnet(work / "alexnet.onnx")
        opt = work / "alexnet_dc.onnx"
        bundle = work / "bundle"
        if bundle.exists():
            shutil.rmtree(bundle)
        _, t_opt = mconv("optimize", str(src), "--recipe", str(RECIPE), "-o", str(opt))
        doc, t_exp = mconv("export", str(opt), "--target", "cpu", "-o", str(bundle))
        account = doc["account"]
        mcw = (bundle / "weights.mcw").stat().st_size
        print("AlexNet (light_bvlc_alexnet architecture; i.i.d. Student-t(3) weights at He std)")
        print(f"optimize {t_opt:.1f} s, export {t_exp:.1f} s (wall, subprocesses)")
        print()
        head = (
            f"{'layer':7s} {'tensor':10s} {'kept%':>6s} {'paper':>6s} {'w bits':>6s} {'paper':>5s} "
            f"{'idx':>4s} {'eff bits/w':>10s} {'codec':>26s} {'bytes':>11s} {'rate%':>6s} {'paper P+Q+H':>11s}"
        )
        print(head)
        print("-" * len(head))
        rows = {r["name"]: r for r in account["layers"]}
        for layer in LAYERS:
            r = rows.get(f"{layer}_w_0")
            if r is None:
                continue
            p = PAPER[layer]
            nonzero = max(r["kept"] * r["elements"], 1)
            print(
                f"{layer:7s} {r['name']:10s} {100 * r['kept']:6.1f} {p[0]:6d} {r['weight_bits']:6d} {p[1]:5} "
                f"{str(r['index_bits'] or '-'):>4s} {8 * r['bytes'] / nonzero:10.2f} {r['codec']:>26s} "
                f"{r['bytes']:11,d} {100 * r['bytes'] / r['original_bytes']:6.2f} {p[6]:11.2f}"
            )
        weights_only = [r for n, r in rows.items() if n.endswith("_w_0")]
        w_bytes = sum(r["bytes"] for r in weights_only)
        w_orig = sum(r["original_bytes"] for r in weights_only)
        kept = sum(r["kept"] * r["elements"] for r in weights_only) / sum(r["elements"] for r in weights_only)
        print("-" * len(head))
        print(
            f"{'weights':18s} {100 * kept:6.1f} {PAPER['total'][0]:6d} {'':>20s}"
            f"{'':>26s} {w_bytes:11,d} {100 * w_bytes / w_orig:6.2f} {PAPER['total'][6]:11.2f}"
        )
        tot = account["total"]
        print(
            f"all tensors (biases too): {tot['bytes']:,} bytes of {tot['original_bytes']:,} "
            f"({tot['original_bytes'] / tot['bytes']:.1f}x); predicted {tot['predicted_bytes']:,}"
        )
        print(
            f"weights.mcw file: {mcw:,} bytes = {mcw / 1e6:.2f} MB ({w_orig / 1e6:.1f} MB dense float32 weights)"
        )
        verdict = "PASS" if mcw / 1e6 <= BUDGET_MB else "FAIL"
        print(
            f"budget <= {BUDGET_MB} MB: {verdict}; aim <= {AIM_MB} MB: {'met' if mcw / 1e6 <= AIM_MB else 'not met'}"
        )
        print(
            f"with 4-bit relative indices everywhere (Table 4's column): {four_bit(opt, rows) / 1e6:.2f} MB of weights"
        )
        pos, val, bias = entropy_bound(opt)
        print(
            f"entropy bound of these tensors (log2 C(n, kept) positions {pos:,} B + kept values' entropy "
            f"{val:,} B + fp16 biases {bias:,} B): {(pos + val + bias) / 1e6:.2f} MB; weights.mcw is "
            f"{100 * (mcw / (pos + val + bias) - 1):.1f}% above it"
        )
        sb = stream_bound(bundle / "weights.mcw")
        if sb["bound"]:
            print(
                f"entropy-coded streams (gaps, palette indices): stored {sb['stored']:,} B; their symbols' "
                f"zero-order bound {sb['bound']:,} B; canonical Huffman would take {sb['huffman']:,} B "
                f"({100 * (sb['huffman'] / sb['bound'] - 1):+.2f}%), rANS {sb['rans']:,} B "
                f"({100 * (sb['rans'] / sb['bound'] - 1):+.2f}%), stored {100 * (sb['stored'] / sb['bound'] - 1):+.2f}%"
            )
        print("paper: AlexNet 240 MB -> 6.9 MB (35x); pruning 9x, + quantization 27x, + Huffman 35x")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
