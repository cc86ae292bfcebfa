"""--help for people (issue 12 item 9): every option and argument has a help text, no metavar
shows a Python type (``<list[Path]>``, ``<str>``) or typer's braces (``{src}...``), and optimize
lists its passes and recipes from the registries."""

from __future__ import annotations

import re

import pytest
import typer
from mconv.cli.app import app
from typer.testing import CliRunner

COMMAND = typer.main.get_command(app)
NAMES = sorted(COMMAND.commands)
# What typer shows for an option or argument without a metavar of its own.
PYTHON_TYPE = re.compile(r"<[^>]*>|\{[^}]*\}|\blist\[|\b(str|int|float|path|bool|Path)\b")


def _help(*args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_every_command_is_walked():
    assert {"import", "optimize", "export", "run", "verify", "inspect", "analyze", "demo"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_option_has_help_and_a_metavar_without_python_types(name):
    cmd = COMMAND.commands[name]
    ctx = cmd.make_context(name, ["--help"], resilient_parsing=True)
    for param in cmd.get_params(ctx):
        label = "/".join(param.opts) or param.name
        assert (param.help or "").strip(), f"mconv {name}: {label} has no help text"
        if param.param_type_name == "option":
            decl, _ = param.get_help_record(ctx)
            metavar = decl.split(" ", 1)[1] if " " in decl.replace(", ", ",") else ""
            assert not PYTHON_TYPE.search(metavar), f"mconv {name}: {label} shows {metavar!r}"
    usage = cmd.get_usage(ctx)
    assert "{" not in usage and "<" not in usage, usage


@pytest.mark.parametrize("name", NAMES)
def test_help_text_has_no_python_types_or_braces(name):
    text = _help(name)
    for bad in ("{", "<list", "list[", "<path>", "<str>", "<int>", "<float>", "Path]"):
        assert bad not in text, f"mconv {name} --help shows {bad!r}:\n{text}"


def test_the_help_checker_catches_an_undocumented_option():
    probe = typer.Typer()

    @probe.command()
    def cmd(files: list[str], seed: int = typer.Option(0, "--seed")) -> None:  # noqa: B008
        pass

    text = CliRunner().invoke(probe, ["--help"]).stdout
    assert PYTHON_TYPE.search(text)  # typer's own rendering would fail the walk above


def test_optimize_help_lists_the_registered_passes_and_recipes():
    from mconv.passes.base import PASSES
    from mconv.passes.pipeline import recipe_names

    text = _help("optimize")
    assert "Passes (--passes):" in text and "Recipes (--recipe):" in text
    for name in [*PASSES, *recipe_names()]:
        assert re.search(rf"^\s+{re.escape(name)}\s", text, re.M), f"{name} not listed:\n{text}"


def test_usage_lines_name_arguments_plainly():
    assert "Usage: mconv import [OPTIONS] FILE..." in _help("import")
    assert "Usage: mconv verify [OPTIONS] REF CANDIDATE" in _help("verify")


def test_the_command_line_starts_without_any_target_runtime():
    """Building the commands reads every target's export flags from its ``options.py`` alone:
    no target package, ONNX Runtime, onnx, the executor or scipy is imported for it (they cost
    about 2 s of a streamed ``optimize``'s start-up before), and the options class the flags
    came from is the one the target package uses once it is imported."""
    import subprocess
    import sys

    code = (
        "import sys, mconv.cli.app\n"
        "heavy = [m for m in ('onnxruntime', 'onnx', 'onnx_ir', 'scipy', 'mconv.targets.cpu',"
        " 'mconv.targets.reference', 'mconv.targets.metal', 'mconv.targets.webgpu') if m in sys.modules]\n"
        "print(heavy)\n"
        "from mconv.targets import options_class\n"
        "before = {n: options_class(n) for n in ('cpu', 'xla', 'metal', 'webgpu', 'weights', 'reference')}\n"
        "import mconv.targets.cpu, mconv.targets.xla, mconv.targets.weights, mconv.targets.reference\n"
        "from mconv.targets.cpu.options import Options as C\n"
        "print(before['cpu'] is C, before['xla'] is mconv.targets.xla.Options,"
        " before['weights'] is mconv.targets.weights.Options,"
        " before['reference'] is mconv.targets.reference.Options)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "True True True True"]
