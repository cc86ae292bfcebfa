"""LLM-size weight files: streaming throughput and peak RSS, and the quantizer comparison.

    python3 bench/llm_weights.py generate [--layers 8] [--shards 2] [--pool] [--embeddings] [--out /work/cache/llm/llama-1.6b]
    python3 bench/llm_weights.py throughput [--src DIR|FILE] # baseline fp16 pass vs blockwise / cluster
    python3 bench/llm_weights.py compare                    # SNR at equal bits per weight

``generate`` writes Llama-7B-shaped layers (hidden 4096, MLP 11008; 8 layers = 1.62B parameters,
3.2 GB of fp16; 32 layers with ``--embeddings`` = Llama-2-7B's 6.74B, 13.5 GB), random normal * 0.02, as shards plus
``model.safetensors.index.json``, chunk by chunk (seeded); ``--pool`` takes each chunk as a
random slice of 2**26 normal draws (fast enough for the 13 GB file). ``throughput`` runs each
job as a whole command in a fresh process, timed from start to exit, with its own peak RSS and
CPU seconds (``os.wait4``): the baseline, a numpy script that reads every tensor and writes it
back as fp16, then ``mconv optimize SRC --passes SPEC -o OUT --json`` (the streamed path) per
scheme, each as a speed ratio to the baseline of the same run; with one ``.safetensors`` file as
SRC (``generate --shards 1``) the packed jobs write ``OUT.safetensors`` and one more job runs the
issue's own command, ``--passes "cluster(bits=4)" -o FOLDER``: a weights bundle, streamed.
``compare`` quantizes the same
tensors (one Llama q_proj- and down_proj-shaped weight, drawn with a heavy-tailed distribution
and correlated activations) with k-means palettes, RTN, HQQ and GPTQ and prints weight SNR and
output SNR at the bits per weight each costs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HIDDEN, MLP = 4096, 11008
DEFAULT = Path("/work/cache/llm/llama-1.6b")


VOCAB = 32000


def layer_shapes(layers: int, embeddings: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    out: list[tuple[str, tuple[int, ...]]] = (
        [("model.embed_tokens.weight", (VOCAB, HIDDEN))] if embeddings else []
    )
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.k_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.v_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
            (p + "mlp.gate_proj.weight", (MLP, HIDDEN)),
            (p + "mlp.up_proj.weight", (MLP, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, MLP)),
        ]
    if embeddings:
        out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def _write_shard(
    path: Path, tensors: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator, pool: np.ndarray | None
) -> None:
    header, pos = {}, 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _name, shape in tensors:
            if len(shape) == 1:
                f.write(np.ones(shape, np.float16).tobytes())
                continue
            rows_per = max(1, (8 << 20) // shape[1])
            for r in range(0, shape[0], rows_per):
                rows = min(rows_per, shape[0] - r)
                if pool is not None:  # a random slice of the pool: no normal draws per value
                    at = int(rng.integers(0, pool.size - rows * shape[1]))
                    f.write(pool[at : at + rows * shape[1]].tobytes())
                    continue
                block = rng.standard_normal((rows, shape[1]), dtype=np.float32)
                block *= 0.02
                f.write(block.astype(np.float16).tobytes())
    os.replace(tmp, path)


def generate(
    out: Path, layers: int, shards: int = 2, seed: int = 0, pool: bool = False, embeddings: bool = False
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shapes = layer_shapes(layers, embeddings)
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(1 << 26, dtype=np.float32) * 0.02).astype(np.float16) if pool else None
    per = -(-len(shapes) // shards)
    wmap = {}
    total = 0
    for s in range(shards):
        part = shapes[s * per : (s + 1) * per]
        # one shard: a single model.safetensors and no index, as single-file checkpoints ship
        name = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        _write_shard(out / name, part, rng, values)
        for t, shape in part:
            wmap[t] = name
            total += int(np.prod(shape)) * 2
        print(f"wrote {name}", flush=True)
    if shards > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=2)
        )
    print(f"{sum(int(np.prod(s)) for _, s in shapes) / 1e9:.2f}B parameters, {total / 1e9:.2f} GB in {out}")


# --- jobs run in a child ---------------------------------------------------------------------


def _baseline(src: Path, dest: Path) -> dict:
    """Read every tensor and write it back as fp16 (numpy, chunked, one output file per shard)."""
    from mconv.drivers.weights_stream import open_checkpoint

    shards, _, _ = open_checkpoint(src)
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    nbytes = 0
    for shard in shards:
        with open(shard.path, "rb") as f, open(dest / shard.path.name, "wb") as out:
            for t in shard.tensors:
                done = 0
                while done < t.nbytes:
                    n = min(16 << 20, t.nbytes - done)
                    f.seek(t.offset + done)
                    a = np.frombuffer(f.read(n), dtype=t.dtype)
                    out.write(a.astype(np.float16).tobytes())
                    done += n
                nbytes += t.nbytes
    return {"seconds": time.perf_counter() - t0, "bytes_in": nbytes}


def _child(argv: list[str]) -> None:
    src, dest = Path(argv[0]), Path(argv[1])
    result = _baseline(src, dest)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    print(json.dumps(result))


JOBS = {
    "blockwise int4 b32 sym (rtn)": "blockwise(bits=4, block=32)",
    "blockwise int4 b128 asym (rtn)": "blockwise(bits=4, block=128, sym=false)",
    "cluster(bits=4)": "cluster(bits=4)",
    "cluster(bits=4, groups=64)": "cluster(bits=4, groups=64)",
}


BUNDLE_JOB = "cluster(bits=4) into a weights bundle"


def _run(cmd: list[str]) -> tuple[float, float, str, float]:
    """Wall seconds, peak RSS (MB, this child's own), stdout and CPU seconds (user + system)
    of a whole command."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    out, err = p.stdout.read(), p.stderr.read()  # small: --json and a progress line
    # wait4: the rusage of this child alone (RUSAGE_CHILDREN is the max over all of them)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{cmd} failed: {err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, out, usage.ru_utime + usage.ru_stime


def throughput(src: Path, scratch: Path, only: list[str] | None = None) -> None:
    """Each job a whole command in a fresh process, timed from start to exit: the baseline
    script, then ``mconv optimize SRC --passes SPEC -o OUT --json`` per scheme."""
    from _startup import compile_mconv
    from mconv.drivers.weights_stream import open_checkpoint

    compile_mconv()  # as pip install does: the timed commands start from bytecode
    shards, index, _ = open_checkpoint(src)
    bytes_in = sum(t.nbytes for s in shards for t in s.tensors)
    mconv = str(Path(sys.executable).with_name("mconv"))
    rows = []
    base = None
    jobs: dict[str, str | None] = {"baseline fp16 rewrite (numpy)": None, **JOBS}
    if index is None:  # one file: the issue's own command, a folder out (a weights bundle)
        jobs[BUNDLE_JOB] = "cluster(bits=4)"
    for label, spec in jobs.items():
        if only and spec is not None and spec not in only:
            continue
        # one file in: packed safetensors to a .safetensors name, the bundle to a folder
        single = index is None and label != BUNDLE_JOB and spec is not None
        dest = scratch / ("out.safetensors" if single else "out")
        subprocess.run(["rm", "-rf", str(scratch / "out"), str(scratch / "out.safetensors")], check=True)
        if spec is None:
            cmd = [sys.executable, __file__, "_child", str(src), str(dest)]
        else:
            cmd = [mconv, "optimize", str(src), "--passes", spec, "-o", str(dest), "--json"]
        wall, rss, out, cpu = _run(cmd)
        r: dict = {"seconds": wall, "cpu_seconds": cpu, "peak_rss_mb": rss, "mb_per_s": bytes_in / 1e6 / wall}
        if spec is None:
            base = wall
            r["loop_seconds"] = json.loads(out.strip().splitlines()[-1])["seconds"]
        else:
            doc = json.loads(out)
            rep = doc["passes"][0]
            r["pass_seconds"] = rep["seconds"]
            # an all-equal tensor (a norm of ones) is stored exactly: SNR inf (or null in JSON);
            # the mean is over the tensors with a finite SNR, the exact ones counted apart
            snrs = [t["snr_db"] for t in rep["tensors"]]
            finite = [float(v) for v in snrs if v is not None and np.isfinite(float(v))]
            r["snr_db_mean"] = float(np.mean(finite)) if finite else float("nan")
            r["tensors_exact"] = len(snrs) - len(finite)
            r["bits_per_weight"] = float(np.mean([t["bits_per_weight"] for t in rep["tensors"]]))
            r["bytes_out"] = doc["file_bytes_after"]
        r["x_baseline_speed"] = base / wall if base else None
        rows.append((label, spec, r))
        print(label, json.dumps(r), flush=True)
    subprocess.run(["rm", "-rf", str(scratch / "out"), str(scratch / "out.safetensors")], check=True)
    load = os.getloadavg()
    print(f"\n{bytes_in / 1e9:.2f} GB in; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end")
    print("| job | s (whole command) | MB/s in | speed vs baseline | CPU s | peak RSS MB | bits/w | SNR dB |")
    print("|---|---|---|---|---|---|---|---|")
    for label, spec, r in rows:
        name = f'`--passes "{spec}"`' if spec else label
        if label == BUNDLE_JOB:
            name += " `-o FOLDER` (a weights bundle)"
        print(
            f"| {name} | {r['seconds']:.1f} | {r['mb_per_s']:.0f} | {r['x_baseline_speed']:.2f} | "
            f"{r['cpu_seconds']:.1f} | {r['peak_rss_mb']:.0f} | {r.get('bits_per_weight', 16):.2f} | {r.get('snr_db_mean', float('nan')):.2f} |"
        )


# --- quantizer comparison -------------------------------------------------------------------


def compare(seed: int = 0, k: int = 1024, n_out: int = 1024, samples: int = 4096) -> None:
    """SNR of weights and of outputs (X W^T) at the bits per weight each scheme costs."""
    from mconv.passes import blockwise as bw
    from mconv.passes.cluster import cluster_array

    rng = np.random.default_rng(seed)
    # Heavy-tailed weights (Student t, 5 dof) as trained LLM weights are, and activations with
    # a few outlier channels and correlations (what GPTQ's Hessian exploits).
    w = (rng.standard_t(5, size=(n_out, k)) * 0.02).astype(np.float32)
    mix = np.eye(k) + 0.2 * rng.standard_normal((k, k)) / np.sqrt(k)
    x = rng.standard_normal((samples, k)) @ mix
    x[:, rng.choice(k, 8, replace=False)] *= 10.0
    x = x.astype(np.float32)
    h = 2.0 * x.T.astype(np.float64) @ x / samples
    y = x @ w.T

    def snrs(approx: np.ndarray) -> tuple[float, float]:
        d = approx - w
        ws = 10 * np.log10(
            float((w.astype(np.float64) ** 2).sum()) / float((d.astype(np.float64) ** 2).sum())
        )
        yd = x @ d.T
        return ws, 10 * np.log10(
            float((y.astype(np.float64) ** 2).sum()) / float((yd.astype(np.float64) ** 2).sum())
        )

    rows = []
    for bits, block in ((4, 32), (4, 128), (3, 64)):
        for sym in (True, False):
            for method in ("rtn", "hqq", "gptq"):
                t0 = time.perf_counter()
                q = bw.quantize(w, bits, block, sym, method, h if method == "gptq" else None)
                dt = time.perf_counter() - t0
                rows.append(
                    (
                        f"int{bits} b{block} {'sym' if sym else 'asym'} {method}",
                        q.bits_per_weight(),
                        *snrs(q.dequantize()),
                        dt,
                    )
                )
    for bits in (3, 4):
        for groups in (1, 16, n_out):
            t0 = time.perf_counter()
            c = cluster_array(w, bits, "optimal", groups=groups)
            dt = time.perf_counter() - t0
            bpw = bits + groups * (1 << bits) * 16 / w.size
            rows.append((f"k-means {bits}-bit, {groups} palette(s)", bpw, *snrs(c), dt))
    from mconv.passes.cluster import cluster_blocks

    for bits, block in ((2, 64), (3, 128), (3, 256), (4, 256), (4, 1024)):
        t0 = time.perf_counter()
        c = cluster_blocks(w, bits, block, init="optimal")
        dt = time.perf_counter() - t0
        bpw = bits + (1 << bits) * 16 / block  # float16 palettes, as the streamed file stores them
        rows.append((f"k-means {bits}-bit optimal, a palette per {block} values", bpw, *snrs(c), dt))
    print(
        f"\nweights [{n_out}, {k}] Student-t(5)*0.02, activations {samples}x{k} correlated, 8 outlier channels"
    )
    print("| scheme | bits/weight | weight SNR dB | output SNR dB | s |")
    print("|---|---|---|---|---|")
    for name, bpw, ws, ys, dt in sorted(rows, key=lambda r: r[1]):
        print(f"| {name} | {bpw:.3f} | {ws:.2f} | {ys:.2f} | {dt:.2f} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["generate", "throughput", "compare"])
    ap.add_argument("--out", type=Path, default=DEFAULT)
    ap.add_argument("--src", type=Path, default=DEFAULT)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--embeddings", action="store_true", help="generate: add Llama's embeddings and lm_head")
    ap.add_argument(
        "--pool",
        action="store_true",
        help="generate: weights as random slices of 2**26 normal draws (fast; for the 7B file)",
    )
    ap.add_argument("--scratch", type=Path, default=Path("/work/cache/llm/scratch"))
    ap.add_argument("--only", action="append", help="throughput: this pass spec only (repeatable)")
    a = ap.parse_args()
    if a.what == "generate":
        generate(a.out, a.layers, a.shards, pool=a.pool, embeddings=a.embeddings)
    elif a.what == "throughput":
        a.scratch.mkdir(parents=True, exist_ok=True)
        throughput(a.src, a.scratch, a.only)
    else:
        compare()


if __name__ == "__main__":
    main()
