"""PyTorch pickles read without unpickling: a walk of the opcodes (``pickletools.genops``) over
a small symbolic stack, so that nothing in the file is ever called or imported.

What the walk gives (:class:`PickleScan`): every global the pickle names (``module``, ``name``),
every storage its persistent ids declare (``('storage', StorageType, key, location, numel)``)
and every tensor view built on one (``torch._utils._rebuild_tensor*`` / ``_rebuild_qtensor``:
storage offset, size, stride). Callers compare those against the archive's members before
torch reads anything.

What it refuses (one :class:`mconv.errors.InputError`, with the byte position in the pickle):
- anything ``genops`` cannot decode: an unknown opcode, a string or bytes whose declared length
  runs past the end of the pickle (torch's C++ unpickler would allocate that length first),
  text that is not UTF-8, a pickle without STOP;
- a FRAME longer than what is left, a memo index that is not the next one (torch's unpickler
  reserves memory for the index), a GET of an index never stored;
- opcodes PyTorch never writes and that only serve to build arbitrary objects (INST, OBJ, EXT*,
  PERSID, buffers);
- a stack that does not balance (a pop from an empty stack, a mark that is not there);
- a storage persistent id whose numel is not a non-negative integer, whose key is not a
  string, or that names a storage type with no known element size; a tensor view with a
  negative offset, size or stride, or whose last element lies beyond its storage.
"""

from __future__ import annotations

import io
import pickletools
import struct
from dataclasses import dataclass, field
from pathlib import Path

from mconv.errors import InputError, show

# Element sizes of the storage classes torch writes in persistent ids (``torch.FloatStorage``).
STORAGE_ITEMSIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
    "BoolStorage": 1, "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8,
    "QUInt8Storage": 1, "QInt8Storage": 1, "QInt32Storage": 4, "QUInt4x2Storage": 1,
    "QUInt2x4Storage": 1, "UntypedStorage": 1,
}  # fmt: skip
STORAGE_MODULES = ("torch", "torch.storage")
# Element sizes of the dtypes ``_rebuild_tensor_v3`` names (its storage is untyped: bytes).
DTYPE_ITEMSIZE = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "complex128": 16, "cdouble": 16,
    "complex64": 8, "cfloat": 8, "complex32": 4, "chalf": 4, "qint8": 1, "quint8": 1, "qint32": 4,
    "quint4x2": 1, "quint2x4": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "bits8": 1, "bits16": 2, "bits1x8": 1,
    "bits2x4": 1, "bits4x2": 1,
}  # fmt: skip
# The rebuild functions whose first four arguments are (storage, offset, size, stride).
VIEW_REBUILDERS = {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_qtensor"}
PARAMETER_REBUILDERS = {"_rebuild_parameter", "_rebuild_parameter_with_state"}

_REFUSED_OPCODES = {
    "INST", "OBJ", "EXT1", "EXT2", "EXT4", "PERSID", "NEXT_BUFFER", "READONLY_BUFFER", "NEWOBJ_EX",
}  # fmt: skip


@dataclass(frozen=True)
class Global:
    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass
class Storage:
    key: str
    type_name: str
    itemsize: int
    numel: int
    pos: int  # byte position of its persistent id in the pickle

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class Tensor:
    storage: Storage


class _Opaque:
    """Any value the walk does not need to know (dicts, lists, objects)."""


OPAQUE = _Opaque()


@dataclass
class PickleScan:
    globals: list[tuple[Global, int]] = field(default_factory=list)  # (global, byte position)
    storages: dict[str, Storage] = field(default_factory=dict)
    other_pids: list[tuple[str, int]] = field(default_factory=list)  # persistent ids not 'storage'
    tensors: int = 0
    end: int = 0  # offset just past STOP
    top: object = None  # the value left on the stack


class _Refused(Exception):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.pos = pos


def scan(data: bytes | io.BytesIO, path: Path | str, member: str, *, start: int = 0) -> PickleScan:
    """Walk one pickle (from ``start`` when ``data`` is bytes; from the stream's position for a
    stream) and return what it declares; refuse what rule 2 of the module docstring lists."""
    stream = data if isinstance(data, io.BytesIO) else io.BytesIO(data)
    if not isinstance(data, io.BytesIO):
        stream.seek(start)
    total = len(stream.getbuffer())
    try:
        return _walk(stream, total)
    except _Refused as exc:
        raise InputError(
            str(exc), path=str(path), where=f"pickle '{show(member)}' at byte {exc.pos}", hint=_HINT
        ) from None
    except (ValueError, struct.error, EOFError, OverflowError, IndexError, KeyError) as exc:
        # genops: unknown opcode, truncated argument, bad UTF-8, no STOP, ...
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(
            f"pickle is damaged ({show(text, 160)})",
            path=str(path),
            where=f"pickle '{show(member)}'",
            hint=_HINT,
        ) from None


_HINT = "the file is damaged or was not written by torch.save / torch.jit.save; re-save the model"


def _walk(stream: io.BytesIO, total: int) -> PickleScan:
    out = PickleScan()
    stack: list = []
    marks: list[int] = []
    memo: dict[int, object] = {}

    def pop(pos: int):
        if not stack or (marks and len(stack) <= marks[-1]):
            raise _Refused("pickle pops from an empty stack", pos)
        return stack.pop()

    def pop_mark(pos: int) -> list:
        if not marks:
            raise _Refused("pickle closes a mark that was never opened", pos)
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def put(index: int, pos: int) -> None:
        if index > len(memo):
            raise _Refused(f"memo index {index} skips ahead of the {len(memo)} stored", pos)
        if not stack or (marks and len(stack) <= marks[-1]):
            raise _Refused("pickle memoizes from an empty stack", pos)
        memo[index] = stack[-1]

    def number(arg: object, pos: int) -> int:
        """An opcode's integer argument (pickletools decodes it as an int for these opcodes)."""
        if not isinstance(arg, int):
            raise _Refused(f"opcode argument {arg!r} is not an integer", pos)
        return arg

    stopped = False
    for op, arg, at in pickletools.genops(stream):
        assert at is not None, "genops gives every opcode's position on a BytesIO"
        pos = at
        name = op.name
        if name in _REFUSED_OPCODES:
            raise _Refused(f"opcode {name}, which PyTorch never writes", pos)
        if name == "STOP":
            out.top = pop(pos)
            stopped = True
            break
        if name == "PROTO":
            continue
        if name == "FRAME":
            if number(arg, pos) > total - stream.tell():
                raise _Refused(f"frame of {arg} bytes runs past the end of the pickle", pos)
            continue
        if name == "MARK":
            marks.append(len(stack))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            put(number(arg, pos), pos)
        elif name == "MEMOIZE":
            put(len(memo), pos)
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            index = number(arg, pos)
            if index not in memo:
                raise _Refused(f"memo index {arg} was never stored", pos)
            stack.append(memo[index])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
            else:
                attr, module = pop(pos), pop(pos)
                if not isinstance(module, str) or not isinstance(attr, str):
                    raise _Refused("STACK_GLOBAL without two strings", pos)
            g = Global(module, attr)
            out.globals.append((g, pos))
            stack.append(g)
        elif name == "BINPERSID":
            stack.append(_persistent(pop(pos), pos, out))
        elif name == "REDUCE":
            args = pop(pos)
            func = pop(pos)
            stack.append(_reduce(func, args, pos, out))
        elif name == "NEWOBJ":
            pop(pos), pop(pos)
            stack.append(OPAQUE)
        elif name == "BUILD":
            pop(pos)
            if not stack:
                raise _Refused("BUILD without an object", pos)
        elif name == "TUPLE":
            stack.append(tuple(pop_mark(pos)))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = [pop(pos) for _ in range(n)][::-1]
            stack.append(tuple(items))
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"):
            stack.append(OPAQUE)
        elif name in ("LIST", "DICT", "FROZENSET"):
            pop_mark(pos)
            stack.append(OPAQUE)
        elif name in ("APPENDS", "SETITEMS", "ADDITEMS"):
            pop_mark(pos)
            if not stack:
                raise _Refused(f"{name} without a container", pos)
        elif name == "APPEND":
            pop(pos)
            if not stack:
                raise _Refused("APPEND without a list", pos)
        elif name == "SETITEM":
            pop(pos), pop(pos)
            if not stack:
                raise _Refused("SETITEM without a dict", pos)
        elif name == "POP":
            pop(pos)
        elif name == "POP_MARK":
            pop_mark(pos)
        elif name == "DUP":
            stack.append(stack[-1] if stack else pop(pos))
        elif op.arg is not None or name in ("NONE", "NEWTRUE", "NEWFALSE"):
            stack.append(arg)  # ints, floats, strings, bytes, None, booleans
        else:
            raise _Refused(f"opcode {name} is not read", pos)
    if not stopped:
        raise _Refused("pickle ends without STOP", total)
    out.end = stream.tell()
    return out


def _persistent(pid, pos: int, out: PickleScan):
    if not isinstance(pid, tuple) or not pid or not isinstance(pid[0], str):
        raise _Refused("persistent id is not a tuple naming its kind", pos)
    if pid[0] != "storage":
        out.other_pids.append((pid[0], pos))
        return OPAQUE
    if len(pid) < 5:
        raise _Refused(f"storage persistent id of {len(pid)} fields (5 expected)", pos)
    kind, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if (
        not isinstance(kind, Global)
        or kind.module not in STORAGE_MODULES
        or kind.name not in STORAGE_ITEMSIZE
    ):
        raise _Refused(f"storage of unknown type '{show(kind)}'", pos)
    if not isinstance(key, str) or not isinstance(location, str):
        raise _Refused("storage key or location is not a string", pos)
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise _Refused(f"storage '{show(key)}' has element count {show(numel)}", pos)
    itemsize = STORAGE_ITEMSIZE[kind.name]
    known = out.storages.get(key)
    if known is not None and known.nbytes != numel * itemsize:
        raise _Refused(
            f"storage '{show(key)}' is declared with {known.nbytes} and with {numel * itemsize} bytes", pos
        )
    storage = known or Storage(key, kind.name, itemsize, numel, pos)
    out.storages[key] = storage
    return storage


def _ints(value, what: str, pos: int) -> tuple[int, ...]:
    if not isinstance(value, tuple) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise _Refused(f"tensor {what} is not a tuple of integers", pos)
    if any(v < 0 for v in value):
        raise _Refused(f"tensor {what} {show(value)} has a negative entry", pos)
    return value


def _reduce(func, args, pos: int, out: PickleScan):
    if not isinstance(func, Global) or not isinstance(args, tuple):
        return OPAQUE
    if func.module == "torch._utils" and func.name in PARAMETER_REBUILDERS:
        return args[0] if args and isinstance(args[0], Tensor) else OPAQUE
    if func.module != "torch._utils" or func.name not in VIEW_REBUILDERS:
        return OPAQUE
    if len(args) < 4 or not isinstance(args[0], Storage):
        raise _Refused(f"{func.name} without (storage, offset, size, stride)", pos)
    storage, offset = args[0], args[1]
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise _Refused(f"tensor on storage '{show(storage.key)}' has offset {show(offset)}", pos)
    size, stride = _ints(args[2], "size", pos), _ints(args[3], "stride", pos)
    if len(size) != len(stride):
        raise _Refused(f"tensor size {show(size)} and stride {show(stride)} differ in rank", pos)
    itemsize = 1
    if func.name == "_rebuild_tensor_v3":
        dtype = args[6] if len(args) > 6 else None
        if not isinstance(dtype, Global) or dtype.module != "torch" or dtype.name not in DTYPE_ITEMSIZE:
            raise _Refused(f"tensor of unknown dtype '{show(dtype)}'", pos)
        itemsize = DTYPE_ITEMSIZE[dtype.name]
    else:
        itemsize = storage.itemsize
    if all(s > 0 for s in size):
        last = offset + sum((s - 1) * st for s, st in zip(size, stride))
        need = (last + 1) * itemsize
    else:
        need = 0  # an empty tensor reads nothing
    if need > storage.nbytes:
        raise _Refused(
            f"tensor of size {show(list(size))}, stride {show(list(stride))} at offset {offset} needs "
            f"{need} bytes of storage '{show(storage.key)}', which holds {storage.nbytes}",
            pos,
        )
    out.tensors += 1
    return Tensor(storage)
