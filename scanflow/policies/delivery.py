"""Progressive delivery of a challenger: when a shadow or canary stage advances, promotes or rolls back.

Who calls it: the Planner, on each tick of a delivery, with what the Tracker and the gateway measured
since the delivery began (`LiveFigures`). Pure, no I/O, no clock: the caller passes `now`.

The question each tick: is the challenger *not worse* than the champion by more than `margin` (in the
metric's own units: accuracy as a fraction, or the regression error), judged on the rows feedback
labelled? Every row a model answered and feedback labelled gives that model a score, higher is better
(`row_scores`: 1 or 0 for a class, minus the absolute error for a value). Two kinds of evidence:

- paired (shadow): the gateway mirrors a request to the challenger, so both models answered the same
  row; the score differences of those rows estimate the gap with little variance (the models agree on
  most rows, so most differences are 0);
- unpaired (canary): each model answered its own share of the traffic; the two means are compared.

The Planner looks again at every tick, for as long as the stage lasts. A fixed-sample test (a z-test at
95 %) repeated at every look would promote a challenger that is worse by the margin far more often than
5 % of the time: it only has to cross once. Each bound here is a confidence *sequence* instead, valid at
every count of labelled rows at once (Waudby-Smith, Arnold, Wu, Howard and Ramdas, "Time-uniform
central limit theory and asymptotic confidence sequences", Annals of Statistics 2024, the two-sided
asymptotic CS of their Proposition 2.5): with `t` rows of sample variance `s2`,

    radius(t) = sqrt( 2 (t s2 rho2 + 1) / (t^2 rho2) * log( sqrt(t s2 rho2 + 1) / alpha ) )

`rho2` only moves where the sequence is tightest (near `planned_labels` rows of unit variance); any
choice keeps the bound valid. The chance that a challenger worse than the champion by the margin is
ever promoted on that evidence stays near `1 - confidence` however often the Planner looks
(tests/policies/test_delivery.py simulates it). Paired and unpaired evidence each get half of alpha.

Errors and latency need no statistics to end a stage. The challenger's answers failing beyond
`max_error_rate` (once `min_timed_requests` of them were seen, or MIN_ERRORS failed: one timeout in the
first requests is not a verdict) roll back at once. Its p99 over the SLO (and over the champion's by more
than `latency_tolerance`) once enough of its requests were timed rolls back once it is *confirmed*: at a
later look, the p99 of its newest answers, every one of them answered after the breach was first seen,
breaks the same bounds. Why: a p99 of a few hundred answers is decided by its few slowest, and a burst
(mirrors queued behind a challenger that was slow for a moment while the machine was busy) is not the
model; a slow model breaks the bounds again on fresh answers, one window later.
A stage that waits for labels rolls back at its timeout: no evidence is no promotion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from scanflow.labels import same_label
from scanflow.policies.types import Decision

StageKind = Literal["shadow", "canary"]
MIN_ERRORS = 10  # failures that end a delivery before `min_timed_requests` answers (one timeout does not)
Action = Literal["hold", "advance", "promote", "rollback"]
Phase = Literal["running", "promoted", "rolled_back"]


@dataclass(frozen=True)
class OutcomeSums:
    """Running sums of per-row scores (or paired differences): all a confidence sequence needs, and
    what a caller can add to row by row without keeping the rows."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    @staticmethod
    def of(values: Sequence[float] | np.ndarray) -> OutcomeSums:
        v = np.asarray(values, dtype=float)
        return OutcomeSums(int(v.size), float(v.sum()), float(np.square(v).sum()))

    def plus(self, other: OutcomeSums) -> OutcomeSums:
        return OutcomeSums(self.n + other.n, self.total + other.total, self.total_sq + other.total_sq)

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    @property
    def variance(self) -> float:
        """The sample variance (divisor n: the estimator the confidence sequence is stated with)."""
        if self.n == 0:
            return math.nan
        return max(0.0, self.total_sq / self.n - self.mean**2)


def rho2_for(planned: float, alpha: float) -> float:
    """Pure: the tuning that makes the sequence tightest near `planned` rows of unit variance (the
    paper's closed form for the conjugate-mixture boundary)."""
    if planned <= 0 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need planned > 0 and 0 < alpha < 1, got planned={planned} alpha={alpha}")
    a = -2.0 * math.log(alpha)
    return (a + math.log(a + 1.0)) / planned


def radius(sums: OutcomeSums, alpha: float, planned: float) -> float:
    """Pure: half-width of the time-uniform (1 - alpha) confidence sequence for the mean of `sums`
    (infinite with no rows)."""
    if sums.n == 0:
        return math.inf
    rho2 = rho2_for(planned, alpha)
    v = sums.n * sums.variance * rho2 + 1.0
    return math.sqrt(2.0 * v / (sums.n**2 * rho2) * math.log(math.sqrt(v) / alpha))


def paired_bounds(diffs: OutcomeSums, alpha: float, planned: float) -> tuple[float, float]:
    """Pure: (low, high) bounds on challenger minus champion from paired score differences."""
    r = radius(diffs, alpha, planned)
    return (diffs.mean - r, diffs.mean + r) if diffs.n else (-math.inf, math.inf)


def unpaired_bounds(challenger: OutcomeSums, champion: OutcomeSums, alpha: float,
                    planned: float) -> tuple[float, float]:
    """Pure: (low, high) bounds on challenger minus champion from each model's own rows (half of alpha
    to each model's sequence: both hold at once with probability 1 - alpha)."""
    if challenger.n == 0 or champion.n == 0:
        return -math.inf, math.inf
    rc, rh = radius(champion, alpha / 2.0, planned), radius(challenger, alpha / 2.0, planned)
    gap = challenger.mean - champion.mean
    return gap - rc - rh, gap + rc + rh


def row_scores(task: str, predicted: Sequence[Any] | np.ndarray, truth: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Pure: one score per labelled row, higher is better: 1.0 for a right class and 0.0 for a wrong
    one (task "classification", labels compared as `same_label` does: 3, 3.0 and "3" are one class),
    minus the absolute error for a value ("regression")."""
    if len(predicted) != len(truth):
        raise ValueError(f"predicted ({len(predicted)} rows) and truth ({len(truth)} rows) differ in shape")
    if task == "classification":
        return np.array([same_label(a, b) for a, b in zip(predicted, truth, strict=True)], dtype=float)
    p, y = np.asarray(predicted), np.asarray(truth)
    if task == "regression":
        return -np.abs(p.astype(float) - y.astype(float))
    raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")


@dataclass(frozen=True)
class Stage:
    """One stage of a delivery. shadow: `share` of requests mirrored to the challenger, its answers
    recorded and never returned. canary: `share` of requests answered by the challenger. A stage ends
    after at least `min_seconds`, once the challenger has `min_labelled` labelled rows of its own (and,
    for a shadow stage or a canary with no shadow before it, once it is shown not worse); it rolls back
    at `timeout_s` when that has not happened. `min_labelled` counts the rows of the delivery so far:
    paired rows in shadow, the challenger's own answered rows in canary."""

    kind: StageKind
    share: float
    min_labelled: int = 200
    min_seconds: float = 30.0
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.kind not in ("shadow", "canary"):
            raise ValueError(f"stage kind must be 'shadow' or 'canary', got {self.kind!r}")
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"{self.kind} share must be in (0, 1], got {self.share}")
        if self.min_labelled < 0 or self.min_seconds < 0 or self.timeout_s <= self.min_seconds:
            raise ValueError(f"{self.kind} stage: need min_labelled >= 0, min_seconds >= 0 and "
                             f"timeout_s > min_seconds, got {self.min_labelled}, {self.min_seconds}, {self.timeout_s}")


@dataclass(frozen=True)
class DeliveryConfig:
    """The stages in order (full promotion after the last), the non-inferiority `margin` and
    `confidence`, the challenger's error budget, how many of its requests must have been timed before its
    p99 is held against the SLO, and `latency_tolerance`: how much slower than the champion's p99 on the same
    gateways over the same period (relative) a challenger that breaks the SLO may be before it is rolled back
    for latency. Why relative too: when the machine or the node is saturated, both models break the SLO, and
    the challenger's calls also cross one hop more (its own gateway or Service); that is not the model."""

    stages: tuple[Stage, ...] = (Stage("shadow", 1.0), Stage("canary", 0.1), Stage("canary", 0.5))
    margin: float = 0.02
    confidence: float = 0.95
    max_error_rate: float = 0.001
    min_timed_requests: int = 200
    planned_labels: float = 500.0
    latency_tolerance: float = 1.0

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a delivery needs at least one stage (or none at all: a direct swap)")
        if (self.margin < 0 or not 0.5 <= self.confidence < 1.0 or not 0.0 <= self.max_error_rate < 1.0
                or self.latency_tolerance < 0):
            raise ValueError(f"need margin >= 0, 0.5 <= confidence < 1, 0 <= max_error_rate < 1, latency_tolerance >= 0;"
                             f" got {self.margin}, {self.confidence}, {self.max_error_rate}, {self.latency_tolerance}")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence


@dataclass(frozen=True)
class LiveFigures:
    """What the deployed agents measured since the delivery began (cumulative).

    paired: score differences (challenger minus champion) of labelled rows both models answered
    (mirrored in shadow). challenger / champion: scores of labelled rows each answered to clients
    (canary). requests / errors / p99: the challenger's answers as the gateway saw them (mirrored ones
    in shadow), `timed` of them with a latency; champion_p99_ms: the champion's p99 on the same gateways over
    the same period, of `champion_timed` answers (None: not timed); slo_p99_ms: the service's SLO (None: none declared).
    agreement: the share of mirrored requests both models answered alike (reported, not judged: after a
    drift the challenger is meant to disagree)."""

    paired: OutcomeSums = field(default_factory=OutcomeSums)
    challenger: OutcomeSums = field(default_factory=OutcomeSums)
    champion: OutcomeSums = field(default_factory=OutcomeSums)
    requests: int = 0
    errors: int = 0
    timed: int = 0
    p99_ms: float | None = None
    slo_p99_ms: float | None = None
    agreement: float | None = None
    champion_p99_ms: float | None = None
    champion_timed: int = 0
    recent_p99_ms: float | None = None  # the challenger's p99 over its newest `recent_timed` answers
    recent_timed: int = 0
    champion_recent_p99_ms: float | None = None  # the champion's, over its newest answers


@dataclass(frozen=True)
class DeliveryState:
    """Where a delivery stands: the stage index, when that stage began, whether non-inferiority was
    shown, how it ended, and `slow_since_timed`: the challenger's timed answers when a latency breach was
    first seen (None: none pending confirmation)."""

    stage: int = 0
    stage_started: float | None = None
    shown_not_worse: bool = False
    phase: Phase = "running"
    slow_since_timed: int | None = None


@dataclass(frozen=True)
class DeliveryDecision(Decision):
    action: Action = "hold"
    stage: int = 0
    kind: StageKind | None = None
    share: float = 0.0


@dataclass(frozen=True)
class DeliveryContext:
    now: float
    figures: LiveFigures
    config: DeliveryConfig = field(default_factory=DeliveryConfig)
    state: DeliveryState = field(default_factory=DeliveryState)


def evidence(figures: LiveFigures, config: DeliveryConfig) -> dict[str, Any]:
    """Pure: the bounds on challenger minus champion from each kind of evidence, and the verdicts
    `not_worse` (some lower bound above -margin) and `worse` (some upper bound below -margin)."""
    alpha, planned = config.alpha / 2.0, config.planned_labels
    p_low, p_high = paired_bounds(figures.paired, alpha, planned)
    u_low, u_high = unpaired_bounds(figures.challenger, figures.champion, alpha, planned)
    return {
        "paired_rows": figures.paired.n, "paired_gap": _finite(figures.paired.mean),
        "paired_low": _finite(p_low), "paired_high": _finite(p_high),
        "challenger_rows": figures.challenger.n, "champion_rows": figures.champion.n,
        "unpaired_gap": _finite(figures.challenger.mean - figures.champion.mean)
        if figures.challenger.n and figures.champion.n else None,
        "unpaired_low": _finite(u_low), "unpaired_high": _finite(u_high),
        "margin": config.margin, "confidence": config.confidence,
        "not_worse": max(p_low, u_low) > -config.margin,
        "worse": min(p_high, u_high) < -config.margin,
    }


def _finite(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 6)


def failing(figures: LiveFigures, config: DeliveryConfig) -> str | None:
    """Pure: why the challenger's answers failing must end the delivery at once, or None."""
    enough = figures.requests >= config.min_timed_requests or figures.errors >= MIN_ERRORS
    if enough and figures.errors > config.max_error_rate * figures.requests:
        return (f"challenger failed {figures.errors} of {figures.requests} requests "
                f"(allowed {config.max_error_rate:.2%})")
    return None


def too_slow(p99: float | None, timed: int, champion: float | None, champion_timed: int, slo: float | None,
             config: DeliveryConfig) -> str | None:
    """Pure: why a challenger p99 of `timed` answers is too slow (over the SLO, and over the champion's
    p99 by more than `latency_tolerance` when enough of the champion's answers were timed), or None."""
    if slo is None or p99 is None or timed < config.min_timed_requests or p99 <= slo:
        return None
    if champion is None or champion_timed < config.min_timed_requests:  # nothing to compare with
        return f"challenger p99 {p99:.1f} ms over the SLO {slo:.1f} ms ({timed} requests timed)"
    if p99 > champion * (1.0 + config.latency_tolerance):
        return (f"challenger p99 {p99:.1f} ms over the SLO {slo:.1f} ms and over the champion's {champion:.1f} ms "
                f"by more than {config.latency_tolerance:.0%} ({timed} requests timed)")
    return None


def latency(figures: LiveFigures, config: DeliveryConfig, slow_since: int | None) -> tuple[str | None, int | None]:
    """Pure: (why the challenger goes for latency, or None; the new `slow_since_timed`).

    A breach of the p99 of its answers so far is only noted (its timed count kept); it is confirmed once
    the newest answers the gateway keeps a p99 of all came after it (`timed - slow_since >= recent_timed`)
    and their p99 breaks the bounds against the champion's newest; unconfirmed, the note is dropped. A
    gateway that reports no recent p99 (an older one) is judged on its p99 so far, `min_timed_requests`
    answers after the note."""
    fig = figures
    if slow_since is None:
        seen = too_slow(fig.p99_ms, fig.timed, fig.champion_p99_ms, fig.champion_timed, fig.slo_p99_ms, config)
        return None, (fig.timed if seen is not None else None)
    if fig.recent_p99_ms is None:
        p99, timed, champion, champion_timed = fig.p99_ms, fig.timed, fig.champion_p99_ms, fig.champion_timed
        fresh = config.min_timed_requests
    else:
        p99, timed, fresh = fig.recent_p99_ms, fig.recent_timed, fig.recent_timed
        champion = fig.champion_recent_p99_ms if fig.champion_recent_p99_ms is not None else fig.champion_p99_ms
        champion_timed = min(fig.champion_timed, fig.recent_timed)
    if timed < config.min_timed_requests or fig.timed - slow_since < fresh:
        return None, slow_since  # not enough fresh answers yet to confirm or clear it
    why = too_slow(p99, timed, champion, champion_timed, fig.slo_p99_ms, config)
    if why is None:
        return None, None
    return f"{why} on its newest answers, confirming the breach seen at {slow_since} timed", slow_since


def decide(ctx: DeliveryContext) -> tuple[DeliveryDecision, DeliveryState]:
    """Pure: one look at a running delivery. hold: keep the stage; advance: go to the next stage (its
    share in the decision); promote: the last stage passed, the challenger takes all traffic; rollback:
    the champion keeps it all, the challenger's replicas go."""
    cfg, st, fig = ctx.config, ctx.state, ctx.figures
    if st.phase != "running":
        return DeliveryDecision(f"delivery already {st.phase}", action="hold", stage=st.stage), st
    if st.stage >= len(cfg.stages):  # the declaration lost stages while this delivery ran past them
        return DeliveryDecision(f"stage {st.stage} is no longer declared ({len(cfg.stages)} stages)", action="rollback",
                                stage=st.stage), replace(st, phase="rolled_back")
    started = ctx.now if st.stage_started is None else st.stage_started
    st = replace(st, stage_started=started)
    stage = cfg.stages[st.stage]
    elapsed = max(0.0, ctx.now - started)
    ev = evidence(fig, cfg)
    shown = st.shown_not_worse or bool(ev["not_worse"])
    st = replace(st, shown_not_worse=shown)
    labelled = fig.paired.n if stage.kind == "shadow" else fig.challenger.n
    inputs = {**ev, "stage_kind": stage.kind, "share": stage.share, "elapsed_s": round(elapsed, 3),
              "labelled": labelled, "min_labelled": stage.min_labelled, "requests": fig.requests,
              "errors": fig.errors, "p99_ms": fig.p99_ms, "slo_p99_ms": fig.slo_p99_ms, "timed": fig.timed,
              "champion_p99_ms": fig.champion_p99_ms, "champion_timed": fig.champion_timed,
              "recent_p99_ms": fig.recent_p99_ms, "recent_timed": fig.recent_timed,
              "champion_recent_p99_ms": fig.champion_recent_p99_ms, "agreement": fig.agreement}

    def end(action: Action, reason: str) -> tuple[DeliveryDecision, DeliveryState]:
        phase: Phase = "rolled_back" if action == "rollback" else "promoted" if action == "promote" else "running"
        nxt = st.stage + 1 if action == "advance" else st.stage
        new_state = replace(st, stage=nxt, stage_started=ctx.now if action == "advance" else st.stage_started,
                            phase=phase)
        now_stage = cfg.stages[nxt]
        share = {"rollback": 0.0, "promote": 1.0}.get(action, now_stage.share)  # the challenger's share from now
        return DeliveryDecision(reason, inputs, action=action, stage=nxt, kind=now_stage.kind, share=share), new_state

    slow, slow_since = latency(fig, cfg, st.slow_since_timed)
    st = replace(st, slow_since_timed=slow_since)
    inputs["slow_since_timed"] = slow_since
    why = failing(fig, cfg) or slow
    if why is not None:
        return end("rollback", why)
    if ev["worse"]:
        return end("rollback", f"challenger worse than the champion by more than {cfg.margin} "
                               f"at {cfg.confidence:.0%} confidence")
    # a canary after a shadow stage needs no new proof (the shadow's holds, and "worse" above still
    # rolls back on its own rows); a canary with no shadow before it is judged on unpaired rows
    # a latency breach awaiting confirmation holds the stage: a slow model must not be promoted meanwhile
    if elapsed >= stage.min_seconds and labelled >= stage.min_labelled and shown and st.slow_since_timed is None:
        last = st.stage + 1 >= len(cfg.stages)
        return end("promote" if last else "advance",
                   f"{stage.kind} at {stage.share:.0%} passed after {elapsed:.0f} s: {labelled} labelled rows, "
                   f"not worse than the champion by more than {cfg.margin} at {cfg.confidence:.0%} confidence")
    if elapsed >= stage.timeout_s:
        missing = (f"{labelled} of {stage.min_labelled} labelled rows" if labelled < stage.min_labelled
                   else "no evidence that the challenger is not worse")
        return end("rollback", f"{stage.kind} stage timed out after {elapsed:.0f} s: {missing}")
    pending = "" if st.slow_since_timed is None else \
        f"; p99 over the bounds at {st.slow_since_timed} timed, confirming on fresh answers"
    return DeliveryDecision(f"{stage.kind} at {stage.share:.0%}: {labelled}/{stage.min_labelled} labelled rows, "
                            f"{elapsed:.0f}/{stage.min_seconds:.0f} s{pending}", inputs, action="hold", stage=st.stage,
                            kind=stage.kind, share=stage.share), st

