"""Drift detection benchmark: power, false-positive rate across splits, latency; ours vs alibi-detect.

    .venv/bin/python benchmarks/drift.py --quick     # < 1 min on 2 cores, reduced counts (printed)
    .venv/bin/python benchmarks/drift.py             # full counts

For each independent split (a fresh random train / calibration / pool partition of digits, a fresh
autoencoder): clean windows (false-positive rate) and corrupted windows for every corruption and
severity (power), at window sizes 100 and 500. Windows are drawn without replacement from the
split's pool, so each is a simple random sample of digits never seen in training or calibration.
Side by side, in the same run and on the same windows: alibi-detect MMD and KS (backend pytorch)
with the same autoencoder's encoder as preprocess_fn, on fewer splits (MMD is slow). Medians for
latency. Last line: one JSON object of figures.
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


@dataclass
class Tally:
    """Outcomes and latencies of one detector, keyed by (window size, condition)."""

    hits: dict[tuple[int, str], list[bool]] = field(default_factory=dict)
    per_split_fp: dict[int, list[float]] = field(default_factory=dict)
    latency_s: dict[int, list[float]] = field(default_factory=dict)

    def add(self, w: int, cond: str, flagged: bool, seconds: float) -> None:
        self.hits.setdefault((w, cond), []).append(flagged)
        self.latency_s.setdefault(w, []).append(seconds)

    def rate(self, w: int, cond: str) -> float:
        v = self.hits.get((w, cond), [])
        return float(np.mean(v)) if v else float("nan")

    def power(self, w: int) -> float:
        vals = [self.rate(w, f"{k}/{s}") for k in KINDS for s in SEVERITIES]
        return float(np.nanmean(vals))

    def worst_split_fpr(self, w: int) -> float:
        v = self.per_split_fp.get(w, [])
        return float(max(v)) if v else float("nan")

    def latency_ms(self, w: int) -> float:
        v = self.latency_s.get(w, [])
        return 1000 * statistics.median(v) if v else float("nan")


def timed_predict(det: AutoencoderDriftDetector, x: np.ndarray) -> tuple[bool, float]:
    t0 = time.perf_counter()
    rep = det.predict(x)
    return rep.is_drift, time.perf_counter() - t0


def run_split(
    split: int,
    args: argparse.Namespace,
    x_all: np.ndarray,
    ours: Tally,
    others: dict[str, Tally],
    with_alibi: bool,
) -> None:
    rng = np.random.default_rng(1000 + split)
    perm = rng.permutation(len(x_all))
    tr, cal, pool = perm[: args.n_train], perm[args.n_train : args.n_train + args.n_cal], perm[
        args.n_train + args.n_cal :
    ]
    det = AutoencoderDriftDetector(epochs=args.epochs, seed=split).fit(x_all[tr], x_all[cal])
    alibi: dict[str, AutoencoderDriftDetector] = {}
    if with_alibi:
        for backend in ("mmd", "ks"):
            a = AutoencoderDriftDetector(backend=backend, epochs=args.epochs, seed=split)
            a.model, a.x_ref = det.model, det.x_ref  # same encoder, no retraining
            a.infer_threshold(x_all[cal])
            alibi[backend] = a
    for w in WINDOWS:
        fp = []
        n_clean = args.clean_per_split
        n_corrupt = args.corrupt_per_split
        if with_alibi:
            n_clean, n_corrupt = max(n_clean, args.alibi_clean), max(n_corrupt, args.alibi_corrupt)
        for i in range(n_clean):
            x = x_all[rng.choice(pool, w, replace=False)]
            if i < args.clean_per_split:
                flagged, dt = timed_predict(det, x)
                ours.add(w, "clean", flagged, dt)
                fp.append(flagged)
            if with_alibi and i < args.alibi_clean:
                for name, a in alibi.items():
                    others[name].add(w, "clean", *timed_predict(a, x))
        ours.per_split_fp.setdefault(w, []).append(float(np.mean(fp)))
        for kind in KINDS:
            for sev in SEVERITIES:
                for i in range(n_corrupt):
                    x = corrupt(x_all[rng.choice(pool, w, replace=False)], kind, sev, rng)
                    if i < args.corrupt_per_split:
                        ours.add(w, f"{kind}/{sev}", *timed_predict(det, x))
                    if with_alibi and i < args.alibi_corrupt:
                        for name, a in alibi.items():
                            others[name].add(w, f"{kind}/{sev}", *timed_predict(a, x))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="reduced counts and epochs, < 1 min")
    p.add_argument("--splits", type=int, default=None)
    args = p.parse_args()
    args.n_train, args.n_cal = 720, 450
    if args.quick:
        args.splits = args.splits or 20
        args.epochs, args.clean_per_split, args.corrupt_per_split = 10, 10, 5
        args.alibi_splits, args.alibi_clean, args.alibi_corrupt = 2, 5, 1
    else:
        args.splits = args.splits or 40
        args.epochs, args.clean_per_split, args.corrupt_per_split = 30, 10, 5
        args.alibi_splits, args.alibi_clean, args.alibi_corrupt = 10, 10, 3
    import torch

    torch.set_num_threads(2)
    with_alibi = alibi_available()
    x_all, _ = load_digits_scaled()
    print(
        f"drift benchmark{' (--quick: reduced counts, ' + str(args.epochs) + ' epochs)' if args.quick else ''}: "
        f"{args.splits} splits (train {args.n_train}, calibration {args.n_cal}, pool "
        f"{len(x_all) - args.n_train - args.n_cal}); per split {args.clean_per_split} clean and "
        f"{args.corrupt_per_split} corrupted windows per corruption/severity and window size"
    )
    if with_alibi:
        print(
            f"alibi-detect MMD/KS (encoder as preprocess_fn) on the first {args.alibi_splits} splits: "
            f"{args.alibi_clean} clean, {args.alibi_corrupt} per corruption/severity per split"
        )
    else:
        print("alibi-detect not installed: MMD/KS comparison skipped (pip install 'scanflow[alibi]')")
    ours = Tally()
    others = {"mmd": Tally(), "ks": Tally()}
    t0 = time.perf_counter()
    for split in range(args.splits):
        run_split(split, args, x_all, ours, others, with_alibi and split < args.alibi_splits)
        print(f"  split {split + 1}/{args.splits} done at {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0

    conds = ["clean"] + [f"{k}/{s}" for k in KINDS for s in SEVERITIES]
    names = ["ae"] + (["mmd", "ks"] if with_alibi else [])
    tallies = {"ae": ours, **others}
    for w in WINDOWS:
        print(f"\nwindow {w}: rate flagged (clean = FPR, else power); n windows in brackets")
        print(f"{'condition':<12}" + "".join(f"{n:>16}" for n in names))
        for c in conds:
            cells = []
            for n in names:
                t = tallies[n]
                cells.append(f"{t.rate(w, c):>10.2f} ({len(t.hits.get((w, c), [])):>3})")
            print(f"{c:<12}" + "".join(f"{cell:>16}" for cell in cells))
        print(f"{'mean power':<12}" + "".join(f"{tallies[n].power(w):>16.2f}" for n in names))
        print(f"{'latency ms':<12}" + "".join(f"{tallies[n].latency_ms(w):>16.2f}" for n in names))
        print(f"ae FPR per split: mean {np.mean(ours.per_split_fp[w]):.3f}, worst {ours.worst_split_fpr(w):.2f}")
    figures: dict[str, float | int | bool | None] = {
        "quick": bool(args.quick),
        "splits": args.splits,
        "seconds": round(elapsed, 1),
    }
    for w in WINDOWS:
        figures[f"latency_ms_w{w}"] = round(ours.latency_ms(w), 3)
        figures[f"fpr_w{w}"] = round(ours.rate(w, "clean"), 4)
        figures[f"fpr_worst_split_w{w}"] = round(ours.worst_split_fpr(w), 3)
        figures[f"power_w{w}"] = round(ours.power(w), 4)
        figures[f"power_noise1_w{w}"] = round(ours.rate(w, "noise/1"), 4)
        for n in ("mmd", "ks"):
            ok = with_alibi
            figures[f"{n}_power_w{w}"] = round(others[n].power(w), 4) if ok else None
            figures[f"{n}_fpr_w{w}"] = round(others[n].rate(w, "clean"), 4) if ok else None
            figures[f"{n}_latency_ms_w{w}"] = round(others[n].latency_ms(w), 3) if ok else None
        figures[f"speedup_vs_mmd_w{w}"] = (
            round(others["mmd"].latency_ms(w) / ours.latency_ms(w), 1) if with_alibi else None
        )
    print(f"\ntotal {elapsed:.1f} s")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
