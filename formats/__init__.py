"""Formats: files in, ``onnx_ir.Model`` out (and back where a format has a writer).

Each format is one module in this package that defines a module-level ``FORMAT = Format(...)``.
Detection looks at extensions first, then magic bytes. Importers record the source format and
its sha256 in the model's ``metadata_props`` (``mconv.source_format``, ``mconv.source_sha256``,
``mconv.source_name``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir
from mconv.errors import InputError
from mconv.fileio import require_file, sha256_file


@dataclass
class Format:
    name: str
    description: str
    extensions: tuple[str, ...]  # lower-case, with dot; multi-part allowed (".index")
    # load(paths, options) -> ir.Model. ``paths`` are the files the user gave, in detected order.
    load: Callable[[list[Path], dict], ir.Model] | None = None
    # save(model, dest, options) -> list of files written (atomically).
    save: Callable[[ir.Model, Path, dict], list[Path]] | None = None
    # sniff(head_bytes, path) -> True if the file is of this format (magic bytes / structure).
    sniff: Callable[[bytes, Path], bool] | None = None
    # how many files the format takes at most (Caffe: prototxt + caffemodel; Keras: json + h5).
    max_files: int = 1


# One line per format module. A new format is one new file plus one line here.
_MODULES = (
    "onnx_format",
    "keras",
    "caffe",
    "tflite",
    "pytorch",
    "dlk_json",
    "weights",
    "npz_format",
    "tf_checkpoint",
)

_loaded: dict[str, Format] | None = None


def check_modules(package: str, names: Sequence[str]) -> None:
    """Every listed module exists in ``package`` (found, not imported: the modules load lazily,
    on the first ``registry()`` call). A name that does not, a typo say, is an ImportError here,
    when the package is imported, instead of a format silently missing."""
    missing = [name for name in names if importlib.util.find_spec(f"{package}.{name}") is None]
    if missing:
        raise ImportError(
            f"{package} lists format module(s) that do not exist: {', '.join(missing)}",
            name=f"{package}.{missing[0]}",
        )


check_modules(__name__, _MODULES)


def registry() -> dict[str, Format]:
    global _loaded
    if _loaded is None:
        found: dict[str, Format] = {}
        for mod in _MODULES:
            fmt = importlib.import_module(f"{__name__}.{mod}").FORMAT
            found[fmt.name] = fmt
        _loaded = found
    return _loaded


def get_format(name: str) -> Format:
    reg = registry()
    if name not in reg:
        raise InputError(f"unknown format '{name}'", hint=f"choose one of: {', '.join(sorted(reg))}")
    return reg[name]


def _head(path: Path, n: int = 4096) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def detect(path: Path) -> Format:
    """Pick the format of one file: by extension, then by magic bytes."""
    name = path.name.lower()
    reg = registry()
    by_ext = [f for f in reg.values() if any(name.endswith(ext) for ext in f.extensions)]
    head = _head(path)
    if len(by_ext) == 1:
        return by_ext[0]
    candidates = by_ext or list(reg.values())
    for fmt in candidates:
        if fmt.sniff is not None and fmt.sniff(head, path):
            return fmt
    if by_ext:
        return by_ext[0]
    raise InputError(
        "cannot tell the model format from the extension or the first bytes",
        path=str(path),
        where=f"first bytes {head[:8]!r}",
        hint=f"pass --format (one of: {', '.join(sorted(reg))})",
    )


def _is_torch_spec(text: str) -> bool:
    return bool(re.match(r"^[\w.]+:\w+$", text)) and not Path(text).exists()


def import_model(
    paths: Sequence[str | Path], format: str | None = None, options: dict | None = None
) -> ir.Model:
    """Read one model from one or more files into the IR."""
    files = [Path(p) for p in paths]
    if not files:
        raise InputError("no input file given", hint="mconv import FILE [FILE2] -o OUT.onnx")
    # A PyTorch ``package.module:factory`` spec names code to run, not a file (formats/pytorch/__init__.py).
    spec = len(files) == 1 and format in (None, "torch") and _is_torch_spec(str(paths[0]))
    for p in files:
        if not spec:
            require_file(p, "model file")
    if spec:
        fmt = get_format("torch")
    elif format:
        fmt = get_format(format)
    else:
        kinds = {detect(p).name for p in files}
        if len(kinds) == 1:
            fmt = get_format(kinds.pop())
        else:
            # Split formats (Caffe prototxt + caffemodel, Keras JSON + HDF5): the format whose
            # loader takes several files and whose extensions cover them all wins.
            multi = [
                f
                for f in registry().values()
                if f.max_files >= len(files)
                and all(any(p.name.lower().endswith(e) for e in f.extensions) for p in files)
            ]
            if len(multi) != 1:
                raise InputError(
                    f"files look like different formats ({', '.join(sorted(kinds))})",
                    path=", ".join(map(str, files)),
                    hint="pass --format",
                )
            fmt = multi[0]
    if len(files) > fmt.max_files:
        raise InputError(
            f"format '{fmt.name}' takes at most {fmt.max_files} file(s), got {len(files)}",
            hint="give only the model file(s) of one model",
        )
    if fmt.load is None:
        raise InputError(f"format '{fmt.name}' cannot be imported, only exported")
    model = fmt.load(files, dict(options or {}))
    model.metadata_props["mconv.source_format"] = fmt.name
    model.metadata_props["mconv.source_name"] = ",".join(p.name for p in files)
    model.metadata_props["mconv.source_sha256"] = "" if spec else ",".join(sha256_file(p) for p in files)
    return model


def open_model_with_shapes(path: str | Path, shapes: dict[str, list[int]] | None) -> ir.Model:
    """Open a model file (ONNX or any importable format) with ``--input-shape`` applied."""
    p = Path(path)
    if p.suffix.lower() == ".onnx":
        from mconv.irio import load_onnx

        model = load_onnx(p)
    else:
        model = import_model([p], options={"input_shapes": dict(shapes or {})})
    from mconv.edit.input_shapes import fix_input_shapes

    fix_input_shapes(model, dict(shapes or {}), path=str(p))
    return model
