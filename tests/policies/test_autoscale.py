"""Autoscale policy: scripted tick sequences (overload, idle, interrupted, oscillating) tick by tick."""

from __future__ import annotations

import itertools
import json

import pytest
from policy_replay import Tick, replay_autoscale, replicas, with_guard

from scanflow.policies import autoscale
from scanflow.policies.autoscale import AutoscaleConfig, AutoscaleContext

CFG = with_guard(AutoscaleConfig(), cold_start_s=0.0)  # most scripts start with trusted metrics
OVER = Tick(latency_ms=200.0, in_flight=40.0, arrival_rate=3600.0, service_time_ms=1.0)
IDLE = Tick(latency_ms=5.0, in_flight=0.5, arrival_rate=300.0, service_time_ms=1.0)


def direction_changes(rs: list[int]) -> int:
    moves = [b - a for a, b in itertools.pairwise(rs) if b != a]
    return sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))


def test_overload_scales_up_at_once_to_the_rate_estimate() -> None:
    got = replay_autoscale([OVER] * 3, CFG, start=1)
    # (3600 rps * 1 ms + 40 queued * 1 ms / 5 s) / 0.7 = 5.15 -> 6, at the very first tick, then steady
    assert replicas(got) == [6, 6, 6]
    assert got[0].action == "up" and got[0].inputs["estimate_source"] == "rate"
    assert got[1].action == "hold"


def test_overload_without_rate_uses_queue_depth_and_the_max_bound() -> None:
    tick = Tick(latency_ms=120.0, in_flight=30.0)
    got = replay_autoscale([tick], CFG, start=2)
    assert got[0].replicas == 8  # 30 in flight / 2 per replica = 15, clamped to max 8
    assert got[0].inputs["estimate_source"] == "queue"


def test_over_slo_adds_at_least_one_even_when_the_estimate_is_low() -> None:
    tick = Tick(latency_ms=80.0, in_flight=1.0, arrival_rate=100.0, service_time_ms=1.0)
    assert replicas(replay_autoscale([tick], CFG, start=2)) == [3]


def test_over_slo_waits_for_replicas_still_starting() -> None:
    tick = {"latency_ms": 80.0, "in_flight": 1.0, "arrival_rate": 100.0, "service_time_ms": 1.0}
    d, _ = autoscale.decide(AutoscaleContext(now=0.0, current_replicas=3, ready_replicas=2, slo_latency_ms=50.0,
                                             config=CFG, **tick))
    assert d.action == "hold" and d.replicas == 3


def test_idle_goes_down_after_the_delay_straight_to_the_stabilised_need() -> None:
    rs = replicas(replay_autoscale([IDLE] * 40, CFG, start=4))
    assert rs[:30] == [4] * 30 and rs[30:] == [1] * 10


def test_idle_with_max_step_scales_down_one_at_a_time_to_min() -> None:
    got = replay_autoscale([IDLE] * 200, with_guard(CFG, max_step_down=1), start=4)
    rs = replicas(got)
    downs = [i for i in range(1, len(rs)) if rs[i] < rs[i - 1]] + ([0] if rs[0] < 4 else [])
    assert rs[-1] == 1 and min(rs) == 1
    assert all(b - a >= -1 for a, b in zip([4] + rs, rs))  # max step down 1
    assert downs[0] >= 30  # down_delay 30 s with 1 s ticks
    assert all(b - a >= 60 for a, b in itertools.pairwise(downs))  # cooldown 60 s between steps
    assert direction_changes(rs) == 0


def test_comfortable_band_never_scales_down() -> None:
    tick = Tick(latency_ms=30.0, in_flight=0.5, arrival_rate=300.0, service_time_ms=1.0)  # 30 ms in (25, 50]
    got = replay_autoscale([tick] * 100, CFG, start=4)
    assert set(replicas(got)) == {4}
    assert got[-1].inputs["band"] == "comfortable"


def test_interrupted_idle_restarts_the_down_streak() -> None:
    # 20 idle ticks, one busy tick (estimate 3 of 3 replicas: steady), then idle again
    busy = Tick(latency_ms=30.0, in_flight=2.0, arrival_rate=1800.0, service_time_ms=1.0)
    got = replay_autoscale([IDLE] * 20 + [busy] + [IDLE] * 70, CFG, start=3)
    rs = replicas(got)
    # the busy tick's raw value (3) holds the down window for 30 s (to t=49), then the down streak
    # needs its own 30 s: the first step down comes at t=80, not at t=30
    assert rs[:80] == [3] * 80
    assert rs[80] < 3
    assert "window" not in got[79].reason and got[79].inputs["guardrail"] == "hysteresis"


def test_rate_noise_near_a_boundary_does_not_add_a_replica_while_latency_is_low() -> None:
    # 1 replica, 700 rps * 1 ms / 0.7 = 1.0x -> estimate flickers to 2, but the replica is not saturated
    ticks = [Tick(latency_ms=8.0, in_flight=1.0, arrival_rate=r, service_time_ms=1.0) for r in (650, 760, 690, 800)]
    assert replicas(replay_autoscale(ticks, CFG, start=1)) == [1, 1, 1, 1]
    saturating = Tick(latency_ms=8.0, in_flight=1.0, arrival_rate=1500.0, service_time_ms=1.0)
    assert replicas(replay_autoscale([saturating], CFG, start=1)) == [3]  # 1.5 / 0.7 -> 3, ahead of latency


def test_oscillating_load_around_the_slo_never_flaps() -> None:
    high = Tick(latency_ms=70.0, in_flight=6.0, arrival_rate=1800.0, service_time_ms=1.0)
    got = replay_autoscale([high, IDLE] * 60, CFG, start=1)
    rs = replicas(got)
    assert rs[0] == 3  # 1.8 busy cores / 0.7 -> 3 at once
    assert direction_changes(rs) == 0 and rs == sorted(rs)  # only ever up, never down while it oscillates


def test_cold_start_holds_scale_down_then_releases_it() -> None:
    cfg = with_guard(AutoscaleConfig(), cold_start_s=30.0, down_delay_s=0.0, down_ticks=1)
    rs = replicas(replay_autoscale([IDLE] * 35, cfg, start=3))
    assert rs[:30] == [3] * 30 and rs[30] == 1


def test_time_scale_shortens_the_down_delay() -> None:
    cfg = with_guard(CFG, time_scale=10.0)
    rs = replicas(replay_autoscale([IDLE] * 10, cfg, start=3, dt=1.0))
    assert rs[3] == 3 and rs[4] == 1  # 30 s / 10 = 3 s of streak; 5 ticks (unscaled 30 s)


def test_decision_records_reason_and_inputs_as_json() -> None:
    d = replay_autoscale([OVER], CFG)[0]
    data = json.loads(json.dumps(d.to_dict()))
    assert data["replicas"] == 6 and data["action"] == "up"
    assert "over-slo" in data["reason"] and data["inputs"]["latency_ms"] == 200.0


@pytest.mark.parametrize("kw", [{"current_replicas": -1}, {"slo_latency_ms": 0.0}, {"in_flight": -3.0}])
def test_bad_context_is_refused(kw: dict[str, float]) -> None:
    base = {"now": 0.0, "current_replicas": 1, "slo_latency_ms": 50.0}
    with pytest.raises(ValueError):
        AutoscaleContext(**{**base, **kw})  # type: ignore[arg-type]


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="target_utilization"):
        AutoscaleConfig(target_utilization=1.5)


def test_over_slo_adds_one_again_only_after_the_last_change_settled() -> None:
    # the estimate says 2 but latency stays above the SLO: +1 now, then nothing for settle_s (10 s), +1
    tick = Tick(latency_ms=80.0, in_flight=1.0, arrival_rate=1000.0, service_time_ms=1.0)
    rs = replicas(replay_autoscale([tick] * 12, CFG, start=2))
    assert rs[0] == 3 and rs[1:10] == [3] * 9 and rs[10] == 4


def test_config_for_a_declared_service_takes_its_bounds() -> None:
    from scanflow.spec import Service

    svc = Service(name="digits", model_uri="models:/digits@champion", replicas=2, min_replicas=2, max_replicas=5)
    cfg = autoscale.config_for(svc, time_scale=4.0, target_utilization=0.6)
    g = cfg.guardrails
    assert (g.min_replicas, g.max_replicas, g.time_scale, cfg.target_utilization) == (2, 5, 4.0, 0.6)
    d, _ = autoscale.decide(AutoscaleContext(now=0.0, current_replicas=2, slo_latency_ms=svc.slo.latency_ms,
                                             latency_ms=500.0, in_flight=100.0, config=cfg))
    assert d.replicas == 5


def test_over_slo_while_the_queue_shrinks_adds_nothing() -> None:
    # latency is still above the SLO but the backlog drains (400 -> 300 -> 200): no extra replica
    ticks = [Tick(latency_ms=300.0, in_flight=q, arrival_rate=1000.0, service_time_ms=1.0) for q in (400, 300, 200)]
    cfg = with_guard(CFG, time_scale=1.0)
    got = replay_autoscale(ticks, AutoscaleConfig(settle_s=0.0, startup_s=None, guardrails=cfg.guardrails), start=4)
    assert got[0].replicas >= 4 and [d.action for d in got[1:]] == ["hold", "hold"]


def test_a_latency_known_only_as_a_lower_bound_at_the_slo_is_over_it() -> None:
    """The Checker reports a percentile past the histogram's top bucket as that bound, flagged: at the
    SLO it is a breach (the real latency is at least that), without the flag it is not."""
    def tick(lower_bound: bool) -> autoscale.ScaleDecision:
        d, _ = autoscale.decide(AutoscaleContext(
            now=0.0, current_replicas=1, slo_latency_ms=50.0, latency_ms=50.0, latency_lower_bound=lower_bound,
            in_flight=1.0, config=CFG))
        return d

    over, at = tick(True), tick(False)
    assert over.action == "up" and over.inputs["band"] == "over-slo" and over.inputs["latency_lower_bound"]
    assert at.action == "hold" and at.inputs["band"] == "comfortable"


@pytest.mark.parametrize(("latency_ms", "lower_bound", "breached"), [
    (None, False, False), (None, True, False),  # no request completed: no breach
    (49.9, False, False), (50.0, False, False), (50.1, False, True),
    (50.0, True, True),  # at the SLO but only a lower bound (past the top bucket): may be anywhere above
    (49.9, True, False),
])
def test_slo_breached_is_one_rule(latency_ms: float | None, lower_bound: bool, breached: bool) -> None:
    from scanflow.policies.types import slo_breached

    assert slo_breached(latency_ms, 50.0, lower_bound) is breached
