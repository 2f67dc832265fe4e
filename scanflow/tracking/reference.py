"""The data contract between a team's training job and the agents: reference data and its schema.

A training job logs, in the MLflow run that registers its model, the rows the model was trained for
(`x`, the drift detector's reference), clean labelled rows it never trained on (`x_holdout`,
`y_holdout`: the detector's calibration and the promotion gate's clean part) and a `DataSchema`
(width, tabular or image, categorical columns, classification or regression). The agents learn a
workflow from this and from the model's signature only: the Checker fits its detector from the
champion's reference, and the Executor's promotion gate reads its holdout. No agent imports a
workflow's code or knows its dataset.

After a drift-triggered promotion the Executor logs a *serving reference* in the new champion's run
(`SERVING_REFERENCE_DIR`): the recent traffic the new model was trained to serve, and the labelled
feedback rows held out of its training. `load_reference` prefers it, so the detector refitted for the
new champion reads the drifted traffic as the new normal and the loop converges instead of retraining
after every cooldown.

Who calls: training jobs (`log_reference`), the bootstrap, the Checker and the Executor
(`reference_for_version`, `load_reference`). Blocking (MLflow): async callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

REFERENCE_DIR = "scanflow/reference"  # written by the training job
SERVING_REFERENCE_DIR = "scanflow/serving_reference"  # written by the Executor after a promotion
REFERENCE_TAG = "scanflow.reference"  # run tag: the artifact directories logged, comma separated
DATA_FILE = "reference.npz"
SCHEMA_FILE = "schema.json"
SCHEMA_VERSION = 1
MAX_ROWS = 5000  # reference rows kept at most (a random subsample): the detector needs ~1,000
MIN_ROWS = 20  # fewer reference rows cannot fit and calibrate a detector
MIN_HOLDOUT_ROWS = 10  # fewer labelled holdout rows cannot judge a challenger

Task = Literal["classification", "regression"]
Kind = Literal["tabular", "image"]
TASKS: tuple[str, ...] = get_args(Task)
KINDS: tuple[str, ...] = get_args(Kind)


class ReferenceError(ValueError):
    """Reference data or its schema is wrong; the message says which part and why."""


class ReferenceMissingError(ReferenceError, LookupError):
    """A run has no reference data: its training job did not call `log_reference`."""


class ReferenceUnavailableError(RuntimeError):
    """The reference exists but could not be read now (MLflow down, a timeout): worth trying again."""


@dataclass(frozen=True)
class DataSchema:
    """What the agents know of a model's inputs and target.

    kind: "tabular" (rows of numbers; categorical columns hold integer category codes) or "image"
        (each row a flattened image of `image_shape`, (H, W) or (C, H, W)).
    task: "classification" (labels are classes) or "regression" (labels are numbers).
    categorical: indices of the tabular columns that are category codes (one-hot encoded by the detector).
    feature_names: optional column names, one per feature.
    """

    kind: Kind
    n_features: int
    task: Task
    image_shape: tuple[int, ...] = ()
    categorical: tuple[int, ...] = ()
    feature_names: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ReferenceError(f"schema kind {self.kind!r}: expected one of {list(KINDS)}")
        if self.task not in TASKS:
            raise ReferenceError(f"schema task {self.task!r}: expected one of {list(TASKS)}")
        if not isinstance(self.n_features, int) or self.n_features < 1:
            raise ReferenceError(f"schema n_features {self.n_features!r}: expected an integer >= 1")
        if self.kind == "image":
            if len(self.image_shape) not in (2, 3) or any(int(d) < 1 for d in self.image_shape):
                raise ReferenceError(f"image_shape {self.image_shape!r}: expected (H, W) or (C, H, W) of positive sizes")
            if math.prod(self.image_shape) != self.n_features:
                raise ReferenceError(f"image_shape {self.image_shape!r} holds {math.prod(self.image_shape)} values, "
                                     f"but rows have {self.n_features} features")
            if self.categorical:
                raise ReferenceError("categorical columns are for tabular data, not images")
        elif self.image_shape:
            raise ReferenceError(f"image_shape {self.image_shape!r} given for tabular data (kind='image' for images)")
        bad = [c for c in self.categorical if not 0 <= c < self.n_features]
        if bad or len(set(self.categorical)) != len(self.categorical):
            raise ReferenceError(f"categorical {list(self.categorical)!r}: expected distinct column indices in "
                                 f"[0, {self.n_features})")
        if self.feature_names and len(self.feature_names) != self.n_features:
            raise ReferenceError(f"{len(self.feature_names)} feature_names for {self.n_features} features")

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": self.kind, "n_features": self.n_features, "task": self.task,
                "image_shape": list(self.image_shape), "categorical": list(self.categorical),
                "feature_names": list(self.feature_names)}

    @classmethod
    def from_dict(cls, data: Any) -> DataSchema:
        if not isinstance(data, dict):
            raise ReferenceError(f"schema must be a JSON object, got {type(data).__name__}")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ReferenceError(f"schema_version {data.get('schema_version')!r} not supported (expected {SCHEMA_VERSION})")
        try:
            return cls(kind=data["kind"], n_features=int(data["n_features"]), task=data["task"],
                       image_shape=tuple(int(d) for d in data.get("image_shape") or ()),
                       categorical=tuple(int(c) for c in data.get("categorical") or ()),
                       feature_names=tuple(str(n) for n in data.get("feature_names") or ()))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ReferenceError):
                raise
            raise ReferenceError(f"schema {data!r}: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Reference:
    """A model's reference data: `x` (what it serves), and labelled clean rows it never trained on."""

    schema: DataSchema
    x: NDArray[np.float32]
    x_holdout: NDArray[np.float32]
    y_holdout: NDArray[Any]
    source: str = ""  # where it was read from: runs:/<id>/<dir>


def _rows(value: ArrayLike, what: str, n_features: int | None = None, min_rows: int = MIN_ROWS) -> NDArray[np.float32]:
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ReferenceError(f"{what}: not a numeric array ({exc})") from None
    if arr.ndim > 2:
        arr = arr.reshape(len(arr), -1)  # images given as (n, H, W) or (n, C, H, W)
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ReferenceError(f"{what}: expected rows of features, shape (n, f), got {arr.shape}")
    if n_features is not None and arr.shape[1] != n_features:
        raise ReferenceError(f"{what}: rows have {arr.shape[1]} features, expected {n_features}")
    if len(arr) < min_rows:
        raise ReferenceError(f"{what}: {len(arr)} rows; at least {min_rows} are needed")
    if not np.isfinite(arr).all():
        raise ReferenceError(f"{what}: contains NaN or infinite values")
    return arr


def _targets(value: ArrayLike, n: int, task: str) -> NDArray[Any]:
    y = np.asarray(value)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.shape != (n,):
        raise ReferenceError(f"y_holdout: expected one target per holdout row, shape ({n},), got {y.shape}")
    if task == "regression":
        try:
            y = y.astype(np.float64)
        except (TypeError, ValueError):
            raise ReferenceError("y_holdout: regression targets must be numbers") from None
        if not np.isfinite(y).all():
            raise ReferenceError("y_holdout: contains NaN or infinite values")
    elif y.dtype.kind not in "iub" and y.dtype.kind != "U":
        if y.dtype.kind == "f" and np.all(np.mod(y, 1) == 0):
            y = y.astype(np.int64)
        else:
            raise ReferenceError(f"y_holdout: classification labels must be integers or strings, got {y.dtype}")
    return y


def make_reference(x: ArrayLike, x_holdout: ArrayLike, y_holdout: ArrayLike, *, task: Task,
                   kind: Kind = "tabular", image_shape: tuple[int, ...] = (), categorical: tuple[int, ...] = (),
                   feature_names: tuple[str, ...] = (), max_rows: int = MAX_ROWS, seed: int = 0) -> Reference:
    """Pure: a checked Reference (arrays validated against one schema; `x` subsampled to `max_rows`)."""
    xr = _rows(x, "x")
    schema = DataSchema(kind=kind, n_features=int(xr.shape[1]), task=task, image_shape=tuple(image_shape),
                        categorical=tuple(int(c) for c in categorical), feature_names=tuple(feature_names))
    xh = _rows(x_holdout, "x_holdout", schema.n_features, MIN_HOLDOUT_ROWS)
    yh = _targets(y_holdout, len(xh), task)
    if len(xr) > max_rows:
        xr = xr[np.sort(np.random.default_rng(seed).choice(len(xr), max_rows, replace=False))]
    return Reference(schema, np.ascontiguousarray(xr), np.ascontiguousarray(xh), yh)


def save_reference(ref: Reference, directory: str | Path) -> Path:
    """Write schema.json and reference.npz into `directory` (created)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / DATA_FILE, x=ref.x, x_holdout=ref.x_holdout, y_holdout=ref.y_holdout)
    (out / SCHEMA_FILE).write_text(json.dumps(ref.schema.to_dict(), indent=2))
    return out


def read_reference(directory: str | Path, source: str = "") -> Reference:
    """Read what `save_reference` wrote; ReferenceError says what is missing or wrong."""
    src = Path(directory)
    if not (src / SCHEMA_FILE).is_file() or not (src / DATA_FILE).is_file():
        raise ReferenceMissingError(f"{source or src}: no {SCHEMA_FILE} and {DATA_FILE}")
    try:
        schema = DataSchema.from_dict(json.loads((src / SCHEMA_FILE).read_text()))
    except json.JSONDecodeError as exc:
        raise ReferenceError(f"{source or src}: {SCHEMA_FILE} is not JSON ({exc})") from None
    with np.load(src / DATA_FILE, allow_pickle=False) as data:
        missing = {"x", "x_holdout", "y_holdout"} - set(data.files)
        if missing:
            raise ReferenceError(f"{source or src}: {DATA_FILE} lacks arrays {sorted(missing)}")
        x = _rows(data["x"], "x", schema.n_features)
        xh = _rows(data["x_holdout"], "x_holdout", schema.n_features, MIN_HOLDOUT_ROWS)
        yh = _targets(data["y_holdout"], len(xh), schema.task)
    return Reference(schema, x, xh, yh, source=source)


def log_reference(x: ArrayLike, x_holdout: ArrayLike, y_holdout: ArrayLike, *, task: Task,
                  kind: Kind = "tabular", image_shape: tuple[int, ...] = (), categorical: tuple[int, ...] = (),
                  feature_names: tuple[str, ...] = (), run_id: str | None = None,
                  artifact_path: str = REFERENCE_DIR, max_rows: int = MAX_ROWS, seed: int = 0) -> str:
    """Log a model's reference data in its MLflow run (the active one, or `run_id`); returns its URI.

    Call it from the training job, in the run that registers the model:
        log_reference(x_train, x_val, y_val, task="classification")
    `x`: rows the model was trained on (at most `max_rows` are kept, a random subsample);
    `x_holdout`, `y_holdout`: clean labelled rows it never trained on (>= 10). Raises ReferenceError
    before logging anything when the arrays or the schema are wrong. Blocking (MLflow).
    """
    import mlflow
    from mlflow import MlflowClient

    ref = make_reference(x, x_holdout, y_holdout, task=task, kind=kind, image_shape=image_shape,
                         categorical=categorical, feature_names=feature_names, max_rows=max_rows, seed=seed)
    if run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise ReferenceError("log_reference needs an active MLflow run or run_id= (the run that logs the model)")
        run_id = active.info.run_id
    client = MlflowClient()
    with tempfile.TemporaryDirectory(prefix="scanflow-ref-") as tmp:
        save_reference(ref, tmp)
        client.log_artifacts(run_id, tmp, artifact_path=artifact_path)
    logged = set(filter(None, (client.get_run(run_id).data.tags.get(REFERENCE_TAG) or "").split(",")))
    client.set_tag(run_id, REFERENCE_TAG, ",".join(sorted(logged | {artifact_path})))
    return f"runs:/{run_id}/{artifact_path}"


def load_reference(run_id: str, artifact_path: str | None = None) -> Reference:
    """The reference logged in run `run_id`: the serving reference when the Executor logged one, else
    the training job's (or exactly `artifact_path`). ReferenceMissingError names the run and the fix."""
    import mlflow
    from mlflow import MlflowClient

    if artifact_path is None:
        logged = set((MlflowClient().get_run(run_id).data.tags.get(REFERENCE_TAG) or "").split(","))
        artifact_path = next((p for p in (SERVING_REFERENCE_DIR, REFERENCE_DIR) if p in logged), None)
        if artifact_path is None:
            raise ReferenceMissingError(
                f"MLflow run {run_id} logs no reference data: the training job must call "
                "scanflow.tracking.reference.log_reference(x, x_holdout, y_holdout, task=...) in the run that "
                "registers the model (docs/bring-your-own-model.md)")
    source = f"runs:/{run_id}/{artifact_path}"
    with tempfile.TemporaryDirectory(prefix="scanflow-ref-") as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=tmp)
        except Exception as exc:
            # the run's tag says it was logged: a failed download is MLflow's trouble, not a missing contract
            raise ReferenceUnavailableError(f"{source}: cannot download the reference now ({exc})") from exc
        return read_reference(local, source=source)


def version_run_id(model_name: str, version: str) -> str:
    """The MLflow run that logged a registered model version (where its reference lives)."""
    from mlflow import MlflowClient

    mv = MlflowClient().get_model_version(model_name, str(version))
    if not mv.run_id:
        raise ReferenceMissingError(f"model {model_name!r} version {version} was registered without a run: "
                                    "register it from the training job's run so its reference can be found")
    return str(mv.run_id)


def reference_for_version(model_name: str, version: str) -> Reference:
    """The reference of a registered model version (see `load_reference`)."""
    return load_reference(version_run_id(model_name, version))
