"""`ReconstructionDriftDetector`: drift from the reconstruction errors of an autoencoder, any input kind.

Who calls it: the image and tabular detectors (scanflow/drift/detector.py, scanflow/drift/tabular.py)
subclass it and implement only what differs between input kinds: how rows are put into the model's
input space (`_fit_inputs`, `_model_inputs`, `_input_state` / `_restore_inputs`), the model
(`_build_model`) and the schema they describe. `scanflow.drift.factory` builds and loads them;
the Checker agent calls `predict` per window, off the event loop.

How it decides (docs/drift.md has the why and the numbers):
1. `fit` learns the input scaling from the reference rows and trains the autoencoder on them.
2. calibration, on clean rows the autoencoder never saw: the mean and variance of log
   reconstruction errors (the null) and their `error_quantile` (the critical-point threshold).
3. `predict`: per-sample errors of the window, the same way; critical points are the samples above
   the threshold; the window is drift when its log-errors differ from the calibration ones in mean
   (Welch t-test, two-sided by default) or spread (Brown-Forsythe in Welch form), Bonferroni
   combined, at p < fpr. With backend "mmd" | "ks" | "lsdd", alibi-detect's test on the encoder
   outputs (window against the calibration set) decides instead; critical points still come from
   the errors.

Persistence: `save` writes detector.json (format version, class name, config, schema, null),
autoencoder.pt (the model's state dict), inputs.npz (the learnt input scaling) and calibration.npz
(calibration rows and their errors); `load` rebuilds the saved class from them without retraining.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from scanflow.drift import alibi_backend, stats
from scanflow.drift.autoencoder import (
    Autoencoder,
    default_threads,
    encode,
    reconstruction_errors,
    torch_threads,
    train_autoencoder,
)
from scanflow.drift.base import Array, DriftDetector, NotFittedError, PreprocessFn
from scanflow.drift.report import DriftReport

Backend = Literal["ae", "mmd", "ks", "lsdd"]
BACKENDS: tuple[str, ...] = ("ae", "mmd", "ks", "lsdd")
# 3: detector.json names the schema, inputs.npz holds the input scaling. 2 (8x8 images in [0, 1],
# no inputs.npz) still loads. 1 (full-resolution convolutions) does not: refit.
FORMAT_VERSION = 3
READABLE_FORMATS = (2, 3)
DETECTOR_FILE = "detector.json"
MODEL_FILE = "autoencoder.pt"
INPUTS_FILE = "inputs.npz"
CALIBRATION_FILE = "calibration.npz"


class ReconstructionDriftDetector(DriftDetector):
    """Owns calibration, the window verdict, `DriftReport`s and persistence for autoencoder detectors.

    backend: "ae" (default: location + scale tests on log reconstruction errors) or an
        alibi-detect test ("mmd", "ks", "lsdd") on encoder outputs; needs `pip install alibi-detect`.
    error_quantile: calibration quantile above which a sample is a critical point.
    alternative: for the mean test: "two-sided" (errors up or down) or "greater" (only up).
    epochs, batch_size, lr: autoencoder training.
    num_threads: torch threads while fitting (default: the cores this process may use, at most 4)
        and, when given, while scoring (restored afterwards; 1 is best for windows of <= 1,000 rows).
    """

    name = "reconstruction"
    kind = ""  # "image" | "tabular": the schema kind a subclass serves
    _classes: ClassVar[dict[str, type[ReconstructionDriftDetector]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register every subclass by name: `load` rebuilds the class named in detector.json."""
        super().__init_subclass__(**kwargs)
        ReconstructionDriftDetector._classes[cls.__name__] = cls

    def __init__(
        self,
        *,
        n_features: int,
        backend: Backend = "ae",
        fpr: float = 0.05,
        error_quantile: float = 0.95,
        alternative: stats.Alternative = "two-sided",
        epochs: int = 30,
        batch_size: int = 64,
        lr: float = 3e-3,
        num_threads: int | None = None,
        calibration_fraction: float = 0.35,
        preprocess_fn: PreprocessFn | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(
            fpr=fpr,
            n_features=n_features,
            calibration_fraction=calibration_fraction,
            preprocess_fn=preprocess_fn,
            seed=seed,
        )
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
        if not 0.0 < error_quantile < 1.0:
            raise ValueError(f"error_quantile must be in (0, 1), got {error_quantile}")
        if alternative not in ("two-sided", "greater"):
            raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
        if epochs < 1 or batch_size < 1:
            raise ValueError(f"epochs ({epochs}) and batch_size ({batch_size}) must be >= 1")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if backend != "ae":
            alibi_backend.require_alibi(backend)  # fail at construction, not after minutes of training
        self.backend: Backend = backend
        self.error_quantile = float(error_quantile)
        self.alternative: stats.Alternative = alternative
        self.epochs = int(epochs)
        self.batch_size = int(batch_size)
        self.lr = float(lr)
        self.num_threads = num_threads
        self.model: Autoencoder | None = None
        self.null: stats.NullStats | None = None
        self.scale_null: stats.NullStats | None = None
        self.error_threshold: float | None = None
        self.calibration_errors: NDArray[np.float64] | None = None
        self._alibi: Any = None

    # -- what a subclass implements ---------------------------------------------------------------
    @abstractmethod
    def _fit_inputs(self, x_ref: Array) -> None:
        """Learn the input scaling / encoding from the (validated, preprocessed) reference rows."""

    @abstractmethod
    def _model_inputs(self, x: Array) -> Array:
        """Rows -> the model's input space, (n, width), float32 (uses what `_fit_inputs` learnt)."""

    @abstractmethod
    def _build_model(self) -> Autoencoder:
        """A fresh, untrained autoencoder sized from the config and the learnt input encoding."""

    @abstractmethod
    def _input_state(self) -> dict[str, NDArray[Any]]:
        """The learnt input scaling as named arrays, for `save`."""

    @abstractmethod
    def _restore_inputs(self, arrays: dict[str, NDArray[Any]]) -> None:
        """Set the input scaling from `_input_state`'s arrays, for `load`."""

    @abstractmethod
    def schema(self) -> dict[str, Any]:
        """What inputs this detector takes: kind, n_features, categorical, image_shape (JSON-able)."""

    def config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this detector (`load` calls the class with them)."""
        return {
            "backend": self.backend,
            "fpr": self.fpr,
            "error_quantile": self.error_quantile,
            "alternative": self.alternative,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "calibration_fraction": self.calibration_fraction,
            "seed": self.seed,
        }

    # -- the DriftDetector steps ------------------------------------------------------------------
    def _fit(self, x_ref: Array) -> None:
        with torch_threads(self.num_threads or default_threads()):
            self._fit_inputs(x_ref)
            with torch.random.fork_rng(devices=[]):  # seeded layer initialisation; global RNG restored
                torch.manual_seed(self.seed)
                model = self._build_model()
            self.model = train_autoencoder(
                model,
                self._model_inputs(x_ref),
                epochs=self.epochs,
                batch_size=self.batch_size,
                lr=self.lr,
                seed=self.seed,
            )

    def _errors(self, x: Array) -> NDArray[np.float64]:
        model = self._model()
        with torch_threads(self.num_threads):
            return reconstruction_errors(model, self._model_inputs(x))

    def _calibrate(self, x_cal: Array) -> None:
        errors = self._errors(x_cal)
        self.error_threshold = stats.error_threshold(errors, self.error_quantile)
        log_errs = stats.log_errors(errors)
        self.null = stats.NullStats.of(log_errs)
        self.scale_null = stats.NullStats.of(stats.abs_deviations(log_errs))
        self.calibration_errors = errors
        self._alibi = (
            alibi_backend.build_alibi(self.backend, x_cal, self.encoder_fn(), self.fpr)
            if self.backend != "ae"
            else None
        )

    def _predict(self, x: Array) -> DriftReport:
        assert self.null is not None and self.scale_null is not None  # set by _calibrate
        assert self.error_threshold is not None
        errors = self._errors(x)
        critical = stats.critical_points(errors, self.error_threshold)
        meta = self.metadata()
        if self._alibi is None:
            t_loc, t_scale, p_loc, p_scale = stats.location_scale_test(
                stats.log_errors(errors), self.null, self.scale_null, self.alternative
            )
            score, p_value = t_loc, stats.bonferroni(p_loc, p_scale)
            is_drift = p_value < self.fpr
            meta.update(t_scale=t_scale, p_location=p_loc, p_scale=p_scale)
        else:
            score, p_value, is_drift = alibi_backend.alibi_verdict(self._alibi.predict(x), self.backend)
        return DriftReport(
            score=score,
            p_value=p_value,
            threshold=self.fpr,
            is_drift=bool(is_drift),
            drift_rate=len(critical) / len(x),
            critical_indices=tuple(int(i) for i in critical),
            n=len(x),
            metadata=meta,
            errors=errors,
        )

    # -- public helpers ---------------------------------------------------------------------------
    def errors(self, x: ArrayLike) -> NDArray[np.float64]:
        """Per-sample reconstruction errors of validated rows (what critical points are judged on)."""
        self._model()
        return self._errors(self._preprocess(self.validate(x, what="x", min_rows=1)))

    def metadata(self) -> dict[str, Any]:
        return {
            "detector": self.name,
            "class": type(self).__name__,
            "backend": self.backend,
            "fpr": self.fpr,
            "threshold": self.fpr,
            "error_quantile": self.error_quantile,
            "alternative": self.alternative,
            "error_threshold": self.error_threshold,
            "n_calibration": self.null.n if self.null else None,
            "schema": self.schema(),
        }

    def _model(self) -> Autoencoder:
        if self.model is None:
            raise NotFittedError(f"{self.name}: call fit() before using the autoencoder")
        return self.model

    def encoder_fn(self) -> PreprocessFn:
        """The fitted encoder as a numpy -> numpy function on rows (e.g. an alibi-detect preprocess_fn)."""
        model = self._model()
        return lambda x: encode(model, self._model_inputs(np.asarray(x, dtype=np.float32)))

    # -- persistence ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write detector.json, autoencoder.pt, inputs.npz and calibration.npz into `directory`."""
        if not self.fitted or self.x_cal is None or self.calibration_errors is None:
            raise NotFittedError(f"{self.name}: fit() before save()")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(self._model().state_dict(), out / MODEL_FILE)
        np.savez_compressed(out / INPUTS_FILE, **self._input_state())
        np.savez_compressed(out / CALIBRATION_FILE, x_cal=self.x_cal, errors=self.calibration_errors)
        meta = {
            "format_version": FORMAT_VERSION,
            "class": type(self).__name__,
            "config": self.config(),
            "schema": self.schema(),
            "null": {"mean": self.null.mean, "var": self.null.var, "n": self.null.n} if self.null else None,
            "error_threshold": self.error_threshold,
        }
        (out / DETECTOR_FILE).write_text(json.dumps(meta, indent=2))
        return out

    @classmethod
    def load(cls, directory: str | Path, *, preprocess_fn: PreprocessFn | None = None) -> Self:
        """Read a detector written by `save`, as the class it was saved as; ready to predict (no retraining).

        Called on the base (or through `scanflow.drift.load_detector`) it loads any registered
        subclass; called on a subclass it refuses a detector of another class with a ValueError.
        """
        src = Path(directory)
        meta_path = src / DETECTOR_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"no {DETECTOR_FILE} in {src}")
        meta = json.loads(meta_path.read_text())
        if meta.get("format_version") not in READABLE_FORMATS:
            raise ValueError(f"unsupported detector format {meta.get('format_version')!r} in {src}: refit it")
        saved = str(meta.get("class"))
        klass = cls._classes.get(saved)
        if klass is None:
            raise ValueError(f"{src}: detector class {saved!r} is unknown (known: {sorted(cls._classes)}); "
                             "import the module that defines it, or use scanflow.drift.load_detector")
        if not issubclass(klass, cls):
            raise ValueError(  # noqa: TRY004 - the saved file is wrong for this class, not an argument's type
                f"{src} holds a {saved}, not a {cls.__name__}: load it with scanflow.drift.load_detector"
            )
        det = klass(**meta["config"], preprocess_fn=preprocess_fn)
        if (src / INPUTS_FILE).is_file():
            with np.load(src / INPUTS_FILE, allow_pickle=False) as inputs:
                det._restore_inputs({k: inputs[k] for k in inputs.files})
        model = det._build_model()
        model.load_state_dict(torch.load(src / MODEL_FILE, weights_only=True))
        model.eval()
        det.model = model
        with np.load(src / CALIBRATION_FILE, allow_pickle=False) as cal:
            x_cal = cal["x_cal"].astype(np.float32)
        det.x_ref = x_cal  # reference rows are not stored; the calibration rows stand in
        det.infer_threshold(x_cal)  # recomputes the same null and threshold from the same model
        return det  # type: ignore[return-value]  # an instance of a subclass of cls

    def log_to_mlflow(self, name: str = "drift_detector", *, tracking_uri: str | None = None) -> str:
        """Log the detector as artifacts under `name` in the active MLflow run (or a new one).

        Blocking: call it off the event loop. Returns the artifact URI for `load_from_mlflow`.
        """
        import mlflow

        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        with tempfile.TemporaryDirectory() as tmp:
            self.save(tmp)
            active = mlflow.active_run()
            ctx = mlflow.start_run(run_name=name) if active is None else contextlib.nullcontext(active)
            with ctx as run:
                mlflow.log_artifacts(tmp, artifact_path=name)
                mlflow.log_params({f"{name}.{k}": v for k, v in self.config().items()})
                mlflow.log_param(f"{name}.class", type(self).__name__)
                assert self.null is not None and self.error_threshold is not None
                mlflow.log_metrics(
                    {
                        f"{name}.error_threshold": self.error_threshold,
                        f"{name}.null_log_error_mean": self.null.mean,
                        f"{name}.null_log_error_var": self.null.var,
                    }
                )
                return f"runs:/{run.info.run_id}/{name}"

    @classmethod
    def load_from_mlflow(
        cls, uri: str, *, tracking_uri: str | None = None, preprocess_fn: PreprocessFn | None = None
    ) -> Self:
        """Download the artifacts at `uri` (e.g. "runs:/<id>/drift_detector") and `load` them. Blocking."""
        import mlflow

        with tempfile.TemporaryDirectory() as tmp:
            local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp, tracking_uri=tracking_uri)
            return cls.load(local, preprocess_fn=preprocess_fn)
