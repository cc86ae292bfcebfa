"""Independent trials on Ray: sensitivity sweeps and the budget search's measurements.

Rules:
1. :func:`map_trials` runs ``fn(shared, item)`` for every item and returns the results in the
   items' order. ``workers=0`` and no ``address``: in this process, one after another (the
   default, and what every result is compared against). ``workers=N``: a local Ray with N
   worker processes, started here and shut down after. ``address``: join that Ray cluster
   (``ray://host:port`` or ``auto``), left running after.
2. ``shared`` (the model as ONNX bytes, the data) is put in Ray's object store once; each task
   gets a reference, and a worker process builds its state from it once (:func:`worker_state`
   caches by a token), not once per task.
3. The functions and values sent are mconv's own (Ray serializes them itself); nothing read from
   a model file is ever unpickled: a model travels as ONNX bytes and is parsed by onnx.
4. Results are the same as in-process: each worker runs the same code on the same arrays with
   BLAS pinned to one thread (as in this process when ``threads=1``; Ray pins its workers by
   default), and the tests compare a 2-worker run with the in-process one, value for value.
5. Bad values are one line and exit 2: ``workers`` below 0, both ``workers`` and ``address``,
   Ray not installed (hint: ``pip install 'mconv[ray]'``), a cluster that cannot be reached.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mconv.errors import InputError, show

# worker-side state built once per process from the shared object (rule 2)
_STATE: dict[str, Any] = {}


def check_workers(workers: int, address: str | None) -> None:
    """Refuse bad ``--workers`` / ``--ray`` values (rule 5)."""
    if workers < 0:
        raise InputError(
            f"--workers {workers} is negative", where="--workers", hint="give 0 (no Ray) or N >= 1"
        )
    if workers and address:
        raise InputError(
            "--workers and --ray both given",
            where="--workers",
            hint="--workers N starts a local Ray; --ray ADDRESS joins a cluster: give one",
        )


def uses_ray(workers: int, address: str | None) -> bool:
    return bool(workers) or bool(address)


def worker_state(shared: Mapping[str, Any], build: Callable[[Mapping[str, Any]], Any]) -> Any:
    """The state ``build(shared)`` for this process, built once per ``shared['token']``."""
    token = shared["token"]
    if token not in _STATE:
        _STATE.clear()  # one sweep at a time per worker process
        _STATE[token] = build(shared)
    return _STATE[token]


def new_token() -> str:
    return uuid.uuid4().hex


def _ray(workers: int, address: str | None) -> tuple[Any, bool]:
    try:
        import ray
    except ImportError:
        raise InputError(
            "Ray is not installed",
            where="--ray" if address else "--workers",
            hint="pip install 'mconv[ray]' (or run without --workers/--ray)",
        ) from None
    if ray.is_initialized():
        return ray, False
    env = {"env_vars": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    try:
        if address:
            ray.init(address=address, runtime_env=env, log_to_driver=False, logging_level=logging.ERROR)
        else:
            ray.init(
                num_cpus=workers,
                include_dashboard=False,
                runtime_env=env,
                log_to_driver=False,
                logging_level=logging.ERROR,
                configure_logging=False,
            )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"--ray {show(address)}" if address else f"--workers {workers}"
        raise InputError(
            f"cannot start or reach Ray: {show(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 120)}",
            where=where,
            hint="check the address (ray://HOST:10001 or auto) and that the cluster runs this Ray version",
        ) from None
    return ray, True


def map_trials(
    fn: Callable[[Mapping[str, Any], Any], Any],
    shared: Mapping[str, Any],
    items: Sequence[Any],
    *,
    workers: int = 0,
    address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Any]:
    """``[fn(shared, item) for item in items]``, on Ray when asked (rule 1)."""
    check_workers(workers, address)
    items = list(items)
    shared = dict(shared)
    shared.setdefault("token", new_token())
    if not uses_ray(workers, address):
        out = []
        for i, item in enumerate(items):
            out.append(fn(shared, item))
            if progress is not None:
                progress(i + 1, len(items))
        return out
    ray, started = _ray(workers, address)
    try:
        ref = ray.put(shared)
        remote = ray.remote(num_cpus=1)(_call)
        futures = [remote.remote(fn, ref, item) for item in items]
        index = {f: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        pending = list(futures)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for f in ready:
                results[index[f]] = ray.get(f)
            if progress is not None:
                progress(len(futures) - len(pending), len(futures))
        return results
    finally:
        if started:
            ray.shutdown()


def _call(fn: Callable[[Mapping[str, Any], Any], Any], shared: Mapping[str, Any], item: Any) -> Any:
    # Ray resolves the object reference to the shared mapping before the call (rule 2)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return fn(shared, item)
