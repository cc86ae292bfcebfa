"""``mconv analyze``: per-layer sensitivity of a model on data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mconv.api.common import ModelLike, PathLike, _as_model, _guards, _progress, load_data_batched
from mconv.errors import InputError


@dataclass
class AnalyzeResult:
    """``mconv analyze``: per-layer sensitivity (and the recipe written, if any)."""

    report: Any
    recipe: str | None = None
    source: str | None = None  # the model file (None: an ir.Model was given)

    def write_report(self, path: PathLike) -> Path:
        """The self-contained HTML report of this analysis (:mod:`mconv.report`)."""
        from mconv.report import write_report

        summary = None
        if self.source is not None:
            from mconv.api.inspection import inspect_path

            summary = inspect_path(self.source)
        return write_report(
            path, "analyze", self.as_dict(), inputs=[self.source, self.recipe], summary=summary
        )

    def as_dict(self) -> dict[str, Any]:
        doc = self.report.as_dict()
        doc["recipe"] = self.recipe
        return doc


@_guards("model", "data", output="output", kind="file")
def analyze(
    model: ModelLike,
    data,
    *,
    sweep: Sequence[float] = (0.5, 0.7, 0.9),
    bits: Sequence[int] = (),
    max_drop: float | None = None,
    output: PathLike | None = None,
    progress=None,
    engine: str = "reference",
    device: str = "cpu",
    workers: int = 0,
    ray_address: str | None = None,
) -> AnalyzeResult:
    """``mconv analyze``: prune (and cluster at ``bits``) one layer at a time over ``sweep``,
    measure the metric drop on ``data``; with ``max_drop`` choose per layer, and with ``output``
    write that choice as a recipe (TOML). ``engine="xla"`` runs the sweep on the model lowered
    to jax (``device`` cpu or cuda). ``workers=N`` runs the layers' sweeps on a local Ray of N
    workers, ``ray_address`` on a Ray cluster; the report is the same."""
    from mconv.drivers.analyze import analyze_sensitivity, write_recipe

    if output is not None and max_drop is None:
        raise InputError("-o needs --max-drop", hint="e.g. --max-drop 0.01 -o recipe.toml")
    m, source = _as_model(model)
    (feeds,), _ = load_data_batched(m, data)  # a batch fixed at 1: freed for the sweep's batches
    if feeds is None:
        raise InputError("analyze needs data", hint="--data calib.npz (inputs by name, optional labels)")
    with _progress(progress)("analyze", None) as update:
        report = analyze_sensitivity(
            m,
            feeds,
            sweep=list(sweep),
            bits=[int(b) for b in bits],
            max_drop=max_drop,
            progress=update,
            engine=engine,
            device=device,
            workers=workers,
            ray_address=ray_address,
        )
    recipe = None
    if output is not None:
        write_recipe(report, output)
        recipe = str(output)
    return AnalyzeResult(report, recipe, str(source) if source is not None else None)


def sparkline(values: Sequence[float], lo: float | None = None, hi: float | None = None) -> str:
    """:func:`mconv.drivers.analyze.sparkline`: a layer's metric at each sparsity, in blocks."""
    from mconv.drivers.analyze import sparkline as line

    return line(values, lo, hi)
