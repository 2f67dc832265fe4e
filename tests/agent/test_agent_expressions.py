"""Safe expressions: what a constraint may do, and the attacks it must refuse at compile time."""

from __future__ import annotations

import math

import pytest

from scanflow.expressions import ExpressionError, compile_expression


@pytest.mark.parametrize(
    ("text", "event", "state", "expected"),
    [
        ("event.drift_rate > 0.1", {"drift_rate": 0.2}, {}, True),
        ("event['drift_rate'] > 0.1", {"drift_rate": 0.05}, {}, False),
        ("event.stats.p99 >= 50 and state.replicas < 4", {"stats": {"p99": 60}}, {"replicas": 2}, True),
        ("abs(event.x) + max(1, 2) - min(3, 4) == 1", {"x": -2}, {}, True),
        ("len(event.items) == 3", {"items": [1, 2, 3]}, {}, True),  # a key, not dict.items
        ("get(event, 'missing', 7) == 7", {}, {}, True),
        ("event.name in ['a', 'b']", {"name": "b"}, {}, True),
        ("2 ** 10 == 1024", {}, {}, True),
        ("1 if event.x else 0", {"x": 0}, {}, 0),
    ],
)
def test_valid_expressions_evaluate(text: str, event: dict, state: dict, expected: object) -> None:
    assert compile_expression(text).evaluate(event=event, state=state) == expected


def test_since_and_now_are_passed_in() -> None:
    e = compile_expression("since('retrain') > 600 and now > 10")
    assert e.test(now=11.0, since=lambda name: 601.0 if name == "retrain" else 0.0)
    assert not e.test(now=11.0, since=lambda name: 5.0)
    assert e.test(now=11.0)  # since() without history is inf
    assert math.isinf(compile_expression("since('x')").evaluate())


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("__import__('os').system('true')", "not allowed"),
        ("event.__class__", "'_'"),
        ("event._private", "'_'"),
        ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
        ("open('/etc/passwd')", "call to 'open'"),
        ("eval('1')", "call to 'eval'"),
        ("event.items()", "call to 'event.items'"),
        ("foo > 1", "unknown name 'foo'"),
        ("(lambda: 1)()", "not allowed"),
        ("[x for x in event]", "ListComp"),
        ("{k: 1 for k in event}", "DictComp"),
        ("f'{event}'", "JoinedStr"),
        ("(y := 1)", "NamedExpr"),
        ("import os", "not a valid expression"),
        ("x = 1", "not a valid expression"),
        ("9 ** 9999999", "exponent"),
        ("event.x ** event.y", "exponent must be a number literal"),
        ("'a' * 100000000", "more than 1000 times"),
        ("'" + "a" * 5000 + "'", "longer than"),
        ("", "must not be empty"),
        ("1 +", "not a valid expression"),
        ("max(1, key=abs)", "keyword"),
    ],
)
def test_attacks_are_refused_when_compiled(text: str, fragment: str) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text)
    assert fragment in str(info.value)


def test_missing_key_is_a_clear_evaluation_error() -> None:
    e = compile_expression("event.drift_rate > 0.1")
    with pytest.raises(ExpressionError, match="no key 'drift_rate'"):
        e.evaluate(event={"other": 1})


def test_type_errors_are_evaluation_errors_not_crashes() -> None:
    with pytest.raises(ExpressionError, match="TypeError"):
        compile_expression("event.x > 1").evaluate(event={"x": "text"})


def test_attribute_access_on_non_mappings_is_refused() -> None:
    with pytest.raises(ExpressionError, match=r"mappings\) only"):
        compile_expression("event.x.real").evaluate(event={"x": 1})
