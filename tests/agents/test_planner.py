"""The Planner's own pure pieces: the critical-points gate on a retrain, and the autoscale state it keeps
between ticks (scripted tick sequences, no processes)."""

from __future__ import annotations

from agents.planner import _autoscale_json, _autoscale_state, gate_on_points
from scanflow.policies import autoscale, retrain

CFG = retrain.RetrainConfig(k=2, m=3, cooldown_s=600.0)


def _tick(state: retrain.RetrainState, drift: bool, points: int, now: float, needed: int = 400):
    decision, new = retrain.decide(retrain.RetrainContext(now=now, drift=drift, config=CFG, state=state))
    waiting = retrain.RetrainState((state.windows + (drift,))[-CFG.m:], state.last_retrain_at)
    return gate_on_points(decision, new, waiting, points, needed)


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
    assert st2 == retrain.RetrainState((True, True), None)
    d, _ = _tick(st2, False, 500, now=51.0)  # 2 of the last 3 still drifted, enough points now
    assert d.retrain


def test_autoscale_state_survives_the_json_round_trip_between_ticks() -> None:
    cfg = autoscale.AutoscaleConfig()
    st = autoscale.AutoscaleState()
    for i in range(6):  # overload ticks: the guardrails' streak and change times must carry over
        _d, st = autoscale.decide(autoscale.AutoscaleContext(
            now=1000.0 + 15 * i, current_replicas=1, slo_latency_ms=50.0, latency_ms=400.0, in_flight=20.0,
            config=cfg, state=st))
        back = _autoscale_state(_autoscale_json(st))
        assert back == st
    assert st.guard.streak.count > 0 or st.guard.last_change_at is not None
