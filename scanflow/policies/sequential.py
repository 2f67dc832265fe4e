"""A Bernoulli CUSUM on drift verdicts: how often stable traffic raises an alarm, bounded by design.

Who calls it: the retrain policy (scanflow/policies/retrain.py) on every drift window, benchmarks/alarms.py
and docs/drift.md's figures. Pure, no I/O.

Why: a window test flags clean windows at its false-positive rate p0 (0.05 by default), by chance, every
so often. A "k of the last m windows" rule turns that into a retrain every 1 / (C(m, k) p0^k) windows of
stable traffic: 2 of 3 at 0.05 is one every ~130 windows, minutes at a few windows a second. The CUSUM
accumulates the log-likelihood ratio of each verdict, drifted rate p1 against clean rate p0:

    S_t = max(0, S_{t-1} + (log(p1 / p0) if flagged else log((1 - p1) / (1 - p0))))

and alarms when S_t >= h. At p0 = 0.05, p1 = 0.5 a flagged window adds 2.30 and a clean one takes 0.64
away. Its average run length under stable traffic (ARL0, windows to a false alarm) and under drift (ARL1,
the detection delay) follow from h exactly: the statistic is a Markov chain, solved here on a fine grid
(`average_run_length`). `threshold_for` inverts it: the h that gives a target ARL0, for example one false
alarm in ten days at the window rate a deployment sees.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

GRID = 400  # states of the Markov chain between 0 and h: ARL within ~1 % of a 4,000-state solve
MAX_THRESHOLD = 60.0  # an h beyond this is no alarm at all (ARL0 beyond any horizon)


@dataclass(frozen=True)
class Design:
    """What the CUSUM tells apart: clean windows flagged at rate `p0`, drifted ones at `p1` (> p0)."""

    p0: float = 0.05
    p1: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.p0 < self.p1 < 1.0:
            raise ValueError(f"need 0 < p0 < p1 < 1, got p0={self.p0} p1={self.p1}")

    @property
    def up(self) -> float:
        """What a flagged window adds: log(p1 / p0)."""
        return math.log(self.p1 / self.p0)

    @property
    def down(self) -> float:
        """What a clean window adds (negative): log((1 - p1) / (1 - p0))."""
        return math.log((1.0 - self.p1) / (1.0 - self.p0))


def step(statistic: float, flagged: bool, design: Design) -> float:
    """Pure: the CUSUM after one more window."""
    return max(0.0, statistic + (design.up if flagged else design.down))


def average_run_length(h: float, rate: float, design: Design, *, grid: int = GRID) -> float:
    """Pure: expected windows from S = 0 to S >= h when each window is flagged independently at `rate`.

    The statistic lives on [0, h); on a grid of `grid` states each window moves it up or down by the
    design's steps (rounded to the grid), and the expected time to absorption solves (I - Q) t = 1."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    if h <= 0:
        return 1.0
    if rate == 0.0 and design.down < 0:  # never flagged: the statistic stays at 0 for ever
        return math.inf
    d = h / grid
    states = np.arange(grid) * d
    q = np.zeros((grid, grid))
    rows = np.arange(grid)
    for inc, prob in ((design.up, rate), (design.down, 1.0 - rate)):
        if prob == 0.0:
            continue
        nxt = np.maximum(0.0, states + inc)
        inside = nxt < h - 1e-12
        idx = np.minimum(np.rint(nxt / d).astype(int), grid - 1)
        np.add.at(q, (rows[inside], idx[inside]), prob)
    t = np.linalg.solve(np.eye(grid) - q, np.ones(grid))
    return float(t[0])


@functools.lru_cache(maxsize=256)
def _threshold(arl0: float, p0: float, p1: float) -> float:
    design = Design(p0, p1)
    lo, hi = 0.0, design.up
    while average_run_length(hi, p0, design) < arl0:
        lo, hi = hi, hi * 2.0
        if hi > MAX_THRESHOLD:
            return MAX_THRESHOLD
    for _ in range(40):
        mid = (lo + hi) / 2.0
        if average_run_length(mid, p0, design) < arl0:
            lo = mid
        else:
            hi = mid
    return hi


def threshold_for(arl0_windows: float, design: Design) -> float:
    """Pure: the smallest h whose ARL0 (windows to a false alarm at rate p0) is at least `arl0_windows`.
    Cached (the Planner asks on every window; the target moves only with the window rate)."""
    if arl0_windows < 1:
        raise ValueError(f"arl0_windows must be >= 1, got {arl0_windows}")
    # the target rounded to 2 significant digits: the cache stays small while the rate estimate moves
    target = float(f"{arl0_windows:.2g}")
    return _threshold(max(target, 1.0), round(design.p0, 6), round(design.p1, 6))


def arl0_for(false_alarms_per_day: float, windows_per_second: float, minimum: float = 1.0) -> float:
    """Pure: windows between false alarms for a target of `false_alarms_per_day` at a window rate."""
    if false_alarms_per_day <= 0 or windows_per_second <= 0:
        raise ValueError("false_alarms_per_day and windows_per_second must be > 0")
    return max(minimum, windows_per_second * 86400.0 / false_alarms_per_day)


def k_of_m_run_length(k: int, m: int, rate: float) -> float:
    """Pure: expected windows until `k` of the last `m` verdicts are drifted (the rule "k_of_m", history empty
    at the start), each window flagged independently at `rate`. A Markov chain on the last m verdicts."""
    if not 1 <= k <= m:
        raise ValueError(f"need 1 <= k <= m, got k={k} m={m}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    states: list[tuple[bool, ...]] = [()]
    index: dict[tuple[bool, ...], int] = {(): 0}
    for s in states:  # grows while new histories appear: every history of up to m verdicts below k drifted
        for v in (True, False):
            nxt = (s + (v,))[-m:]
            if sum(nxt) < k and nxt not in index:
                index[nxt] = len(states)
                states.append(nxt)
    q = np.zeros((len(states), len(states)))
    for i, s in enumerate(states):
        for v, prob in ((True, rate), (False, 1.0 - rate)):
            nxt = (s + (v,))[-m:]
            if sum(nxt) < k:
                q[i, index[nxt]] += prob
    try:
        t = np.linalg.solve(np.eye(len(states)) - q, np.ones(len(states)))
    except np.linalg.LinAlgError:  # rate 0: never
        return math.inf
    return float(t[0])
