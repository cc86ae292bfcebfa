"""Passes: ``onnx_ir.Model -> onnx_ir.Model`` rewrites with typed configs and reports.

Writing a pass
--------------
One file per pass in this folder, one line in ``_PASS_MODULES`` below::

    @register_pass("fuse-bn")
    class FuseBatchNorm(Pass):
        '''Rules, numbered, with a before/after sketch.'''

        @dataclass
        class Config:
            min_size: int = 0

        def run(self, model, config, ctx) -> PassReport:
            ...                                   # mutate model; per node: ctx.config_for(node)
            return self.report(modified, notes=[...], tensors=[...])

The pipeline fills the report's counts (nodes, parameters, bytes before/after), time and config.

Spec strings
------------
``fold,dce,fuse-bn,prune(sparsity=0.9),cluster(bits=5,init='linear'),fp16``: passes separated by
commas, options as ``key=value`` with Python literals (int, float, str, bool, list, dict). The
options ``op_type`` and ``op_name`` take overrides: ``prune(sparsity=0.9,op_type={'Conv':
{'sparsity': 0.6}})``. A bare name that is a recipe (``lossless``) expands to its passes.

Recipes (TOML)
--------------
Built-in recipes live in ``passes/recipes/NAME.toml`` (:func:`recipe_names`); any ``.toml`` path
works too. Schema::

    description = "what the recipe is for"       # optional

    [[pass]]                                      # one table per pass, run in order
    name = "prune"                                # a registered pass name
    sparsity = 0.9                                # global options of the pass's Config

    [pass.op_type.Conv]                           # overrides for every node of this op type
    sparsity = 0.6

    [pass.op_name.fc8]                            # overrides for the node of this name
    sparsity = 0.75

For a node, **name beats type beats global**. Unknown pass names, unknown option keys and
values of the wrong type raise :class:`mconv.errors.InputError` with the valid choices.

Provenance
----------
:func:`run_pipeline` appends the passes it ran to ``model.metadata_props["mconv.passes"]``: a JSON
list of ``{"name": ..., "config": {...}}`` (config with ``op_type`` / ``op_name`` overrides when
present). Fusing passes record ``metadata_props["mconv.fused_from"]`` on the fused node: a JSON
list of the names of the original nodes.
"""

from __future__ import annotations

import importlib

from mconv.passes.base import (
    PASSES,
    NoConfig,
    Pass,
    PassContext,
    PassReport,
    PassSpec,
    get_pass,
    register_pass,
    resolve_config,
)
from mconv.passes.pipeline import load_recipe, make_spec, parse_spec, recipe_names, run_pipeline

__all__ = [
    "PASSES",
    "NoConfig",
    "Pass",
    "PassContext",
    "PassReport",
    "PassSpec",
    "get_pass",
    "load_recipe",
    "make_spec",
    "parse_spec",
    "recipe_names",
    "register_pass",
    "resolve_config",
    "run_pipeline",
]

# One line per pass module. A new pass is one new file plus one line here.
_PASS_MODULES = (
    "shape_inference",
    "fold",
    "dce",
    "eliminate_identity",
    "fuse_bn",
    "fp16",
    "finetune",
    "prune",
    "cluster",
    "quantize",
    "dynamic_batch",
    "budget",
    "blockwise",
    "inline_if",
)

for _module in _PASS_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
