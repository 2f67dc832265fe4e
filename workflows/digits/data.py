"""The digits data: scikit-learn's bundled 8x8 digits (no download), split and corrupted.

Who calls it: the digits training job (train/feedback), the drift detector's tests and benchmark
(train as reference, calibration for the null distribution, test for clean windows), and the S1
drift scenario, which feeds `corrupt(...)` windows to the served model.

Pixels are scaled to float32 in [0, 1] and flattened to shape (n, 64); `corrupt` works on the 8x8
images underneath and returns the same shape and dtype, clipped to [0, 1]. Everything is
deterministic given a seed (or a `numpy.random.Generator`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float32]
Labels = NDArray[np.int64]
CorruptionKind = Literal["noise", "rotation", "shift", "contrast", "deadcols", "bleed"]

# Random per-image corruptions: the drift detector's tests and benchmark sweep exactly these.
KINDS: tuple[CorruptionKind, ...] = ("noise", "rotation", "shift")
# Systematic "new scanner" corruptions (MNIST-C style, one fixed transform for every image plus mild
# sensor noise): the kind of drift a retrain on a few hundred labelled points can learn. S1 uses one
# (`S1_DRIFT`); benchmarks/s1_corruptions.py measures them all.
SENSOR_KINDS: tuple[CorruptionKind, ...] = ("contrast", "deadcols", "bleed")
ALL_KINDS: tuple[CorruptionKind, ...] = KINDS + SENSOR_KINDS
SEVERITIES: tuple[int, ...] = (1, 2, 3)
N_FEATURES = 64
IMAGE_SHAPE = (8, 8)

# Strength per severity. Severity 1 is mild on purpose: noise sigma 0.1 in 500-row windows is caught by
# MMD on autoencoder features in only ~3 windows out of 4 (power 0.73 over 100 splits), so detectors can
# be told apart.
NOISE_SIGMA = {1: 0.1, 2: 0.2, 3: 0.3}
ROTATION_DEG = {1: 6.0, 2: 12.0, 3: 24.0}  # angle drawn uniformly in +-[deg/2, deg] per image
SHIFT_PX = {1: 0.3, 2: 0.6, 3: 1.2}  # sub-pixel shift, random direction per image
# contrast: a washed-out scanner, x -> 0.5 + gain * (x - 0.5) (ink greyer, paper brighter)
CONTRAST_GAIN = {1: 0.6, 2: 0.4, 3: 0.25}
# deadcols: sensor columns that read 0 (a dead line of the scanner's array)
DEAD_COLUMNS = {1: (2,), 2: (2, 5), 3: (1, 3, 5)}
# bleed: ink spreads to the 8 neighbours, x -> max(x, strength * max over the 3x3 neighbourhood)
BLEED_STRENGTH = {1: 0.5, 2: 0.7, 3: 0.9}
# every sensor kind adds this mild Gaussian read noise (mild on purpose: sigma 0.2 destroys the
# information in 8x8 images, so no retrain can undo it; docs/scenarios.md S1)
SENSOR_NOISE_SIGMA = 0.02

# Fractions of the 1,797 images; the remainder is the feedback pool.
SPLIT_FRACTIONS = {"train": 0.40, "calibration": 0.25, "test": 0.20}


@dataclass(frozen=True)
class Splits:
    """Disjoint, stratified parts of digits.

    train: fits the classifier and is the drift detector's reference data.
    calibration: held out from every fit; gives the detector its null distribution.
    test: clean evaluation data (accuracy, clean drift windows).
    feedback: a labelled pool the retraining job may draw on (true labels, never predictions).
    """

    x_train: Array
    y_train: Labels
    x_calibration: Array
    y_calibration: Labels
    x_test: Array
    y_test: Labels
    x_feedback: Array
    y_feedback: Labels
    seed: int

    def sizes(self) -> dict[str, int]:
        return {
            "train": len(self.x_train),
            "calibration": len(self.x_calibration),
            "test": len(self.x_test),
            "feedback": len(self.x_feedback),
        }


def load_digits_scaled() -> tuple[Array, Labels]:
    """All 1,797 digits as float32 (n, 64) in [0, 1] (raw pixels are 0..16) and int64 labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / 16.0).clip(0.0, 1.0)
    y = np.asarray(bunch.target, dtype=np.int64)
    return x, y


def load_splits(seed: int = 0) -> Splits:
    """Shuffle digits with `seed` and cut it into train / calibration / test / feedback.

    Stratified by label, so every part has every digit in about the same proportion.
    """
    from sklearn.model_selection import train_test_split

    x, y = load_digits_scaled()
    n = len(x)
    n_train = round(SPLIT_FRACTIONS["train"] * n)
    n_cal = round(SPLIT_FRACTIONS["calibration"] * n)
    n_test = round(SPLIT_FRACTIONS["test"] * n)
    x_tr, x_rest, y_tr, y_rest = train_test_split(x, y, train_size=n_train, random_state=seed, stratify=y)
    x_cal, x_rest, y_cal, y_rest = train_test_split(
        x_rest, y_rest, train_size=n_cal, random_state=seed + 1, stratify=y_rest
    )
    x_te, x_fb, y_te, y_fb = train_test_split(
        x_rest, y_rest, train_size=n_test, random_state=seed + 2, stratify=y_rest
    )
    return Splits(x_tr, y_tr, x_cal, y_cal, x_te, y_te, x_fb, y_fb, seed)


def _as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def corrupt(
    x: Array,
    kind: CorruptionKind,
    severity: int,
    rng: np.random.Generator | int | None = None,
) -> Array:
    """A corrupted copy of `x` (n, 64): Gaussian noise, rotation or sub-pixel shift (random per image),
    or a systematic scanner change (contrast, deadcols, bleed: the same transform for every image,
    plus mild read noise).

    `rng` is a Generator or a seed; the same seed gives the same output. Raises ValueError on an
    unknown kind, a severity outside 1..3 or a wrong shape.
    """
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown corruption kind {kind!r}; expected one of {list(ALL_KINDS)}")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {list(SEVERITIES)}, got {severity!r}")
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != N_FEATURES:
        raise ValueError(f"expected shape (n, {N_FEATURES}), got {arr.shape}")
    gen = _as_rng(rng)
    if kind == "noise":
        out = arr + gen.normal(0.0, NOISE_SIGMA[severity], size=arr.shape).astype(np.float32)
    elif kind in SENSOR_KINDS:
        out = _sensor(arr, kind, severity, gen)
    else:
        out = _warp(arr, kind, severity, gen)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def _warp(arr: Array, kind: CorruptionKind, severity: int, gen: np.random.Generator) -> Array:
    """Rotate or shift every 8x8 image at once: one affine grid per image, bilinear, zeros outside.

    Vectorised with torch's affine_grid/grid_sample (torch is a dependency already), ~100x faster
    than a per-image scipy loop, which matters for benchmarks that corrupt thousands of windows.
    """
    import torch
    import torch.nn.functional as F

    n = len(arr)
    theta = np.zeros((n, 2, 3), dtype=np.float32)
    if kind == "rotation":
        top = ROTATION_DEG[severity]
        angles = np.deg2rad(gen.uniform(top / 2, top, size=n) * gen.choice([-1.0, 1.0], size=n))
        cos, sin = np.cos(angles), np.sin(angles)
        theta[:, 0, 0], theta[:, 0, 1], theta[:, 1, 0], theta[:, 1, 1] = cos, -sin, sin, cos
    else:
        direction = gen.uniform(0.0, 2 * np.pi, size=n)
        px = SHIFT_PX[severity] * 2.0 / IMAGE_SHAPE[0]  # pixels -> normalised [-1, 1] coordinates
        theta[:, 0, 0] = theta[:, 1, 1] = 1.0
        theta[:, 0, 2], theta[:, 1, 2] = px * np.cos(direction), px * np.sin(direction)
    images = torch.from_numpy(np.ascontiguousarray(arr)).reshape(n, 1, *IMAGE_SHAPE)
    with torch.inference_mode():
        grid = F.affine_grid(torch.from_numpy(theta), [n, 1, *IMAGE_SHAPE], align_corners=False)
        out = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.reshape(n, N_FEATURES).numpy()


def _sensor(arr: Array, kind: CorruptionKind, severity: int, gen: np.random.Generator) -> Array:
    """One fixed scanner transform for every image, then read noise (dead columns stay 0)."""
    if kind == "contrast":
        out = 0.5 + CONTRAST_GAIN[severity] * (arr - 0.5)
    elif kind == "bleed":
        images = arr.reshape(-1, *IMAGE_SHAPE)
        padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))
        rows, cols = IMAGE_SHAPE
        neighbours = np.max([padded[:, i:i + rows, j:j + cols] for i in range(3) for j in range(3)], axis=0)
        out = np.maximum(images, BLEED_STRENGTH[severity] * neighbours).reshape(arr.shape)
    else:
        out = arr.copy()
    out = out + gen.normal(0.0, SENSOR_NOISE_SIGMA, size=arr.shape).astype(np.float32)
    if kind == "deadcols":
        out.reshape(-1, *IMAGE_SHAPE)[:, :, list(DEAD_COLUMNS[severity])] = 0.0
    return out.astype(np.float32)
