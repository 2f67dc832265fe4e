"""The HPA baseline follows the documented Kubernetes algorithm, tick by tick."""

from __future__ import annotations

import pytest
from policy_replay import replay_hpa, replicas

from scanflow.policies import hpa
from scanflow.policies.hpa import HpaConfig, HpaContext

CFG = HpaConfig(min_replicas=1, max_replicas=40, target=0.7)


def test_acts_only_once_per_sync_period() -> None:
    d0, st = hpa.decide(HpaContext(now=0.0, current_replicas=1, metric=1.0, config=CFG))
    d1, st2 = hpa.decide(HpaContext(now=5.0, current_replicas=d0.replicas, metric=1.0, config=CFG, state=st))
    assert d0.replicas == 2 and d1.replicas == 2 and "between syncs" in d1.reason and st2 == st
    d2, _ = hpa.decide(HpaContext(now=15.0, current_replicas=2, metric=1.0, config=CFG, state=st))
    assert d2.replicas == 3  # ceil(2 * 1.0 / 0.7)


def test_tolerance_ignores_small_deviations() -> None:
    assert replicas(replay_hpa([0.76, 0.64], CFG, start=4)) == [4, 4]  # ratios 1.086, 0.914
    assert replicas(replay_hpa([0.78], CFG, start=4)) == [5]  # ratio 1.114 -> ceil(4.46)


def test_cpu_saturated_overload_climbs_slowly() -> None:
    # CPU utilization cannot exceed 100%: ratio <= 1.43 per sync, whatever the backlog
    assert replicas(replay_hpa([1.0] * 5, CFG, start=1)) == [2, 3, 5, 8, 12]


def test_scale_up_rate_limit_is_max_of_four_pods_and_double() -> None:
    assert replicas(replay_hpa([7.0], CFG, start=2)) == [6]  # ratio 10 -> 20, limited to 2 + 4
    assert replicas(replay_hpa([7.0], CFG, start=10)) == [20]  # limited to 2 * 10
    # a second change inside the same 15 s period counts the pods already added (sync 5 s here)
    cfg = HpaConfig(min_replicas=1, max_replicas=40, target=0.7, sync_period_s=5.0)
    assert replicas(replay_hpa([7.0, 7.0, 7.0, 7.0], cfg, start=2, dt=5.0)) == [6, 6, 6, 12]  # period over: max(6 + 4, 2 * 6)


def test_scale_down_waits_for_the_stabilization_window() -> None:
    # high for 2 syncs (-> 3 replicas), then idle: the max recommendation of the last 300 s holds
    metrics = [1.0, 1.0] + [0.1] * 25
    rs = replicas(replay_hpa(metrics, CFG, start=1))
    assert rs[:2] == [2, 3]
    last_high = 1 * 15.0  # recommendation 3 made at t=15
    first_down = next(i for i, r in enumerate(rs) if i > 1 and r < 3)
    assert first_down * 15.0 >= last_high + 300.0
    assert rs[-1] == 1


def test_unready_pods_count_as_zero_when_scaling_up() -> None:
    d, _ = hpa.decide(HpaContext(now=0.0, current_replicas=4, ready_replicas=2, metric=0.8, config=CFG))
    assert d.replicas == 4 and "unready" in d.reason  # 0.8*2/4 = 0.4 < target: direction flips -> hold
    d, _ = hpa.decide(HpaContext(now=0.0, current_replicas=4, ready_replicas=3, metric=1.0, config=CFG))
    assert d.replicas == 4  # (1.0*3/4)/0.7 = 1.071: within the tolerance once unready pods count
    d, _ = hpa.decide(HpaContext(now=0.0, current_replicas=4, ready_replicas=3, metric=1.2, config=CFG))
    assert d.replicas == 6  # (1.2*3/4)/0.7 = 1.286 -> ceil(5.14)


def test_bounds_apply() -> None:
    cfg = HpaConfig(min_replicas=2, max_replicas=3, target=0.7)
    assert replicas(replay_hpa([1.0] * 3, cfg, start=2)) == [3, 3, 3]


def test_time_scale_shortens_sync_and_windows() -> None:
    cfg = HpaConfig(min_replicas=1, max_replicas=40, target=0.7, time_scale=10.0)
    rs = replicas(replay_hpa([1.0, 1.0] + [0.1] * 25, cfg, start=1, dt=1.5))
    assert rs[:2] == [2, 3]
    first_down = next(i for i, r in enumerate(rs) if i > 1 and r < 3)
    assert first_down * 1.5 >= 1.5 + 30.0 and rs[-1] == 1


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError):
        HpaConfig(min_replicas=3, max_replicas=2)
