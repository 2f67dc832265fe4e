"""Pinning policy (opt-in): a `resources` plan pins only whole cores that fit the node's CPUs less the
reserve, and says why it did not otherwise; on scripted observations and on the elastic policy's own
decisions through a load step (noisy, one tick late)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from policy_replay import Obs, replay_elastic

from scanflow.policies import pinning
from scanflow.policies.elastic import ElasticConfig
from scanflow.policies.pinning import PinConfig, PinContext

NUMA = PinConfig(mode="numa")


def _pin(cpu: float, replicas: int = 1, node_cpus: float | None = 8.0, cfg: PinConfig = NUMA) -> pinning.PinDecision:
    return pinning.decide(PinContext(cpu=cpu, replicas=replicas, node_cpus=node_cpus, config=cfg))


def test_off_by_default_leaves_affinity_alone() -> None:
    d = pinning.decide(PinContext(cpu=2.0, replicas=1, node_cpus=8.0))
    assert d.affinity is None and "off" in d.reason


def test_whole_cores_that_fit_are_pinned_cpumem() -> None:
    d = _pin(2.0, replicas=3)
    assert d.affinity == "numa" and "3 x 2 exclusive cores of 7" in d.reason and "CPUMEM" in d.reason
    assert d.inputs["cores_needed"] == 6 and d.inputs["exclusive_cores"] == 7
    assert _pin(1.0, cfg=PinConfig(mode="pinned")).affinity == "pinned"
    assert _pin(2.0000000001).affinity == "numa"  # float noise of cpu_step multiples is still whole


@pytest.mark.parametrize("cpu", [0.25, 0.5, 1.25, 1.5, 2.75])
def test_fractional_cores_are_not_pinned_and_the_plan_says_why(cpu: float) -> None:
    d = _pin(cpu)
    assert d.affinity == "none" and f"{cpu:g} cores per replica is not a whole number" in d.reason


def test_not_enough_cores_is_not_pinned() -> None:
    d = _pin(2.0, replicas=4)  # 8 cores needed, 7 exclusive
    assert d.affinity == "none" and "4 x 2 cores > 7 exclusive cores (8 CPUs less 1 reserved)" in d.reason
    assert _pin(2.0, replicas=4, cfg=PinConfig(mode="numa", reserved_cores=0)).affinity == "numa"


def test_a_two_core_machine_pins_one_single_core_replica_at_most() -> None:
    # one core stays for the gateway, the agents and other services' replicas
    assert _pin(1.0, node_cpus=2).affinity == "numa"
    assert _pin(2.0, node_cpus=2).affinity == "none"
    assert _pin(1.0, replicas=2, node_cpus=2).affinity == "none"
    assert _pin(1.0, node_cpus=2, cfg=PinConfig(mode="numa", reserved_cores=2)).affinity == "none"


def test_an_unobserved_node_is_not_pinned() -> None:
    for cpus in (None, 0.0):
        d = _pin(1.0, node_cpus=cpus)
        assert d.affinity == "none" and "not observed" in d.reason


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="pin mode"):
        PinConfig(mode="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved_cores"):
        PinConfig(mode="numa", reserved_cores=-1)


def _step_ticks(seed: int) -> list[Obs]:
    """300 -> 2400 -> 300 rps, 1 ms of CPU each, rates and CPU with a 10% lognormal error."""
    rng = np.random.default_rng(seed)
    ticks = []
    for rate in [300.0] * 5 + [2400.0] * 20 + [300.0] * 120:
        high = rate > 1000
        ticks.append(Obs(latency_ms=200.0 if high else 8.0, in_flight=20.0 if high else 1.0,
                         arrival_rate=rate * float(np.exp(rng.normal(0.0, 0.1))),
                         cpu_per_request_ms=float(np.exp(rng.normal(0.0, 0.1))), cpu_utilization=1.0 if high else 0.3,
                         throttled_ratio=0.9 if high else 0.0))
    return ticks


@pytest.mark.parametrize("step", [0.25, 1.0])
def test_through_a_noisy_delayed_step_only_whole_core_sizes_that_fit_are_pinned(step: float) -> None:
    # the elastic policy's decisions on a load step (noisy, one tick late), each passed through the
    # pinning policy as the Planner does; with whole-core steps (cpu_step 1, the setting pinning wants)
    # the grown replica is pinned while it fits, with quarter-core steps its fractional sizes are not
    cfg = ElasticConfig(cpu_step=step, min_cpu=step)
    cfg = replace(cfg, scale=replace(cfg.scale, guardrails=replace(cfg.scale.guardrails, cold_start_s=0.0)))
    decisions = replay_elastic(_step_ticks(3), cfg, cpu=1.0, node_cpus=8.0, delay=1)
    assert max(d.cpu for d in decisions) > 2.0  # the step grew it in place
    seen = set()
    for d in decisions:
        p = _pin(d.cpu, d.replicas)
        whole = pinning.whole_cores(d.cpu)
        assert (p.affinity == "numa") == (whole is not None and whole * d.replicas <= 7), (d.cpu, d.replicas, p)
        seen.add((d.cpu > 2.0, p.affinity))
    grown = {a for big, a in seen if big}
    assert ("numa" if step == 1.0 else "none") in grown
