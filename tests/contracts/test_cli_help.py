"""Every `scanflow ... --help` answers, and flags show as flags (typer's rich help printed `--help <bool>`,
as if the flag took a value)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from scanflow.cli import app


def _command_paths() -> list[list[str]]:
    root = typer.main.get_command(app)
    paths: list[list[str]] = [[]]

    def walk(cmd: object, prefix: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            paths.append([*prefix, name])
            walk(sub, [*prefix, name])

    walk(root, [])
    return paths


PATHS = _command_paths()


def test_the_cli_has_its_commands() -> None:
    assert {"up", "down", "status", "demo", "validate", "init"} <= {p[0] for p in PATHS if p}


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "scanflow")
def test_help_answers_without_value_placeholders_on_flags(path: list[str]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert "<bool>" not in result.output
