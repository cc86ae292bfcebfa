"""Help and hints read whole: ``optimize --help`` gives each pass's first sentence, never cut; the
unknown-pass hint names whole passes (all, or the first ones and a count); ``demo``'s work
folder is ``--workdir``, with ``-o`` a deprecated spelling that still works and says so once."""

from __future__ import annotations

import json
import re

import pytest
from mconv.cli.app import app
from mconv.passes import HINT_LIMIT, PASSES, recipe_names, summary, unknown_pass_hint, whole_names
from typer.testing import CliRunner


def _section(text: str, title: str) -> dict[str, str]:
    """A help section's rows: name -> its description, wrapped lines joined (a line broken
    after a hyphen joined without a space)."""
    rows: dict[str, str] = {}
    lines = text.split(f"{title}:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    name = None
    for line in lines:
        m = re.match(r"^  (\S+)\s+(.*)$", line)
        if m:
            name = m.group(1)
            rows[name] = m.group(2).strip()
        elif name is not None and line.strip():
            sep = "" if rows[name].endswith("-") else " "
            rows[name] += sep + line.strip()
    return rows


@pytest.mark.parametrize("width", [None, 60, 240])
def test_optimize_help_gives_each_pass_its_whole_first_sentence(width):
    extra = {} if width is None else {"terminal_width": width}
    r = CliRunner().invoke(app, ["optimize", "--help"], **extra)
    assert r.exit_code == 0, r.output
    rows = _section(r.stdout, "Passes (--passes)")
    assert set(rows) == set(PASSES)
    for name, cls in PASSES.items():
        want = summary(cls.__doc__)
        assert rows[name] == want, f"{name}: {rows[name]!r} != {want!r}"
        assert want.endswith("."), want
        # the docstring's own words, up to the end of its first sentence
        doc = " ".join((cls.__doc__ or "").split()).replace("``", "'")
        assert doc.startswith(want.rstrip(".")[:40]), (want, doc)
    assert rows["round-fp16"].endswith("with its lossless fp16 codec.")
    recipes = _section(r.stdout, "Recipes (--recipe)")
    assert set(recipes) == set(recipe_names())
    assert all(d.endswith((".", ")")) for d in recipes.values()), recipes


def test_summary_is_the_first_sentence_whole():
    assert summary("Do a thing.\n\n    1. Rule.") == "Do a thing."
    assert (
        summary("Round these to\n    float16, keeping: all. Then more.")
        == "Round these to float16, keeping: all."
    )
    assert summary("As Han et al. 2016 did, e.g. pruning, i.e. zeros. Next.") == (
        "As Han et al. 2016 did, e.g. pruning, i.e. zeros."
    )
    assert summary("Fold ``BatchNormalization`` (rules in the module doc).") == "Fold 'BatchNormalization'."
    assert summary("Weight sharing (module doc).") == "Weight sharing."
    assert summary("Keep 0.5 of them. Rest") == "Keep 0.5 of them."
    assert summary("No period at all") == "No period at all"
    assert summary(None) == ""


def test_whole_names_counts_what_does_not_fit():
    names = ["alpha", "beta", "gamma", "delta"]
    assert whole_names(names, 100) == "alpha, beta, gamma, delta"
    assert whole_names(names, 25) == "alpha, beta, gamma, delta"  # exactly fits
    assert whole_names(names, 24) == "alpha, beta and 2 more"
    assert whole_names(names, 22) == "alpha, beta and 2 more"
    assert whole_names(names, 21) == "alpha and 3 more"
    assert whole_names(names, 5) == "4 more"


def _one_error(args: list[str]) -> str:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    return lines[0]


def _listed(hint: str) -> tuple[list[str], int]:
    """The pass names a hint lists and the count it gives of the rest."""
    m = re.search(r"passes: (.*?)(?: and (\d+) more \(mconv optimize --help lists all\))?; recipes: ", hint)
    assert m, hint
    return m.group(1).split(", "), int(m.group(2) or 0)


@pytest.mark.parametrize("bad", ["fuse", "bogus", "prun", "x" * 300, "deep"])
def test_the_unknown_pass_hint_lists_whole_names(tmp_path, bad):
    line = _one_error(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--passes", bad])
    assert "\u2026" not in line.split("(hint: ", 1)[1], line  # nothing of the hint cut
    hint = line.split("(hint: ", 1)[1][:-1]
    assert hint == unknown_pass_hint(bad) and len(hint) <= HINT_LIMIT
    names, more = _listed(hint)
    everything = sorted(PASSES)
    assert names == everything[: len(names)] and more == len(everything) - len(names)
    assert hint.endswith(f"; recipes: {', '.join(recipe_names())}")
    if bad == "bogus":  # nothing close: as many passes as fit, whole, the rest counted
        whole = f"passes: {', '.join(everything)}; recipes: {', '.join(recipe_names())}"
        assert (hint == whole) == (len(whole) <= HINT_LIMIT)
    if bad == "fuse":
        assert hint.startswith("did you mean 'fuse-bn'? passes: ")
    if bad == "deep":
        assert hint.startswith("did you mean 'deep-compression'? ")


def test_get_pass_gives_the_same_hint():
    from mconv.errors import InputError
    from mconv.passes import get_pass

    with pytest.raises(InputError) as e:
        get_pass("fuse")
    assert e.value.hint == unknown_pass_hint("fuse")


# --- demo: --workdir, and -o as its deprecated spelling ----------------------------------------


def _demo(*args: str):
    return CliRunner().invoke(app, ["demo", "--recipe", "lossless", "--json", *args])


def test_demo_workdir_writes_the_work_folder_without_a_warning(tmp_path):
    r = _demo("--workdir", str(tmp_path / "w"))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["workdir"] == str(tmp_path / "w")
    assert {"model.onnx", "optimized.onnx", "bundle"} <= {p.name for p in (tmp_path / "w").iterdir()}
    assert "deprecated" not in r.stderr


def test_demo_o_still_works_and_says_it_is_deprecated_once(tmp_path):
    r = _demo("-o", str(tmp_path / "w"))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["workdir"] == str(tmp_path / "w")  # stdout stays one JSON document
    assert (tmp_path / "w" / "bundle" / "manifest.json").is_file()
    warnings = [ln for ln in r.stderr.splitlines() if "deprecated" in ln]
    assert warnings == ["warning: demo -o is deprecated: it names the work folder; use --workdir DIR"]


def test_demo_o_and_a_different_workdir_are_one_error(tmp_path):
    line = _one_error(["demo", "-o", str(tmp_path / "a"), "--workdir", str(tmp_path / "b")])
    assert "-o and --workdir name different folders" in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_demo_help_says_workdir_and_that_o_is_deprecated():
    r = CliRunner().invoke(app, ["demo", "--help"], terminal_width=200)
    assert r.exit_code == 0
    assert re.search(r"^  --workdir DIR\s+Work folder", r.stdout, re.M), r.stdout
    assert re.search(r"^  -o DIR\s+Deprecated: the same as --workdir\.", r.stdout, re.M), r.stdout
