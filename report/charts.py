"""Charts as inline SVG, drawn by matplotlib's SVG backend (imported here only: a report asks for it).

Rules:

1. Text stays text (``svg.fonttype = none``, a system sans-serif font): the labels are in the
   page's DOM, searchable and copyable, and no font file is embedded.
2. Nothing is parsed as markup: ``text.parse_math`` is off, so a ``$`` in a model's node name is
   a dollar sign, and the SVG writer escapes ``<`` and ``&`` of every label it writes.
3. The output is deterministic (fixed ``svg.hashsalt``, no date in the metadata), and the XML
   prolog and DOCTYPE are dropped so the ``<svg>`` element goes inline in HTML.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

RC: dict[str, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "mconv-report",
    "text.parse_math": False,
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 72,
}

# one colour per storage component of a tensor (account rows), before/after, pass/fail
CODEC_COLORS = {
    "raw": "#9e9e9e",
    "palette": "#1f77b4",
    "sparse index": "#ff7f0e",
    "entropy-coded": "#2ca02c",
    "header": "#d62728",
}
BEFORE, AFTER = "#bdbdbd", "#1f77b4"


def _log_y(ax: Any) -> None:
    """A log y axis whose tick labels are plain text (matplotlib's default is mathtext, rule 2)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo < 10:  # within one decade: no major tick, so label the minor ones
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))


def to_svg(fig: Any, label: str) -> str:
    """The figure as one inline ``<svg>`` element, ``aria-label``-led by ``label`` (escaped)."""
    import html

    buf = io.StringIO()
    with plt.rc_context(RC):  # type: ignore[arg-type]
        fig.tight_layout()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = buf.getvalue()
    start = text.find("<svg")
    svg = text[start:]
    # sized by the page (CSS), scaled by its viewBox
    svg = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1", svg, count=1)
    return svg.replace("<svg", f'<svg role="img" aria-label="{html.escape(label)}"', 1)


def _rc(fn):
    def wrapped(*args, **kwargs):
        with plt.rc_context(RC):  # type: ignore[arg-type]
            return fn(*args, **kwargs)

    wrapped.__doc__ = fn.__doc__
    return wrapped


@_rc
def stacked_bytes(
    names: Sequence[str], before: Sequence[int], parts: dict[str, Sequence[int]], title: str
) -> str:
    """Per layer a bar of its dense bytes (before) and one stacked by storage component (after)."""
    import numpy as np

    n = len(names)
    fig, ax = plt.subplots(figsize=(7.5, max(2.2, 0.42 * n + 1.2)))
    y = np.arange(n)
    ax.barh(y - 0.2, before, height=0.38, color=BEFORE, label="before (dense)")
    left = np.zeros(n)
    for part, values in parts.items():
        v = np.asarray(values, dtype=float)
        if v.any():
            ax.barh(y + 0.2, v, height=0.38, left=left, color=CODEC_COLORS.get(part, "#8c564b"), label=part)
            left += v
    ax.set_yticks(y, list(names))
    ax.invert_yaxis()
    ax.set_xlabel("bytes")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return to_svg(fig, title)


@_rc
def totals(labels: Sequence[str], values: Sequence[int], title: str) -> str:
    fig, ax = plt.subplots(figsize=(7.0, 0.45 * len(labels) + 1.1))
    colors = [BEFORE] + [AFTER] * (len(labels) - 1)
    ax.barh(range(len(labels)), values, color=colors)
    ax.set_yticks(range(len(labels)), list(labels))
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,}", va="center", fontsize=8)
    ax.set_xlabel("bytes")
    ax.set_title(title)
    ax.margins(x=0.25)
    return to_svg(fig, title)


@_rc
def sparsity_bits(names: Sequence[str], sparsity: Sequence[float], bits: Sequence[float], title: str) -> str:
    import numpy as np

    n = len(names)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.5, max(2.2, 0.36 * n + 1.2)), sharey=True)
    y = np.arange(n)
    a1.barh(y, sparsity, color="#ff7f0e")
    a1.set_xlim(0, 1)
    a1.set_xlabel("sparsity (fraction zero)")
    a1.set_yticks(y, list(names))
    a1.invert_yaxis()
    a2.barh(y, bits, color="#1f77b4")
    a2.set_xlabel("bits per weight kept")
    fig.suptitle(title, fontsize=10)
    return to_svg(fig, title)


@_rc
def histogram(
    name: str,
    before: Any | None,
    after: Any | None,
    centroids: Sequence[float],
    threshold: float | None,
    title: str,
) -> str:
    """Weight values before and after (zeros of the pruned left out of "after"), the centroids
    as ticks on the axis and the pruning threshold as dashed lines at +-t."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.0, 2.6))
    arrays = [a for a in (before, after) if a is not None and a.size]
    lo = min(float(a.min()) for a in arrays) if arrays else -1.0
    hi = max(float(a.max()) for a in arrays) if arrays else 1.0
    edges = [float(e) for e in np.linspace(lo, hi if hi > lo else lo + 1, 81)]
    if before is not None and before.size:
        ax.hist(before, bins=edges, color=BEFORE, label="before", alpha=0.9)
    if after is not None and after.size:
        ax.hist(after, bins=edges, histtype="step", color=AFTER, linewidth=1.2, label="after (nonzero)")
    if centroids:
        ax.plot(list(centroids), [0] * len(centroids), "|", color="#d62728", markersize=14, label="centroids")
    if threshold:
        for t in (-threshold, threshold):
            ax.axvline(t, color="#ff7f0e", linestyle="--", linewidth=1)
        ax.plot([], [], "--", color="#ff7f0e", label=f"pruning threshold +-{threshold:.3g}")
    _log_y(ax)
    ax.set_xlabel(f"weight value of {name}")
    ax.set_ylabel("count")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")
    return to_svg(fig, title)


@_rc
def frontier(
    front: Sequence[tuple[int, float]],
    attempts: Sequence[dict],
    target: int | None,
    title: str,
) -> str:
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    if front:
        xs, ys = zip(*sorted(front), strict=True)
        ax.plot(xs, ys, "-o", color=BEFORE, markersize=3, label="frontier (estimated)")
    for a in attempts:
        if a.get("estimated_cost") is None:
            continue
        marker = "*" if a.get("chosen") else "o"
        color = "#2ca02c" if a.get("passed") else "#d62728"
        ax.plot(
            a["predicted_bytes"],
            a["estimated_cost"],
            marker,
            color=color,
            markersize=14 if a.get("chosen") else 7,
        )
        ax.annotate(
            f"#{a['index']}{' chosen' if a.get('chosen') else ''}",
            (a["predicted_bytes"], a["estimated_cost"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    ax.plot([], [], "o", color="#2ca02c", label="attempt, passed")
    ax.plot([], [], "o", color="#d62728", label="attempt, failed")
    ax.plot([], [], "*", color="black", markersize=10, label="chosen")
    if target:
        ax.axvline(target, color="#ff7f0e", linestyle="--", label=f"target {target:,} B")
    ax.set_xlabel("predicted bytes of the layers' weights")
    ax.set_ylabel("estimated cost")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return to_svg(fig, title)


@_rc
def stages(labels: Sequence[str], before: Sequence[float], after: Sequence[float], rolled: Sequence[bool],
           baseline: float | None, floor: float | None, metric: str, title: str) -> str:  # fmt: skip
    import numpy as np

    n = len(labels)
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    x = np.arange(n)
    ax.plot(x, after, "-o", color=AFTER, markersize=4, label=f"{metric} after the stage")
    bad = [i for i in range(n) if rolled[i]]
    if bad:
        ax.plot([x[i] for i in bad], [after[i] for i in bad], "x", color="#d62728", markersize=10,
                markeredgewidth=2, label="rolled back")  # fmt: skip
    if baseline is not None:
        ax.axhline(baseline, color=BEFORE, linestyle=":", label=f"baseline {baseline:.4f}")
    if floor is not None:
        ax.axhline(floor, color="#ff7f0e", linestyle="--", label=f"baseline - max drop {floor:.4f}")
    ax.set_xticks(x, list(labels), rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"held-out {metric}")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return to_svg(fig, title)


@_rc
def curves(series: dict[str, tuple[Sequence[float], Sequence[float]]], baseline: float | None,
           xlabel: str, ylabel: str, title: str) -> str:  # fmt: skip
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, "-o", markersize=3, label=label)
    if baseline is not None:
        ax.axhline(baseline, color=BEFORE, linestyle=":", label=f"baseline {baseline:.4f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    return to_svg(fig, title)


@_rc
def error_histogram(log10_edges: Sequence[float], counts: Sequence[int], zeros: int, title: str) -> str:
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.0, 2.6))
    e = np.asarray(log10_edges)
    ax.bar(e[:-1], counts, width=np.diff(e), align="edge", color=AFTER, edgecolor="white")
    ax.set_xlabel("log10 |candidate - reference|")
    ax.set_ylabel("values")
    ax.set_title(f"{title} ({zeros:,} exactly equal not shown)")
    return to_svg(fig, title)


@_rc
def trace(names: Sequence[str], errors: Sequence[float], first: int | None, title: str) -> str:
    import numpy as np

    n = len(errors)
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    x = np.arange(n)
    y = np.maximum(np.asarray(errors, dtype=float), 1e-12)
    ax.plot(x, y, "-", color=AFTER, linewidth=1, marker="." if n < 200 else None)
    _log_y(ax)
    if first is not None:
        ax.axvline(first, color="#d62728", linestyle="--")
        ax.annotate(f"first drift: {names[first]}", (first, y[first]), textcoords="offset points",
                    xytext=(6, 6), color="#d62728", fontsize=8)  # fmt: skip
    ax.set_xlabel("value, in topological order")
    ax.set_ylabel("relative L2 error")
    ax.set_title(title)
    return to_svg(fig, title)


@_rc
def counts(labels: Sequence[str], values: Sequence[float], xlabel: str, title: str) -> str:
    fig, ax = plt.subplots(figsize=(7.0, max(1.8, 0.3 * len(labels) + 1.0)))
    ax.barh(range(len(labels)), values, color=AFTER)
    ax.set_yticks(range(len(labels)), list(labels))
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return to_svg(fig, title)
