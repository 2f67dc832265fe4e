"""Tune: replicas x threads x pinning for a machine, from measurements or the model; CPUMEM layout."""

from __future__ import annotations

import pytest

from scanflow.policies import tune
from scanflow.policies.tune import Machine, TuneConfig, TuneContext


def test_model_prefers_single_thread_pinned_replicas_up_to_the_cores() -> None:
    d = tune.decide(TuneContext(Machine(cores=2)))
    assert d.config == TuneConfig(2, 1, "pinned") and d.source == "model"
    assert d.cpusets == ((0,), (1,)) and d.cpus_per_replica == 1.0
    assert d.service_update() == {"replicas": 2, "threads": 1, "cpu": 1.0, "affinity": "pinned"}


def test_two_sockets_pick_numa_layout() -> None:
    d = tune.decide(TuneContext(Machine(cores=8, sockets=2)))
    assert d.config == TuneConfig(8, 1, "numa")


def test_cpumem_formula_places_replicas_per_socket() -> None:
    m = Machine(cores=8, sockets=2)
    assert tune.cpusets(TuneConfig(4, 2, "numa"), m) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert tune.cpusets(TuneConfig(2, 4, "numa"), m) == ((0, 1, 2, 3), (4, 5, 6, 7))
    m3 = Machine(cores=12, sockets=2)  # 6 cores per socket, 3 replicas of 2 per socket
    assert tune.cpusets(TuneConfig(6, 2, "numa"), m3)[3] == (6, 7)
    assert tune.cpusets(TuneConfig(2, 1, "none"), Machine(2)) == ((0, 1), (0, 1))


def test_measurements_override_the_model_when_clearly_better() -> None:
    m = Machine(cores=4)
    measured = {TuneConfig(1, 4): 900.0, TuneConfig(4, 1, "pinned"): 2000.0, TuneConfig(2, 2, "pinned"): 2500.0}
    d = tune.decide(TuneContext(m, measured))
    assert d.config == TuneConfig(2, 2, "pinned") and d.source == "measured"
    assert d.expected_gain_vs_default == pytest.approx(2500 / 900 - 1)


def test_within_noise_the_model_favourite_wins() -> None:
    m = Machine(cores=4)
    measured = {TuneConfig(4, 1, "pinned"): 2000.0, TuneConfig(2, 2, "none"): 2040.0}  # +2% < 3%
    assert tune.decide(TuneContext(m, measured)).config == TuneConfig(4, 1, "pinned")


def test_a_gain_within_the_stated_noise_keeps_the_default() -> None:
    m = Machine(cores=2)
    default = tune.default_config(m)
    other = next(c for c in tune.candidates(m) if c != default)
    measured = {default: 1000.0, other: 1150.0}  # +15%, but the probes spread 20%
    kept = tune.decide(TuneContext(m, measured, min_gain=0.2))
    assert kept.config == default and "kept the default" in kept.reason
    moved = tune.decide(TuneContext(m, {default: 1000.0, other: 1300.0}, min_gain=0.2))
    assert moved.config == other and moved.expected_gain_vs_default == pytest.approx(0.3)


def test_candidates_split_the_machine_evenly() -> None:
    cands = tune.candidates(Machine(cores=6))
    assert {c.replicas for c in cands} == {1, 2, 3, 6}
    assert all(c.replicas * c.threads == 6 for c in cands)


@pytest.mark.parametrize("kw", [{"cores": 0}, {"cores": 6, "sockets": 4}])
def test_bad_machine_is_refused(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="cores"):
        Machine(**kw)


def test_bad_measurement_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        tune.decide(TuneContext(Machine(2), {TuneConfig(2, 1): float("nan")}))
