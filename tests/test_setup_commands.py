"""The README's set-up commands are what CI runs: `.ci/run` calls the README's test command and
nothing else, and that command is a script that installs what the tests need before running them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _sh_block_after(text: str, marker: str) -> str:
    start = text.index(marker)
    m = re.search(r"```sh\n(.*?)\n```", text[start:], re.S)
    assert m, f"no sh block after {marker!r}"
    return m.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = _sh_block_after(readme, "Install what the tests need")
    assert command == "bash scripts/test"
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [
        ln
        for ln in ci
        if ln and not ln.startswith("#") and not ln.startswith("set ") and not ln.startswith("cd ")
    ]
    assert steps == [f"exec {command}"], steps


def test_the_test_script_installs_then_runs_the_suite():
    script = (ROOT / "scripts" / "test").read_text()
    install = script.index('python3 -m pip install -q -e ".[test]"')
    apt = script.index("apt-get install")
    run = script.index("python3 -m pytest")
    assert apt < install < run
    for package in ("mesa-vulkan-drivers", "chromium", "nodejs", "espeak-ng"):
        assert package in script
