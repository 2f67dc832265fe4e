"""When to retrain after drift, and whether the retrained model may replace the champion (S1).

Two pure policies, used by the Planner (retrain) and the Executor or Planner (promotion):

- `decide(ctx) -> (RetrainDecision, RetrainState)`: retrain when the drift verdicts say so, no retrain
  is running, and the cooldown since the last retrain has passed. The verdicts are judged by
  - "cusum" (the default): a Bernoulli CUSUM on the windows' verdicts (scanflow/policies/sequential.py)
    whose alarm threshold is set from a target: `false_alarms_per_day` of stable traffic at the window
    rate the Planner observes (its own EWMA of the time between drift windows) for a detector that
    flags clean windows at its false-positive rate. At 0.2 windows a second and 0.1 false alarms a day
    the threshold is 10.2: 5 drifted windows in a row alarm (12.8 when only half of them are flagged),
    and stable traffic raises one alarm in ~195,000 windows;
  - "k_of_m": drift in at least `k` of the last `m` windows (the rule before: 2 of 3 at a 0.05 window
    rate alarms every ~130 stable windows, so only the cooldown stood between stable traffic and a
    retrain; kept for comparison, benchmarks/alarms.py).
  After a retrain the evidence is cleared, so the new model needs fresh evidence; and while that retrain
  is in flight, the verdicts of the detector version it answers (the old champion's, still arriving until
  the new one serves) are not evidence again: they only repeat the drift the retrain is for. They count
  again only after `retrain_timeout_s` (a challenger not promoted: the champion, its detector and the
  drift stay). Before, with a 60 s cooldown, the old champion's verdicts during a 60 s retrain planned a
  second one.
- `decide_promotion(challenger, champion, config) -> PromotionDecision`: promote when the challenger
  is better on drifted data by more than `min_gain_drifted`, and not worse on clean data than the
  champion by more than `clean_tolerance`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from scanflow.policies import sequential
from scanflow.policies.types import Decision

Rule = Literal["cusum", "k_of_m"]
RULES: tuple[str, ...] = ("cusum", "k_of_m")
RATE_ALPHA = 0.1  # EWMA weight of each new interval between drift windows in the window-rate estimate


@dataclass(frozen=True)
class RetrainConfig:
    """rule: "cusum" (default) or "k_of_m". cusum: `false_alarms_per_day` (the target on stable traffic),
    `window_fpr` (the detector's rate on clean windows when the verdict does not say it), `drift_power`
    (the flagged share of drifted windows the CUSUM is tuned to tell apart; a stronger drift alarms
    sooner), `default_window_s` (the time between windows assumed until two were seen), `min_arl0_windows`
    (a floor on windows between false alarms, whatever the rate). k_of_m: `k`, `m`."""

    k: int = 2
    m: int = 3
    cooldown_s: float = 600.0
    time_scale: float = 1.0
    rule: Rule = "cusum"
    false_alarms_per_day: float = 0.1
    window_fpr: float = 0.05
    drift_power: float = 0.5
    default_window_s: float = 5.0
    min_arl0_windows: float = 1000.0
    retrain_timeout_s: float = 1800.0  # a retrain's verdicts wait this long for the new champion's detector

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.m:
            raise ValueError(f"need 1 <= k <= m, got k={self.k} m={self.m}")
        if self.cooldown_s < 0 or self.time_scale <= 0:
            raise ValueError("cooldown_s must be >= 0 and time_scale > 0")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {list(RULES)}, got {self.rule!r}")
        if self.false_alarms_per_day <= 0 or self.default_window_s <= 0 or self.min_arl0_windows < 1 \
                or self.retrain_timeout_s < 0:
            raise ValueError("false_alarms_per_day and default_window_s must be > 0, min_arl0_windows >= 1, "
                             "retrain_timeout_s >= 0")
        sequential.Design(self.window_fpr, self.drift_power)  # ValueError unless 0 < window_fpr < drift_power < 1


@dataclass(frozen=True)
class RetrainState:
    windows: tuple[bool, ...] = ()  # verdicts of the last m drift windows, oldest first
    last_retrain_at: float | None = None
    cusum: float = 0.0  # the CUSUM statistic (rule "cusum")
    window_s: float | None = None  # EWMA of the seconds between drift windows
    last_window_at: float | None = None
    retrain_version: str | None = None  # the detector version whose verdicts the last retrain answers


@dataclass(frozen=True)
class RetrainContext:
    """drift: the verdict of a new drift window (None = no new window this tick).

    window_fpr: the detector's false-positive rate, as its verdict states it (None: the config's).
    version: the model version whose detector judged the window (None: not known).
    retrain_running: a training job started earlier has not finished (observed, e.g. from the
    Executor). last_retrain_at: when a retrain last started, if known from outside (e.g. the store);
    the later of this and the state's own record counts.
    """

    now: float
    drift: bool | None = None
    drift_score: float | None = None
    window_fpr: float | None = None
    version: str | None = None
    retrain_running: bool = False
    last_retrain_at: float | None = None
    config: RetrainConfig = field(default_factory=RetrainConfig)
    state: RetrainState = field(default_factory=RetrainState)


@dataclass(frozen=True)
class RetrainDecision(Decision):
    retrain: bool = False


def design_of(ctx: RetrainContext) -> sequential.Design:
    """The CUSUM's design: the verdict's own false-positive rate where it states one (below drift_power)."""
    p0 = ctx.window_fpr if ctx.window_fpr is not None and 0 < ctx.window_fpr < ctx.config.drift_power \
        else ctx.config.window_fpr
    return sequential.Design(p0, ctx.config.drift_power)


def answered(ctx: RetrainContext) -> bool:
    """Pure: this window was judged by the detector version a retrain still in flight answers (its verdicts
    wait for the new champion's detector, at most `retrain_timeout_s`)."""
    st, cfg = ctx.state, ctx.config
    return (st.retrain_version is not None and ctx.version is not None and ctx.version == st.retrain_version
            and st.last_retrain_at is not None
            and ctx.now - st.last_retrain_at < cfg.retrain_timeout_s / cfg.time_scale)


def observe(ctx: RetrainContext) -> RetrainState:
    """Pure: the state after this tick's window (verdict history, CUSUM, window rate), nothing reset. A window
    a retrain in flight answers (`answered`) moves only the window rate."""
    cfg, st = ctx.config, ctx.state
    if ctx.drift is None:
        return st
    window_s = st.window_s
    if st.last_window_at is not None and ctx.now > st.last_window_at:
        gap = ctx.now - st.last_window_at
        window_s = gap if window_s is None else (1 - RATE_ALPHA) * window_s + RATE_ALPHA * gap
    if answered(ctx):
        return replace(st, window_s=window_s, last_window_at=ctx.now)
    # a newer detector judged it: the retrain landed (or a version the Planner never saw serves)
    return RetrainState(windows=(st.windows + (bool(ctx.drift),))[-cfg.m:], last_retrain_at=st.last_retrain_at,
                        cusum=sequential.step(st.cusum, bool(ctx.drift), design_of(ctx)), window_s=window_s,
                        last_window_at=ctx.now,
                        retrain_version=st.retrain_version if ctx.version is None else None)


def alarm_threshold(ctx: RetrainContext, state: RetrainState) -> tuple[float, float, float]:
    """Pure: (h, ARL0 target in windows, windows per second) for the CUSUM at the observed window rate."""
    cfg = ctx.config
    window_s = state.window_s if state.window_s is not None else cfg.default_window_s / cfg.time_scale
    rate = 1.0 / max(window_s, 1e-3)
    arl0 = sequential.arl0_for(cfg.false_alarms_per_day, rate, cfg.min_arl0_windows)
    return sequential.threshold_for(arl0, design_of(ctx)), arl0, rate


def decide(ctx: RetrainContext) -> tuple[RetrainDecision, RetrainState]:
    cfg, st = ctx.config, ctx.state
    state = observe(ctx)
    known = [t for t in (st.last_retrain_at, ctx.last_retrain_at) if t is not None]
    last = max(known) if known else None
    since = None if last is None else ctx.now - last
    drifted = sum(state.windows)
    inputs: dict[str, Any] = {"now": ctx.now, "drift": ctx.drift, "drift_score": ctx.drift_score,
                              "drifted_windows": drifted, "windows": len(state.windows), "rule": cfg.rule,
                              "retrain_running": ctx.retrain_running, "since_last_retrain_s": since,
                              "version": ctx.version}
    if answered(ctx):
        return RetrainDecision(f"no: the retrain for version {ctx.version}'s drift is in flight; its verdicts wait "
                               "for the new champion's detector", inputs), state
    if cfg.rule == "k_of_m":
        inputs |= {"k": cfg.k, "m": cfg.m}
        evidence = f"drift in {drifted} of the last {len(state.windows)} windows"
        alarm = drifted >= cfg.k
        bar = f"{cfg.k}"
    else:
        h, arl0, rate = alarm_threshold(ctx, state)
        design = design_of(ctx)
        inputs |= {"cusum": round(state.cusum, 3), "threshold": round(h, 3), "arl0_windows": round(arl0),
                   "windows_per_s": round(rate, 4), "window_fpr": design.p0, "drift_power": design.p1,
                   "false_alarms_per_day": cfg.false_alarms_per_day}
        evidence = f"drift CUSUM {state.cusum:.2f}"
        alarm = state.cusum >= h
        bar = f"{h:.2f} (one false alarm per {arl0:,.0f} stable windows)"
    if not alarm:
        return RetrainDecision(f"no: {evidence} < {bar}", inputs), state
    if ctx.retrain_running:
        return RetrainDecision("no: a retrain is already running", inputs), state
    cooldown = cfg.cooldown_s / cfg.time_scale
    if since is not None and since < cooldown:
        return RetrainDecision(f"no: last retrain {since:.0f}s ago < cooldown {cooldown:.0f}s", inputs), state
    return (
        RetrainDecision(f"retrain: {evidence} >= {bar}", inputs, retrain=True),
        replace(state, windows=(), cusum=0.0, last_retrain_at=ctx.now, retrain_version=ctx.version),
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
