"""Reference executor speed: mconv exact and fast_math against ONNX Runtime and onnx.reference.

Three whole forward passes, each timed in one process with every runner interleaved (round r runs
each runner once, in turn), so that load from other jobs on the machine hits all of them alike:

* light AlexNet (onnx's ``light_bvlc_alexnet``, N(0, 0.01) weights, biases 0.1) at batch 1,
* the real Caffe LeNet-5 (``shared/models/caffe``) on 1,000 real MNIST digits
  (``shared/data/mnist5k.npz``, pixels / 256, one batch of 1,000),
* light ResNet-50 (he-normal weights, :func:`mconv.fixtures.light.he_normal`, its batch freed by
  the ``dynamic-batch`` pass) at batch 8.

Runners: mconv's reference ``Executor.run`` in its default exact mode (float64 accumulation for
float32) and under ``fast_math`` (float32 accumulation), each with numpy's BLAS at its default
thread count and limited to 1 thread (threadpoolctl), ONNX Runtime's CPU provider with
``intra_op_num_threads=1`` and with its default (all cores), and onnx.reference's
``ReferenceEvaluator`` (AlexNet only: it takes seconds per run). Each runner gets one warm-up
call, then the median of ``--repeat`` calls is reported with ratios of like against like: mconv
at BLAS default threads against ORT at its default, mconv at 1 BLAS thread against ORT at 1
thread. Before timing, each case checks that mconv and ORT agree. A last runner, the float64 GEMM
floor (:func:`gemm_floor`), does only the GEMMs any float64-accumulating oracle must do: its ratio
to ORT is the nearest such an oracle can come on this machine.

    python bench/reference_speed.py [--repeat 7] [--cases alexnet,lenet,resnet50] [--profile CASE]

``--profile CASE`` prints the time per op type of one exact and one fast_math mconv run of that
case, then a cProfile summary of an exact run.

OpenBLAS: where OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set, numpy's BLAS runs a slow generic
kernel; unset both for the benchmark (``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python ...``).
The script prints which BLAS kernel ran and its thread count.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


@dataclass
class Case:
    name: str
    proto: object  # onnx.ModelProto
    feeds: dict[str, np.ndarray]
    compare: str  # output name compared between mconv and ORT
    reference: bool = False  # also time onnx.reference
    runners: dict[str, Callable[[], object]] = field(default_factory=dict)


def alexnet_case() -> Case:
    from alexnet_speed import alexnet_with_random_weights

    proto = alexnet_with_random_weights()
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    return Case("light AlexNet, batch 1", proto, {"data_0": x}, "prob_1", reference=True)


def lenet_case(shared: Path, count: int) -> Case | None:
    from mconv.formats import import_model
    from mconv.irio import to_proto

    caffe = shared / "models" / "caffe"
    data = shared / "data" / "mnist5k.npz"
    if not (caffe / "lenet.prototxt").exists() or not data.exists():
        print(f"note: {caffe} or {data} missing; LeNet-5 case skipped")
        return None
    model = import_model([caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"])
    images = np.load(data)["images"][:count]
    x = (images.astype(np.float32) / 256.0).reshape(count, 1, 28, 28)
    return Case(f"Caffe LeNet-5, {count} MNIST digits", to_proto(model), {"data": x}, "prob")


def resnet_case(batch: int) -> Case:
    from mconv.fixtures.light import he_normal, light_model
    from mconv.irio import to_proto
    from mconv.passes import PassContext, parse_spec, run_pipeline

    model, _ = run_pipeline(light_model("resnet50", he_normal, 0), parse_spec("dynamic-batch"), PassContext())
    proto = to_proto(model)
    x = np.random.default_rng(2).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    return Case(
        f"light ResNet-50, batch {batch}", proto, {proto.graph.input[0].name: x}, proto.graph.output[0].name
    )


def blas_description() -> str:
    from threadpoolctl import threadpool_info

    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')} kernel={i.get('architecture')} threads={i.get('num_threads')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    )


def build_runners(case: Case) -> None:
    import onnx_ir as ir
    import onnxruntime as ort
    from mconv.engines.reference.executor import Executor
    from mconv.engines.reference.ops import fast_math

    executor = Executor(ir.from_proto(case.proto))
    data = case.proto.SerializeToString()

    def session(threads: int) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])

    ort1, ortn = session(1), session(0)
    feeds = case.feeds

    def fast() -> object:
        with fast_math():
            return executor.run(feeds)

    got = executor.run(feeds)[case.compare]
    want = ortn.run([case.compare], feeds)[0]
    rel = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    print(f"{case.name}: max |mconv - ORT| / max |ORT| on {case.compare} = {rel:.2e}")
    assert rel < 1e-3, f"mconv and onnxruntime disagree on {case.name}"
    case.runners = {
        "mconv exact": lambda: executor.run(feeds),
        "mconv fast_math": fast,
        "mconv exact 1t": lambda: executor.run(feeds),
        "mconv fast_math 1t": fast,
        "ORT 1 thread": lambda: ort1.run(None, feeds),
        "ORT default": lambda: ortn.run(None, feeds),
    }
    if case.reference:
        from onnx.reference import ReferenceEvaluator

        reference = ReferenceEvaluator(case.proto)
        case.runners["onnx.reference"] = lambda: reference.run(None, feeds)
    floor = gemm_floor(case)
    case.runners["float64 GEMM floor"] = floor
    case.runners["float64 GEMM floor 1t"] = floor
    case.executor = executor  # type: ignore[attr-defined]


def gemm_floor(case: Case) -> Callable[[], object]:
    """The arithmetic an oracle that accumulates in float64 cannot avoid: every Conv, Gemm and
    MatMul of the model as the float64 GEMMs of its shapes (a Conv of group g: g products of
    ``[M/g, C/g*kh*kw] @ [C/g*kh*kw, N*Ho*Wo]``), on operands and outputs made beforehand, with nothing
    else (no patch copies, no casts, no other op). Timed beside ORT's whole pass, it bounds how
    near ORT such an oracle can come on this machine."""
    import onnx
    from onnx import numpy_helper, shape_inference

    proto = onnx.ModelProto()
    proto.CopyFrom(case.proto)  # type: ignore[arg-type]
    for i in proto.graph.input:
        if i.name in case.feeds:
            for d, n in zip(i.type.tensor_type.shape.dim, case.feeds[i.name].shape, strict=True):
                d.Clear()
                d.dim_value = int(n)
    proto = shape_inference.infer_shapes(proto)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*proto.graph.input, *proto.graph.value_info, *proto.graph.output]
    }
    inits = {t.name: numpy_helper.to_array(t).shape for t in proto.graph.initializer}
    shapes.update({k: list(v) for k, v in inits.items()})
    rng = np.random.default_rng(0)
    operands: list[tuple[np.ndarray, np.ndarray]] = []
    for node in proto.graph.node:
        if node.op_type == "Conv":
            w, y = shapes[node.input[1]], shapes[node.output[0]]
            g = next((a.i for a in node.attribute if a.name == "group"), 1)
            m, k = w[0] // g, int(np.prod(w[1:]))
            n = y[0] * int(np.prod(y[2:]))
            operands += [(rng.standard_normal((m, k)), rng.standard_normal((k, n))) for _ in range(g)]
        elif node.op_type in ("Gemm", "MatMul"):
            a, b = shapes[node.input[0]], shapes[node.input[1]]
            trans_b = any(x.name == "transB" and x.i for x in node.attribute)
            rows, k = int(np.prod(a[:-1])), a[-1]
            cols = b[0] if trans_b else b[-1]
            operands.append((rng.standard_normal((rows, k)), rng.standard_normal((k, cols))))

    # the products are written into buffers made beforehand too: a fresh output of tens of MB is
    # fresh pages from the kernel on every call (single-threaded page faults), which no executor
    # has to pay and which made this "floor" slower than the exact executor on ResNet-50
    outs = [np.empty((a.shape[0], b.shape[1])) for a, b in operands]

    def run() -> object:
        for (a, b), out in zip(operands, outs, strict=True):
            np.matmul(a, b, out=out)
        return outs

    return run


def time_interleaved(
    runners: dict[str, Callable[[], object]], repeat: int, slow_repeat: int
) -> dict[str, float]:
    """Median wall time per runner; round r calls every runner once (onnx.reference only in the
    first ``slow_repeat`` rounds). Runners named ``... 1t`` run with numpy's BLAS limited to one
    thread (set outside the timed call)."""
    from threadpoolctl import threadpool_limits

    def call(name: str, fn: Callable[[], object]) -> float:
        limit = threadpool_limits(limits=1, user_api="blas") if name.endswith(" 1t") else None
        try:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        finally:
            if limit is not None:
                limit.restore_original_limits()

    for name, fn in runners.items():
        call(name, fn)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(repeat):
        for name, fn in runners.items():
            if name == "onnx.reference" and r >= slow_repeat:
                continue
            time.sleep(0.1)  # ORT's pool spins a while after a run: not into the next runner's time
            times[name].append(call(name, fn))
    return {k: statistics.median(v) for k, v in times.items()}


def profile(case: Case) -> None:
    import cProfile
    import dataclasses
    import pstats

    from mconv.engines.reference.ops import fast_math

    executor = case.executor  # type: ignore[attr-defined]
    for label, mode in (("exact", None), ("fast_math", fast_math)):
        totals: dict[str, float] = {}
        steps = executor.plan.steps
        originals = [s.opdef for s in steps]

        def wrap(fn, key, totals=totals):
            def timed(*a):
                t0 = time.perf_counter()
                out = fn(*a)
                totals[key] = totals.get(key, 0.0) + time.perf_counter() - t0
                return out

            return timed

        for s, od in zip(steps, originals):
            s.opdef = dataclasses.replace(od, forward=wrap(od.forward, s.op_type))
        try:
            executor.run(case.feeds)
            totals.clear()
            if mode is None:
                executor.run(case.feeds)
            else:
                with mode():
                    executor.run(case.feeds)
        finally:
            for s, od in zip(steps, originals):
                s.opdef = od
        print(f"per op type, {label} ({case.name}):")
        for k, v in sorted(totals.items(), key=lambda kv: -kv[1]):
            print(f"  {k:24s} {v * 1e3:9.2f} ms")
    prof = cProfile.Profile()
    prof.runcall(executor.run, case.feeds)
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--reference-repeat", type=int, default=3, help="runs of onnx.reference (slow)")
    parser.add_argument("--cases", default="alexnet,lenet,resnet50")
    parser.add_argument("--digits", type=int, default=1000)
    parser.add_argument("--resnet-batch", type=int, default=8)
    parser.add_argument("--profile", default="", help="a case name (alexnet, lenet, resnet50) to profile")
    parser.add_argument(
        "--shared", type=Path, default=Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))
    )
    args = parser.parse_args()

    import onnxruntime as ort

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; python {platform.python_version()}"
    )
    print(f"numpy {np.__version__}, onnxruntime {ort.__version__}")
    print(
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '<unset>')} "
        f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '<unset>')}"
    )
    print(f"numpy BLAS: {blas_description()}")
    if hasattr(os, "getloadavg"):
        print(f"load average at start: {os.getloadavg()[0]:.2f}")

    makers: dict[str, Callable[[], Case | None]] = {
        "alexnet": alexnet_case,
        "lenet": lambda: lenet_case(args.shared, args.digits),
        "resnet50": lambda: resnet_case(args.resnet_batch),
    }
    rows = []
    for key in [c for c in args.cases.split(",") if c]:
        case = makers[key]()
        if case is None:
            continue
        build_runners(case)
        if args.profile == key:
            profile(case)
        med = time_interleaved(case.runners, args.repeat, args.reference_repeat)
        rows.append((case, med))
        print(f"{case.name}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()), flush=True)

    if hasattr(os, "getloadavg"):
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print()
    threads = blas_description().rsplit("threads=", 1)[-1]
    print(
        f"ms, median of {args.repeat} interleaved warm runs; default = numpy BLAS {threads} threads / ORT's default"
    )
    print(
        "| case | threads | mconv exact | mconv fast_math | ORT | onnx.reference "
        "| exact / ORT | fast_math / ORT | onnx.reference / exact | float64 GEMM floor / ORT |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case, med in rows:
        ref = med.get("onnx.reference")
        for label, suffix, ort_key in (("default", "", "ORT default"), ("1", " 1t", "ORT 1 thread")):
            ex, fm, on = med["mconv exact" + suffix], med["mconv fast_math" + suffix], med[ort_key]
            fl = med["float64 GEMM floor" + suffix]
            r = ref if suffix == "" else None
            print(
                f"| {case.name} | {label} | {ex * 1e3:.1f} | {fm * 1e3:.1f} | {on * 1e3:.1f} | "
                f"{'-' if r is None else f'{r * 1e3:.0f}'} | {ex / on:.2f}x | {fm / on:.2f}x | "
                f"{'-' if r is None else f'{r / ex:.1f}x'} | {fl / on:.2f}x |"
            )
    for case, med in rows:
        if "onnx.reference" in med:
            print(
                f"{case.name}: onnx.reference / float64 GEMM floor = "
                f"{med['onnx.reference'] / med['float64 GEMM floor']:.1f}x (the most any float64 oracle can gain)"
            )
    print(
        "\ntargets: exact <= 2x ORT (AlexNet, LeNet-5), <= 3x (ResNet-50); onnx.reference >= 10x slower "
        "than exact on AlexNet; fast_math <= 1.5x ORT"
    )


if __name__ == "__main__":
    main()
