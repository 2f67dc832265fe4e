"""A plan's training run, once, and the rows it trains on: the Executor's `retrain` without its glue.

A retried `retrain` (after a crash, or a failed attempt) must not train and register a second model for
the same plan, so the run is looked up in MLflow before the job runs (`train_once`). Traffic replays
inputs, so the labelled critical rows are deduplicated first (`distinct_rows`). Pure or MLflow-only:
nothing here reads the workflow or the agent's state, so tests call it directly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from scanflow.agent import PermanentError

HOLDOUT_FRACTION = 0.3  # share of a plan's labelled rows held out for the promotion gate (`holdout_fraction`)
# A retried `retrain` must not train (and register) a second model for the same plan. The platform
# opens the training job's MLflow run inside run_job, so the Executor can tag the run only once the job
# is over; a crash between the job's end and the tag is covered by the plan's own training-data path,
# which the job runner logs as the param `extra_points_path` when the job starts. On retry a FINISHED
# run found either way that registered a version is reused; an unfinished one (cut with the Executor)
# is trained again.
PLAN_TAG = "scanflow.plan"
KEY_TAG = "scanflow.idempotency_key"
PATH_PARAM = "extra_points_path"
# The plan's holdout of labelled drifted rows (never trained on): the promotion gate's drifted part,
# also passed to the training job, which may log its score on it.
VALIDATION_PARAM = "validation_points_path"
# The recent unlabelled inputs since the drift, for jobs that adapt to them (e.g. re-standardising).
DRIFT_PARAM = "drift_inputs_path"


@dataclasses.dataclass(frozen=True)
class PlanRun:
    """What the lookup saw of one training run of a plan."""

    run_id: str
    status: str  # MLflow run status: RUNNING, FINISHED, FAILED, KILLED, SCHEDULED
    start_time: int  # ms since the epoch
    version: str | None  # the model version this run registered, if any


def reusable_run(runs: list[PlanRun]) -> PlanRun | None:
    """Pure: the newest FINISHED run of the plan that registered a version (None: train, again or first).
    A run still RUNNING was cut with a crashed Executor (its job was killed at restart): not reusable."""
    done = [r for r in runs if r.status == "FINISHED" and r.version is not None]
    return max(done, key=lambda r: r.start_time) if done else None


def _filter_literal(value: str) -> str | None:
    """`value` quoted for an MLflow filter string, or None when it cannot be (a quote in it)."""
    return None if "'" in value or "\\" in value else f"'{value}'"


def plan_runs(client: Any, model_name: str, plan_key: str, train_path: str) -> list[PlanRun]:
    """Every training run of this plan (tagged with `plan_key`, or logged with `train_path` as its
    extra points), with the version of `model_name` it registered. Blocking (MLflow)."""
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    if not exp_ids:
        return []
    found: dict[str, Any] = {}
    for field, value in ((f"tags.`{PLAN_TAG}`", plan_key), (f"params.{PATH_PARAM}", train_path)):
        lit = _filter_literal(value)
        if lit is not None:
            for run in client.search_runs(exp_ids, f"{field} = {lit}", max_results=100):
                found[run.info.run_id] = run
    out = []
    for run_id, run in found.items():
        versions = [v for v in client.search_model_versions(f"run_id = '{run_id}'") if v.name == model_name]
        version = str(max(int(v.version) for v in versions)) if versions else None
        out.append(PlanRun(run_id, str(run.info.status), int(run.info.start_time or 0), version))
    return out


def train_once(plat: Any, job: Any, params: dict[str, Any], plan_key: str, idem_key: str | None,
               tracking_uri: str, model_name: str) -> tuple[str, str | None, dict[str, Any], bool]:
    """Run the training job for a plan unless a finished run of it already registered a model version.

    Returns (version, run_id, outputs, reused). `params[PATH_PARAM]` is the plan's training data.
    Raises PermanentError when the job fails. Blocking (MLflow, the job).
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    earlier = reusable_run(plan_runs(client, model_name, plan_key, str(params[PATH_PARAM])))
    if earlier is not None and earlier.version is not None:
        run = client.get_run(earlier.run_id)
        return earlier.version, earlier.run_id, dict(run.data.metrics), True
    result = plat.run_job(job, params)
    if result.run_id:
        client.set_tag(result.run_id, PLAN_TAG, plan_key)
        if idem_key:
            client.set_tag(result.run_id, KEY_TAG, idem_key)
    if not result.succeeded:
        raise PermanentError(f"training job failed: {result.message} (MLflow run {result.run_id})")
    version = result.outputs.get("version")
    if version is None:
        raise PermanentError(f"training job returned {sorted(result.outputs)} without 'version' (MLflow run "
                             f"{result.run_id}): it must register the model and return its version")
    return str(version), result.run_id, dict(result.outputs), False


def distinct_rows(x: np.ndarray, tolerance: float = 0.0) -> np.ndarray:
    """Pure: indices of the first row of each group of near-identical rows (RMS difference <= tolerance;
    0: exact duplicates only), in order.

    Why: traffic may replay inputs, so the critical points can hold several copies of one input.
    Copies overweight it in training, and a copy in the holdout of an input in training makes the
    holdout measure memory, not the drift. The tolerance is the workflow's (Executor setting
    `duplicate_tolerance`): what counts as "the same input seen again" depends on its data.
    Greedy, O(n^2 * f) when tolerance > 0: ~0.1 s for 1,000 rows of 64."""
    if len(x) == 0:
        return np.zeros(0, dtype=np.int64)
    if tolerance <= 0:
        _, first = np.unique(x, axis=0, return_index=True)
        return np.sort(first).astype(np.int64)
    keep: list[int] = []
    for i in range(len(x)):
        if not keep or float(np.sqrt(((x[keep] - x[i]) ** 2).mean(axis=1)).min()) > tolerance:
            keep.append(i)
    return np.asarray(keep, dtype=np.int64)
