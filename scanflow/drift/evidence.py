"""One window test over several kinds of evidence, at one controlled false-positive rate. Pure numpy.

Who calls it: `ReconstructionDriftDetector` (scanflow/drift/reconstruction.py) at calibration
(`CombinedNull.fit`, `min_window`) and per window (`CombinedNull.test`); scanflow/drift/feature_ks.py (the
per-feature KS test beside it and the null of the two together); benchmarks/drift.py.

Why: the autoencoder's reconstruction errors see changes that move rows off what it learnt (noise,
inverted or unfamiliar inputs) but not changes *along* the data (a mild contrast change, a dead input
column the model reconstructs as well as a live one), which a plain per-feature test sees. So the test
looks at four or five *families* of evidence, each a set of per-row values whose window mean is compared
with the calibration set's:

- `errors`: the log reconstruction error and its absolute deviation from the calibration median
  (location and spread, as `stats.window_test`);
- `inputs`: every column of the model's input space (pixels scaled to [0, 1]; standardised numeric
  columns and one-hot codes) and its absolute deviation from the calibration median (per-feature
  location and spread: what per-feature KS tests see);
- `latent`: every encoder output and its absolute deviation (what an MMD on the encoder outputs sees);
- `input_mean` (images only): each row's mean input and its absolute deviation (a change every pixel
  shares a little, such as a tone curve, adds up there; `ReconstructionDriftDetector._scores`);
- `error_tail`: whether the row's log error is above each of a few upper calibration quantiles, one-sided
  (a drift that hits a few rows hard moves the window's tail share, not its mean error).

Each component k is a z-test of the window mean against the calibration mean with the calibration's
standard deviation (floored, so a column constant in the calibration set stays testable), less a margin
for the calibration set's own sampling error (per deployment: `CombinedNull.fit`'s joint margins). The
means of the families that do not depend on the autoencoder come from every reference row, the others from
the calibration rows, each at its effective size (near-copies count once). A family's statistic
is its largest |z|; the window's is the smallest family p-value (min-p). Both are calibrated on the null
*jointly*: the component z's of a clean window are, by the central limit theorem, normal with the
correlation of the per-row values, so `draws` normal vectors with the calibration's correlation give the
null distribution of every family maximum and of the min-p, correlations between pixels, spreads and
families included (Bonferroni would throw that away and lose power). The window's p-value is the share
of null draws whose min-p is at least as small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

DRAWS = 4000  # null draws: p-values resolve to 1/4001, the family rates to ~0.3 % at 0.05
# A component's variance is at least VAR_FLOOR_ROWS / n_calibration (squared units of the model's input
# space, which is scaled: pixels in [0, 1], standardised columns, one-hot codes): one pseudo-row one unit
# out. A pixel that is 0 in every calibration image then moves z by ~1 per clean row that inks it,
# instead of making any such row infinitely significant.
VAR_FLOOR_ROWS = 1.0
# Families of the model's inputs alone: the training rows describe them as well as held-out rows do, so they
# are calibrated on both (`CombinedNull.fit`'s reference); the others need rows the autoencoder never saw.
INPUT_FAMILIES = ("inputs", "input_mean", "input_ecdf")
TOP_COMPONENTS = 5  # the report names this many most-shifted input columns


@dataclass(frozen=True)
class Layout:
    """Which columns of the per-row value matrix belong to which family, and which are one-sided."""

    families: tuple[str, ...]
    family_of: NDArray[np.int64]  # (K,) family index per component
    one_sided: NDArray[np.bool_]  # (K,) True: only an increase counts (errors with alternative "greater")
    # (K,) True: a 0/1 indicator whose window mean is a share, tested with the binomial (one-sided only)
    shares: NDArray[np.bool_] | None = None

    @classmethod
    def of(cls, sizes: Sequence[tuple[str, int]], one_sided: Sequence[int] = (), shares: Sequence[int] = ()) -> Layout:
        names = tuple(n for n, k in sizes if k > 0)
        fam = np.concatenate([np.full(k, i, dtype=np.int64) for i, (_, k) in enumerate(s for s in sizes if s[1] > 0)])
        mask = np.zeros(len(fam), dtype=bool)
        mask[list(one_sided)] = True
        share = np.zeros(len(fam), dtype=bool)
        share[list(shares)] = True
        if (share & ~mask).any():
            raise ValueError("share components must be one-sided")
        return cls(names, fam, mask, share if share.any() else None)


def row_values(blocks: Sequence[NDArray[np.float64]], medians: Sequence[NDArray[np.float64]]) -> NDArray[np.float64]:
    """Per-row values: for each block (n, k) its columns then their |x - calibration median|, side by side."""
    parts: list[NDArray[np.float64]] = []
    for b, m in zip(blocks, medians, strict=True):
        arr = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
        parts += [arr, np.abs(arr - m)]
    return np.concatenate(parts, axis=1)


FAMILIES = ("errors", "inputs", "latent", "input_mean")  # the blocks' families, in order (`layout_of`)


def layout_of(blocks: Sequence[NDArray[np.float64]], n_cuts: int, n_tails: int, alternative: str) -> Layout:
    """Pure: the layout of `values_of`: each block's columns and spreads, then `n_cuts` empirical-CDF points
    ("input_ecdf") and `n_tails` tail shares ("error_tail", one-sided: only more rows above an upper quantile
    is evidence; fewer is what a blur does, and the errors family sees that in the mean). With
    `alternative` "greater" the errors' location is one-sided too."""
    sizes = [(name, 2 * b.shape[1]) for name, b in zip(FAMILIES[:len(blocks)], blocks, strict=True)]
    sizes += [("input_ecdf", n_cuts), ("error_tail", n_tails)]
    before = sum(k for _, k in sizes[:-1])
    tail = list(range(before, before + n_tails))
    return Layout.of(sizes, one_sided=([0] if alternative == "greater" else []) + tail, shares=tail)


def values_of(blocks: Sequence[NDArray[np.float64]], medians: Sequence[NDArray[np.float64]],
              cuts: tuple[NDArray[np.int64], NDArray[np.float64]], tail_cuts: NDArray[np.float64]) -> NDArray[np.float64]:
    """Pure: per-row values of every family: `row_values` of the blocks (errors, model inputs, encoder outputs,
    row means), then the inputs' empirical CDF at the calibration's quartiles (`ecdf_cuts`), then whether the
    row's log error (blocks[0]) is above each tail cut (the window's exceedance shares)."""
    cols, thr = cuts
    return np.concatenate([row_values(blocks, medians), (blocks[1][:, cols] <= thr).astype(np.float64),
                           (blocks[0][:, :1] > tail_cuts).astype(np.float64)], axis=1)


ECDF_QUANTILES = (0.25, 0.5, 0.75)


def ecdf_cuts(x: NDArray[np.float64], quantiles: Sequence[float] = ECDF_QUANTILES
              ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """(columns, thresholds): each column's calibration quantiles, distinct, where the share of calibration
    values at or below lies strictly inside (0, 1). The window's share at or below each is its empirical
    CDF there: a few points of a per-feature KS test, which sees a change of shape or of a point mass (a
    pixel that is 0 less often under noise, grey levels moved by a tone curve) that means and spreads miss."""
    cols: list[int] = []
    thr: list[float] = []
    for j in range(x.shape[1]):
        for q in sorted(set(np.quantile(x[:, j], quantiles).tolist())):
            share = float(np.mean(x[:, j] <= q))
            if 0.0 < share < 1.0:
                cols.append(j)
                thr.append(q)
    return np.asarray(cols, dtype=np.int64), np.asarray(thr, dtype=np.float64)


@dataclass(frozen=True)
class CombinedNull:
    """The calibration's per-component mean and standard deviation, its effective size and margin per
    component, and the joint null of the family maxima and of the min-p (sorted draws)."""

    layout: Layout
    mean: NDArray[np.float64]  # (K,)
    sd: NDArray[np.float64]  # (K,) floored
    n: NDArray[np.float64]  # (K,) effective rows behind each mean (near-copies count once)
    family_null: NDArray[np.float64]  # (F, draws) sorted family maxima |z|
    minp_null: NDArray[np.float64]  # (draws,) sorted min-p
    margin: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))  # (K,) calibration SEs allowed

    @classmethod
    def fit(cls, values: NDArray[np.float64], layout: Layout, *, draws: int = DRAWS, seed: int = 0,
            n_eff: float | None = None, confidence: float = 0.0, reference: NDArray[np.float64] | None = None,
            reference_n: float | None = None, wide: NDArray[np.bool_] | None = None) -> CombinedNull:
        """From the calibration rows' per-row values (n, K).

        n_eff: the calibration's effective size (`copies.kish` of its groups of near-copies; None: its row
        count). reference, reference_n, wide: per-row values of more rows (every reference row, the
        training rows included), their effective size, and the components (`wide`) whose mean and spread
        are taken from them instead: those that do not depend on the autoencoder (inputs), which the
        training rows describe as well as held-out rows do. Three times the rows cut the calibration's
        own error by 1.7.

        confidence: the share of calibration sets (deployments) for which no component's calibration mean
        is off by more than its margin, so that the rate on clean windows is at most the stated one for
        that deployment. A margin per family, the `confidence` joint quantile of the family maxima of the
        calibration offsets, which are normal with the per-row correlation (the same draws as the window
        null): a per-component margin (the rule before) lets a family of 128 pixels keep ~13 offsets
        beyond it, and a deployment whose calibration drew a few of them flagged a third of its clean
        windows. 0: no margin."""
        v = np.asarray(values, dtype=np.float64)
        n, k = v.shape
        if n < 2:
            raise ValueError("need at least 2 calibration rows")
        if k != len(layout.family_of):
            raise ValueError(f"{k} components, layout has {len(layout.family_of)}")
        if not 0.0 <= confidence < 1.0:
            raise ValueError(f"confidence must be in [0, 1), got {confidence}")
        mean = v.mean(axis=0)
        var = np.maximum(v.var(axis=0, ddof=1), VAR_FLOOR_ROWS / n)
        sd = np.sqrt(var)
        std = (v - mean) / sd
        corr = (std.T @ std) / (n - 1)  # correlation with the floored variances (<= 1 on the diagonal)
        w, vec = np.linalg.eigh(corr)
        root = vec * np.sqrt(np.clip(w, 0.0, None))  # corr = root @ root.T
        z = np.random.default_rng(seed).standard_normal((draws, k)) @ root.T
        fam = _family_max(np.where(layout.one_sided, np.maximum(z, 0.0), np.abs(z)), layout)
        family_null = np.sort(fam, axis=0).T.copy()
        minp = _upper_p(fam, family_null).min(axis=1)
        sizes = np.full(k, float(n if n_eff is None else n_eff))
        if reference is not None and wide is not None and wide.any():
            ref = np.asarray(reference, dtype=np.float64)
            if ref.ndim != 2 or ref.shape[1] != k or len(ref) < 2:
                raise ValueError(f"reference values of shape {ref.shape}, expected (>= 2, {k})")
            mean = np.where(wide, ref.mean(axis=0), mean)
            sd = np.where(wide, np.sqrt(np.maximum(ref.var(axis=0, ddof=1), VAR_FLOOR_ROWS / len(ref))), sd)
            sizes = np.where(wide, float(len(ref) if reference_n is None else reference_n), sizes)
        margin = joint_margins(fam, confidence)[layout.family_of] if confidence > 0 else np.zeros(k)
        return cls(layout, mean, sd, sizes, family_null, np.sort(minp), margin)

    def z(self, window_means: NDArray[np.float64], n: float | NDArray[np.float64],
          margin: float | NDArray[np.float64] | None = None) -> NDArray[np.float64]:
        """Component z's of window means (shape (..., K)) of n rows (effective: near-copies count once),
        less `margin` calibration standard errors per component (None: this null's own margins).

        Share components (`Layout.shares`) get the normal score of their binomial mid-p value instead: a
        share of rare events (2 expected in 100 rows) is far from normal, and its upper tail under the
        normal approximation is several times too light, which would flag clean small windows."""
        allow = self.margin if margin is None else margin
        if np.any(np.asarray(allow) < 0):
            raise ValueError(f"margin must be >= 0, got {margin}")
        means = np.asarray(window_means, dtype=np.float64)
        d = means - self.mean
        slack = allow * self.sd / np.sqrt(self.n)
        excess = np.maximum(0.0, np.abs(d) - slack) / (self.sd / np.sqrt(n))
        signed = np.sign(d) * excess
        out = np.where(self.layout.one_sided, np.maximum(signed, 0.0), signed)
        shares = self.layout.shares
        if shares is not None:
            p0 = self.mean[shares] + np.broadcast_to(slack, self.mean.shape)[shares]
            rows = np.maximum(1.0, np.rint(np.broadcast_to(np.asarray(n, dtype=np.float64), self.mean.shape)[shares]))
            out[..., shares] = share_z(means[..., shares], rows, p0)
        return out

    def p_values(self, z: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(p per family (..., F), the window's p (...,)) of component z's (..., K)."""
        stat = _family_max(np.where(self.layout.one_sided, z, np.abs(z)), self.layout)
        p_fam = _upper_p(stat, self.family_null)
        minp = p_fam.min(axis=-1)
        # share of null draws with a min-p at least as small (the +1 keeps p > 0: a finite null)
        count = np.searchsorted(self.minp_null, minp, side="right")
        p = (count + 1.0) / (len(self.minp_null) + 1.0)
        # beyond every draw the resampled p is stuck at 1 / (draws + 1); there the Bonferroni bound (each
        # component's normal p times the components, valid whatever their correlation) says how far beyond
        bonf = self._bonferroni(z)
        p_fam = np.where(p_fam <= 1.0 / (self.family_null.shape[1] + 1.0), np.minimum(p_fam, bonf[1]), p_fam)
        return p_fam, np.where(count == 0, np.minimum(p, bonf[0]), p)

    def _bonferroni(self, z: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(the window's Bonferroni p over every component, per family (..., F)) from normal tails."""
        from scipy.special import ndtr

        tail = np.where(self.layout.one_sided, ndtr(-z), 2.0 * ndtr(-np.abs(z)))
        fam = np.empty((*z.shape[:-1], len(self.layout.families)))
        for f in range(len(self.layout.families)):
            members = self.layout.family_of == f
            fam[..., f] = np.minimum(1.0, tail[..., members].min(axis=-1) * members.sum())
        window = np.minimum(1.0, fam.min(axis=-1) * len(self.layout.families))
        return window, fam

    def test(self, values: NDArray[np.float64], margin: float | None = None, n_eff: float | None = None, *,
             partial: tuple[NDArray[np.bool_], NDArray[np.float64], float] | None = None) -> WindowEvidence:
        """One window's per-row values (n, K) against the null, less `margin` calibration standard errors
        (None: the null's own margins, `fit`'s confidence). n_eff: the window's effective size (its rows by
        default; fewer where the window repeats inputs: `copies.kish`). partial: (components, the values
        of some of the rows, their effective size): those components are judged on those rows alone (the
        autoencoder's families on the rows it never trained on); with no such row they carry no evidence."""
        v = np.asarray(values, dtype=np.float64)
        means = v.mean(axis=0)
        n = np.full(len(means), float(len(v) if n_eff is None else n_eff))
        if partial is not None:
            comps, rows, rows_n = partial
            if len(rows):
                means[comps] = np.asarray(rows, dtype=np.float64)[:, comps].mean(axis=0)
                n[comps] = rows_n
            else:
                means[comps] = self.mean[comps]
        z = self.z(means, n, margin)
        p_fam, p = self.p_values(z)
        return WindowEvidence(z, dict(zip(self.layout.families, (float(x) for x in p_fam), strict=True)), float(p))

    def resampled_fpr(self, values: NDArray[np.float64], n: int, fpr: float, *, draws: int, rng: np.random.Generator,
                      chunk: int = 250) -> float:
        """Rate at which windows of n rows resampled from the calibration's own values are flagged (no
        margin): the test's rate when its null is exactly true, normal approximation or not."""
        v = np.asarray(values, dtype=np.float64)
        flagged = 0
        for start in range(0, draws, chunk):
            m = min(chunk, draws - start)
            means = v[rng.integers(0, len(v), size=(m, n))].mean(axis=1)
            _, p = self.p_values(self.z(means, n, 0.0))
            flagged += int((p < fpr).sum())
        return flagged / draws


def joint_margins(fam: NDArray[np.float64], confidence: float) -> NDArray[np.float64]:
    """Pure: per-family margins (F,) from null draws of the family maxima (draws, F): each family's q-quantile,
    with one q for all, chosen so that a share `confidence` of the draws has every family within its margin.
    (Bisection on q: the share of draws inside every family's quantile rises with q.)"""
    f = np.asarray(fam, dtype=np.float64)
    lo, hi = confidence, 1.0
    for _ in range(30):
        q = (lo + hi) / 2.0
        inside = (f <= np.quantile(f, q, axis=0)).all(axis=1).mean()
        if inside >= confidence:
            hi = q
        else:
            lo = q
    return np.asarray(np.quantile(f, hi, axis=0))


def share_z(share: NDArray[np.float64], n: int | NDArray[np.float64], p0: NDArray[np.float64]) -> NDArray[np.float64]:
    """Pure: one-sided normal scores of shares of n rows against null rates p0: z = -ndtri(mid-p), the
    mid-p value P(X > k) + P(X = k) / 2 for X ~ Binomial(n, p0) and k the window's count; 0 at or below
    the expected count. Why not the normal approximation: its z exceeds 3.09 (one-sided 0.001) four times
    too often at 2 expected events. Why mid-p rather than the exact P(X >= k): the exact value stays under
    every level by up to a factor 3 at a few expected events (discreteness), the mid-p value is about at
    the level (3.09 at its rate, 2.33 at most 1.6 times it), and the window test's rate is checked on
    resampled windows anyway (`min_window`)."""
    from scipy.special import ndtri
    from scipy.stats import binom

    p = np.clip(np.asarray(p0, dtype=np.float64), 1e-12, 1.0 - 1e-12)
    k = np.rint(np.asarray(share, dtype=np.float64) * n)
    midp = binom.sf(k, n, p) + 0.5 * binom.pmf(k, n, p)
    z = -ndtri(np.clip(midp, 1e-300, 1.0))
    return np.where(k > n * p, np.clip(z, 0.0, 40.0), 0.0)


@dataclass(frozen=True)
class WindowEvidence:
    """One window's component z's, the p-value of each family and the window's p-value."""

    z: NDArray[np.float64]
    family_p: dict[str, float]
    p_value: float


def _family_max(stat: NDArray[np.float64], layout: Layout) -> NDArray[np.float64]:
    """(..., K) -> (..., F): the largest statistic within each family."""
    out = np.empty((*stat.shape[:-1], len(layout.families)))
    for f in range(len(layout.families)):
        out[..., f] = stat[..., layout.family_of == f].max(axis=-1)
    return out


def _upper_p(stat: NDArray[np.float64], sorted_null: NDArray[np.float64]) -> NDArray[np.float64]:
    """(..., F) family maxima -> the share of null draws at least as large, per family (with +1)."""
    draws = sorted_null.shape[1]
    out = np.empty(stat.shape)
    for f in range(sorted_null.shape[0]):
        above = draws - np.searchsorted(sorted_null[f], stat[..., f], side="left")
        out[..., f] = (above + 1.0) / (draws + 1.0)
    return out


def min_window(null: CombinedNull, values: NDArray[np.float64], fpr: float, *, sizes: Sequence[int],
               draws: int = 2000, seed: int = 0) -> int:
    """The smallest window size from which the combined test holds its rate on windows resampled from the
    calibration (fpr + 3 binomial standard errors), and every larger size in `sizes` too. The values are
    moved onto the null's means and spreads first."""
    tolerance = fpr + 3.0 * math.sqrt(fpr * (1.0 - fpr) / draws)
    gen = np.random.default_rng(seed)
    ordered = sorted({int(s) for s in sizes})
    smallest = ordered[-1]
    # the null's means and spreads may come from more rows than these (`CombinedNull.fit`'s reference):
    # moved onto them, the resampled windows are windows of a null that is exactly true
    v = np.asarray(values, dtype=np.float64)
    own_mean = v.mean(axis=0)
    own_sd = np.sqrt(np.maximum(v.var(axis=0, ddof=1), VAR_FLOOR_ROWS / len(v)))
    moved = (null.mean != own_mean) | (null.sd != own_sd)
    v = np.where(moved, null.mean + (v - own_mean) * (null.sd / own_sd), v)
    for n in reversed(ordered):
        if null.resampled_fpr(v, n, fpr, draws=draws, rng=gen) > tolerance:
            break
        smallest = n
    return smallest
