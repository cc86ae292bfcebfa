"""PyTorch import: TorchScript archives and ``package.module:factory`` specs, through torch's
own ONNX exporter (extra ``mconv[torch]``).

Rules:

1. Sources. A TorchScript archive (``torch.jit.save``; a zip holding ``code/`` and
   ``constants.pkl``) is loaded with ``torch.jit.load``: the archive holds TorchScript source
   that torch compiles, not pickled Python objects, so no code from the file runs as Python.
   A spec ``package.module:factory`` (not an existing file) imports ``package.module`` (the
   current directory is on the import path, as for ``python -m``) and calls ``factory()``,
   which must return an ``nn.Module``: the user asked for that code to run.
2. Anything else is refused, saying what it holds. ``torch.load`` is only ever called with
   ``weights_only=True``, to tell a state dict (tensors, no architecture) from a pickled module;
   neither is imported.
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
import zipfile
from pathlib import Path

import onnx
import onnx_ir as ir
from mconv.errors import InputError
from mconv.formats import Format
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


def is_torchscript_archive(path: Path) -> bool:
    """A zip written by ``torch.jit.save``: it holds ``<root>/code/`` and ``<root>/constants.pkl``."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, NotImplementedError, ValueError):
        return False  # a damaged directory (undecodable names, unknown zip version): not ours
    return any("/code/" in n for n in names) and any(n.endswith("/constants.pkl") for n in names)


def _refuse_non_script(path: Path):
    """Rule 2: say what a non-TorchScript file holds, loading it only with ``weights_only=True``."""
    torch = _torch()
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for pickled modules, RuntimeError for junk
        text = str(exc)
        if "weights_only" in text or "Unpickl" in type(exc).__name__ or "GLOBAL" in text:
            raise InputError(
                "holds pickled Python objects (a whole module saved with torch.save); mconv never unpickles code",
                path=str(path),
                hint=_HINT_SOURCE,
            ) from None
        raise InputError(
            f"not a readable PyTorch file ({type(exc).__name__}: {text.splitlines()[0][:100] if text else ''})",
            path=str(path),
            hint=_HINT_SOURCE,
        ) from None
    if _holds_tensors(obj, torch):
        raise InputError(
            "holds weights but no architecture (a state dict)",
            path=str(path),
            hint=_HINT_SOURCE + "; or import it as a weight file after saving with safetensors",
        )
    raise InputError(
        f"holds a {type(obj).__name__}, not a TorchScript module", path=str(path), hint=_HINT_SOURCE
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
    if not is_torchscript_archive(path):
        _refuse_non_script(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch 2.13 deprecates TorchScript; it still loads
            return torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:120]
        raise InputError(
            f"not a readable TorchScript archive ({type(exc).__name__}: {first})",
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
