"""The S1 drift scenario's data: which drift, the labelled traffic, and the promotion gate's held-out data.

Who calls it: the S1 demo (scanflow.demo.s1_drift), benchmarks/s1.py, benchmarks/s1_corruptions.py,
the e2e S1 test, and the Executor's `evaluate_and_promote` (through `gate_data`).

The drift is a new scanner (`DRIFT_KIND` at `DRIFT_SEVERITY`): a systematic change a retrain on a few
hundred labelled points can learn, unlike sigma-0.2 pixel noise, which destroys the information in
8x8 images (docs/scenarios.md, S1). The feedback split (270 labelled digits) is cut in two, once:
- traffic: the rows the load sends (clean, then corrupted copies); the Checker picks critical points
  among them and the retrain trains on those, with their true labels (`calibration_traffic` can add
  calibration digits to them: measured, not used, see `CALIBRATION_TRAFFIC_FRACTION`);
- gate: rows never sent, never offered as critical points, never trained on. The promotion gate
  compares challenger and champion on them, clean and corrupted, so a challenger that only memorised
  pool rows is not promoted for it.
Accuracy figures quoted as "unseen" use the test split, corrupted afresh (the gate's drifted rows are
used to decide, so they are not used to report; its clean rows include the test split, see gate_data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scanflow.examples.digits.data import Array, CorruptionKind, Labels, Splits, corrupt, load_splits

DRIFT_KIND: CorruptionKind = "contrast"
DRIFT_SEVERITY = 2
GATE_FRACTION = 1 / 3  # of the feedback split: 90 digits, 9 per class
TRAFFIC_COPIES = 8  # corrupted copies of each traffic digit (fresh read noise per copy)
GATE_COPIES = 4
# Share of the calibration split (per label) the load may also send as traffic (0.4 = 180 of 449 digits:
# ~360 distinct traffic digits instead of 180). Off: measured, it did not help. The lead was that a
# plan's ~440 critical points held only ~100-120 distinct digits; offline with 0.4 (benchmarks/
# s1_corruptions.py --as-executor --calibration-traffic 0,0.4, 10 detector seeds) the trained-on points
# went 113 -> 179 but the median gap went 1.1 -> 2.6 points (8 of 9 usable seeds worse), and with 800+
# points it was no better than without (docs/scenarios.md S1). Kept as a parameter so that is repeatable.
# Calibration rows, not a bigger feedback split, so the training and test splits stay as they are.
CALIBRATION_TRAFFIC_FRACTION = 0.0
SPLIT_SEED = 0
TRAFFIC_RNG, GATE_RNG, UNSEEN_RNG, POST_DRIFT_RNG = 7, 11, 123, 2027


@dataclass(frozen=True)
class GateData:
    """Held-out labelled rows for the promotion gate: clean and corrupted copies of the gate digits."""

    x_clean: Array
    y_clean: Labels
    x_drifted: Array
    y_drifted: Labels


def feedback_slices(y_feedback: Labels, gate_fraction: float = GATE_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Pure: (traffic indices, gate indices) into the feedback split, disjoint, stratified by label.

    Deterministic: the first ceil(fraction * count) rows of each label (in split order) go to the gate."""
    if not 0.0 < gate_fraction < 1.0:
        raise ValueError(f"gate_fraction must be in (0, 1), got {gate_fraction}")
    gate: list[int] = []
    for label in np.unique(y_feedback):
        rows = np.flatnonzero(y_feedback == label)
        gate.extend(rows[: int(np.ceil(gate_fraction * len(rows)))].tolist())
    mask = np.zeros(len(y_feedback), dtype=bool)
    mask[gate] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def calibration_traffic(y_calibration: Labels, fraction: float = CALIBRATION_TRAFFIC_FRACTION) -> np.ndarray:
    """Pure: indices of the calibration rows the load also sends, stratified by label: the last
    ceil(fraction * count) rows of each label (in split order). `fraction` 0 sends none."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    picked: list[int] = []
    for label in np.unique(y_calibration):
        rows = np.flatnonzero(y_calibration == label)
        n = int(np.ceil(fraction * len(rows)))
        picked.extend(rows[len(rows) - n:].tolist() if n else [])
    return np.sort(np.asarray(picked, dtype=np.int64))


def _splits() -> Splits:
    return load_splits(SPLIT_SEED)


def traffic_pools(kind: CorruptionKind = DRIFT_KIND, severity: int = DRIFT_SEVERITY,
                  copies: int = TRAFFIC_COPIES, splits: Splits | None = None,
                  calibration_fraction: float = CALIBRATION_TRAFFIC_FRACTION) -> dict[str, tuple[Array, Labels]]:
    """The load's labelled rows: {"clean": traffic digits, "drifted": `copies` corrupted copies of them}.

    Traffic digits: the feedback split's traffic slice, then `calibration_traffic(calibration_fraction)`."""
    s = splits or _splits()
    traffic, _ = feedback_slices(s.y_feedback)
    cal = calibration_traffic(s.y_calibration, calibration_fraction)
    x = np.concatenate([s.x_feedback[traffic], s.x_calibration[cal]])
    y = np.concatenate([s.y_feedback[traffic], s.y_calibration[cal]])
    xs, ys = np.concatenate([x] * copies), np.concatenate([y] * copies)
    return {"clean": (x, y), "drifted": (corrupt(xs, kind, severity, rng=TRAFFIC_RNG), ys)}


def gate_data(kind: CorruptionKind = DRIFT_KIND, severity: int = DRIFT_SEVERITY,
              splits: Splits | None = None) -> GateData:
    """The promotion gate's held-out rows: no training, traffic or critical point ever held them.

    drifted: `GATE_COPIES` corrupted copies of the gate digits. clean: the gate digits plus the clean
    test split (449 rows): the gate refuses a challenger that loses more than 1 point of clean accuracy,
    and on the 90 gate digits alone one digit is 1.1 points."""
    s = splits or _splits()
    _, gate = feedback_slices(s.y_feedback)
    x, y = s.x_feedback[gate], s.y_feedback[gate]
    xs, ys = np.concatenate([x] * GATE_COPIES), np.concatenate([y] * GATE_COPIES)
    return GateData(np.concatenate([x, s.x_test]), np.concatenate([y, s.y_test]),
                    corrupt(xs, kind, severity, rng=GATE_RNG), ys)


def unseen_test(kind: CorruptionKind = DRIFT_KIND, severity: int = DRIFT_SEVERITY,
                rng: int = UNSEEN_RNG, splits: Splits | None = None) -> tuple[Array, Array, Labels]:
    """(clean test rows, a fresh corrupted copy, labels): digits no training, traffic or gate ever saw."""
    s = splits or _splits()
    return s.x_test, corrupt(s.x_test, kind, severity, rng=rng), s.y_test


def post_drift_pool(kind: CorruptionKind = DRIFT_KIND, severity: int = DRIFT_SEVERITY,
                    splits: Splits | None = None) -> tuple[Array, Labels]:
    """The world S1 leaves: the test split's digits through S1's drift with read noise of their own, rows no
    reference, retrain, calibration or traffic pool ever held (the promotion gate saw them clean only).
    What the scenarios send after the promotion, so that the refitted detector is judged on fresh rows of
    the new distribution, not on the pool it was refitted on."""
    s = splits or _splits()
    return corrupt(s.x_test, kind, severity, rng=POST_DRIFT_RNG), s.y_test

