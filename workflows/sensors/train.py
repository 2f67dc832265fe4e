"""The sensors training job: fit on clean readings (+ labelled drifted readings), log, register, alias.

Who calls it: the Executor agent through `Platform.run_job` (the workflow's `train` job, entrypoint
`scanflow.examples.sensors.train:train`), the tests, and people: `python -m scanflow.examples.sensors.train`.

The MLflow run that registers the model also holds its reference data
(`scanflow.tracking.reference.log_reference`): the rows it was fitted on (clean + extra, not the
synthetic copies), the clean holdout split with its labels, and the schema (tabular, classification,
column 0 categorical). The agents learn the workflow from that and from the model's signature.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import time
from typing import Any

import numpy as np
from scanflow.examples.sensors.model import ADAPT_CHOICES, EXTRA_SHARE

log = logging.getLogger(__name__)

EXPERIMENT = "sensors"
MODEL_NAME = "sensors"


def _pip_requirements() -> list[str]:
    """The model's runtime needs, stated: MLflow's inference of them imports everything in a
    subprocess, seconds of a job that fits in about one."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in ("scikit-learn", "numpy", "skops")]


def train(
    model_name: str = MODEL_NAME,
    alias: str = "challenger",
    extra_points_path: str | None = None,
    validation_points_path: str | None = None,
    drift_inputs_path: str | None = None,
    seed: int = 0,
    experiment: str = EXPERIMENT,
    tracking_uri: str | None = None,
    *,
    max_iter: int = 100,
    learning_rate: float = 0.1,
    adapt: str = "moments",
    extra_share: float = EXTRA_SHARE,
) -> dict[str, Any]:
    """Train, evaluate, log and register a sensors model; set `alias` (the very first model: also 'champion').

    extra_points_path: .npz `x` (n, 10), `y` (n,) TRUE states of drifted readings: trained on, weighted
        and with synthetic drifted copies of the clean rows (`scanflow.examples.sensors.model.training_rows`).
    validation_points_path: same format, held out of training: its accuracy is only logged
        ("accuracy_validation_drifted").
    drift_inputs_path: .npz `x` (m, 10) of recent unlabelled drifted inputs: checked and counted
        (param "n_drift_inputs"), not fitted on: the labelled extra points already give the
        recalibration's gain and offset, class-balanced, which unlabelled rows cannot.
    Options: `max_iter`, `learning_rate` (the boosted trees), `adapt` ("moments" or "none"),
    `extra_share` (see `training_rows`). Bad values raise ValueError before any slow work.
    Returns {"version", "run_id", "accuracy_clean", "accuracy_drifted", ["accuracy_validation_drifted"],
    "aliases", "n_extra"}: accuracies on the clean holdout split and on its recalibrated copy.
    `tracking_uri` None keeps MLflow's configured URI (MLFLOW_TRACKING_URI).
    """
    from scanflow.examples.sensors.points import load_inputs, load_labelled

    if adapt not in ADAPT_CHOICES:
        raise ValueError(f"adapt must be one of {list(ADAPT_CHOICES)}, got {adapt!r}")
    if max_iter < 1 or learning_rate <= 0 or extra_share < 0:
        raise ValueError(f"need max_iter >= 1, learning_rate > 0 and extra_share >= 0, got {max_iter}, "
                         f"{learning_rate}, {extra_share}")
    if not model_name or not alias:
        raise ValueError("model_name and alias must be non-empty")
    extra = load_labelled(extra_points_path, "extra_points_path") if extra_points_path else None
    validation = load_labelled(validation_points_path, "validation_points_path") if validation_points_path else None
    drift_inputs = load_inputs(drift_inputs_path) if drift_inputs_path else None

    import mlflow
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from scanflow.examples.sensors.data import CATEGORICAL, FEATURE_NAMES, load_splits, recalibrate
    from scanflow.examples.sensors.model import SKOPS_TRUSTED_TYPES, accuracy, build_model, fit, training_rows

    from scanflow.tracking.reference import log_reference
    from scanflow.tracking.registry import CHAMPION, ensure_experiment, get_alias_version, set_alias

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    t0 = time.perf_counter()
    s = load_splits(seed)
    x_fit, y_fit, w_fit, n_synthetic = training_rows(s.x_train, s.y_train, extra, adapt=adapt,
                                                     extra_share=extra_share, seed=seed)
    model = fit(build_model(max_iter=max_iter, learning_rate=learning_rate, seed=seed), x_fit, y_fit, w_fit)
    scores = {"accuracy_clean": accuracy(model, s.x_holdout, s.y_holdout),
              "accuracy_drifted": accuracy(model, recalibrate(s.x_holdout), s.y_holdout)}
    if validation is not None and len(validation[0]):
        scores["accuracy_validation_drifted"] = accuracy(model, *validation)
    train_s = time.perf_counter() - t0

    n_extra = 0 if extra is None else len(extra[0])
    x_reference = s.x_train if extra is None else np.concatenate([s.x_train, extra[0]])
    first = get_alias_version(model_name, CHAMPION) is None
    params = {"seed": seed, "max_iter": max_iter, "learning_rate": learning_rate, "adapt": adapt,
              "extra_share": extra_share, "n_train": len(s.x_train), "n_extra": n_extra,
              "n_synthetic": n_synthetic, "alias": alias,
              "n_validation_drifted": 0 if validation is None else len(validation[0]),
              "n_drift_inputs": 0 if drift_inputs is None else len(drift_inputs)}
    example = s.x_holdout[:5]
    active = mlflow.active_run()  # under the job runner (Platform.run_job) the job's run is active: log there
    with (mlflow.start_run(experiment_id=ensure_experiment(experiment)) if active is None
          else contextlib.nullcontext(active)) as run:
        mlflow.log_params(params)
        mlflow.log_metrics({**scores, "train_seconds": train_s})
        info = mlflow.sklearn.log_model(
            model, name=model_name, signature=infer_signature(example, model.predict(example)),
            input_example=example[:2], registered_model_name=model_name, pip_requirements=_pip_requirements(),
            serialization_format="skops", skops_trusted_types=list(SKOPS_TRUSTED_TYPES),
        )
        log_reference(x_reference, s.x_holdout, s.y_holdout, task="classification", kind="tabular",
                      categorical=CATEGORICAL, feature_names=FEATURE_NAMES, run_id=run.info.run_id, seed=seed)
    version = str(info.registered_model_version) if info.registered_model_version else None
    if version is None:
        raise RuntimeError(f"model {model_name!r} was logged but not registered")
    metrics = {"accuracy_clean": scores["accuracy_clean"], "accuracy_drifted": scores["accuracy_drifted"]}
    aliases = [alias]
    set_alias(model_name, alias, version, actor="train", reason="trained", metrics=metrics)
    if first and alias != CHAMPION:
        set_alias(model_name, CHAMPION, version, actor="train", reason="first model", metrics=metrics)
        aliases.append(CHAMPION)
    log.info("trained %s v%s: clean %.3f drifted %.3f (%d extra points, %.1fs)", model_name, version,
             scores["accuracy_clean"], scores["accuracy_drifted"], n_extra, train_s)
    return {"version": version, "run_id": run.info.run_id, **scores, "aliases": aliases, "n_extra": n_extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scanflow.examples.sensors.train",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--model-name", default=MODEL_NAME)
    parser.add_argument("--alias", default="challenger")
    parser.add_argument("--extra-points", dest="extra_points_path", default=None, help=".npz with x, y")
    parser.add_argument("--validation-points", dest="validation_points_path", default=None, help=".npz with x, y")
    parser.add_argument("--drift-inputs", dest="drift_inputs_path", default=None, help=".npz with x")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--adapt", choices=ADAPT_CHOICES, default="moments")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = train(**vars(args))
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
