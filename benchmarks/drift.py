"""Drift detection benchmark: false-positive rate per deployment, power, latency; digits and a sensor table.

    .venv/bin/python benchmarks/drift.py --quick     # ~1-2 min on 2 shared cores, reduced counts (printed)
    .venv/bin/python benchmarks/drift.py             # full counts (several minutes)
    options: --splits N, --windows 200 500, --data digits sensors

A *split* is one deployment: a fresh reference draw trains an autoencoder and ONE calibration set
calibrates it, as `fit` does in production; then fresh clean windows (the per-split FPR, the rate that
deployment pages with) and corrupted windows (power) are tested against that fixed calibration.

- digits (1,797 images: too few to draw fresh 500-row windows beside a reference): 720 random digits
  train the autoencoder; the other 1,077 are the split's *population*. The calibration set (450) and
  every window are drawn from it with replacement, so calibration and windows are independent draws
  of one distribution, the calibration is fixed for the split, and windows are fresh. Corruptions:
  noise, rotation, shift at severities 1-3 (workflows/digits/data.py).
- sensors (workflows/sensors/data.py, generated, 10 columns, one a category code): each split
  generates its own reference (800 training, 500 calibration rows) and every window from new seeds.
  Drift: the sensor recalibration at strengths 0.05 / 0.1 / 0.2 of the scenario's (strength 1 puts
  temperature in degrees F, a schema violation rather than drift).

The previous rule (Welch, `stats.welch_location_scale`) is scored on the same windows from the
report's errors ("welch" column): before/after on identical data. alibi-detect MMD and KS (digits,
first split, few windows) as before. Latency: median wall time of `predict` at the detector's default
threads (1 for windows <= 1,000 rows). Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scanflow.drift import AutoencoderDriftDetector, TabularAutoencoderDriftDetector, alibi_available, stats
from scanflow.drift.reconstruction import ReconstructionDriftDetector
from workflows.digits.data import KINDS, SEVERITIES, corrupt, load_digits_scaled
from workflows.sensors import data as sensors

N_TRAIN, N_CAL = 720, 450
SENSOR_TRAIN, SENSOR_CAL = 800, 500
SENSOR_STRENGTHS = (0.05, 0.1, 0.2)


@dataclass
class Tally:
    """Outcomes and latencies of one rule on one data kind, keyed by (window size, condition)."""

    hits: dict[tuple[int, str], list[bool]] = field(default_factory=dict)
    per_split: dict[int, list[float]] = field(default_factory=dict)
    latency_s: dict[int, list[float]] = field(default_factory=dict)

    def add(self, w: int, cond: str, flagged: bool, seconds: float | None = None) -> None:
        self.hits.setdefault((w, cond), []).append(bool(flagged))
        if seconds is not None:
            self.latency_s.setdefault(w, []).append(seconds)

    def close_split(self, w: int, flags: list[bool]) -> None:
        self.per_split.setdefault(w, []).append(float(np.mean(flags)))

    def rate(self, w: int, cond: str) -> float:
        v = self.hits.get((w, cond), [])
        return float(np.mean(v)) if v else float("nan")

    def n(self, w: int, cond: str) -> int:
        return len(self.hits.get((w, cond), []))

    def power(self, w: int) -> float:
        cells = [c for (ww, c) in self.hits if ww == w and c != "clean"]
        return float(np.mean([self.rate(w, c) for c in cells])) if cells else float("nan")

    def worst_split(self, w: int) -> float:
        return float(max(self.per_split.get(w, [float("nan")])))

    def latency_ms(self, w: int) -> float:
        v = self.latency_s.get(w, [])
        return 1000 * statistics.median(v) if v else float("nan")


def welch_flag(det: ReconstructionDriftDetector, errors: np.ndarray) -> bool:
    """The previous rule on the same window: Welch location + Brown-Forsythe spread, Bonferroni."""
    assert det.calibration_errors is not None
    cal = stats.log_errors(det.calibration_errors)
    _, _, p_loc, p_sc = stats.welch_location_scale(
        stats.log_errors(errors), stats.NullStats.of(cal), stats.NullStats.of(stats.abs_deviations(cal))
    )
    return stats.bonferroni(p_loc, p_sc) < det.fpr


def score(det: ReconstructionDriftDetector, x: np.ndarray, w: int, cond: str, t: dict[str, Tally]) -> tuple[bool, bool]:
    t0 = time.perf_counter()
    rep = det.predict(x)
    dt = time.perf_counter() - t0
    assert rep.errors is not None
    old = welch_flag(det, rep.errors)
    t["ae"].add(w, cond, rep.is_drift, dt)
    t["welch"].add(w, cond, old)
    return rep.is_drift, old


def digits_split(split: int, args: argparse.Namespace, x_all: np.ndarray, t: dict[str, Tally]) -> None:
    rng = np.random.default_rng(1000 + split)
    perm = rng.permutation(len(x_all))
    population = x_all[perm[N_TRAIN:]]
    cal = population[rng.integers(0, len(population), N_CAL)]
    det = AutoencoderDriftDetector(epochs=args.epochs, seed=split).fit(x_all[perm[:N_TRAIN]], cal)
    t["ae"].min_windows.append(det.min_window)  # type: ignore[attr-defined]
    for w in args.windows:
        flags: list[tuple[bool, bool]] = []
        for _ in range(args.clean):
            flags.append(score(det, population[rng.integers(0, len(population), w)], w, "clean", t))
        t["ae"].close_split(w, [a for a, _ in flags])
        t["welch"].close_split(w, [b for _, b in flags])
        for kind in KINDS:
            for sev in SEVERITIES:
                for _ in range(args.corrupt):
                    x = corrupt(population[rng.integers(0, len(population), w)], kind, sev, rng)
                    score(det, x, w, f"{kind}/{sev}", t)
        if split < args.alibi_splits:
            alibi_cells(det, cal, population, w, rng, t)


def alibi_cells(det: AutoencoderDriftDetector, cal: np.ndarray, population: np.ndarray, w: int,
                rng: np.random.Generator, t: dict[str, Tally]) -> None:
    """alibi-detect MMD and KS sharing the split's autoencoder (calibration rows as reference)."""
    for backend in ("mmd", "ks"):
        a = AutoencoderDriftDetector(backend=backend, seed=det.seed)  # type: ignore[arg-type]
        a.model, a.x_ref = det.model, det.x_ref
        a.infer_threshold(cal)
        for _ in range(2):
            t0 = time.perf_counter()
            t[backend].add(w, "clean", a.predict(population[rng.integers(0, len(population), w)]).is_drift,
                           time.perf_counter() - t0)
        for kind in KINDS:
            for sev in SEVERITIES:
                x = corrupt(population[rng.integers(0, len(population), w)], kind, sev, rng)
                t0 = time.perf_counter()
                t[backend].add(w, f"{kind}/{sev}", a.predict(x).is_drift, time.perf_counter() - t0)


def sensors_split(split: int, args: argparse.Namespace, t: dict[str, Tally]) -> None:
    seed = 5000 + 1000 * split
    x_train, _ = sensors.generate(SENSOR_TRAIN, seed)
    x_cal, _ = sensors.generate(SENSOR_CAL, seed + 1)
    det = TabularAutoencoderDriftDetector(sensors.N_FEATURES, categorical=sensors.CATEGORICAL,
                                          epochs=args.tab_epochs, seed=split).fit(x_train, x_cal)
    t["ae"].min_windows.append(det.min_window)  # type: ignore[attr-defined]
    for w in args.windows:
        flags = [score(det, sensors.generate(w, seed + 10 + i)[0], w, "clean", t) for i in range(args.clean)]
        t["ae"].close_split(w, [a for a, _ in flags])
        t["welch"].close_split(w, [b for _, b in flags])
        for strength in SENSOR_STRENGTHS:
            for i in range(args.corrupt):
                x = sensors.recalibrate(sensors.generate(w, seed + 500 + i)[0], strength)
                score(det, x, w, f"recal/{strength}", t)


def print_tables(kind: str, t: dict[str, Tally], windows: list[int], names: list[str]) -> None:
    for w in windows:
        print(f"\n{kind}, window {w}: rate flagged (clean = FPR per deployment, else power); n windows in brackets")
        print(f"{'condition':<14}" + "".join(f"{n:>16}" for n in names))
        conds = sorted({c for (ww, c) in t["ae"].hits if ww == w}, key=lambda c: (c != "clean", c))
        for c in conds:
            cells = [f"{t[n].rate(w, c):>10.3f} ({t[n].n(w, c):>3})" for n in names]
            print(f"{c:<14}" + "".join(f"{cell:>16}" for cell in cells))
        print(f"{'mean power':<14}" + "".join(f"{t[n].power(w):>16.3f}" for n in names))
        print(f"{'latency ms':<14}" + "".join(f"{t[n].latency_ms(w):>16.2f}" for n in names))
        for n in ("ae", "welch"):
            v = t[n].per_split.get(w, [])
            print(f"{n} FPR per split: mean {np.mean(v):.3f}, worst {max(v):.3f}, "
                  f"splits above 0.15: {sum(x > 0.15 for x in v)} of {len(v)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer splits, epochs and windows")
    p.add_argument("--splits", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None, help="digits autoencoder epochs")
    p.add_argument("--windows", type=int, nargs="+", default=[200, 500])
    p.add_argument("--data", nargs="+", default=["digits", "sensors"], choices=["digits", "sensors"])
    args = p.parse_args()
    args.splits = args.splits or 20
    args.epochs = args.epochs or (15 if args.quick else 30)
    args.tab_epochs = 30 if args.quick else 60
    args.clean, args.corrupt = (40, 3) if args.quick else (60, 5)
    args.alibi_splits = (1 if alibi_available() else 0) if "digits" in args.data else 0
    import torch

    torch.set_num_threads(1)  # the model is tiny; on 2 shared cores a second thread only contends
    print(f"drift benchmark{' --quick' if args.quick else ''}: {args.splits} splits (deployments) per data kind, "
          f"windows {args.windows}; per split and window size {args.clean} fresh clean windows against the "
          f"split's one calibration set and {args.corrupt} per drift condition; digits {args.epochs} epochs, "
          f"sensors {args.tab_epochs}")
    figures: dict[str, object] = {"quick": bool(args.quick), "splits": args.splits, "windows": args.windows}
    t_start = time.perf_counter()
    for kind in args.data:
        t = {n: Tally() for n in ("ae", "welch", "mmd", "ks")}
        t["ae"].min_windows = []  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        x_all = load_digits_scaled()[0] if kind == "digits" else None
        for split in range(args.splits):
            if x_all is not None:
                digits_split(split, args, x_all, t)
            else:
                sensors_split(split, args, t)
            print(f"  {kind} split {split + 1}/{args.splits} at {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
        names = ["ae", "welch"] + (["mmd", "ks"] if args.alibi_splits and kind == "digits" else [])
        print_tables(kind, t, args.windows, names)
        mws = t["ae"].min_windows  # type: ignore[attr-defined]
        print(f"{kind} min_window over splits: {min(mws)}-{max(mws)}")
        out: dict[str, object] = {"seconds": round(time.perf_counter() - t0, 1), "min_window_max": max(mws)}
        for w in args.windows:
            out[f"fpr_w{w}"] = round(float(np.mean(t["ae"].per_split[w])), 4)
            out[f"fpr_worst_split_w{w}"] = round(t["ae"].worst_split(w), 3)
            out[f"power_w{w}"] = round(t["ae"].power(w), 4)
            out[f"latency_ms_w{w}"] = round(t["ae"].latency_ms(w), 3)
            out[f"welch_fpr_w{w}"] = round(float(np.mean(t["welch"].per_split[w])), 4)
            out[f"welch_fpr_worst_split_w{w}"] = round(t["welch"].worst_split(w), 3)
            out[f"welch_power_w{w}"] = round(t["welch"].power(w), 4)
            if "mmd" in names:
                out[f"mmd_power_w{w}"] = round(t["mmd"].power(w), 4)
                out[f"mmd_latency_ms_w{w}"] = round(t["mmd"].latency_ms(w), 3)
        figures[kind] = out
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
