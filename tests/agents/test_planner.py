"""The Planner's own pure pieces: the critical-points gate on a retrain, and the autoscale state it keeps
between ticks (scripted tick sequences, no processes)."""

from __future__ import annotations

import json

from scanflow.policies import autoscale, retrain
from scanflow.policies.types import state_from_json, state_to_json
from scanflow.standard.planner import gate_on_points

CFG = retrain.RetrainConfig(k=2, m=3, cooldown_s=600.0, rule="k_of_m")


def _tick(state: retrain.RetrainState, drift: bool, points: int, now: float, needed: int = 400):
    ctx = retrain.RetrainContext(now=now, drift=drift, config=CFG, state=state)
    decision, new = retrain.decide(ctx)
    return gate_on_points(decision, new, retrain.observe(ctx), points, needed)


def test_retrain_waits_for_points_then_fires_once() -> None:
    st = retrain.RetrainState()
    seen = []
    for i, pts in enumerate([70, 140, 210, 280, 350, 420, 490]):  # drift in every window, points grow
        d, st = _tick(st, True, pts, now=100.0 + i)
        seen.append((d.retrain, d.reason.split(":")[0]))
        if d.retrain:
            break
    # window 1: k not reached; windows 2-5 wait for points; window 6 (420 >= 400) retrains
    assert seen == [(False, "no"), (False, "wait"), (False, "wait"), (False, "wait"), (False, "wait"),
                    (True, "retrain")]
    assert st.last_retrain_at == 105.0 and st.windows == ()
    # the cooldown then holds, whatever the points
    d, st = _tick(st, True, 5000, now=200.0)
    d, st = _tick(st, True, 5000, now=201.0)
    assert not d.retrain and "cooldown" in d.reason


def test_waiting_does_not_start_the_cooldown_or_forget_windows() -> None:
    st = retrain.RetrainState((True,), None)
    d, st2 = _tick(st, True, 10, now=50.0)
    assert not d.retrain and d.reason.startswith("wait") and d.inputs["points"] == 10
    assert st2.windows == (True, True) and st2.last_retrain_at is None
    d, _ = _tick(st2, False, 500, now=51.0)  # 2 of the last 3 still drifted, enough points now
    assert d.retrain


def test_autoscale_state_survives_the_json_round_trip_between_ticks() -> None:
    cfg = autoscale.AutoscaleConfig()
    st = autoscale.AutoscaleState()
    for i in range(6):  # overload ticks: the guardrails' streak and change times must carry over
        _d, st = autoscale.decide(autoscale.AutoscaleContext(
            now=1000.0 + 15 * i, current_replicas=1, slo_latency_ms=50.0, latency_ms=400.0, in_flight=20.0,
            config=cfg, state=st))
        back = state_from_json(autoscale.AutoscaleState, json.loads(json.dumps(state_to_json(st))))
        assert back == st
    assert st.guard.streak.count > 0 or st.guard.last_change_at is not None


def test_scale_view_trusts_the_observed_count() -> None:
    from scanflow.standard.planner import scale_view

    # nothing asked: what the gateway serves
    assert scale_view(3, 3, None, None, 100.0, 60.0, 1) == (3, 3)
    # the Planner asked for 2 long ago, the platform restored 3 (or lost one: 1): observed wins
    assert scale_view(3, 3, 2, 10.0, 100.0, 60.0, 1) == (3, 3)
    assert scale_view(1, 1, 2, 10.0, 100.0, 60.0, 1) == (1, 1)
    # an ask that has shown: observed
    assert scale_view(2, 2, 2, 95.0, 100.0, 60.0, 1) == (2, 2)
    # unhealthy replicas are not ready
    assert scale_view(3, 2, None, None, 100.0, 60.0, 1) == (3, 2)
    # nothing observed: the last ask, else the declared count
    assert scale_view(None, None, 4, 1.0, 100.0, 60.0, 1) == (4, None)
    assert scale_view(None, None, None, None, 100.0, 60.0, 2) == (2, None)


def test_scale_view_counts_a_recent_ask_as_replicas_starting() -> None:
    from scanflow.standard.planner import scale_view

    # asked for 3 five seconds ago, one serves: 3 current, 1 ready (the policy waits for them)
    assert scale_view(1, 1, 3, 95.0, 100.0, 60.0, 1) == (3, 1)
    # asked to go down to 1, the gateway still lists 2 (draining): current 1
    assert scale_view(2, 2, 1, 99.0, 100.0, 60.0, 1) == (1, 1)


def test_plan_from_observed_replicas_waits_for_a_starting_scale_then_trusts_the_gateway() -> None:
    """Scripted ticks through scale_view + the policy, as plan_scale runs them: overload asks for more;
    while those start, nothing more is asked; after pending_s the observed count rules again."""
    from scanflow.standard.planner import scale_view

    cfg = autoscale.AutoscaleConfig()
    st, asked, asked_at = autoscale.AutoscaleState(), None, None
    wants = []
    for i, observed in enumerate([1, 1, 1, 1, 1]):  # the scale never shows at the gateway
        now = 100.0 + 20 * i
        cur, ready = scale_view(observed, observed, asked, asked_at, now, 60.0, 1)
        d, st = autoscale.decide(autoscale.AutoscaleContext(
            now=now, current_replicas=cur, ready_replicas=ready, slo_latency_ms=50.0, latency_ms=300.0,
            in_flight=8.0, config=cfg, state=st))
        if d.replicas != cur:
            asked, asked_at = d.replicas, now
        wants.append((cur, d.replicas))
    # asks for 4 (8 in flight / 2), holds while it is pending (<60 s), then sees 1 serving and asks again
    assert wants[0] == (1, 4) and wants[1] == (4, 4) and wants[2] == (4, 4)
    assert wants[3][0] == 1 and wants[3][1] > 1


def test_autoscale_config_reads_time_scale_guardrails_and_bounds() -> None:
    from scanflow.spec import Service
    from scanflow.standard.planner import autoscale_config

    svc = Service(name="s", model_uri="models:/m@champion", min_replicas=1, max_replicas=3)
    cfg, pending = autoscale_config({"time_scale": 10.0, "latency_low": 0.4, "pending_s": 50.0,
                                     "guardrails": {"cooldown_down_s": 20.0, "max_replicas": 99}}, svc)
    g = cfg.guardrails
    assert (g.min_replicas, g.max_replicas, g.time_scale, g.cooldown_down_s) == (1, 3, 10.0, 20.0)
    assert cfg.latency_low == 0.4 and pending == 5.0
    default, pending_default = autoscale_config({}, svc)
    assert default.guardrails.time_scale == 1.0 and pending_default == 60.0


def test_elastic_state_survives_the_json_round_trip_between_ticks() -> None:
    from scanflow.policies import elastic
    from scanflow.standard.planner import scale_state

    cfg = elastic.ElasticConfig()
    st = elastic.ElasticState()
    for i in range(40):  # idle ticks at 2 cores: needs, the shrink streak and observed_since carry over
        _d, st = elastic.decide(elastic.ElasticContext(
            now=1000.0 + i, current_replicas=1, cpu=2.0, slo_latency_ms=50.0, latency_ms=5.0, in_flight=0.5,
            arrival_rate=100.0, cpu_per_request_ms=1.0, cpu_utilization=0.05, node_cpus=4.0, config=cfg, state=st))
        stored = json.loads(json.dumps({"autoscale": state_to_json(st.scale),
                                        "elastic": state_to_json(st, exclude={"scale"})}))
        back = scale_state(stored["autoscale"], stored["elastic"])
        assert back == st
        st = back
    assert st.observed_since == 1000.0 and st.last_move is not None  # observed a whole window, then shrank


def test_elastic_config_mode_and_vertical_knobs() -> None:
    from scanflow.spec import Service
    from scanflow.standard.planner import elastic_config

    svc = Service(name="s", model_uri="models:/m@champion", min_replicas=1, max_replicas=3)
    cfg, pending = elastic_config({"mode": "vertical-first", "min_cpu": 0.5, "max_cpu": 4, "cpu_step": 0.5,
                                   "cpu_cooldown_down_s": 10.0, "time_scale": 2.0, "shrink_headroom": 0.6}, svc)
    assert cfg.vertical and (cfg.min_cpu, cfg.max_cpu, cfg.cpu_step, cfg.cooldown_down_s) == (0.5, 4.0, 0.5, 10.0)
    assert cfg.shrink_headroom == 0.6
    assert cfg.scale.guardrails.max_replicas == 3 and pending == 30.0
    plain, _ = elastic_config({}, svc)
    assert not plain.vertical and plain.max_cpu is None  # no mode: horizontal only, as before


def test_cpu_view_trusts_what_the_replicas_report_except_a_resize_in_flight() -> None:
    from scanflow.standard.planner import cpu_view

    assert cpu_view(0.3, None, None, 100.0, 60.0, 1.0) == 0.3  # what the replicas report wins
    assert cpu_view(None, None, None, 100.0, 60.0, 1.0) == 1.0  # nothing reported: the declared cores
    assert cpu_view(0.3, 1.5, 90.0, 100.0, 60.0, 1.0) == 1.5  # asked 10 s ago, not shown yet: in flight
    assert cpu_view(1.5, 1.5, 90.0, 100.0, 60.0, 1.0) == 1.5
    assert cpu_view(0.3, 1.5, 10.0, 100.0, 60.0, 1.0) == 0.3  # asked 90 s ago and never shown: refused
    # asked 1.5 from 0.3 10 s ago; the replicas still report 0.3: in flight. They report 0.25, neither the
    # size they had nor the one asked: someone else resized them (S3's right-sized start, an operator)
    assert cpu_view(0.3, 1.5, 90.0, 100.0, 60.0, 1.0, asked_from=0.3) == 1.5
    assert cpu_view(0.25, 1.5, 90.0, 100.0, 60.0, 1.0, asked_from=0.3) == 0.25
    assert cpu_view(None, 1.5, 90.0, 100.0, 60.0, 1.0, asked_from=0.3) == 1.5  # nothing reported: in flight


def test_resources_plan_payload_is_what_the_executor_accepts() -> None:
    from scanflow.policies import elastic
    from scanflow.spec import Affinity, Resources

    d, _ = elastic.decide(elastic.ElasticContext(
        now=0.0, current_replicas=1, cpu=0.3, slo_latency_ms=50.0, latency_ms=400.0, arrival_rate=600.0,
        cpu_per_request_ms=1.0, throttled_ratio=0.9, node_cpus=2, headroom_cores_per_replica=1.7))
    plan = {"plan": "resources", "service": "digits", "resources": {"cpu": d.cpu, "memory": "512Mi"},
            "threads": d.threads, "reason": d.reason}
    assert Resources.model_validate(plan["resources"]).cpu == 1.5 and plan["threads"] == 1
    assert plan.get("affinity") is None or Affinity.model_validate(plan["affinity"])


def test_pin_config_is_off_unless_the_workflow_asks() -> None:
    import pytest

    from scanflow.standard.planner import pin_config

    assert pin_config({}).mode == "none" and pin_config({}).reserved_cores == 1.0
    cfg = pin_config({"pin": "numa", "pin_reserved_cores": 2})
    assert (cfg.mode, cfg.reserved_cores) == ("numa", 2.0)
    with pytest.raises(ValueError, match="pin mode"):
        pin_config({"pin": "yes"})


def test_resources_plan_carries_the_pinning_with_the_declared_placement_kept() -> None:
    from scanflow.policies import pinning
    from scanflow.spec import Affinity, Resources, Service
    from scanflow.standard.planner import resources_plan

    svc = Service(name="digits", model_uri="models:/m@champion", resources=Resources(cpu=0.5, memory="1Gi"),
                  affinity=Affinity(node_selector={"pool": "inference"}, spread_across_nodes=True))
    off = pinning.decide(pinning.PinContext(cpu=2.0, replicas=1, node_cpus=8))
    plan = resources_plan(svc, 2.0, 2, off, "grow", "k1")
    assert plan["affinity"] is None and plan["resources"] == {"cpu": 2.0, "memory": "1Gi"} and plan["reason"] == "grow"
    on = pinning.PinConfig(mode="numa")
    pinned = resources_plan(svc, 2.0, 2, pinning.decide(pinning.PinContext(2.0, 1, 8, on)), "grow", "k1")
    aff = Affinity.model_validate(pinned["affinity"])
    assert aff.policy == "numa" and aff.node_selector == {"pool": "inference"} and aff.spread_across_nodes
    assert pinned["reason"].startswith("grow; numa: 1 x 2 exclusive cores") and pinned["pinning"] in pinned["reason"]
    loose = resources_plan(svc, 1.5, 1, pinning.decide(pinning.PinContext(1.5, 1, 8, on)), "shrink", None)
    assert loose["affinity"]["policy"] == "none" and "not a whole number" in loose["pinning"]


def test_plan_resources_on_a_resize_or_a_change_of_pinning_only() -> None:
    from scanflow.policies import elastic, pinning
    from scanflow.spec import Service
    from scanflow.standard.planner import plan_resources

    svc = Service(name="digits", model_uri="models:/m@champion", max_replicas=8)
    on, off = pinning.PinConfig(mode="numa"), pinning.PinConfig()

    def dec(cpu: float, replicas: int) -> elastic.ElasticDecision:
        return elastic.ElasticDecision("r", replicas=replicas, cpu=cpu, threads=max(1, int(cpu)))

    # a grow to 2 whole cores on an 8-CPU node: pinned in the same plan
    plan, pin = plan_resources(svc, dec(2.0, 1), 1.0, 1, 8.0, on, "none", "k")
    assert plan is not None and plan["affinity"]["policy"] == "numa" and pin.affinity == "numa"
    # nothing changes: no plan
    assert plan_resources(svc, dec(2.0, 1), 2.0, 1, 8.0, on, "numa", "k")[0] is None
    # replicas 1 -> 4 at 2 cores (8 > 7 exclusive): the size stays, but a plan unpins before the scale
    plan, pin = plan_resources(svc, dec(2.0, 4), 2.0, 4, 8.0, on, "numa", "k")
    assert plan is not None and plan["affinity"]["policy"] == "none" and plan["resources"]["cpu"] == 2.0
    assert "4 x 2 cores > 7 exclusive" in plan["reason"]
    # pinning off: a resize without affinity, and no plan without a resize
    plan, pin = plan_resources(svc, dec(2.0, 1), 1.0, 1, 8.0, off, "none", "k")
    assert plan is not None and plan["affinity"] is None and pin.affinity is None
    assert plan_resources(svc, dec(2.0, 4), 2.0, 4, 8.0, off, "numa", "k")[0] is None


def test_policy_states_written_by_older_or_newer_versions_are_read_back() -> None:
    """A Planner restarted on a state another version wrote: the failover's old `streak` key, a field
    it does not know, and a first tick (nothing stored) that counts as long after any resize."""
    import pytest
    from pydantic import ValidationError

    from scanflow.policies import failover
    from scanflow.standard.planner import FIRST_TICKS_SINCE_RESIZE, scale_state

    first = scale_state({}, {})
    assert first.ticks_since_cpu_change == FIRST_TICKS_SINCE_RESIZE and first.scale == autoscale.AutoscaleState()
    st = state_from_json(retrain.RetrainState, {"windows": [True, False], "added_later": 1})
    assert st.windows == (True, False) and st.cusum == 0.0
    assert state_from_json(failover.FailoverState, {"routed_to": "backup"}).routed_to == "backup"
    with pytest.raises(ValidationError, match="routed_to"):
        state_from_json(failover.FailoverState, {"routed_to": "elsewhere"})
