"""The nulls a window is judged against, fitted once, and one window's verdict. Pure numpy.

Who calls it: `ReconstructionDriftDetector._calibrate` (`fit_nulls`, once per calibration) and `_verdict`
(`combined`, once per window; scanflow/drift/reconstruction.py). The nulls are the joint z-test's
(`evidence.CombinedNull`), the per-feature KS test's (`feature_ks.FeatureKS`) and their min-p's
(`feature_ks.PairNull`). Kept apart from the detector so the decision reads in one place: which rows
each null is fitted on and each family judges, at which effective size, and how the two tests'
p-values become one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scanflow.drift import copies, evidence, stats
from scanflow.drift.evidence import INPUT_FAMILIES, CombinedNull
from scanflow.drift.feature_ks import FeatureKS, PairNull


@dataclass(frozen=True)
class Rows:
    """Which rows a calibration has: the calibration rows' near-copy groups, and, where the training rows
    are known apart from them, the values, model inputs and groups of every reference row (training
    rows and calibration rows together, for the families that do not depend on the autoencoder)."""

    cal_groups: NDArray[np.int64] | None
    ref_values: NDArray[np.float64] | None = None
    ref_inputs: NDArray[np.float64] | None = None
    ref_groups: NDArray[np.int64] | None = None


def fit_nulls(values: NDArray[np.float64], inputs: NDArray[np.float64], layout: evidence.Layout, rows: Rows, *,
              codes: list[list[int]], confidence: float, fpr: float, seed: int
              ) -> tuple[CombinedNull, FeatureKS, PairNull, int]:
    """Pure: (the joint z-test's null, the KS test's, their min-p's, min_window) from the calibration rows'
    per-row values and model inputs. The input families and the KS test take every reference row where
    they are known (a training row's pixels are as much a sample as a held-out row's; three times the
    rows cut the calibration's error by 1.7); the autoencoder's families only the calibration rows."""
    cal_n = copies.kish(rows.cal_groups) if rows.cal_groups is not None else None
    null = CombinedNull.fit(values, layout, seed=seed, n_eff=cal_n, confidence=confidence,
                            reference=rows.ref_values,
                            reference_n=None if rows.ref_groups is None else copies.kish(rows.ref_groups),
                            wide=~model_components(layout))
    ks = FeatureKS.fit(inputs if rows.ref_inputs is None else rows.ref_inputs, codes=codes, seed=seed,
                       rows_in=rows.cal_groups if rows.ref_groups is None else rows.ref_groups)
    pair = PairNull.fit(values, inputs, null, ks, seed=seed, rows_in=rows.cal_groups)
    return null, ks, pair, evidence.min_window(null, values, fpr, sizes=stats.WINDOW_GRID, seed=seed)


@dataclass(frozen=True)
class Verdict:
    """The window's p-value, each family's, and what the report says of how it was reached."""

    p_value: float
    family_p: dict[str, float]
    z: NDArray[np.float64]
    meta: dict[str, Any] = field(default_factory=dict)


def model_components(layout: evidence.Layout) -> NDArray[np.bool_]:
    """Pure: the components that depend on the autoencoder (its errors and encoder outputs)."""
    return ~np.isin(layout.family_of, [i for i, f in enumerate(layout.families) if f in INPUT_FAMILIES])


def combined(null: CombinedNull, ks: FeatureKS | None, pair: PairNull | None, values: NDArray[np.float64],
             inputs: NDArray[np.float64] | None, tested: NDArray[np.bool_], seen: NDArray[np.bool_],
             rows_in: NDArray[np.int64] | None) -> Verdict:
    """Pure: the window's verdict over the rows inside the reference's range (`tested`).

    Near-copies in the window count once (`rows_in`, their groups): the standard errors of its means and
    of its empirical CDFs follow its effective size, not its row count. Rows that copy a row the
    autoencoder trained on (`seen`) reconstruct from memory: its families judge the other rows only,
    so traffic replaying reference inputs does not read as "errors down"; the input families and the
    KS test judge every row. The two tests' smaller p-value is calibrated on their joint null (`pair`;
    Bonferroni without one)."""
    def size(mask: NDArray[np.bool_]) -> float:
        return copies.kish(rows_in[mask]) if rows_in is not None and mask.any() else float(mask.sum())

    m_eff = size(tested)
    seen = seen & tested
    partial = None
    if seen.any():
        unseen = tested & ~seen
        partial = (model_components(null.layout), values[unseen], size(unseen))
    ev = null.test(values[tested], None, m_eff, partial=partial)
    family_p = dict(ev.family_p)
    meta: dict[str, Any] = {"seen_rows": int(seen.sum())}
    p_value = ev.p_value
    if ks is not None and inputs is not None:
        _, p_ks = ks.test(inputs[tested], m_eff)
        family_p["feature_ks"] = p_ks
        meta.update(p_joint=ev.p_value, p_feature_ks=p_ks)
        p_value = pair.p_value(ev.p_value, p_ks) if pair is not None else stats.bonferroni(ev.p_value, p_ks)
    return Verdict(p_value, family_p, ev.z, meta)


def shifted_inputs(layout: evidence.Layout, z: NDArray[np.float64], column_of: Callable[[int], int]
                   ) -> list[dict[str, float]]:
    """Pure: the row columns whose input location or spread moved most, `[{column, z}]` (at most
    `evidence.TOP_COMPONENTS`; `column_of` maps a column of the model's input space to its row column)."""
    if "inputs" not in layout.families:
        return []
    idx = np.flatnonzero(layout.family_of == layout.families.index("inputs"))
    width = len(idx) // 2
    both = np.maximum(np.abs(z[idx[:width]]), np.abs(z[idx[width:]]))
    out: dict[int, float] = {}  # a row column (a code column has one encoded column per code) -> largest z
    for c in np.argsort(-both):
        if both[c] <= 0 or len(out) >= evidence.TOP_COMPONENTS:
            break
        out.setdefault(column_of(int(c)), round(float(both[c]), 2))
    return [{"column": c, "z": v} for c, v in out.items()]
