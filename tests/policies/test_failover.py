"""Failover: N failed checks -> backup; M healthy checks -> back; hysteresis; never to a dead backup."""

from __future__ import annotations

from scanflow.policies import failover
from scanflow.policies.failover import FailoverConfig, FailoverContext, FailoverState

CFG = FailoverConfig(fail_checks=3, recover_checks=5)


def replay(primary: str, backup: str | None = None) -> list[str]:
    """primary/backup: one char per check, 'u' healthy, 'd' down. Returns the route after each check."""
    state, out = FailoverState(), []
    for i, p in enumerate(primary):
        b = backup[i] if backup else "u"
        d, state = failover.decide(FailoverContext(now=float(i), primary_healthy=p == "u",
                                                   backup_healthy=b == "u", config=CFG, state=state))
        out.append("B" if d.route_to == "backup" else "P")
    return "".join(out)  # type: ignore[return-value]


def test_fails_over_after_three_failed_checks_and_back_after_five_healthy() -> None:
    assert replay("uuddduuuuuu") == "PPPPBBBBBPP"


def test_short_outages_do_not_move_traffic() -> None:
    assert replay("ududduddu") == "PPPPPPPPP"


def test_flapping_primary_must_prove_itself_before_traffic_returns() -> None:
    assert replay("dddudududuuuuu") == "PPBBBBBBBBBBBP"


def test_never_fails_over_to_a_dead_backup() -> None:
    assert replay("dddddu", backup="ddduuu") == "PPPBBB"  # waits for the backup, then moves


def test_decision_says_why_and_when_it_changed() -> None:
    st = FailoverState()
    for i in range(3):
        d, st = failover.decide(FailoverContext(now=float(i), primary_healthy=False, config=CFG, state=st))
    assert d.changed and d.route_to == "backup" and "3 checks" in d.reason and st.changed_at == 2.0
    d, st = failover.decide(FailoverContext(now=3.0, primary_healthy=False, config=CFG, state=st))
    assert not d.changed and d.inputs["streak"] == -4
