"""PyTorch import: TorchScript archives and ``package.module:factory`` specs, through torch's
own ONNX exporter (extra ``mconv[torch]``).

Rules:

1. Sources. A TorchScript archive (``torch.jit.save``; a zip holding ``code/`` and
   ``constants.pkl``) is loaded with ``torch.jit.load``: the archive holds TorchScript source
   that torch compiles, not pickled Python objects, so no code from the file runs as Python.
   TorchScript itself can call any registered operator (``torch.from_file`` maps, creates or
   overwrites a file; ``torch.save`` writes one; ``print`` writes to stdout), and
   ``torch.jit.load`` runs ``__setstate__`` methods: so before torch sees the archive, every
   ``.py`` member (all methods, ``__setstate__``, submodules, classes, functions) is checked
   against an allowlist of pure tensor operations (``formats/pytorch/script_check.py``: ATen
   operators that touch no file, stream or global state, a few prim operators, TorchScript
   builtins and classes whose source is in ``code/``; ``print``, other operator namespaces and
   C++ custom classes are refused). One error lists what was found.
   A spec ``package.module:factory`` (not an existing file) imports ``package.module`` (the
   current directory is on the import path, as for ``python -m``) and calls ``factory()``,
   which must return an ``nn.Module``: the user asked for that code to run.
2. Anything else is refused, saying what it holds (:func:`examine`): a zip with ``data.pkl``
   and ``code/`` is TorchScript; a zip with ``data.pkl`` alone is a ``torch.save`` archive; a
   pickle that starts with torch.save's magic number is a legacy (pre-1.6) ``torch.save``;
   anything else is not a PyTorch file. ``torch.load`` is only ever called with
   ``weights_only=True``, after rule 5's checks, to tell a state dict (tensors, no
   architecture) from a pickled module; neither is imported.
3. Inputs: each argument of ``forward`` (names and types from the TorchScript schema, or the
   Python signature and its annotations; :func:`arguments`) is given by
   ``options["input_shapes"]`` (the CLI's ``--input-shape NAME=1,3,224,224``: a tensor, an input
   of the ONNX model), ``options["input_values"]`` (``--input-value NAME=VALUE``: an int, float
   or bool argument, read by the argument's type and baked into the graph as a constant) or
   ``options["example_inputs"]`` (``--example-inputs FILE.npz``, read by
   :func:`mconv.npzio.read_npz`, or a dict of arrays: arrays become tensors with their own
   dtype and values, 0-d arrays give int/float/bool values). Every argument without a default
   needs one of them; an int/float/bool argument without a value, ``--input-shape`` for one,
   ``--input-value`` for a tensor, other types (lists, strings, dicts), unknown names and
   sources that disagree are refused, naming the argument and its type. Random inputs from
   shapes are float32 unless ``options["input_dtypes"]`` names a torch dtype (``{"ids":
   "int64"}``; integer example inputs are zeros, valid for any embedding), at most
   ``MAX_EXAMPLE_BYTES`` each.
4. Export: ``torch.onnx.export(..., dynamo=False)`` (the TorchScript-based exporter; the
   dynamo exporter needs ``onnxscript``, which mconv does not require), in eval mode, opset
   ``options["opset"]`` (default 17), constant folding on, into an in-memory buffer read by
   :func:`mconv.irio.from_proto`. Shapes are static as given: traced code may have baked
   sizes in, so a symbolic batch would be a guess. Values are bound by a wrapper whose
   ``forward`` takes the tensors only: a TorchScript one (``define``d from the argument names
   and the values as literals, so the exporter's constant propagation removes the branches the
   values decide; the exporter would otherwise make every schema argument a graph input) or,
   for a factory's module, a Python one that the tracer runs. For the export only, the
   exporter's ``not`` casts a number to bool first (a scripted ``if not len(self._buf):``
   otherwise fails), and the fused ``aten::_transformer_encoder_layer_fwd`` of a traced
   ``nn.TransformerEncoder`` gets a symbolic that writes the layer out (:func:`_fused_symbolics`).
   Outputs are named ``output`` (one) or ``output_0``, ``output_1``, ...
   ``forward`` runs once first (on a copy, for a stateful module) to count the outputs and to
   report a refusal of the inputs as ``forward() failed on inputs ...``. Exporter failures (an
   op without an ONNX symbolic) become one-line :class:`mconv.errors.InputError`.
   State: a TorchScript ``forward`` that reassigns module attributes (silero-vad's
   ``self._state = ...``, :func:`mutated_attributes`) keeps state between calls in torch. The
   ONNX model has no such state: each run computes from the attributes as loaded from the file
   (for silero-vad: empty, i.e. just after ``reset_states()``) and the new state is dropped, so
   the ONNX model equals torch's first call after loading. The import notes say so.
5. Nothing from the file reaches torch before it is checked (:func:`examine`): the zip's
   central directory against the real file (``formats/_zipsafe.py``: disks, counts, sizes,
   compression ratios, names, overlaps); every pickle walked opcode by opcode without
   unpickling (``formats/pytorch/pickle_scan.py``: lengths, memo indices, opcodes); every storage
   that ``data.pkl`` / ``constants.pkl`` declare against its ``data/<key>`` member's size, and
   every tensor view's last element against its storage; in TorchScript pickles, every global
   against what the TorchScript unpickler resolves itself (rebuild functions, storage types,
   ``__torch__`` classes whose source is in ``code/``; not C++ custom classes
   ``__torch__.torch.classes.*``, whose ``__setstate__`` runs at load); the TorchScript code
   against rule 1's allowlist; an archive in the legacy format (``model.json``, code loaded
   from elsewhere) is refused. A legacy file's storages must fit in
   the bytes after its pickles. Damage torch still finds becomes one ``InputError``.
6. ``torch.export.save`` archives (``.pt2``: ``<root>/archive_format``, ``models/<name>.json``,
   ``data/weights/``, ``data/constants/``, ``data/sample_inputs/<name>.pt``) are rebuilt
   without ``torch.export.load``, which is not pickle-free: it reads the sample inputs with
   ``torch.load`` falling back to ``weights_only=False``, tensor subclasses with
   ``weights_only=False`` and other constants with ``pickle.loads``. mconv reads (through
   ``_zipsafe``) the JSON program and the weights/constants configs; every tensor must be a raw
   member (``use_pickle`` false; a pickled one is refused, naming it), its sizes, strides and
   offset within the member's bytes; every ``target`` in the program must be an ATen/prims
   operator or one of the symbolic-size helpers (``_PT2_TARGET``: the deserializer resolves
   any ``torch.X`` by getattr); an archive with AOTInductor code is refused. torch's
   ``ExportedProgramDeserializer`` then builds the program from those tensors with empty
   sample inputs (the pickle is never read). Example inputs for the export are drawn from the
   program's input shapes (``--input-shape`` for symbolic sizes), and the program goes through
   the dynamo ONNX exporter (opset 18 or more; ``onnxscript``).
7. ``options["exporter"] == "dynamo"`` (``--option exporter=dynamo``): a factory's module goes
   through ``torch.onnx.export(dynamo=True)`` (torch.export, then the ONNX translation) instead
   of the TorchScript-based exporter; opset 18 or more.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import io
import keyword
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir
from mconv.errors import InputError, show
from mconv.fileio import require_file
from mconv.formats import Format
from mconv.formats._zipsafe import looks_like_zip, read_directory, read_member
from mconv.formats.pytorch.pickle_scan import STORAGE_ITEMSIZE, scan
from mconv.formats.pytorch.script_check import check_archive
from mconv.irio import from_proto
from mconv.npzio import read_npz

if TYPE_CHECKING:  # torch is optional; imported where a PyTorch model is read
    import torch

# ``package.module:factory``: a Python import path and a callable, not a file name.
SPEC_RE = re.compile(r"^[\w.]+:\w+$")
DEFAULT_OPSET = 17
_HINT_SOURCE = "pass a TorchScript file (torch.jit.script(model).save(PATH)) or a package.module:factory spec"


def is_factory_spec(text: str) -> bool:
    """True for ``package.module:factory`` when no file of that name exists (rule 1)."""
    return bool(SPEC_RE.match(text)) and not Path(text).exists()


def _torch():
    try:
        import torch
    except ImportError:
        raise InputError(
            "PyTorch import needs torch", hint="pip install 'mconv[torch]' (torch CPU is enough)"
        ) from None
    return torch


# --- sources -----------------------------------------------------------------------------------

PICKLE_LIMIT = 256 << 20  # one pickle member (data.pkl of the largest models is a few MB)
# Globals the TorchScript unpickler resolves by itself (besides ``__torch__`` classes from code/).
_JIT_GLOBALS = {
    "torch._utils": {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_qtensor", "_rebuild_sparse_tensor"},
    "torch.jit._pickle": {
        "build_intlist", "build_tensorlist", "build_doublelist", "build_boollist",
        "build_tensor_from_id", "restore_type_tag",
    },
    "collections": {"OrderedDict"},
    "builtins": {"complex"},
    "torch": {
        "device", "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
        "per_channel_symmetric", "per_channel_affine_float_qparams", *STORAGE_ITEMSIZE,
    },
}  # fmt: skip


@dataclass
class Source:
    """What a file named as a PyTorch model is (rule 2), after the safety checks."""

    kind: str  # "torchscript" | "torch.save" | "legacy"
    root: str = ""
    odd_globals: list[str] = field(default_factory=list)  # globals outside torch's weights-only list
    other_pids: list[str] = field(default_factory=list)


def examine(path: Path) -> Source:
    """Rule 5: what ``path`` holds, every structure torch would trust checked first.

    Raises :class:`InputError` for anything that is not a PyTorch file or is damaged."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
    if looks_like_zip(head):
        return _examine_zip(path)
    if head[:1] == b"\x80":
        return _examine_legacy(path)
    raise InputError(
        "not a PyTorch file: neither a zip archive (TorchScript, torch.save) nor a pickle (legacy torch.save)",
        path=str(path),
        where=f"first bytes {head.hex(' ')}",
        hint=_HINT_SOURCE,
    )


def _examine_zip(path: Path) -> Source:
    entries = {e.name: e for e in read_directory(path)}
    first = next(iter(entries), "")
    root = first.split("/", 1)[0] if "/" in first else ""
    if not root or f"{root}/data.pkl" not in entries:
        raise InputError(
            f"a zip archive without data.pkl (members such as '{show(first)}'): not a PyTorch file",
            path=str(path),
            hint=_HINT_SOURCE,
        )
    script = any(n.startswith(f"{root}/code/") for n in entries)
    source = Source("torchscript" if script else "torch.save", root)
    if script:
        legacy = [n for n in entries if n.lower().rsplit("/", 1)[-1] == "model.json"]
        if legacy:
            raise InputError(
                "a TorchScript archive in the legacy format (model.json), whose code torch loads "
                "from other places than code/",
                path=str(path),
                where=f"member '{show(legacy[0])}'",
                hint="load it with the torch that wrote it and torch.jit.save it again",
            )
        check_archive(path, entries, root)  # rule 5: no TorchScript code runs unchecked
    # TorchScript reads data.pkl and constants.pkl at load and the debug tables later; torch.load
    # reads data.pkl. Every pickle is walked; those two hold the storages torch will read.
    pickles = [n for n in entries if n.startswith(f"{root}/") and n.endswith((".pkl", ".debug_pkl"))]
    for name in pickles if script else [f"{root}/data.pkl"]:
        result = scan(read_member(path, entries[name], PICKLE_LIMIT), path, name)
        stem = name[: -len(".pkl")]
        if name in (f"{root}/data.pkl", f"{root}/constants.pkl"):
            _check_storages(
                path, name, result, {k: e for k, e in entries.items() if k.startswith(stem + "/")}, stem
            )
        if script:
            _check_jit_globals(path, name, result, entries, root)
        else:
            source.odd_globals += _odd_globals(result)
            source.other_pids += [k for k, _ in result.other_pids]
    return source


def _check_storages(path: Path, member: str, result, folder: dict, stem: str) -> None:
    """Item: every storage a pickle declares is a member at least as long as its bytes."""
    for storage in result.storages.values():
        record = folder.get(f"{stem}/{storage.key}")
        where = f"pickle '{show(member)}' at byte {storage.pos}"
        if record is None:
            raise InputError(
                f"storage '{show(storage.key)}' has no member '{show(stem)}/{show(storage.key)}'",
                path=str(path),
                where=where,
                hint="the archive is incomplete; re-save the model",
            )
        if record.usize < storage.nbytes:
            raise InputError(
                f"storage '{show(storage.key)}' declares {storage.numel} x {storage.itemsize} = "
                f"{storage.nbytes} bytes ({storage.type_name}) but member '{show(record.name)}' holds {record.usize}",
                path=str(path),
                where=where,
                hint="the archive is truncated or damaged; re-save the model",
            )


def _check_jit_globals(path: Path, member: str, result, entries: dict, root: str) -> None:
    for g, pos in result.globals:
        if g.module == "__torch__" or g.module.startswith("__torch__."):
            if g.module == "__torch__.torch.classes" or g.module.startswith("__torch__.torch.classes."):
                problem = (
                    f"class '{show(str(g))}' is a C++ custom class, whose __setstate__ is code "
                    "outside the archive"
                )
            elif f"{root}/code/{g.module.replace('.', '/')}.py" in entries:
                continue
            else:
                problem = f"class '{show(str(g))}' has no TorchScript source in code/"
        elif g.name in _JIT_GLOBALS.get(g.module, ()):
            continue
        else:
            problem = f"global '{show(str(g))}' is not one TorchScript writes"
        raise InputError(
            problem,
            path=str(path),
            where=f"pickle '{show(member)}' at byte {pos}",
            hint="mconv reads TorchScript written by torch.jit.save; re-save the model",
        )


def _weights_only_globals() -> set[str]:
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        return set(_get_allowed_globals())
    except Exception:  # a torch without it: every global is named in the refusal
        return set()


def _odd_globals(result) -> list[str]:
    allowed = _weights_only_globals()
    return [str(g) for g, _ in result.globals if str(g) not in allowed]


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _examine_legacy(path: Path) -> Source:
    """A raw-pickle torch.save (before PyTorch 1.6): magic number, protocol version, system info,
    the object, the storage keys, then each storage as an 8-byte element count and its bytes."""
    size = path.stat().st_size
    if size > PICKLE_LIMIT:
        raise InputError(
            f"legacy torch.save file of {size} bytes (at most {PICKLE_LIMIT} are read)",
            path=str(path),
            hint="re-save it with a current torch.save and a safetensors copy of the weights",
        )
    stream = io.BytesIO(path.read_bytes())
    parts = [scan(stream, path, "legacy magic number")]
    if parts[0].top != _LEGACY_MAGIC:
        raise InputError(
            "a pickle without torch.save's magic number: not a PyTorch file",
            path=str(path),
            where="byte 0",
            hint=_HINT_SOURCE,
        )
    for what in ("protocol version", "system info", "object", "storage keys"):
        parts.append(scan(stream, path, f"legacy {what}"))
    storages = parts[3].storages
    left = size - parts[4].end
    need = sum(8 + s.nbytes for s in storages.values())
    if need > left:
        raise InputError(
            f"{len(storages)} storage(s) declare {need} bytes but {left} follow the pickles",
            path=str(path),
            where=f"byte {parts[4].end}",
            hint="the file is truncated or damaged; re-save the model",
        )
    return Source(
        "legacy",
        odd_globals=_odd_globals(parts[3]),
        other_pids=[k for k, _ in parts[3].other_pids],
    )


def is_torchscript_archive(path: Path) -> bool:
    """A zip written by ``torch.jit.save``: it holds ``<root>/code/`` and ``<root>/data.pkl``."""
    try:
        names = [e.name for e in read_directory(Path(path))]
    except (InputError, OSError):
        return False  # a damaged directory: not ours to sniff
    root = names[0].split("/", 1)[0] if names and "/" in names[0] else ""
    return bool(root) and f"{root}/data.pkl" in names and any(n.startswith(f"{root}/code/") for n in names)


def _refuse_non_script(path: Path, source: Source):
    """Rule 2: say what a non-TorchScript file holds, loading it only with ``weights_only=True``
    (after :func:`examine` checked every storage it declares against the file)."""
    torch = _torch()
    what = "a legacy torch.save file" if source.kind == "legacy" else "a torch.save archive"
    pickled = source.odd_globals or source.other_pids
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for pickled modules, RuntimeError for damage
        if pickled:
            named = source.odd_globals[0] if source.odd_globals else f"persistent id '{source.other_pids[0]}'"
            raise InputError(
                f"{what} that holds pickled Python objects (a whole module saved with torch.save; "
                f"it names '{show(named)}'); mconv never unpickles code",
                path=str(path),
                hint=_HINT_SOURCE,
            ) from None
        text = (_lines(exc) or [""])[0]
        raise InputError(
            f"{what} that torch cannot read ({type(exc).__name__}: {show(text, 120)})",
            path=str(path),
            hint=_HINT_SOURCE,
        ) from None
    if _holds_tensors(obj, torch):
        raise InputError(
            f"{what} that holds weights but no architecture (a state dict)",
            path=str(path),
            hint=_HINT_SOURCE + "; or import it as a weight file after saving with safetensors",
        )
    raise InputError(
        f"{what} that holds a {type(obj).__name__}, not a TorchScript module",
        path=str(path),
        hint=_HINT_SOURCE,
    )


def _holds_tensors(obj, torch) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_holds_tensors(v, torch) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_tensors(v, torch) for v in obj)
    return False


def _load_script(path: Path):
    torch = _torch()
    try:
        source = examine(path)
    except OSError as exc:
        raise InputError(f"cannot read the file ({exc.strerror})", path=str(path)) from None
    if source.kind != "torchscript":
        _refuse_non_script(path, source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch 2.13 deprecates TorchScript; it still loads
            return torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        first = (_lines(exc) or [""])[0]
        raise InputError(
            f"not a readable TorchScript archive ({type(exc).__name__}: {show(first, 120)})",
            path=str(path),
            hint="re-save it with torch.jit.save",
        ) from None


@contextlib.contextmanager
def _cwd_on_path():
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _load_factory(spec: str):
    torch = _torch()
    module_name, _, attr = spec.partition(":")
    with _cwd_on_path():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise InputError(
                f"cannot import module '{module_name}' ({exc})",
                path=spec,
                hint="run from the folder that holds the package, or install it",
            ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(
            f"module '{module_name}' has no callable '{attr}'",
            path=spec,
            hint="spec is package.module:factory",
        )
    try:
        module_obj = factory()
    except Exception as exc:
        raise InputError(
            f"factory raised {type(exc).__name__}: {str(exc)[:120]}",
            path=spec,
            hint="the factory must take no arguments",
        ) from None
    if not isinstance(module_obj, torch.nn.Module):
        raise InputError(
            f"factory returned a {type(module_obj).__name__}, not a torch.nn.Module",
            path=spec,
            hint="return the model from the factory",
        )
    return module_obj


# --- inputs and export -------------------------------------------------------------------------

MAX_EXAMPLE_BYTES = 4 << 30  # one example input drawn from --input-shape
_INT64 = (-(1 << 63), (1 << 63) - 1)
_SCALARS = {"IntType": "int", "FloatType": "float", "BoolType": "bool", "NumberType": "number"}
_SAMPLE = {"int": "<int>", "float": "<float>", "bool": "<true|false>", "number": "<number>", "any": "<value>"}
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


@dataclass
class Argument:
    """One argument of ``forward`` (rule 3)."""

    name: str
    kind: str  # "tensor", "int", "float", "bool", "number", "any" (unannotated Python), "other"
    type_text: str  # as the schema or the annotation writes it
    required: bool

    @property
    def scalar(self) -> bool:
        return self.kind in ("int", "float", "bool", "number")

    @property
    def label(self) -> str:
        """``name: type`` for messages (both come from the file)."""
        return show(f"{self.name}: {self.type_text}", 80)

    @property
    def kind_text(self) -> str:
        return {"int": "an int", "bool": "a bool", "float": "a float"}.get(self.kind, "a number")


def _script_kind(jit_type) -> str:
    kind = jit_type.kind()
    if kind == "OptionalType":
        return _script_kind(jit_type.getElementType())
    if kind == "TensorType":
        return "tensor"
    return _SCALARS.get(kind, "other")


def _python_kind(annotation, torch) -> tuple[str, str]:
    """(kind, text) of a Python annotation; anything unknown is traced as a tensor ("any")."""
    if annotation is inspect.Parameter.empty:
        return "any", "unannotated"
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    origin = getattr(annotation, "__args__", None)
    if origin and type(None) in origin and len(origin) == 2:  # Optional[T] / T | None
        inner = next(a for a in origin if a is not type(None))
        kind, _ = _python_kind(inner, torch)
        return kind, str(annotation).replace("typing.", "")
    if isinstance(annotation, str):
        bare = re.sub(
            r"^Optional\[(.*)\]$|^(.*?)\s*\|\s*None$",
            lambda m: m.group(1) or m.group(2) or "",
            annotation.strip(),
        )
        scalar = {"int": "int", "float": "float", "bool": "bool"}.get(bare)
        if scalar:
            return scalar, annotation
        return ("tensor" if bare in ("Tensor", "torch.Tensor") else "any"), annotation
    if annotation is bool:
        return "bool", "bool"
    if annotation is int:
        return "int", "int"
    if annotation is float:
        return "float", "float"
    if annotation is torch.Tensor:
        return "tensor", "Tensor"
    return "any", text


def arguments(module) -> list[Argument]:
    """The arguments of ``forward`` with their kinds (rule 3): from the TorchScript schema, or
    from the Python signature and its annotations."""
    torch = _torch()
    if isinstance(module, torch.jit.ScriptModule):
        return [
            Argument(
                a.name,
                _script_kind(a.type),
                a.type.annotation_str,
                a.default_value is None and not a.has_default_value(),
            )
            for a in module.forward.schema.arguments[1:]  # drop self
        ]
    out = []
    for p in inspect.signature(module.forward).parameters.values():
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            kind, text = _python_kind(p.annotation, torch)
            out.append(Argument(p.name, kind, text, p.default is inspect.Parameter.empty))
    return out


def forward_arguments(module) -> list[tuple[str, bool]]:
    """(name, required) for each argument of ``forward`` (rule 3)."""
    return [(a.name, a.required) for a in arguments(module)]


def parse_input_values(specs: list[str] | None) -> dict[str, str]:
    """The CLI's ``--input-value NAME=VALUE`` strings -> {name: text}; each argument's type
    (from ``forward``) decides how the text is read."""
    values: dict[str, str] = {}
    for spec in specs or []:
        name, sep, value = spec.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InputError(
                f"bad --input-value '{show(spec)}'", hint="use NAME=VALUE, e.g. --input-value sr=16000"
            )
        if values.get(name, value) != value:
            raise InputError(
                f"--input-value {show(name)} given twice ({show(values[name])} and {show(value)})",
                hint="give each argument one value",
            )
        values[name] = value
    return values


def _coerce(kind: str, raw) -> int | float | bool:
    """A value for an int/float/bool/number argument, or ValueError saying why not."""
    if isinstance(raw, np.generic):
        raw = raw.item()
    text = raw.strip().lower() if isinstance(raw, str) else None
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ValueError("not a bool (true/false or 1/0)")
    if isinstance(raw, bool):
        raise ValueError(f"a bool, not {'an int' if kind == 'int' else 'a number'}")
    value: int | float
    if isinstance(raw, (int, float)):
        value = raw
    elif text is not None:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            if kind == "int":
                raise ValueError("not an int") from None
            try:
                value = float(text)
            except ValueError:
                if kind == "any" and (text in _TRUE or text in _FALSE):
                    return text in _TRUE
                raise ValueError("not a number") from None
    else:
        raise ValueError(f"a {type(raw).__name__}, not a number")
    if kind == "int" and not isinstance(value, int):
        raise ValueError("not an int")
    if kind == "float":
        value = float(value)
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        raise ValueError("outside the int64 range")
    return value


def _literal(value: int | float | bool) -> str:
    """``value`` as TorchScript source (only values :func:`_coerce` made get here)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '-float("inf")'
    return repr(float(value))


def _example_arrays(source, label: str) -> tuple[dict[str, np.ndarray], str]:
    """``options["example_inputs"]``: an ``.npz`` path (read by the bounded reader) or a dict."""
    if source is None:
        return {}, label
    if isinstance(source, dict):
        return {str(k): np.asarray(v) for k, v in source.items()}, label
    path = require_file(source, "example inputs file")
    return dict(read_npz(path)), str(path)


def _scalar_from_array(arg: Argument, array: np.ndarray, npz: str):
    where = f"array '{show(arg.name)}'"
    if array.size != 1 or array.ndim > 1:
        raise InputError(
            f"forward() argument '{arg.label}' takes one value, but the array holds shape "
            f"{list(array.shape)}",
            path=npz,
            where=where,
            hint="store one value as a 0-d array, e.g. np.savez(f, sr=np.int64(16000))",
        )
    allowed = {"int": "iu", "bool": "biu", "float": "iuf", "number": "iuf", "any": "biuf"}[arg.kind]
    if array.dtype.kind not in allowed:
        raise InputError(
            f"forward() argument '{arg.label}' takes {arg.kind_text}, but the array's dtype is {array.dtype}",
            path=npz,
            where=where,
            hint=f"store it as {'an integer' if arg.kind == 'int' else 'a numeric'} 0-d array",
        )
    try:
        return _coerce(arg.kind, array.reshape(()).item())
    except ValueError as exc:
        raise InputError(
            f"forward() argument '{arg.label}': the array's value is {exc}",
            path=npz,
            where=where,
            hint="store a value of the argument's type",
        ) from None


def _random_input(torch, name: str, shape: list[int], dtype_name, label: str, generator):
    dtype = getattr(torch, str(dtype_name or "float32"), None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(
            f"unknown dtype {dtype_name!r} for input {name}", path=label, hint="e.g. float32, int64"
        )
    if any(d < 0 for d in shape):
        raise InputError(
            f"--input-shape {show(name)}={','.join(map(str, shape))}: dimensions must be non-negative",
            path=label,
            hint=f"e.g. --input-shape {show(name)}=1,3,224,224",
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_EXAMPLE_BYTES:
        raise InputError(
            f"--input-shape {show(name)}={','.join(map(str, shape))} needs {nbytes} bytes for an example "
            f"input (at most {MAX_EXAMPLE_BYTES})",
            path=label,
            hint="export with a smaller shape; the ONNX model's shapes are as given",
        )
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.zeros(shape, dtype=dtype)  # token ids, indices: zeros are valid for any embedding or gather


@dataclass
class Plan:
    """What ``forward`` gets (rule 3): tensors (ONNX inputs, in argument order) and baked values."""

    args: list[Argument]
    tensors: dict[str, torch.Tensor]
    values: dict[str, int | float | bool]

    def call(self) -> tuple[tuple, dict]:
        """Positional arguments while every one is given, keywords after the first gap."""
        given = {**self.tensors, **self.values}
        positional: list = []
        keywords: dict = {}
        for i, a in enumerate(self.args):
            if a.name in given and len(positional) == i:
                positional.append(given[a.name])
            elif a.name in given:
                keywords[a.name] = given[a.name]
        return tuple(positional), keywords

    def describe(self) -> str:
        parts = [f"{n}={list(t.shape)}" for n, t in self.tensors.items()]
        return ", ".join(parts + [f"{n}={v!r}" for n, v in self.values.items()]) or "(none)"


def plan_inputs(module, options: dict, label: str) -> Plan:
    """Rule 3: each argument of ``forward`` from --input-shape, --input-value or --example-inputs."""
    torch = _torch()
    args = arguments(module)
    shapes = {k: list(v) for k, v in (options.get("input_shapes") or {}).items()}
    values = dict(options.get("input_values") or {})
    arrays, npz = _example_arrays(options.get("example_inputs"), label)
    dtypes = dict(options.get("input_dtypes") or {})
    known = [a.name for a in args]
    listing = ", ".join(f"{a.name}: {a.type_text}" for a in args) or "(none)"
    for given, path, what in (
        (shapes, label, ""),
        (values, label, ""),
        (arrays, npz, " (arrays of the example inputs)"),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            more = f" (+{len(unknown) - 8} more)" if len(unknown) > 8 else ""
            raise InputError(
                f"forward() has no argument(s) {', '.join(show(u) for u in unknown[:8])}{more}{what}",
                path=path,
                hint=f"forward's arguments: {listing}",
            )
    generator = torch.Generator().manual_seed(0)
    tensors: dict[str, object] = {}
    bound: dict[str, int | float | bool] = {}
    missing = []
    for a in args:
        n, shown = a.name, show(a.name)
        in_shape, in_value, in_array = n in shapes, n in values, n in arrays
        if a.kind == "other":
            if in_shape or in_value or in_array or a.required:
                raise InputError(
                    f"forward() argument '{a.label}' has a type mconv cannot give"
                    + ("" if in_shape or in_value or in_array else " and no default"),
                    path=label,
                    hint="mconv gives tensors (--input-shape, --example-inputs) and int, float and bool "
                    "values (--input-value); script a wrapper whose forward takes those",
                )
            continue
        if a.scalar or (a.kind == "any" and in_value):
            if in_shape:
                raise InputError(
                    f"forward() argument '{a.label}' is not a tensor: --input-shape does not apply",
                    path=label,
                    hint=f"give its value, baked into the ONNX model as a constant: --input-value {shown}={_SAMPLE[a.kind]}",
                )
            value = None
            if in_value:
                try:
                    value = _coerce(a.kind, values[n])
                except ValueError as exc:
                    raise InputError(
                        f"--input-value {shown}={show(str(values[n]))}: {exc} (forward() argument '{a.label}')",
                        path=label,
                        hint=f"e.g. --input-value {shown}={_SAMPLE[a.kind]}",
                    ) from None
            if in_array:
                from_array = _scalar_from_array(a, arrays[n], npz)
                if in_value and from_array != value:
                    raise InputError(
                        f"forward() argument '{shown}' is {value!r} by --input-value but {from_array!r} in the example inputs",
                        path=npz,
                        where=f"array '{shown}'",
                        hint="give it once",
                    )
                value = from_array
            if value is not None:
                bound[n] = value
            elif a.required:
                raise InputError(
                    f"forward() argument '{a.label}' needs a value",
                    path=label,
                    hint=f"--input-value {shown}={_SAMPLE[a.kind]} (baked into the ONNX model as a constant), "
                    f"or a 0-d array '{shown}' in --example-inputs",
                )
            continue
        if in_value:
            raise InputError(
                f"forward() argument '{a.label}' is a tensor; --input-value gives int, float "
                "and bool arguments",
                path=label,
                hint=f"give its shape (--input-shape {shown}=1,3,224,224) or an array '{shown}' in --example-inputs; "
                "it becomes an input of the ONNX model",
            )
        if in_array:
            array = arrays[n]
            if in_shape and list(array.shape) != shapes[n]:
                raise InputError(
                    f"--input-shape {shown}={','.join(map(str, shapes[n]))} but the example input has shape "
                    f"{list(array.shape)}",
                    path=npz,
                    where=f"array '{shown}'",
                    hint="give one of them, or make them agree",
                )
            try:
                tensors[n] = torch.from_numpy(np.array(array, copy=True))
            except TypeError as exc:
                raise InputError(
                    f"example input '{shown}' has dtype {array.dtype}, which torch cannot hold ({show(str(exc), 80)})",
                    path=npz,
                    where=f"array '{shown}'",
                    hint="store a float, integer or bool array",
                ) from None
        elif in_shape:
            tensors[n] = _random_input(torch, n, shapes[n], dtypes.get(n), label, generator)
        elif a.required:
            missing.append(n)
    if missing:
        example = " ".join(f"--input-shape {show(n)}=1,3,224,224" for n in missing)
        raise InputError(
            f"needs a shape for input(s) {', '.join(show(n) for n in missing)}",
            path=label,
            hint=f"e.g. {example} (or arrays in --example-inputs)",
        )
    return Plan(args, tensors, bound)


def mutated_attributes(module) -> list[str]:
    """Module attributes a TorchScript ``forward`` reassigns (``self._state = ...``): state that
    torch keeps between calls."""
    torch = _torch()
    if not isinstance(module, torch.jit.ScriptModule):
        return []
    names: set[str] = set()
    try:
        graph = module.forward.inlined_graph  # held: its nodes die with it
        blocks = [graph]
        while blocks:
            for node in blocks.pop().nodes():
                if node.kind() == "prim::SetAttr":
                    names.add(node.s("name"))
                blocks.extend(node.blocks())
    except Exception:  # a graph torch cannot inline: nothing to say
        return []
    return sorted(names)


def _needs_binding(module, plan: Plan, torch) -> bool:
    """Rule 3: a wrapper binds values unless ``forward`` takes exactly a prefix of tensors."""
    if isinstance(module, torch.jit.ScriptModule) and any(a.kind != "tensor" for a in plan.args):
        return True  # the TorchScript exporter makes every schema argument a graph input
    return bool(plan.values or plan.call()[1])


def _script_binding(torch, module, plan: Plan, label: str):
    """A TorchScript module whose ``forward(tensors...)`` calls ``module`` with the values as
    constants, so that the exporter's constant folding removes the branches they decide."""
    for n in [*plan.tensors, *plan.values]:
        if not n.isidentifier() or keyword.iskeyword(n):  # schema names are identifiers; checked anyway
            raise InputError(
                f"forward() argument '{show(n)}' is not an identifier", path=label, hint="re-save the model"
            )
    params = "".join(f", {n}: Tensor" for n in plan.tensors)
    call = ", ".join(
        [f"{n}={n}" for n in plan.tensors] + [f"{n}={_literal(v)}" for n, v in plan.values.items()]
    )

    class Bound(torch.jit.ScriptModule):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

    bound = Bound(module)
    try:
        bound.define(f"def forward(self{params}):\n    return self.inner({call})\n")
    except Exception as exc:
        raise InputError(
            f"cannot call forward({plan.describe()}) in TorchScript ({_describe(exc)})",
            path=label,
            hint="check --input-value against forward's argument types",
        ) from None
    return bound


def _python_binding(torch, module, plan: Plan):
    class Bound(torch.nn.Module):
        def __init__(self, inner, names: list[str]) -> None:
            super().__init__()
            self.inner = inner
            self.names = names

        def forward(self, *tensors):
            args, kwargs = Plan(plan.args, dict(zip(self.names, tensors)), plan.values).call()
            return self.inner(*args, **kwargs)

    return Bound(module, list(plan.tensors))


@contextlib.contextmanager
def _not_of_numbers(torch):
    """torch's TorchScript exporter refuses ``not`` on an int (a scripted ``if not len(self.buf):``
    becomes Not of an int64 constant). For the export, ``not`` casts to bool first, as Python's
    ``not`` reads a number; a ``not`` symbolic the user registered is left alone."""
    try:
        from torch.onnx._internal.torchscript_exporter import registration

        group = registration.registry.get_function_group("aten::__not_")
        ours = group is not None and not group._functions._overrides
    except Exception:  # another exporter layout: leave it as it is
        ours = False
    if ours:

        def not_(g, value):
            return g.op("Not", g.op("Cast", value, to_i=onnx.TensorProto.BOOL))

        torch.onnx.register_custom_op_symbolic("aten::__not_", not_, 9)
    try:
        yield
    finally:
        if ours:
            torch.onnx.unregister_custom_op_symbolic("aten::__not_", 9)


def _encoder_layer_symbolic(g, src, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps,
                            ln1_w, ln1_b, ln2_w, ln2_b, ffn1_w, ffn1_b, ffn2_w, ffn2_b, mask=None, mask_type=None):  # fmt: skip
    """``aten::_transformer_encoder_layer_fwd`` (the fused fast path a traced
    ``nn.TransformerEncoderLayer`` records in eval mode) as the ONNX ops of its definition
    (aten/src/ATen/native/transformers/transformer.cpp): self-attention with the packed
    ``qkv`` projection, residual, LayerNorm before (``norm_first``) or after each block, and the
    ReLU or exact-GELU feed-forward. Inputs are batch-first ``[B, S, E]`` as the fast path takes
    them. ``mask`` (bool: True is masked out, as ``_masked_softmax`` reads it; float: added)
    is ``[S, S]`` (mask_type 0), ``[B, S]`` key padding (1) or ``[B, H, S, S]`` (2)."""
    from torch.onnx._internal.torchscript_exporter import symbolic_helper as sh

    e = int(sh._get_const(embed_dim, "i", "embed_dim"))
    h = int(sh._get_const(num_heads, "i", "num_heads"))
    gelu = bool(sh._get_const(use_gelu, "b", "use_gelu"))
    pre = bool(sh._get_const(norm_first, "b", "norm_first"))
    epsilon = float(sh._get_const(eps, "f", "eps"))
    d = e // h

    def const(values, dtype=np.int64):
        return g.op("Constant", value_t=_torch().tensor(np.asarray(values, dtype=dtype)))

    def linear(x, w, b):
        return g.op("Add", g.op("MatMul", x, g.op("Transpose", w, perm_i=[1, 0])), b)

    def norm(x, w, b):
        if g.opset >= 17:
            return g.op("LayerNormalization", x, w, b, axis_i=-1, epsilon_f=epsilon)
        mean = g.op("ReduceMean", x, axes_i=[-1])
        c = g.op("Sub", x, mean)
        var = g.op("ReduceMean", g.op("Mul", c, c), axes_i=[-1])
        std = g.op("Sqrt", g.op("Add", var, const(epsilon, np.float32)))
        return g.op("Add", g.op("Mul", g.op("Div", c, std), w), b)

    x = norm(src, ln1_w, ln1_b) if pre else src
    qkv = g.op("Reshape", linear(x, qkv_w, qkv_b), const([0, -1, 3, h, d]))
    q, k, v = (g.op("Gather", qkv, const(i), axis_i=2) for i in range(3))  # [B, S, H, D] each
    q = g.op("Mul", g.op("Transpose", q, perm_i=[0, 2, 1, 3]), const(1.0 / math.sqrt(d), np.float32))
    scores = g.op("MatMul", q, g.op("Transpose", k, perm_i=[0, 2, 3, 1]))  # [B, H, S, S]
    if mask is not None and not sh._is_none(mask):
        kind = sh._maybe_get_const(mask_type, "i")
        if kind == 1:  # key padding [B, S] -> [B, 1, 1, S]
            mask = g.op("Unsqueeze", mask, const([1, 2]))
        if sh._is_bool(mask):
            mask = g.op("Where", mask, const(-np.inf, np.float32), const(0.0, np.float32))
        scores = g.op("Add", scores, mask)
    attn = g.op("Softmax", scores, axis_i=-1)
    out = g.op(
        "Transpose", g.op("MatMul", attn, g.op("Transpose", v, perm_i=[0, 2, 1, 3])), perm_i=[0, 2, 1, 3]
    )
    x = g.op("Add", linear(g.op("Reshape", out, const([0, -1, e])), proj_w, proj_b), src)
    if not pre:
        x = norm(x, ln1_w, ln1_b)
    y = norm(x, ln2_w, ln2_b) if pre else x
    y = linear(y, ffn1_w, ffn1_b)
    if gelu:
        erf = g.op("Erf", g.op("Div", y, const(math.sqrt(2.0), np.float32)))
        y = g.op("Mul", g.op("Mul", y, const(0.5, np.float32)), g.op("Add", erf, const(1.0, np.float32)))
    else:
        y = g.op("Relu", y)
    x = g.op("Add", linear(y, ffn2_w, ffn2_b), x)
    return norm(x, ln2_w, ln2_b) if not pre else x


@contextlib.contextmanager
def _fused_symbolics(torch):
    """For the export only: symbolics for the fused ops a trace records and torch's exporter has
    none for (``aten::_transformer_encoder_layer_fwd``, :func:`_encoder_layer_symbolic`),
    registered unless the user registered one, and removed after."""
    name, since = "aten::_transformer_encoder_layer_fwd", 9
    try:
        from torch.onnx._internal.torchscript_exporter import registration

        ours = not registration.registry.is_registered_op(name, 99)  # none at any opset
    except Exception:  # another exporter layout: leave it as it is
        ours = False
    if ours:
        torch.onnx.register_custom_op_symbolic(name, _encoder_layer_symbolic, since)
    try:
        yield
    finally:
        if ours:
            torch.onnx.unregister_custom_op_symbolic(name, since)


def _count_outputs(result, torch) -> int:
    if isinstance(result, torch.Tensor):
        return 1
    if isinstance(result, (tuple, list)):
        return sum(_count_outputs(r, torch) for r in result)
    if isinstance(result, dict):
        return sum(_count_outputs(r, torch) for r in result.values())
    return 0


# Terminal escapes (CSI colours, OSC titles, two-byte escapes) that torch and onnxscript put in
# their messages: removed before a message is shown, not escaped into ``\x1b[96m`` text.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def _lines(exc: BaseException) -> list[str]:
    """The non-blank lines of ``str(exc)``, terminal escapes removed."""
    return [line.strip() for line in _ANSI.sub("", str(exc)).strip().splitlines() if line.strip()]


def _describe(exc: BaseException, limit: int = 120) -> str:
    """``Type: message`` of ``exc`` in one line; a TorchScript error's last line is the Python
    error the script raised (``builtins.ValueError: ...``), after the source excerpt. The ONNX
    exporters wrap the error that stopped them (``ConversionError: ... This is step 2/3``):
    the cause's first line follows."""
    lines = _lines(exc)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.jit.Error) and lines:
        return show(lines[-1].removeprefix("builtins."), limit)
    first = lines[0] if lines else ""
    cause = exc.__cause__
    if cause is None or not type(exc).__module__.startswith("torch.onnx"):
        return f"{type(exc).__name__}: {show(first, limit)}"
    cause_lines = _lines(cause)
    return (
        f"{type(exc).__name__}: {show(first.split('. ')[0].rstrip('.'), limit)}; caused by "
        f"{type(cause).__name__}: {show(cause_lines[0] if cause_lines else '', limit)}"
    )


@contextlib.contextmanager
def _quiet_torch():
    """Around mconv's calls into torch: Python warnings ignored and logging disabled. torch,
    torchvision and onnxscript log through ``logging`` with handlers of their own (the dynamo
    exporter's "torchvision is not installed" lines, fake tensors' tracebacks of a failed meta
    function) and warn on import and export; stderr is mconv's (one line for an error).
    Restored after."""
    import logging

    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            logging.disable(previous)


def export_to_model(module, options: dict, label: str) -> ir.Model:
    """Rule 4: ``module`` through torch.onnx.export into the IR."""
    torch = _torch()
    module.eval()
    plan = plan_inputs(module, options, label)
    opset = int(options.get("opset") or DEFAULT_OPSET)
    state = mutated_attributes(module)
    try:  # a stateful forward runs on a copy: the export starts from the state as loaded
        probe = copy.deepcopy(module) if state else module
        args, kwargs = plan.call()
        with torch.no_grad():
            n_out = _count_outputs(probe(*args, **kwargs), torch)
    except Exception as exc:
        raise InputError(
            f"forward() failed on inputs {plan.describe()} ({_describe(exc)})",
            path=label,
            hint="check --input-shape, --input-value and --example-inputs against forward()",
        ) from None
    target = module
    if _needs_binding(module, plan, torch):
        script = isinstance(module, torch.jit.ScriptModule)
        target = (
            _script_binding(torch, module, plan, label) if script else _python_binding(torch, module, plan)
        )
    names = list(plan.tensors)
    if str(options.get("exporter") or "torchscript") == "dynamo":  # rule 7
        if isinstance(module, torch.jit.ScriptModule):
            raise InputError(
                "the dynamo exporter takes Python modules, not TorchScript",
                path=label,
                hint="drop exporter=dynamo",
            )
        model = _dynamo_export(torch, target, tuple(plan.tensors.values()), names, opset, label)
        model.metadata_props["mconv.import_notes"] = (
            f"exported by torch {torch.__version__} torch.export + dynamo ONNX exporter (opset {max(opset, 18)}), "
            f"inputs {', '.join(f'{n}={list(t.shape)}' for n, t in plan.tensors.items()) or '(none)'}"
        )
        return model
    outputs = ["output"] if n_out == 1 else [f"output_{i}" for i in range(n_out)]
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings(), _not_of_numbers(torch), _fused_symbolics(torch):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                target,
                tuple(plan.tensors.values()),
                buf,
                dynamo=False,
                input_names=names,
                output_names=outputs,
                opset_version=opset,
                do_constant_folding=True,
                training=torch.onnx.TrainingMode.EVAL,
            )
    except Exception as exc:
        raise InputError(
            f"torch's ONNX exporter failed ({_describe(exc, 160)})",
            path=label,
            hint=f"the module uses an op without an ONNX mapping at opset {opset}",
        ) from None
    model = from_proto(onnx.load_from_string(buf.getvalue()))
    notes = [
        f"exported by torch {torch.__version__} torch.onnx (TorchScript-based exporter, opset {opset}), "
        f"inputs {', '.join(f'{n}={list(t.shape)}' for n, t in plan.tensors.items()) or '(none)'}"
    ]
    if plan.values:
        baked = ", ".join(f"{n}={v!r}" for n, v in plan.values.items())
        notes.append(f"baked into the graph as constants: {baked} (the ONNX model has no input for them)")
    if state:
        notes.append(
            f"forward() keeps state between calls in torch (it reassigns {', '.join(show(s) for s in state[:6])}"
            f"{', ...' if len(state) > 6 else ''}): the ONNX model starts every run from the state as loaded "
            "and returns no new state, so each run is the module's first call after loading"
        )
    model.metadata_props["mconv.import_notes"] = "\n".join(notes)
    return model


# --- torch.export archives (.pt2) --------------------------------------------------------------

PT2_JSON_LIMIT = 256 << 20  # the serialized program (models/<name>.json)
PT2_CONFIG_LIMIT = 64 << 20  # a weights or constants config
# Targets the program may call: ATen / prims operators and the operator/math helpers torch.export
# writes for symbolic sizes. The deserializer resolves any "torch.X.Y" by getattr (torch.load
# would be a target like any other), so nothing else is accepted.
_PT2_TARGET = re.compile(
    r"^(torch\.ops\.(aten|prims)\.\w+\.\w+|_operator\.(getitem|add|sub|mul|floordiv|truediv|mod|neg|pow|"
    r"eq|ne|lt|le|gt|ge|and_|or_|not_)|math\.(ceil|floor|trunc|sqrt)|torch\.sym_(int|float|max|min|not|sqrt|ite)|"
    r"torch\._sym_sqrt)$"
)


def is_pt2_archive(path: Path) -> bool:
    """A zip written by ``torch.export.save``: ``<root>/archive_format`` and ``<root>/models/``."""
    try:
        names = [e.name for e in read_directory(Path(path))]
    except (InputError, OSError):
        return False
    root = names[0].split("/", 1)[0] if names and "/" in names[0] else ""
    return (
        bool(root)
        and f"{root}/archive_format" in names
        and any(n.startswith(f"{root}/models/") for n in names)
    )


def _pt2_targets(obj, found: set[str], depth: int = 0) -> None:
    if depth > 200:
        return
    if isinstance(obj, dict):
        t = obj.get("target")
        if isinstance(t, str):
            found.add(t)
        for v in obj.values():
            _pt2_targets(v, found, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            _pt2_targets(v, found, depth + 1)


def _pt2_tensors(path: Path, entries: dict, folder: str, config: dict, kind: str, torch, schema) -> dict:
    """Tensors of a weights / constants config from raw members; pickled ones are refused."""
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    out = {}
    for fqn, e in config.items():
        where = f"{kind} '{show(fqn)}'"
        if not isinstance(e, dict) or "path_name" not in e:
            raise InputError(
                f"{kind} entry '{show(fqn)}' is not a tensor record", path=str(path), where=where
            )
        if e.get("use_pickle", True) or not isinstance(e.get("tensor_meta"), dict):
            raise InputError(
                f"{kind} '{show(fqn)}' is stored as a pickle (a tensor subclass or a Python object); "
                "mconv never unpickles, and torch.export.load would (weights_only=False)",
                path=str(path),
                where=where,
                hint="export a plain module (plain tensors) and torch.export.save it again",
            )
        meta = e["tensor_meta"]
        try:
            dtype = _SERIALIZE_TO_TORCH_DTYPE[schema.ScalarType(meta["dtype"])]
            sizes = [int(s["as_int"]) for s in meta["sizes"]]
            strides = [int(s["as_int"]) for s in meta["strides"]]
            offset = int(meta["storage_offset"]["as_int"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"{kind} '{show(fqn)}' has a damaged tensor_meta ({type(exc).__name__})",
                path=str(path),
                where=where,
            ) from None
        if len(strides) != len(sizes) or min([*sizes, *strides, offset], default=0) < 0:
            raise InputError(f"{kind} '{show(fqn)}': bad sizes/strides/offset", path=str(path), where=where)
        member = entries.get(f"{folder}/{e['path_name']}")
        if member is None:
            raise InputError(
                f"{kind} '{show(fqn)}' has no member '{show(str(e['path_name']))}'",
                path=str(path),
                where=where,
                hint="the archive is incomplete; save it again",
            )
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = math.prod(sizes)
        reach = 0 if numel == 0 else offset + sum((n - 1) * s for n, s in zip(sizes, strides)) + 1
        if reach * itemsize > member.usize:
            raise InputError(
                f"{kind} '{show(fqn)}' needs {reach * itemsize} bytes but its member holds {member.usize}",
                path=str(path),
                where=where,
                hint="the archive is damaged; save it again",
            )
        raw = bytearray(read_member(path, member, member.usize))
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        t = (
            torch.as_strided(flat, sizes, strides, offset).clone()
            if numel
            else torch.empty(sizes, dtype=dtype)
        )
        out[fqn] = torch.nn.Parameter(t, requires_grad=False) if e.get("is_param") else t
    return out


def load_pt2(path: Path):
    """Rule 6: the ExportedProgram of a ``torch.export.save`` archive, built without unpickling."""
    import json

    torch = _torch()
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _bytes_to_dataclass

    path = Path(path)
    entries = {e.name: e for e in read_directory(path)}
    root = next(iter(entries)).split("/", 1)[0]
    if any(n.startswith(f"{root}/data/aotinductor/") for n in entries):
        raise InputError(
            "a torch.export archive with AOTInductor-compiled code (shared libraries); mconv runs no code from a file",
            path=str(path),
            hint="torch.export.save the ExportedProgram itself",
        )
    models = sorted(n for n in entries if n.startswith(f"{root}/models/") and n.endswith(".json"))
    if not models:
        raise InputError("a torch.export archive without a program (models/*.json)", path=str(path))
    name = f"{root}/models/model.json" if f"{root}/models/model.json" in models else models[0]
    model_name = name[len(f"{root}/models/") : -len(".json")]

    def read_json(member: str, limit: int, required: bool = True):
        e = entries.get(member)
        if e is None:
            if required:
                raise InputError(
                    f"member '{show(member)}' is missing", path=str(path), hint="save the archive again"
                )
            return None, b""
        if e.usize > limit:
            raise InputError(f"member '{show(member)}' is {e.usize} bytes (limit {limit})", path=str(path))
        data = read_member(path, e, limit)
        try:
            return json.loads(data), data
        except (ValueError, RecursionError) as exc:
            raise InputError(
                f"member '{show(member)}' is not JSON ({type(exc).__name__})",
                path=str(path),
                hint="save it again",
            ) from None

    program, program_bytes = read_json(name, PT2_JSON_LIMIT)
    targets: set[str] = set()
    _pt2_targets(program, targets)
    odd = sorted(t for t in targets if not _PT2_TARGET.match(t))
    if odd:
        raise InputError(
            f"the program calls {', '.join(show(t) for t in odd[:4])}{' ...' if len(odd) > 4 else ''}: "
            "not an ATen/prims operator",
            path=str(path),
            where=f"member '{show(name)}'",
            hint="mconv imports programs of ATen operators only (custom ops and higher-order ops are refused)",
        )
    tensors = {}
    for kind, sub, key in (
        ("weight", "weights", "model_weights_config"),
        ("constant", "constants", "model_constants_config"),
    ):
        cfg, _ = read_json(f"{root}/data/{sub}/{key}.json", PT2_CONFIG_LIMIT, required=False)
        if cfg is None:
            continue
        if not isinstance(cfg, dict) or not isinstance(cfg.get("config"), dict):
            raise InputError(f"{sub} config is not a {{'config': {{...}}}} record", path=str(path))
        tensors[kind] = _pt2_tensors(path, entries, f"{root}/data/{sub}", cfg["config"], kind, torch, schema)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            serialized = _bytes_to_dataclass(schema.ExportedProgram, program_bytes)
            # sample inputs (a torch.save pickle in the archive) are never read: b"" stands for none
            return ExportedProgramDeserializer().deserialize(
                serialized, tensors.get("weight", {}), tensors.get("constant", {}), b""
            ), model_name
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"torch cannot rebuild the exported program ({_describe(exc, 160)})",
            path=str(path),
            where=f"member '{show(name)}'",
            hint="save it again with torch.export.save (the same torch version)",
        ) from None


def _pt2_example_inputs(ep, options: dict, label: str) -> tuple[list[str], tuple]:
    """Zeros (floats: seeded normal) of each user input's shape; symbolic sizes from --input-shape."""
    torch = _torch()
    shapes = {k: list(v) for k, v in (options.get("input_shapes") or {}).items()}
    names = ep.graph_signature.user_inputs
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    generator = torch.Generator().manual_seed(0)
    args = []
    for name in names:
        val = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(val, torch.Tensor):
            raise InputError(
                f"program input '{show(name)}' is not a tensor", path=label, hint="export with tensor inputs"
            )
        shape = shapes.get(name)
        if shape is None:
            try:
                shape = [int(d) for d in val.shape]
            except Exception:
                raise InputError(
                    f"program input '{show(name)}' has symbolic sizes {list(val.shape)}",
                    path=label,
                    hint=f"give them: --input-shape {show(name)}=1,3,224,224",
                ) from None
        args.append(
            _random_input(torch, name, shape, str(val.dtype).removeprefix("torch."), label, generator)
        )
    return list(names), tuple(args)


def _dynamo_export(torch, target, args: tuple, names: list[str], opset: int, label: str):
    """torch.onnx.export(dynamo=True): torch.export then the ONNX translation (needs onnxscript)."""
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        raise InputError(
            "the dynamo exporter needs onnxscript", path=label, hint="pip install onnxscript"
        ) from None
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                target, args, dynamo=True, opset_version=max(opset, 18), input_names=names, verbose=False
            )
    except Exception as exc:
        raise InputError(
            f"torch's dynamo ONNX exporter failed ({_describe(exc, 160)})",
            path=label,
            hint="the program uses an operator without an ONNX translation",
        ) from None
    return from_proto(program.model_proto)


def _load_pt2_model(path: Path, options: dict) -> ir.Model:
    torch = _torch()
    label = str(path)
    ep, model_name = load_pt2(path)
    names, args = _pt2_example_inputs(ep, options, label)
    opset = int(options.get("opset") or 18)
    model = _dynamo_export(torch, ep, args, names, opset, label)
    model.metadata_props["mconv.import_notes"] = (
        f"torch.export archive (program '{show(model_name)}') rebuilt from its JSON program and raw weights "
        f"(no pickle read: the archive's sample inputs were not loaded); exported by torch {torch.__version__} "
        f"dynamo ONNX exporter (opset {max(opset, 18)}), inputs "
        + ", ".join(f"{n}={list(a.shape)}" for n, a in zip(names, args))
    )
    return model


def _load(paths: list[Path], options: dict) -> ir.Model:
    source = str(paths[0])
    with _quiet_torch():
        if is_factory_spec(source):
            module = _load_factory(source)
        elif is_pt2_archive(paths[0]):
            return _load_pt2_model(paths[0], options)
        else:
            module = _load_script(paths[0])
        return export_to_model(module, options, source)


def _sniff(head: bytes, path: Path) -> bool:
    return head[:4] == b"PK\x03\x04" and (is_torchscript_archive(path) or is_pt2_archive(path))


FORMAT = Format(
    name="torch",
    description="PyTorch: torch.export archive (.pt2), TorchScript archive (torch.jit.save) or package.module:factory spec",
    extensions=(".pt", ".pth", ".ptl", ".torchscript", ".pt2"),
    load=_load,
    sniff=_sniff,
)
