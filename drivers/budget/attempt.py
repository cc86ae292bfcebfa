"""Rules 6 and 7: one attempt of the search, an allocation scheduled, fitted to the target and
gated stage by stage on the held-out samples."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.drivers.budget import evaluation as E
from mconv.drivers.budget.allocation import _alloc_bytes, _alloc_table, _reallocate, _widest
from mconv.drivers.budget.config import PALETTE_RECORD, BudgetConfig, Progress
from mconv.drivers.budget.evaluation import _Evaluator, _restore, _weights_state
from mconv.drivers.budget.schedule import (
    _cluster_spec,
    _clustered_names,
    _prefix,
    _schedule,
    cluster_entries,
    cluster_groups,
)
from mconv.drivers.budget.sensitivity import _Layer, after_cut, cut_of
from mconv.passes.base import PassContext, PassSpec
from mconv.passes.pipeline import _record_provenance, snapshot_model


@dataclass
class Search:
    """What every attempt reads: the options, the evaluator and split, the layers and their
    allocations (``fitting``), the model every attempt starts from (``base``) and the stages
    that ran before the search (``pre``, ``pre_stages``)."""

    config: BudgetConfig
    say: Progress
    ev: _Evaluator
    train: np.ndarray
    held: np.ndarray
    baseline: float
    max_drop: float | None
    epochs: int
    holdout: float
    shift: int
    shift_targets: str
    data: dict | None
    reference: ir.Model | None
    memo: dict
    pre: list[PassSpec]
    pre_stages: list[dict]
    start_metric: float
    layers: list[_Layer] = field(default_factory=list)
    fitting: list[dict] = field(default_factory=list)
    base: ir.Model | None = None
    base_history: str | None = None
    tried: dict[int, dict] = field(default_factory=dict)
    split: dict = field(default_factory=dict)  # rule 1: the counts the report names
    est: dict = field(default_factory=dict)  # rule 3: the estimator's report
    room: int = 0  # rule 7: the bytes the layers' blobs have under the target
    plans: dict = field(default_factory=dict)  # rule 13: (layer, sparsity, bits) -> cluster settings

    @property
    def target(self) -> int | None:
        return self.config.target_size

    @property
    def close(self) -> int:
        """Rule 7: a size this near the target fits it."""
        return 0 if self.target is None else max(16, self.target // 100)

    def sizes_of(self) -> dict[str, int]:
        return {layer.name: layer.params for layer in self.layers}

    def plan_for(self, alloc: Mapping) -> list[tuple[str, list[PassSpec]]]:
        """Rule 6's schedule for ``alloc`` with this search's fine-tuning settings."""
        c = self.config
        return _schedule(
            alloc, self.epochs, c.seed, self.holdout, c.batch_size, c.engine, c.device,
            self.shift, self.shift_targets, self.sizes_of(), self.plans, self.loss,
        )  # fmt: skip

    @property
    def loss(self) -> str:
        """Rule 6: retraining distils what the gate measures. Class scores and per-position
        class probabilities: the KL (per position over the last axis); a raw output the gate
        compares by its channel-balanced cosine (a detector's boxes and scores, a feature map):
        the channel-balanced MSE. A KL over the last axis of a detector's ``[N, 4 + classes,
        anchors]`` would be a softmax over its anchors, blind to the class scores."""
        return "mse" if self.ev.metric_name == "cosine" else "kl"

    @property
    def entropy_plans(self) -> dict | None:
        """Rule 13: the dict the clustering stage's reallocations fill, or None (k-means only)."""
        return self.plans if self.config.cluster == "entropy" else None

    def history_bytes(self, specs: list[PassSpec], stages: list[tuple[str, list[PassSpec]]]) -> int:
        """The bundle's provenance of ``specs`` and the ``stages`` still to come (an attempt's
        history, at most: a rolled-back stage leaves its specs out), when the target is the
        bundle's; 0 when it is the weight file's."""
        if self.config.target_of != "bundle":
            return 0
        history = [spec.as_dict() for spec in specs] + [spec.as_dict() for _, ss in stages for spec in ss]
        return len(json.dumps(history, sort_keys=True, separators=(",", ":")))

    def nonlayer_now(self, work: ir.Model, specs: list[PassSpec], stages: list) -> int:
        """Rule 7: the measured size less the layers' blobs, with their palette records."""
        sizes = E._rounded_sizes(work)
        blobs = sum(sizes["stored"].get(layer.tensor, 0) for layer in self.layers)
        nonlayer = sizes[self.config.measured] - blobs + PALETTE_RECORD * len(self.layers)
        return nonlayer + self.history_bytes(specs, stages)

    def final_size(self, work: ir.Model, specs: list[PassSpec], stages: list) -> int:
        return E._rounded_sizes(work)[self.config.measured] + self.history_bytes(specs, stages)

    def run(self, k: int) -> dict:
        """Attempt ``k`` of ``fitting``, once (the search asks again for one it tried)."""
        if k not in self.tried:
            label = f"attempt {len(self.tried) + 1}/{self.config.attempts}"
            r = self.tried[k] = _Attempt(self, k, label).run()
            self.say(  # the metric so far, between attempts
                f"{label} done: held-out {self.ev.metric_name} {r['final']:.4f} (drop {r['drop']:+.4f}), "
                f"{self.config.target_of} {r['sizes'][self.config.measured]:,} B",
                0,
                None,
            )
        return self.tried[k]


class _Attempt:
    """One allocation's schedule on a copy of the base model (rule 6), each fine-tuning stage
    rolled back when it made the held-out outputs worse, re-estimated and fitted (rule 7)."""

    def __init__(self, search: Search, k: int, label: str) -> None:
        assert search.base is not None
        self.s, self.k, self.label = search, k, label
        self.work = snapshot_model(search.base)
        self.alloc: Any = search.fitting[k]
        # rule 14: the allocation's structured cuts run first; the layers and allocation after
        # them (keys (s, b)) are what every later stage re-estimates
        self.cut_alloc: Any = self.alloc
        self.layers: list[_Layer] = search.layers
        self.cuts: dict[str, dict] = {}
        cutting = any(cut_of(layer, self.alloc[layer.name]) for layer in search.layers)
        self.kept: list[PassSpec] = list(search.pre)
        self.stages = list(search.pre_stages)
        self.held_metric = search.start_metric
        self.held_got = search.ev.outputs(self.work, search.held)  # the outputs before the next stage
        self.budget = _alloc_bytes(search.layers, self.alloc)
        self.reallocated: list[dict] = []
        self.predicted: Any = None
        self.stage_budget: Any = None
        # rule 6: with re-estimation every stage's slot; its settings are decided when it comes
        self.plan = search.plan_for(_widest(search.layers) if search.config.reestimate else self.alloc)
        if cutting and search.config.reestimate:
            first = [st for st in search.plan_for(self.alloc) if st[0].startswith("structured")]
            self.plan = first + self.plan
        elif not cutting:
            self.layers, self.alloc = after_cut(search.layers, self.alloc, self.work)
        self.ctx = PassContext(
            data=search.data, reference_model=search.reference, seed=search.config.seed, memo=search.memo
        )

    def run(self) -> dict:
        for si, (name, planned) in enumerate(self.plan):
            self.ctx.progress = _prefix(self.s.say, f"{self.label} [{si + 1}/{len(self.plan)}] {name}")
            self.ctx.stage = None
            specs = self._reestimate(si, name) if self.s.config.reestimate else planned
            if specs is None:
                continue  # the allocation has nothing for this stage (e.g. nothing clustered)
            self._stage(si, name, specs)
            if name == "structured pruning":
                self._cut()
        return self._finish()

    def _cut(self) -> None:
        """Rule 14: the graph is cut; the layers and the allocation follow it."""
        for layer in self.layers:
            cut = cut_of(layer, self.cut_alloc[layer.name])
            if cut is not None:
                self.cuts[layer.name] = {
                    "fraction": cut.fraction,
                    "channels": cut.channels,
                    "removed": len(cut.removed),
                }
        self.layers, self.alloc = after_cut(self.layers, self.cut_alloc, self.work)

    def _reestimate(self, si: int, name: str) -> list[PassSpec] | None:
        s = self.s
        if name.startswith("structured"):
            return dict(s.plan_for(self.cut_alloc)).get(name)
        if (name.startswith("prune step") and si > 0) or name == "cluster":
            s.say(f"{self.label} [{si + 1}/{len(self.plan)}] re-estimating the allocation", 0, None)
            self.stage_budget = self.budget
            if name == "cluster" and s.target is not None:  # rule 7: the bytes left, measured
                self.stage_budget = s.target - s.nonlayer_now(self.work, self.kept, self.plan[si:])
            self.alloc, self.predicted = _reallocate(
                self.work, s.ev, s.train, self.layers, self.stage_budget, bits_only=name == "cluster",
                plans=s.entropy_plans if name == "cluster" else None,
            )  # fmt: skip
            self.reallocated.append(
                {
                    "stage": name,
                    "budget_bytes": self.stage_budget,
                    "predicted_bytes": self.predicted,
                    "allocation": _alloc_table(self.alloc),
                }
            )
        return dict(self.s.plan_for(self.alloc)).get(name)

    def _stage(self, si: int, name: str, specs: list[PassSpec]) -> None:
        s, work = self.s, self.work
        before_state = _weights_state(work)
        t0 = time.perf_counter()
        fitting_now = s.config.reestimate and name == "cluster" and s.target is not None
        if not fitting_now:
            E._run_specs(work, specs, self.ctx)
        else:
            specs = self._fit_cluster(si, name, specs, before_state)
        groups = cluster_groups(_clustered_names(self.alloc), s.sizes_of())
        if (
            s.config.reestimate
            and s.target is not None
            and len(groups) > 1
            and name == f"cluster {len(groups)}"
        ):
            specs = self._refit_last_group(si, name, specs, groups[-1], before_state)
        got = s.ev.outputs(work, s.held)
        m = s.ev.metric(got, s.held)
        check = specs[0].name in ("finetune", "round-fp16") or name == "biases clustered"
        rolled = check and s.ev.worse(self.held_got, got, s.held)
        if rolled:
            _restore(work, before_state)
        else:
            self.kept += specs
        self.stages.append(
            {
                "stage": name,
                "metric_before": self.held_metric,
                "metric_after": m,
                "rolled_back": rolled,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
        if not rolled:
            self.held_metric, self.held_got = m, got

    def _sized(self, alloc_now: Mapping, group_specs: list[PassSpec], whole: bool) -> None:
        """Rule 7 at clustering: the attempt's model clustered for its size (with progressive
        groups, every group at once: the result's indices), else the stage."""
        if whole:
            full = cluster_entries(alloc_now, self.s.plans)
            E._run_specs(self.work, [_cluster_spec(full)], self.ctx)
        else:
            E._run_specs(self.work, group_specs, self.ctx)

    def _fit_cluster(self, si: int, name: str, specs: list[PassSpec], before_state: tuple) -> list[PassSpec]:
        """Rule 7: the export after clustering is the result's size (the stages after it move
        centroids, not indices): the bits again for the bytes it missed the target by, over or
        under, until it fits within ``close`` of it; the largest that fits is kept (else the
        smallest). Returns the stage's specs."""
        s, work, target = self.s, self.work, self.s.target
        assert target is not None  # fitting implies a target
        progressive = len(cluster_groups(_clustered_names(self.alloc), s.sizes_of())) > 1
        alloc, predicted, stage_budget = self.alloc, self.predicted, self.stage_budget
        self._sized(alloc, specs, progressive)
        runs: list[dict] = []
        for _ in range(4):
            size = s.final_size(work, self.kept + specs, self.plan[si + 1 :])
            runs.append(
                {"size": size, "state": _weights_state(work), "alloc": alloc,
                 "predicted": predicted, "specs": specs, "budget": stage_budget}
            )  # fmt: skip
            if 0 <= target - size <= s.close:
                break
            # over: below what the overshooting allocation was predicted to take (its budget may
            # hold slack that the same allocation would fill again)
            stage_budget = (min(stage_budget, predicted) if size > target else stage_budget) + target - size
            _restore(work, before_state)
            alloc, predicted = _reallocate(
                work, s.ev, s.train, self.layers, stage_budget, bits_only=True, plans=s.entropy_plans
            )
            if any(alloc == r["alloc"] for r in runs):
                break
            specs = dict(s.plan_for(alloc)).get(name, specs)
            self._sized(alloc, specs, progressive)
        fit = [r for r in runs if r["size"] <= target]
        kept_run = max(fit, key=lambda r: r["size"]) if fit else min(runs, key=lambda r: r["size"])
        self.alloc, self.predicted, specs = kept_run["alloc"], kept_run["predicted"], kept_run["specs"]
        self.stage_budget = stage_budget
        if progressive:  # the first group alone now; the others in their own stages
            _restore(work, before_state)
            E._run_specs(work, specs, self.ctx)
        else:
            _restore(work, kept_run["state"])
        self.reallocated[-1].update(
            budget_bytes=kept_run["budget"],
            predicted_bytes=self.predicted,
            allocation=_alloc_table(self.alloc),
            fitted=[[r["budget"], r["size"]] for r in runs],
        )
        return specs

    def _refit_last_group(
        self, si: int, name: str, specs: list[PassSpec], group: list[str], before_state: tuple
    ) -> list[PassSpec]:
        """Rule 7: the last group clustered, the export is the result's size; the earlier
        groups' fine-tuning moved their weights since the fit, so when it now overshoots the last
        group's bits are chosen again for the bytes it went over by."""
        s, work, target = self.s, self.work, self.s.target
        assert target is not None
        last = [layer for layer in self.layers if layer.name in group]
        for _ in range(4):
            sizes = E._rounded_sizes(work)  # one export: the size and each layer's blob
            over = sizes[s.config.measured] + s.history_bytes(self.kept + specs, self.plan[si + 1 :]) - target
            if over <= 0:
                break
            stored = sizes["stored"]
            room = sum(stored.get(layer.tensor, 0) for layer in last) - over
            _restore(work, before_state)
            part, part_bytes = _reallocate(
                work, s.ev, s.train, last, room, bits_only=True, plans=s.entropy_plans
            )
            if all(part[n] == self.alloc[n] for n in part) or any(b is None for _, b in part.values()):
                E._run_specs(work, specs, self.ctx)
                break
            self.alloc = {**self.alloc, **part}
            specs = dict(s.plan_for(self.alloc)).get(name, specs)
            E._run_specs(work, specs, self.ctx)
            self.reallocated.append(
                {
                    "stage": name,
                    "budget_bytes": room,
                    "predicted_bytes": part_bytes
                    + sum(stored.get(layer.tensor, 0) for layer in self.layers if layer not in last),
                    "overshoot": over,
                    "allocation": _alloc_table(self.alloc),
                }
            )
        return specs

    def _finish(self) -> dict:
        s, work = self.s, self.work
        got = s.ev.outputs(work, s.held)
        final = s.ev.metric(got, s.held)
        if s.base_history is None:
            work.metadata_props.pop("mconv.passes", None)
        else:
            work.metadata_props["mconv.passes"] = s.base_history
        _record_provenance(work, self.kept)
        sizes = E._attempt_sizes(work)
        drop = s.baseline - final
        lost = s.ev.losses(got, s.held)
        se = s.ev.drop_se(got, s.held)
        bound = drop + s.config.gate_se * (se or 0.0)  # rule 7: the net drop, less what noise allows
        ok_drop = s.max_drop is None or bound <= s.max_drop + 1e-12
        ok_size = s.target is None or sizes[s.config.measured] <= s.target
        return {
            "index": self.k,
            "alloc": self.alloc,
            "model": work,
            "specs": self.kept,
            "stages": self.stages,
            "final": final,
            "agreement": s.ev.agreement(got, s.held),
            "drop": drop,
            "drop_se": se,
            "drop_bound": bound,
            "lost": lost,
            "sizes": sizes,
            "ok": ok_drop and ok_size,
            "ok_drop": ok_drop,
            "ok_size": ok_size,
            "predicted": _alloc_bytes(self.layers, self.alloc),
            "budget": self.budget,
            "layers": self.layers,
            "cuts": self.cuts,
            "reallocated": self.reallocated,
        }
