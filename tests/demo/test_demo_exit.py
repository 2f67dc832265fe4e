"""`scanflow demo` gates on its verdicts: one scenario that misses its bar makes the command exit 1, and
the JSON line says which (no stack: the knowledge base, the scenarios and the MLflow logging are stood in)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scanflow.cli import app
from scanflow.demo import runner
from scanflow.demo.report import ScenarioResult


def _scenario(key: str, passed: bool) -> Any:
    def run(ctx: Any) -> ScenarioResult:
        return ScenarioResult(key, key.upper(), "bar", passed=passed, figures={"x": 1.0})

    return run


@pytest.fixture
def stood_in(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    verdicts = {"s1": True, "s2": True, "s3": True, "s4": True}

    @contextmanager
    def kb(home: Path, quick: bool, say: Any) -> Iterator[tuple[Any, str, str | None]]:
        yield None, "file:///nonexistent", None

    monkeypatch.setattr(runner, "knowledge_base", kb)
    monkeypatch.setattr(runner, "scenarios", lambda: [(k, k.upper(), _scenario(k, v)) for k, v in verdicts.items()])
    monkeypatch.setattr(runner, "log_to_mlflow", lambda uri, results, quick: "run-id")
    return verdicts


def test_a_missed_bar_makes_the_demo_exit_1(stood_in: dict[str, bool], tmp_path: Path) -> None:
    stood_in["s3"] = False
    result = CliRunner().invoke(app, ["demo", "--json", "--home", str(tmp_path)])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["ok"] is False and doc["scenarios"]["s3"]["passed"] is False and doc["scenarios"]["s1"]["passed"]


def test_every_bar_met_exits_0(stood_in: dict[str, bool], tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--json", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["ok"] is True
