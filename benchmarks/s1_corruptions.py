"""Which drift can S1's retrain honestly fix? Offline, the real training and detection code, no stack.

    flock /tmp/scanflow-bench.lock .venv/bin/python benchmarks/s1_corruptions.py [--quick] [--seeds 3]

For each candidate corruption (kind/severity of scanflow.examples.digits.data.corrupt), per seed:
1. the old champion: `train_model` on the clean training split (what the S1 bootstrap trains);
2. the drift detector as the S1 bootstrap fits it (autoencoder, quick: 15 epochs, on train/calibration);
   200-row windows of the corrupted traffic pool (scanflow.examples.digits.s1.traffic_pools): the share of
   windows flagged, and the critical rows they name, in window order, as the Checker hands them on;
3. the retrain: `train_model` on the clean training split + the first N critical rows with TRUE labels
   (+ synthetic drifted copies of the clean rows with --adapt moments, the job's default);
4. accuracy on UNSEEN digits: the clean test split and a freshly corrupted copy (absent from training,
   traffic and the promotion gate).
Figures are medians over seeds. gap = old champion's clean accuracy - new model's drifted accuracy
(the issue's "accuracy on drifted data back within 2 points of clean accuracy"); gap_self = the new
model's own clean - drifted. Why a script and not a notebook: docs/benchmarks/s1-retrain.md quotes its tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WINDOW = 200  # the S1 quick window (workflow tracker setting quick_window)
N_WINDOWS = 10


@dataclass(frozen=True)
class Row:
    """One candidate, one seed (or the medians over seeds)."""

    candidate: str
    old_clean: float
    old_drifted: float
    detected: float  # share of drifted windows the detector flags
    critical_rate: float  # median share of critical rows per drifted window
    n: int
    new_clean: float
    new_drifted: float

    @property
    def drop(self) -> float:
        return 100.0 * (self.old_clean - self.old_drifted)

    @property
    def gap(self) -> float:
        return 100.0 * (self.old_clean - self.new_drifted)

    @property
    def gap_self(self) -> float:
        return 100.0 * (self.new_clean - self.new_drifted)


def critical_rows(detector: object, x: np.ndarray, window: int, rng: np.random.Generator,
                  n_windows: int) -> tuple[float, float, list[int]]:
    """(share of windows flagged, median critical share, critical row indices in window order) over
    `n_windows` random windows of `x` (rows may repeat across windows, as in replayed traffic)."""
    flagged, rates, rows = 0, [], []
    seen: set[int] = set()
    for _ in range(n_windows):
        idx = rng.choice(len(x), window, replace=False)
        rep = detector.predict(x[idx])  # type: ignore[attr-defined]
        flagged += int(rep.is_drift)
        rates.append(rep.drift_rate)
        for i in rep.critical_indices:
            if int(idx[i]) not in seen:
                seen.add(int(idx[i]))
                rows.append(int(idx[i]))
    return flagged / n_windows, float(statistics.median(rates)), rows


def executor_pick(x: np.ndarray, rows: list[int], seed: int, holdout: float | None = None) -> list[int]:
    """The rows the Executor trains on: each input once (scanflow.standard.retraining.distinct_rows), minus its
    holdout (`holdout`, default scanflow.standard.retraining.HOLDOUT_FRACTION; a seeded permutation, as the
    Executor's per plan)."""
    from scanflow.standard.retraining import HOLDOUT_FRACTION, distinct_rows

    frac = HOLDOUT_FRACTION if holdout is None else holdout
    kept = [rows[i] for i in distinct_rows(x[rows])]
    order = np.random.default_rng(seed).permutation(len(kept))
    return [kept[i] for i in order[int(len(kept) * frac):]]


def measure(kind: str, severity: int, seed: int, ns: tuple[int, ...], old: object, detector: object,
            as_executor: bool = False, calibration_fraction: float | None = None,
            holdout: float | None = None, adapt: str = "moments") -> list[Row]:
    from scanflow.examples.digits.model import accuracy
    from scanflow.examples.digits.s1 import traffic_pools, unseen_test
    from scanflow.examples.digits.train import train_model

    splits = _splits()
    extra = {} if calibration_fraction is None else {"calibration_fraction": calibration_fraction}
    pool_x, pool_y = traffic_pools(kind, severity, splits=splits, **extra)["drifted"]  # type: ignore[arg-type]
    x_clean, x_drift, y = unseen_test(kind, severity, rng=1000 + seed, splits=splits)  # type: ignore[arg-type]
    old_clean, old_drifted = accuracy(old, x_clean, y), accuracy(old, x_drift, y)
    detected, rate, crit = critical_rows(detector, pool_x, WINDOW, np.random.default_rng(seed), N_WINDOWS)
    out = []
    for n in ns:
        pick = executor_pick(pool_x, crit[:n], seed, holdout) if as_executor else crit[:n]
        model, _, _ = train_model(splits, (pool_x[pick], pool_y[pick]), seed=seed, adapt=adapt)
        name = (f"{kind}/{severity}" + ("" if calibration_fraction is None else f"+cal{calibration_fraction:g}")
                + ("" if holdout is None else f"+hold{holdout:g}") + ("" if adapt == "moments" else f"+{adapt}"))
        out.append(Row(name, old_clean, old_drifted, detected, rate, len(pick),
                       accuracy(model, x_clean, y), accuracy(model, x_drift, y)))
    return out


_SPLITS: object = None


def _splits() -> object:
    global _SPLITS
    if _SPLITS is None:
        from scanflow.examples.digits.data import load_splits

        _SPLITS = load_splits(0)
    return _SPLITS


def medians(rows: list[Row]) -> Row:
    """Pure: the per-field medians of one candidate's rows (one per seed)."""
    med = {f: statistics.median(getattr(r, f) for r in rows)
           for f in ("old_clean", "old_drifted", "detected", "critical_rate", "new_clean", "new_drifted")}
    return Row(rows[0].candidate, n=int(statistics.median(r.n for r in rows)), **med)


def main() -> int:
    from scanflow.examples.digits.data import SENSOR_KINDS, SEVERITIES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n", default="150,300", help="critical points per retrain, comma-separated")
    ap.add_argument("--candidates", default=",".join(["noise/2"] + [f"{k}/{s}" for k in SENSOR_KINDS
                                                                       for s in SEVERITIES]))
    ap.add_argument("--quick", action="store_true", help="1 seed, N=300 only")
    ap.add_argument("--as-executor", action="store_true",
                    help="train as the Executor does: the first N critical rows made distinct, minus a 30 %% holdout")
    ap.add_argument("--calibration-traffic", default=None,
                    help="comma-separated shares of the calibration split the traffic also holds "
                         "(scanflow.examples.digits.s1.CALIBRATION_TRAFFIC_FRACTION; default: that constant)")
    ap.add_argument("--holdout", default=None,
                    help="with --as-executor: comma-separated holdout fractions to compare "
                         "(default: scanflow.standard.retraining.HOLDOUT_FRACTION)")
    ap.add_argument("--adapt", default="moments",
                    help="comma-separated retrain recipes to compare: moments (synthetic drifted copies of the "
                         "clean rows, the job's default) and/or none (scanflow.examples.digits.train.training_rows)")
    args = ap.parse_args()
    adapts = args.adapt.split(",")
    holdouts: list[float | None] = [None] if args.holdout is None else [float(v) for v in args.holdout.split(",")]
    fractions: list[float | None] = ([None] if args.calibration_traffic is None
                                     else [float(v) for v in args.calibration_traffic.split(",")])
    seeds = 1 if args.quick else args.seeds
    ns = (300,) if args.quick else tuple(int(v) for v in args.n.split(","))
    cands = [(c.split("/")[0], int(c.split("/")[1])) for c in args.candidates.split(",")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from scanflow.examples.digits.train import train_model

    from scanflow.drift import AutoencoderDriftDetector

    t0 = time.perf_counter()
    per: dict[tuple[str, int], list[Row]] = {}
    for seed in range(seeds):
        s = _splits()
        old, _, _ = train_model(s, seed=seed)
        det = AutoencoderDriftDetector(fpr=0.05, epochs=15, num_threads=1, seed=seed)
        det.fit(s.x_train, s.x_calibration)  # type: ignore[attr-defined]
        for (kind, sev), frac, hold, adapt in ((c, f, h, a) for c in cands for f in fractions for h in holdouts
                                               for a in adapts):
            for n, r in zip(ns, measure(kind, sev, seed, ns, old, det, args.as_executor, frac, hold, adapt),
                            strict=True):
                per.setdefault((r.candidate, n), []).append(r)
                print(f"seed {seed} {r.candidate} N {n}: trained on {r.n}, gap {r.gap:.1f} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    print(f"{'candidate':20s} {'N':>4s} {'old clean':>9s} {'old drift':>9s} {'drop':>5s} {'detect':>6s} "
          f"{'crit':>5s} {'new clean':>9s} {'new drift':>9s} {'gap':>5s} {'gap_self':>8s}")
    table = []
    for rows in per.values():
        m = medians(rows)
        table.append({**asdict(m), "drop": m.drop, "gap": m.gap, "gap_self": m.gap_self, "seeds": len(rows),
                      "gaps": [round(r.gap, 1) for r in rows], "trained_on": [r.n for r in rows]})
        print(f"{m.candidate:20s} {m.n:4d} {m.old_clean:9.3f} {m.old_drifted:9.3f} {m.drop:5.1f} {m.detected:6.2f} "
              f"{m.critical_rate:5.2f} {m.new_clean:9.3f} {m.new_drifted:9.3f} {m.gap:5.1f} {m.gap_self:8.1f}")
    print(json.dumps({"seeds": seeds, "seconds": round(time.perf_counter() - t0, 1), "rows": table}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
