"""The two notebooks: as committed (outputs kept, public API only), and run again top to bottom.

`test_committed_*` read the notebooks as they are in the repository (fast, no kernel): each holds the
outputs of a run, a plot among them, and uses Scanflow only through the `scanflow` CLI and the
documented APIs. `test_0*` run each in a fresh kernel (a whole stack each: `scanflow up --quick`,
traffic, a retrain and promotion) and check in the outputs that the story happened: the drift decision
with its reason, the retrain, the promotion, the plot, the stack stopped and its MLflow store kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ("01_data_scientist.ipynb", "02_operator.ipynb")

# Each notebook bounds its own waits: the stack's start <= 900 s (the cell gives up after that), the
# traffic <= 320 s (data scientist) or 350 s (operator) of sending, the reads and `scanflow down` well
# under a minute each. Measured on 2 busy cores (load 7): 190 s and 230 s. The cell limit covers the
# longest cell (the start) with room; the test's limit covers every cell's worst case added up.
CELL_TIMEOUT_S = 1200
TEST_TIMEOUT_S = 2400


def outputs(nb) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def images(nb) -> int:  # type: ignore[no-untyped-def]
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def source(nb) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def assert_clean(nb, workdir: str) -> None:  # type: ignore[no-untyped-def]
    """One plot at least, no errors, none of the clutter users saw (progress bars, the tqdm widget
    notice, MLflow's pickle warning), no absolute paths of this machine, and the token never shown."""
    text = outputs(nb)
    assert images(nb) >= 1, "no plot"
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    for clutter in ("Downloading artifacts", "IProgress not found", "Pickle or CloudPickle", "Traceback"):
        assert clutter not in text, clutter
    assert str(NOTEBOOKS.parent) not in text, "an absolute path in the outputs"
    token = NOTEBOOKS / workdir / ".scanflow" / "shop" / "token"
    if token.exists():
        assert token.read_text().strip() not in text, "the stack's token in the outputs"


@pytest.mark.parametrize("name", NAMES)
def test_committed_with_outputs_and_public_api_only(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("outputs") for c in code[-3:]), f"{name} is committed without its outputs"
    assert images(nb) >= 1, f"{name} is committed without its plot"
    src = source(nb)
    for internal in ("scanflow.demo", "from workflows", "import workflows", "sys.path"):
        assert internal not in src, f"{name} uses {internal!r}"
    assert not re.search(r"^\s*assert ", src, re.MULTILINE), f"{name} checks with asserts (the tests assert)"
    assert not re.search(r"(from|import) scanflow\.", src), f"{name} imports Scanflow internals"
    assert "/tmp/" not in outputs(nb) and "/work/" not in outputs(nb), f"{name}: absolute paths in its outputs"
    assert 'scanflow("down")' in code[-1].source, f"{name} does not stop its stack in its last cell"
    assert "rmtree" not in code[-1].source, f"{name} removes its MLflow store at the end"


@pytest.mark.slow
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_01_data_scientist(run_notebook) -> None:  # type: ignore[no-untyped-def]
    nb = run_notebook("01_data_scientist.ipynb", timeout_s=CELL_TIMEOUT_S)
    text = outputs(nb)
    summary = json.loads(next(line for line in text.splitlines() if '"new_version_after_s"' in line))
    assert summary["failed"] == 0 and summary["new_version_after_s"] is not None, summary
    assert "2" in summary["versions"], summary  # the promoted version answered the drifted rows
    assert re.search(r"retrain: drift CUSUM [\d.]+ >= [\d.]+", text), "no retrain plan with its reason"
    assert "execute-retrain fired" in text
    for action in ("retrain", "evaluate_and_promote", "swap_model"):
        assert re.search(rf"\b{action}\s+ok\b", text), f"{action} did not succeed"
    promoted = re.search(r"champion: version (\d+) \(was (\d+)\), moved by the executor: promote: drifted \+([\d.]+)", text)
    assert promoted and promoted[1] == "2" and promoted[2] == "1" and float(promoted[3]) > 0, "no promotion"
    assert re.search(r"/#/models/shop/versions/2\b", text) and "/#/experiments/" in text, "no MLflow links"
    assert "stopped: nothing of the stack is left" in text and "up exited with 0" in text
    assert (NOTEBOOKS / "scientist/.scanflow/shop/mlflow/mlflow.db").exists(), "the MLflow store was removed"
    assert not (NOTEBOOKS / "scientist/.scanflow/shop/stack.json").exists(), "the stack still runs"
    assert_clean(nb, "scientist")


@pytest.mark.slow
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_02_operator(run_notebook) -> None:  # type: ignore[no-untyped-def]
    nb = run_notebook("02_operator.ipynb", timeout_s=CELL_TIMEOUT_S)
    text = outputs(nb)
    fired = {" ".join(m[1].split()): int(m[2])  # the table's rows: agent, strategy, fired, skipped, error
             for m in re.finditer(r"^(\w+ +[\w-]+) +(\d+) +\d+ +\d+$", text, re.MULTILINE)}
    assert fired.get("tracker check-drift", 0) > 0, f"the Tracker never asked for a drift check: {fired}"
    assert fired.get("executor execute-retrain", 0) >= 1, f"no retrain executed: {fired}"
    # a quarter core per replica cannot serve the load step: the Planner must have resized the service
    resized = fired.get("executor execute-resources", 0) + fired.get("executor execute-scale", 0)
    assert resized >= 1, f"the load step resized nothing: {fired}"
    assert re.search(r"execute-retrain: retrain: drift CUSUM [\d.]+ >= [\d.]+", text), "no retrain with its reason"
    assert re.search(r"swap_model\s+ok", text)
    n = re.search(r"(\d+) autoscale decisions over the last", text)
    assert n and int(n[1]) >= 20, "too few autoscale decisions read"
    assert re.search(r"x (hold|grow|shrink|up|down) +band \S+: e\.g\. \S", text), "no autoscale reason shown"
    assert "GET executor/services" in text and "scanflow_agent_decisions_total" in text, "the REST reads printed nothing"
    assert "champion: version 2" in text and "/#/experiments/" in text
    assert "stopped: nothing of the stack is left" in text and "up exited with 0" in text
    assert (NOTEBOOKS / "operator/.scanflow/shop/mlflow/mlflow.db").exists(), "the MLflow store was removed"
    assert_clean(nb, "operator")
