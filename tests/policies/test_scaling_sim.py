"""The S2 benchmark's queueing simulation on observations: conservation, flap counting, what the
controllers see (bucketed p99, one interval late), resizes, and the three controllers on a short run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from scanflow.policies import simulated

_PATH = Path(__file__).parents[2] / "benchmarks" / "scaling.py"


@pytest.fixture(scope="module")
def scaling():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("scaling_benchmark", _PATH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scaling_benchmark"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_count_flaps() -> None:
    events = [(0.0, 1, 3), (5.0, 3, 2), (100.0, 2, 1), (130.0, 1, 2)]
    assert simulated.count_flaps(events, 60.0) == 2  # up->down at 5 s, down->up 30 s apart
    assert simulated.count_flaps(events, 4.0) == 0
    assert simulated.count_flaps([(0.0, 1.0, 1.5), (10.0, 1.5, 1.25)], 60.0) == 1  # resizes count too


def test_p99_is_what_the_gateway_histogram_says() -> None:
    assert simulated.bucketed(7.0) == (7.5, False)
    assert simulated.bucketed(50.0) == (50.0, False)
    assert simulated.bucketed(5000.0) == (1000.0, True)  # past the top bucket: a lower bound


def test_fixed_capacity_matches_queueing_theory(scaling) -> None:  # type: ignore[no-untyped-def]
    # one 1-core replica at 600 rps x 1 ms (rho 0.6): no violation; core-seconds = run length
    arrivals = np.sort(np.random.default_rng(0).uniform(0, 20, 12_000))
    service = np.full(len(arrivals), 0.001)
    r = scaling.simulate(lambda v: (1, 1.0), "fixed", arrivals, service, 20.0, slo_ms=50.0, time_scale=1.0)
    assert r.violation_s == 0 and r.flaps == 0 and r.core_s == pytest.approx(20.0, abs=0.01)
    # at 1,500 rps one core is overloaded: the queue grows and (nearly) every second violates
    over = np.sort(np.random.default_rng(1).uniform(0, 20, 30_000))
    r = scaling.simulate(lambda v: (1, 1.0), "fixed", over, np.full(len(over), 0.001), 20.0, slo_ms=50.0,
                         time_scale=1.0)
    assert r.violation_s >= 18
    # the same load on one replica resized to 2 cores (2 threads) at the first tick: 1 core until the
    # resize lands 2 s later (3 s in all: a backlog of 1,500), then 2 cores drain it in 3 s and keep up
    r = scaling.simulate(lambda v: (1, 2.0), "fixed", over, np.full(len(over), 0.001), 20.0, slo_ms=50.0,
                         time_scale=1.0)
    assert r.violation_s <= 8 and r.core_s == pytest.approx(1.0 * 3 + 2.0 * 17, abs=0.1)


def test_controllers_see_only_delayed_observations(scaling) -> None:  # type: ignore[no-untyped-def]
    seen = []

    def spy(v):  # type: ignore[no-untyped-def]
        seen.append(v)
        return v.replicas, v.cpu

    arrivals = np.sort(np.random.default_rng(0).uniform(0, 5, 3000))
    scaling.simulate(spy, "spy", arrivals, np.full(len(arrivals), 0.001), 5.0, slo_ms=50.0, time_scale=1.0,
                     noise=0.0)
    assert seen[0].obs is None  # nothing measured before the first full interval
    assert seen[1].obs == seen[2].recent[-2] and seen[1].obs is not None
    assert not hasattr(seen[1].obs, "service_ms") and not hasattr(seen[1], "arrivals")  # no oracle field
    assert seen[2].obs.arrival_rate == pytest.approx(600, rel=0.2)  # Poisson count over one interval
    assert seen[2].obs.cpu_per_request_ms == pytest.approx(1.0)


def test_vertical_first_beats_horizontal_and_hpa_on_a_short_step(scaling) -> None:  # type: ignore[no-untyped-def]
    res = scaling.run(seeds=1, time_scale=10.0, service_ms=1.0, slo_ms=50.0, max_replicas=10)
    vertical, horizontal, hpa = res["vertical"][0], res["horizontal"][0], res["hpa"][0]
    assert vertical.flaps == 0 and horizontal.flaps == 0
    assert vertical.violation_s < horizontal.violation_s < hpa.violation_s
    assert vertical.core_s < hpa.core_s and horizontal.core_s < hpa.core_s
    assert vertical.max_cpu > 1 and horizontal.max_cpu == 1  # only the vertical-first one resizes


def _last_json(capsys) -> dict:  # type: ignore[no-untyped-def,type-arg]
    import json

    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_last_line_names_the_acceptance_keys_and_an_easy_trace_fails_its_target(scaling, capsys) -> None:  # type: ignore[no-untyped-def]
    """An SLO nothing violates gives 0/0 ratios: the benchmark must not call that a met target."""
    assert scaling.main(["--seeds", "1", "--time-scale", "10", "--slo-ms", "100000"]) == 0
    figures = _last_json(capsys)
    for key in ("violation_ratio_vs_hpa", "core_seconds_ratio_vs_hpa", "flaps",
                "vertical_violation_ratio_vs_horizontal", "observed_inputs"):
        assert key in figures, key
    assert figures["hpa_violation_s"] == 0 and figures["violation_ratio_vs_hpa"] == 0.0
    assert figures["target_met"] is False and figures["vertical_target_met"] is False
