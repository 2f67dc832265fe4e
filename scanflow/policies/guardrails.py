"""Guardrails that wrap every replica-count policy the same way.

A policy computes a raw desired replica count (its own logic); `apply_guardrails` then runs the same
steps for all of them, in order, and says which step held or changed the value:

1. cold start: right after the controller starts, never scale down (its metrics are not yet trusted);
2. bounds: clamp to [min_replicas, max_replicas]; a current count outside the bounds is corrected at
   once, whatever the other rules say;
3. hysteresis: act only after `up_ticks` / `down_ticks` consecutive ticks in one direction, and after
   the streak has lasted `up_delay_s` / `down_delay_s` (a change of direction resets both);
4. cooldown: no scale-down within `cooldown_down_s` of the last change, no scale-up within
   `cooldown_up_s` of it;
5. max step: move by at most `max_step_up` / `max_step_down` replicas in one decision.

Every duration is divided by `time_scale`, so a whole run can be shortened (benchmarks, tests)
while keeping the same shape. Who calls it: `autoscale.decide` and `hpa.decide`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scanflow.policies.types import Streak


@dataclass(frozen=True)
class Guardrails:
    """Limits on how a replica count may move. Durations are nominal seconds (see `time_scale`)."""

    min_replicas: int = 1
    max_replicas: int = 8
    up_ticks: int = 1
    down_ticks: int = 1
    up_delay_s: float = 0.0
    down_delay_s: float = 0.0
    cooldown_up_s: float = 0.0
    cooldown_down_s: float = 0.0
    max_step_up: int | None = None
    max_step_down: int | None = None
    cold_start_s: float = 0.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError(
                f"bounds must satisfy 0 <= min_replicas <= max_replicas and max_replicas >= 1, "
                f"got min={self.min_replicas} max={self.max_replicas}"
            )
        if self.up_ticks < 1 or self.down_ticks < 1:
            raise ValueError(f"up_ticks and down_ticks must be >= 1, got {self.up_ticks}, {self.down_ticks}")
        for name in ("max_step_up", "max_step_down"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {v}")
        for name in ("up_delay_s", "down_delay_s", "cooldown_up_s", "cooldown_down_s", "cold_start_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")

    def scaled(self, seconds: float) -> float:
        return seconds / self.time_scale


@dataclass(frozen=True)
class GuardState:
    """What the guardrails remember between ticks (goes in and out of every decide call)."""

    streak: Streak = field(default_factory=Streak)
    last_change_at: float | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class GuardOutcome:
    replicas: int
    step: str  # which guardrail decided: "bounds", "cold-start", "hysteresis", "cooldown", "max-step", "pass", "steady"
    detail: str
    state: GuardState


def clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def apply_guardrails(
    raw_desired: int, current: int, now: float, cfg: Guardrails, state: GuardState
) -> GuardOutcome:
    """The guarded replica count for this tick, with the step that decided and the new state."""
    started = state.started_at if state.started_at is not None else now
    state = replace(state, started_at=started)
    # Bounds first for the current value itself: a count outside the bounds is corrected now.
    bounded_current = clamp(current, cfg.min_replicas, cfg.max_replicas)
    if bounded_current != current:
        return GuardOutcome(
            bounded_current, "bounds",
            f"current {current} outside [{cfg.min_replicas}, {cfg.max_replicas}]",
            replace(state, streak=Streak(), last_change_at=now),
        )
    desired = clamp(raw_desired, cfg.min_replicas, cfg.max_replicas)
    clamped_note = f" (raw {raw_desired} clamped)" if desired != raw_desired else ""
    direction = (desired > current) - (desired < current)
    streak = state.streak.update(direction, now)
    state = replace(state, streak=streak)
    if direction == 0:
        return GuardOutcome(current, "steady", f"desired {desired} == current{clamped_note}", state)
    if direction < 0 and now - started < cfg.scaled(cfg.cold_start_s):
        return GuardOutcome(
            current, "cold-start",
            f"no scale-down in the first {cfg.scaled(cfg.cold_start_s):g}s after start", state,
        )
    ticks, delay = (cfg.up_ticks, cfg.up_delay_s) if direction > 0 else (cfg.down_ticks, cfg.down_delay_s)
    if streak.count < ticks or streak.age(now) < cfg.scaled(delay):
        return GuardOutcome(
            current, "hysteresis",
            f"{'up' if direction > 0 else 'down'} streak {streak.count}/{ticks} ticks, "
            f"{streak.age(now):g}/{cfg.scaled(delay):g}s",
            state,
        )
    cooldown = cfg.cooldown_up_s if direction > 0 else cfg.cooldown_down_s
    if state.last_change_at is not None and now - state.last_change_at < cfg.scaled(cooldown):
        return GuardOutcome(
            current, "cooldown",
            f"last change {now - state.last_change_at:g}s ago < {cfg.scaled(cooldown):g}s", state,
        )
    max_step = cfg.max_step_up if direction > 0 else cfg.max_step_down
    target = desired
    step = "pass"
    if max_step is not None and abs(desired - current) > max_step:
        target = current + direction * max_step
        step = "max-step"
    # A change restarts the hysteresis: the next move needs its own fresh streak.
    new_state = replace(state, streak=Streak(), last_change_at=now)
    return GuardOutcome(target, step, f"{current} -> {target} (desired {desired}){clamped_note}", new_state)
