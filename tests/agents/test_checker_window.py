"""The Checker validates the Tracker's window against its drift detector's `min_window` (scanflow/standard/checker.py
`configured_window`, `window_check`, `check_drift`): a real fitted detector and a real MLflow server for
the monitoring run; the prediction log's reads are stubbed (rows handed over as the Tracker's log would)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from scanflow.agent import PermanentError
from scanflow.drift import TabularAutoencoderDriftDetector
from scanflow.spec import Workflow
from tests.agents.agents_support import digits_workflow
from tests.agents.test_monitoring_agents import FakeContext

pytestmark = pytest.mark.timeout(300)


def _rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """4 normal columns and a category code that is 1 in ~2 % of rows: its sparse one-hot column makes
    the detector's derived min_window larger than 2 (a mean of a few rare events is not yet normal)."""
    return np.column_stack([rng.normal(size=(n, 4)), rng.random(n) < 0.02]).astype(np.float32)


@pytest.fixture(scope="module")
def detector() -> TabularAutoencoderDriftDetector:
    rng = np.random.default_rng(0)
    det = TabularAutoencoderDriftDetector(n_features=5, categorical=(4,), epochs=5, seed=0)
    det.fit(_rows(400, rng), _rows(400, rng))
    assert det.min_window is not None and det.min_window >= 3
    return det


def _workflow(window: int, min_rows: int | None = None) -> Workflow:
    """The digits example (tests' default workflow) under a name of its own, its Tracker announcing
    `window` rows per check (quick or not) and passing `min_rows` to check_drift when given."""
    wf = digits_workflow()
    agents = []
    for a in wf.agents:
        if a.role == "tracker":
            strategies = [s.model_copy(update={"actions": [
                act.model_copy(update={"args": {**act.args, **({"min_rows": min_rows} if min_rows else {})}})
                for act in s.actions]}) for s in a.strategies]
            a = a.model_copy(update={"settings": {**a.settings, "window": window, "quick_window": window},
                                     "strategies": strategies})
        agents.append(a)
    return wf.model_copy(update={"name": f"win-{uuid.uuid4().hex[:8]}", "agents": agents})


def test_window_check_names_both_numbers() -> None:
    from scanflow.standard import checker

    assert checker.window_check(500, 20, 250)["status"] == "ok"
    bad = checker.window_check(200, 20, 250)
    assert bad["status"] == "window_too_small" and (bad["window"], bad["min_window"], bad["needed"]) == (200, 250, 250)
    assert "200" in bad["message"] and "min_window 250" in bad["message"]
    by_rows = checker.window_check(200, 300, 40)  # the check's own min_rows can be the larger one
    assert by_rows["status"] == "window_too_small" and "min_rows 300" in by_rows["message"]
    assert checker.window_check(None, 20, 250)["status"] == "ok"  # no Tracker declared: checked per call


def test_configured_window_reads_the_trackers_settings() -> None:
    from scanflow.standard import checker

    wf = digits_workflow()  # the digits example: window 500, quick_window 200, check_drift args {}
    assert checker.configured_window(wf, False) == (500, checker.MIN_ROWS)
    assert checker.configured_window(wf, True) == (200, checker.MIN_ROWS)
    assert checker.configured_window(_workflow(300, min_rows=50), False) == (300, 50)
    assert checker.configured_window(wf.model_copy(update={"agents": []}), False) == (None, checker.MIN_ROWS)


def test_a_window_below_min_window_is_reported_then_tested_when_rows_suffice(
        mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, detector: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    from scanflow.standard import checker
    from scanflow.tracking import predictions

    m = int(detector.min_window)
    wf = _workflow(m - 1)
    rng = np.random.default_rng(1)
    logged = _rows(3 * (m - 1), rng)  # the Tracker's log: what has arrived so far is read up to `arrived`
    arrived = {"rows": m - 1}

    def read_since(run_id: str, wm: int) -> Any:
        rows = logged[wm:arrived["rows"]]
        records = [SimpleNamespace(request_id=f"req-{wm + i}", service=wf.services[0].name, inputs=[r.tolist()])
                   for i, r in enumerate(rows)]
        return SimpleNamespace(records=records, watermark=arrived["rows"], inputs=lambda: rows)

    monkeypatch.setattr(checker, "_current_detector", lambda ctx: (detector, "3"))
    monkeypatch.setattr(checker, "_current_estimator", lambda ctx, version: None)
    monkeypatch.setattr(predictions, "prediction_run_id", lambda exp, name: "predictions-run")
    monkeypatch.setattr(predictions, "read_since", read_since)
    ctx: Any = FakeContext("checker", tmp_path, wf)

    # loading the detector validates the configured window: log and state (/status) say so, with both numbers
    with caplog.at_level(logging.WARNING, logger=ctx.log.name):
        checker.load_detector(ctx)
    check = ctx.state["window_check"]
    assert (check["status"], check["window"], check["min_window"], check["detector_version"]) == (
        "window_too_small", m - 1, m, "3")
    assert any(f"window of {m - 1} rows is below the detector's min_window {m}" in r.getMessage() for r in caplog.records)

    # the Tracker announces its first window: too short for the detector, so skipped, nothing emitted, rows kept
    first = asyncio.run(checker.check_drift(ctx, {}))
    assert (first["status"], first["window"], first["min_window"]) == ("window_too_small", m - 1, m)
    assert ctx.emitted == [] and ctx.state.get("watermark", 0) == 0

    # the second: the rows of both windows are tested, and the verdict carries the window check
    arrived["rows"] = 2 * (m - 1)
    second = asyncio.run(checker.check_drift(ctx, {}))
    assert second["n"] == 2 * (m - 1) and ctx.state["watermark"] == 2 * (m - 1)
    name, payload = ctx.emitted[-1]
    assert name == "drift.checked" and payload["window_check"]["status"] == "window_too_small"
    assert payload["window_check"]["min_window"] == m and payload["n"] >= m

    # a nonsensical min_rows is refused as bad input, not a crash
    with pytest.raises(PermanentError, match="min_rows"):
        asyncio.run(checker.check_drift(ctx, {"min_rows": "many"}))
    checker.end_monitoring(ctx)


def test_a_window_at_min_window_is_ok(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, detector: Any) -> None:
    from scanflow.standard import checker

    ctx: Any = FakeContext("checker", tmp_path, _workflow(int(detector.min_window)))
    assert checker._validate_window(ctx, detector, "3")["status"] == "ok"
    assert ctx.state["window_check"]["window"] == detector.min_window
