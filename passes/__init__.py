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
list of ``{"name": ..., "config": {...}}``: the options that differ from the pass's defaults in
the recorded mconv version, with ``op_type`` / ``op_name`` overrides when present. Fusing passes record ``metadata_props["mconv.fused_from"]`` on the fused node: a JSON
list of the names of the original nodes.
"""

from __future__ import annotations

import importlib
import re

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
    "summary",
    "unknown_pass_hint",
    "whole_names",
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
    "round_fp16",
    "blockwise",
    "inline_if",
    "soft_share",
)

for _module in _PASS_MODULES:
    importlib.import_module(f"{__name__}.{_module}")


# --- help text --------------------------------------------------------------------------------

# The longest hint an error line shows whole (mconv.errors.MconvError.line bounds it so).
HINT_LIMIT = 200
# A period that ends no sentence: after an abbreviation.
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bet al)(?<!\betc)(?<!\bvs)\.(?=\s|$)")
_MODULE_DOC = re.compile(r"\s*\((?:rules |see )?(?:in )?(?:the )?module doc(?:string)?\)", re.I)


def summary(doc: str | None) -> str:
    """A pass's line in ``optimize --help``: the first sentence of its docstring's first
    paragraph, on one line, whole (never cut; the help wraps it between words), without a
    pointer to the module's docstring, which the command line cannot show."""
    paragraph = re.split(r"\n\s*\n", (doc or "").strip(), maxsplit=1)[0]
    text = " ".join(paragraph.split()).replace("``", "'")
    m = _SENTENCE_END.search(text)
    sentence = text[: m.end()] if m else text
    return _MODULE_DOC.sub("", sentence)


def whole_names(names: list[str], budget: int) -> str:
    """``a, b, c and 4 more``: as many of ``names`` as fit in ``budget`` characters, each whole,
    then a count of the rest (all of them when they fit; ``4 more`` when not even one does)."""
    full = ", ".join(names)
    if len(full) <= budget:
        return full
    shown: list[str] = []
    for i, name in enumerate(names):
        rest = len(names) - i - 1
        candidate = ", ".join([*shown, name]) + f" and {rest} more"
        if len(candidate) > budget:
            break
        shown.append(name)
    rest = len(names) - len(shown)
    return f"{', '.join(shown)} and {rest} more" if shown else f"{rest} more"


def unknown_pass_hint(name: str) -> str:
    """The hint of an unknown pass name: the closest names, then every recipe and as many passes
    as fit in an error line whole (:data:`HINT_LIMIT`), the rest counted."""
    import difflib

    passes = sorted(PASSES)
    recipes = recipe_names()
    close = difflib.get_close_matches(name, [*passes, *recipes], n=2, cutoff=0.6)
    if not close:  # a prefix of a name ('fuse' for 'fuse-bn') is close too
        close = [n for n in [*passes, *recipes] if name and n.startswith(name)][:2]
    head = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    tail = f"; recipes: {', '.join(recipes)}" if recipes else ""
    more = " (mconv optimize --help lists all)"
    budget = HINT_LIMIT - len(head) - len("passes: ") - len(tail)
    listed = whole_names(passes, budget)
    if " more" in listed and len(listed) + len(more) <= budget:
        listed += more
    elif " more" in listed:
        listed = whole_names(passes, budget - len(more)) + more
    return f"{head}passes: {listed}{tail}"
