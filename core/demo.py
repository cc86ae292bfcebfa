"""``mconv demo``: the main job on the embedded default model, with its size and accuracy report.

import -> optimize (recipe) -> export cpu -> verify on held-out real digits. Writes only into the
folder given or a temporary one.
"""

from __future__ import annotations

import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np

DEFAULT_RECIPE = "deep-compression"


def fixture_path(name: str) -> Path:
    return Path(str(resources.files("mconv.fixtures").joinpath(name)))


def digits_feeds(split: str) -> dict[str, np.ndarray]:
    with np.load(fixture_path(f"digits_{split}.npz")) as z:
        images, labels = z["images"], z["labels"]
    x = images.reshape(len(images), -1).astype(np.float32) / 16.0
    return {"input": x, "labels": labels}


def run_demo(workdir: Path | None, out, recipe: str | None = None) -> dict:
    from mconv import passes as P
    from mconv.cli.app import render_byte_account, render_pass_reports
    from mconv.cli.output import human_bytes
    from mconv.formats import import_model
    from mconv.irio import model_stats, save_onnx
    from mconv.runtime import open_runner
    from mconv.targets import get_target
    from mconv.verify import Gates, verify_outputs
    from rich.table import Table

    recipe = recipe or DEFAULT_RECIPE
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="mconv-demo-")
        work = Path(tmp.name)
    else:
        work = Path(workdir)
        work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        src = fixture_path("digits_mlp.onnx")
        model = import_model([src])
        save_onnx(model, work / "model.onnx")
        original_bytes = model_stats(model).bytes
        train = digits_feeds("train")
        test = digits_feeds("test")
        labels = test.pop("labels")

        ctx = P.PassContext(data=train, seed=0)
        with out.progress(f"optimize ({recipe})", total=None) as update:
            ctx.progress = update
            optimized, reports = P.run_pipeline(model, P.load_recipe(recipe), ctx)
        save_onnx(optimized, work / "optimized.onnx")
        render_pass_reports(out, reports)

        bundle = get_target("cpu").export(optimized, work / "bundle", {})
        render_byte_account(out, bundle.manifest)
        bundle_bytes = sum(f["bytes"] for f in bundle.manifest["files"].values())
        weight_bytes = sum(w["bytes"] for w in bundle.manifest["weights"])

        ref_out = open_runner(work / "model.onnx").run(test)
        cand_out = open_runner(work / "bundle").run(test)
        report = verify_outputs(ref_out, cand_out, Gates(min_top1=0.97), labels)
        m = report.outputs["logits"]
        seconds = time.perf_counter() - t0

        table = Table(
            title=f"mconv demo: LeNet-300-100-style MLP on real handwritten digits ({len(labels)} held-out)",
            title_justify="left",
        )
        for c in ("", "weights", "ratio", "top-1 accuracy"):
            table.add_column(c, justify="left" if not c else "right")
        table.add_row(
            "original (float32)", human_bytes(original_bytes), "1.0x", f"{m['accuracy_reference']:.4f}"
        )
        table.add_row(
            f"bundle ({recipe}, cpu)",
            human_bytes(weight_bytes),
            f"{original_bytes / max(weight_bytes, 1):.1f}x",
            f"{m['accuracy_candidate']:.4f}",
        )
        out.print(table)
        out.print(
            f"agreement with the original: top-1 {m['top1_agreement']:.4f}, cosine {m['cosine']:.6f}, "
            f"SNR {m['snr_db']:.1f} dB; whole bundle {human_bytes(bundle_bytes)}; {seconds:.1f}s"
        )
        out.print(
            f"verification {'passed' if report.passed else 'FAILED'} (gate: top-1 agreement >= 0.97)"
            + ("" if tmp else f"; files in {work}")
        )
        return {
            "passed": report.passed,
            "recipe": recipe,
            "workdir": None if tmp else str(work),
            "bytes_before": original_bytes,
            "bytes_after": weight_bytes,
            "bundle_bytes": bundle_bytes,
            "accuracy_reference": m["accuracy_reference"],
            "accuracy_candidate": m["accuracy_candidate"],
            "verify": report.as_dict(),
            "passes": [r.as_dict() for r in reports],
            "seconds": round(seconds, 2),
        }
    finally:
        if tmp is not None:
            tmp.cleanup()
