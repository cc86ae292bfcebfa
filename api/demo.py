"""``mconv demo``: the main job on the embedded default model, with its size and accuracy report.

import -> optimize (recipe) -> export cpu -> verify on held-out real digits. Writes only into the
folder given or a temporary one.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from mconv.fileio import OUTPUT_MARKER, PRODUCER, atomic_dir

DEFAULT_RECIPE = "deep-compression"


def fixture_path(name: str) -> Path:
    return Path(str(resources.files("mconv.fixtures").joinpath(name)))


def digits_feeds(split: str) -> dict[str, np.ndarray]:
    with np.load(fixture_path(f"digits_{split}.npz")) as z:
        images, labels = z["images"], z["labels"]
    x = images.reshape(len(images), -1).astype(np.float32) / 16.0
    return {"input": x, "labels": labels}


@dataclass
class DemoResult:
    """``mconv demo``'s result; ``as_dict()`` is its ``--json`` document."""

    passed: bool
    recipe: str
    workdir: str | None
    bytes_before: int
    bytes_after: int
    bundle_bytes: int
    metrics: dict
    verify: dict
    reports: list
    manifest: dict
    held_out: int
    seconds: float

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "recipe": self.recipe,
            "workdir": self.workdir,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "bundle_bytes": self.bundle_bytes,
            "accuracy_reference": self.metrics["accuracy_reference"],
            "accuracy_candidate": self.metrics["accuracy_candidate"],
            "verify": self.verify,
            "passes": [r.as_dict() for r in self.reports],
            "seconds": round(self.seconds, 2),
        }


def demo(workdir: Path | None = None, recipe: str | None = None, progress=None) -> DemoResult:
    """import -> optimize (``recipe``, default deep-compression) -> export cpu -> verify on the
    held-out digits; files in ``workdir`` (kept) or a temporary folder (removed).

    ``workdir`` is written as one output (:func:`mconv.fileio.atomic_dir`): a new or empty
    folder, or one an earlier demo wrote (its ``.mconv-output.json`` lists its files); any
    other folder is refused."""
    recipe = recipe or DEFAULT_RECIPE
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="mconv-demo-")
        final = work = Path(tmp.name)
        aside: contextlib.AbstractContextManager[Path] = contextlib.nullcontext(work)
    else:
        # The work folder is an mconv output like any other (mconv.fileio rule 5): written aside
        # and swapped in whole, replacing only an earlier demo's folder (or an empty one).
        final = Path(workdir)
        aside = atomic_dir(final)
    try:
        with aside as work:
            result = _demo(work, final, recipe, progress, keep=tmp is None)
            if tmp is None:
                files = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
                marker = {"producer": PRODUCER, "files": files}
                (work / OUTPUT_MARKER).write_text(json.dumps(marker, indent=2))
                for p in work.rglob("*"):
                    p.chmod(0o755 if p.is_dir() else 0o644)
                work.chmod(0o755)
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def _demo(work: Path, final: Path, recipe: str, progress, keep: bool) -> DemoResult:
    """The demo's steps, writing into ``work`` (``final`` once swapped in, when ``keep``)."""
    from mconv import passes as P
    from mconv.api.common import _progress
    from mconv.api.run import open
    from mconv.formats import import_model
    from mconv.irio import model_stats, save_onnx
    from mconv.metrics import Gates, verify_outputs
    from mconv.targets import get_target

    t0 = time.perf_counter()
    src = fixture_path("digits_mlp.onnx")
    model = import_model([src])
    save_onnx(model, work / "model.onnx")
    original_bytes = model_stats(model).bytes
    train = digits_feeds("train")
    test = digits_feeds("test")
    labels = test.pop("labels")

    ctx = P.PassContext(data=train, seed=0)
    with _progress(progress)(f"optimize ({recipe})", None) as update:
        ctx.progress = update
        optimized, reports = P.run_pipeline(model, P.load_recipe(recipe), ctx)
    save_onnx(optimized, work / "optimized.onnx")
    bundle = get_target("cpu").export(optimized, work / "bundle", {})
    bundle_bytes = sum(f["bytes"] for f in bundle.manifest["files"].values())
    weight_bytes = sum(w["bytes"] for w in bundle.weights)

    ref_out = open(work / "model.onnx").run(test)
    cand_out = open(work / "bundle").run(test)
    report = verify_outputs(ref_out, cand_out, Gates(min_top1=0.97), labels)
    return DemoResult(
        passed=report.passed,
        recipe=recipe,
        workdir=str(final) if keep else None,
        bytes_before=original_bytes,
        bytes_after=weight_bytes,
        bundle_bytes=bundle_bytes,
        metrics=report.outputs["logits"],
        verify=report.as_dict(),
        reports=list(reports),
        manifest=bundle.manifest,
        held_out=len(labels),
        seconds=time.perf_counter() - t0,
    )
