"""The suite's determinism rules (issue 11, item 15), checked on the test sources themselves.

Random numbers in tests come from ``np.random.default_rng(<int literal>)``; a generator kept at
module scope is named ``RNG`` (tests/conftest.py restarts it from its seed before every test);
nothing uses numpy's global legacy state or the ``random`` module; hypothesis is derandomized
and no test turns that off or gives it an example database.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from hypothesis import settings

TESTS = Path(__file__).resolve().parent
LEGACY = {"seed", "rand", "randn", "randint", "random", "normal", "uniform", "choice", "shuffle"}
LEGACY |= {"permutation", "RandomState", "random_sample", "integers", "standard_normal"}


def _module_level_nodes(tree: ast.AST):
    """Nodes executed at import: everything except the bodies of functions and lambdas."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _is_default_rng(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and ast.unparse(call.func) in {"np.random.default_rng", "default_rng"}


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(TESTS)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if "random" in names:
                out.append(f"{rel}:{node.lineno}: the random module (seed a numpy Generator instead)")
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.count(".") == 2 and func.startswith("np.random.") and func.split(".")[-1] in LEGACY:
                out.append(f"{rel}:{node.lineno}: {func} uses numpy's global state")
            if _is_default_rng(node):
                args = node.args
                if len(args) != 1 or (isinstance(args[0], ast.Constant) and args[0].value is None):
                    out.append(f"{rel}:{node.lineno}: default_rng needs a seed")
            if func in {"settings", "hypothesis.settings"}:
                for kw in node.keywords:
                    if kw.arg in {"derandomize", "database"}:
                        out.append(f"{rel}:{node.lineno}: settings({kw.arg}=...) overrides the profile")
    for node in _module_level_nodes(tree):
        if _is_default_rng(node):
            arg = node.args[0] if len(node.args) == 1 else None
            if not (isinstance(arg, ast.Constant) and type(arg.value) is int):
                out.append(f"{rel}:{node.lineno}: a module-level generator needs a fixed integer seed")
        if isinstance(node, ast.Assign) and _is_default_rng(node.value):
            names = [ast.unparse(t) for t in node.targets]
            if names != ["RNG"]:
                out.append(
                    f"{rel}:{node.lineno}: a module-level generator must be named RNG (reset per test)"
                )
    return out


def test_no_test_module_keeps_unseeded_or_shared_random_state() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 20
    problems = [p for f in files for p in _problems(f)]
    assert problems == []


def test_the_guard_sees_the_patterns_it_forbids(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import random\nimport numpy as np\nrng = np.random.default_rng(0)\nG = np.random.default_rng()\n"
        "np.random.seed(1)\nH = np.random.default_rng(SEED)\nfrom hypothesis import settings\nS = settings(derandomize=False)\n"
    )
    global TESTS
    saved, TESTS = TESTS, tmp_path
    try:
        found = _problems(bad)
    finally:
        TESTS = saved
    assert sorted({int(p.split(":")[1]) for p in found}) == [1, 3, 4, 5, 6, 8], found
    assert len(found) == 9, found


def test_hypothesis_profile_is_derandomized_and_explicit_settings_inherit_it() -> None:
    assert settings.default.derandomize is True
    assert settings.default.database is None
    explicit = settings(max_examples=7, deadline=None)
    assert explicit.derandomize is True and explicit.database is None and explicit.print_blob is True


def test_module_rng_restarts_from_its_seed_before_every_test_a() -> None:
    assert RNG.integers(0, 2**62) == np.random.default_rng(5).integers(0, 2**62)
    RNG.integers(0, 2**62, 100)  # advance it: the next test must not see this


def test_module_rng_restarts_from_its_seed_before_every_test_b() -> None:
    assert RNG.integers(0, 2**62) == np.random.default_rng(5).integers(0, 2**62)


RNG = np.random.default_rng(5)
