"""The target protocol, and export options declared as dataclasses (as passes declare ``Config``).

A target is the object :func:`mconv.targets.get_target` hands out (for the built-in targets, the
target's package module itself: ``TARGET = sys.modules[__name__]``). It has:

- ``name: str``;
- ``Options``: a dataclass of the export options it takes (see below);
- ``export(model, out_dir, options=None) -> Bundle``: write a bundle for an ``onnx_ir.Model``;
- ``load(bundle) -> Runner``: run a bundle (a :class:`~mconv.bundle.Bundle` or a path) where
  this machine can;
- ``load_model(model, label="model") -> Runner``: run a bare model without writing a bundle;
- optionally ``to_model(bundle) -> onnx_ir.Model``: the bundle's graph with its weights, for
  localization node by node (:class:`ConvertsToModel`).

A ``Runner`` has ``inputs`` (list of :class:`~mconv.bundle.TensorSpec`), ``outputs`` (list of
names) and ``run(feeds) -> dict[str, np.ndarray]``.

Export options
--------------
Each target declares its options in ``targets/<name>/options.py`` as a dataclass ``Options``
(a module that imports nothing heavy, so the command line builds its flags without importing a
runtime). A field made with :func:`option` carries a ``help`` text: it becomes the
``mconv export`` flag ``--<name-with-dashes>`` (a ``bool`` is a switch, anything else takes a
value shown as ``metavar``); the CLI builds ``--batch``, ``--precision``, ``--bake-weights``,
``--mlir-text`` and ``--dense`` this way. A field without help (``codec``, ``verification``) is
an option of the Python API only. :func:`check_options` refuses an option the target does not
declare with one line naming the target (exit 2).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from mconv.errors import InputError

if TYPE_CHECKING:
    from mconv.bundle import Bundle


@runtime_checkable
class Runner(Protocol):
    inputs: list
    outputs: list

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@runtime_checkable
class Target(Protocol):
    name: str
    Options: type

    def export(
        self, model: Any, out_dir: str | os.PathLike, options: Mapping[str, Any] | None = None
    ) -> Any: ...

    def load(self, bundle: Any) -> Any: ...

    def load_model(self, model: Any, label: str = "model") -> Any: ...


@runtime_checkable
class ConvertsToModel(Protocol):
    """The optional part of the protocol: a bundle back to an IR model (localization)."""

    def to_model(self, bundle: Any) -> Any: ...


def option(default: Any = None, *, help: str | None = None, metavar: str | None = None) -> Any:  # noqa: A002
    """A dataclass field of a target's ``Options``; ``help`` makes it a command-line flag."""
    return dataclasses.field(default=default, metadata={"help": help, "metavar": metavar})


@dataclasses.dataclass(frozen=True)
class Options:
    """What every target takes from the Python API (no command-line flags)."""

    # force one codec for every weight ("raw", "fp16", ...; "auto" or None: the codec choice)
    codec: str | None = None
    # a verification summary recorded in the manifest
    verification: dict | None = None


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag built from target options: the field, its type, help and targets."""

    name: str
    type: type
    help: str
    metavar: str | None
    targets: tuple[str, ...]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _plain_type(annotation: Any) -> type:
    """``int | None`` -> int, ``bool`` -> bool (annotations may be strings: resolved by the caller)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return _plain_type(args[0]) if len(args) == 1 else object
    return annotation if isinstance(annotation, type) else object


def fields_of(options_cls: type) -> dict[str, tuple[dataclasses.Field, type]]:
    """Every field of an ``Options`` dataclass with its plain type."""
    hints = typing.get_type_hints(options_cls)
    return {f.name: (f, _plain_type(hints[f.name])) for f in dataclasses.fields(options_cls)}


def flags(declared: Mapping[str, type]) -> list[Flag]:
    """The command-line flags of the targets' ``Options`` (target name -> class), in field order;
    a flag two targets declare is one flag whose help names both."""
    out: dict[str, Flag] = {}
    for target, cls in declared.items():
        for name, (f, typ) in fields_of(cls).items():
            text = f.metadata.get("help")
            if not text:
                continue
            seen = out.get(name)
            if seen is None:
                out[name] = Flag(name, typ, text, f.metadata.get("metavar"), (target,))
                continue
            if seen.type is not typ:
                raise TypeError(
                    f"option {name!r} has type {seen.type} in {seen.targets} but {typ} in {target}"
                )
            out[name] = dataclasses.replace(seen, targets=(*seen.targets, target))
    return list(out.values())


def flag_help(flag: Flag) -> str:
    """``Static batch size (metal, xla).``: the first target's help text and every target's name."""
    return f"{flag.help.rstrip('.')} ({', '.join(sorted(flag.targets))})."


def check_options(
    target: str, options_cls: type, options: Mapping[str, Any], *, path: str | None = None
) -> dict[str, Any]:
    """The options given (None and False mean "not given" and are dropped), each one the target
    declares and of its declared type; anything else is an InputError naming the target."""
    declared = fields_of(options_cls)
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    cli = [n for n, (f, _) in declared.items() if f.metadata.get("help")]
    for key, value in given.items():
        if key not in declared:
            takes = ", ".join("--" + n.replace("_", "-") for n in cli) or "no command-line options"
            raise InputError(
                f"the {target} target takes no option '{key}'",
                path=path,
                where="--" + key.replace("_", "-"),
                hint=f"the {target} target takes {takes}",
            )
        typ = declared[key][1]
        ok = (
            typ is object
            or (typ is bool and isinstance(value, bool))
            or (typ is int and isinstance(value, int) and not isinstance(value, bool))
            or (typ is float and isinstance(value, int | float) and not isinstance(value, bool))
            or (typ not in (bool, int, float) and isinstance(value, typ))
        )
        if not ok:
            raise InputError(
                f"option '{key}' of the {target} target must be {typ.__name__}, got {type(value).__name__}",
                path=path,
                where="--" + key.replace("_", "-"),
                hint=f"give --{key.replace('_', '-')} a {typ.__name__}",
            )
    return given


def open_bundle(bundle: Bundle | str | os.PathLike, name: str) -> Bundle:
    """``bundle`` (a :class:`mconv.bundle.Bundle` or its path) opened and checked, and checked to
    be the target ``name``'s: a bundle for another target is one InputError naming the one to use."""
    from mconv.bundle import Bundle, load_bundle  # noqa: F811  (at run time, not on import)

    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)
    if bundle.target != name:
        raise InputError(
            f"bundle is for target '{bundle.target}', not '{name}'",
            path=str(bundle.root),
            hint=f"run it with --target {bundle.target}",
        )
    return bundle
