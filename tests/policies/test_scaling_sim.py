"""The S2 benchmark's queueing simulation: conservation, flap counting, and the policy vs HPA on a short run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).parents[2] / "benchmarks" / "scaling.py"


@pytest.fixture(scope="module")
def scaling():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("scaling_benchmark", _PATH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scaling_benchmark"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_count_flaps(scaling) -> None:  # type: ignore[no-untyped-def]
    events = [(0.0, 1, 3), (5.0, 3, 2), (100.0, 2, 1), (130.0, 1, 2)]
    assert scaling.count_flaps(events, 60.0) == 2  # up->down at 5 s, down->up 30 s apart
    assert scaling.count_flaps(events, 4.0) == 0


def test_fixed_replicas_match_queueing_theory(scaling) -> None:  # type: ignore[no-untyped-def]
    # one replica at 600 rps x 1 ms (rho 0.6): no violation; replica-seconds = run length
    arrivals = np.sort(np.random.default_rng(0).uniform(0, 20, 12_000))
    service = np.full(len(arrivals), 0.001)
    r = scaling.simulate(lambda m: 1, "fixed", arrivals, service, 20.0, slo_ms=50.0, time_scale=1.0,
                         util_period_s=15.0)
    assert r.violation_s == 0 and r.flaps == 0 and r.replica_s == pytest.approx(20.0, abs=0.01)
    # at 1,500 rps one replica is overloaded: the queue grows and (nearly) every second violates
    over = np.sort(np.random.default_rng(1).uniform(0, 20, 30_000))
    r = scaling.simulate(lambda m: 1, "fixed", over, np.full(len(over), 0.001), 20.0, slo_ms=50.0,
                         time_scale=1.0, util_period_s=15.0)
    assert r.violation_s >= 18


def test_planner_beats_hpa_on_a_short_step_without_flapping(scaling) -> None:  # type: ignore[no-untyped-def]
    res = scaling.run(seeds=1, time_scale=10.0, service_ms=1.0, slo_ms=50.0, max_replicas=10)
    planner, hpa = res["planner"][0], res["hpa"][0]
    assert planner.flaps == 0
    assert planner.violation_s < hpa.violation_s
    assert planner.replica_s < hpa.replica_s
