"""`DriftReport`: the typed result of one drift check, converted to plain Python at the edge.

Who calls it: detectors build it (scanflow/drift/detector.py); the Checker agent sends
`to_dict()` as the `drift.checked` event payload and may attach `plot(path)` to an MLflow run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class DriftReport:
    """One window's verdict.

    score: the window statistic (Welch t of the mean log-error for backend "ae"; the backend's
        distance otherwise).
    p_value: the test's p-value; is_drift is `p_value < threshold` (threshold = the stated fpr).
    drift_rate: fraction of critical points, samples whose reconstruction error is beyond the
        calibration quantile (about 1 - quantile on clean data).
    critical_indices: their positions in the window, for retraining on them (with true labels).
    metadata: detector name, backend, fpr, threshold, error_threshold, error_quantile; for backend
        "ae" also p_location, p_scale and t_scale (the two tests behind p_value).
    errors: per-sample reconstruction errors (kept for plots; left out of `to_dict` by default); NaN
        for rows that could not be scored (non-finite values).
    schema_violation: None, or what breaks the reference's schema (scanflow/drift/ranges.py): columns,
        rows, fraction_out, max_excess (in reference widths), non-finite rows, non-integer code columns.
        Those rows are not in the drift test: an integration bug is not drift.
    """

    score: float
    p_value: float
    threshold: float
    is_drift: bool
    drift_rate: float
    critical_indices: tuple[int, ...]
    n: int
    metadata: dict[str, Any] = field(default_factory=dict)
    errors: NDArray[np.float64] | None = field(default=None, repr=False, compare=False)
    schema_violation: dict[str, Any] | None = None

    def to_dict(self, include_errors: bool = False) -> dict[str, Any]:
        """Plain JSON-able dict (floats, ints, bools, lists), e.g. an event payload."""
        out: dict[str, Any] = {
            "score": float(self.score),
            "p_value": float(self.p_value),
            "threshold": float(self.threshold),
            "is_drift": bool(self.is_drift),
            "drift_rate": float(self.drift_rate),
            "critical_indices": [int(i) for i in self.critical_indices],
            "n": int(self.n),
            "metadata": dict(self.metadata),
            "schema_violation": None if self.schema_violation is None else dict(self.schema_violation),
        }
        if include_errors and self.errors is not None:
            out["errors"] = [float(e) if np.isfinite(e) else None for e in self.errors]
        return out

    def plot(self, path: str | Path) -> Path:
        """Write a PNG: per-sample errors with critical points and threshold, and their histogram."""
        from scanflow.extras import missing_extra

        try:
            import matplotlib
        except ModuleNotFoundError as exc:
            raise missing_extra(exc, "demo", "a drift report's plot") from None
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        if self.errors is None:
            raise ValueError("this report carries no per-sample errors to plot")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        errors = np.asarray(self.errors)
        thr = self.metadata.get("error_threshold")
        crit = np.asarray(self.critical_indices, dtype=int)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
        try:
            ax1.scatter(np.arange(len(errors)), errors, s=6, c="tab:blue", label="sample")
            if len(crit):
                ax1.scatter(crit, errors[crit], s=10, c="tab:red", label="critical")
            if thr is not None:
                ax1.axhline(float(thr), color="tab:red", ls="--", lw=1, label="error threshold")
                ax2.axvline(float(thr), color="tab:red", ls="--", lw=1)
            ax1.set_xlabel("sample in window")
            ax1.set_ylabel("reconstruction error")
            ax1.legend(loc="upper right", fontsize=7)
            ax2.hist(errors[np.isfinite(errors)], bins=30, color="tab:blue", alpha=0.8)
            ax2.set_xlabel("reconstruction error")
            verdict = "DRIFT" if self.is_drift else "no drift"
            fig.suptitle(
                f"{verdict}: score {self.score:.2f}, p {self.p_value:.2g} (threshold {self.threshold:g}), "
                f"critical {self.drift_rate:.1%} of {self.n}",
                fontsize=10,
            )
            fig.tight_layout()
            fig.savefig(path, dpi=100)
        finally:
            plt.close(fig)
        return path
