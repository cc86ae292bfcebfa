"""The entry point's abort path: typer raises its own Abort (on an EOFError, say); main turns
it into one line and exit 1, not an AttributeError from a name the vendored click lacks."""

from __future__ import annotations

import mconv.cli.app as cli_app
import pytest
import typer


def test_an_abort_is_one_line_and_exit_1(monkeypatch, capsys):
    def aborting(**kwargs):
        raise typer.Abort()

    monkeypatch.setattr(cli_app, "app", aborting)
    with pytest.raises(SystemExit) as exc:
        cli_app.main()
    assert exc.value.code == 1
    assert capsys.readouterr().err == "aborted\n"
