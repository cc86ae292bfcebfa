"""AlexNet speed: mconv's reference executor against onnxruntime and onnx.reference.

The ``light_bvlc_alexnet`` model shipped with onnx builds its weights with ConstantOfShape nodes;
this script replaces them by random normal initializers (std 0.01, biases 0.1 so ReLUs stay
alive), then times, in one process and on the same 1x3x224x224 input:

* mconv forward (``Executor.run``),
* onnxruntime forward (CPU provider, default threads),
* onnx.reference.ReferenceEvaluator forward,
* mconv forward + backward (``Executor.value_and_grad`` of ``sum(prob**2)`` with respect to
  every weight and bias).

It prints medians and the ratios mconv/ORT and onnx.reference/mconv (targets: <= 3 and >= 10).

    python bench/alexnet_speed.py [--repeat 10] [--profile]

OpenBLAS: on machines where OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set (see the environment
notes), numpy's BLAS is forced onto a slow generic kernel; unset both in the benchmark command
only, e.g. ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/alexnet_speed.py``.
The script prints which BLAS kernel it runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnx
from onnx import helper


def alexnet_with_random_weights(seed: int = 0, drop_dropout: bool = False) -> onnx.ModelProto:
    """The light AlexNet with its ConstantOfShape-built weights folded and filled with random
    values: N(0, 0.01) weights, biases 0.1.

    ``drop_dropout`` removes the (inference-mode, hence identity) Dropout nodes, for an executor
    that lacks the op.
    """
    from mconv.fixtures.light import light_model
    from mconv.irio import to_proto
    from mconv.passes import parse_spec, run_pipeline

    def fill(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        if name.endswith("_b_0"):
            return np.full(shape, 0.1, np.float32)
        return rng.normal(0.0, 0.01, shape).astype(np.float32)

    model = light_model("bvlc_alexnet", fill, seed)
    if drop_dropout:
        model, _ = run_pipeline(model, parse_spec("eliminate-identity"))
    return to_proto(model)


def time_runs(fn, repeat: int, warmup: int = 1) -> tuple[float, float]:
    """Median and best wall time of ``repeat`` calls (best is the figure least hurt by other load)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def blas_description() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} threads={i.get('num_threads')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--reference-repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print time per op type for mconv")
    parser.add_argument(
        "--ort-threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default, all cores)"
    )
    args = parser.parse_args()

    import onnx_ir as ir
    import onnxruntime as ort
    from mconv.engines.reference.executor import Executor
    from mconv.engines.reference.ops import lookup
    from onnx.reference import ReferenceEvaluator

    proto = alexnet_with_random_weights(drop_dropout=lookup("Dropout") is None)
    if lookup("Dropout") is None:
        print("note: Dropout is not registered yet; its (identity) nodes are bypassed")
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    feeds = {"data_0": x}
    print(
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '<unset>')} "
        f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '<unset>')}"
    )
    print(f"BLAS: {blas_description()}")

    executor = Executor(ir.from_proto(proto))
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.ort_threads
    sess = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    reference = ReferenceEvaluator(proto)

    # With std-0.01 weights the softmax is nearly flat, so compare the logits (r24), not prob.
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    probe.graph.output.append(helper.make_empty_tensor_value_info("r24"))
    logits_ort = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["r24"], feeds
    )[0]
    logits_mconv = executor.run(feeds, outputs=["r24"])["r24"]
    rel = np.abs(logits_mconv - logits_ort).max() / np.abs(logits_ort).max()
    print(f"logits: max |mconv - ORT| / max |ORT| = {rel:.2e}")
    assert rel < 1e-4, "mconv and onnxruntime disagree on AlexNet's logits"

    t_mconv = time_runs(lambda: executor.run(feeds), args.repeat)
    t_ort = time_runs(lambda: sess.run(None, feeds), args.repeat)
    t_ref = time_runs(lambda: reference.run(None, feeds), args.reference_repeat, warmup=0)

    wrt = [i.name for i in proto.graph.initializer if i.name.endswith(("_w_0", "_b_0"))]

    def loss(outs: dict) -> tuple[float, dict]:
        p = outs["prob_1"]
        return float(np.sum(p.astype(np.float64) ** 2)), {"prob_1": 2 * p}

    t_grad = time_runs(lambda: executor.value_and_grad(feeds, loss, wrt), max(3, args.repeat // 2))

    print(f"{'':24s} {'median ms':>10s} {'best ms':>10s}")
    for label, (med, best) in (
        ("mconv forward", t_mconv),
        ("onnxruntime forward", t_ort),
        ("onnx.reference forward", t_ref),
        (f"mconv fwd+bwd ({len(wrt)} grads)", t_grad),
    ):
        print(f"{label:24s} {med * 1e3:10.1f} {best * 1e3:10.1f}")
    print(
        f"mconv / ORT            median {t_mconv[0] / t_ort[0]:6.2f}x  best {t_mconv[1] / t_ort[1]:6.2f}x  (target <= 3)"
    )
    print(
        f"onnx.reference / mconv median {t_ref[0] / t_mconv[0]:6.1f}x  best {t_ref[1] / t_mconv[1]:6.1f}x  (target >= 10)"
    )

    if args.profile:
        profile_ops(executor, feeds, loss, wrt)


def profile_ops(executor, feeds: dict, loss, wrt: list[str], repeat: int = 3) -> None:
    """Best time per op type, forward and VJP, by wrapping the kernels of the executor's plan."""
    import dataclasses

    totals: dict[str, list[float]] = {}

    def wrap(fn, key):
        def timed(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            totals.setdefault(key, []).append(time.perf_counter() - t0)
            return out

        return timed

    steps = executor.plan.steps
    originals = [s.opdef for s in steps]
    for s, od in zip(steps, originals):
        vjp = None if od.vjp is None else wrap(od.vjp, f"{s.op_type} vjp")
        s.opdef = dataclasses.replace(od, forward=wrap(od.forward, f"{s.op_type} fwd"), vjp=vjp)
    per_run: dict[str, list[float]] = {}
    try:
        for _ in range(repeat):
            totals.clear()
            executor.value_and_grad(feeds, loss, wrt)
            for k, v in totals.items():
                per_run.setdefault(k, []).append(sum(v))
    finally:
        for s, od in zip(steps, originals):
            s.opdef = od
    print("per op type, best of runs (forward+backward pass):")
    for k, v in sorted(per_run.items(), key=lambda kv: -min(kv[1])):
        print(f"  {k:20s} {min(v) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
