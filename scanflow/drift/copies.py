"""Near-copies in reference data and in windows: groups, effective sizes, a split that keeps copies together.

Who calls it: `DriftDetector.fit` (the fit/calibration split), `ReconstructionDriftDetector` (effective
sizes of the calibration set and of each window) and `scanflow.drift.evidence` (the multiplier bootstraps
draw one weight per group). Pure numpy and scikit-learn's neighbour search; no torch, no I/O.

Why: real references and real traffic repeat inputs. A team resamples a small table with jitter, a
serving reference replays traffic, a popular input arrives many times. Every window test here assumes
independent rows. Two things break when rows are near-copies:

- **memory**: a calibration row whose copy the autoencoder trained on reconstructs as well as a training
  row, so the calibration's errors are those of memorised rows and every fresh row reads as novel. The
  split therefore keeps each group of copies on one side (`split_groups`).
- **sample size**: eight copies of one row carry the information of one row, not eight. A mean over them
  varies as a mean over its groups does. Standard errors use Kish's effective size (`kish`) of the
  calibration set and of the window instead of their row counts.

A group is a set of rows within `tolerance` (root-mean-square difference per column, in a scaled space the
detector chooses) of its first member, in a seeded random order (leader clustering): no chains, so a
tolerance too large for low-dimensional data merges neighbours into small groups, which lowers effective
sizes (a more conservative test), but never fuses the whole data set.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

# The tolerance, when none is given, is this share of the median distance between two random rows of the
# reference (root-mean-square per column, in the detector's scaled space). On data without copies the
# nearest distinct neighbour is rarely that close: of tables and images measured (docs/drift.md,
# Near-copies) at most ~2 % of rows had a distinct neighbour within it, and those merge into pairs.
DEFAULT_TOLERANCE_SHARE = 0.1
PAIRS = 4000  # random pairs behind the median distance
# Below this effective size (distinct calibration rows) a detector warns that its null is uncertain: the
# margins for the calibration's own error then cost much power, and the reference is probably a few rows
# replayed (`calibration_warnings`: the report's `warnings`, the Checker's log, an MLflow tag).
MIN_DISTINCT_CALIBRATION = 100
EXACT = 0.0  # tolerance 0: identical rows only


KEY = 0.0  # a column of scale 0 is a key: rows are near-copies only where their keys are equal (a category)


def scaled(x: NDArray[np.floating], scale: NDArray[np.float64]) -> NDArray[np.float64]:
    """Rows divided by the per-column scale (the space distances are measured in); key columns (scale 0)
    as they are."""
    arr = np.asarray(x, dtype=np.float64)
    sc = np.asarray(scale, dtype=np.float64)
    return np.where(sc == KEY, arr, arr / np.where(sc == KEY, 1.0, sc))


def _split_keys(z: NDArray[np.float64], keys: NDArray[np.bool_] | None
                ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """(the distance columns, one key label per row or None)."""
    if keys is None or not keys.any():
        return z, None
    _, key_of = np.unique(z[:, keys], axis=0, return_inverse=True)
    return z[:, ~keys], key_of.reshape(-1)


def median_distance(z: NDArray[np.float64], *, pairs: int = PAIRS, seed: int = 0,
                    keys: NDArray[np.bool_] | None = None) -> float:
    """Median root-mean-square distance between random pairs of distinct rows (by index) of z, over the
    columns that are not keys."""
    z, _ = _split_keys(np.asarray(z, dtype=np.float64), keys)
    n = len(z)
    if n < 2 or z.shape[1] == 0:
        return 0.0
    gen = np.random.default_rng(seed)
    i = gen.integers(0, n, pairs)
    j = (i + gen.integers(1, n, pairs)) % n  # never the same index
    return float(np.median(np.sqrt(((z[i] - z[j]) ** 2).mean(axis=1))))


def default_tolerance(z: NDArray[np.float64], *, seed: int = 0, keys: NDArray[np.bool_] | None = None) -> float:
    """`DEFAULT_TOLERANCE_SHARE` of the median pairwise distance of the scaled rows z (key columns aside)."""
    return DEFAULT_TOLERANCE_SHARE * median_distance(z, seed=seed, keys=keys)


def groups(z: NDArray[np.float64], tolerance: float, *, seed: int = 0,
           keys: NDArray[np.bool_] | None = None) -> NDArray[np.int64]:
    """Group label per row (0..G-1): rows with equal keys (`keys`: key columns, compared exactly) within
    `tolerance` (RMS over the other columns) of their group's first member.

    Leaders are taken in a seeded random order, so which copy leads does not depend on the rows' order.
    tolerance 0: identical rows only. O(n^2 d) distances in blocks (a few ms for 500 x 64, ~1 s for
    5,000 x 64 on one core)."""
    if tolerance < 0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance}")
    arr, key_of = _split_keys(np.asarray(z, dtype=np.float64), keys)
    if key_of is None:
        return _groups(arr, tolerance, seed)
    out = np.empty(len(arr), dtype=np.int64)
    offset = 0
    for k in np.unique(key_of):
        rows = np.flatnonzero(key_of == k)
        lab = _groups(arr[rows], tolerance, seed)
        out[rows] = lab + offset
        offset += int(lab.max()) + 1
    return _relabel(out)


def _groups(arr: NDArray[np.float64], tolerance: float, seed: int) -> NDArray[np.int64]:
    """`groups` without keys."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.shape[1] == 0:  # nothing but keys: equal keys are copies
        return np.zeros(n, dtype=np.int64)
    if tolerance == EXACT:
        _, inverse = np.unique(arr, axis=0, return_inverse=True)
        return _relabel(inverse.reshape(-1))
    order = np.random.default_rng(seed).permutation(n)
    # centred (the squared norms below lose less to cancellation), in float32: distances at a tolerance
    # need no more digits, and the product is the cost
    arr = (arr[order] - arr.mean(axis=0)).astype(np.float32)
    limit = tolerance * tolerance * arr.shape[1]  # squared Euclidean distance of that RMS
    sq = (arr * arr).sum(axis=1)
    label = np.full(n, -1, dtype=np.int64)
    block = max(1, 2_000_000 // max(1, n))
    for start in range(0, n, block):
        stop = min(n, start + block)
        dist = arr[start:stop] @ arr.T  # squared distances, in place: a 500 x 500 block in under a ms
        dist *= -2.0
        dist += sq[start:stop, None]
        dist += sq[None, :]
        near = dist <= limit * (1 + 1e-5) + 1e-6
        near[np.arange(stop - start), np.arange(start, stop)] = True
        # a row near nothing but itself leads a group of one: only rows with a neighbour need the loop
        alone = near.sum(axis=1) == 1
        rows = np.arange(start, stop)
        label[rows[alone & (label[start:stop] < 0)]] = rows[alone & (label[start:stop] < 0)]
        for r in rows[~alone]:
            if label[r] >= 0:
                continue
            members = near[r - start] & (label < 0)
            label[members] = r
    out = np.empty(n, dtype=np.int64)
    out[order] = label
    return _relabel(out)


def _relabel(labels: NDArray[np.int64]) -> NDArray[np.int64]:
    """Labels renumbered 0..G-1 in order of first appearance."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def kish(labels: NDArray[np.int64]) -> float:
    """Kish's effective sample size of rows grouped by `labels`: n^2 / sum of squared group sizes.

    Equal to the row count when every row is its own group, to the group count when groups are equal."""
    lab = np.asarray(labels)
    if len(lab) == 0:
        return 0.0
    sizes = np.bincount(_relabel(lab.astype(np.int64)))
    return float(len(lab) ** 2 / float((sizes.astype(np.float64) ** 2).sum()))


def split_groups(labels: NDArray[np.int64], fraction: float, *, seed: int = 0) -> NDArray[np.bool_]:
    """Pure: a mask of the rows held out, whole groups at a time, about `fraction` of the rows.

    Groups are taken in a seeded random order until the held-out rows reach the fraction."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    lab = _relabel(np.asarray(labels, dtype=np.int64))
    sizes = np.bincount(lab)
    target = fraction * len(lab)
    held = np.zeros(len(sizes), dtype=bool)
    total = 0
    for g in np.random.default_rng(seed).permutation(len(sizes)):
        if total >= target:
            break
        held[g] = True
        total += int(sizes[g])
    return held[lab]


def group_weights(labels: NDArray[np.int64]) -> tuple[NDArray[np.int64], int]:
    """(labels renumbered 0..G-1, G): what the multiplier bootstraps index their per-group weights with."""
    lab = _relabel(np.asarray(labels, dtype=np.int64))
    return lab, int(lab.max()) + 1 if len(lab) else 0


def near_any(z: NDArray[np.float64], reference: NDArray[np.float64], tolerance: float,
             keys: NDArray[np.bool_] | None = None) -> NDArray[np.bool_]:
    """Pure: per row of z, whether some reference row is within `tolerance` of it (RMS over the columns that
    are not keys, keys equal): a row the model has seen, give or take the copies' jitter."""
    arr, key_of = _split_keys(np.vstack([np.asarray(z, dtype=np.float64), np.asarray(reference, dtype=np.float64)]),
                              keys)
    n = len(z)
    out = np.zeros(n, dtype=bool)
    if n == 0 or len(reference) == 0:
        return out
    if key_of is None:
        key_of = np.zeros(len(arr), dtype=np.int64)
    width = max(1, arr.shape[1])
    limit = tolerance * tolerance * width * (1 + 1e-5) + 1e-6
    centre = arr.mean(axis=0)
    for k in np.unique(key_of[:n]):
        rows = np.flatnonzero(key_of[:n] == k)
        ref = arr[n:][key_of[n:] == k]
        if len(ref) == 0:
            continue
        a = (arr[rows] - centre).astype(np.float32)
        b = (ref - centre).astype(np.float32)
        dist = a @ b.T
        dist *= -2.0
        dist += (a * a).sum(axis=1)[:, None]
        dist += (b * b).sum(axis=1)[None, :]
        out[rows] = dist.min(axis=1) <= limit
    return out


def calibration_warnings(cal_groups: NDArray[np.int64] | None, tolerance: float | None) -> list[str]:
    """Pure: the warning a calibration of these near-copy groups deserves, in words; none from
    MIN_DISTINCT_CALIBRATION distinct rows on (or when the groups are not known)."""
    if cal_groups is None:
        return []
    eff = kish(cal_groups)
    if eff >= MIN_DISTINCT_CALIBRATION:
        return []
    return [(f"the calibration holds {len(cal_groups)} rows but only ~{eff:.0f} distinct inputs (near-copies within "
            f"{tolerance or 0:.3g}), under {MIN_DISTINCT_CALIBRATION}: its null is uncertain and the test "
            "conservative; give the reference more distinct rows")]

