"""The Bernoulli CUSUM's run lengths: the Markov-chain solution against a simulation, and its inversion."""

from __future__ import annotations

import numpy as np
import pytest

from scanflow.policies import sequential
from scanflow.policies.sequential import Design


def simulated_run_length(h: float, rate: float, design: Design, runs: int, seed: int) -> float:
    """Mean windows to S >= h over `runs` simulated streams flagged independently at `rate`."""
    gen = np.random.default_rng(seed)
    lengths = []
    for _ in range(runs):
        s, t = 0.0, 0
        while s < h:
            s = sequential.step(s, bool(gen.random() < rate), design)
            t += 1
        lengths.append(t)
    return float(np.mean(lengths))


@pytest.mark.parametrize(("h", "rate"), [(4.0, 0.05), (4.0, 0.5), (6.0, 0.1)])
def test_markov_chain_run_length_matches_a_simulation(h: float, rate: float) -> None:
    d = Design(0.05, 0.5)
    exact = sequential.average_run_length(h, rate, d)
    sim = simulated_run_length(h, rate, d, runs=400, seed=1)
    # 400 runs of a roughly geometric length: the mean's standard error is ~5 % of it
    assert sim == pytest.approx(exact, rel=0.2)


def test_threshold_for_a_target_meets_it_and_no_lower_one_does() -> None:
    d = Design(0.05, 0.5)
    h = sequential.threshold_for(20_000, d)
    assert sequential.average_run_length(h, d.p0, d) >= 20_000
    assert sequential.average_run_length(h - 0.05, d.p0, d) < 20_000 * 1.5  # not far beyond what was asked
    # every window flagged: the alarm comes after ceil(h / up) windows (the detection delay)
    assert sequential.average_run_length(h, 1.0, d) == pytest.approx(np.ceil(h / d.up), abs=0.01)


def test_design_and_targets_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        Design(0.5, 0.05)
    with pytest.raises(ValueError):
        sequential.arl0_for(0.0, 1.0)
    with pytest.raises(ValueError):
        sequential.threshold_for(0.5, Design())
    assert sequential.arl0_for(1.0, 0.2) == pytest.approx(17_280)


def test_k_of_m_run_length_matches_the_rule_replayed() -> None:
    from scanflow.policies import retrain

    cfg = retrain.RetrainConfig(rule="k_of_m", k=2, m=3, cooldown_s=0.0)
    gen = np.random.default_rng(3)
    lengths = []
    for _ in range(300):
        state, t, fired = retrain.RetrainState(), 0, False
        while not fired:
            t += 1
            d, state = retrain.decide(retrain.RetrainContext(now=float(t), drift=bool(gen.random() < 0.1),
                                                             config=cfg, state=state))
            fired = d.retrain
        lengths.append(t)
    assert np.mean(lengths) == pytest.approx(sequential.k_of_m_run_length(2, 3, 0.1), rel=0.15)
    assert sequential.k_of_m_run_length(2, 3, 1.0) == 2.0
    assert sequential.k_of_m_run_length(2, 3, 0.0) == float("inf")
