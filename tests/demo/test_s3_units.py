"""S3's verdicts from the agents' audit logs (scanflow.demo.s3_tune): each must fail when the chain did
not happen, when the gain was not measured, or (right-sized) when anything changed."""

from __future__ import annotations

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
from scanflow.loadgen_engine import Second

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


def test_right_size_is_where_the_planners_own_shrink_lands_for_the_observed_need() -> None:
    from scanflow.demo.s3_tune import right_size
    from scanflow.policies.elastic import ElasticConfig, hold_band

    cfg = ElasticConfig(min_cpu=0.25, cpu_step=0.25)

    def looks(*needs: float, current: int = 1) -> list[dict]:
        return [{**_plan("hold", 100.0 + i), "current": current, "inputs": {"need_cores": n}}
                for i, n in enumerate(needs)]

    # settled at 0.25 with needs up to 0.24 (its band's top edge when throttled): right-sized is 0.5,
    # the largest need x1.5 = 0.36 in 0.25 steps, and that need sits inside 0.5's band away from both edges
    size = right_size(looks(0.21, 0.24, 0.2, 0.22), cfg)
    assert size == 0.5
    lo, hi = hold_band(0.5, cfg)
    assert lo * 1.2 < 0.2 and 0.24 * 2 < hi
    # only the last SETTLED_LOOKS count (an early spike before it settled does not)
    assert right_size(looks(0.9, 0.3, 0.3, 0.3, 0.3), cfg) == 0.5
    # per replica: 2 replicas needing 0.6 in all are 0.3 each
    assert right_size(looks(0.6, 0.6, 0.6, 0.6, current=2), cfg) == right_size(looks(0.3, 0.3, 0.3, 0.3), cfg)
    assert right_size(looks(0.05, 0.05, 0.05, 0.05), cfg) == 0.25  # never under min_cpu
    assert right_size([_plan("hold", 1.0)], cfg) is None  # nothing observed
    # what a CI run measured: needs of 0.16-0.17 after a grow to 0.5. The shrink's landing for 0.17
    # (x1.5 = 0.255 -> 0.5) leaves the need 2 % over 0.5's shrink edge (0.167), and case 2 read 0.16 and
    # shrank. 0.25 holds it with room under its saturated share (0.225) and no shrink below it.
    assert right_size(looks(0.17, 0.165, 0.17, 0.168), cfg) == 0.25
    lo, _ = hold_band(0.5, cfg)
    assert 0.16 < lo < 0.17  # the premise: 0.5 was at its edge


def test_right_rate_puts_the_observed_need_in_the_middle_of_the_sizes_band() -> None:
    from scanflow.demo.s3_tune import RIGHT_RATE_SPAN, right_rate, right_size
    from scanflow.policies.elastic import ElasticConfig, hold_band

    cfg = ElasticConfig(min_cpu=0.25, cpu_step=0.25)

    def looks(*needs: float, rate: float = 189.4) -> list[dict]:
        return [{**_plan("hold", 100.0 + i), "current": 1, "inputs": {"need_cores": n, "arrival_rate": rate}}
                for i, n in enumerate(needs)]

    # what a CI run measured: needs 0.17-0.25 at 189 rps after a grow to 0.5. right_size picks 0.5 with
    # the lowest need 2 % over its shrink edge; case 2 read 0.16 at the same load and shrank. At the rate
    # right_rate picks, the observed spread (x1.5) lies inside 0.5's band on both sides
    plans = looks(0.17, 0.25, 0.2, 0.21)
    size = right_size(plans, cfg)
    assert size == 0.5
    rate = right_rate(plans, size, 1, cfg, 189.4)
    lo, hi = hold_band(size, cfg)
    hi = min(hi, size * cfg.saturated_utilization)
    scale = rate / 189.4
    assert scale > 1  # the load moved up, away from the shrink edge
    assert lo < 0.17 * scale and 0.25 * scale < hi, (rate, lo, hi)
    # two replicas carry twice the rate at the same per-replica need
    assert right_rate(plans, size, 2, cfg, 189.4) == min(400.0, 189.4 * RIGHT_RATE_SPAN, 2 * rate)
    # bounded around case 1's load, and unchanged with nothing observed
    assert right_rate(looks(0.001, 0.001, 0.001, 0.001), size, 1, cfg, 100.0) == 100.0 * RIGHT_RATE_SPAN
    assert right_rate(looks(5.0, 5.0, 5.0, 5.0), size, 1, cfg, 100.0) == 100.0  # never lowered
    assert right_rate([_plan("hold", 1.0)], size, 1, cfg, 150.0) == 150.0


def test_the_right_size_reads_the_steady_need_not_the_backlog() -> None:
    """A CI run: at 112 rps and ~1 ms of CPU per request the Planner's needs read ~0.47 (the backlog term);
    the steady need is 0.16, which a quarter core holds, and the load is not lowered."""
    from scanflow.demo.s3_tune import right_rate, right_size
    from scanflow.policies.elastic import ElasticConfig

    cfg = ElasticConfig(min_cpu=0.25, cpu_step=0.25)
    plans = [{**_plan("hold", 100.0 + i), "current": 1,
              "inputs": {"need_cores": 0.47, "arrival_rate": 112.0, "cpu_per_request_ms": ms}}
             for i, ms in enumerate((0.99, 1.06, 0.80, 1.24))]
    size = right_size(plans, cfg)
    assert size == 0.25
    assert right_rate(plans, size, 1, cfg, 112.0) == 112.0
