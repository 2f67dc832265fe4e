"""Retrain on a CUSUM of drift verdicts (or K of M windows) with cooldown; promote challenger vs champion."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scanflow.policies import retrain
from scanflow.policies.retrain import (
    Evaluation,
    PromotionConfig,
    RetrainConfig,
    RetrainContext,
    RetrainState,
    decide_promotion,
)


def replay(windows: list[bool | None], cfg: RetrainConfig, *, running: list[bool] | None = None,
           dt: float = 60.0) -> list[bool]:
    state, out = RetrainState(), []
    for i, w in enumerate(windows):
        d, state = retrain.decide(RetrainContext(now=i * dt, drift=w, config=cfg, state=state,
                                                 retrain_running=bool(running and running[i])))
        out.append(d.retrain)
    return out


CFG = RetrainConfig(k=2, m=3, cooldown_s=600.0, rule="k_of_m")
CUSUM = RetrainConfig(cooldown_s=600.0, false_alarms_per_day=0.1, default_window_s=60.0)


def test_a_lone_false_positive_never_retrains() -> None:
    assert replay([True, False, False, True, False, False, True], CFG) == [False] * 7


def test_two_of_three_drifted_windows_retrain_once() -> None:
    got = replay([False, True, False, True, True, True], CFG)
    assert got == [False, False, False, True, False, False]  # history cleared, then cooldown


def test_cooldown_then_fresh_evidence_retrains_again() -> None:
    # retrain at t=60 (2nd window); windows every 60 s; cooldown 600 s
    got = replay([True, True] + [True] * 12, CFG)
    fired = [i for i, f in enumerate(got) if f]
    assert fired[0] == 1 and fired[1] * 60 - 60 >= 600


def test_not_while_a_retrain_is_running() -> None:
    windows: list[bool | None] = [True, True, True, None]
    assert replay(windows, CFG, running=[True, True, True, False]) == [False, False, False, True]


def test_outside_record_of_last_retrain_counts() -> None:
    st = RetrainState(windows=(True,))
    d, _ = retrain.decide(RetrainContext(now=1000.0, drift=True, last_retrain_at=700.0, config=CFG, state=st))
    assert not d.retrain and "cooldown" in d.reason and d.inputs["since_last_retrain_s"] == 300.0


def test_bad_k_m_refused() -> None:
    with pytest.raises(ValueError, match="k"):
        RetrainConfig(k=4, m=3)
    with pytest.raises(ValueError, match="rule"):
        RetrainConfig(rule="vote")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="p0"):
        RetrainConfig(window_fpr=0.6, drift_power=0.5)


def test_cusum_alarm_threshold_follows_the_window_rate() -> None:
    # one window a minute: 1,440 a day; 0.1 false alarms a day -> 14,400 windows between false alarms
    d, st = retrain.decide(RetrainContext(now=0.0, drift=False, config=CUSUM))
    assert d.inputs["arl0_windows"] == 14400 and d.inputs["windows_per_s"] == round(1 / 60, 4)
    d, st = retrain.decide(RetrainContext(now=1.0, drift=False, config=CUSUM, state=st))  # a window 1 s later
    fast = retrain.alarm_threshold(RetrainContext(now=1.0, config=CUSUM), st)
    slow = retrain.alarm_threshold(RetrainContext(now=1.0, config=CUSUM), RetrainState())
    assert fast[2] > slow[2] and fast[0] > slow[0]  # more windows a day: a higher bar for the same target


def test_cusum_a_stable_stream_at_the_window_fpr_stays_quiet() -> None:
    # 20,000 clean windows flagged at the detector's 5 %, one a minute: the CUSUM is designed for one false
    # alarm per 14,400 windows (0.1 a day) and 2 of 3 fires every ~130 windows (the cooldown aside)
    flags = list(np.random.default_rng(0).random(20_000) < 0.05)
    assert sum(replay(flags, CUSUM, dt=60.0)) <= 3
    assert sum(replay(flags, RetrainConfig(k=2, m=3, cooldown_s=600.0, rule="k_of_m"), dt=60.0)) > 50


def test_cusum_sustained_drift_alarms_within_the_stated_delay() -> None:
    h, _, _ = retrain.alarm_threshold(RetrainContext(now=0.0, config=CUSUM), RetrainState())
    windows = math.ceil(h / math.log(0.5 / 0.05))  # every window flagged: +2.30 each
    got = replay([False] * 10 + [True] * 10, CUSUM)
    assert got.index(True) == 10 + windows - 1
    # half the drifted windows flagged: later, but it does alarm
    assert any(replay([False] * 10 + [True, False] * 20, CUSUM))


def test_cusum_uses_the_verdicts_own_fpr() -> None:
    st = RetrainState()
    d, st = retrain.decide(RetrainContext(now=0.0, drift=True, window_fpr=0.01, config=CUSUM, state=st))
    assert d.inputs["window_fpr"] == 0.01 and st.cusum == pytest.approx(math.log(0.5 / 0.01))


def test_promotion_rules() -> None:
    champ = Evaluation(clean=0.97, drifted=0.70)
    assert decide_promotion(Evaluation(0.965, 0.85), champ).promote
    assert not decide_promotion(Evaluation(0.93, 0.90), champ).promote  # loses 4 points clean
    # "at most 1 point": exactly 1 point passes although 0.907 - 0.897 is 0.01000000000000001 in floats
    assert decide_promotion(Evaluation(0.897, 0.89), Evaluation(0.907, 0.19)).promote
    assert not decide_promotion(Evaluation(0.896, 0.89), Evaluation(0.907, 0.19)).promote
    assert not decide_promotion(Evaluation(0.98, 0.70), champ).promote  # no gain on drifted data
    assert decide_promotion(Evaluation(0.5, 0.5), None).promote  # first model
    strict = PromotionConfig(min_gain_drifted=0.2)
    d = decide_promotion(Evaluation(0.97, 0.85), champ, strict)
    assert not d.promote and "gain" in d.reason and d.to_dict()["inputs"]["champion"]["drifted"] == 0.7


def test_evaluation_refuses_accuracies_outside_0_1() -> None:
    with pytest.raises(ValueError, match="accuracy clean"):
        Evaluation(clean=97.0, drifted=0.5)
    with pytest.raises(ValueError, match="r2 drifted"):
        Evaluation(clean=0.5, drifted=float("nan"), metric="r2")
    assert Evaluation(clean=-3.0, drifted=0.2, metric="r2").clean == -3.0  # R^2 below 0: worse than the mean


def test_regression_promotion_reads_r2() -> None:
    champ = Evaluation(clean=0.90, drifted=0.10, metric="r2")
    d = decide_promotion(Evaluation(0.895, 0.80, metric="r2"), champ)
    assert d.promote and "drifted" in d.reason
    assert "r2" in decide_promotion(Evaluation(0.80, 0.80, metric="r2"), champ).reason


def test_score_by_task() -> None:
    from scanflow.policies.retrain import score

    assert score("classification", [1, 2, 3, 4], [1, 2, 0, 4]) == 0.75
    assert score("classification", np.array(["a", "b"]), ["a", "c"]) == 0.5
    assert score("classification", np.array([1, 2]), np.array(["1", "2"])) == 1.0  # types differ: compared as text
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert score("regression", y, y) == 1.0
    assert abs(score("regression", y, np.full(4, y.mean()))) < 1e-12  # predicting the mean: R^2 = 0
    assert score("regression", y, y + 10) < 0
    with pytest.raises(ValueError, match="targets"):
        score("regression", y, y[:2])


def test_a_retrain_in_flight_is_not_asked_for_again_by_the_verdicts_it_answers() -> None:
    # cooldown 60 s, windows every 4 s: the old champion's detector keeps flagging while the retrain runs
    # (60 s and more on a busy machine); before, its verdicts planned a second retrain once the cooldown passed
    cfg = RetrainConfig(cooldown_s=60.0, default_window_s=4.0)
    state, fired, t = RetrainState(), [], 0.0
    for _ in range(40):  # 160 s of version 1's drifted verdicts
        d, state = retrain.decide(RetrainContext(now=t, drift=True, version="1", config=cfg, state=state))
        fired.append(d.retrain)
        t += 4.0
    assert sum(fired) == 1 and state.retrain_version == "1"
    assert "in flight" in d.reason
    # the new champion serves: its clean verdicts, then drift again, count afresh (and after the cooldown)
    d, state = retrain.decide(RetrainContext(now=t, drift=False, version="2", config=cfg, state=state))
    assert state.retrain_version is None and not d.retrain
    got = []
    for _ in range(10):
        t += 4.0
        d, state = retrain.decide(RetrainContext(now=t, drift=True, version="2", config=cfg, state=state))
        got.append(d.retrain)
    assert any(got)


def test_a_challenger_never_promoted_lets_the_verdicts_count_after_the_timeout() -> None:
    cfg = RetrainConfig(cooldown_s=60.0, default_window_s=4.0, retrain_timeout_s=100.0)
    state, t, fired = RetrainState(), 0.0, 0
    for _ in range(60):  # 240 s, version 1 throughout: the retrain's challenger was not promoted
        d, state = retrain.decide(RetrainContext(now=t, drift=True, version="1", config=cfg, state=state))
        fired += d.retrain
        t += 4.0
    assert fired == 2  # once, then again after the timeout (100 s) with fresh evidence
