"""The Checker's detector settings and the model they watch, read from a workflow's declaration.

Here, not in the single-machine bootstrap, because the Checker reads them on every platform, and the
bootstrap (which fits the first champion's detector) must fit it with the same options.
"""

from __future__ import annotations

from typing import Any

from scanflow.spec import Workflow

QUICK_DETECTOR_EPOCHS = 15  # --quick: ~2x faster fits with the same verdicts on the shipped workflows


class NoTrainingJob(RuntimeError):
    """The workflow declares no job, so no model to watch."""


def model_name_of(workflow: Workflow) -> str:
    """The registered model the workflow's training job writes and its services serve."""
    if not workflow.jobs:
        raise NoTrainingJob(f"workflow {workflow.name!r} declares no job: the first job must train its model")
    return str(workflow.jobs[0].params.get("model_name", workflow.name))


def detector_options(workflow: Workflow, quick: bool) -> Any:
    """The Checker's detector settings (`fpr`, `epochs`, `copy_tolerance`) from its AgentSpec; fewer epochs
    under --quick."""
    from scanflow.drift.lifecycle import DetectorOptions

    checker = next((a for a in workflow.agents if a.role == "checker"), None)
    settings = checker.settings if checker else {}
    epochs = settings.get("epochs")
    tolerance = settings.get("copy_tolerance")
    return DetectorOptions(fpr=float(settings.get("fpr", 0.05)),
                           epochs=int(epochs) if epochs is not None else (QUICK_DETECTOR_EPOCHS if quick else None),
                           copy_tolerance=None if tolerance is None else float(tolerance))
