"""One op, one family name (issue 13 item 6): the reference executor (engines/reference/ops/),
the XLA lowering (engines/xla/lower/) and the Metal kernels (targets/metal/msl/) group ops in
family files of the same names, and an op that several of them implement sits in the same family
in each. An op's family is the module that defines the function its registry entry holds."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_FAMILIES = {
    "__init__",
    "graph",
    "_special",
}  # the xla graph lowering, the lazy scipy.special: no op families


def _family(fn) -> str:
    return fn.__module__.rsplit(".", 1)[-1]


def reference_families() -> dict[str, str]:
    from mconv.engines.reference.ops import REGISTRY

    # ops of other domains (ai.onnx.ml, com.microsoft) keyed "domain::op": a family may hold only those
    return {(f"{domain}::{op}" if domain else op): _family(d.forward) for (op, domain), d in REGISTRY.items()}


def xla_families() -> dict[str, str]:
    from mconv.engines.xla.lower import REGISTRY

    return {op: _family(rule.fn) for op, rule in REGISTRY.items()}


def metal_families() -> dict[str, str]:
    from mconv.targets.metal.msl import LOWER

    return {op: _family(fn) for op, fn in LOWER.items()}


def disagreements(tables: dict[str, dict[str, str]]) -> list[str]:
    ops = sorted({op for table in tables.values() for op in table})
    out = []
    for op in ops:
        seen = {target: table[op] for target, table in tables.items() if op in table}
        if len(set(seen.values())) > 1:
            out.append(f"{op}: " + ", ".join(f"{t} {f}" for t, f in sorted(seen.items())))
    return out


def test_each_op_has_the_same_family_in_every_target_that_has_it():
    tables = {"reference": reference_families(), "xla": xla_families(), "metal": metal_families()}
    assert all(tables.values())
    assert disagreements(tables) == []


def test_family_files_are_named_from_one_list():
    # every family file of xla and metal is a family the reference executor has too, and every
    # family module registers at least one op (no empty or stray family files)
    folders = {
        "reference": ROOT / "engines" / "reference" / "ops",
        "xla": ROOT / "engines" / "xla" / "lower",
        "metal": ROOT / "targets" / "metal" / "msl",
    }
    files = {t: {p.stem for p in f.glob("*.py")} - NOT_FAMILIES for t, f in folders.items()}
    tables = {"reference": reference_families(), "xla": xla_families(), "metal": metal_families()}
    for target, names in files.items():
        assert names - files["reference"] == set(), target
        assert names == set(tables[target].values()), target


def test_a_disagreement_is_reported_with_each_targets_family():
    tables = {"reference": {"GridSample": "misc", "Relu": "activation"}, "xla": {"GridSample": "sampling"}}
    assert disagreements(tables) == ["GridSample: reference misc, xla sampling"]
