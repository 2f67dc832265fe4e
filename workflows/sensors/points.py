"""Read and check the .npz row files the Executor hands the sensors training job.

Who calls it: scanflow.examples.sensors.train (extra points, validation points, drift inputs). A bad file
fails here with a ValueError naming the file and the fault, before any slow work or MLflow call.
Format: `x` float (n, 10) readings; `y` (n,) TRUE machine states 0..3 (from the feedback set, never
the model's own predictions) when labels are needed.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from scanflow.examples.sensors.data import CATEGORICAL, MACHINE_TYPES, N_CLASSES, N_FEATURES, Array, Labels


def _arrays(path: str | Path, what: str) -> dict[str, np.ndarray]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{what} {str(p)!r} does not exist")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files if k in ("x", "y")}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{p}: not a readable .npz file of arrays x, y ({exc})") from None


def _rows(x: np.ndarray, where: str) -> Array:
    if x.ndim != 2 or x.shape[1] != N_FEATURES:
        raise ValueError(f"{where}: x must have shape (n, {N_FEATURES}), got {x.shape}")
    try:
        arr = x.astype(np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: x must be numeric, got {x.dtype}") from None
    if not np.isfinite(arr).all():
        raise ValueError(f"{where}: x holds NaN or infinite values")
    codes = arr[:, list(CATEGORICAL)]
    if len(arr) and (np.any(codes != np.round(codes)) or codes.min() < 0 or codes.max() >= len(MACHINE_TYPES)):
        raise ValueError(f"{where}: column 0 (machine_type) must hold integer codes 0..{len(MACHINE_TYPES) - 1}")
    return arr


def load_labelled(path: str | Path, what: str = "extra_points_path") -> tuple[Array, Labels]:
    """(x float32 (n, 10), y int64 (n,)) from a file of labelled readings; ValueError says what is wrong."""
    arrays = _arrays(path, what)
    if "x" not in arrays or "y" not in arrays:
        raise ValueError(f"{path}: needs arrays 'x' and 'y', has {sorted(arrays)}")
    x, y = _rows(arrays["x"], str(path)), arrays["y"]
    if y.shape != (len(x),):
        raise ValueError(f"{path}: y must have shape ({len(x)},), got {y.shape}")
    if y.dtype.kind == "f" and np.all(np.mod(y, 1) == 0):
        y = y.astype(np.int64)
    if y.dtype.kind not in "iu" or (len(y) and (y.min() < 0 or y.max() >= N_CLASSES)):
        raise ValueError(f"{path}: y must hold integer labels 0..{N_CLASSES - 1}")
    return x, y.astype(np.int64)


def load_inputs(path: str | Path, what: str = "drift_inputs_path") -> Array:
    """x float32 (m, 10) from a file of unlabelled readings (`y`, if present, is ignored)."""
    arrays = _arrays(path, what)
    if "x" not in arrays:
        raise ValueError(f"{path}: needs an array 'x', has {sorted(arrays)}")
    return _rows(arrays["x"], str(path))
