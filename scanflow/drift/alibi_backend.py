"""Optional alibi-detect tests on a detector's encoder outputs, imported lazily.

Who calls it: `ReconstructionDriftDetector` (scanflow/drift/reconstruction.py) when built with
backend "mmd" | "ks" | "lsdd": the alibi-detect test then decides the verdict, while critical points
still come from the reconstruction errors. alibi-detect is an optional dependency
(`pip install 'scanflow[alibi]'`); asking for one of these backends without it fails at construction.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

Encoder = Callable[[NDArray[np.float32]], NDArray[np.float32]]


def alibi_available() -> bool:
    return importlib.util.find_spec("alibi_detect") is not None


def require_alibi(backend: str) -> None:
    if not alibi_available():
        raise ImportError(
            f"backend {backend!r} needs alibi-detect: pip install 'scanflow[alibi]' "
            "(or use the default backend 'ae')"
        )


def build_alibi(backend: str, x_cal: NDArray[np.float32], encoder: Encoder, fpr: float) -> Any:
    """An alibi-detect drift test with `encoder` as preprocess_fn and the calibration rows as reference.

    The calibration rows, not the training rows: the encoder has seen the training rows, so they
    would look unlike any fresh clean window and inflate the false-positive rate.
    """
    require_alibi(backend)

    def preprocess(x: Any) -> NDArray[np.float32]:
        return encoder(np.asarray(x, dtype=np.float32))

    if backend == "mmd":
        from alibi_detect.cd import MMDDrift

        return MMDDrift(x_cal, backend="pytorch", p_val=fpr, preprocess_fn=preprocess, device="cpu")
    if backend == "lsdd":
        from alibi_detect.cd import LSDDDrift

        return LSDDDrift(x_cal, backend="pytorch", p_val=fpr, preprocess_fn=preprocess, device="cpu")
    from alibi_detect.cd import KSDrift

    return KSDrift(x_cal, p_val=fpr, preprocess_fn=preprocess)


def alibi_verdict(result: dict[str, Any], backend: str) -> tuple[float, float, bool]:
    """(score, p-value, is_drift) from an alibi-detect prediction; KS p-values Bonferroni-adjusted."""
    data = result["data"]
    p = np.atleast_1d(np.asarray(data["p_val"], dtype=np.float64))
    dist = np.atleast_1d(np.asarray(data["distance"], dtype=np.float64))
    if backend == "ks":
        return float(dist.max()), float(min(1.0, p.min() * len(p))), bool(data["is_drift"])
    return float(dist[0]), float(p[0]), bool(data["is_drift"])
