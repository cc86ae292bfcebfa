"""PyTorch import: TorchScript archives and ``package.module:factory`` specs, through torch's
own ONNX exporter (extra ``mconv[torch]``).

Rules:

1. Sources. A TorchScript archive (``torch.jit.save``; a zip holding ``code/`` and
   ``constants.pkl``) is loaded with ``torch.jit.load``: the archive holds TorchScript source
   that torch compiles, not pickled Python objects, so no code from the file runs as Python.
   A spec ``package.module:factory`` (not an existing file) imports ``package.module`` (the
   current directory is on the import path, as for ``python -m``) and calls ``factory()``,
   which must return an ``nn.Module``: the user asked for that code to run.
2. Anything else is refused, saying what it holds (:func:`examine`): a zip with ``data.pkl``
   and ``code/`` is TorchScript; a zip with ``data.pkl`` alone is a ``torch.save`` archive; a
   pickle that starts with torch.save's magic number is a legacy (pre-1.6) ``torch.save``;
   anything else is not a PyTorch file. ``torch.load`` is only ever called with
   ``weights_only=True``, after rule 5's checks, to tell a state dict (tensors, no
   architecture) from a pickled module; neither is imported.
3. Example inputs: ``options["input_shapes"]`` (the CLI's ``--input-shape NAME=1,3,224,224``)
   gives one shape per argument of ``forward`` (names from the TorchScript schema or the
   Python signature). Every argument without a default needs one; unknown names are refused.
   Inputs are float32 unless ``options["input_dtypes"]`` names a torch dtype (``{"ids":
   "int64"}``; integer example inputs are zeros, valid for any embedding).
4. Export: ``torch.onnx.export(..., dynamo=False)`` (the TorchScript-based exporter; the
   dynamo exporter needs ``onnxscript``, which mconv does not require), in eval mode, opset
   ``options["opset"]`` (default 17), constant folding on, into an in-memory buffer read by
   :func:`mconv.irio.from_proto`. Shapes are static as given: traced code may have baked
   sizes in, so a symbolic batch would be a guess. Outputs are named ``output`` (one) or
   ``output_0``, ``output_1``, ... Exporter failures (an op without an ONNX symbolic) become
   one-line :class:`mconv.errors.InputError`.
5. Nothing from the file reaches torch before it is checked (:func:`examine`): the zip's
   central directory against the real file (``formats/_zipsafe.py``: disks, counts, sizes,
   compression ratios, names, overlaps); every pickle walked opcode by opcode without
   unpickling (``formats/_torch_pickle.py``: lengths, memo indices, opcodes); every storage
   that ``data.pkl`` / ``constants.pkl`` declare against its ``data/<key>`` member's size, and
   every tensor view's last element against its storage; in TorchScript pickles, every global
   against what the TorchScript unpickler resolves itself (rebuild functions, storage types,
   ``__torch__`` classes whose source is in ``code/``). A legacy file's storages must fit in
   the bytes after its pickles. Damage torch still finds becomes one ``InputError``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir
from mconv.errors import InputError, show
from mconv.formats import Format
from mconv.formats._torch_pickle import STORAGE_ITEMSIZE, scan
from mconv.formats._zipsafe import looks_like_zip, read_directory, read_member
from mconv.irio import from_proto

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
            if g.module.startswith("__torch__.torch.classes."):
                continue  # torch's own C++ classes (packed quantized weights)
            if f"{root}/code/{g.module.replace('.', '/')}.py" in entries:
                continue
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
        text = (str(exc).strip().splitlines() or [""])[0]
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
        first = (str(exc).strip().splitlines() or [""])[0]
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


def forward_arguments(module) -> list[tuple[str, bool]]:
    """(name, required) for each argument of ``forward`` (rule 3)."""
    torch = _torch()
    if isinstance(module, torch.jit.ScriptModule):
        args = module.forward.schema.arguments[1:]  # drop self
        return [(a.name, a.default_value is None and not a.has_default_value()) for a in args]
    params = inspect.signature(module.forward).parameters.values()
    return [
        (p.name, p.default is inspect.Parameter.empty)
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]


def _example_inputs(module, shapes: dict[str, list[int]], label: str, dtypes: dict[str, str]):
    torch = _torch()
    args = forward_arguments(module)
    names = [n for n, _ in args]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise InputError(
            f"forward() has no argument(s) {', '.join(unknown)}",
            path=label,
            hint=f"forward's arguments: {', '.join(names) or '(none)'}",
        )
    missing = [n for n, required in args if required and n not in shapes]
    if missing:
        example = " ".join(f"--input-shape {n}=1,3,224,224" for n in missing)
        raise InputError(
            f"needs a shape for input(s) {', '.join(missing)}", path=label, hint=f"e.g. {example}"
        )
    used = []
    for n, _ in args:
        if n not in shapes:
            break  # later optional arguments keep their defaults
        used.append(n)
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for n in used:
        dtype = getattr(torch, str(dtypes.get(n, "float32")), None)
        if not isinstance(dtype, torch.dtype):
            raise InputError(
                f"unknown dtype {dtypes[n]!r} for input {n}", path=label, hint="e.g. float32, int64"
            )
        if dtype.is_floating_point:
            tensors.append(torch.randn(*shapes[n], generator=generator).to(dtype))
        else:  # token ids, indices: zeros are valid for any embedding or gather
            tensors.append(torch.zeros(*shapes[n], dtype=dtype))
    return used, tuple(tensors)


def _count_outputs(result, torch) -> int:
    if isinstance(result, torch.Tensor):
        return 1
    if isinstance(result, (tuple, list)):
        return sum(_count_outputs(r, torch) for r in result)
    if isinstance(result, dict):
        return sum(_count_outputs(r, torch) for r in result.values())
    return 0


def export_to_model(module, options: dict, label: str) -> ir.Model:
    """Rule 4: ``module`` through torch.onnx.export into the IR."""
    torch = _torch()
    module.eval()
    shapes = {k: list(v) for k, v in (options.get("input_shapes") or {}).items()}
    names, example = _example_inputs(module, shapes, label, dict(options.get("input_dtypes") or {}))
    opset = int(options.get("opset") or DEFAULT_OPSET)
    try:
        with torch.no_grad():
            n_out = _count_outputs(module(*example), torch)
    except Exception as exc:
        raise InputError(
            f"forward() failed on inputs of shape {[list(t.shape) for t in example]} "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ''})",
            path=label,
            hint="check --input-shape",
        ) from None
    outputs = ["output"] if n_out == 1 else [f"output_{i}" for i in range(n_out)]
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                example,
                buf,
                dynamo=False,
                input_names=names,
                output_names=outputs,
                opset_version=opset,
                do_constant_folding=True,
                training=torch.onnx.TrainingMode.EVAL,
            )
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise InputError(
            f"torch's ONNX exporter failed ({type(exc).__name__}: {first})",
            path=label,
            hint=f"the module uses an op without an ONNX mapping at opset {opset}",
        ) from None
    model = from_proto(onnx.load_from_string(buf.getvalue()))
    model.metadata_props["mconv.import_notes"] = (
        f"exported by torch {torch.__version__} torch.onnx (TorchScript-based exporter, opset {opset}), "
        f"inputs {', '.join(f'{n}={shapes[n]}' for n in names)}"
    )
    return model


def _load(paths: list[Path], options: dict) -> ir.Model:
    source = str(paths[0])
    if is_factory_spec(source):
        module = _load_factory(source)
    else:
        module = _load_script(paths[0])
    return export_to_model(module, options, source)


def _sniff(head: bytes, path: Path) -> bool:
    return head[:4] == b"PK\x03\x04" and is_torchscript_archive(path)


FORMAT = Format(
    name="torch",
    description="PyTorch: TorchScript archive (torch.jit.save) or package.module:factory spec",
    extensions=(".pt", ".pth", ".ptl", ".torchscript"),
    load=_load,
    sniff=_sniff,
)
