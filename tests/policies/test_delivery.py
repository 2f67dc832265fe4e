"""Progressive delivery's live analysis: time-uniform non-inferiority, harm, stages and timeouts.

The statistical cases simulate labelled rows as a deployed Planner would see them: it looks again every
`LOOK` rows for as long as the stage lasts. The seeds here (20-29) are not the ones the default
`planned_labels` was chosen on (0 and 1, docs/benchmarks/policies.md).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from scanflow.policies import delivery
from scanflow.policies.delivery import (
    DeliveryConfig,
    DeliveryContext,
    DeliveryDecision,
    DeliveryState,
    LiveFigures,
    OutcomeSums,
    Stage,
)
from scanflow.policies.types import state_from_json, state_to_json

LOOK = 100  # labelled rows between two looks (about 3 s of the demo's feedback)
SHADOW_ONLY = DeliveryConfig(stages=(Stage("shadow", 1.0, min_labelled=200, min_seconds=0.0, timeout_s=1e9),))


def paired_paths(better: float, worse: float, sims: int, rows: int, seed: int) -> np.ndarray:
    """Per-row score differences (challenger minus champion) of `sims` deliveries: +1 at rate `better`
    (only the challenger right), -1 at rate `worse`, else 0 (both right or both wrong)."""
    u = np.random.default_rng(seed).random((sims, rows))
    return np.where(u < better, 1.0, np.where(u < better + worse, -1.0, 0.0))


def first_verdicts(diffs: np.ndarray, cfg: DeliveryConfig) -> tuple[str, int]:
    """Replays one delivery through `decide`, a look every LOOK rows: ('promote'|'rollback'|'hold', rows)."""
    state = DeliveryState()
    cs, cs2 = np.cumsum(diffs), np.cumsum(diffs * diffs)
    for i, n in enumerate(range(LOOK, len(diffs) + 1, LOOK)):
        fig = LiveFigures(paired=OutcomeSums(n, float(cs[n - 1]), float(cs2[n - 1])))
        d, state = delivery.decide(DeliveryContext(now=float(i), figures=fig, config=cfg, state=state))
        if d.action != "hold":
            return d.action, n
    return "hold", len(diffs)


def test_a_challenger_worse_by_the_margin_is_rarely_promoted_however_often_the_planner_looks() -> None:
    # worse by exactly the margin (2 points): 4 % of rows only the champion gets right, 2 % the challenger
    paths = paired_paths(0.02, 0.04, sims=300, rows=12_000, seed=20)
    verdicts = [first_verdicts(p, SHADOW_ONLY)[0] for p in paths]
    assert verdicts.count("promote") / len(verdicts) <= SHADOW_ONLY.alpha
    # the same paths judged by a 95 % z-test at every look (no correction for looking again) promote far
    # more often: the bound above is what keeps the rate down
    naive = 0
    for p in paths:
        n = np.arange(1, len(p) + 1)[LOOK - 1::LOOK]
        mean = np.cumsum(p)[LOOK - 1::LOOK] / n
        sd = np.sqrt(np.maximum(np.cumsum(p * p)[LOOK - 1::LOOK] / n - mean**2, 1e-12))
        naive += bool(np.any((mean - 1.645 * sd / np.sqrt(n) > -0.02) & (n >= 200)))
    assert naive / len(paths) > 2 * SHADOW_ONLY.alpha


def test_an_equal_challenger_is_promoted_and_a_much_worse_one_rolled_back() -> None:
    equal = [first_verdicts(p, SHADOW_ONLY) for p in paired_paths(0.03, 0.03, sims=60, rows=8_000, seed=21)]
    assert sum(v == "promote" for v, _ in equal) / len(equal) >= 0.95
    assert np.median([n for v, n in equal if v == "promote"]) < 4_000
    bad = [first_verdicts(p, SHADOW_ONLY) for p in paired_paths(0.0, 0.10, sims=60, rows=4_000, seed=22)]
    assert all(v == "rollback" for v, _ in bad)
    assert max(n for _, n in bad) <= 1_500  # a 10-point loss is seen within a few hundred labelled rows


def test_bounds_cover_the_gap_and_narrow_with_rows() -> None:
    few = OutcomeSums.of([1.0, 0.0, -1.0, 0.0])
    many = OutcomeSums.of(np.tile([1.0, 0.0, -1.0, 0.0], 1000))
    lo_f, hi_f = delivery.paired_bounds(few, 0.05, 500)
    lo_m, hi_m = delivery.paired_bounds(many, 0.05, 500)
    assert lo_f < lo_m < 0.0 < hi_m < hi_f
    assert delivery.paired_bounds(OutcomeSums(), 0.05, 500) == (-math.inf, math.inf)
    champ, chal = OutcomeSums.of([1.0] * 900 + [0.0] * 100), OutcomeSums.of([1.0] * 800 + [0.0] * 200)
    lo, hi = delivery.unpaired_bounds(chal, champ, 0.05, 500)
    assert lo < -0.1 < hi < 0.0


def test_failing_answers_roll_back_at_once_and_slow_ones_once_enough_were_timed() -> None:
    cfg = DeliveryConfig()
    assert delivery.decide(DeliveryContext(0.0, LiveFigures(requests=50, errors=1), cfg))[0].action == "hold"
    d, st = delivery.decide(DeliveryContext(0.0, LiveFigures(requests=50, errors=10), cfg))
    assert (d.action, st.phase, d.share) == ("rollback", "rolled_back", 0.0)
    assert "failed 10 of 50" in d.reason
    assert delivery.decide(DeliveryContext(0.0, LiveFigures(requests=400, errors=1), cfg))[0].action == "rollback"
    slow = LiveFigures(requests=500, timed=500, p99_ms=180.0, slo_p99_ms=100.0)
    assert confirmed(slow, cfg).action == "rollback"
    few = LiveFigures(requests=50, timed=50, p99_ms=180.0, slo_p99_ms=100.0)
    assert delivery.decide(DeliveryContext(0.0, few, cfg))[0].action == "hold"
    no_slo = LiveFigures(requests=500, timed=500, p99_ms=180.0)
    assert delivery.decide(DeliveryContext(0.0, no_slo, cfg))[0].action == "hold"


def later(fig: LiveFigures, fresh: int = 256) -> LiveFigures:
    """The same challenger `fresh` timed answers later, its newest `fresh` ones as slow as all before."""
    return dataclasses.replace(fig, requests=fig.requests + fresh, timed=fig.timed + fresh, recent_p99_ms=fig.p99_ms,
                               recent_timed=fresh, champion_recent_p99_ms=fig.champion_p99_ms)


def confirmed(fig: LiveFigures, cfg: DeliveryConfig) -> DeliveryDecision:
    """The decision on `fig`'s latency once seen, then seen again on fresh answers as slow."""
    d, st = delivery.decide(DeliveryContext(0.0, fig, cfg))
    if d.action != "hold":
        return d
    return delivery.decide(DeliveryContext(3.0, later(fig), cfg, st))[0]


def test_a_slow_challenger_is_judged_against_the_champion_timed_on_the_same_gateway() -> None:
    cfg = DeliveryConfig()  # latency_tolerance 1.0: up to twice the champion's p99
    # the machine is saturated: both break the SLO, the challenger no more than the champion -> not its fault
    busy = LiveFigures(requests=500, timed=500, p99_ms=180.0, slo_p99_ms=100.0, champion_p99_ms=120.0,
                       champion_timed=500)
    assert confirmed(busy, cfg).action == "hold"
    # the champion meets the SLO easily and the challenger takes more than twice as long: the model is slow
    slow = LiveFigures(requests=500, timed=500, p99_ms=180.0, slo_p99_ms=100.0, champion_p99_ms=60.0,
                       champion_timed=500)
    d = confirmed(slow, cfg)
    assert d.action == "rollback" and "over the champion's 60.0 ms" in d.reason and d.inputs["champion_p99_ms"] == 60.0
    assert d.inputs["slow_since_timed"] == 500 and "confirming the breach seen at 500 timed" in d.reason
    # within the SLO, however slower than the champion: no latency verdict
    quick = LiveFigures(requests=500, timed=500, p99_ms=90.0, slo_p99_ms=100.0, champion_p99_ms=10.0)
    assert confirmed(quick, cfg).action == "hold"
    # too few of the champion's answers timed (its gateway does not coalesce): the SLO alone judges
    unmatched = LiveFigures(requests=500, timed=500, p99_ms=180.0, slo_p99_ms=100.0, champion_p99_ms=120.0,
                            champion_timed=20)
    assert confirmed(unmatched, cfg).action == "rollback"
    strict = DeliveryConfig(latency_tolerance=0.0)
    assert confirmed(busy, strict).action == "rollback"
    with pytest.raises(ValueError, match="latency_tolerance"):
        DeliveryConfig(latency_tolerance=-0.1)


def test_a_latency_burst_that_fresh_answers_do_not_repeat_is_not_a_rollback() -> None:
    """A good challenger whose first ~300 answers held a burst (mirrors queued while the machine was busy):
    noted, the stage held (no promotion meanwhile), then cleared once its newest answers meet the SLO."""
    cfg = DeliveryConfig(stages=(Stage("shadow", 1.0, min_labelled=100, min_seconds=0.0),))
    burst = LiveFigures(paired=good(2000), requests=308, timed=308, p99_ms=323.9, slo_p99_ms=50.0,
                        champion_p99_ms=65.3, champion_timed=308, recent_p99_ms=323.9, recent_timed=256,
                        champion_recent_p99_ms=65.3)
    d, st = delivery.decide(DeliveryContext(0.0, burst, cfg))
    assert (d.action, st.slow_since_timed) == ("hold", 308) and "confirming on fresh answers" in d.reason
    # 100 answers on, the newest 256 still overlap the burst: neither confirmed nor cleared
    d, st = delivery.decide(DeliveryContext(2.0, dataclasses.replace(burst, timed=408, requests=408), cfg, st))
    assert (d.action, st.slow_since_timed) == ("hold", 308)
    # 256 fresh answers within the SLO: the note goes, and the evidence promotes
    fresh = dataclasses.replace(burst, timed=564, requests=564, recent_p99_ms=30.0, champion_recent_p99_ms=28.0)
    d, st = delivery.decide(DeliveryContext(5.0, fresh, cfg, st))
    assert (d.action, st.slow_since_timed) == ("promote", None)
    # the same burst repeated on fresh answers is a rollback, its reason naming both looks
    again = dataclasses.replace(fresh, recent_p99_ms=300.0, champion_recent_p99_ms=60.0)
    _, st = delivery.decide(DeliveryContext(0.0, burst, cfg))
    d, st = delivery.decide(DeliveryContext(5.0, again, cfg, st))
    assert (d.action, st.phase) == ("rollback", "rolled_back") and "300.0 ms" in d.reason
    # a gateway that reports no recent p99: confirmed on its p99 so far, min_timed_requests answers later
    old = dataclasses.replace(burst, recent_p99_ms=None, recent_timed=0, champion_recent_p99_ms=None)
    _, st = delivery.decide(DeliveryContext(0.0, old, cfg))
    d, _ = delivery.decide(DeliveryContext(5.0, dataclasses.replace(old, timed=508, requests=508), cfg, st))
    assert d.action == "rollback"


def good(n: int) -> OutcomeSums:
    """n paired rows where the challenger is right 5 % more often: clearly not worse."""
    return OutcomeSums.of(np.tile(np.r_[np.ones(5), np.zeros(95)], n // 100 + 1)[:n])


def test_stages_advance_in_order_each_after_its_time_then_promote() -> None:
    cfg = DeliveryConfig(stages=(Stage("shadow", 1.0, min_labelled=300, min_seconds=30, timeout_s=600),
                                 Stage("canary", 0.1, min_labelled=50, min_seconds=60, timeout_s=600),
                                 Stage("canary", 0.5, min_labelled=100, min_seconds=60, timeout_s=600)))
    st = DeliveryState()
    d, st = delivery.decide(DeliveryContext(0.0, LiveFigures(paired=good(3000)), cfg, st))
    assert d.action == "hold" and "0/30 s" in d.reason  # proven, but not for long enough
    d, st = delivery.decide(DeliveryContext(31.0, LiveFigures(paired=good(3000)), cfg, st))
    assert (d.action, d.kind, d.share, st.stage, st.shown_not_worse) == ("advance", "canary", 0.1, 1, True)
    canary_rows = OutcomeSums.of([1.0] * 40)
    d, st = delivery.decide(DeliveryContext(100.0, LiveFigures(paired=good(3000), challenger=canary_rows), cfg, st))
    assert d.action == "hold"  # 69 s in, but 40 of 50 labelled rows
    canary_rows = OutcomeSums.of([1.0] * 60)
    d, st = delivery.decide(DeliveryContext(101.0, LiveFigures(paired=good(3000), challenger=canary_rows), cfg, st))
    assert (d.action, d.share, st.stage, st.stage_started) == ("advance", 0.5, 2, 101.0)
    canary_rows = OutcomeSums.of([1.0] * 150)
    d, st = delivery.decide(DeliveryContext(170.0, LiveFigures(paired=good(3000), challenger=canary_rows), cfg, st))
    assert (d.action, d.share, st.phase) == ("promote", 1.0, "promoted")
    json.dumps(d.to_dict(), allow_nan=False)  # the decision's figures go to the store and MLflow as JSON
    assert d.to_dict()["inputs"]["paired_rows"] == 3000
    # a finished delivery decides nothing more
    assert delivery.decide(DeliveryContext(500.0, LiveFigures(errors=50, requests=50), cfg, st))[0].action == "hold"
    # a declaration that lost stages while the delivery ran past them ends it, it does not crash
    fewer = DeliveryConfig(stages=cfg.stages[:1])
    d, _ = delivery.decide(DeliveryContext(9.0, LiveFigures(), fewer, DeliveryState(stage=2, stage_started=0.0)))
    assert d.action == "rollback" and "no longer declared" in d.reason


def test_a_canary_worse_on_its_own_rows_rolls_back_even_after_the_shadow_passed() -> None:
    cfg = DeliveryConfig(stages=(Stage("shadow", 1.0, min_labelled=100, min_seconds=0, timeout_s=600),
                                 Stage("canary", 0.1, min_labelled=50, min_seconds=0, timeout_s=600)))
    _, st = delivery.decide(DeliveryContext(0.0, LiveFigures(paired=good(3000)), cfg))
    assert st.stage == 1
    served_badly = LiveFigures(paired=good(3000), challenger=OutcomeSums.of([1.0] * 500 + [0.0] * 500),
                               champion=OutcomeSums.of([1.0] * 4500 + [0.0] * 500))
    d, st = delivery.decide(DeliveryContext(10.0, served_badly, cfg, st))
    assert d.action == "rollback" and "worse than the champion" in d.reason


def test_no_evidence_is_no_promotion_a_stage_times_out_to_rollback() -> None:
    cfg = DeliveryConfig(stages=(Stage("shadow", 1.0, min_labelled=200, min_seconds=0, timeout_s=120),))
    d, st = delivery.decide(DeliveryContext(0.0, LiveFigures(paired=OutcomeSums.of([0.0] * 50)), cfg))
    assert d.action == "hold"
    d, st = delivery.decide(DeliveryContext(121.0, LiveFigures(paired=OutcomeSums.of([0.0] * 50)), cfg, st))
    assert d.action == "rollback" and "50 of 200 labelled rows" in d.reason
    # enough rows but a gap too uncertain to call either way
    noisy = OutcomeSums.of(np.tile([1.0, -1.0], 150))
    d, _ = delivery.decide(DeliveryContext(121.0, LiveFigures(paired=noisy), cfg, DeliveryState(stage_started=0.0)))
    assert d.action == "rollback" and "no evidence that the challenger is not worse" in d.reason


def test_a_canary_with_no_shadow_before_it_needs_unpaired_proof() -> None:
    cfg = DeliveryConfig(stages=(Stage("canary", 0.2, min_labelled=100, min_seconds=0, timeout_s=600),))
    few = LiveFigures(challenger=OutcomeSums.of([1.0] * 95 + [0.0] * 5), champion=OutcomeSums.of([1.0] * 380 + [0.0] * 20))
    assert delivery.decide(DeliveryContext(0.0, few, cfg))[0].action == "hold"  # 100 rows cannot bound a 2-point gap
    many = LiveFigures(challenger=OutcomeSums.of([1.0] * 19_000 + [0.0] * 1_000),
                       champion=OutcomeSums.of([1.0] * 76_000 + [0.0] * 4_000))
    assert delivery.decide(DeliveryContext(0.0, many, cfg))[0].action == "promote"


def test_row_scores_per_task() -> None:
    assert delivery.row_scores("classification", [1, 2, 3], ["1", 0, 3.0]).tolist() == [1.0, 0.0, 1.0]
    assert delivery.row_scores("regression", [1.5, 2.0], [1.0, 3.0]).tolist() == [-0.5, -1.0]
    with pytest.raises(ValueError, match="shape"):
        delivery.row_scores("classification", [1, 2], [1])
    with pytest.raises(ValueError, match="task"):
        delivery.row_scores("ranking", [1], [1])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"kind": "blue-green", "share": 0.5}, "kind"),
    ({"kind": "canary", "share": 0.0}, "share"),
    ({"kind": "canary", "share": 1.5}, "share"),
    ({"kind": "shadow", "share": 1.0, "min_seconds": 60, "timeout_s": 30}, "timeout_s"),
])
def test_a_bad_stage_is_refused_with_its_reason(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Stage(**kwargs)  # type: ignore[arg-type]


def test_a_bad_config_is_refused_and_the_state_survives_a_restart() -> None:
    with pytest.raises(ValueError, match="at least one stage"):
        DeliveryConfig(stages=())
    with pytest.raises(ValueError, match="confidence"):
        DeliveryConfig(confidence=1.0)
    st = DeliveryState(stage=1, stage_started=12.5, shown_not_worse=True)
    assert state_from_json(DeliveryState, json.loads(json.dumps(state_to_json(st)))) == st
