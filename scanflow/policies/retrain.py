"""When to retrain after drift, and whether the retrained model may replace the champion (S1).

Two pure policies, used by the Planner (retrain) and the Executor or Planner (promotion):

- `decide(ctx) -> (RetrainDecision, RetrainState)`: retrain when significant drift was seen in at
  least `k` of the last `m` drift windows, no retrain is running, and the cooldown since the last
  retrain has passed. A lone false positive (detectors here have FPR ~0.05) therefore never starts
  a retrain; after a retrain the window history is cleared, so the new model needs fresh evidence.
- `decide_promotion(challenger, champion, config) -> PromotionDecision`: promote when the challenger
  is better on drifted data by more than `min_gain_drifted`, and not worse on clean data than the
  champion by more than `clean_tolerance`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scanflow.policies.types import Decision


@dataclass(frozen=True)
class RetrainConfig:
    k: int = 2
    m: int = 3
    cooldown_s: float = 600.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.m:
            raise ValueError(f"need 1 <= k <= m, got k={self.k} m={self.m}")
        if self.cooldown_s < 0 or self.time_scale <= 0:
            raise ValueError("cooldown_s must be >= 0 and time_scale > 0")


@dataclass(frozen=True)
class RetrainState:
    windows: tuple[bool, ...] = ()  # verdicts of the last m drift windows, oldest first
    last_retrain_at: float | None = None


@dataclass(frozen=True)
class RetrainContext:
    """drift: the verdict of a new drift window (None = no new window this tick).

    retrain_running: a training job started earlier has not finished (observed, e.g. from the
    Executor). last_retrain_at: when a retrain last started, if known from outside (e.g. the store);
    the later of this and the state's own record counts.
    """

    now: float
    drift: bool | None = None
    drift_score: float | None = None
    retrain_running: bool = False
    last_retrain_at: float | None = None
    config: RetrainConfig = field(default_factory=RetrainConfig)
    state: RetrainState = field(default_factory=RetrainState)


@dataclass(frozen=True)
class RetrainDecision(Decision):
    retrain: bool = False


def decide(ctx: RetrainContext) -> tuple[RetrainDecision, RetrainState]:
    cfg, st = ctx.config, ctx.state
    windows = st.windows
    if ctx.drift is not None:
        windows = (windows + (bool(ctx.drift),))[-cfg.m:]
    drifted = sum(windows)
    known = [t for t in (st.last_retrain_at, ctx.last_retrain_at) if t is not None]
    last = max(known) if known else None
    since = None if last is None else ctx.now - last
    inputs = {"now": ctx.now, "drift": ctx.drift, "drift_score": ctx.drift_score,
              "drifted_windows": drifted, "windows": len(windows), "k": cfg.k, "m": cfg.m,
              "retrain_running": ctx.retrain_running, "since_last_retrain_s": since}
    state = RetrainState(windows=windows, last_retrain_at=st.last_retrain_at)
    if drifted < cfg.k:
        return RetrainDecision(f"no: drift in {drifted} of the last {len(windows)} windows < {cfg.k}",
                               inputs), state
    if ctx.retrain_running:
        return RetrainDecision("no: a retrain is already running", inputs), state
    cooldown = cfg.cooldown_s / cfg.time_scale
    if since is not None and since < cooldown:
        return RetrainDecision(f"no: last retrain {since:.0f}s ago < cooldown {cooldown:.0f}s", inputs), state
    return (
        RetrainDecision(f"retrain: drift in {drifted} of the last {len(windows)} windows >= {cfg.k}",
                        inputs, retrain=True),
        RetrainState(windows=(), last_retrain_at=ctx.now),
    )


@dataclass(frozen=True)
class Evaluation:
    """One model's score on clean data and on drifted data; higher is better.

    metric: "accuracy" (classifiers, in [0, 1]) or "r2" (regression: the coefficient of determination,
    at most 1; scale-free, so the same tolerances mean the same thing for any target's units)."""

    clean: float
    drifted: float
    version: str | None = None
    metric: str = "accuracy"

    def __post_init__(self) -> None:
        for name in ("clean", "drifted"):
            v = getattr(self, name)
            if not math.isfinite(v) or v > 1.0 or (self.metric == "accuracy" and v < 0.0):
                raise ValueError(f"{self.metric} {name} must be finite and at most 1 (accuracy: in [0, 1]), got {v}")


def score(task: str, y_true: Any, y_pred: Any) -> float:
    """Pure: accuracy for classification (labels compared as given, or as text when types differ),
    R^2 for regression (1 - SSE/SST; with constant targets, 1 for a perfect fit and 0 otherwise)."""
    yt = np.asarray(y_true)
    yp = np.asarray(y_pred)
    if yt.shape[0] != yp.shape[0] or yt.shape[0] == 0:
        raise ValueError(f"score: {yt.shape[0]} targets for {yp.shape[0]} predictions")
    if task == "regression":
        yt, yp = yt.astype(np.float64).reshape(-1), yp.astype(np.float64).reshape(-1)
        sse = float(((yt - yp) ** 2).sum())
        sst = float(((yt - yt.mean()) ** 2).sum())
        return (1.0 if sse == 0 else 0.0) if sst == 0 else 1.0 - sse / sst
    if yt.dtype.kind != yp.dtype.kind and not (yt.dtype.kind in "iu" and yp.dtype.kind in "iu"):
        yt, yp = yt.astype(str), yp.astype(str)
    return float((yt.reshape(-1) == yp.reshape(-1)).mean())


@dataclass(frozen=True)
class PromotionConfig:
    min_gain_drifted: float = 0.0  # the challenger must beat the champion on drifted data by more
    clean_tolerance: float = 0.01  # and may lose at most this much on clean data


@dataclass(frozen=True)
class PromotionDecision(Decision):
    promote: bool = False


def decide_promotion(
    challenger: Evaluation, champion: Evaluation | None, config: PromotionConfig | None = None
) -> PromotionDecision:
    cfg = config or PromotionConfig()
    inputs: dict[str, object] = {"challenger": challenger.__dict__.copy(),
                                 "champion": None if champion is None else champion.__dict__.copy(),
                                 "min_gain_drifted": cfg.min_gain_drifted,
                                 "clean_tolerance": cfg.clean_tolerance}
    if champion is None:
        return PromotionDecision("promote: there is no champion yet", inputs, promote=True)
    metric = challenger.metric
    gain = challenger.drifted - champion.drifted
    loss = champion.clean - challenger.clean
    if gain <= cfg.min_gain_drifted:
        return PromotionDecision(f"keep champion: drifted {metric} gain {gain:+.4f} <= {cfg.min_gain_drifted}",
                                 inputs)
    if loss > cfg.clean_tolerance + 1e-9:  # "at most": a loss of exactly the tolerance passes (float noise)
        return PromotionDecision(f"keep champion: clean {metric} loss {loss:.4f} > {cfg.clean_tolerance}",
                                 inputs)
    return PromotionDecision(f"promote: drifted {gain:+.4f}, clean {-loss:+.4f}", inputs, promote=True)
