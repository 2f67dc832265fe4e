"""The observation model the S2 benchmark and the demo's comparison share (scanflow.policies.simulated):
windowed figures, the gateway histogram's p99, one interval of delay, seeded lognormal noise on the rates
and CPU only, and the controllers that read nothing else."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scanflow.policies import simulated
from scanflow.policies.simulated import Observer


def _observe(o: Observer, rate: float = 600.0, p99: float | None = 7.0, util: float = 0.6) -> simulated.Observation:
    return o.observe(interval_s=1.0, arrivals=rate, p99_ms=p99, in_flight=3.0, cpu_per_request_ms=1.0,
                     cpu_used_s=util, cpu_capacity_s=1.0, throttled=[0.1, 0.4], headroom_cores_per_replica=7.0)


def test_an_interval_without_noise_is_what_was_measured_with_the_p99_bucketed() -> None:
    o = Observer(noise=0.0)
    obs = _observe(o)
    assert (obs.arrival_rate, obs.cpu_per_request_ms, obs.cpu_utilization) == (600.0, 1.0, 0.6)
    assert (obs.p99_ms, obs.p99_lower_bound, obs.in_flight) == (7.5, False, 3.0)
    assert obs.throttled_ratio == 0.4 and obs.headroom_cores_per_replica == 7.0  # the worst replica
    assert _observe(o, p99=5000.0).p99_lower_bound and _observe(o, p99=None).p99_ms is None
    assert o.observe(interval_s=0.5, arrivals=300, p99_ms=None, in_flight=0.0, cpu_per_request_ms=None,
                     cpu_used_s=0.0, cpu_capacity_s=0.0, throttled=[],
                     headroom_cores_per_replica=8.0).arrival_rate == 600.0  # a rate over the window
    assert o.history[-1].cpu_utilization is None and o.history[-1].throttled_ratio is None


def test_a_controller_sees_the_interval_before_last() -> None:
    o = Observer(noise=0.0)
    assert o.view(1.0, 1, 1, 1.0).obs is None
    first = _observe(o, rate=100.0)
    assert o.view(1.0, 1, 1, 1.0).obs is None  # the interval just measured is not forwarded yet
    _observe(o, rate=200.0)
    v = o.view(2.0, 2, 1, 1.5)
    assert v.obs == first and v.recent == (first,) and (v.replicas, v.ready, v.cpu) == (2, 1, 1.5)


def test_noise_is_lognormal_on_rates_and_cpu_only_and_seeded() -> None:
    o = Observer(noise=0.1, seed=5)
    seen = [_observe(o, util=0.5) for _ in range(4000)]
    logs = np.log([s.arrival_rate / 600.0 for s in seen])
    assert abs(float(np.mean(logs))) < 0.01 and float(np.std(logs)) == pytest.approx(0.1, rel=0.1)
    assert float(np.std(np.log([s.cpu_per_request_ms or math.nan for s in seen]))) == pytest.approx(0.1, rel=0.1)
    assert all(s.cpu_utilization is not None and s.cpu_utilization <= 1.0 for s in seen)  # capped like the Checker's
    assert {(s.p99_ms, s.in_flight, s.throttled_ratio) for s in seen} == {(7.5, 3.0, 0.4)}  # not noisy
    again = Observer(noise=0.1, seed=5)
    assert [_observe(again, util=0.5) for _ in range(10)] == seen[:10]
    with pytest.raises(ValueError, match="noise"):
        Observer(noise=-0.1)


def test_controllers_read_only_the_delayed_observation() -> None:
    o = Observer(noise=0.0)
    planner = simulated.elastic_controller(50.0, 4, 1.0, 8.0, vertical=True)
    assert planner(o.view(0.0, 1, 1, 1.0)) == (1, 1.0)  # nothing observed yet: hold
    # an overloaded interval (3,000 rps x 1 ms on 1 core, p99 past the top bucket), then a calm one:
    # the Planner answers the overload only once it is the interval before last
    o.observe(interval_s=1.0, arrivals=3000, p99_ms=5000.0, in_flight=2000.0, cpu_per_request_ms=1.0,
              cpu_used_s=1.0, cpu_capacity_s=1.0, throttled=[1.0], headroom_cores_per_replica=7.0)
    assert planner(o.view(1.0, 1, 1, 1.0)) == (1, 1.0)
    _observe(o, rate=3000.0, util=1.0)
    replicas, cpu = planner(o.view(2.0, 1, 1, 1.0))
    assert replicas == 1 and cpu > 4.0  # grown in place, not out
    hpa = simulated.hpa_controller(4, 1.0)
    o2 = Observer(noise=0.0)
    for _ in range(20):
        _observe(o2, util=1.0)
    replicas, cpu = hpa(o2.view(20.0, 1, 1, 1.0))
    assert replicas > 1 and cpu == 1.0  # the HPA scales out on the averaged utilization, never resizes
