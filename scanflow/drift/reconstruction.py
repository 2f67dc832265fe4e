"""`ReconstructionDriftDetector`: drift from the reconstruction errors of an autoencoder, any input kind.

Who calls it: the image and tabular detectors (scanflow/drift/detector.py, scanflow/drift/tabular.py)
subclass it and implement only what differs between input kinds: how rows are put into the model's
input space (`_fit_inputs`, `_model_inputs`, `_input_state` / `_restore_inputs`), the model
(`_build_model`) and the schema they describe. `scanflow.drift.factory` builds and loads them;
the Checker agent calls `predict` per window, off the event loop.

How it decides (docs/drift.md has the why; docs/benchmarks/drift.md the numbers): `fit` (the base,
scanflow/drift/base.py) splits the reference from its calibration rows by groups of near-copies; `_fit`
learns the input scaling and trains the autoencoder; `_calibrate` fits the nulls on rows it never saw
(`evidence.CombinedNull`, `feature_ks.FeatureKS` and `feature_ks.PairNull`, the input families on every
reference row) and `min_window`; `predict` screens the window (`ranges.py`: a schema violation is no
drift) and judges the rest (`window.combined`), critical points being the rows above the calibration's
error quantile. Persistence: scanflow/drift/storage.py.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from scanflow.drift import alibi_backend, copies, evidence, ranges, stats, storage, window
from scanflow.drift.autoencoder import (
    Autoencoder,
    default_threads,
    encode,
    errors_and_codes,
    reconstruction_errors,
    torch_threads,
    train_autoencoder,
)
from scanflow.drift.base import Array, DriftDetector, NotFittedError, PreprocessFn
from scanflow.drift.evidence import CombinedNull
from scanflow.drift.feature_ks import FeatureKS, PairNull
from scanflow.drift.options import BACKENDS, EVIDENCE, Backend, Evidence
from scanflow.drift.report import DriftReport
from scanflow.drift.storage import FORMAT_VERSION, READABLE_FORMATS

__all__ = ["FORMAT_VERSION", "READABLE_FORMATS", "ReconstructionDriftDetector"]

# Windows up to this many rows are scored on one torch thread unless num_threads says otherwise: the
# model is tiny, and a second thread costs more in handoff than it saves (docs/drift.md, Threads).
SINGLE_THREAD_ROWS = 1000
# Calibration quantiles of the log reconstruction error whose exceedance shares form the "error_tail"
# family: a drift that hits a few rows hard (a patch blanked in one image of ten) barely moves the mean
# error of a window but doubles or triples its share of rows above the calibration's upper quantiles.
TAIL_QUANTILES = (0.9, 0.95, 0.98)


class ReconstructionDriftDetector(DriftDetector):
    """Owns calibration, the window verdict, `DriftReport`s and persistence for autoencoder detectors.

    backend: "ae" (default: location + scale tests on log reconstruction errors) or an
        alibi-detect test ("mmd", "ks", "lsdd") on encoder outputs; needs `pip install alibi-detect`.
    error_quantile: calibration quantile above which a sample is a critical point.
    alternative: for the mean test: "two-sided" (errors up or down) or "greater" (only up).
    epochs, batch_size, lr: autoencoder training.
    num_threads: torch threads while fitting (default: the cores this process may use, at most 4)
        and scoring (default: 1 for windows of <= SINGLE_THREAD_ROWS rows, else the process's
        setting); restored afterwards.
    calibration_confidence: share of calibration sets (deployments) whose means are all within the
        margins the test allows for them (`evidence.CombinedNull.fit`: a joint quantile per family), so
        that such a deployment flags clean windows at most at `fpr`; 0: no margin.
    range_margin: share of a column's reference width allowed beyond its minimum and maximum before
        a value is a schema violation (`ranges.py`).
    copy_tolerance: what counts as a near-copy (`DriftDetector`); the calibration and every window are
        judged at their effective sizes, near-copies counting once.
    evidence: "combined" (default): reconstruction errors, every input column and every encoder output,
        one min-p test calibrated jointly on the null, beside a per-feature KS test on the input
        columns (its own joint null), their min-p calibrated on their joint null (`evidence.py`); "errors": the errors' location
        and spread only (`stats.window_test`, the rule before), for comparison; "full": "combined" plus
        each input column's empirical CDF at its calibration quartiles (`evidence.ecdf_cuts`): level with
        per-feature KS on tone curves and mild noise, at the price of a larger min_window and a slower fit
        (docs/drift.md).
    """

    name = "reconstruction"
    kind = ""  # "image" | "tabular": the schema kind a subclass serves
    # True where every input column is the same quantity on one scale (pixels): the row's mean input is then
    # a quantity too (an image's overall intensity), and the "input_mean" evidence family tests it (`_scores`)
    input_mean: ClassVar[bool] = False
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
        calibration_confidence: float = 0.9,
        range_margin: float = ranges.DEFAULT_MARGIN,
        evidence: Evidence = "combined",
        copy_tolerance: float | None = None,
        preprocess_fn: PreprocessFn | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(
            fpr=fpr,
            n_features=n_features,
            calibration_fraction=calibration_fraction,
            copy_tolerance=copy_tolerance,
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
        if not range_margin >= 0:
            raise ValueError(f"range_margin must be >= 0, got {range_margin}")
        if evidence not in EVIDENCE:
            raise ValueError(f"evidence must be one of {list(EVIDENCE)}, got {evidence!r}")
        self.evidence: Evidence = evidence
        self.margin = stats.margin_for(calibration_confidence)  # ValueError outside [0, 1)
        if backend != "ae":
            alibi_backend.require_alibi(backend)  # fail at construction, not after minutes of training
        self.backend: Backend = backend
        self.error_quantile = float(error_quantile)
        self.alternative: stats.Alternative = alternative
        self.epochs = int(epochs)
        self.batch_size = int(batch_size)
        self.lr = float(lr)
        self.num_threads = num_threads
        self.calibration_confidence = float(calibration_confidence)
        self.range_margin = float(range_margin)
        self.model: Autoencoder | None = None
        self.window_null: stats.WindowNull | None = None
        self.null: stats.NullStats | None = None  # window_null.location, kept for callers and MLflow
        self.min_window: int | None = None
        self.ranges: ranges.FeatureRanges | None = None
        self.error_threshold: float | None = None
        self.calibration_errors: NDArray[np.float64] | None = None
        # (the `evidence` argument shadows the module here: the classes are imported by name)
        self.combined: CombinedNull | None = None  # evidence "combined": the joint null
        self.feature_ks: FeatureKS | None = None  # and the per-feature KS test beside it
        self.pair_null: PairNull | None = None  # the null of the two tests' min-p
        self._medians: list[NDArray[np.float64]] = []  # calibration medians of each evidence block
        self._cuts: tuple[NDArray[np.int64], NDArray[np.float64]] = (np.zeros(0, np.int64), np.zeros(0))
        self._tail_cuts: NDArray[np.float64] = np.zeros(0)  # log-error cuts of the "error_tail" family
        self._alibi: Any = None

    # -- what a subclass implements ---------------------------------------------------------------
    @abstractmethod
    def _fit_inputs(self, x_ref: Array) -> None:
        """Learn the input scaling / encoding from the (validated, preprocessed) reference rows."""

    @abstractmethod
    def _model_inputs(self, x: Array) -> Array:
        """Rows -> the model's input space, (n, width), float32 (uses what `_fit_inputs` learnt)."""

    def _code_groups(self) -> list[list[int]]:
        """For each categorical input, the columns of the model's input space holding its one-hot codes (the
        feature KS test balances them and counts each input as one column, `feature_ks.FeatureKS.fit`)."""
        return []

    @abstractmethod
    def _build_model(self) -> Autoencoder:
        """A fresh, untrained autoencoder sized from the config and the learnt input encoding."""

    @abstractmethod
    def _input_state(self) -> dict[str, NDArray[Any]]:
        """The learnt input scaling as named arrays, for `save`."""

    @abstractmethod
    def _restore_inputs(self, arrays: dict[str, NDArray[Any]]) -> None:
        """Set the input scaling from `_input_state`'s arrays, for `load`."""

    def _ranges_of(self, x_ref: Array) -> ranges.FeatureRanges:
        """The reference's range per column (a subclass may share one range or skip code columns)."""
        return ranges.learn_ranges(x_ref, margin=self.range_margin)

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
            "calibration_confidence": self.calibration_confidence,
            "range_margin": self.range_margin,
            "evidence": self.evidence,
            "copy_tolerance": self.copy_tolerance,
            "seed": self.seed,
        }

    # -- the DriftDetector steps ------------------------------------------------------------------
    def _check_reference(self, x_ref: Array, x_cal: Array) -> None:
        self.ranges = self._ranges_of(x_ref)
        ranges.check_calibration(x_cal, self.ranges)

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
        threads = self.num_threads
        if threads is None and len(x) <= SINGLE_THREAD_ROWS:
            threads = 1
        with torch_threads(threads):
            return reconstruction_errors(model, self._model_inputs(x))

    def _scores(self, x: Array) -> tuple[NDArray[np.float64], list[NDArray[np.float64]]]:
        """Per-sample errors and the evidence blocks (log error, model inputs, encoder outputs and, where
        `input_mean`, each row's mean input), one pass.

        Why the row mean: a change that moves every input a little the same way (a new tone curve or
        exposure: grey ink darker) stays under every single column's bar, the more columns the higher
        that bar, but adds up in the row's mean. Measured (benchmarks/drift.py --power-only, 6 deployments,
        120 windows per cell): digits under a mild tone curve were caught in 0.908 of 200-row windows
        without it, 1.000 with it (per-pixel KS: 0.783). Not for tables: a mean over unrelated
        standardised columns is no quantity, and on the sensors it only diluted the level (a one-sensor
        shift 0.717 -> 0.692 of 200-row windows)."""
        model = self._model()
        threads = self.num_threads
        if threads is None and len(x) <= SINGLE_THREAD_ROWS:
            threads = 1
        inputs = self._model_inputs(x)
        with torch_threads(threads):
            errors, codes = errors_and_codes(model, inputs)
        as_float = inputs.astype(np.float64, copy=False)
        blocks: list[NDArray[np.float64]] = [stats.log_errors(errors)[:, None], as_float, codes.astype(np.float64)]
        if self.input_mean:
            blocks.append(as_float.mean(axis=1, keepdims=True))
        return errors, blocks

    def _layout(self, blocks: list[NDArray[np.float64]]) -> evidence.Layout:
        return evidence.layout_of(blocks, len(self._cuts[0]), len(self._tail_cuts), self.alternative)

    def _values(self, blocks: list[NDArray[np.float64]]) -> NDArray[np.float64]:
        return evidence.values_of(blocks, self._medians, self._cuts, self._tail_cuts)

    def _calibrate(self, x_cal: Array) -> None:
        if self.ranges is None and self.x_ref is not None:  # a model set by hand (benchmark twins), or a
            self.ranges = self._ranges_of(self.x_ref)  # format-3 load: the rows it has stand in
        errors, blocks = self._scores(x_cal)
        self.error_threshold = stats.error_threshold(errors, self.error_quantile)
        log_errs = stats.log_errors(errors)
        self.window_null = stats.WindowNull.of(log_errs)
        self.null = self.window_null.location
        if self.evidence in ("combined", "full"):
            self._medians = [np.median(b, axis=0) for b in blocks]
            self._cuts = evidence.ecdf_cuts(blocks[1]) if self.evidence == "full" else (np.zeros(0, np.int64), np.zeros(0))
            self._tail_cuts = np.quantile(log_errs, TAIL_QUANTILES)
            values = self._values(blocks)
            ref_values, ref_inputs, ref_groups = self._reference_evidence(values, blocks[1])
            nulls = window.fit_nulls(
                values, blocks[1], self._layout(blocks), window.Rows(self.cal_groups, ref_values, ref_inputs, ref_groups),
                codes=self._code_groups(), confidence=self.calibration_confidence, fpr=self.fpr, seed=self.seed)
            self.combined, self.feature_ks, self.pair_null, self.min_window = nulls
        else:
            self.combined = None
            self.feature_ks = None
            self.pair_null = None
            self.min_window = stats.min_window(log_errs, self.window_null, self.fpr, self.alternative,
                                               seed=self.seed)
        self.calibration_errors = errors
        self._alibi = (
            alibi_backend.build_alibi(self.backend, x_cal, self.encoder_fn(), self.fpr)
            if self.backend != "ae"
            else None
        )

    def _reference_evidence(self, values: NDArray[np.float64], inputs: NDArray[np.float64]
                            ) -> tuple[NDArray[np.float64] | None, NDArray[np.float64] | None, NDArray[np.int64] | None]:
        """(per-row values, model inputs, near-copy groups) of the training rows and the calibration rows
        together, for the families that do not depend on the autoencoder (`INPUT_FAMILIES`): a training
        row's pixels are as much a sample of the reference as a held-out row's, and three times the rows
        cut the calibration's own error by 1.7. (None, None, None) when no training rows apart from the
        calibration's are known (a detector loaded from an older format)."""
        if not self.training_rows_known() or self.x_ref is None or self.x_cal is None:
            return None, None, None
        _, blocks = self._scores(self._preprocess(self.x_ref))
        groups = self.copy_groups(np.concatenate([self.x_ref, self.x_cal]))
        return (np.concatenate([self._values(blocks), values]), np.concatenate([blocks[1], inputs]), groups)

    def predict(self, x: ArrayLike) -> DriftReport:
        """Test one window: refuse it if shorter than `min_window`, report rows that break the schema
        (non-finite, beyond the reference's range, non-integer codes), test the others for drift.

        `is_drift` is about the rows inside the reference's range only; when fewer than `min_window`
        of them are left, no test is made (is_drift False, p_value 1, metadata `tested` False) and
        `schema_violation` says why. Critical points are taken among all finite rows: a row far out of
        range is new to the model whatever the verdict.
        """
        if not self.fitted:
            raise NotFittedError(f"{self.name}: call fit() on reference data before predict()")
        window = self.validate(x, what="x", allow_nonfinite=True)
        need = self.min_window or 2
        if len(window) < need:
            raise ValueError(f"window of {len(window)} rows: this detector needs at least {need} (its calibration)")
        assert self.ranges is not None  # set with the calibration
        checked = ranges.screen(window, self.ranges)
        finite = np.isfinite(window).all(axis=1)
        errors = np.full(len(window), np.nan)
        values: NDArray[np.float64] | None = None
        inputs: NDArray[np.float64] | None = None
        rows_in = self.copy_groups(window)
        if finite.any():
            errors[finite], blocks = self._scores(self._preprocess(window[finite]))
            if self.combined is not None:
                values = np.full((len(window), len(self.combined.mean)), np.nan)
                values[finite] = self._values(blocks)
                inputs = np.full((len(window), blocks[1].shape[1]), np.nan)
                inputs[finite] = blocks[1]
        return self._verdict(window, errors, checked, values, inputs, rows_in)

    def _predict(self, x: Array) -> DriftReport:
        """Test rows already validated and screened (all finite, in range): `predict` without the screening."""
        ok = np.ones(len(x), dtype=bool)
        errors, blocks = self._scores(self._preprocess(x))
        values = self._values(blocks) if self.combined is not None else None
        return self._verdict(x, errors, ranges.Screen(ok, None), values, blocks[1], self.copy_groups(x))

    def _verdict(self, window_rows: Array, errors: NDArray[np.float64], checked: ranges.Screen,
                 values: NDArray[np.float64] | None = None, inputs: NDArray[np.float64] | None = None,
                 rows_in: NDArray[np.int64] | None = None) -> DriftReport:
        assert self.window_null is not None and self.error_threshold is not None  # set by _calibrate
        with np.errstate(invalid="ignore"):
            critical = stats.critical_points(errors, self.error_threshold)  # NaN (not scored) is never above
        tested = checked.ok_rows
        n_tested = int(tested.sum())
        # near-copies in the window count once (a popular input, replayed traffic): the standard errors
        # of its means and of its empirical CDFs follow its effective size, not its row count
        m_eff = copies.kish(rows_in[tested]) if rows_in is not None and n_tested else float(n_tested)
        meta = self.metadata()
        meta.update(tested_rows=n_tested, tested=n_tested >= (self.min_window or 2), effective_rows=round(m_eff, 1))
        score, p_value, is_drift = 0.0, 1.0, False
        if not meta["tested"]:
            meta["untested_reason"] = (
                f"{n_tested} rows inside the reference's range, fewer than min_window {self.min_window}"
            )
        elif self._alibi is None:
            z_loc, z_scale, p_loc, p_scale = stats.window_test(
                stats.log_errors(errors[tested]), self.window_null, self.margin, self.alternative
            )
            score, p_value = z_loc, stats.bonferroni(p_loc, p_scale)
            meta.update(t_scale=z_scale, p_location=p_loc, p_scale=p_scale)
            if self.combined is not None and values is not None:
                verdict = window.combined(self.combined, self.feature_ks, self.pair_null, values,
                                          inputs if self.feature_ks is not None else None, tested,
                                          self.seen(window_rows), rows_in)
                p_value = verdict.p_value
                meta.update(verdict.meta, evidence_p=verdict.family_p,
                            shifted_inputs=window.shifted_inputs(self.combined.layout, verdict.z, self._input_column))
            is_drift = p_value < self.fpr
        else:
            x_in = self._preprocess(window_rows[tested])
            score, p_value, is_drift = alibi_backend.alibi_verdict(self._alibi.predict(x_in), self.backend)
        return DriftReport(
            score=float(score),
            p_value=float(p_value),
            threshold=self.fpr,
            is_drift=bool(is_drift),
            drift_rate=len(critical) / len(window_rows),
            critical_indices=tuple(int(i) for i in critical),
            n=len(window_rows),
            metadata=meta,
            errors=errors,
            schema_violation=checked.violation,
        )

    def _input_column(self, encoded: int) -> int:
        """The row column a column of the model's input space comes from (the same one, unless a subclass
        encodes rows, as the tabular one-hot does)."""
        return encoded

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
            "min_window": self.min_window,
            "calibration_confidence": self.calibration_confidence,
            "calibration_margin": self.margin,
            "range_margin": self.range_margin,
            "evidence": self.evidence,
            "schema": self.schema(),
            "copy_tolerance": self.copy_limit,
            "reference_distinct": self.reference_distinct,
            "calibration_rows": None if self.x_cal is None else len(self.x_cal),
            "calibration_effective": None if self.cal_groups is None else round(self.calibration_effective(), 1),
            "warnings": self.warnings(),
        }

    def calibration_effective(self) -> float:
        """The calibration set's effective size: its distinct rows (`copies.kish` of its near-copy groups)."""
        if self.cal_groups is None:
            return float(0 if self.x_cal is None else len(self.x_cal))
        return copies.kish(self.cal_groups)

    def warnings(self) -> list[str]:
        """What makes this detector's null uncertain, in words (empty when nothing does)."""
        return copies.calibration_warnings(self.cal_groups, self.copy_limit)

    def _model(self) -> Autoencoder:
        if self.model is None:
            raise NotFittedError(f"{self.name}: call fit() before using the autoencoder")
        return self.model

    def encoder_fn(self) -> PreprocessFn:
        """The fitted encoder as a numpy -> numpy function on rows (e.g. an alibi-detect preprocess_fn)."""
        model = self._model()
        return lambda x: encode(model, self._model_inputs(np.asarray(x, dtype=np.float32)))

    # -- persistence (scanflow/drift/storage.py) ---------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write detector.json, autoencoder.pt, inputs.npz and calibration.npz into `directory`."""
        return storage.save(self, directory)

    @classmethod
    def load(cls, directory: str | Path, *, preprocess_fn: PreprocessFn | None = None) -> Self:
        """Read a detector written by `save`, as the class it was saved as; ready to predict (no retraining).

        Called on the base (or through `scanflow.drift.load_detector`) it loads any registered
        subclass; called on a subclass it refuses a detector of another class with a ValueError.
        """
        return storage.load(cls, directory, preprocess_fn=preprocess_fn)

    def log_to_mlflow(self, name: str = "drift_detector", *, tracking_uri: str | None = None) -> str:
        """Log the detector as artifacts under `name` in the active MLflow run (or a new one).

        Blocking: call it off the event loop. Returns the artifact URI for `load_from_mlflow`.
        """
        return storage.log_to_mlflow(self, name, tracking_uri=tracking_uri)

    @classmethod
    def load_from_mlflow(
        cls, uri: str, *, tracking_uri: str | None = None, preprocess_fn: PreprocessFn | None = None
    ) -> Self:
        """Download the artifacts at `uri` (e.g. "runs:/<id>/drift_detector") and `load` them. Blocking."""
        return storage.load_from_mlflow(cls, uri, tracking_uri=tracking_uri, preprocess_fn=preprocess_fn)
