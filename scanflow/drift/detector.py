"""`AutoencoderDriftDetector`: drift from reconstruction errors of a convolutional autoencoder.

Who calls it: the Checker agent (fit once on the training data, then `predict` per window of logged
inputs, off the event loop: `await asyncio.to_thread(det.predict, x)`), the digits tests and
benchmarks/drift.py.

How it decides (docs/drift.md has the why and the numbers):
1. `fit` trains the autoencoder on the reference (training) data.
2. calibration, on clean data the autoencoder never saw: the mean and variance of log
   reconstruction errors (the null) and their `error_quantile` (the critical-point threshold).
3. `predict`: per-sample errors of the window, the same way; critical points are the samples above
   the threshold; the window is drift when its log-errors differ from the calibration ones in mean
   (Welch t-test, two-sided by default) or spread (Brown-Forsythe in Welch form), Bonferroni
   combined, at p < fpr. With backend "mmd" | "ks" | "lsdd", alibi-detect's test on
   the encoder outputs (window against the calibration set) decides instead; critical points still
   come from the errors.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np
import torch
from numpy.typing import NDArray

from scanflow.drift import stats
from scanflow.drift.autoencoder import (
    ConvAutoencoder,
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
FORMAT_VERSION = 2  # 2: strided-conv encoder + dense decoder (state dicts of 1 do not fit)


class AutoencoderDriftDetector(DriftDetector):
    """Drift detector for 8x8 images (n, 64) in [0, 1] built on a small torch autoencoder.

    backend: "ae" (default: location + scale tests on log reconstruction errors) or an
        alibi-detect test ("mmd", "ks", "lsdd") on encoder outputs; needs `pip install alibi-detect`.
    error_quantile: calibration quantile above which a sample is a critical point.
    alternative: for the mean test: "two-sided" (errors up or down) or "greater" (only up).
    latent_dim, epochs, batch_size, lr: autoencoder training; defaults fit ~1,000 rows in a few s.
    num_threads: torch threads while fitting (default: the cores this process may use, at most 4)
        and, when given, while scoring (restored afterwards; 1 is best for windows of <= 1,000 rows:
        a forward pass of 500 rows is ~2 ms of CPU, and a second thread on a busy machine contends).
    """

    name = "autoencoder"

    def __init__(
        self,
        *,
        backend: Backend = "ae",
        fpr: float = 0.05,
        error_quantile: float = 0.95,
        alternative: stats.Alternative = "two-sided",
        latent_dim: int = 16,
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
            n_features=64,
            calibration_fraction=calibration_fraction,
            preprocess_fn=preprocess_fn,
            seed=seed,
        )
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
        if not 0.0 < error_quantile < 1.0:
            raise ValueError(f"error_quantile must be in (0, 1), got {error_quantile}")
        if epochs < 1 or batch_size < 1 or latent_dim < 1:
            raise ValueError("epochs, batch_size and latent_dim must be >= 1")
        if backend != "ae":
            _require_alibi(backend)  # fail at construction, not after minutes of training
        self.backend: Backend = backend
        if alternative not in ("two-sided", "greater"):
            raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
        self.error_quantile = float(error_quantile)
        self.alternative: stats.Alternative = alternative
        self.latent_dim = int(latent_dim)
        self.epochs = int(epochs)
        self.batch_size = int(batch_size)
        self.lr = float(lr)
        self.num_threads = num_threads
        self.model: ConvAutoencoder | None = None
        self.null: stats.NullStats | None = None
        self.scale_null: stats.NullStats | None = None
        self.error_threshold: float | None = None
        self.calibration_errors: NDArray[np.float64] | None = None
        self._alibi: Any = None

    # -- backend steps ----------------------------------------------------------------------------
    def _fit(self, x_ref: Array) -> None:
        with torch_threads(self.num_threads or default_threads()):
            self.model = train_autoencoder(
                x_ref,
                latent_dim=self.latent_dim,
                epochs=self.epochs,
                batch_size=self.batch_size,
                lr=self.lr,
                seed=self.seed,
            )

    def _calibrate(self, x_cal: Array) -> None:
        model = self._model()
        with torch_threads(self.num_threads):
            errors = reconstruction_errors(model, x_cal)
        self.error_threshold = stats.error_threshold(errors, self.error_quantile)
        log_errs = stats.log_errors(errors)
        self.null = stats.NullStats.of(log_errs)
        self.scale_null = stats.NullStats.of(stats.abs_deviations(log_errs))
        self.calibration_errors = errors
        self._alibi = _build_alibi(self.backend, x_cal, model, self.fpr) if self.backend != "ae" else None

    def _predict(self, x: Array) -> DriftReport:
        model = self._model()
        assert self.null is not None and self.scale_null is not None  # set by _calibrate
        assert self.error_threshold is not None
        with torch_threads(self.num_threads):
            errors = reconstruction_errors(model, x)
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
            score, p_value, is_drift = _alibi_verdict(self._alibi.predict(x), self.backend)
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

    def metadata(self) -> dict[str, Any]:
        return {
            "detector": self.name,
            "backend": self.backend,
            "fpr": self.fpr,
            "threshold": self.fpr,
            "error_quantile": self.error_quantile,
            "alternative": self.alternative,
            "error_threshold": self.error_threshold,
            "n_calibration": self.null.n if self.null else None,
        }

    def _model(self) -> ConvAutoencoder:
        if self.model is None:
            raise NotFittedError(f"{self.name}: call fit() before using the autoencoder")
        return self.model

    def encoder_fn(self) -> PreprocessFn:
        """The fitted encoder as a numpy -> numpy function (e.g. an alibi-detect preprocess_fn)."""
        model = self._model()
        return lambda x: encode(model, np.asarray(x, dtype=np.float32))

    # -- persistence ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "fpr": self.fpr,
            "error_quantile": self.error_quantile,
            "alternative": self.alternative,
            "latent_dim": self.latent_dim,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "calibration_fraction": self.calibration_fraction,
            "seed": self.seed,
        }

    def save(self, directory: str | Path) -> Path:
        """Write detector.json, autoencoder.pt (state dict) and calibration.npz into `directory`."""
        if not self.fitted or self.x_cal is None or self.calibration_errors is None:
            raise NotFittedError(f"{self.name}: fit() before save()")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(self._model().state_dict(), out / "autoencoder.pt")
        np.savez_compressed(out / "calibration.npz", x_cal=self.x_cal, errors=self.calibration_errors)
        meta = {
            "format_version": FORMAT_VERSION,
            "class": type(self).__name__,
            "config": self.config(),
            "null": {"mean": self.null.mean, "var": self.null.var, "n": self.null.n} if self.null else None,
            "error_threshold": self.error_threshold,
        }
        (out / "detector.json").write_text(json.dumps(meta, indent=2))
        return out

    @classmethod
    def load(cls, directory: str | Path, *, preprocess_fn: PreprocessFn | None = None) -> Self:
        """Read a detector written by `save`; ready to predict (no retraining)."""
        src = Path(directory)
        meta_path = src / "detector.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"no detector.json in {src}")
        meta = json.loads(meta_path.read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported detector format {meta.get('format_version')!r} in {src}")
        det = cls(**meta["config"], preprocess_fn=preprocess_fn)
        model = ConvAutoencoder(det.latent_dim)
        model.load_state_dict(torch.load(src / "autoencoder.pt", weights_only=True))
        model.eval()
        det.model = model
        with np.load(src / "calibration.npz") as cal:
            x_cal = cal["x_cal"].astype(np.float32)
        det.x_ref = x_cal  # reference rows are not stored; the calibration rows stand in
        det.infer_threshold(x_cal)  # recomputes the same null and threshold from the same model
        return det

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
        """Download the artifacts at `uri` (e.g. "runs:/<id>/drift_detector") and load them. Blocking."""
        import mlflow

        with tempfile.TemporaryDirectory() as tmp:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=uri, dst_path=tmp, tracking_uri=tracking_uri
            )
            return cls.load(local, preprocess_fn=preprocess_fn)


# -- alibi-detect, imported lazily --------------------------------------------------------------
def alibi_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("alibi_detect") is not None


def _require_alibi(backend: str) -> None:
    if not alibi_available():
        raise ImportError(
            f"backend {backend!r} needs alibi-detect: pip install 'scanflow[alibi]' "
            "(or use the default backend 'ae')"
        )


def _build_alibi(backend: str, x_cal: Array, model: ConvAutoencoder, fpr: float) -> Any:
    """An alibi-detect drift test with the encoder as preprocess_fn and the calibration rows as reference.

    The calibration rows, not the training rows: the encoder has seen the training rows, so they
    would look unlike any fresh clean window and inflate the false-positive rate.
    """
    _require_alibi(backend)

    def preprocess(x: Any) -> NDArray[np.float32]:
        return encode(model, np.asarray(x, dtype=np.float32))

    if backend == "mmd":
        from alibi_detect.cd import MMDDrift

        return MMDDrift(x_cal, backend="pytorch", p_val=fpr, preprocess_fn=preprocess, device="cpu")
    if backend == "lsdd":
        from alibi_detect.cd import LSDDDrift

        return LSDDDrift(x_cal, backend="pytorch", p_val=fpr, preprocess_fn=preprocess, device="cpu")
    from alibi_detect.cd import KSDrift

    return KSDrift(x_cal, p_val=fpr, preprocess_fn=preprocess)


def _alibi_verdict(result: dict[str, Any], backend: str) -> tuple[float, float, bool]:
    """(score, p-value, is_drift) from an alibi-detect prediction; KS p-values Bonferroni-adjusted."""
    data = result["data"]
    p = np.atleast_1d(np.asarray(data["p_val"], dtype=np.float64))
    dist = np.atleast_1d(np.asarray(data["distance"], dtype=np.float64))
    if backend == "ks":
        return float(dist.max()), float(min(1.0, p.min() * len(p))), bool(data["is_drift"])
    return float(dist[0]), float(p[0]), bool(data["is_drift"])
