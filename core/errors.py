"""Errors and exit codes.

Exit codes (stable, scripts rely on them):
    0 success; 1 a verification or budget gate failed; 2 bad input or usage; 3 internal error.

Every user-facing error renders as one line: ``FILE: WHERE: WHAT (hint: HINT)``.
"""

from __future__ import annotations

import unicodedata

EXIT_OK = 0
EXIT_GATE = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 3


NAME_LIMIT = 60
LINE_LIMIT = 600


def _escape(text: str) -> str:
    """Printable text: control, format and surrogate characters as ``\\xNN``/``\\uNNNN`` escapes."""
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] == "C" or cat in ("Zl", "Zp"):
            code = ord(ch)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
        else:
            out.append(ch)
    return "".join(out)


def shorten(text: str, limit: int) -> str:
    """``text`` cut in the middle to at most ``limit`` characters (an ellipsis marks the cut)."""
    if len(text) <= limit:
        return text
    keep = max(limit - 1, 2)
    head = (keep + 1) // 2
    return text[:head] + "\u2026" + text[len(text) - (keep - head) :]


def show(name: object, limit: int = NAME_LIMIT) -> str:
    """A name taken from a file (a layer, a tensor, a path inside an archive), safe for a message.

    Bytes are decoded with backslash escapes, control characters are escaped, and the result is
    shortened to ``limit`` characters: a hostile file cannot put newlines, terminal escapes or
    kilobytes of binary into the one-line error. Quote it in the message as ``'{show(name)}'``.
    """
    if isinstance(name, (bytes, bytearray, memoryview)):
        text = bytes(name).decode("utf-8", errors="backslashreplace")
    else:
        text = str(name)
    # Escaping first, then shortening, so a cut never splits an escape's meaning from its marker.
    return shorten(_escape(text), limit)


SUMMARY_FIRST = 5


def summarize_names(names, first: int = SUMMARY_FIRST, *, noun: str = "more", limit: int = NAME_LIMIT) -> str:
    """``a, b, c, d, e and 137 more``: the first ``first`` of ``names`` (each through
    :func:`show` with ``limit``), then a count of the rest, so a list of any length fits a
    one-line message. An empty list gives ``none``."""
    names = [show(n, limit) for n in names]
    if not names:
        return "none"
    head = ", ".join(names[:first])
    rest = len(names) - min(first, len(names))
    return f"{head} and {rest} {noun}" if rest else head


class MconvError(Exception):
    """An error the user can act on. Rendered as one line, never a traceback."""

    exit_code = EXIT_INPUT

    def __init__(
        self, message: str, *, path: str | None = None, where: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = str(path) if path is not None else None
        self.where = where
        self.hint = hint

    def line(self) -> str:
        """The one-line rendering. Every part is escaped and bounded: whatever a message was built
        from (names from a hostile file included), the line holds no newline or control character."""
        parts = [show(p, 200) for p in (self.path, self.where) if p]
        head = ": ".join(parts + [show(self.message, LINE_LIMIT)])
        return f"{head} (hint: {show(self.hint, 200)})" if self.hint else head

    def __str__(self) -> str:
        return self.line()


class InputError(MconvError):
    """Bad input or usage: a file that cannot be read, a shape that does not fit, ... (exit 2)."""


UNSUPPORTED_LISTED = 8  # up to this many unsupported items are all named in the one line


class UnsupportedError(InputError):
    """Nodes/layers that a registry does not know.

    Up to ``UNSUPPORTED_LISTED`` items are all named in the one line; more are summarized (a
    count per kind, the first few by name) and :meth:`details` lists every one (the CLI puts it
    in ``--json``'s error document and prints it with ``--debug``)."""

    def __init__(
        self,
        items: list[tuple[str, str]],
        *,
        what: str = "op",
        path: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.items = list(items)
        self.what = what
        n = len(self.items)
        if n <= UNSUPPORTED_LISTED:
            listed = ", ".join(f"{name} ({kind})" for name, kind in self.items)
            message = f"{n} unsupported {what}(s): {listed}"
        else:  # a count per kind and the first few by name; every one in --json / --debug
            counts: dict[str, int] = {}
            for _, kind in self.items:
                counts[kind] = counts.get(kind, 0) + 1
            kinds = sorted(counts, key=lambda k: (-counts[k], k))
            by_kind = summarize_names(
                [f"{show(k, 40)} x{counts[k]}" for k in kinds], 8, noun="more kinds", limit=50
            )
            first = ", ".join(f"{show(nm, 40)} ({show(k, 40)})" for nm, k in self.items[:SUMMARY_FIRST])
            message = (
                f"{n} unsupported {what}(s) of {len(kinds)} kind(s): {by_kind}; first: {first} "
                f"and {n - SUMMARY_FIRST} more (every one with --json or --debug)"
            )
        super().__init__(message, path=path, hint=hint)

    def details(self) -> dict:
        """Every item, for ``--json`` and ``--debug`` (the one-line message names only the first few)."""
        return {"what": self.what, "items": [{"name": str(n), "kind": str(k)} for n, k in self.items]}


class IntegrityError(InputError):
    """A bundle whose files do not match their recorded sha256 or size (exit 2)."""


class MconvBug(MconvError):
    """mconv's own fault, found by a check it makes on its output (exit 3, one line)."""

    exit_code = EXIT_INTERNAL


class GateFailed(MconvError):
    """A verification or budget gate failed (exit 1)."""

    exit_code = EXIT_GATE


# The optional packages (pyproject's extras) a command may import on demand: the module's
# top-level name -> the package to install and the extra that brings it.
OPTIONAL_MODULES: dict[str, tuple[str, str | None]] = {
    "tflite": ("tflite", "tflite"),
    "flatbuffers": ("flatbuffers", "tflite"),
    "ai_edge_litert": ("ai-edge-litert", "tflite"),
    "jax": ("jax", "xla"),
    "jaxlib": ("jax", "xla"),
    "torch": ("torch", "torch"),
    "onnxscript": ("onnxscript", "torch"),
    "safetensors": ("safetensors", "weights"),
    "ray": ("ray", "ray"),
    "matplotlib": ("matplotlib", "report"),
    "wgpu": ("wgpu", None),
}


def missing_optional(exc: ModuleNotFoundError) -> InputError | None:
    """The one-line refusal for a command that needs an optional package this installation
    lacks (exit 2: the user's environment, not mconv's fault); None for any other module."""
    top = (exc.name or "").split(".")[0]
    if top not in OPTIONAL_MODULES:
        return None
    package, extra = OPTIONAL_MODULES[top]
    return InputError(
        f"this needs the optional package '{package}', which is not installed",
        hint=f"pip install 'mconv[{extra}]'" if extra else f"pip install {package}",
    )
