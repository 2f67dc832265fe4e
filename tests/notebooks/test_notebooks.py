"""The three tutorials run top to bottom in a fresh kernel (their own asserts check the outcomes)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def outputs(nb) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def images(nb) -> int:  # type: ignore[no-untyped-def]
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def assert_tells_its_story(nb) -> None:  # type: ignore[no-untyped-def]
    """A figure, a link to the MLflow page the notebook produced, and none of the clutter users saw
    (artifact progress bars, the tqdm widget warning, MLflow's pickle warning)."""
    text = outputs(nb)
    assert images(nb) >= 1, "no figure"
    assert "/#/experiments/" in text, "no link to the MLflow run"
    for clutter in ("Downloading artifacts", "IProgress not found", "Pickle or CloudPickle"):
        assert clutter not in text, clutter


def test_01_data_scientist(run_notebook) -> None:  # type: ignore[no-untyped-def]
    nb = run_notebook("01_data_scientist.ipynb")
    text = outputs(nb)
    assert "refused:" in text and "champion version" in text
    assert "#/models/digits/versions/" in text
    assert "\nagents: ... (" in text  # the YAML is cut at the agents, never mid-field
    assert "MLflow is up at" in text and "fitting 5 MLPs" in text  # the slow cells print their progress
    assert_tells_its_story(nb)


@pytest.mark.timeout(900)  # the stack's start (MLflow, bootstrap training, four agents) dominates
def test_02_data_engineer(run_notebook) -> None:  # type: ignore[no-untyped-def]
    nb = run_notebook("02_data_engineer.ipynb", timeout_s=800)
    text = outputs(nb)
    assert "0 failed" in text and "tracker" in text
    assert "drift check:" in text and "fired" in text  # the agents decided something, not only 'skipped'
    assert "bootstrap: done" in text  # the slow start-up cell prints its progress
    assert_tells_its_story(nb)


def test_03_operations(run_notebook) -> None:  # type: ignore[no-untyped-def]
    nb = run_notebook("03_operations.ipynb")
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # the drift and the controller plots rendered inline
    assert_tells_its_story(nb)
