"""``mconv run``: a model or bundle run on feeds."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mconv.api.common import PathLike, _guards, _shapes, naming_the_file
from mconv.errors import InputError


@_guards("path")
def open(path: PathLike, target: str | None = None, input_shapes=None):  # noqa: A001 - the API's name
    """A runner (``inputs``, ``outputs``, ``run(feeds) -> dict``) for a bundle (on its own
    target) or a model file (the reference executor, or ``target``). ``input_shapes`` fixes a
    model's symbolic dims, and is checked against a bundle's inputs."""
    from mconv.api.runtime import open_runner
    from mconv.bundle import is_bundle

    p = Path(path)
    shapes = _shapes(input_shapes)
    with naming_the_file(p):
        if not shapes or is_bundle(p) or p.is_dir():
            runner = open_runner(p, target)
            if shapes:
                from mconv.edit.input_shapes import check_input_shapes

                check_input_shapes(runner.inputs, shapes, path=str(p))
            return runner
        from mconv.formats import open_model_with_shapes
        from mconv.targets import get_target

        return get_target(target or "reference").load_model(open_model_with_shapes(p, shapes))


def output_summary(results: Mapping[str, np.ndarray]) -> dict[str, dict]:
    summary = {}
    for name, arr in results.items():
        a = np.asarray(arr)
        num = bool(a.size) and np.issubdtype(a.dtype, np.number)
        summary[name] = {
            "dtype": a.dtype.name,
            "shape": list(a.shape),
            "min": float(a.min()) if num else None,
            "max": float(a.max()) if num else None,
            "mean": float(a.mean()) if num else None,
        }
    return summary


@dataclass
class RunResult:
    """``mconv run``: the outputs (arrays), their summary, and how random inputs were drawn."""

    outputs: dict[str, np.ndarray] = field(repr=False)
    output: str | None
    seconds: float
    plan: Any = None

    def as_dict(self) -> dict[str, Any]:
        doc = {"output": self.output, "outputs": output_summary(self.outputs), "seconds": self.seconds}
        if self.plan is not None:  # random inputs: how many samples, and how they were batched
            doc.update({"samples": self.plan.samples, "batching": self.plan.as_dict()})
        return doc


@_guards("path", "feeds", "data", output="output", kind="file")
def run(
    path: PathLike,
    feeds: Mapping[str, np.ndarray | PathLike] | None = None,
    *,
    data: PathLike | None = None,
    samples: int | None = None,
    seed: int = 0,
    input_shapes=None,
    target: str | None = None,
    output: PathLike | None = None,
) -> RunResult:
    """``mconv run``: run a bundle or model on ``feeds`` (arrays, or .npy paths by input name),
    on ``data`` (.npz), or on random inputs drawn as verify draws them (``samples``, ``seed``);
    with ``output`` the outputs go to an .npz (atomically)."""
    from mconv.edit.batch import batched_data, per_sample
    from mconv.fileio import atomic_path, require_file
    from mconv.metrics import (
        check_samples,
        check_shapes,
        load_npz_feeds,
        plan_random_feeds,
        run_feeds,
        savable,
    )
    from mconv.npzio import read_npy, write_npz

    check_samples(samples)
    if samples is not None and (feeds or data is not None):
        raise InputError(
            "--samples draws random inputs; it does not go with --input or --data",
            hint="drop --samples, or drop --input/--data",
        )
    shapes = _shapes(input_shapes)
    runner = open(path, target, shapes)
    plan = None
    if not feeds and data is None:  # random inputs, drawn as verify draws them
        plan = plan_random_feeds(runner.inputs, samples=samples, seed=seed, input_shapes=shapes)
        t0 = time.perf_counter()
        results = run_feeds(runner, plan.feeds)
    else:
        given: dict[str, np.ndarray] = {}
        if data is not None:
            given, _ = load_npz_feeds(data, runner.inputs, free_leading=True)
        names = {s.name for s in runner.inputs}
        for name, value in (feeds or {}).items():
            if name not in names:
                raise InputError(f"model has no input '{name}'", hint=f"inputs: {', '.join(sorted(names))}")
            if isinstance(value, str | Path):
                value = read_npy(require_file(value, "input array (.npy)"))  # header checked first
            given[name] = np.asarray(value)
        missing = sorted(names - set(given))
        if missing:
            raise InputError(f"no value for input(s) {', '.join(missing)}", hint="pass --input NAME=file.npy")
        split = batched_data(given, runner.inputs) if data is not None else None
        if split is None and data is not None:
            check_shapes(given, runner.inputs, data)
        t0 = time.perf_counter()
        # the batch fixed at 1 and the data of many samples: a run per sample, outputs joined
        results = run_feeds(runner, per_sample(given, split)) if split is not None else runner.run(given)
    seconds = time.perf_counter() - t0
    if output is not None:
        with atomic_path(Path(output)) as tmp, builtins.open(tmp, "wb") as fh:
            # any output name (savez takes them as keywords); maps and strings as arrays
            write_npz(fh, [item for name, value in results.items() for item in savable(name, value)])
    return RunResult(
        outputs=dict(results), output=str(output) if output else None, seconds=seconds, plan=plan
    )


def check_engine(engine: str) -> None:
    """Refuse an unknown ``--engine`` name (one line, exit 2)."""
    from mconv.engines.xla.engine import check_engine as check

    check(engine)
