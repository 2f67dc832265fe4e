"""The pure strategy engine, replayed as scripted sequences with an explicit `now`."""

from __future__ import annotations

from collections.abc import Sequence

from scanflow.agent.agent import build_strategy
from scanflow.agent.engine import EvalEnv, StrategyState, decide, match
from scanflow.agent.types import Action, Event, Strategy


def strat(**kw: object) -> Strategy:
    base: dict[str, object] = {
        "name": "s",
        "event": "drift.*",
        "constraint": "True",
        "actions": [Action("a")],
    }
    base.update(kw)
    return build_strategy(**base)  # type: ignore[arg-type]


def replay(
    strategies: Sequence[Strategy], script: Sequence[tuple[float, str, dict]], env: EvalEnv | None = None
) -> list[str]:
    """Feed (now, event name, payload) ticks through decide(); return 'strategy:reason' per decision."""
    states: dict[str, StrategyState] = {}
    seen: list[str] = []
    for i, (now, name, payload) in enumerate(script, start=1):
        plan = decide(Event(name, payload, id=i), strategies, states, now, env)
        states = plan.states
        seen.extend(f"{d.strategy}:{d.reason}" for d in plan.decisions)
    return seen


def test_match_uses_globs_and_exact_names_in_order() -> None:
    a, b, c = (
        strat(name="a", event="drift.*"),
        strat(name="b", event="drift.checked"),
        strat(name="c", event="x"),
    )
    assert [s.name for s in match("drift.checked", [a, b, c])] == ["a", "b"]
    assert match("latency.breached", [a, b, c]) == []


def test_fired_intents_have_deterministic_keys_in_action_order() -> None:
    s = strat(name="retrain", actions=[Action("plan"), Action("scale", agent="executor", args={"n": 2})])
    plan = decide(Event("drift.checked", {}, id=7), [s], {}, now=100.0)
    assert [i.key for i in plan.intents] == ["retrain:7:0", "retrain:7:1"]
    assert plan.intents[1].action == Action("scale", "executor", {"n": 2})
    d = plan.decisions[0]
    assert (d.result, d.reason, d.constraint) == ("fired", "fired", "True")
    assert plan.states["retrain"].last_fired == 100.0


def test_cooldown_blocks_until_it_has_passed() -> None:
    s = strat(cooldown_s=10)
    script = [
        (0.0, "drift.a", {}),
        (5.0, "drift.a", {}),
        (9.99, "drift.a", {}),
        (10.0, "drift.a", {}),
        (15.0, "drift.a", {}),
    ]
    assert replay([s], script) == ["s:fired", "s:cooldown", "s:cooldown", "s:fired", "s:cooldown"]


def test_false_constraint_does_not_start_a_cooldown() -> None:
    s = strat(constraint="event.rate > 0.1", cooldown_s=10)
    script = [
        (0.0, "drift.a", {"rate": 0.0}),
        (1.0, "drift.a", {"rate": 0.5}),
        (2.0, "drift.a", {"rate": 0.5}),
    ]
    assert replay([s], script) == ["s:false", "s:fired", "s:cooldown"]


def test_rate_limit_counts_firings_in_a_sliding_minute() -> None:
    s = strat(max_per_minute=2)
    script = [(t, "drift.a", {}) for t in (0.0, 1.0, 2.0, 59.0, 60.5, 61.5, 62.0)]
    assert replay([s], script) == [
        "s:fired",
        "s:fired",
        "s:rate-limited",
        "s:rate-limited",  # 0 and 1 are inside the window
        "s:fired",  # at 60.5 the firing at 0 has left the window
        "s:fired",  # at 61.5 the one at 1 has left too
        "s:rate-limited",
    ]


def test_replayed_event_is_refused_as_duplicate() -> None:
    s = strat()
    first = decide(Event("drift.a", {}, id=3), [s], {}, now=0.0)
    again = decide(Event("drift.a", {}, id=3), [s], first.states, now=100.0)
    assert again.decisions[0].reason == "duplicate"
    assert again.intents == ()
    assert again.states == first.states
    older = decide(Event("drift.a", {}, id=2), [s], first.states, now=100.0)
    assert older.decisions[0].reason == "duplicate"


def test_constraint_error_is_a_decision_not_an_exception() -> None:
    s = strat(constraint="event.rate > 0.1")
    plan = decide(Event("drift.a", {"other": 1}, id=1), [s], {}, now=0.0)
    d = plan.decisions[0]
    assert d.result == "error" and "no key 'rate'" in d.reason
    assert plan.intents == ()


def test_callable_constraint_gets_ctx_and_event_and_may_raise() -> None:
    seen = []

    def ok(ctx: object, event: Event) -> bool:
        seen.append((ctx, event.payload["n"]))
        return event.payload["n"] > 1

    def boom(ctx: object, event: Event) -> bool:
        raise RuntimeError("bad")

    env = EvalEnv(ctx="CTX")
    assert replay([strat(constraint=ok)], [(0, "drift.a", {"n": 1}), (1, "drift.a", {"n": 2})], env) == [
        "s:false",
        "s:fired",
    ]
    assert seen == [("CTX", 1), ("CTX", 2)]
    plan = decide(Event("drift.a", {}, id=1), [strat(constraint=boom)], {}, now=0.0, env=env)
    assert plan.decisions[0].result == "error" and "RuntimeError" in plan.decisions[0].reason


def test_since_and_state_reach_the_constraint() -> None:
    s = strat(constraint="since('retrain') > 600 and state.enabled")
    env_recent = EvalEnv(state={"enabled": True}, since=lambda n: 30.0)
    env_old = EvalEnv(state={"enabled": True}, since=lambda n: 700.0)
    assert decide(Event("drift.a", {}, id=1), [s], {}, 0.0, env_recent).decisions[0].reason == "false"
    assert decide(Event("drift.a", {}, id=1), [s], {}, 0.0, env_old).decisions[0].reason == "fired"


def test_strategies_are_independent_and_states_roundtrip_json() -> None:
    a, b = strat(name="a", cooldown_s=100), strat(name="b")
    assert replay([a, b], [(0, "drift.x", {}), (1, "drift.x", {})]) == [
        "a:fired",
        "b:fired",
        "a:cooldown",
        "b:fired",
    ]
    st = StrategyState(last_fired=1.5, recent=(1.0, 1.5), last_event_id=9)
    assert StrategyState.from_json(st.to_json()) == st


def test_decide_does_not_mutate_its_input_states() -> None:
    s = strat()
    states = {"s": StrategyState()}
    decide(Event("drift.a", {}, id=1), [s], states, now=0.0)
    assert states == {"s": StrategyState()}
