"""The per-feature two-sample KS test beside the joint z-test, and the null of the two together. Pure numpy.

Who calls it: `ReconstructionDriftDetector` (scanflow/drift/reconstruction.py) at calibration
(`FeatureKS.fit`, `PairNull.fit`) and per window (`FeatureKS.test`, `PairNull.p_value`);
benchmarks/drift.py; the tests. The joint z-test (scanflow/drift/evidence.py) compares means and spreads;
this module compares each input column's whole distribution, and calibrates the smaller of the two
p-values on their joint null. Both nulls are Gaussian multiplier bootstraps over the calibration rows
(`Multipliers`), one weight per group of near-copies (scanflow/drift/copies.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from scanflow.drift import copies
from scanflow.drift.evidence import CombinedNull

# null draws of the feature KS test: ~1 s of fit per 450 x 64 calibration on a busy core; p-values
# resolve to 1/2001 (the Bonferroni bound takes over beyond every draw)
KS_DRAWS = 2000
# The smallest scale of a code column in the feature KS test (`FeatureKS.fit`): the null 95 % point of a 0/1
# column with 10 % ones, 1.96 sqrt(0.1 x 0.9). A rarer code is a count of a few events per window, whose tail
# is far heavier than the Gaussian bootstrap's (the share_z problem, for the KS test).
KS_SCALE_FLOOR = 1.96 * math.sqrt(0.1 * 0.9)
KOLMOGOROV_95 = 1.358  # the 95 % point of the supremum of a Brownian bridge: a continuous column's scale


@dataclass(frozen=True)
class Multipliers:
    """Gaussian multipliers for the calibration rows: one per group of near-copies, shared by its rows.

    A draw's weighted sum over the rows, times `factor`, has the null variance of the calibration's
    effective size: sum_i xi_i v_i sqrt(n_eff) / n, which is the familiar sum / sqrt(n) when every row
    is its own group."""

    rows_in: NDArray[np.int64] | None  # group per row (None: every row its own)
    groups: int
    n_eff: float
    factor: float

    @classmethod
    def of(cls, n: int, rows_in: NDArray[np.int64] | None) -> Multipliers:
        if rows_in is None or len(np.unique(rows_in)) == n:
            return cls(None, n, float(n), 1.0 / math.sqrt(n))
        if len(rows_in) != n:
            raise ValueError(f"{len(rows_in)} group labels for {n} calibration rows")
        lab, g = copies.group_weights(rows_in)
        n_eff = copies.kish(lab)
        return cls(lab, g, n_eff, math.sqrt(n_eff) / n)

    def draw(self, gen: np.random.Generator, count: int) -> NDArray[np.float64]:
        """(count, n) multipliers, centred over the rows."""
        xi = gen.standard_normal((count, self.groups))
        if self.rows_in is not None:
            xi = xi[:, self.rows_in]
        return xi - xi.mean(axis=1, keepdims=True)


# -- per-feature two-sample KS: the shape of each column's distribution --------------------------------
# Why a second test beside the joint z-test: a mean and a spread compare a column's first two moments,
# against the column's *overall* variance. A column whose distribution has steep parts (a mixture of
# narrow modes, a point mass such as the 0 of an un-inked pixel) can move a little along its axis, lose
# or gain a point mass, and keep its mean and spread within noise while its CDF moves a lot at one point;
# the KS statistic (the largest CDF gap) sees exactly that. Measured (docs/drift.md): a shift of every
# tabular column by 0.05 of its overall sd, a clipped column, mild pixel noise were all caught by
# per-feature KS and missed by the z-tests.
@dataclass(frozen=True)
class FeatureKS:
    """The calibration's columns, each sorted, each column's scale, the code groups and their scales, and
    the joint null of the largest scaled statistic (one per input column)."""

    sorted_cal: NDArray[np.float64]  # (n, K), each column sorted ascending
    # (K,): what each column's sqrt(n m / (n + m)) D_j is divided by: its own null 95 % point for a code
    # column, KOLMOGOROV_95 for the others (see `fit`)
    scale: NDArray[np.float64]
    max_null: NDArray[np.float64]  # (draws,) sorted: the largest unit statistic (`units`) of each null draw
    # the one-hot columns of each categorical input (a group counts as one column), and each group's null
    # 95 % point of its members' largest scaled statistic
    groups: tuple[NDArray[np.int64], ...] = ()
    group_scale: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    singles: NDArray[np.int64] | None = None  # the columns in no group (None: every column)
    n_eff: float | None = None  # the calibration's effective size (None: its row count)

    @classmethod
    def fit(cls, x_cal: NDArray[np.float64], *, codes: Sequence[Sequence[int]] = (), draws: int = KS_DRAWS,
            seed: int = 0, chunk: int = 500, rows_in: NDArray[np.int64] | None = None) -> FeatureKS:
        """Sort the calibration columns and draw the joint null of the largest unit statistic (`units`):
        S_j = sqrt(n m / (n + m)) D_j / scale_j per column, a code group's largest S_j over its own null
        95 % point.

        Under the null each column's scaled statistic tends to the supremum of a Brownian bridge run
        through that column's CDF, and the columns' bridges are correlated as the columns are. A
        Gaussian multiplier bootstrap draws exactly that: with centred normal weights xi on the
        calibration rows, G_j(t) = sum_i xi_i 1{x_ij <= t} / sqrt(n) at each distinct value t of
        column j (ties and point masses kept: the supremum runs over the values a column takes).
        A cumulative sum along each sorted column gives every t at once. Why not Bonferroni over
        the columns' own p-values: neighbouring pixels move together and pixels on a 1/16 grid take
        few values, so Bonferroni's rate is well under its level (alibi-detect's KSDrift, which uses
        it, flagged 0.017-0.025 of clean windows at 0.05); the joint null spends the whole level.

        Categorical inputs (`codes`: for each, the indices of its one-hot columns). A 0/1 column has one
        CDF jump, so its null supremum is |N(0, p (1 - p))|: 95 % point 1.96 sqrt(p (1 - p)), 0.70 at
        p = 0.15, half a continuous column's 1.358 (Kolmogorov's). Under the maximum of the raw
        statistics the continuous columns set the bar, and a category mix that moved one code by 4 of
        its own null sd was caught in 0.30-0.375 of 200-row windows (MMD: 0.475 on 40). So each code
        column is divided by its own null 95 % point, floored at KS_SCALE_FLOOR (a code in fewer than
        10 % of rows is a count of a few events, whose tail is far heavier than the Gaussian
        bootstrap's), and a categorical input's codes then count as ONE column: their largest, over that
        maximum's own null 95 % point. Measured: with every code a column of its own, 4 codes beside 9
        sensors took level from the sensors, and a one-sensor shift of 0.15 sd fell from 0.158 to 0.100
        of 200-row windows (0.367 to 0.233 at 500) over 6 deployments. Every other column is divided by
        KOLMOGOROV_95 (the raw maximum, as before, for them). Why not balance pixels the same way: they
        are mostly blank and sit on a 1/16 grid, and balanced they raised the clean-window rate on
        digits from 0.062 to 0.087 (200 rows) and 0.083 to 0.117 (500 rows) over 6 deployments, even floored.

        Near-copies (`rows_in`: the group of near-copies of each calibration row, `scanflow.drift.copies`):
        one multiplier per group, shared by its rows, and the effective size n_eff (`copies.kish`) in place
        of n: copies move the calibration's empirical CDF together, as one row would."""
        x = np.asarray(x_cal, dtype=np.float64)
        if x.ndim != 2 or len(x) < 2:
            raise ValueError(f"need a (n >= 2, K) calibration matrix, got shape {x.shape}")
        n, k = x.shape
        groups = tuple(np.asarray(sorted({int(j) for j in g}), dtype=np.int64) for g in codes if len(g))
        grouped = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
        if len(grouped) != len(set(grouped.tolist())) or (len(grouped) and (grouped.min() < 0 or grouped.max() >= k)):
            raise ValueError(f"codes {[g.tolist() for g in groups]}: expected disjoint column indices in [0, {k})")
        order = np.argsort(x, axis=0, kind="stable")
        srt = np.take_along_axis(x, order, axis=0)
        last = np.ones((n, k), dtype=bool)  # the last row of each run of equal values: where F jumps
        last[:-1] = srt[1:] != srt[:-1]
        gen = np.random.default_rng(seed)
        multipliers = Multipliers.of(n, rows_in)
        sups = np.zeros((draws, k))
        for start in range(0, draws, chunk):
            xi = multipliers.draw(gen, min(chunk, draws - start))
            for j in range(k):
                g = np.cumsum(xi[:, order[:, j]], axis=1)[:, last[:, j]]
                sups[start:start + len(xi), j] = np.abs(g).max(axis=1)
        sups *= multipliers.factor
        n_eff = multipliers.n_eff
        scale = np.full(k, KOLMOGOROV_95)
        if not groups:
            return cls(srt, scale, np.sort((sups / scale).max(axis=1)), n_eff=n_eff)
        scale[grouped] = np.maximum(np.quantile(sups[:, grouped], 0.95, axis=0), KS_SCALE_FLOOR)
        scaled = sups / scale
        group_scale = np.array([np.quantile(scaled[:, g].max(axis=1), 0.95) for g in groups])
        singles = np.setdiff1d(np.arange(k), grouped)
        max_null = np.sort(_units(scaled, singles, groups, group_scale).max(axis=-1))
        return cls(srt, scale, max_null, groups, group_scale, singles, n_eff)

    def units(self, scaled: NDArray[np.float64]) -> NDArray[np.float64]:
        """Scaled column statistics (..., K) -> one statistic per input column (..., U) (`_units`)."""
        if not self.groups:
            return scaled
        return _units(scaled, self.singles, self.groups, self.group_scale)

    def __post_init__(self) -> None:
        # each column's distinct calibration values and its empirical CDF there, once: `statistics` then
        # searches only the window (pixels take a few grey levels, so their columns shrink to a few values)
        cdfs: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = []
        n = len(self.sorted_cal)
        for j in range(self.sorted_cal.shape[1]):
            col = self.sorted_cal[:, j]
            last = np.ones(n, dtype=bool)
            last[:-1] = col[1:] != col[:-1]
            cdfs.append((col[last], (np.flatnonzero(last) + 1.0) / n))
        object.__setattr__(self, "_cdfs", cdfs)

    def statistics(self, window: NDArray[np.float64]) -> NDArray[np.float64]:
        """Each column's two-sample KS statistic D = max_t |F_window(t) - F_calibration(t)|, (K,).

        Both empirical CDFs are right-continuous step functions that only jump at observed values, so
        the largest gap is attained at one of the pooled values: at the calibration's distinct values
        (its CDF there is known from `__post_init__`) and at the window's."""
        w = np.sort(np.asarray(window, dtype=np.float64), axis=0)
        k = self.sorted_cal.shape[1]
        m = len(w)
        if m < 1 or w.ndim != 2 or w.shape[1] != k:
            raise ValueError(f"window shape {w.shape} against {k} calibration columns")
        out = np.empty(k)
        cdfs: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = self._cdfs  # type: ignore[attr-defined]
        for j, (values, cdf) in enumerate(cdfs):
            x = w[:, j]
            at_cal = cdf - np.searchsorted(x, values, side="right") / m
            idx = np.searchsorted(values, x, side="right")
            f_cal = np.where(idx > 0, cdf[np.maximum(idx - 1, 0)], 0.0)
            at_win = f_cal - np.searchsorted(x, x, side="right") / m
            out[j] = max(np.abs(at_cal).max(), np.abs(at_win).max())
        return out

    def p_values(self, d: NDArray[np.float64], m: float) -> NDArray[np.float64]:
        """Per-column asymptotic p-values of statistics `d` for a window of m rows (scipy's two-sample
        'asymp' method: the one-sample KS distribution at the effective size n m / (n + m)). Ties (a
        point mass, a code column) only make it conservative."""
        from scipy.stats import kstwo

        n = self.effective_n
        return np.asarray(kstwo.sf(np.asarray(d, dtype=np.float64), max(1, round(n * m / (n + m)))))

    @property
    def effective_n(self) -> float:
        """The calibration's effective size: its rows, or fewer where they are near-copies."""
        return float(len(self.sorted_cal) if self.n_eff is None else self.n_eff)

    def test(self, window: NDArray[np.float64], m_eff: float | None = None) -> tuple[NDArray[np.float64], float]:
        """(per-column D, the window's p-value): the share of joint null draws whose largest scaled
        statistic is at least the window's (+1 in both counts: a finite null). Beyond every draw, where
        that share is stuck at 1 / (draws + 1), the Bonferroni bound over the columns' asymptotic
        p-values (valid whatever their dependence) says how far beyond. m_eff: the window's effective
        size (its rows by default; fewer where it repeats inputs)."""
        d = self.statistics(window)
        n, m = self.effective_n, float(len(window) if m_eff is None else m_eff)
        stat = float(self.units(math.sqrt(n * m / (n + m)) * d / self.scale).max())
        p = float(self.p_of_stat(np.array([stat]))[0])
        if p <= 1.0 / (len(self.max_null) + 1.0):  # Bonferroni over every column's asymptotic p-value
            p = min(p, float(self.p_values(d, m).min()) * len(d))
        return d, min(1.0, p)

    def p_of_stat(self, stat: NDArray[np.float64]) -> NDArray[np.float64]:
        """Share of null draws whose largest scaled statistic is at least `stat` (+1 in both counts)."""
        above = len(self.max_null) - np.searchsorted(self.max_null, stat, side="left")
        return np.asarray((above + 1.0) / (len(self.max_null) + 1.0))



def _units(scaled: NDArray[np.float64], singles: NDArray[np.int64] | None, groups: Sequence[NDArray[np.int64]],
           group_scale: NDArray[np.float64]) -> NDArray[np.float64]:
    """Pure: scaled column statistics (..., K) -> (..., U): the columns in no group as they are, then each
    code group's largest over the group's scale."""
    s = np.asarray(scaled)
    parts = [s[..., singles]] + [s[..., g].max(axis=-1, keepdims=True) / gs
                                 for g, gs in zip(groups, group_scale, strict=True)]
    return np.concatenate(parts, axis=-1)


# -- the two tests together: one min-p, calibrated on their joint null ---------------------------------
# Why not Bonferroni over the joint z-test and the KS test (the rule before): both read the same rows, so
# under the null their p-values are positively dependent (a column whose mean moves by chance moves its CDF
# too), and min(p_joint, p_ks) < 0.025 happens less often than 0.05: measured on the coupled draws below,
# 0.036 on a sensors detector, 0.045 on a digits one. Calibrating the minimum on their joint null gives
# each test the level it may really have: 0.033 on that sensors detector, 0.027 on the digits one (where
# the two are nearly independent), instead of 0.025. PAIR_DRAWS: p-values resolve to 1/4001.
PAIR_DRAWS = 4000


@dataclass(frozen=True)
class PairNull:
    """The null of min(p_joint, p_ks) (sorted draws): the window's p-value is its share at or below."""

    minp_null: NDArray[np.float64]

    @classmethod
    def fit(cls, values: NDArray[np.float64], inputs: NDArray[np.float64], combined: CombinedNull,
            feature_ks: FeatureKS, *, draws: int = PAIR_DRAWS, seed: int = 0, chunk: int = 500,
            rows_in: NDArray[np.int64] | None = None) -> PairNull:
        """Coupled null draws of both tests from ONE Gaussian multiplier per calibration row.

        With centred normal weights xi on the n calibration rows, sum_i xi_i s_i / sqrt(n - 1) over the
        standardised per-row values s is exactly normal with the calibration's correlation (what
        `CombinedNull` draws through an eigendecomposition), and the same xi run through each sorted input
        column give the KS bridges (what `FeatureKS` draws). Each draw's p_joint and p_ks are read off the
        tests' own nulls, as a window's would be, so the minimum's null keeps their dependence. Near-copies
        (`rows_in`) share one multiplier, as in `FeatureKS.fit`."""
        v = np.asarray(values, dtype=np.float64)
        x = np.asarray(inputs, dtype=np.float64)
        n = len(v)
        if len(x) != n:
            raise ValueError(f"{n} rows of values against {len(x)} rows of inputs")
        std = (v - combined.mean) / combined.sd
        order = np.argsort(x, axis=0, kind="stable")
        srt = np.take_along_axis(x, order, axis=0)
        last = np.ones(x.shape, dtype=bool)  # where each column's empirical CDF jumps (ties kept)
        last[:-1] = srt[1:] != srt[:-1]
        one_sided = combined.layout.one_sided
        gen = np.random.default_rng(seed)
        multipliers = Multipliers.of(n, rows_in)
        out = np.empty(draws)
        for start in range(0, draws, chunk):
            xi = multipliers.draw(gen, min(chunk, draws - start))
            z = xi @ std * (multipliers.factor * math.sqrt(n / (n - 1)))
            _, p_joint = combined.p_values(np.where(one_sided, np.maximum(z, 0.0), z))
            sups = np.empty((len(xi), x.shape[1]))
            for j in range(x.shape[1]):
                g = np.cumsum(xi[:, order[:, j]], axis=1)[:, last[:, j]]
                sups[:, j] = np.abs(g).max(axis=1)
            best = feature_ks.units(sups * multipliers.factor / feature_ks.scale).max(axis=-1)
            out[start:start + len(xi)] = np.minimum(p_joint, feature_ks.p_of_stat(best))
        return cls(np.sort(out))

    def p_value(self, p_joint: float, p_ks: float) -> float:
        """The share of null draws whose min-p is at least as small (+1: a finite null). Beyond every draw,
        where that share is stuck at 1 / (draws + 1), the Bonferroni bound 2 min(p_joint, p_ks) (valid
        whatever their dependence) says how far beyond."""
        m = min(p_joint, p_ks)
        count = int(np.searchsorted(self.minp_null, m, side="right"))
        p = (count + 1.0) / (len(self.minp_null) + 1.0)
        if count == 0:
            p = min(p, 2.0 * m)
        return min(1.0, p)
