"""The budget search's option defaults and the size parser (rules 2, 3 and 7)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from mconv.errors import InputError

SPARSITIES = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97)


BITS = (8, 6, 5, 4, 3)


# rule 14: the fractions of a layer's output channels a structured option removes
STRUCTURED = (0.25, 0.5, 0.75)


PRUNE_RECOVERY = 0.1  # rule 3: weight of an option's pruning cost against its clustering cost


PALETTE_RECORD = 8  # index bytes a layer's palette record takes beyond a float one (bits, size, rans)


DECAY = 1e-3  # L2 weight decay of the pre-training stage (0: none)


PRE_PASSES = ("fold", "eliminate-identity", "fuse-bn", "dce")


Progress = Callable[[str, float, float | None], None]


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmg]i?b?|b)?\s*$", re.I)


def parse_size(text: str | int) -> int:
    """``44KB`` -> 45,056; ``6.9MB`` -> 7,235,174; ``5061`` -> 5,061 (KB = 1024 B, as the issue's
    "44 KB (45,056 B)"; KiB and kB read the same)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise InputError(f"size {str(text)[:40]!r} is not a size", hint="e.g. 44KB, 6.9MB or 45056")
        unit = (m.group(2) or "b").lower()[:1]
        value = int(float(m.group(1)) * {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit])
    if value <= 0:
        raise InputError(f"size {text!r} is not positive", hint="e.g. 44KB, 6.9MB or 45056")
    return value


@dataclass(frozen=True)
class BudgetConfig:
    """Every option of the budget search, checked once when made (each bad value one
    :class:`InputError`): the CLI's option group builds it, :func:`mconv.optimize` passes it on
    and :func:`~mconv.drivers.budget.compress_to_budget` reads it. ``target_size`` is held in
    bytes (:func:`parse_size` reads ``44KB``), ``sparsities`` sorted with 0.0 among them."""

    max_drop: float | None = None
    target_size: int | None = None
    target_of: str = "weights"
    seed: int = 0
    engine: str = "auto"  # rule 11: auto, xla or reference (auto: engines/fast.py rule 1)
    device: str = "cpu"
    estimator: str = "fisher"
    holdout: float = 0.25
    epochs: int | None = None
    attempts: int = 8
    batch_size: int = 32
    snr_db_min: float | None = None
    sparsities: tuple[float, ...] = SPARSITIES
    bits: tuple[int, ...] = BITS
    decay: float = DECAY
    reestimate: bool = True
    workers: int = 0
    ray_address: str | None = None
    shift: int | None = None
    prior: str = "l2"  # rule 6's pre-training: "l2", "gmm" (drivers/budget/softshare.py) or "auto"
    # rule 13: "entropy" lets the clustering stage choose, per layer and bit width, entropy-
    # constrained clustering (cluster method="entropy") with a cap and lam from the data
    cluster: str = "kmeans"
    # rule 7: the gate passes when the held-out drop plus this many of its standard errors is
    # within max_drop (0: the measured drop alone)
    gate_se: float = 1.0
    # rule 14: "auto" offers the search structured options (output channels removed), "off" not
    structured: str = "auto"

    def __post_init__(self) -> None:
        from mconv.drivers.parallel import check_workers
        from mconv.engines.xla.engine import check_engine

        if self.engine is None:
            object.__setattr__(self, "engine", "auto")
        # auto (rule 11) is decided on the model and data (search._prepare); a device asks for xla
        check_engine("xla" if self.engine == "auto" else self.engine, self.device)
        check_workers(self.workers, self.ray_address)
        if self.prior not in ("auto", "l2", "gmm"):
            raise InputError(f"prior {self.prior!r}", where="--prior", hint="auto, l2 or gmm")
        if self.structured not in ("auto", "off"):
            raise InputError(f"structured {self.structured!r}", where="--structured", hint="auto or off")
        if self.cluster not in ("kmeans", "entropy"):
            raise InputError(f"cluster {self.cluster!r}", where="--cluster", hint="kmeans or entropy")
        if isinstance(self.gate_se, bool) or not 0.0 <= float(self.gate_se) <= 10.0:
            raise InputError(
                f"gate standard errors {self.gate_se!r}", where="--gate-se", hint="0 to 10, e.g. 1"
            )
        if self.estimator not in ("fisher", "sweep"):
            raise InputError(f"estimator {self.estimator!r}", hint="use 'fisher' or 'sweep'")
        drop = self.max_drop
        if drop is not None and (isinstance(drop, bool) or not 0.0 <= float(drop) < 1.0):
            raise InputError(f"max drop {drop!r} is not a fraction", hint="0.005 is half a point")
        if self.target_size is not None:
            object.__setattr__(self, "target_size", parse_size(self.target_size))
        if self.target_of not in ("weights", "bundle"):
            raise InputError(f"target of {self.target_of!r}", where="--target-of", hint="weights or bundle")
        if not 0.0 < self.holdout < 1.0:
            raise InputError(f"holdout {self.holdout!r}", hint="a fraction in (0, 1), e.g. 0.25")
        if self.attempts < 1:
            raise InputError(f"attempts {self.attempts!r}", hint="1 or more")
        if self.epochs is not None and not _count(self.epochs, 1):
            raise InputError(
                f"epochs {self.epochs!r}", where="--epochs", hint="1 or more per fine-tuning stage"
            )
        if self.shift is not None and not _count(self.shift, 0):
            raise InputError(
                f"shift {self.shift!r}", hint="pixels, 0 (off) or more; None: from the input's size"
            )
        sparsities, bits = self.sparsities, self.bits
        if any(not 0.0 <= float(x) < 1.0 for x in sparsities) or any(not 1 <= int(b) <= 8 for b in bits):
            raise InputError(
                f"sparsities {list(sparsities)}, bits {list(bits)}", hint="sparsities in [0, 1), bits 1..8"
            )
        object.__setattr__(self, "sparsities", tuple(sorted({0.0, *(float(x) for x in sparsities)})))
        object.__setattr__(self, "bits", tuple(bits))

    @classmethod
    def of(cls, config: BudgetConfig | None = None, **options: Any) -> BudgetConfig:
        """``config`` with ``options`` (field names) set; a new config from ``options`` alone."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown budget option(s) {', '.join(unknown)}")
        return cls(**options) if config is None else replace(config, **options)

    @property
    def measured(self) -> str:
        """Rule 7: the export size the target is of (a key of the attempt's sizes)."""
        return "weights_file" if self.target_of == "weights" else "bundle"


def _count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
