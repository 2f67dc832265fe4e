"""Model registry and experiments: the part of the knowledge base that says which model serves.

Who calls it: training jobs (log_pytorch_model), the Executor (promote / set_alias), inference
replicas and the gateway (get_alias_version, load_model), the Checker and the UI
(promotion_history). Every function here is blocking (HTTP to MLflow, torch deserialisation):
async callers wrap them in `asyncio.to_thread`.

Layout (see docs/tracking.md): one MLflow experiment per workflow; one registered model per served
model; aliases `challenger` (newly trained, under evaluation) and `champion` (serving). Every alias move
is recorded as a tag on the version that received the alias, `scanflow.promotion.<alias>.<ms>` =
JSON {alias, version, previous_version, actor, reason, metrics, ts}; the history is the union of those
tags, so it survives in MLflow itself and needs no second store.

The tracking URI is MLflow's usual process-wide one (MLFLOW_TRACKING_URI or mlflow.set_tracking_uri);
`ensure_tracking()` in scanflow/tracking/server.py finds it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# MLflow 3's UI opens an experiment without this tag on its GenAI "Overview / Traces" page; the value for
# classic model training is ExperimentKind.CUSTOM_MODEL_DEVELOPMENT in MLflow's own front end (3.17).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_ML_KIND = "custom_model_development"
log = logging.getLogger(__name__)

PROMOTION_TAG_PREFIX = "scanflow.promotion."
CHAMPION = "champion"
CHALLENGER = "challenger"


class RegistryError(RuntimeError):
    """A registry operation cannot be done as asked (unknown alias, model or version)."""


@dataclass(frozen=True)
class LoggedModel:
    """What a training job gets back: where the model lives and which registered version it became."""

    run_id: str
    model_uri: str
    name: str
    version: str | None


def _client() -> Any:
    from mlflow import MlflowClient

    return MlflowClient()


def ensure_experiment(name: str, *, tags: Mapping[str, str] | None = None, client: Any = None) -> str:
    """The id of the experiment `name` (one per workflow), created on first use. Race-safe.

    Every experiment is tagged as classic model development (`mlflow.experimentKind`), an existing one
    too when it lacks the tag: without it MLflow 3's UI opens it on the GenAI traces page, where
    none of Scanflow's runs show. A kind someone set by hand is kept. `client`: an MlflowClient for
    another tracking URI (default: the process-wide one)."""
    from mlflow.exceptions import MlflowException


    client = client or _client()
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        if EXPERIMENT_KIND_TAG not in (exp.tags or {}):
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, CLASSIC_ML_KIND)
        return str(exp.experiment_id)
    try:
        return str(client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: CLASSIC_ML_KIND, **dict(tags or {})}))
    except MlflowException:
        # another process created it between our read and our create
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def log_pytorch_model(
    model: Any,
    name: str,
    input_example: np.ndarray,
    *,
    experiment: str | None = None,
    registered_model_name: str | None = None,
    run_id: str | None = None,
    metrics: Mapping[str, float] | None = None,
    params: Mapping[str, Any] | None = None,
    register: bool = True,
    pip_requirements: list[str] | None = None,
) -> LoggedModel:
    """Log a torch module (pickle format) to a run and register it; return run, URI and version.

    `input_example` needs >= 2 rows (a one-row example would freeze the batch size in pt2 exports; we
    use pickle anyway, which loads ~2.5x faster and supports `.eval()`: measured here, docs/tracking.md).
    A new run is opened in `experiment` unless `run_id` continues an existing one. `name` is the logged
    model's name; it is registered as `registered_model_name` (default: `name`).
    `pip_requirements` defaults to this torch version: MLflow's own inference of requirements re-imports
    the model in a subprocess and costs ~14 s per call here, against < 1 s for the whole call with a list.
    """
    import mlflow
    import mlflow.pytorch
    import torch

    if pip_requirements is None:
        pip_requirements = [f"torch=={torch.__version__.split('+')[0]}"]
    example = np.asarray(input_example, dtype=np.float32)
    if example.ndim != 2 or example.shape[0] < 2:
        raise ValueError(f"input_example must be a 2-D array with >= 2 rows, got shape {example.shape}")
    exp_id = ensure_experiment(experiment) if experiment else None
    reg_name = registered_model_name or name
    with mlflow.start_run(run_id=run_id, experiment_id=exp_id if run_id is None else None) as run:
        if params:
            mlflow.log_params(dict(params))
        if metrics:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        info = mlflow.pytorch.log_model(
            model,
            name=name,
            input_example=example,
            serialization_format="pickle",
            pip_requirements=pip_requirements,
            registered_model_name=reg_name if register else None,
        )
    version = str(info.registered_model_version) if register and info.registered_model_version else None
    return LoggedModel(run_id=run.info.run_id, model_uri=info.model_uri, name=reg_name, version=version)


def register_model(model_uri: str, name: str) -> str:
    """Register `model_uri` (runs:/..., models:/m-...) under `name`; return the new version."""
    import mlflow

    mv = mlflow.register_model(model_uri, name)
    return str(mv.version)


def get_alias_version(name: str, alias: str) -> str | None:
    """The version behind `name@alias`, or None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return str(_client().get_model_version_by_alias(name, alias).version)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def _clean_metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in (metrics or {}).items():
        f = float(v)
        out[str(k)] = f if math.isfinite(f) else float("nan")
    return out


def promotion_tag(alias: str, ts: float) -> str:
    """Tag key of one alias move; millisecond time keeps keys unique and sortable."""
    return f"{PROMOTION_TAG_PREFIX}{alias}.{int(ts * 1000):013d}"


def set_alias(
    name: str,
    alias: str,
    version: str | int,
    *,
    actor: str,
    reason: str,
    metrics: Mapping[str, float] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Point `name@alias` at `version` and record who, why, with which metrics, when, and what before.

    Idempotent: if the alias already points at `version`, nothing moves and no record is added (the
    Executor may retry an action). Returns the promotion record (with `moved: False` when a no-op).
    Moving `champion` records the version's file digest first (scanflow.tracking.model_digest: replicas
    check it at load). Moving `champion` onto the version `challenger` names clears `challenger` (deleted, a retry too):
    an alias left on the champion would say a version is still under evaluation. The version's
    promotion tags keep that it was the challenger.
    """
    from mlflow.exceptions import MlflowException

    client = _client()
    version = str(version)
    try:
        client.get_model_version(name, version)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise RegistryError(f"model {name!r} has no version {version!r}: cannot set {alias!r}") from None
        raise
    previous = get_alias_version(name, alias)
    ts = time.time() if now is None else now
    record: dict[str, Any] = {
        "alias": alias,
        "version": version,
        "previous_version": previous,
        "actor": actor,
        "reason": reason,
        "metrics": _clean_metrics(metrics),
        "ts": ts,
    }
    moved = previous != version
    if alias == CHAMPION:
        # what replicas will load, fixed before they are told: they refuse files that differ later
        from scanflow.tracking.model_digest import record_digest

        record_digest(name, version)
    if moved:
        # history first: if we die between the two calls, the history shows an intent the alias may not
        # reflect yet; a retry then moves the alias (and records once more) rather than losing the record.
        client.set_model_version_tag(name, version, promotion_tag(alias, ts), json.dumps(record))
        client.set_registered_model_alias(name, alias, version)
        log.info("%s@%s: %s -> %s by %s (%s)", name, alias, previous, version, actor, reason)
    if alias == CHAMPION and get_alias_version(name, CHALLENGER) == version:
        client.delete_registered_model_alias(name, CHALLENGER)
        log.info("%s@%s cleared: version %s is the champion now", name, CHALLENGER, version)
    return {**record, "moved": moved}


def promote(
    name: str,
    from_alias: str = CHALLENGER,
    to_alias: str = CHAMPION,
    *,
    actor: str,
    reason: str,
    metrics: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Move `to_alias` onto the version behind `from_alias` (challenger -> champion by default)."""
    version = get_alias_version(name, from_alias)
    if version is None:
        raise RegistryError(f"model {name!r} has no alias {from_alias!r} to promote")
    return set_alias(name, to_alias, version, actor=actor, reason=reason, metrics=metrics)


def promotion_history(name: str, alias: str | None = None) -> list[dict[str, Any]]:
    """All recorded alias moves of model `name` (optionally one alias), oldest first."""
    client = _client()
    records: list[dict[str, Any]] = []
    for mv in client.search_model_versions(f"name = '{_quote(name)}'"):
        for key, value in (mv.tags or {}).items():
            if not key.startswith(PROMOTION_TAG_PREFIX):
                continue
            try:
                rec = json.loads(value)
            except ValueError:
                continue
            if alias is None or rec.get("alias") == alias:
                records.append(rec)
    records.sort(key=lambda r: (float(r.get("ts", 0)), str(r.get("alias"))))
    return records


def _quote(name: str) -> str:
    return name.replace("\\", "\\\\").replace("'", "\\'")


class TorchPredictor:
    """A loaded torch module as a plain callable: float32 (n, features) array in, numpy array out.

    Why not mlflow.pyfunc: its schema enforcement and pandas round-trip cost more than the model on
    digits (measured: ~2.5x slower per call at batch 1); replicas call this on every micro-batch. `module` is the nn.Module
    for callers that want torch directly (e.g. to set threads or move devices).
    """

    def __init__(self, module: Any, uri: str) -> None:
        self.module = module
        self.uri = uri
        module.eval()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import torch

        arr = np.ascontiguousarray(x, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr.reshape(1, -1)
        with torch.inference_mode():
            out = self.module(torch.from_numpy(arr))
        return out.numpy()

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class indices (argmax of the outputs) for classifiers."""
        return np.asarray(self(x)).argmax(axis=1)


def load_model(uri: str) -> TorchPredictor:
    """Load a logged torch model (`models:/name@champion`, `models:/name/3`, `runs:/...`) for predict."""
    import mlflow.pytorch

    module = mlflow.pytorch.load_model(uri, map_location="cpu")
    return TorchPredictor(module, uri)
