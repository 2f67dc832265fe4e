"""Bootstrap a workflow's knowledge base: a first champion model and the drift detector fitted for it.

Run once per stack home, before the agents start, as its own process
(`python -m scanflow.embedded.bootstrap --workflow W.yaml [--quick]`, MLFLOW_TRACKING_URI set), so
the caller never imports torch. Idempotent: a champion that exists and a detector already logged for it
are kept. The champion comes from the workflow's first job (its training job, called with
`alias="champion"`); the detector is fitted on the reference data that job logged in its run
(scanflow.tracking.reference) and logged for that model version (scanflow.drift.lifecycle), where
the Checker finds it. Nothing here knows a dataset: a workflow is learned from its declaration and MLflow.
Who calls: scanflow.embedded.stack.EmbeddedStack; people, by hand.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from scanflow.agentkit.detectors import NoTrainingJob, detector_options, model_name_of
from scanflow.spec import Workflow
from scanflow.tracking import monitoring

log = logging.getLogger(__name__)

class BootstrapError(RuntimeError):
    """The workflow cannot be bootstrapped; the message says what its declaration or job lacks."""


def bootstrap(workflow: Workflow, *, quick: bool = False) -> dict[str, Any]:
    """First champion (the workflow's first job, alias champion) and its drift detector, unless present."""
    from scanflow.drift.lifecycle import ensure_detector
    from scanflow.platform.jobrunner import load_entrypoint
    from scanflow.tracking.registry import CHAMPION, get_alias_version, set_alias

    out: dict[str, Any] = {}
    model_name = model_name_of(workflow)
    job = workflow.jobs[0]
    champion = get_alias_version(model_name, CHAMPION)
    if champion is None:
        if not isinstance(job.entrypoint, str):
            raise BootstrapError(f"job {job.name!r}: bootstrap needs a Python entrypoint 'module:function'")
        fn = load_entrypoint(job.entrypoint)
        result = fn(**{**job.params, "alias": CHAMPION})
        version = result.get("version") if isinstance(result, dict) else None
        champion = get_alias_version(model_name, CHAMPION)
        if champion is None and version is not None:
            set_alias(model_name, CHAMPION, str(version), actor="bootstrap", reason="first model")
            champion = str(version)
        if champion is None:
            raise BootstrapError(f"job {job.name!r} returned {result!r} and registered no version of "
                                 f"{model_name!r}: it must register the model and return {{'version': ...}}")
        out["trained"] = result
        # the job opened its run unnamed: the UI shows it as the bootstrap's training (failures only logged)
        monitoring.safe(None, "name the bootstrap run", monitoring.name_bootstrap_run, model_name, champion)
    out["champion"] = champion
    out["detector_uri"] = ensure_detector(workflow.name, model_name, champion, detector_options(workflow, quick))
    return out


def main(argv: list[str] | None = None) -> int:
    from scanflow.spec import SpecError, load_workflow
    from scanflow.tracking.reference import ReferenceError

    parser = argparse.ArgumentParser(prog="python -m scanflow.embedded.bootstrap")
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = bootstrap(load_workflow(args.workflow), quick=args.quick)
    except (SpecError, BootstrapError, NoTrainingJob, ReferenceError) as exc:
        print(f"bootstrap: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
