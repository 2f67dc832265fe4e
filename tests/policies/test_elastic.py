"""Vertical-first scaling policy on scripted tick sequences of observations (rate, CPU per request,
utilization, throttling, latency), clean, noisy and one tick late: grows in place first, adds replicas
past the ceiling, shrinks before removing, holds when right-sized, never flaps on measurement noise."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from policy_replay import Obs, capacity_flaps, replay_elastic

from scanflow.policies import elastic
from scanflow.policies.elastic import ElasticConfig, ElasticContext

CFG = ElasticConfig()
CFG = replace(CFG, scale=replace(CFG.scale, guardrails=replace(CFG.scale.guardrails, cold_start_s=0.0)))
STARVED = Obs(latency_ms=400.0, in_flight=30.0, arrival_rate=600.0, cpu_utilization=1.0, throttled_ratio=0.9)
CALM_600 = Obs(latency_ms=8.0, in_flight=1.0, arrival_rate=600.0, cpu_utilization=0.6)


def test_a_mis_sized_throttled_replica_grows_in_place_not_out() -> None:
    # 0.3 of a core, one thread, 600 rps x 1 ms of CPU: it needs 0.86 cores at 70%; over the SLO and
    # throttled, it gets half again on top (a backlog to drain) -> 1.5, and no replica is added
    got = replay_elastic([STARVED] * 3, CFG, cpu=0.3, node_cpus=2.0)
    assert [(d.action, d.replicas, d.cpu) for d in got][:1] == [("grow", 1, 1.5)]
    assert got[0].threads == 1 and "x1.5" in got[0].reason
    assert all(d.replicas == 1 for d in got)
    assert [d.cpu for d in got[1:]] == [1.5, 1.5]  # the resize settles: no x1.5 again on the stale latency


def test_right_sized_holds_on_noisy_ticks() -> None:
    rng = np.random.default_rng(0)
    ticks = [replace(CALM_600, arrival_rate=600.0 * math.exp(rng.normal(0, 0.15)),
                     cpu_per_request_ms=math.exp(rng.normal(0, 0.1)),
                     cpu_utilization=0.6 * math.exp(rng.normal(0, 0.1))) for _ in range(300)]
    got = replay_elastic(ticks, CFG, cpu=1.0, node_cpus=2.0)
    assert {(d.replicas, d.cpu) for d in got} == {(1, 1.0)}  # nothing changed at all


def test_past_the_ceiling_replicas_are_added_at_full_size() -> None:
    # 3,600 rps x 1 ms needs 5.1 cores at 70%; the node has 4: grow to 4 at once, add replicas for the rest
    over = Obs(latency_ms=300.0, in_flight=40.0, arrival_rate=3600.0, cpu_utilization=1.0, throttled_ratio=0.5)
    got = replay_elastic([over], CFG, cpu=1.0, node_cpus=4.0)
    assert got[0].action == "up" and got[0].cpu == 4.0 and got[0].replicas == 2


def test_a_node_without_headroom_leaves_it_to_horizontal_scaling() -> None:
    busy = Obs(latency_ms=300.0, in_flight=20.0, arrival_rate=1500.0, cpu_utilization=1.0, throttled_ratio=0.6,
               headroom_cores_per_replica=0.0)
    got = replay_elastic([busy], CFG, cpu=1.0, node_cpus=2.0)
    assert got[0].cpu == 1.0 and got[0].replicas >= 3  # 1.5 cores / 0.7 -> 3 one-core replicas


def test_idle_shrinks_in_place_before_replicas_go_and_never_moves_up() -> None:
    # two replicas of 4 cores after a peak; load falls to 300 rps: cores shrink first, a replica goes later
    idle = Obs(latency_ms=5.0, in_flight=0.5, arrival_rate=300.0, cpu_utilization=0.05)
    got = replay_elastic([idle] * 200, CFG, start=2, cpu=4.0)
    changes = [(i, d.action) for i, d in enumerate(got) if d.action != "hold"]
    assert changes[0][1] == "shrink" and changes[0][0] <= 5
    assert any(a == "down" for _, a in changes) and got[-1].replicas == 1
    totals = [d.replicas * d.cpu for d in got]
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(totals))  # only ever down
    assert got[-1].cpu >= 300 * 0.001 / 0.7  # still carries the load at the target utilization


def test_noisy_observations_one_tick_late_through_a_step_never_flap() -> None:
    rng = np.random.default_rng(1)

    def noisy(o: Obs) -> Obs:
        return replace(o, arrival_rate=(o.arrival_rate or 0) * math.exp(rng.normal(0, 0.15)),
                       cpu_per_request_ms=math.exp(rng.normal(0, 0.1)))

    low = Obs(latency_ms=6.0, in_flight=1.0, arrival_rate=600.0, cpu_utilization=0.6)
    high = Obs(latency_ms=200.0, in_flight=50.0, arrival_rate=3600.0, cpu_utilization=1.0, throttled_ratio=0.8)
    served = Obs(latency_ms=10.0, in_flight=4.0, arrival_rate=3600.0, cpu_utilization=0.55)
    ticks = [noisy(low)] * 1 + [noisy(low) for _ in range(60)] + [noisy(high) for _ in range(3)] \
        + [noisy(served) for _ in range(120)] + [noisy(low) for _ in range(300)]
    got = replay_elastic(ticks, CFG, cpu=1.0, delay=1)
    assert capacity_flaps(got) == 0
    step = got[61:66]
    assert any(d.cpu >= 5.0 for d in step)  # the step is answered in place within a few ticks
    assert max(d.replicas for d in got) == 1  # an 8-CPU node holds the whole step: no replica added
    assert got[-1].cpu <= 1.5  # and it shrank back after the peak


def test_without_cpu_figures_it_is_the_queue_based_horizontal_policy() -> None:
    blind = Obs(latency_ms=120.0, in_flight=30.0, arrival_rate=None, cpu_per_request_ms=None)
    got = replay_elastic([blind], CFG, start=2)
    assert got[0].cpu == 1.0 and got[0].replicas == 8  # 30 in flight / 2 per replica, max 8
    assert got[0].inputs["estimate_source"] == "queue"


def test_horizontal_only_never_resizes() -> None:
    got = replay_elastic([STARVED] * 5, elastic.horizontal(CFG), cpu=1.0)
    assert {d.cpu for d in got} == {1.0} and got[0].replicas == 2


def test_effective_cpu_and_threads() -> None:
    assert elastic.effective_cpu(2.0, 1) == 1.0  # one thread on an unlimited 2-core node uses one core
    assert elastic.effective_cpu(1.5, 1) == 1.5 and elastic.effective_cpu(0.3, 1) == 0.3
    assert elastic.effective_cpu(None, 2) is None and elastic.effective_cpu(2.75, 2) == 2.75
    assert [elastic.threads_for(c, 4) for c in (0.3, 1.0, 2.75, 8.0)] == [1, 1, 2, 4]


def test_decision_says_why_and_from_what() -> None:
    d, _ = elastic.decide(ElasticContext(now=0.0, current_replicas=1, cpu=0.3, slo_latency_ms=50.0,
                                         latency_ms=400.0, arrival_rate=600.0, cpu_per_request_ms=1.0,
                                         throttled_ratio=0.9, node_cpus=2, headroom_cores_per_replica=1.7,
                                         config=CFG))
    assert d.inputs["need_cores"] == pytest.approx(600 * 0.001 / 0.7) and d.inputs["saturated"]
    assert d.inputs["room"] == 2.0 and "cpu 0.3 -> 1.5" in d.reason
    with pytest.raises(ValueError):
        ElasticContext(now=0.0, current_replicas=1, cpu=0.0, slo_latency_ms=50.0)


def test_a_resize_settles_for_some_ticks_even_when_settle_s_is_scaled_below_one_interval() -> None:
    # a demo's time_scale 10 makes settle_s 1 s; the Checker's interval straddling the resize still says
    # throttled and over the SLO: that must not grow the replica again (measured live: 0.05 -> 0.5 -> 0.75)
    fast = replace(CFG, scale=replace(CFG.scale, guardrails=replace(CFG.scale.guardrails, time_scale=10.0)))
    got = replay_elastic([STARVED] * 4, fast, cpu=0.05, node_cpus=2.0, dt=1.5)
    assert [d.action for d in got][:3] == ["grow", "hold", "hold"]
    assert got[0].cpu == got[2].cpu


@pytest.mark.parametrize("cpu", [0.25, 0.5, 0.75, 1.0, 1.5])
def test_hold_band_is_where_calm_ticks_hold_and_its_edges_move(cpu: float) -> None:
    lo, hi = elastic.hold_band(cpu, CFG)
    assert lo < cpu < hi

    def run(need: float) -> list[elastic.ElasticDecision]:
        # need (cores) = rate x 1 ms of CPU / the 70% target utilization
        tick = replace(CALM_600, arrival_rate=need * CFG.scale.target_utilization * 1000.0, cpu_per_request_ms=1.0)
        return replay_elastic([tick] * 40, CFG, cpu=cpu, node_cpus=4.0)

    for need in (lo * 1.05 if lo else 0.05, (lo + hi) / 2, hi * 0.97):
        assert {d.cpu for d in run(need)} == {cpu}, need  # inside: nothing moves
    assert run(hi * 1.1)[-1].cpu > cpu  # over the top edge: grows
    if lo:
        assert run(lo * 0.95)[-1].cpu < cpu  # at or under the bottom edge: shrinks
    else:
        assert cpu * (1 - CFG.shrink_margin) < CFG.min_cpu + CFG.cpu_step  # no smaller size to go to


@pytest.mark.parametrize("cpu", [0.25, 0.5, 0.75, 1.0, 1.5])
def test_hold_band_when_not_calm_ends_at_the_present_size(cpu: float) -> None:
    # latency between the low band and the SLO (35 ms of 50), not saturated: a need above the present
    # size grows at once (no margin, no second tick), one inside (lo, cpu] holds
    lo, hi = elastic.hold_band(cpu, CFG, calm=False)
    assert hi == cpu and lo == elastic.hold_band(cpu, CFG)[0]

    def run(need: float) -> list[elastic.ElasticDecision]:
        tick = replace(CALM_600, latency_ms=35.0, arrival_rate=need * CFG.scale.target_utilization * 1000.0,
                       cpu_per_request_ms=1.0)
        return replay_elastic([tick] * 40, CFG, cpu=cpu, node_cpus=4.0)

    for need in ((lo + hi) / 2, hi * 0.97):
        assert {(d.cpu, d.replicas) for d in run(need)} == {(cpu, 1)}, need
    assert run(hi * 1.05)[0].action == "grow"  # just over: the first tick grows
