"""Drift detection benchmark: power, false-positive rate across splits, latency; ours vs alibi-detect.

    .venv/bin/python benchmarks/drift.py --quick     # < 1 min on 2 cores, reduced counts (printed)
    .venv/bin/python benchmarks/drift.py             # full counts (a few minutes)

A *split* is an independent draw of the reference: a random 720 digits train a fresh autoencoder;
the other 1,077 are held out. Per split and window size (100, 500):

- clean windows, "fresh" (the FPR figures): each window is a fresh random partition of the held-out
  rows into a calibration set (450) and a window (w rows, the rest unused); the detector is
  re-calibrated on that calibration set (`infer_threshold`, the public API) and tests the window.
  Given the split's autoencoder, windows are independent draws, so the per-split FPR is a real rate
  and the worst split says how much the FPR depends on the reference the autoencoder was fitted on.
  (C's first version drew 500-row windows without replacement from one 627-row pool against one
  calibration set: the windows of a split nearly coincided and flagged all or none.)
- clean windows, "bootstrap": one fixed calibration set, windows drawn *with replacement* from the
  627 rows held out from both. Reported too, for comparison: the pool's own sampling error adds
  variance no detector calibrated on other rows can know about, so this over-states the FPR of a
  test calibrated for fresh data (by about 1/627 against 1/450 + 1/500 in variance at w = 500).
- corrupted windows (power): a fixed calibration set; a random w of the other held-out rows,
  corrupted (noise, rotation, shift; severities 1-3, severity 1 mild enough that MMD misses it).

Side by side, in the same run, on the same windows: alibi-detect MMD and KS (backend pytorch) with
the split's encoder as preprocess_fn and the calibration rows as reference, on fewer windows (MMD is
a permutation test, ~0.4 s per window). Latency: median wall time of `predict` per window, one torch
thread (the detector's CPU time is printed too, since the machine is shared). Last line: JSON.
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

from scanflow.drift import AutoencoderDriftDetector, alibi_available
from workflows.digits.data import KINDS, SEVERITIES, corrupt, load_digits_scaled

WINDOWS = (100, 500)
N_TRAIN, N_CAL = 720, 450
QUICK_NOTE = (
    " --quick (reduced against the full run: 15 autoencoder epochs instead of 30, 20 splits instead of 40,"
    " 5 bootstrap windows instead of 10, alibi-detect on 1 split instead of 10 with 1 clean and 1 corrupted"
    " window per cell instead of 5 and 2: its columns are a rough indication only)"
)
CONDITIONS = ["clean"] + [f"{k}/{s}" for k in KINDS for s in SEVERITIES]


@dataclass
class Tally:
    """Outcomes and latencies of one detector, keyed by (window size, condition)."""

    hits: dict[tuple[int, str], list[bool]] = field(default_factory=dict)
    per_split: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    latency_s: dict[int, list[float]] = field(default_factory=dict)
    cpu_s: dict[int, list[float]] = field(default_factory=dict)

    def add(self, w: int, cond: str, flagged: bool, seconds: float, cpu: float) -> None:
        self.hits.setdefault((w, cond), []).append(flagged)
        self.latency_s.setdefault(w, []).append(seconds)
        self.cpu_s.setdefault(w, []).append(cpu)

    def close_split(self, w: int, cond: str, flags: list[bool]) -> None:
        if flags:
            self.per_split.setdefault((w, cond), []).append(float(np.mean(flags)))

    def n(self, w: int, cond: str) -> int:
        return len(self.hits.get((w, cond), []))

    def rate(self, w: int, cond: str) -> float:
        v = self.hits.get((w, cond), [])
        return float(np.mean(v)) if v else float("nan")

    def power(self, w: int) -> float:
        return float(np.nanmean([self.rate(w, f"{k}/{s}") for k in KINDS for s in SEVERITIES]))

    def worst_split(self, w: int, cond: str = "clean") -> float:
        v = self.per_split.get((w, cond), [])
        return float(max(v)) if v else float("nan")

    def latency_ms(self, w: int) -> float:
        v = self.latency_s.get(w, [])
        return 1000 * statistics.median(v) if v else float("nan")

    def cpu_ms(self, w: int) -> float:
        v = self.cpu_s.get(w, [])
        return 1000 * statistics.median(v) if v else float("nan")


def timed_predict(det: AutoencoderDriftDetector, x: np.ndarray) -> tuple[bool, float, float]:
    """(is_drift, wall seconds, CPU seconds of this thread) of one predict."""
    c0, t0 = time.thread_time(), time.perf_counter()
    rep = det.predict(x)
    return rep.is_drift, time.perf_counter() - t0, time.thread_time() - c0


def alibi_twins(det: AutoencoderDriftDetector, x_cal: np.ndarray) -> dict[str, AutoencoderDriftDetector]:
    """MMD and KS detectors sharing `det`'s trained autoencoder (no retraining), reference x_cal."""
    out = {}
    for backend in ("mmd", "ks"):
        a = AutoencoderDriftDetector(backend=backend, seed=det.seed)  # type: ignore[arg-type]
        a.model, a.x_ref = det.model, det.x_ref
        a.infer_threshold(x_cal)
        out[backend] = a
    return out


def run_split(
    split: int, args: argparse.Namespace, x_all: np.ndarray, tallies: dict[str, Tally], with_alibi: bool
) -> None:
    rng = np.random.default_rng(1000 + split)
    perm = rng.permutation(len(x_all))
    train, held = perm[:N_TRAIN], perm[N_TRAIN:]
    cal0, pool0 = held[:N_CAL], held[N_CAL:]
    det = AutoencoderDriftDetector(epochs=args.epochs, seed=split, num_threads=1).fit(
        x_all[train], x_all[cal0]
    )
    ours, boot = tallies["ae"], tallies["ae-bootstrap"]
    for w in WINDOWS:
        # clean, fresh partitions of the held-out rows (re-calibrated per window)
        flags: list[bool] = []
        alibi_flags: dict[str, list[bool]] = {"mmd": [], "ks": []}
        for i in range(args.clean):
            order = rng.permutation(held)
            cal, window = x_all[order[:N_CAL]], x_all[order[N_CAL : N_CAL + w]]
            det.infer_threshold(cal)
            f, dt, cpu = timed_predict(det, window)
            ours.add(w, "clean", f, dt, cpu)
            flags.append(f)
            if with_alibi and i < args.alibi_clean:
                for name, a in alibi_twins(det, cal).items():
                    r = timed_predict(a, window)
                    tallies[name].add(w, "clean", *r)
                    alibi_flags[name].append(r[0])
        ours.close_split(w, "clean", flags)
        for name, fl in alibi_flags.items():
            tallies[name].close_split(w, "clean", fl)
        # back to the split's fixed calibration set for the bootstrap FPR and the power
        det.infer_threshold(x_all[cal0])
        flags = []
        for _ in range(args.boot):
            f, dt, cpu = timed_predict(det, x_all[rng.choice(pool0, w, replace=True)])
            boot.add(w, "clean", f, dt, cpu)
            flags.append(f)
        boot.close_split(w, "clean", flags)
        twins = alibi_twins(det, x_all[cal0]) if with_alibi else {}
        for kind in KINDS:
            for sev in SEVERITIES:
                for i in range(args.corrupt):
                    x = corrupt(x_all[rng.choice(pool0, w, replace=False)], kind, sev, rng)
                    ours.add(w, f"{kind}/{sev}", *timed_predict(det, x))
                    if i < args.alibi_corrupt:
                        for name, a in twins.items():
                            tallies[name].add(w, f"{kind}/{sev}", *timed_predict(a, x))


def print_tables(tallies: dict[str, Tally], names: list[str]) -> None:
    for w in WINDOWS:
        print(f"\nwindow {w}: rate flagged (clean = FPR on fresh windows, else power); n windows in brackets")
        print(f"{'condition':<12}" + "".join(f"{n:>16}" for n in names))
        for c in CONDITIONS:
            cells = [f"{tallies[n].rate(w, c):>10.3f} ({tallies[n].n(w, c):>3})" for n in names]
            print(f"{c:<12}" + "".join(f"{cell:>16}" for cell in cells))
        print(f"{'mean power':<12}" + "".join(f"{tallies[n].power(w):>16.3f}" for n in names))
        print(f"{'latency ms':<12}" + "".join(f"{tallies[n].latency_ms(w):>16.2f}" for n in names))
        print(f"{'cpu ms':<12}" + "".join(f"{tallies[n].cpu_ms(w):>16.2f}" for n in names))
        ae, bt = tallies["ae"], tallies["ae-bootstrap"]
        print(
            f"ae FPR per split, fresh windows: mean {np.mean(ae.per_split[(w, 'clean')]):.3f}, worst "
            f"{ae.worst_split(w):.2f}; bootstrap from one pool, fixed calibration: mean "
            f"{bt.rate(w, 'clean'):.3f}, worst {bt.worst_split(w):.2f}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer epochs and alibi windows, < 1 min")
    p.add_argument("--splits", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None)
    args = p.parse_args()
    # full: >= 100 windows per corrupted cell, >= 200 fresh clean windows over >= 20 splits, per window size
    args.splits = args.splits or (20 if args.quick else 40)
    args.epochs = args.epochs or (15 if args.quick else 30)
    args.clean, args.boot, args.corrupt = (10, 5, 5) if args.quick else (10, 10, 3)
    args.alibi_splits, args.alibi_clean, args.alibi_corrupt = (1, 1, 1) if args.quick else (10, 5, 2)
    import torch

    torch.set_num_threads(1)  # the model is tiny; on 2 shared cores a second thread only contends
    with_alibi = alibi_available()
    x_all, _ = load_digits_scaled()
    print(
        f"drift benchmark{QUICK_NOTE if args.quick else ''}: "
        f"{args.splits} splits (train {N_TRAIN}, calibration {N_CAL}, held out {len(x_all) - N_TRAIN}), "
        f"autoencoder {args.epochs} epochs; per split and window size {args.clean} fresh clean, {args.boot} "
        f"bootstrap clean and "
        f"{args.corrupt} corrupted windows per corruption/severity; 1 torch thread"
    )
    if with_alibi:
        print(
            f"alibi-detect MMD/KS (encoder as preprocess_fn, calibration rows as reference) on the first "
            f"{args.alibi_splits} splits: {args.alibi_clean} fresh clean, {args.alibi_corrupt} per corruption/severity"
        )
    else:
        print("alibi-detect not installed: MMD/KS comparison skipped (pip install 'scanflow[alibi]')")
    tallies = {"ae": Tally(), "ae-bootstrap": Tally(), "mmd": Tally(), "ks": Tally()}
    t0 = time.perf_counter()
    for split in range(args.splits):
        run_split(split, args, x_all, tallies, with_alibi and split < args.alibi_splits)
        print(
            f"  split {split + 1}/{args.splits} done at {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    elapsed = time.perf_counter() - t0
    names = ["ae"] + (["mmd", "ks"] if with_alibi else [])
    print_tables(tallies, names)
    ours, mmd = tallies["ae"], tallies["mmd"]
    figures: dict[str, float | int | bool | None] = {
        "quick": bool(args.quick),
        "splits": args.splits,
        "epochs": args.epochs,
        "seconds": round(elapsed, 1),
    }
    for w in WINDOWS:
        figures[f"latency_ms_w{w}"] = round(ours.latency_ms(w), 3)
        figures[f"cpu_ms_w{w}"] = round(ours.cpu_ms(w), 3)
        figures[f"fpr_w{w}"] = round(ours.rate(w, "clean"), 4)
        figures[f"fpr_worst_split_w{w}"] = round(ours.worst_split(w), 3)
        figures[f"fpr_bootstrap_w{w}"] = round(tallies["ae-bootstrap"].rate(w, "clean"), 4)
        figures[f"power_w{w}"] = round(ours.power(w), 4)
        figures[f"power_noise1_w{w}"] = round(ours.rate(w, "noise/1"), 4)
        for n in ("mmd", "ks"):
            figures[f"{n}_power_w{w}"] = round(tallies[n].power(w), 4) if with_alibi else None
            figures[f"{n}_fpr_w{w}"] = round(tallies[n].rate(w, "clean"), 4) if with_alibi else None
            figures[f"{n}_latency_ms_w{w}"] = round(tallies[n].latency_ms(w), 3) if with_alibi else None
        figures[f"speedup_vs_mmd_w{w}"] = (
            round(mmd.latency_ms(w) / ours.latency_ms(w), 1) if with_alibi else None
        )
    print(f"\ntotal {elapsed:.1f} s")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
