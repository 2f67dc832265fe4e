"""`scanflow demo --quick --json` end to end: real MLflow, agents, replicas. Slow (a few minutes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def missed_record(sc: dict) -> dict:
    """What says why a scenario missed its bar, the sub-verdicts (`*_passed`) first: CI shows the start
    of an assertion message, and a scenario's figures run long."""
    figures = sc.get("figures") or {}
    verdicts = {k: v for k, v in figures.items() if k.endswith("_passed") or k in ("failed", "error")}
    return {"error": sc.get("error"), "verdicts": verdicts, "decisions": sc.get("decisions"), "figures": figures}


def test_demo_quick_json_last_line(tmp_path: Path, scanflow_exe: Path) -> None:
    proc = subprocess.run([str(scanflow_exe), "demo", "--quick", "--json", "--home", str(tmp_path)],
                          capture_output=True, text=True, timeout=880, check=False)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    doc = json.loads(lines[-1])
    assert set(doc["scenarios"]) == {"s1", "s2", "s3", "s4"}, doc
    for key, sc in doc["scenarios"].items():
        assert sc["bar"], key  # every scenario states its bar
        assert isinstance(sc["passed"], bool) and isinstance(sc["figures"], dict), key
    # the exit code is the verdict of the bars, and every bar is met: a demo that runs but misses them is
    # the product failing a newcomer's first run
    assert doc["ok"] == all(sc["passed"] for sc in doc["scenarios"].values())
    assert proc.returncode == (0 if doc["ok"] else 1), proc.stderr[-2000:]
    missed = {k: missed_record(sc) for k, sc in doc["scenarios"].items() if not sc["passed"]}
    print(json.dumps(missed, indent=1, default=str))  # the whole record (an assertion message is cut short)
    assert doc["ok"] and not missed, missed
    assert "scenario" in proc.stdout and "bar" in proc.stdout  # the table went to stdout
    # its first words say where the log is, which exists (output to a file shows no spinner)
    log_line = proc.stderr.splitlines()[0]
    assert log_line.startswith("scanflow demo: log "), proc.stderr[:500]
    assert (Path(doc["home"]) / "demo.log").is_file()
    if "mlflow_run_id" in doc:  # the run and its plots are on disk for `scanflow mlflow up`
        assert any(Path(doc["home"]).rglob("s2_planner_vs_hpa.png"))
