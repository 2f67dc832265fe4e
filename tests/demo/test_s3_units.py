"""S3's verdicts from the agents' audit logs (scanflow.demo.s3_tune): each must fail when the chain did
not happen, when the gain was not measured, or (right-sized) when anything changed."""

from __future__ import annotations

import math

from scanflow.demo.s3_tune import (
    GAIN_MIN,
    MIN_LOOKS,
    SETTLED_LOOKS,
    SETTLED_S,
    chain,
    flaps_since,
    mis_sized_verdict,
    right_sized_verdict,
    served,
    settled,
)
from scanflow.loadgen import Second

OK = {"a": {"status": "ok"}}


def _plan(action: str, at: float, cpu: float = 1.0) -> dict:
    return {"policy": "autoscale", "action": action, "at": at, "cpu": cpu, "current_cpu": 0.3}


def test_chain_reads_the_planner_and_executor_logs_since_the_start() -> None:
    plans = [_plan("hold", 99.0), _plan("grow", 101.0), _plan("hold", 102.0), _plan("grow", 50.0),
             {"policy": "failover", "action": "grow", "at": 103.0}]
    decisions = [{"strategy": "execute-resources", "result": "fired", "at": 101.5, "outcomes": OK},
                 {"strategy": "execute-resources", "result": "fired", "at": 102.5,
                  "outcomes": {"a": {"status": "failed"}}},
                 {"strategy": "execute-resources", "result": "skipped", "at": 102.6, "outcomes": OK},
                 {"strategy": "execute-scale", "result": "fired", "at": 40.0, "outcomes": OK}]
    c = chain(plans, decisions, 100.0)
    assert [p["action"] for p in c.moves] == ["grow"] and c.looks == 2
    assert len(c.resources_ok) == 1 and c.resources_failed == 1 and c.scales == 0


def test_mis_sized_passes_only_with_the_whole_chain_and_a_gain() -> None:
    grow = chain([_plan("grow", 1.0, 1.0)], [{"strategy": "execute-resources", "result": "fired", "at": 1.5,
                                              "outcomes": OK}], 0.0)
    ok, gain = mis_sized_verdict(grow, 1.0, 1.0, 100.0, 200.0)
    assert ok and gain == 1.0
    assert not mis_sized_verdict(grow, 1.0, 1.0, 100.0, 100.0 * (1 + GAIN_MIN) - 1)[0]  # no measured gain
    assert not mis_sized_verdict(grow, 1.0, 0.3, 100.0, 200.0)[0]  # the replica does not run with it
    assert not mis_sized_verdict(grow, 1.0, None, 100.0, 200.0)[0]
    assert not mis_sized_verdict(grow, 1.0, 1.0, None, 200.0)[0]
    nothing = chain([_plan("hold", 1.0)], [], 0.0)
    assert not mis_sized_verdict(nothing, None, 1.0, 100.0, 200.0)[0]  # faster, but not the agents' doing
    unapplied = chain([_plan("grow", 1.0)], [{"strategy": "execute-resources", "result": "fired", "at": 1.5,
                                              "outcomes": {"a": {"status": "failed"}}}], 0.0)
    assert not mis_sized_verdict(unapplied, 1.0, 1.0, 100.0, 200.0)[0]  # read back differed
    scaled_out = chain([_plan("up", 1.0)], [{"strategy": "execute-scale", "result": "fired", "at": 1.5,
                                             "outcomes": OK}], 0.0)
    assert not mis_sized_verdict(scaled_out, None, 0.3, 100.0, 200.0)[0]  # a replica added, not resized
    assert not mis_sized_verdict(grow, 1.0, 1.0, 100.0, 200.0, flaps=1)[0]  # a move reversed on the steady load


def test_flaps_since_counts_the_planners_own_counter_from_a_point_on() -> None:
    def plan(at: float, flaps: int) -> dict:
        return {**_plan("hold", at), "inputs": {"flaps": flaps}}

    plans = [plan(1.0, 2), plan(5.0, 2), plan(11.0, 2), plan(12.0, 3), plan(13.0, 3)]
    assert flaps_since(plans, 10.0) == 1  # 2 before (S2's), 3 after
    assert flaps_since(plans, 20.0) == 0 and flaps_since([], 0.0) == 0
    assert flaps_since([plan(1.0, 1)], 0.0) == 1


def test_right_sized_passes_only_if_the_planner_looked_and_nothing_changed() -> None:
    looks = [_plan("hold", float(i)) for i in range(MIN_LOOKS)]
    assert right_sized_verdict(chain(looks, [], 0.0), 200.0, 195.0)
    assert not right_sized_verdict(chain(looks[:-1], [], 0.0), 200.0, 195.0)  # nobody looked
    assert not right_sized_verdict(chain([*looks, _plan("shrink", 9.0)], [], 0.0), 200.0, 195.0)
    executed = [{"strategy": "execute-resources", "result": "fired", "at": 1.0, "outcomes": OK}]
    assert not right_sized_verdict(chain(looks, executed, 0.0), 200.0, 195.0)
    assert not right_sized_verdict(chain(looks, [], 0.0), 200.0, 150.0)  # the load was not served


def test_served_counts_answers_per_second_in_the_window() -> None:
    secs = [Second(float(t), 100.0, 100, ok, 0, 0, None, None, 0) for t, ok in ((1, 90), (2, 100), (3, 110), (4, 0))]
    assert served(secs, 2.0, 4.0) == 105.0
    assert served(secs, 10.0, 11.0) is None



def test_settled_needs_quiet_time_and_holds_with_no_shrink_pending() -> None:
    def hold(at: float, pending: int = 0) -> dict:
        return {**_plan("hold", at), "inputs": {"shrink_pending": pending}}

    grow_at = 100.0
    quiet = [hold(grow_at + 1 + i) for i in range(SETTLED_LOOKS)]
    now = grow_at + SETTLED_S + 1
    assert settled([_plan("grow", grow_at), *quiet], 0.0, now)
    # too soon after the move
    assert not settled([_plan("grow", grow_at), *quiet], 0.0, grow_at + SETTLED_S - 1)
    # a shrink two ticks along is not a fixed point, however long the size was held
    assert not settled([_plan("grow", grow_at), *quiet[:-1], hold(grow_at + 9, pending=2)], 0.0, now)
    # too few looks since the move
    assert not settled([_plan("grow", grow_at), *quiet[:-1]], 0.0, now)
    # no move at all: settled once enough holds were seen (the declared size is the fixed point)
    assert settled(quiet, 0.0, now)
    # decisions before `since` do not count
    assert not settled(quiet, grow_at + 50, now)


def test_right_rate_moves_the_observed_need_to_the_middle_of_the_hold_band() -> None:
    from scanflow.demo.s3_tune import RIGHT_RATE_STEP, right_rate
    from scanflow.policies.elastic import ElasticConfig, hold_band

    cfg = ElasticConfig(min_cpu=0.25, cpu_step=0.25)
    lo, hi = hold_band(0.5, cfg)  # (0.208, 0.6]: any tick of a replica that is not saturated holds there

    def looks(need: float) -> list[dict]:
        return [{**_plan("hold", 100.0 + i), "current": 1, "inputs": {"need_cores": need}} for i in range(6)]

    # at 100 rps the Planner saw 0.3 cores needed: below the band's (geometric) middle, 0.354
    assert right_rate(100.0, looks(0.3), 0.5, cfg) == round(100.0 * math.sqrt(lo * hi) / 0.3, 1)
    assert lo < 0.3 * right_rate(100.0, looks(0.3), 0.5, cfg) / 100.0 < hi
    # 0.22, near the bottom edge: the middle is 1.6x away; the load moves by RIGHT_RATE_STEP only (a need
    # estimated at one rate is a guess at a rate far from it), still clear of the edge
    assert right_rate(100.0, looks(0.22), 0.5, cfg) == 100.0 * RIGHT_RATE_STEP
    assert lo * 1.25 < 0.22 * RIGHT_RATE_STEP
    # and down as far only: 0.58, near the top
    assert right_rate(100.0, looks(0.58), 0.5, cfg) == 100.0 / RIGHT_RATE_STEP
    # at the smallest size there is no shrink: half the band's top (0.15 of a core)
    assert right_rate(108.0, looks(0.13), 0.25, cfg) == round(108.0 * 0.15 / 0.13, 1)
    # per replica: 2 replicas needing 0.52 in all are 0.26 each
    two = [{**p, "current": 2, "inputs": {"need_cores": 0.52}} for p in looks(0.0)]
    assert right_rate(100.0, two, 0.5, cfg) == right_rate(100.0, looks(0.26), 0.5, cfg)
    assert right_rate(100.0, [_plan("hold", 1.0)], 0.5, cfg) is None  # nothing observed
