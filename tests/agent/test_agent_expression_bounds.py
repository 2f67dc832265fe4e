"""Expressions are bounded in time and size: refused at registration where the form says enough,
stopped before computing where the payload decides, and stopped by a CPU budget otherwise."""

from __future__ import annotations

import time

import pytest

from scanflow import expressions
from scanflow.agent import Action, Agent, AgentDefinitionError
from scanflow.agent.engine import decide, evaluates_code
from scanflow.agent.types import Event
from scanflow.expressions import (
    MAX_DEPTH,
    MAX_INT_BITS,
    MAX_SEQUENCE,
    ExpressionError,
    _weight,
    compile_expression,
)

# Found by an attack on a running stack: each one was accepted and then blocked the agent.
BOMBS = [
    ("((((9**64)**64)**64)**64) > 0", "nested powers"),
    ("(9**64)**64", "nested powers"),
    ("(event.x ** 8 * event.x) ** 8", "nested powers"),  # degree 72
    ("'a'*10**9", "integer literal only"),
    ("'a' * event.n", "integer literal only"),
    ("[1] * len(event)", "integer literal only"),
    ("'a' * 100000000", "more than 1000 times"),
    ("('ab' * 1000) * 100", f"more than {MAX_SEQUENCE}"),
    ("[[1] * 1000] * 1000", f"more than {MAX_SEQUENCE}"),
    ("'%0999999999d' % 1", "string formatting"),
    ("-" * 1990 + "1", f"the limit is {MAX_DEPTH}"),
]


@pytest.mark.parametrize(("text", "fragment"), BOMBS)
def test_bombs_are_refused_at_compile_time(text: str, fragment: str) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(("text", "_"), BOMBS[:3])
def test_the_sdk_refuses_them_when_the_strategy_is_declared(text: str, _: str) -> None:
    with pytest.raises(AgentDefinitionError, match="nested powers"):
        Agent("a").strategy("bomb", event="*", constraint=text, actions=[Action("x")])


@pytest.mark.parametrize(
    ("text", "event", "expected"),
    [
        ("(event.x ** 2 + event.y ** 2) ** 0.5 == 5", {"x": 3, "y": 4}, True),  # degree 2
        ("event.x ** -1 == 0.5", {"x": 2}, True),
        ("10 ** 18 == 1000000000000000000", {}, True),
        ("1000000000000000000 ** 64 > 0", {}, True),  # 3,840 bits: under the limit
        ("len('ab' * 1000 + 'c') == 2001", {}, True),
        ("len([0, 1] * 1000) == 2000", {}, True),
        ("event.n % 7 == 3", {"n": 10}, True),
        ("len(event.s * 3) == 6", {"s": "ab"}, True),
        ("round(event.x, 2) == 1.23", {"x": 1.2345}, True),
    ],
)
def test_ordinary_arithmetic_still_works(text: str, event: dict, expected: object) -> None:
    assert compile_expression(text).evaluate(event=event) == expected


@pytest.mark.parametrize(
    ("text", "event", "fragment"),
    [
        ("event.x ** 64 > 0", {"x": 10**100}, f"would pass {MAX_INT_BITS} bits"),
        ("event.a * event.a > 0", {"a": 10**1300}, f"would pass {MAX_INT_BITS} bits"),
        ("len(event.s * 1000) > 0", {"s": "a" * 1000}, "a repetition would hold"),
        ("len([event.l] * 1000) > 0", {"l": [1] * 200}, "a repetition would hold"),
        ("len(event.s + event.s) > 0", {"s": "a" * 60_000}, "a concatenation would hold"),
        ("len([event.l, event.l]) > 0", {"l": [[1] * 1000] * 60}, "a list would hold"),
        ("event.f % 1", {"f": "%0999999999d"}, "string formatting"),
        ("round(1, event.n)", {"n": -(10**18)}, "the limit is 1000"),
    ],
)
def test_payload_driven_blowups_are_refused_before_computing(text: str, event: dict, fragment: str) -> None:
    t0 = time.thread_time()
    with pytest.raises(ExpressionError) as info:
        compile_expression(text).evaluate(event=event)
    assert fragment in str(info.value)
    # refused before computing: the size checks walk at most MAX_SEQUENCE items (~2 ms here);
    # computing any of these takes seconds to forever
    assert time.thread_time() - t0 < 1.0


def test_weight_counts_nested_items_per_reference_and_stops_at_the_cap() -> None:
    inner = [1] * 1000
    assert _weight([inner] * 10, 10**9) == 10 + 10 * 1000
    assert _weight({"k": "abc", "l": ["xy", 1]}, 100) == 2 * 2 + 1 + 1 + 3 + 2 + 2  # keys, values
    assert _weight([inner] * 10**6, 5000) == 5001  # stopped at the cap, not walked to 10**9


def _expensive(n: int = 55) -> str:
    """About the most expensive expression the rules accept: 55 passes over a payload list
    (7 nodes each: 400 nodes in all)."""
    return "max(" + ", ".join(["min(event.xs)"] * n) + ") > 0"


def test_the_cpu_budget_stops_an_evaluation_and_says_so() -> None:
    xs = list(range(200_000))
    one = compile_expression("min(event.xs) > 0")
    t0 = time.thread_time()
    for _ in range(5):
        one.evaluate(event={"xs": xs})
    op = (time.thread_time() - t0) / 5  # one pass over the list, CPU seconds
    budget = 3 * op
    e = compile_expression(_expensive())
    t0 = time.thread_time()
    with pytest.raises(ExpressionError, match=r"passed its budget of \d+ ms of CPU time"):
        e.evaluate(event={"xs": xs}, budget_s=budget)
    spent = time.thread_time() - t0
    # The clock is armed at node 32 and read every 32 nodes (7 per pass: ~5 passes), so it stops
    # after budget + ~10 passes; a run to the end is 55 passes.
    assert spent < 35 * op, (spent, budget, op)


def test_an_over_budget_evaluation_is_a_decision_with_result_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expressions, "EVAL_BUDGET_S", 0.001)  # one pass over the list takes more
    a = Agent("a")
    a.strategy("heavy", event="tick", constraint=_expensive(), actions=[Action("x")])
    plan = decide(Event("tick", {"xs": list(range(200_000))}, id=1), a.strategies.values(), {}, now=0.0)
    (d,) = plan.decisions
    assert d.result == "error" and "passed its budget of 1 ms of CPU time" in d.reason
    assert plan.intents == () and plan.states["heavy"].last_event_id == 1  # decided: not re-run


def test_only_real_constraints_leave_the_event_loop() -> None:
    a = Agent("a")
    a.strategy("always", event="tick", constraint="True", actions=[Action("x")])
    a.strategy("check", event="drift.*", constraint="event.rate > 0.1", actions=[Action("x")])
    strategies = list(a.strategies.values())
    assert not evaluates_code("tick", strategies)
    assert not evaluates_code("other", strategies)
    assert evaluates_code("drift.checked", strategies)
