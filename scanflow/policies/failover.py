"""Route a service's traffic to its backup when the primary is down, and back when it recovers (S4).

`decide(ctx) -> (FailoverDecision, FailoverState)`, pure, called by the Planner on each health
check. Hysteresis in both directions: fail over after `fail_checks` consecutive failed checks of the
primary, return after `recover_checks` consecutive healthy ones (recovering is slower on purpose: a
primary that flaps must prove itself first). Never fail over to a backup that is itself unhealthy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scanflow.policies.types import Decision, Streak


@dataclass(frozen=True)
class FailoverConfig:
    fail_checks: int = 3
    recover_checks: int = 5

    def __post_init__(self) -> None:
        if self.fail_checks < 1 or self.recover_checks < 1:
            raise ValueError("fail_checks and recover_checks must be >= 1")


@dataclass(frozen=True)
class FailoverState:
    routed_to: Literal["primary", "backup"] = "primary"
    primary: Streak = field(default_factory=Streak)  # +1 healthy checks, -1 failed checks
    changed_at: float | None = None


@dataclass(frozen=True)
class FailoverContext:
    now: float
    primary_healthy: bool
    backup_healthy: bool = True
    config: FailoverConfig = field(default_factory=FailoverConfig)
    state: FailoverState = field(default_factory=FailoverState)


@dataclass(frozen=True)
class FailoverDecision(Decision):
    route_to: Literal["primary", "backup"] = "primary"
    changed: bool = False


def decide(ctx: FailoverContext) -> tuple[FailoverDecision, FailoverState]:
    cfg, st = ctx.config, ctx.state
    streak = st.primary.update(1 if ctx.primary_healthy else -1, ctx.now)
    inputs = {"now": ctx.now, "primary_healthy": ctx.primary_healthy, "backup_healthy": ctx.backup_healthy,
              "routed_to": st.routed_to, "streak": streak.direction * streak.count}
    held = FailoverState(st.routed_to, streak, st.changed_at)
    if st.routed_to == "primary":
        if ctx.primary_healthy:
            return FailoverDecision("stay on primary: healthy", inputs, "primary"), held
        if streak.count < cfg.fail_checks:
            return FailoverDecision(f"stay on primary: {streak.count}/{cfg.fail_checks} failed checks",
                                    inputs, "primary"), held
        if not ctx.backup_healthy:
            return FailoverDecision("stay on primary: down, but the backup is unhealthy too",
                                    inputs, "primary"), held
        return (FailoverDecision(f"fail over: primary failed {streak.count} checks in a row",
                                 inputs, "backup", changed=True),
                FailoverState("backup", streak, ctx.now))
    if not ctx.primary_healthy:
        return FailoverDecision("stay on backup: primary still down", inputs, "backup"), held
    if streak.count < cfg.recover_checks:
        return FailoverDecision(f"stay on backup: primary healthy {streak.count}/{cfg.recover_checks} checks",
                                inputs, "backup"), held
    return (FailoverDecision(f"route back: primary healthy {streak.count} checks in a row",
                             inputs, "primary", changed=True),
            FailoverState("primary", streak, ctx.now))
