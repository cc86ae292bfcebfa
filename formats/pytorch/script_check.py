"""A static check of the TorchScript source in an archive, before ``torch.jit.load`` compiles it.

``torch.jit.save`` writes every method, function and class of a scripted module as TorchScript
source (a subset of Python syntax) under ``code/``; ``torch.jit.load`` compiles it and runs
``__setstate__`` methods while loading, and mconv then runs ``forward``. TorchScript can call any
registered operator: ``torch.from_file(path, shared=True, size=n)`` creates or overwrites a file,
``torch.save`` writes one, ``print`` writes to stdout. So every ``.py`` member of the archive is
parsed with :mod:`ast` and checked against an allowlist before torch sees the archive.

Rules (every problem found is listed in one :class:`mconv.errors.InputError`):

1. Text. Every ``.py`` member (any folder, any case: torch's zip reader matches names without
   case) is UTF-8 that :mod:`ast` parses. Outside string literals only printable ASCII and
   newlines (no tabs, carriage returns, form feeds, backslashes, non-ASCII); string literals are
   plain ``"..."`` / ``'...'`` (no prefixes, no triple quotes). TorchScript's own lexer reads
   that text exactly as Python's does, so the tree checked is the code torch compiles.
2. Syntax. Module level: classes, functions and ``op_version_set = N``. Classes derive from
   nothing or ``Module``, ``NamedTuple``, ``Interface``, ``ModuleInterface``, ``Enum``; no
   decorators, no nested functions or classes. Statements and expressions are those the
   TorchScript printer writes (assignments, ``if``/``for``/``while``/``with``, calls,
   attributes, subscripts, literals, operators, comprehensions); anything else (``import``,
   ``lambda``, ``try``, ``global``, starred arguments, bytes literals) is refused.
3. Names. A bare name is a local of its function (an argument or an assigned name), a
   TorchScript builtin (:data:`BUILTINS`: ``len``, ``range``, ``annotate``,
   ``unchecked_cast``, ``getattr`` with a literal name, the type names...), or one of the
   roots below. ``print``, ``fork`` and ``awaitable`` are refused (``print`` writes to
   stdout, breaking ``--json`` and the one-line error; forks run code on other threads), and
   so is binding a local of those names.
4. Roots. ``torch.X`` is the ATen operator ``aten::X``; ``ops.aten.X`` the same; ``ops.prim.X``
   a prim operator from :data:`PRIM_PURE`; any other namespace (``ops.quantized``,
   ``ops.c10d``, custom ops) is refused. ``CONSTANTS.cN`` is the archive's constant table.
   ``__torch__.a.b.C`` must be a class or function defined in ``code/__torch__/a/b.py``;
   ``__torch__.torch.classes.*`` (C++ custom classes such as c10d's ``FileStore``) is refused.
5. Operators. An ATen operator must exist in this torch (``torch._C._jit_get_all_schemas``) and
   not be in :data:`ATEN_IMPURE` (operators that read or write files or stdout, or change the
   process's global state). An operator with a ``str`` argument (the only way to name a file)
   must also be in :data:`ATEN_STR_REVIEWED`, the operators whose strings were reviewed as
   modes, messages or string methods: an operator a later torch adds is refused until it is
   reviewed. Every attribute name anywhere (``x.from_file(...)``: a method of a value is the
   ATen operator of that name) and every literal name given to ``getattr`` is checked against
   the refused operator names as well.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from mconv.errors import InputError, show
from mconv.formats._zipsafe import ZipEntry, read_member

CODE_LIMIT = 64 << 20  # one code member (the largest real models hold a few hundred KB)

# ATen operators that reach outside the tensors they are given: files (from_file maps a file,
# shared=True creates or overwrites it; save writes one), stdout (_print), the process's random
# generator and library caches.
ATEN_IMPURE = frozenset(
    {"from_file", "save", "_print", "manual_seed", "seed", "_cufft_set_plan_cache_max_size"}
)

# ATen operators with a ``str`` argument, reviewed: the string is a mode, a message, a dict key,
# a device name or an operand of a string method; none names a file or reaches outside.
ATEN_STR_REVIEWED = frozenset(
    """
    Delete Float Int __contains__ __getitem__ __interpolate __upsample _assert_async _assert_scalar
    _convolution_mode _functional_assert_async _functional_assert_scalar _linalg_check_errors
    _linalg_eigh _linalg_svd _mixed_dtypes_linear _segment_reduce_backward _set_item _sparse_mm
    _sparse_mm_reduce_impl _sparse_mm_reduce_impl_backward _sparse_semi_structured_linear
    _sparse_semi_structured_tile _test_ambiguous_defaults _test_string_default add any capitalize
    center clear conv1d conv2d conv3d copy count device dict div div_ divide divide_ einsum endswith
    eq expandtabs fft_fft fft_fft2 fft_fftn fft_hfft fft_hfft2 fft_hfftn fft_ifft fft_ifft2 fft_ifftn
    fft_ihfft fft_ihfft2 fft_ihfftn fft_irfft fft_irfft2 fft_irfftn fft_rfft fft_rfft2 fft_rfftn find
    format ge gelu gelu_ gelu_backward get get_autocast_dtype gt index index_reduce index_reduce_
    isalnum isalpha isdecimal isdigit isidentifier islower isnumeric isprintable isspace istitle
    isupper items join keys le len linalg_cond linalg_eigh linalg_eigvalsh linalg_lstsq
    linalg_matrix_norm linalg_norm linalg_qr linalg_svd linalg_svdvals list ljust lower lstrip lt
    meshgrid nanquantile ne ord pad pad_sequence partition percentFormat pop popitem quantile
    remove replace rfind rindex rjust rpartition rsplit rstrip scatter scatter_ scatter_reduce
    scatter_reduce_ searchsorted segment_reduce setdefault slice sort sorted split splitlines
    startswith stft strip swapcase title update upper values warn zfill
    """.split()
)

# prim operators the printer writes as ``ops.prim.X`` for tensor properties, exceptions and
# container helpers. Everything else in prim (Print, PythonOp, rpc_*, profiling, fusion groups,
# AddStatValue, TimePoint, awaitables) is refused.
PRIM_PURE = frozenset(
    """
    RaiseException data device dtype layout grad requires_grad name nbytes itemsize index min max
    abs id tolist type rangelist NumToTensor StringIndex ModuleContainerIndex EnumName EnumValue
    TupleIndex TupleUnpack unchecked_cast unchecked_unwrap_optional Uninitialized IfThenElse
    is_cpu is_cuda is_ipu is_maia is_meta is_mkldnn is_mps is_mtia is_nested is_quantized
    is_sparse is_sparse_csr is_vulkan is_xla is_xpu
    """.split()
)

# Names TorchScript resolves without an import: the compiler's builtins and the importer's
# special forms, constants and type names.
BUILTINS = frozenset(
    """
    annotate unchecked_cast uninitialized isinstance getattr hasattr len int float bool str complex
    tuple list dict range zip enumerate min max abs all any divmod sum ord chr bin hex oct round
    hash id pow sorted rangelist _to_tensor AssertionError inf nan infj nanj
    Tensor List Dict Tuple Optional Union NoneType Any Final Future RRef Await Device Stream
    Storage Generator ScalarType Layout MemoryFormat QScheme Scalar number Number
    """.split()
)
ROOTS = frozenset({"torch", "ops", "CONSTANTS", "__torch__"})
REFUSED_NAMES = {
    "print": "writes to stdout",
    "fork": "runs code on another thread",
    "awaitable": "runs code later",
}
_BASES = frozenset({"Module", "NamedTuple", "Interface", "ModuleInterface", "Enum"})

_STATEMENTS = (
    ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.If, ast.For, ast.While, ast.With,
    ast.Pass, ast.Break, ast.Continue, ast.Expr, ast.Assert, ast.Raise, ast.Delete,
)  # fmt: skip
_EXPRESSIONS = (
    ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Attribute, ast.Name,
    ast.Constant, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Dict, ast.IfExp, ast.ListComp,
    ast.DictComp, ast.comprehension, ast.keyword, ast.withitem, ast.arguments, ast.arg,
    ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop,
)  # fmt: skip
_TOKENS = {
    tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP, tokenize.NEWLINE, tokenize.NL,
    tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER,
}  # fmt: skip
# A plain string literal: no prefix, no triple quotes, no control characters (the printer writes
# them as escapes).
_PLAIN_STRING = re.compile(
    r"""^(?:"(?:[^"\\\x00-\x1f\x7f]|\\[\x20-\x7e])*"|'(?:[^'\\\x00-\x1f\x7f]|\\[\x20-\x7e])*')$"""
)
_OUTSIDE = re.compile(r"[^\x20-\x5b\x5d-\x7e\n]")  # printable ASCII but the backslash, newline
_CONSTANT = re.compile(r"^c\d+$")


@functools.lru_cache(maxsize=1)
def operator_names() -> dict[str, dict[str, bool]]:
    """{namespace: {name: has a str argument}} of every operator schema this torch registers."""
    import torch

    out: dict[str, dict[str, bool]] = {}
    for schema in torch._C._jit_get_all_schemas():
        ns, _, name = schema.name.partition("::")
        has_str = any("str" in str(a.type) for a in schema.arguments)
        table = out.setdefault(ns, {})
        table[name] = table.get(name, False) or has_str
    return out


def aten_problem(name: str) -> str | None:
    """Why ``aten::name`` is refused, or None for a pure operator."""
    aten = operator_names().get("aten", {})
    if name not in aten:
        return "not an ATen operator"
    if name in ATEN_IMPURE:
        return "reads or writes files, stdout or global state"
    if aten[name] and name not in ATEN_STR_REVIEWED:
        return "an operator with a string argument that mconv has not reviewed"
    return None


@functools.lru_cache(maxsize=1)
def _refused_attributes() -> frozenset[str]:
    """Attribute names refused anywhere: a method of a value is the ATen operator of its name."""
    aten = operator_names().get("aten", {})
    unreviewed = {n for n, s in aten.items() if s and n not in ATEN_STR_REVIEWED}
    return frozenset(ATEN_IMPURE | unreviewed | set(REFUSED_NAMES))


@dataclass(frozen=True)
class Finding:
    member: str
    line: int
    name: str
    why: str


class _FileChecker:
    def __init__(self, member: str, defined: dict[str, set[str]], found: list[Finding]) -> None:
        self.member = member
        self.defined = defined
        self.found = found
        self.refused = _refused_attributes()

    def add(self, node: ast.AST | None, name: str, why: str) -> None:
        self.found.append(Finding(self.member, getattr(node, "lineno", 0), name, why))

    # --- structure -------------------------------------------------------------------------

    def module(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef):
                self.class_def(stmt)
            elif isinstance(stmt, ast.FunctionDef):
                self.function(stmt, class_body=False)
            elif (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == "op_version_set"
                and isinstance(stmt.value, ast.Constant)
                and type(stmt.value.value) is int
            ):
                continue
            else:
                self.add(stmt, type(stmt).__name__, "a statement outside a class or function")

    def class_def(self, node: ast.ClassDef) -> None:
        if node.decorator_list or node.keywords:
            self.add(node, node.name, "a decorated class or class keywords")
        for base in node.bases:
            if not (isinstance(base, ast.Name) and base.id in _BASES):
                self.add(base, ast.unparse(base), "a base class TorchScript does not write")
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef):
                self.function(stmt, class_body=True)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                self.expr(stmt.annotation, set())
                if stmt.value is not None:
                    self.expr(stmt.value, set())
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    self.expr(stmt.value, set())
                elif (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "__annotations__"
                    and isinstance(target.slice, ast.Constant)
                    and isinstance(target.slice.value, str)
                ):
                    self.expr(stmt.value, set())
                else:
                    self.add(stmt, ast.unparse(target), "an assignment TorchScript does not write")
            elif isinstance(stmt, ast.Pass):
                continue
            else:
                self.add(stmt, type(stmt).__name__, "a statement TorchScript does not write in a class")

    def function(self, node: ast.FunctionDef, class_body: bool) -> None:
        if node.decorator_list:
            self.add(node, node.name, "a decorated function")
        args = node.args
        if args.vararg or args.kwarg or args.posonlyargs or args.kwonlyargs:
            self.add(node, node.name, "*args, **kwargs or keyword-only arguments")
        local = {a.arg for a in args.args}
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.Name) and isinstance(stmt.ctx, (ast.Store, ast.Del)):
                local.add(stmt.id)
        for name in sorted(local & set(REFUSED_NAMES)):
            self.add(node, name, f"a local named after a builtin that {REFUSED_NAMES[name]}")
        for a in args.args:
            if a.annotation is not None:
                self.expr(a.annotation, local)
        for default in args.defaults:
            self.expr(default, local)
        if node.returns is not None:
            self.expr(node.returns, local)
        for stmt in node.body:
            self.statement(stmt, local)

    def statement(self, node: ast.stmt, local: set[str]) -> None:
        if not isinstance(node, _STATEMENTS):
            self.add(node, type(node).__name__, "a statement TorchScript does not write")
            return
        if isinstance(node, (ast.For, ast.While)) and node.orelse:
            self.add(node, "else", "a loop with an else clause")
        if isinstance(node, ast.AnnAssign):
            self.expr(node.annotation, local)
            self.expr(node.target, local)
            if node.value is not None:
                self.expr(node.value, local)
            return
        for _, value in ast.iter_fields(node):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, ast.stmt):
                    self.statement(item, local)
                elif isinstance(item, ast.AST):
                    self.expr(item, local)

    # --- expressions -----------------------------------------------------------------------

    def expr(self, node: ast.AST, local: set[str]) -> None:
        if not isinstance(node, _EXPRESSIONS):
            self.add(node, type(node).__name__, "an expression TorchScript does not write")
            return
        if isinstance(node, ast.Constant):
            if not (
                node.value is None
                or node.value is Ellipsis
                or type(node.value) in (str, int, float, complex, bool)
            ):
                self.add(node, type(node.value).__name__, "a literal TorchScript does not write")
            return
        if isinstance(node, (ast.Attribute, ast.Name)):
            self.reference(node, local)
            return
        if isinstance(node, ast.Call):
            self.call(node, local)
            return
        for child in ast.iter_child_nodes(node):
            self.expr(child, local)

    def call(self, node: ast.Call, local: set[str]) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) and func.id not in local else None
        self.expr(func, local)
        for arg in node.args:
            self.expr(arg, local)
        for kw in node.keywords:
            if kw.arg is None:
                self.add(kw, "**", "keyword unpacking")
            self.expr(kw.value, local)
        if name in ("getattr", "hasattr"):
            literal = node.args[1] if len(node.args) == 2 else None
            if not (isinstance(literal, ast.Constant) and isinstance(literal.value, str)):
                self.add(node, name, "an attribute name that is not a literal")
            elif literal.value in self.refused:
                self.add(node, literal.value, "a refused operator reached through getattr")

    def reference(self, node: ast.Attribute | ast.Name, local: set[str]) -> None:
        parts: list[str] = []
        base: ast.AST = node
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        parts.reverse()
        if not isinstance(base, ast.Name):  # a method or attribute of a computed value
            self.attributes(node, parts)
            self.expr(base, local)
            return
        root = base.id
        if root in ROOTS:
            self.rooted(node, root, parts)
        elif root in local:
            self.attributes(node, parts)
        elif root in REFUSED_NAMES:
            self.add(node, root, REFUSED_NAMES[root])
        elif root in BUILTINS:
            self.attributes(node, parts)
        else:
            self.add(node, root, "a name TorchScript does not resolve")

    def attributes(self, node: ast.AST, parts: list[str]) -> None:
        for part in parts:
            if part in self.refused:
                self.add(node, part, "a refused operator called as a method")

    def rooted(self, node: ast.AST, root: str, parts: list[str]) -> None:
        dotted = ".".join([root, *parts])
        if root == "torch":
            if not parts:
                self.add(node, dotted, "the torch namespace used as a value")
                return
            why = aten_problem(parts[0])
            if why:
                self.add(node, f"torch.{parts[0]}", why)
            self.attributes(node, parts[1:])
        elif root == "ops":
            if len(parts) < 2:
                self.add(node, dotted, "an operator namespace used as a value")
                return
            ns, op = parts[0], parts[1]
            if ns == "aten":
                why = aten_problem(op)
                if why:
                    self.add(node, f"ops.aten.{op}", why)
            elif ns == "prim":
                if op not in PRIM_PURE:
                    self.add(node, f"ops.prim.{op}", "a prim operator outside mconv's allowlist")
            else:
                self.add(node, f"ops.{ns}.{op}", "an operator outside the aten and prim namespaces")
            self.attributes(node, parts[2:])
        elif root == "CONSTANTS":
            if len(parts) != 1 or not _CONSTANT.match(parts[0]):
                self.add(node, dotted, "not an entry of the constant table")
        else:  # __torch__
            self.torch_class(node, parts)

    def torch_class(self, node: ast.AST, parts: list[str]) -> None:
        dotted = ".".join(["__torch__", *parts])
        if parts[:2] == ["torch", "classes"]:
            self.add(node, dotted, "a C++ custom class (TorchBind), code outside the archive")
            return
        for i in range(len(parts), -1, -1):
            qualifier = ".".join(["__torch__", *parts[:i]])
            if i < len(parts) and parts[i] in self.defined.get(qualifier, ()):
                self.attributes(node, parts[i + 1 :])
                return
        self.add(node, dotted, "a class or function without TorchScript source in code/")


def _check_text(member: str, text: str, found: list[Finding]) -> ast.Module | None:
    """Rule 1: the characters and tokens that TorchScript's lexer and Python's read alike."""
    lines = text.split("\n")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        found.append(
            Finding(member, getattr(exc, "lineno", 0) or 0, "", f"not Python syntax ({type(exc).__name__})")
        )
        return None
    spans: dict[int, list[tuple[int, int]]] = {}
    for tok in tokens:
        if tok.type not in _TOKENS:
            found.append(Finding(member, tok.start[0], tok.string[:20], "a token TorchScript does not write"))
            return None
        if tok.type == tokenize.STRING:
            if tok.start[0] != tok.end[0] or not _PLAIN_STRING.match(tok.string):
                found.append(
                    Finding(
                        member, tok.start[0], tok.string[:20], "a string literal TorchScript does not write"
                    )
                )
                return None
            spans.setdefault(tok.start[0], []).append((tok.start[1], tok.end[1]))
    for number, line in enumerate(lines, 1):
        outside = line
        for start, end in sorted(spans.get(number, []), reverse=True):
            outside = outside[:start] + outside[end:]
        bad = _OUTSIDE.search(outside)
        if bad:
            found.append(Finding(member, number, bad.group(), "a character outside printable ASCII"))
            return None
    try:
        return ast.parse(text, filename=member)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        found.append(
            Finding(member, getattr(exc, "lineno", 0) or 0, "", f"not Python syntax ({type(exc).__name__})")
        )
        return None


def _qualifier(member: str, root: str) -> str | None:
    """``__torch__.a.b`` for ``<root>/code/__torch__/a/b.py`` (the file torch loads for it)."""
    prefix = f"{root}/code/"
    if not member.startswith(prefix) or not member.endswith(".py"):
        return None
    return member[len(prefix) : -len(".py")].replace("/", ".")


def find_problems(sources: dict[str, str], root: str) -> list[Finding]:
    """Rules 1-5 over ``{member name: source text}``; an empty list means all of it is allowed."""
    found: list[Finding] = []
    trees: dict[str, ast.Module] = {}
    defined: dict[str, set[str]] = {}
    for member, text in sources.items():
        tree = _check_text(member, text, found)
        if tree is None:
            continue
        trees[member] = tree
        qualifier = _qualifier(member, root)
        if qualifier is not None:
            defined[qualifier] = {s.name for s in tree.body if isinstance(s, (ast.ClassDef, ast.FunctionDef))}
    for member, tree in trees.items():
        try:
            _FileChecker(member, defined, found).module(tree)
        except RecursionError:
            found.append(Finding(member, 0, "", "code nested too deeply"))
    return found


def check_archive(path: Path, entries: dict[str, ZipEntry], root: str) -> None:
    """Refuse ``path`` unless every ``.py`` member passes rules 1-5 (one error lists them all)."""
    members = [n for n in entries if n.lower().endswith(".py")]
    sources: dict[str, str] = {}
    found: list[Finding] = []
    for name in members:
        data = read_member(path, entries[name], CODE_LIMIT)
        try:
            sources[name] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            found.append(Finding(name, 0, "", f"not UTF-8 text (byte {exc.start})"))
    found += find_problems(sources, root)
    if not found:
        return
    seen: dict[str, Finding] = {}
    for f in found:
        seen.setdefault(f.name or f.why, f)
    listed = [
        f"{show(f.name, 60) + ' ' if f.name else ''}({f.why}; {show(f.member.removeprefix(root + '/'), 80)} line {f.line})"
        for f in list(seen.values())[:4]
    ]
    more = f"; and {len(seen) - 4} more" if len(seen) > 4 else ""
    raise InputError(
        f"the TorchScript code uses what mconv does not run: {'; '.join(listed)}{more}",
        path=str(path),
        hint="mconv imports TorchScript made of pure tensor operations (no file access, no print, no custom "
        "ops); remove those calls and save the model again",
    )
