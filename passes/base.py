"""The pass framework: registry, typed configs with overrides, context and reports.

A pass is a class registered by name with :func:`register_pass`. It declares a ``Config``
dataclass (every field has a default) and implements ``run(model, config, ctx) -> PassReport``.
It mutates ``model`` in place, or builds a new one and returns it in ``PassReport.model``.
The pipeline (:mod:`mconv.passes.pipeline`) fills in the counts, timings and config of the report.

Config resolution (as coremltools' OptimizationConfig): a pass spec holds a global config and
overrides per op type and per op name; for a node, **name beats type beats global**::

    prune(sparsity=0.9)                 # global
    [pass.op_type.Conv] sparsity = 0.6  # every Conv
    [pass.op_name.fc8]  sparsity = 0.75 # the node named fc8, whatever its type

Passes that act per node or per weight tensor call ``ctx.config_for(node)``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError
from mconv.irio import model_stats

PASSES: dict[str, type[Pass]] = {}


@dataclass
class NoConfig:
    """Config of a pass that takes no options."""


class Pass:
    """Base class of a registered pass: ``name``, ``Config`` and ``run``."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    # True for passes that never change what the model computes (beyond float rounding order).
    lossless: ClassVar[bool] = True

    def run(self, model: ir.Model, config: Any, ctx: PassContext) -> PassReport:
        raise NotImplementedError

    def report(
        self,
        modified: bool,
        *,
        notes: list[str] | None = None,
        tensors: list[dict] | None = None,
        model: ir.Model | None = None,
    ) -> PassReport:
        """A report for the pipeline to complete (counts, timing and config are filled in there)."""
        return PassReport(
            name=self.name,
            modified=modified,
            notes=list(notes or []),
            tensors=list(tensors or []),
            model=model,
        )


def register_pass(name: str) -> Callable[[type[Pass]], type[Pass]]:
    """Class decorator: register a pass under ``name`` (a lowercase, hyphenated word)."""

    def deco(cls: type[Pass]) -> type[Pass]:
        if not dataclasses.is_dataclass(cls.Config):
            raise TypeError(f"pass {name}: Config must be a dataclass")
        if name in PASSES and PASSES[name] is not cls:
            raise ValueError(f"pass name '{name}' registered twice ({PASSES[name].__name__}, {cls.__name__})")
        cls.name = name
        PASSES[name] = cls
        return cls

    return deco


def get_pass(name: str) -> type[Pass]:
    if name not in PASSES:
        from mconv.passes import unknown_pass_hint

        raise InputError(f"unknown pass '{name}'", where="pass spec", hint=unknown_pass_hint(name))
    return PASSES[name]


# --- config values -------------------------------------------------------------------------


def _check_value(value: Any, hint: Any, where: str, key: str) -> Any:
    """Check ``value`` against a field's type hint; ints widen to float, lists to tuples."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        errors = []
        for arm in typing.get_args(hint):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check_value(value, arm, where, key)
            except InputError as exc:
                errors.append(exc)
        raise errors[0] if errors else InputError(f"'{key}' must not be None", where=where)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise InputError(
                f"'{key}' is {value!r}",
                where=where,
                hint=f"choose one of: {', '.join(repr(c) for c in choices)}",
            )
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise InputError(f"'{key}' must be a list, got {value!r}", where=where, hint=f"e.g. {key}=[...]")
        args = typing.get_args(hint)
        item = args[0] if args else Any
        checked = [_check_value(v, item, where, key) for v in value]
        return tuple(checked) if origin is tuple else checked
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool | np.bool_):
            raise InputError(f"'{key}' must be true or false, got {value!r}", where=where)
        return bool(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"'{key}' must be a number, got {value!r}", where=where)
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"'{key}' must be an integer, got {value!r}", where=where)
        return value
    if hint is str:
        if not isinstance(value, str):
            raise InputError(
                f"'{key}' must be a string, got {value!r}", where=where, hint=f"quote it: {key}='{value}'"
            )
        return value
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise InputError(f"'{key}' must be a table/dict, got {value!r}", where=where)
        return dict(value)
    return value


# The largest count an option may name (groups, blocks, batch size): beyond it no model's tensor
# has that many channels or elements worth a palette each.
MAX_COUNT = 1 << 31


@dataclass(frozen=True)
class Bound:
    """The range a numeric option may take (None: unbounded on that side; ``*_open``: the end
    itself excluded). Every count-like option is bounded, so that a value no model can use
    (``groups=10**9``, ``epochs=10**12``) is refused when the spec is read, not after gigabytes
    are allocated; what a given tensor can use is checked again where the pass meets it."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def holds(self, v: float) -> bool:
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return not (self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)))

    def text(self) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        lo = "" if self.lo is None else f"{num(self.lo)} {'<' if self.lo_open else '<='} "
        hi = "" if self.hi is None else f" {'<' if self.hi_open else '<='} {num(self.hi)}"
        return f"{lo}value{hi}"


def bounded(
    default: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Any:
    """A Config field with a :class:`Bound` (``epochs: int = bounded(5, 0, 10**6)``)."""
    return field(default=default, metadata={"bound": Bound(lo, hi, lo_open, hi_open)})


def _check_bound(f: dataclasses.Field, value: Any, where: str) -> None:
    """Numbers are finite and inside the field's :class:`Bound`, if it has one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{f.name}={value}", where=where, hint=f"{f.name} takes a finite number")
    bound = f.metadata.get("bound")
    if bound is not None and not bound.holds(value):
        raise InputError(
            f"{f.name}={value} is out of range", where=where, hint=f"{f.name} takes {bound.text()}"
        )


def check_config(config_cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Validate ``values`` (key -> value) for ``config_cls``; unknown keys raise InputError."""
    hints = typing.get_type_hints(config_cls)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    checked = {}
    for key, value in values.items():
        if key not in fields:
            valid = ", ".join(sorted(fields)) or "(none: this pass takes no options)"
            raise InputError(f"unknown option '{key}'", where=where, hint=f"valid options: {valid}")
        try:
            checked[key] = _check_value(value, hints[key], where, key)
        except InputError as exc:
            if not exc.hint:
                default = _field_default(config_cls, key)
                exc.hint = f"{key} takes {_type_name(hints[key])}, default {default!r}"
            raise
        _check_bound(fields[key], checked[key], where)
    return checked


def _field_default(config_cls: type, key: str) -> Any:
    f = next(f for f in dataclasses.fields(config_cls) if f.name == key)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def config_as_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as a JSON-able dict (tuples become lists)."""

    def plain(v: Any) -> Any:
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, np.generic):
            return v.item()
        return v

    return {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


@dataclass
class PassSpec:
    """One pass of a pipeline: its name, global options and per-op-type / per-op-name overrides."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    op_type: dict[str, dict[str, Any]] = field(default_factory=dict)
    op_name: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cls = get_pass(self.name)
        where = f"pass {self.name}"
        self.config = check_config(cls.Config, self.config, where)
        self.op_type = {
            t: check_config(cls.Config, v, f"{where} op_type.{t}") for t, v in self.op_type.items()
        }
        self.op_name = {
            n: check_config(cls.Config, v, f"{where} op_name.{n}") for n, v in self.op_name.items()
        }

    @property
    def pass_class(self) -> type[Pass]:
        return PASSES[self.name]

    def resolve(self, node: ir.Node | None = None) -> Any:
        """The config for ``node`` (global when None): name beats type beats global."""
        values = dict(self.config)
        if node is not None:
            values.update(self.op_type.get(node.op_type, {}))
            if node.name:
                values.update(self.op_name.get(node.name, {}))
        return self.pass_class.Config(**values)

    def as_dict(self) -> dict[str, Any]:
        """``{"name", "config"}``: the global options that differ from the pass's defaults, plus
        any overrides. Provenance is written into every model and bundle, whose bytes are the
        user's budget (a small compressed bundle would otherwise spend more on option names than
        on weights); the mconv version recorded beside it fixes what the defaults were."""
        config = config_as_dict(self.resolve())
        defaults = _default_config(self.pass_class)
        config = {k: v for k, v in config.items() if k not in defaults or defaults[k] != v}
        if self.op_type:
            config["op_type"] = {t: config_as_dict_partial(v) for t, v in sorted(self.op_type.items())}
        if self.op_name:
            config["op_name"] = {n: config_as_dict_partial(v) for n, v in sorted(self.op_name.items())}
        return {"name": self.name, "config": config}


def _default_config(cls: type[Pass]) -> dict[str, Any]:
    """The pass's default options as :func:`config_as_dict` writes them ({} where a field has no
    default: then every option is recorded)."""
    try:
        return config_as_dict(cls.Config())
    except TypeError:
        return {}


def config_as_dict_partial(values: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(values.items())}


def resolve_config(spec: PassSpec, node: ir.Node | None = None) -> Any:
    """The config of ``spec`` for ``node``: name beats type beats global."""
    return spec.resolve(node)


# --- context and report ----------------------------------------------------------------------

Progress = Callable[[str, float, float | None], None]


@dataclass
class PassContext:
    """What a pass may use besides the model.

    data: calibration / fine-tuning feeds keyed by input name (optional ``labels``).
    reference_model: the uncompressed model, for distillation.
    progress: ``progress(description, completed, total)`` or None (the CLI draws a bar, or
        prints a line every few seconds off a terminal). Passes report through :meth:`tick`.
    seed: seed of every random choice a pass makes.
    memo: what a pass computed that the run's later passes may reuse, as it would compute it
        again (the teacher's outputs of fine-tuning); one run's passes share it.
    """

    data: dict[str, np.ndarray] | None = None
    reference_model: ir.Model | None = None
    progress: Progress | None = None
    seed: int = 0
    spec: PassSpec | None = None  # the pass being run; set by the pipeline
    stage: str | None = field(default=None, repr=False)  # "pass 3/5 finetune", set by tick()
    memo: dict = field(default_factory=dict, repr=False)

    def config_for(self, node: ir.Node | None = None) -> Any:
        """The running pass's config for ``node`` (global when None): name beats type beats global."""
        if self.spec is None:
            raise RuntimeError("config_for() is only available while a pipeline runs a pass")
        return self.spec.resolve(node)

    def rng(self, salt: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, salt])

    def tick(self, description: str, completed: float, total: float | None) -> None:
        """Report progress to ``progress``.

        The pipeline ticks between passes (no pass running: ``pass NAME``, i, n, passed on as
        it is); that tick names the stage. A tick from inside a pass (``spec`` set) is shown under its stage:
        ``pass 3/5 finetune: epoch 2/10 loss 0.41 | 37/120``, so a long pass's own count (and
        its ETA) keeps the pipeline's place in view."""
        if self.progress is None:
            return
        if self.spec is None:
            name = description[len("pass ") :] if description.startswith("pass ") else None
            self.stage = f"pass {int(completed) + 1}/{int(total)} {name}" if name and total else None
            self.progress(description, completed, total)
            return
        stage = self.stage or f"pass {self.spec.name}"
        self.progress(f"{stage}: {description}", completed, total)


@dataclass
class PassReport:
    """What a pass changed. ``as_dict()`` has stable keys for JSON output and bundles."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    params_before: int = 0
    params_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0
    tensors: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    modified: bool = False
    # A pass that builds a new model instead of mutating returns it here (not serialized).
    model: ir.Model | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": self.config,
            "modified": self.modified,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "params_before": self.params_before,
            "params_after": self.params_after,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "seconds": round(self.seconds, 6),
            "tensors": self.tensors,
            "notes": self.notes,
        }


def stats_triplet(model: ir.Model) -> tuple[int, int, int]:
    s = model_stats(model)
    return s.nodes, s.params, s.bytes
