"""Errors and exit codes.

Exit codes (stable, scripts rely on them):
    0 success; 1 a verification or budget gate failed; 2 bad input or usage; 3 internal error.

Every user-facing error renders as one line: ``FILE: WHERE: WHAT (hint: HINT)``.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_GATE = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 3


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
        parts = [p for p in (self.path, self.where) if p]
        head = ": ".join(parts + [self.message])
        return f"{head} (hint: {self.hint})" if self.hint else head

    def __str__(self) -> str:
        return self.line()


class InputError(MconvError):
    """Bad input or usage: a file that cannot be read, a shape that does not fit, ... (exit 2)."""


class UnsupportedError(InputError):
    """Nodes/layers that a registry does not know. Names every one of them in one line."""

    def __init__(
        self,
        items: list[tuple[str, str]],
        *,
        what: str = "op",
        path: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.items = list(items)
        listed = ", ".join(f"{name} ({kind})" for name, kind in self.items)
        super().__init__(f"{len(self.items)} unsupported {what}(s): {listed}", path=path, hint=hint)


class IntegrityError(InputError):
    """A bundle whose files do not match their recorded sha256 or size (exit 2)."""


class GateFailed(MconvError):
    """A verification or budget gate failed (exit 1)."""

    exit_code = EXIT_GATE
