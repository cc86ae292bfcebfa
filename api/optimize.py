"""``mconv optimize``: a pass spec or recipe over a model, or the budget search."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir
from mconv.api.common import (
    ModelLike,
    PathLike,
    _as_model,
    _guards,
    _progress,
    load_data_batched,
    naming_the_file,
    open_model,
    save,
)
from mconv.edit.batch import fix_batch
from mconv.errors import GateFailed, InputError

if TYPE_CHECKING:
    from mconv.drivers.budget import BudgetConfig


@dataclass
class OptimizeResult:
    """``mconv optimize``: the optimized model, each pass's report, the predicted byte account."""

    output: str | None
    files: list[str]
    weight_bytes_before: int
    weight_bytes_after: int
    file_bytes_after: int | None
    predicted_bundle_weight_bytes: int | None
    reports: list = field(default_factory=list)
    account: dict | None = None
    model: ir.Model | None = field(default=None, repr=False, compare=False)
    budget: Any = field(default=None, repr=False)  # a passes.budget.BudgetResult
    # False: lossy passes ran and nothing measured the result (a recipe without data); None: no
    # such claim (lossless passes, or data was given)
    accuracy_measured: bool | None = None
    datafree: Any = field(default=None, repr=False)  # a passes.budget.DataFreePlan
    warnings: list[str] = field(default_factory=list)
    source: str | None = None  # the input file (None: an ir.Model was given)
    notes: list[str] = field(default_factory=list)  # what was done that the passes do not say

    def write_report(self, path: PathLike) -> Path:
        """The self-contained HTML report of this optimize (:mod:`mconv.report`): the source
        file's weights are read again for the histograms' "before"."""
        from mconv.api.inspection import inspect_model
        from mconv.report import check_path, write_report

        check_path(path, self.source, self.output)
        before = open_model(self.source) if self.source is not None and self.model is not None else None
        summary = None
        if self.model is not None:
            summary = {"path": self.output, "kind": "optimized", **inspect_model(self.model)}
        return write_report(
            path, "optimize", self.as_dict(), inputs=[self.source, self.output], summary=summary,
            before=before, after=self.model,
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        doc = self._doc()
        if self.budget is not None:
            doc["budget"] = self.budget.as_dict()
            doc["accuracy_measured"] = self.budget.accuracy_measured
        elif self.accuracy_measured is not None:
            doc["accuracy_measured"] = self.accuracy_measured
        if self.datafree is not None:
            doc["datafree"] = self.datafree.as_dict()
        doc["warnings"] = list(self.warnings)
        doc["notes"] = list(self.notes)
        doc["source"] = self.source
        return doc

    def _doc(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "files": self.files,
            # like for like: weight bytes in the input and in the written model (dense)
            "bytes_before": self.weight_bytes_before,
            "bytes_after": self.weight_bytes_after,
            "weight_bytes_before": self.weight_bytes_before,
            "weight_bytes_after": self.weight_bytes_after,
            "file_bytes_after": self.file_bytes_after,
            # what an export stores for these weights, from the byte account (None: not
            # predicted, the model carries no pruning or clustering facts)
            "predicted_bundle_weight_bytes": self.predicted_bundle_weight_bytes,
            "passes": [r.as_dict() for r in self.reports],
            "account": self.account,
        }


BATCH_NOTE = (
    "the inputs fix the batch at 1: freed for the data (dynamic-batch, checked on samples at once "
    "against each alone); the written model has [1, ...] again"
)


def _stream_config(passes: str, scheme) -> dict:
    """The pass's whole config as the graph pipeline records it (every option, defaults
    included), with the streamed selection's ``min_elements``: a bundle's provenance."""
    import dataclasses

    from mconv import passes as P
    from mconv.passes.cluster import Cluster

    spec = P.parse_spec(passes)[0]
    return {**dataclasses.asdict(Cluster.Config()), **spec.config, "min_elements": scheme.min_elements}


def _optimize_streamed(src: Path, passes: str, scheme, output: Path, progress) -> OptimizeResult:
    """``optimize`` of a safetensors checkpoint by one streamable pass
    (:func:`mconv.drivers.weights_stream.compress_checkpoint`)."""
    from mconv.drivers.weights_stream import compress_checkpoint, compress_to_bundle, open_checkpoint
    from mconv.passes.base import PassReport

    with naming_the_file(src):
        n = sum(len(s.tensors) for s in open_checkpoint(src)[0])
        with _progress(progress)(f"optimize {passes}", n) as update:
            done = [0]

            def tick(name: str) -> None:
                update(f"stream {name}", done[0], n)
                done[0] += 1

            if scheme.bundle:  # one file to a folder: a weights bundle (weights_stream rule 7)
                r = compress_to_bundle(src, output, scheme, config=_stream_config(passes, scheme), tick=tick)
            else:
                r = compress_checkpoint(src, output, scheme, tick=tick)
    keys = ("bits", "init", "groups") if scheme.kind == "cluster" else ("bits", "block", "sym", "method")
    config = {k: getattr(scheme, k) for k in (*keys, "min_elements")}
    report = PassReport(
        scheme.kind,
        config,
        bytes_before=r.bytes_in,
        bytes_after=r.bytes_out,
        seconds=r.seconds,
        tensors=r.tensors,
        notes=[
            f"streamed: {r.mb_per_s:.0f} MB/s of input, {'a weights bundle' if scheme.bundle else 'packed safetensors'}"
        ],
        modified=bool(r.tensors),
    )
    files = [Path(f) for f in r.files]
    return OptimizeResult(
        output=str(output),
        files=r.files,
        weight_bytes_before=r.bytes_in,
        weight_bytes_after=r.bytes_out,
        file_bytes_after=sum(p.stat().st_size for p in files),
        predicted_bundle_weight_bytes=None,
        reports=[report],
        source=str(src),
    )


@_guards("model", "data", "val_data", "recipe", output="output")
def optimize(
    model: ModelLike,
    *,
    passes: str | None = None,
    recipe: str | None = None,
    data=None,
    seed: int = 0,
    output: PathLike | None = None,
    format: str | None = None,
    max_drop: float | None = None,
    target_size: int | str | None = None,
    save_recipe: PathLike | None = None,
    progress=None,
    target_of: str = "weights",
    engine: str | None = None,
    device: str | None = None,
    workers: int = 0,
    ray_address: str | None = None,
    val_data=None,
    epochs: int | None = None,
    force: bool = False,
    budget: BudgetConfig | None = None,
) -> OptimizeResult:
    """``mconv optimize``: run a pass spec (``passes``) or a recipe (name or TOML path) over the
    model (an ``ir.Model``, mutated, or a path); with ``output``, write it and check that ONNX's
    checker and ONNX Runtime accept it. ``data``: calibration / fine-tuning feeds (.npz or dict).

    ``max_drop`` (a fraction: 0.005 is half a point), ``target_size`` (``44KB``, ``6.9MB``, bytes)
    and ``save_recipe`` (a TOML path) go with ``recipe="deep-compression"``; ``target_of``
    (``weights``, the default, or ``bundle``) says what ``target_size`` is the size of: the cpu
    bundle's ``weights.mcw``, or its whole directory (graph and manifest too): the budget search of
    :func:`mconv.drivers.budget.compress_to_budget` picks each layer's sparsity and bits on a
    held-out split (its report is ``budget`` in the result); an unmet budget raises
    ``GateFailed`` (exit 1) after the best result was written. ``val_data`` (.npz or dict) is a
    validation set of its own for that gate: then fine-tuning uses all of ``data``. ``epochs``:
    the budget search's epochs per fine-tuning stage (default: from the model's multiply-adds
    and the samples, :func:`mconv.drivers.budget.default_epochs`).

    ``engine`` (``reference`` or ``xla``) and ``device`` (``cpu`` or ``cuda``, xla only) say where
    fine-tuning runs: every ``finetune`` pass of the spec or recipe that does not name its own,
    and every fine-tuning stage of the budget search (whose gate stays on the reference).

    ``workers`` (a local Ray of N processes) or ``ray_address`` (a cluster) run the budget
    search's independent trials on Ray (each layer's candidate settings); the result is the
    in-process run's. They need the budget search (``max_drop`` / ``target_size``).

    ``budget``: the budget search's options as one checked
    :class:`~mconv.drivers.budget.BudgetConfig` (:func:`budget_config` makes it; the CLI's option
    group does), in place of ``max_drop``, ``target_size``, ``target_of`` and ``epochs``.

    A recipe run without ``data`` (and no budget option) backs every ``prune`` and ``cluster``
    off per layer until the data-free check holds (:func:`mconv.drivers.budget.limit_datafree`;
    ``datafree`` and ``accuracy_measured: false`` in the result, and a warning). Data too few to
    measure (a held-out split under :data:`mconv.drivers.budget.MIN_HELD_OUT`, or one whose one
    sample is more than ``max_drop``) is refused before any work. ``force`` runs the recipe as
    written without data, and goes on with too few samples."""
    from mconv import passes as P
    from mconv.drivers.parallel import check_workers, uses_ray

    check_workers(workers, ray_address)
    from mconv.engines.xla.engine import check_engine

    if engine is not None or device is not None:  # auto: the fastest present (mconv.engines.fast rule 1)
        check_engine("xla" if engine == "auto" else engine or "reference", device or "cpu")

    if bool(passes) == bool(recipe):
        raise InputError(
            "give exactly one of --passes or --recipe", hint=f"recipes: {', '.join(P.recipe_names())}"
        )
    static = _static_budget(passes, budget, max_drop, target_size, save_recipe)
    if static is not None:  # --max-drop with quantize(mode=static): the pass's own fallback
        budget, max_drop = None, None
    budgeted = (
        budget is not None or max_drop is not None or target_size is not None or save_recipe is not None
    )
    _refuse_budget_options(budgeted, val_data, epochs)
    if budgeted:
        if budget is None:
            budget = budget_config(
                model, max_drop=max_drop, target_size=target_size, target_of=target_of, seed=seed,
                engine=engine, device=device, workers=workers, ray_address=ray_address, epochs=epochs,
            )  # fmt: skip
        return _optimize_budget(
            model, recipe, data, output, format, save_recipe, progress, budget, val_data, force
        )
    if uses_ray(workers, ray_address):
        raise InputError(
            "--workers/--ray run the budget search's trials; this optimize has no budget",
            where="--workers" if workers else "--ray",
            hint="add --max-drop F or --target-size SIZE with --recipe deep-compression, or drop --workers/--ray",
        )
    if passes and data is None and output is not None and not isinstance(model, ir.Model):
        from mconv.drivers.weights_stream import stream_scheme

        scheme = stream_scheme(Path(model), passes, Path(output), format)
        if scheme is not None:  # a safetensors checkpoint streamed tensor by tensor (README)
            return _optimize_streamed(Path(model), passes, scheme, Path(output), progress)
    specs = static or (P.parse_spec(passes) if passes else P.load_recipe(str(recipe)))
    return _optimize_pipeline(
        model, specs, recipe, passes, data, seed, output, format, progress, engine, device, force
    )


def _optimize_pipeline(
    model: ModelLike,
    specs: list,
    recipe: str | None,
    passes: str | None,
    data: Any,
    seed: int,
    output: PathLike | None,
    format: str | None,
    progress: Any,
    engine: str | None,
    device: str | None,
    force: bool,
) -> OptimizeResult:
    """A pass spec or recipe run over the model (a lossy recipe without data backed off by the
    data-free check), written and checked when ``output`` is given."""
    from mconv import passes as P
    from mconv.account import predicted_account
    from mconv.irio import model_stats, spilling

    if engine == "auto":
        from mconv.engines.fast import resolve_engine

        engine, device = resolve_engine(engine, device)
    if engine is not None or device is not None:
        for spec in specs:  # the finetune passes that do not name their own engine
            if spec.name == "finetune":
                spec.config.setdefault("engine", engine or "reference")
                spec.config.setdefault("device", device or "cpu")
    out_path = Path(output) if output is not None else None
    # Large rewritten weights wait in a scratch folder beside the output (deleted at the end),
    # so the pipeline holds about one weight at a time in memory (mconv.irio.spilling).
    parent = out_path.resolve().parent if out_path is not None else None
    scratch = parent if parent is not None and parent.is_dir() else Path(tempfile.gettempdir())
    written: list[Path] = []
    source = None if isinstance(model, ir.Model) else Path(model)
    with spilling(scratch), naming_the_file(source) if source else contextlib.nullcontext():
        m, _ = _as_model(model)
        before = model_stats(m)
        (feeds,), freed = load_data_batched(m, data)
        ctx = P.PassContext(data=feeds, seed=seed)
        lossy = recipe is not None and any(s.name in ("prune", "cluster") for s in specs)
        if lossy and ctx.data is not None and not force:
            _refuse_too_few(m, ctx.data, specs, data)
        plans: list = []

        def limit(model_now: ir.Model, rest: list) -> list:
            from mconv.drivers.budget import limit_datafree

            update("data-free check (weight SNR per layer)", 0, None)
            rest, plan = limit_datafree(model_now, rest)
            plans.append(plan)
            return rest

        # measured: a finetune pass holds samples out and reports the compressed model on them
        measured = ctx.data is not None and any(s.name == "finetune" for s in specs)
        datafree = lossy and not measured and not force
        with _progress(progress)(f"optimize {recipe or passes}", len(specs)) as update:
            ctx.progress = update
            m, reports = P.run_pipeline(m, specs, ctx, limit=limit if datafree else None)
        if freed:
            fix_batch(m)
        if out_path is not None:
            written = save(m, out_path, format, source=source)
        after = model_stats(m)
        account = predicted_account(m)
    file_bytes = None
    if out_path is not None:
        from mconv.formats.weights import is_weight_only
        from mconv.targets.validity import check_written

        check_written(out_path, source, what="optimize", graph=not is_weight_only(m))
        file_bytes = sum(p.stat().st_size for p in written if p.is_file())
    return OptimizeResult(
        output=str(out_path) if out_path is not None else None,
        files=[str(p) for p in written],
        weight_bytes_before=before.bytes,
        weight_bytes_after=after.bytes,
        file_bytes_after=file_bytes,
        predicted_bundle_weight_bytes=account["total"]["bytes"] if account else None,
        reports=list(reports),
        account=account or None,
        model=m,
        source=str(source) if source is not None else None,
        notes=[BATCH_NOTE] if freed else [],
        **_unmeasured(lossy and not measured, plans[0] if plans else None, ctx.data is None),
    )


def _unmeasured(unmeasured: bool, plan, no_data: bool) -> dict[str, Any]:
    """The result's ``accuracy_measured``, ``datafree`` and warning for a lossy recipe that
    nothing measured: no data, or no finetune pass to use it (``plan``: the data-free check's,
    None under ``force``)."""
    if not unmeasured:
        return {}
    why = "no --data" if no_data else "no finetune pass measured it"
    if plan is not None:
        note = plan.note(why)
    else:
        note = (
            f"ACCURACY WAS NOT MEASURED: {why}, and --force ran the recipe as written, unchecked; "
            "give --data D.npz (and a finetune pass) to measure it"
        )
    return {"accuracy_measured": False, "datafree": plan, "warnings": [note]}


def _refuse_too_few(m: ir.Model, feeds: Mapping[str, np.ndarray], specs: list, data) -> None:
    """A recipe's fine-tuning holds out too few samples to tell anything: exit 2 before work."""
    from mconv.drivers.budget import _check_data, too_few_samples

    tunes = [s for s in specs if s.name == "finetune"]
    holdout = float(tunes[0].resolve().holdout) if tunes else 0.0
    if holdout <= 0:
        return
    n = _check_data(m, feeds)[2]
    held = min(max(int(round(holdout * n)), 1), n - 1) if n >= 2 else 0
    why = too_few_samples(held, None)
    if why is not None:
        raise InputError(
            f"{n} samples: {why}",
            path=str(data) if not isinstance(data, Mapping) else None,
            hint="give more samples, or --force to go on without a measure that means anything",
        )


def _static_budget(
    passes: str | None, budget: Any, max_drop: float | None, target_size: Any, save_recipe: Any
) -> list | None:
    """``--max-drop`` given with a pass spec holding ``quantize(mode=static)`` and no other
    budget option: the parsed spec with ``max_drop`` set on that pass (the layers it keeps float
    until the held-out drop is within it, passes/quantize_static.py rule 6), else None."""
    from mconv import passes as P

    drop = max_drop if max_drop is not None else getattr(budget, "max_drop", None)
    size = target_size if target_size is not None else getattr(budget, "target_size", None)
    if not passes or drop is None or size is not None or save_recipe is not None:
        return None
    specs = P.parse_spec(passes)
    hits = [s for s in specs if s.name == "quantize" and s.config.get("mode") == "static"]
    if not hits:
        return None
    for spec in hits:
        if spec.config.get("max_drop") is None:
            spec.config["max_drop"] = float(drop)
    return specs


def _refuse_budget_options(budgeted: bool, val_data: Any, epochs: int | None) -> None:
    """The budget search's own options without the search: exit 2."""
    if val_data is not None and not budgeted:
        raise InputError(
            "--val-data is the budget search's gate data",
            where="--val-data",
            hint="add --max-drop F or --target-size SIZE with --recipe deep-compression",
        )
    if epochs is not None and not budgeted:
        raise InputError(
            "--epochs is the budget search's, per fine-tuning stage",
            where="--epochs",
            hint="add --max-drop F or --target-size SIZE with --recipe deep-compression, or give "
            "finetune(epochs=N) in --passes",
        )


def budget_config(
    model: ModelLike,
    *,
    max_drop: float | None = None,
    target_size: int | str | None = None,
    target_of: str = "weights",
    seed: int = 0,
    engine: str | None = None,
    device: str | None = None,
    workers: int = 0,
    ray_address: str | None = None,
    epochs: int | None = None,
    prior: str = "l2",
    cluster: str = "kmeans",
    gate_se: float = 1.0,
    structured: str = "auto",
) -> BudgetConfig:
    """The budget search's options (the CLI's option group, or :func:`optimize`'s keywords) as
    one :class:`~mconv.drivers.budget.BudgetConfig`, checked once: ``--workers``/``--ray`` and
    ``--engine``/``--device`` first, then the search's own, refused naming ``model``'s file."""
    from mconv.drivers.budget import BudgetConfig
    from mconv.drivers.parallel import check_workers
    from mconv.engines.xla.engine import check_engine

    check_workers(workers, ray_address)
    engine, device = engine or "auto", device or "cpu"  # auto: decided on the model and data
    check_engine("xla" if engine == "auto" else engine, device)
    source = None if isinstance(model, ir.Model) else Path(model)
    with naming_the_file(source) if source else contextlib.nullcontext():
        return BudgetConfig(
            max_drop=max_drop, target_size=target_size, target_of=target_of, seed=seed,  # type: ignore[arg-type]
            engine=engine, device=device, workers=workers,
            ray_address=ray_address, epochs=epochs, prior=prior, cluster=cluster, gate_se=gate_se,
            structured=structured,
        )  # fmt: skip


def _optimize_budget(
    model: ModelLike,
    recipe: str | None,
    data: Any,
    output: PathLike | None,
    format: str | None,
    save_recipe: PathLike | None,
    progress: Any,
    config: BudgetConfig,
    val_data: Any = None,
    force: bool = False,
) -> OptimizeResult:
    """``--max-drop`` / ``--target-size`` / ``--save-recipe``: the budgeted Deep Compression."""
    from mconv.account import predicted_account
    from mconv.drivers.budget import BudgetNotMet, compress_to_budget
    from mconv.irio import model_stats

    if recipe != "deep-compression":
        raise InputError(
            "--max-drop, --target-size and --save-recipe go with --recipe deep-compression",
            hint="mconv optimize MODEL --recipe deep-compression --data D.npz --max-drop 0.005",
        )
    source = None if isinstance(model, ir.Model) else Path(model)
    m, _ = _as_model(model)
    before = model_stats(m)
    (feeds, val_feeds), freed = load_data_batched(m, data, val_data)

    def check_gate(held: int, gate: float | None) -> None:  # before the work: a gate too coarse
        from mconv.drivers.budget import too_few_samples

        why = too_few_samples(held, gate)
        if why is not None and not force:
            where = val_data if val_feeds is not None else data
            raise InputError(
                why,
                path=str(where) if not isinstance(where, Mapping) else None,
                hint=f"give more samples ({'--val-data' if val_feeds is not None else '--data'}), "
                "a larger --max-drop, or --force to go on with a gate that cannot tell",
            )

    failed: GateFailed | None = None
    with naming_the_file(source) if source else contextlib.nullcontext():
        with _progress(progress)("optimize deep-compression (budget)", None) as update:
            try:
                budget = compress_to_budget(
                    m, feeds, config, progress=update, val_data=val_feeds, check_gate=check_gate
                )
            except BudgetNotMet as exc:  # the best result found is still written and reported
                budget, failed = exc.result, exc
    m = budget.model
    if freed:
        fix_batch(m)
    written: list[Path] = []
    file_bytes = None
    out_path = Path(output) if output is not None else None
    if out_path is not None:
        from mconv.formats.weights import is_weight_only
        from mconv.targets.validity import check_written

        written = save(m, out_path, format, source=source)
        check_written(out_path, source, what="optimize", graph=not is_weight_only(m))
        file_bytes = sum(p.stat().st_size for p in written if p.is_file())
    if save_recipe is not None:
        budget.write_recipe(save_recipe)
    account = predicted_account(m)
    result = OptimizeResult(
        output=str(out_path) if out_path is not None else None,
        files=[str(p) for p in written],
        weight_bytes_before=before.bytes,
        weight_bytes_after=model_stats(m).bytes,
        file_bytes_after=file_bytes,
        predicted_bundle_weight_bytes=account["total"]["bytes"] if account else None,
        reports=[],
        account=account or None,
        model=m,
        budget=budget,
        source=str(source) if source is not None else None,
    )
    if freed:
        result.notes.append(BATCH_NOTE)
    if failed is not None:
        failed.result = result  # type: ignore[attr-defined]
        raise failed
    return result


def budget_summary(budget: Any) -> str:
    """The budget search's report (``OptimizeResult.budget``) as the CLI prints it."""
    from mconv.drivers.budget import summary_text

    return summary_text(budget)


def pass_listing() -> list[tuple[str, list[tuple[str, str]]]]:
    """``optimize --help``'s epilog: the registered passes and the built-in recipes, each with
    its one-line description, read from the registries."""
    import tomllib

    from mconv.passes import summary
    from mconv.passes.base import PASSES
    from mconv.passes.pipeline import RECIPE_DIR, recipe_names

    passes = [(name, summary(cls.__doc__)) for name, cls in sorted(PASSES.items())]
    recipes = []
    for name in recipe_names():
        try:
            desc = tomllib.loads((RECIPE_DIR / f"{name}.toml").read_text()).get("description", "")
        except (OSError, ValueError):
            desc = ""
        recipes.append((name, str(desc)))
    return [("Passes (--passes)", passes), ("Recipes (--recipe)", recipes)]
