"""``scipy.special`` on first use: importing it costs about 0.6 s of every command that loads the
reference executor, and only Erf, Gelu and the sigmoid-family activations need it."""

from __future__ import annotations


class _Special:
    def __getattr__(self, name: str):
        from scipy import special as module

        return getattr(module, name)


special = _Special()
