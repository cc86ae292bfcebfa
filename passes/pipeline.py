"""Pipelines: pass specs from a spec string or a TOML recipe, run in order with reports."""

from __future__ import annotations

import ast
import json
import re
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, show
from mconv.passes.base import PASSES, PassContext, PassReport, PassSpec, config_as_dict, stats_triplet

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
METADATA_KEY = "mconv.passes"

_ITEM = re.compile(r"^\s*([A-Za-z_][\w\-.]*)\s*(?:\((.*)\))?\s*$", re.S)


def recipe_names() -> list[str]:
    """Names of the built-in recipes (``passes/recipes/NAME.toml``)."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.toml"))


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise InputError(
                    f"unbalanced ')' at character {i}",
                    where="pass spec",
                    hint="e.g. fold,dce,prune(sparsity=0.9)",
                )
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth or quote:
        raise InputError(
            "unbalanced brackets or quotes",
            where="pass spec",
            hint="e.g. fold,dce,cluster(bits=5,init='linear')",
        )
    parts.append(text[start:])
    return parts


# A bare word: a letter or underscore, then letters, digits and ``_ . + -`` (``kmeans++``).
_WORD = re.compile(r"[A-Za-z_][\w.+\-]*")
_KEY = re.compile(r"\s*=(?!=)")  # a word followed by '=' is an option's name
_LITERAL_WORDS = {"True": "True", "False": "False", "None": "None", "true": "True", "false": "False"}


def _quote_bare_words(args: str) -> str:
    """``init=optimal`` -> ``init='optimal'``: every bare word outside quotes that is not an
    option name (before ``=``) becomes a string; ``True``/``False``/``None`` stay literals and
    ``true``/``false`` (as in TOML recipes) are booleans. Numbers are not words (``1e-3``)."""
    out, i, n = [], 0, len(args)
    while i < n:
        ch = args[i]
        if ch in "'\"":  # a quoted string, copied as it is (backslash escapes included)
            j = i + 1
            while j < n and args[j] != ch:
                j += 2 if args[j] == "\\" else 1
            out.append(args[i : j + 1])
            i = j + 1
            continue
        word = _WORD.match(args, i)
        if word and not (i and (args[i - 1].isalnum() or args[i - 1] in "_.")):
            text = word.group()
            if _KEY.match(args, word.end()):
                out.append(text)
            else:
                out.append(_LITERAL_WORDS.get(text) or repr(text))
            i = word.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _parse_args(name: str, args: str) -> dict[str, Any]:
    try:
        call = ast.parse(f"f({_quote_bare_words(args)})", mode="eval").body
    except (SyntaxError, MemoryError, RecursionError):
        raise InputError(
            f"cannot parse options '({args})'",
            where=f"pass {name}",
            hint="write key=value pairs, e.g. prune(sparsity=0.9) or cluster(bits=4,init=optimal)",
        ) from None
    assert isinstance(call, ast.Call)
    if call.args:
        raise InputError("options must be named", where=f"pass {name}", hint="write key=value, e.g. bits=5")
    values = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise InputError("'**' is not allowed in a pass spec", where=f"pass {name}")
        try:
            values[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise InputError(
                f"option '{kw.arg}' is not a literal: {show(ast.unparse(kw.value))}",
                where=f"pass {name}",
                hint="values are numbers, true/false, words or quoted strings, and lists: "
                "init=optimal, sparsity=0.9, block_list=[Softmax, Exp]",
            ) from None
    return values


# A recipe is a few kilobytes; options nest a few levels (op_type -> name -> option -> list).
MAX_RECIPE_BYTES = 1 << 20
MAX_OPTION_DEPTH = 16


def _depth(value: Any) -> int:
    """How deep lists, tuples and dicts nest in ``value`` (a scalar: 0), without recursion; the
    walk stops once past :data:`MAX_OPTION_DEPTH`."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list | tuple):
            deepest = max(deepest, d + 1)
            if deepest > MAX_OPTION_DEPTH:
                return deepest
            stack.extend((x, d + 1) for x in v)
    return deepest


def make_spec(name: str, values: dict[str, Any]) -> PassSpec:
    """A PassSpec from flat options; the keys ``op_type`` and ``op_name`` hold overrides."""
    if _depth(values) > MAX_OPTION_DEPTH:
        raise InputError(
            f"options nested more than {MAX_OPTION_DEPTH} deep",
            where=f"pass {name}",
            hint="options are numbers, words, lists of them and op_type/op_name tables",
        )
    values = dict(values)
    op_type = values.pop("op_type", {}) or {}
    op_name = values.pop("op_name", {}) or {}
    for key, table in (("op_type", op_type), ("op_name", op_name)):
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise InputError(
                f"'{key}' must map names to tables of options",
                where=f"pass {name}",
                hint=f"e.g. {key}={{'Conv': {{'sparsity': 0.6}}}}",
            )
    return PassSpec(
        name,
        values,
        {str(k): dict(v) for k, v in op_type.items()},
        {str(k): dict(v) for k, v in op_name.items()},
    )


def parse_spec(spec: str) -> list[PassSpec]:
    """Parse ``fold,dce,prune(sparsity=0.9),cluster(bits=5,init=linear)``.

    Option values are Python literals (numbers, ``True``/``False``, quoted strings, lists,
    dicts), ``true``/``false``, or bare words, which are strings (``init=linear`` is
    ``init='linear'``; a word where a number is expected is refused naming the option). A name
    that is not a pass but a recipe (or a ``.toml`` path) expands to the recipe's passes.
    """
    specs: list[PassSpec] = []
    for item in _split_top_level(spec):
        if not item.strip():
            continue
        m = _ITEM.match(item)
        if not m:
            raise InputError(
                f"cannot parse '{item.strip()}'",
                where="pass spec",
                hint="write name or name(key=value,...), separated by commas",
            )
        name, args = m.group(1), m.group(2)
        if name not in PASSES and not args and (name in recipe_names() or name.endswith(".toml")):
            specs.extend(load_recipe(name))
            continue
        if name not in PASSES:
            from mconv.passes import unknown_pass_hint

            raise InputError(f"unknown pass '{name}'", where="pass spec", hint=unknown_pass_hint(name))
        specs.append(make_spec(name, _parse_args(name, args) if args else {}))
    return specs


def load_recipe(name_or_path: str | Path) -> list[PassSpec]:
    """Load a TOML recipe: a built-in name (see :func:`recipe_names`) or a path to a ``.toml``."""
    path = Path(name_or_path)
    if not path.is_file():
        builtin = RECIPE_DIR / f"{name_or_path}.toml"
        if builtin.is_file():
            path = builtin
        else:
            raise InputError(
                f"unknown recipe '{name_or_path}'",
                path=str(name_or_path),
                hint=f"built-in recipes: {', '.join(recipe_names())}; or give a .toml path",
            )
    if path.stat().st_size > MAX_RECIPE_BYTES:
        raise InputError(
            f"a recipe of {path.stat().st_size} bytes is larger than {MAX_RECIPE_BYTES}",
            path=str(path),
            hint="a recipe lists passes and their options: a few kilobytes",
        )
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        doc = None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(
            f"not a valid TOML recipe ({show(str(exc), 200)})",
            path=str(path),
            hint="see the schema in mconv.passes' docstring",
        ) from None
    if doc is None or _depth(doc) > MAX_OPTION_DEPTH:
        raise InputError(
            f"values nested more than {MAX_OPTION_DEPTH} deep",
            path=str(path),
            hint="options are numbers, words, lists of them and op_type/op_name tables",
        )
    unknown = set(doc) - {"pass", "description"}
    if unknown:
        raise InputError(
            f"unknown top-level key(s): {', '.join(sorted(unknown))}",
            path=str(path),
            hint="a recipe has 'description' and [[pass]] tables",
        )
    entries = doc.get("pass", [])
    if not isinstance(entries, list):
        raise InputError("'pass' must be an array of tables", path=str(path), hint="write [[pass]]")
    specs = []
    for i, entry in enumerate(entries):
        entry = dict(entry)
        name = entry.pop("name", None)
        if not isinstance(name, str):
            raise InputError(
                "pass without a name", path=str(path), where=f"[[pass]] #{i + 1}", hint='add name = "fold"'
            )
        try:
            specs.append(make_spec(name, entry))
        except InputError as exc:
            exc.path = str(path)
            exc.where = f"[[pass]] #{i + 1} ({exc.where or name})"
            raise
    return specs


def _record_provenance(model: ir.Model, specs: list[PassSpec]) -> None:
    """Append the pipeline to ``metadata_props['mconv.passes']`` (a JSON list of {name, config})."""
    try:
        history = json.loads(model.metadata_props.get(METADATA_KEY, "[]"))
        if not isinstance(history, list):
            history = []
    except json.JSONDecodeError:
        history = []
    history.extend(s.as_dict() for s in specs)
    model.metadata_props[METADATA_KEY] = json.dumps(history, sort_keys=True, separators=(",", ":"))


def snapshot_model(model: ir.Model) -> ir.Model:
    """A copy of ``model`` whose initializers own their arrays (passes may change weights in place)."""
    copy = model.clone()
    for value in copy.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            try:
                value.const_value = ir.Tensor(np.array(tensor.numpy(), copy=True), name=value.name)
            except Exception:  # noqa: BLE001 - dtypes numpy cannot hold stay shared (read-only use)
                pass
    return copy


# The lossy passes a data-free limit backs off (``run_pipeline``'s ``limit``).
LIMITED = ("prune", "cluster")


def run_pipeline(
    model: ir.Model,
    specs: list[PassSpec],
    ctx: PassContext | None = None,
    *,
    limit: Callable[[ir.Model, list[PassSpec]], list[PassSpec]] | None = None,
) -> tuple[ir.Model, list[PassReport]]:
    """Run ``specs`` in order on ``model`` (mutated in place where passes allow).

    Returns the final model and one report per pass; records the pipeline in the model's
    metadata under ``mconv.passes`` (the specs as they ran). ``limit``, when given, is called
    once on the model as the first ``prune`` or ``cluster`` pass is reached and returns that
    pass and the rest rewritten (a recipe run without data:
    :func:`mconv.drivers.budget.limit_datafree`).
    """
    ctx = ctx or PassContext()
    specs = list(specs)
    if ctx.reference_model is None and ctx.data is not None:
        if any(getattr(s.pass_class, "uses_reference_model", False) for s in specs):
            ctx.reference_model = snapshot_model(model)  # the uncompressed model, for distillation
    reports = []
    before = stats_triplet(model)
    for i in range(len(specs)):
        if limit is not None and specs[i].name in LIMITED:
            specs[i:] = limit(model, specs[i:])
            limit = None
        spec = specs[i]
        ctx.tick(f"pass {spec.name}", i, len(specs))
        config = spec.resolve()
        ctx.spec = spec
        t0 = time.perf_counter()
        try:
            report = spec.pass_class().run(model, config, ctx)
        finally:
            ctx.spec = None
        seconds = time.perf_counter() - t0
        if report.model is not None:
            model = report.model
            report.model = None
        after = stats_triplet(model)
        report.name = spec.name
        report.config = spec.as_dict()["config"] if (spec.op_type or spec.op_name) else config_as_dict(config)
        report.nodes_before, report.params_before, report.bytes_before = before
        report.nodes_after, report.params_after, report.bytes_after = after
        report.seconds = seconds
        reports.append(report)
        before = after
    ctx.tick("passes done", len(specs), len(specs))
    _record_provenance(model, specs)
    return model, reports
