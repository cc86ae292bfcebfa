"""``mconv optimize``: run a pass pipeline over a model (:func:`mconv.api.optimize`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from mconv.cli import render
from mconv.cli.common import (
    Command,
    DebugOpt,
    JsonOpt,
    QuietOpt,
    ReportOpt,
    app,
    make_out,
    reuse_progress,
)
from mconv.cli.output import Out, run_command

# The command's options: the budget search's group (--max-drop .. --force) feeds one
# BudgetConfig (mconv.api.optimize.budget_config), checked once.
ModelPathOpt = Annotated[
    Path, typer.Argument(metavar="IN", help="Input model (.onnx or any importable file).")
]

OutputOpt = Annotated[Path, typer.Option("-o", "--output", metavar="FILE", help="Output path (.onnx).")]

PassesOpt = Annotated[
    str | None,
    typer.Option(
        "--passes", metavar="SPEC", help="Pass spec, e.g. 'fold,dce,prune(sparsity=0.9)' (passes below)."
    ),
]

RecipeOpt = Annotated[
    str | None,
    typer.Option("--recipe", metavar="NAME|FILE", help="Built-in recipe (below) or a TOML file."),
]

DataOpt = Annotated[
    Path | None,
    typer.Option("--data", metavar="FILE", help="Calibration / fine-tuning data (.npz)."),
]

ValDataOpt = Annotated[
    Path | None,
    typer.Option(
        "--val-data",
        metavar="FILE",
        help="deep-compression budget: validation data (.npz) for the gate; fine-tuning then "
        "uses all of --data (give it when --data is the set the model was trained on).",
    ),
]

SeedOpt = Annotated[
    int, typer.Option("--seed", metavar="INT", help="Seed of every random choice the passes make.")
]

FormatOpt = Annotated[
    str | None,
    typer.Option("--format", metavar="NAME", help="Output format (default: from the extension)."),
]

MaxDropOpt = Annotated[
    float | None,
    typer.Option(
        "--max-drop",
        metavar="F",
        help="deep-compression: the largest held-out metric drop, a fraction (0.005 = half a "
        "point); each layer's sparsity and bits are searched under it.",
    ),
]

TargetSizeOpt = Annotated[
    str | None,
    typer.Option(
        "--target-size",
        metavar="SIZE",
        help="deep-compression: the largest bundle weights (44KB, 6.9MB, bytes); with --max-drop, "
        "exit 1 with the best result when both cannot be met.",
    ),
]

TargetOfOpt = Annotated[
    str,
    typer.Option(
        "--target-of",
        metavar="WHAT",
        help="deep-compression: what --target-size is the size of: weights (the cpu bundle's "
        "weights.mcw) or bundle (the whole cpu bundle directory: graph and manifest too).",
    ),
]

EpochsOpt = Annotated[
    int | None,
    typer.Option(
        "--epochs",
        metavar="N",
        help="deep-compression budget: epochs of each fine-tuning stage (default: from the "
        "model's multiply-adds and the samples, 3 to 80).",
    ),
]

PriorOpt = Annotated[
    str,
    typer.Option(
        "--prior",
        metavar="NAME",
        help="deep-compression budget: the pre-training before the search: l2 (weight decay), gmm "
        "(soft weight-sharing: a Gaussian-mixture prior) or auto (gmm for a target over 50x).",
    ),
]

ClusterOpt = Annotated[
    str,
    typer.Option(
        "--cluster",
        metavar="METHOD",
        help="deep-compression budget: kmeans (the paper's) or entropy (each layer's bits may be "
        "entropy-constrained clustering, chosen on the data for fewer coded bytes at less error).",
    ),
]

StructuredOpt = Annotated[
    str,
    typer.Option(
        "--structured",
        metavar="MODE",
        help="deep-compression budget: auto (default: the search may remove whole output channels "
        "of a Conv/Gemm layer, rewiring its consumers) or off (unstructured sparsity only).",
    ),
]

GateSeOpt = Annotated[
    float,
    typer.Option(
        "--gate-se",
        metavar="K",
        help="deep-compression budget: the gate passes when the held-out drop plus K of its "
        "standard errors is within --max-drop (default 1; 0: the measured drop alone).",
    ),
]

SaveRecipeOpt = Annotated[
    Path | None,
    typer.Option(
        "--save-recipe",
        metavar="FILE.toml",
        help="deep-compression: write the chosen per-layer recipe (rerun it with the same data "
        "and seed: the same bytes).",
    ),
]

EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        metavar="NAME",
        help="Where fine-tuning runs: reference (numpy) or xla (jax, compiled); for every "
        "finetune pass that names none, and the budget search's stages, teacher and gate "
        "(there auto, the default: xla when jax is installed).",
    ),
]

DeviceOpt = Annotated[str | None, typer.Option("--device", metavar="NAME", help="cpu or cuda (xla engine).")]

WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        metavar="N",
        help="deep-compression budget: run the search's per-layer trials on a local Ray with N workers.",
    ),
]

RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        help="deep-compression budget: run the trials on this Ray cluster (ray://HOST:PORT or auto).",
    ),
]

ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Go on where the data cannot check the result: without --data, run a recipe's "
        "prune and cluster as written (default: each layer only as far as a data-free weight "
        "check keeps its outputs close); with too few samples to measure, run anyway.",
    ),
]


@app.command("optimize", cls=Command)
def optimize_cmd(
    model_path: ModelPathOpt,
    output: OutputOpt,
    passes: PassesOpt = None,
    recipe: RecipeOpt = None,
    data: DataOpt = None,
    val_data: ValDataOpt = None,
    seed: SeedOpt = 0,
    format: FormatOpt = None,
    max_drop: MaxDropOpt = None,
    target_size: TargetSizeOpt = None,
    target_of: TargetOfOpt = "weights",
    epochs: EpochsOpt = None,
    prior: PriorOpt = "l2",
    cluster: ClusterOpt = "kmeans",
    gate_se: GateSeOpt = 1.0,
    structured: StructuredOpt = "auto",
    save_recipe: SaveRecipeOpt = None,
    engine: EngineOpt = None,
    device: DeviceOpt = None,
    workers: WorkersOpt = 0,
    ray_address: RayAddressOpt = None,
    force: ForceOpt = False,
    report: ReportOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run a pass pipeline (spec or recipe) over a model."""
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api
        from mconv.api.optimize import budget_config
        from mconv.errors import GateFailed

        if report is not None:  # refused before the work (mconv.report.check_path)
            from mconv.api.common import check_report_path as check_path

            if report.resolve() == output.resolve():
                from mconv.errors import InputError

                raise InputError(
                    "--report is the -o path", path=str(report), hint="give the report its own path"
                )
            check_path(report, model_path, data, val_data)
        budget = None
        if max_drop is not None or target_size is not None or save_recipe is not None:
            budget = budget_config(
                model_path, max_drop=max_drop, target_size=target_size, target_of=target_of,
                seed=seed, engine=engine, device=device, workers=workers, ray_address=ray_address,
                epochs=epochs, prior=prior, cluster=cluster, gate_se=gate_se, structured=structured,
            )  # fmt: skip
        failed = None
        with out.progress(f"optimize {recipe or passes}") as update:
            try:
                result = api.optimize(
                    model_path, passes=passes, recipe=recipe, data=data, seed=seed, output=output,
                    format=format, save_recipe=save_recipe, progress=reuse_progress(update, restart=True),
                    engine=engine, device=device, workers=workers, ray_address=ray_address,
                    val_data=val_data, epochs=epochs, force=force, budget=budget,
                )  # fmt: skip
            except GateFailed as exc:  # an unmet budget: the best result is reported, then exit 1
                if getattr(exc, "result", None) is None:
                    raise
                result, failed = exc.result, exc  # type: ignore[attr-defined]
        _render(out, result, output)
        if report is not None:  # an unmet budget's report too: that is when it is read
            result.write_report(report)
        out.emit(result.as_dict())
        if failed is not None:
            raise failed
        return 0

    run_command(out, body)


def _render(out: Out, result, output: Path) -> None:
    """The human report on stderr: the budget's summary, the passes, warnings, the predicted
    byte account and the one-line size summary."""
    if result.budget is not None:
        from mconv.api.optimize import budget_summary

        out.print(budget_summary(result.budget), markup=False, soft_wrap=True)
    render.render_pass_reports(out, result.reports)
    for warning in result.warnings:  # a lossy recipe without data: said loudly, JSON too
        out.print(f"warning: {warning}", markup=False, soft_wrap=True)
    for note in result.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    if result.datafree is not None and result.datafree.backed_off:
        plan = result.datafree
        out.print(
            f"data-free check: {plan.backed_off} of {len(plan.layers)} layers backed off from the "
            f"recipe to keep a weight SNR of {plan.snr_db:.1f} dB",
            markup=False,
            soft_wrap=True,
        )
    if result.account:  # what export will store, predicted before encoding (the paper's Table 4)
        render.render_byte_account(
            out, {"account": result.account}, title="weight storage at export (predicted)"
        )
    out.print(
        render.optimize_summary(
            output,
            result.weight_bytes_before,
            result.weight_bytes_after,
            result.file_bytes_after or 0,
            result.predicted_bundle_weight_bytes,
        ),
        markup=False,
        soft_wrap=True,
    )
