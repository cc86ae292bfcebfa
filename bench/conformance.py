"""ONNX backend conformance of three backends, in one process: mconv reference, onnx.reference, ORT.

Runs the CPU cases of ``onnx.backend.test.BackendTest`` (the same selection and the same expected
failures as ``tests/engines/reference/test_backend_suite.py`` for mconv) and prints a markdown
table of pass / fail / expected-fail counts per backend to stdout, plus how many mconv cases ran
an op through ``misc.FALLBACK_OPS``.

    python bench/conformance.py                 # all three backends
    python bench/conformance.py --backend mconv --failures   # list mconv's failing cases
"""

from __future__ import annotations

import argparse
import collections
import sys
import unittest
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.backend.test
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

ROOT = Path(__file__).resolve().parent.parent


class OnnxReferenceRep(BackendRep):
    def __init__(self, model: onnx.ModelProto) -> None:
        from onnx.reference import ReferenceEvaluator

        self.session = ReferenceEvaluator(model)
        self.names = [
            i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
        ]

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        return tuple(self.session.run(None, dict(zip(self.names, inputs))))


class OnnxReferenceBackend(Backend):
    """``onnx.reference.ReferenceEvaluator`` as a backend (onnx ships none for it)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> OnnxReferenceRep:
        return OnnxReferenceRep(model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


def _suite_module():
    sys.path.insert(0, str(ROOT / "tests" / "engines" / "reference"))
    import test_backend_suite  # the one place that defines the selection and expected failures

    return test_backend_suite


def run_backend(name: str, backend: Any, apply_expected: bool) -> dict[str, Any]:
    suite_mod = _suite_module()
    bt = onnx.backend.test.BackendTest(backend, f"bench_{name}")
    suite_mod.select(bt)
    expected = set(suite_mod.EXPECTED_FAILURES) if apply_expected else set()
    cases = bt.test_cases
    result = unittest.TestResult()
    names: list[str] = []
    for case_cls in cases.values():
        for attr in sorted(dir(case_cls)):
            if attr.startswith("test_") and attr.endswith("_cpu"):
                names.append(attr)
                case_cls(attr).run(result)
    failed = {t.id().rsplit(".", 1)[-1]: tb for t, tb in result.failures + result.errors}
    skipped = {t.id().rsplit(".", 1)[-1] for t, _ in result.skipped}
    ran = [n for n in names if n not in skipped]
    xfail = [n for n in ran if n in failed and n[: -len("_cpu")] in expected]
    xpass = [n for n in ran if n not in failed and n[: -len("_cpu")] in expected]
    fail = [n for n in ran if n in failed and n[: -len("_cpu")] not in expected]
    return {
        "name": name,
        "cases": len(names),
        "ran": len(ran),
        "skipped": len(skipped),
        "passed": len(ran) - len(failed),
        "failed": fail,
        "xfail": xfail,
        "xpass": xpass,
        "tracebacks": failed,
    }


def fallback_cases() -> int:
    """How many node cases run at least one op (subgraphs included) through FALLBACK_OPS."""
    from mconv.engines.reference.ops.misc import FALLBACK_OPS

    fallback = {(d, op) for d, op in FALLBACK_OPS}

    def ops_of(graph: onnx.GraphProto) -> set[tuple[str, str]]:
        found = set()
        for node in graph.node:
            found.add(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
            for a in node.attribute:
                if a.HasField("g"):
                    found |= ops_of(a.g)
                for g in a.graphs:
                    found |= ops_of(g)
        return found

    count = 0
    for test in onnx.backend.test.loader.load_model_tests(kind="node"):
        model = test.model
        if model is None and test.model_dir:
            model = onnx.load(str(Path(test.model_dir) / "model.onnx"))
        if model is not None and ops_of(model.graph) & fallback:
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["mconv", "onnx.reference", "onnxruntime"], action="append")
    parser.add_argument("--failures", action="store_true", help="list failing cases with their error")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    chosen = args.backend or ["mconv", "onnx.reference", "onnxruntime"]
    rows = []
    for name in chosen:
        if name == "mconv":
            from mconv.engines.reference import backend
        elif name == "onnx.reference":
            backend = OnnxReferenceBackend
        else:
            import onnxruntime.backend as backend
        r = run_backend(name, backend, apply_expected=(name == "mconv"))
        rows.append(r)
        if args.failures:
            by_error: dict[str, list[str]] = collections.defaultdict(list)
            for case in r["failed"]:
                tb = r["tracebacks"][case].strip().splitlines()[-1][:160]
                by_error[tb].append(case)
            for err, cases in sorted(by_error.items(), key=lambda kv: -len(kv[1])):
                print(f"# {len(cases)}: {err}", file=sys.stderr)
                for c in cases:
                    print(f"    {c}", file=sys.stderr)
    print("| backend | CPU cases | ran | passed | failed | expected fail | unexpected pass | skipped |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['name']} | {r['cases']} | {r['ran']} | {r['passed']} | {len(r['failed'])} | "
            f"{len(r['xfail'])} | {len(r['xpass'])} | {r['skipped']} |"
        )
    if "mconv" in chosen:
        print(f"\nmconv node cases that use a FALLBACK op: {fallback_cases()}")


if __name__ == "__main__":
    main()
