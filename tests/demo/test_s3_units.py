"""S3's verdicts from the agents' audit logs (scanflow.demo.s3_tune): each must fail when the chain did
not happen, when the gain was not measured, or (right-sized) when anything changed."""

from __future__ import annotations

from scanflow.demo.load import Second
from scanflow.demo.s3_tune import (
    GAIN_MIN,
    MIN_LOOKS,
    chain,
    mis_sized_verdict,
    right_sized_verdict,
    served,
)

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

