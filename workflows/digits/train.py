"""The digits training job: train on the clean split (+ labelled critical points), log, register, alias.

Who calls it: the Executor agent through `Platform.run_job` (the workflow's `train` job, entrypoint
`scanflow.examples.digits.train:train`), the S1 scenario, and people:
`python -m scanflow.examples.digits.train`.

The extra points are critical points picked by the drift detector from live traffic, saved by the
caller as .npz with arrays `x` (n, 64) and `y` (n,): `y` must be the TRUE labels (from the feedback
set), never the model's own predictions, or retraining would only confirm the model's mistakes.

The model is the logit average of 5 MLPs trained from different seeds, merged into one plain MLP
(`average_logits`): one model's accuracy on drifted digits varied by several points from seed to seed.

Evaluation: accuracy on the clean test split and on a corrupted copy of it (`drift_kind`,
`drift_severity`; by default S1's drift, workflows/digits/s1.py), logged as the run's metrics. The
promotion gate does not use them: it evaluates on the held-out gate data (scanflow.examples.digits.s1.gate_data).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from scanflow.examples.digits.model import N_CLASSES, N_FEATURES, accuracy, build_model, fit

log = logging.getLogger(__name__)

EXPERIMENT = "digits"


def load_extra_points(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and check the critical points file: `x` float (n, 64) in [0, 1], `y` int labels 0..9."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"extra_points_path {str(p)!r} does not exist")
    try:
        with np.load(p, allow_pickle=False) as data:
            arrays = {k: np.asarray(data[k]) for k in data.files if k in ("x", "y")}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{p}: not a readable .npz file of arrays x, y ({exc})") from None
    if "x" not in arrays or "y" not in arrays:
        raise ValueError(f"{p}: needs arrays 'x' and 'y', has {sorted(arrays)}")
    x, y = arrays["x"].astype(np.float32), arrays["y"]
    if x.ndim != 2 or x.shape[1] != N_FEATURES:
        raise ValueError(f"{p}: x must have shape (n, {N_FEATURES}), got {x.shape}")
    if y.shape != (len(x),):
        raise ValueError(f"{p}: y must have shape ({len(x)},), got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and (y.min() < 0 or y.max() >= N_CLASSES)):
        raise ValueError(f"{p}: y must hold integer labels 0..{N_CLASSES - 1}")
    if not np.isfinite(x).all():
        raise ValueError(f"{p}: x holds NaN or infinite values")
    return x.clip(0.0, 1.0), y.astype(np.int64)


def load_drift_inputs(path: str | Path) -> np.ndarray:
    """Read the Executor's drift inputs file: `x` float (m, 64), finite (clipped to [0, 1])."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as data:
            x = np.asarray(data["x"], dtype=np.float32)
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"drift_inputs_path {str(p)!r}: not a readable .npz file with array x ({exc})") from None
    if x.ndim != 2 or x.shape[1] != N_FEATURES or not np.isfinite(x).all():
        raise ValueError(f"{p}: x must be finite with shape (m, {N_FEATURES}), got {x.shape}")
    return x.clip(0.0, 1.0)


def _pip_requirements() -> list[str]:
    """The model's runtime needs, stated: MLflow's inference of them imports everything in a
    subprocess and took ~14 s of a ~20 s training job here."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in ("torch", "numpy", "cloudpickle")]


def average_logits(members: list[Any]) -> Any:
    """One `Sequential(Linear, ReLU, Linear)` whose logits are exactly the mean of the members' logits.

    Why: an ensemble cuts the variance that decided S1's accuracy gap (one seed's model lost 1 to 7
    points on unseen drifted digits, another none; docs/scenarios.md S1), and averaging K MLPs
    64 -> h -> 10 is itself an MLP 64 -> K*h -> 10 (hidden units side by side, output weights / K).
    So the served artefact stays one plain torch Sequential: replicas, pickling and the promotion gate
    need no ensemble code. Pure (builds a new module, leaves the members alone)."""
    import torch

    if not members:
        raise ValueError("average_logits needs at least one member")
    for m in members:
        if not (isinstance(m, torch.nn.Sequential) and len(m) == 3 and isinstance(m[0], torch.nn.Linear)
                and isinstance(m[1], torch.nn.ReLU) and isinstance(m[2], torch.nn.Linear)
                and m[0].in_features == N_FEATURES and m[2].out_features == N_CLASSES
                and m[2].in_features == m[0].out_features):
            raise ValueError(f"members must be Sequential(Linear({N_FEATURES}, h), ReLU, Linear(h, {N_CLASSES}))")
    hidden = sum(m[0].out_features for m in members)
    first, last = torch.nn.Linear(N_FEATURES, hidden), torch.nn.Linear(hidden, N_CLASSES)
    with torch.no_grad():
        first.weight.copy_(torch.cat([m[0].weight for m in members], dim=0))
        first.bias.copy_(torch.cat([m[0].bias for m in members]))
        last.weight.copy_(torch.cat([m[2].weight for m in members], dim=1) / len(members))
        last.bias.copy_(torch.stack([m[2].bias for m in members]).mean(dim=0))
    return torch.nn.Sequential(first, torch.nn.ReLU(), last).eval()


ADAPT_CHOICES = ("moments", "none")


MIN_DRIFT_INPUTS = 100  # fewer unlabelled drift inputs: match the labelled extra points' moments instead


def training_rows(splits: Any, extra: tuple[np.ndarray, np.ndarray] | None = None, *, adapt: str = "moments",
                  seed: int = 0, drift_inputs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Pure: the rows a retrain fits on, as (x, y, how many of them are synthetic).

    The clean training split, plus `extra` (the labelled drifted critical points), plus with
    adapt="moments" one synthetic drifted copy of every clean training row
    (`scanflow.drift.adapt.moment_matched_copies`: per pixel, the clean rows' mean and spread moved to
    the critical points', class-balanced over the digits both hold), labelled as its clean row. Why: ~100 labelled drifted digits alone left the
    retrain's drifted accuracy at the mercy of which digits they were; the copies carry the drift to
    all ~1,000 clean digits (offline, docs/scenarios.md S1: the median gap and its worst seeds fell
    by 1 to 5 points). No extra points, no copies: the first model trains on clean only.
    `drift_inputs`: unlabelled recent inputs of the drifted traffic (the Executor's `drift_inputs_path`);
    with at least MIN_DRIFT_INPUTS of them the copies take their moments (all the traffic, not only the
    few rows feedback labelled, and not skewed by which rows the detector named critical), else the
    labelled extra points' moments, class-balanced."""
    from scanflow.drift.adapt import MIN_TARGET_ROWS, moment_matched_copies  # loads torch: only when training

    if adapt not in ADAPT_CHOICES:
        raise ValueError(f"adapt must be one of {list(ADAPT_CHOICES)}, got {adapt!r}")
    x, y = splits.x_train, splits.y_train
    if extra is None or len(extra[0]) == 0:
        return x, y, 0
    parts_x, parts_y = [x, extra[0]], [y, extra[1]]
    n_synthetic = 0
    if adapt == "moments" and drift_inputs is not None and len(drift_inputs) >= MIN_DRIFT_INPUTS:
        parts_x.append(moment_matched_copies(x, drift_inputs, rng=seed, bounds=(0.0, 1.0)))
        parts_y.append(y)
        n_synthetic = len(x)
    elif adapt == "moments" and len(extra[0]) >= MIN_TARGET_ROWS:
        parts_x.append(moment_matched_copies(x, extra[0], rng=seed, bounds=(0.0, 1.0), source_labels=y,
                                             target_labels=extra[1]))
        parts_y.append(y)
        n_synthetic = len(x)
    return (np.concatenate(parts_x).astype(np.float32, copy=False), np.concatenate(parts_y), n_synthetic)


def train_model(splits: Any, extra: tuple[np.ndarray, np.ndarray] | None = None, *, hidden: int = 64,
                epochs: int = 60, lr: float = 1e-2, seed: int = 0, members: int = 5,
                adapt: str = "moments",
                rows: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[Any, list[float], float]:
    """The model part of `train`, without MLflow: `members` MLPs (seeds seed, seed+1, ...) fitted on
    `training_rows` (the clean training split, `extra` (x, y) and, with adapt="moments", synthetic
    drifted copies of the clean rows), merged into one model that averages their logits
    (`average_logits`). Returns (model, the first member's losses, accuracy on the calibration split).

    Why an average and not the best of a few restarts on clean calibration (the previous recipe):
    clean accuracy says nothing about drifted accuracy (measured: restart choice by calibration, or
    by the plan's drifted holdout of ~85 rows, was no better than chance on unseen drifted digits),
    while the average of 5 cut the median gap from 4.7 to ~2 points (13 detector seeds, docs/scenarios.md
    S1). 60 epochs: drifted accuracy was still rising at 30. Cost: 5 x 60 epochs, ~2-5 s here.

    Public so offline experiments (benchmarks/s1_corruptions.py) measure exactly what the job trains.
    `rows`: the (x, y) of `training_rows` when the caller already built them (then `extra` and `adapt`
    are not used)."""
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    x, y = rows if rows is not None else training_rows(splits, extra, adapt=adapt, seed=seed)[:2]
    fitted: list[Any] = []
    losses: list[float] = []
    for i in range(members):
        model = build_model(hidden=hidden, seed=seed + i)
        member_losses = fit(model, x, y, epochs=epochs, lr=lr, seed=seed + i)
        losses = losses or member_losses
        fitted.append(model)
    merged = average_logits(fitted)
    return merged, losses, accuracy(merged, splits.x_calibration, splits.y_calibration)


def train(
    tracking_uri: str | None = None,
    model_name: str = "digits",
    extra_points_path: str | None = None,
    epochs: int = 60,
    seed: int = 0,
    alias: str = "challenger",
    hidden: int = 64,
    lr: float = 1e-2,
    drift_kind: str = "contrast",
    drift_severity: int = 2,
    experiment: str = EXPERIMENT,
    members: int = 5,
    validation_points_path: str | None = None,
    adapt: str = "moments",
    drift_inputs_path: str | None = None,
    serving_delay_ms: float = 0.0,
) -> dict[str, Any]:
    """Train, evaluate, log and register a digits model; set `alias` (the very first one: 'champion').

    Returns {"version", "run_id", "accuracy_clean", "accuracy_drifted", "aliases", "n_extra"}, plus
    "accuracy_validation_drifted" when `validation_points_path` is given: labelled drifted rows held out
    of training (the Executor's holdout of a plan's critical points, same .npz format as the extra
    points), logged so the run records how the model does on the drift it was trained for; nothing
    is selected on them (too few rows to choose by, see `train_model`).
    `adapt`: "moments" (default) adds synthetic drifted copies of the clean rows when there are extra
    points (`training_rows`); "none" trains on clean + extra only.
    `drift_inputs_path`: .npz with `x`, unlabelled recent inputs of the drifted traffic (see `training_rows`).
    `serving_delay_ms`: a planted defect for the delivery checks (scanflow.examples.digits.defects.Slowed): a
    challenger (never the first champion) waits this long on each call, which no accuracy gate sees. 0 (the
    default) for real use.
    `tracking_uri` None keeps MLflow's configured URI (MLFLOW_TRACKING_URI).
    The run also holds the model's reference data (scanflow.tracking.reference.log_reference): the rows it
    trained on, and the clean calibration split (never trained on) with its labels, from which the agents
    fit the drift detector and judge challengers.
    """
    # Bad input fails first, before the slow imports and any MLflow call.
    from scanflow.examples.digits.data import ALL_KINDS, SEVERITIES

    if drift_kind not in ALL_KINDS or drift_severity not in SEVERITIES:
        raise ValueError(f"drift_kind must be one of {list(ALL_KINDS)} and drift_severity one of "
                         f"{list(SEVERITIES)}, got {drift_kind!r}, {drift_severity!r}")
    if adapt not in ADAPT_CHOICES:
        raise ValueError(f"adapt must be one of {list(ADAPT_CHOICES)}, got {adapt!r}")
    if epochs < 1 or hidden < 1 or lr <= 0 or members < 1 or serving_delay_ms < 0:
        raise ValueError(f"need epochs >= 1, hidden >= 1, lr > 0, members >= 1 and serving_delay_ms >= 0, got "
                         f"{epochs}, {hidden}, {lr}, {members}, {serving_delay_ms}")
    extra = load_extra_points(extra_points_path) if extra_points_path else None
    validation = load_extra_points(validation_points_path) if validation_points_path else None
    drift_inputs = load_drift_inputs(drift_inputs_path) if drift_inputs_path else None
    import mlflow
    import mlflow.pytorch
    from scanflow.examples.digits.data import corrupt, load_splits

    from scanflow.tracking.reference import log_reference
    from scanflow.tracking.registry import CHAMPION, ensure_experiment, get_alias_version, set_alias

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    t0 = time.perf_counter()
    splits = load_splits(seed)
    n_extra = 0 if extra is None else len(extra[0])
    x_fit, y_fit, n_synthetic = training_rows(splits, extra, adapt=adapt, seed=seed, drift_inputs=drift_inputs)
    # stage lines on this logger: a job's log, and the progress a notebook prints while it waits
    log.info("fitting %d MLPs x %d epochs on %d rows", members, epochs, len(x_fit))
    model, losses, val_acc = train_model(splits, hidden=hidden, epochs=epochs, lr=lr, seed=seed, members=members,
                                         rows=(x_fit, y_fit))
    x_drifted = corrupt(splits.x_test, drift_kind, drift_severity, rng=seed)  # type: ignore[arg-type]
    acc_clean = accuracy(model, splits.x_test, splits.y_test)
    acc_drifted = accuracy(model, x_drifted, splits.y_test)
    scores = {"accuracy_clean": acc_clean, "accuracy_drifted": acc_drifted}
    if validation is not None and len(validation[0]):
        scores["accuracy_validation_drifted"] = accuracy(model, *validation)
    train_s = time.perf_counter() - t0
    log.info("fitted in %.1f s: accuracy %.3f on clean test rows, %.3f on drifted ones", train_s, acc_clean,
             acc_drifted)

    first = get_alias_version(model_name, CHAMPION) is None
    params = {"epochs": epochs, "seed": seed, "hidden": hidden, "lr": lr, "n_train": len(splits.x_train),
              "n_extra": n_extra, "drift_kind": drift_kind, "drift_severity": drift_severity, "alias": alias,
              "members": members, "adapt": adapt, "n_synthetic": n_synthetic,
              "n_validation_drifted": 0 if validation is None else len(validation[0]),
              "n_drift_inputs": 0 if drift_inputs is None else len(drift_inputs)}
    active = mlflow.active_run()  # under the job runner (Platform.run_job) the job's run is active: log there
    with (mlflow.start_run(experiment_id=ensure_experiment(experiment)) if active is None
          else contextlib.nullcontext(active)) as run:
        log.info("logging the model and its reference data to MLflow (run %s)", run.info.run_id)
        slowed = serving_delay_ms > 0 and alias != CHAMPION and not first
        mlflow.log_params({**params, **({"serving_delay_ms": serving_delay_ms} if slowed else {})})
        if slowed:
            from scanflow.examples.digits.defects import Slowed

            model = Slowed(model, serving_delay_ms / 1000.0)
        mlflow.log_metrics({**scores, "final_loss": losses[-1], "train_seconds": train_s,
                            "accuracy_validation": val_acc})
        info = mlflow.pytorch.log_model(
            model, name=model_name, input_example=splits.x_test[:2], serialization_format="pickle",
            registered_model_name=model_name, pip_requirements=_pip_requirements(),
        )
        real = x_fit[: len(x_fit) - n_synthetic]  # the clean and labelled rows, not the synthetic copies
        log_reference(real, splits.x_calibration, splits.y_calibration, task="classification", kind="image",
                      image_shape=(8, 8), seed=seed)
    version = str(info.registered_model_version) if info.registered_model_version else None
    if version is None:
        raise RuntimeError(f"model {model_name!r} was logged but not registered")
    metrics = {"accuracy_clean": acc_clean, "accuracy_drifted": acc_drifted}
    aliases = [alias]
    set_alias(model_name, alias, version, actor="train", reason="trained", metrics=metrics)
    if first and alias != CHAMPION:
        set_alias(model_name, CHAMPION, version, actor="train", reason="first model", metrics=metrics)
        aliases.append(CHAMPION)
    log.info("trained %s v%s: clean %.3f drifted %.3f (%d extra points, %.1fs)",
             model_name, version, acc_clean, acc_drifted, n_extra, train_s)
    return {"version": version, "run_id": run.info.run_id, **scores, "aliases": aliases, "n_extra": n_extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scanflow.examples.digits.train",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--model-name", default="digits")
    parser.add_argument("--extra-points", dest="extra_points_path", default=None, help=".npz with x, y")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--members", type=int, default=5, help="MLPs whose logits the model averages")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--adapt", choices=ADAPT_CHOICES, default="moments",
                        help="synthetic drifted copies of the clean rows when extra points are given")
    parser.add_argument("--alias", default="challenger")
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
