"""Guardrails: bounds, cold start, hysteresis (reset on direction change), delays, cooldown, max step."""

from __future__ import annotations

import pytest

from scanflow.policies.guardrails import Guardrails, GuardState, apply_guardrails
from scanflow.policies.types import Streak


def run(raws: list[int], cfg: Guardrails, start: int = 2, dt: float = 1.0) -> list[tuple[int, str]]:
    state, current, out = GuardState(), start, []
    for i, raw in enumerate(raws):
        o = apply_guardrails(raw, current, i * dt, cfg, state)
        state, current = o.state, o.replicas
        out.append((current, o.step))
    return out


def test_bounds_clamp_desired_and_correct_current_at_once() -> None:
    cfg = Guardrails(min_replicas=2, max_replicas=4, up_ticks=3)
    assert run([10], cfg, start=3) == [(3, "hysteresis")]  # 10 clamped to 4, but needs 3 ticks
    assert run([10, 10, 10], cfg, start=3)[-1] == (4, "pass")
    # a current count outside the bounds is fixed immediately, hysteresis or not
    assert run([1], cfg, start=1) == [(2, "bounds")]
    assert run([9], cfg, start=6) == [(4, "bounds")]


def test_hysteresis_needs_consecutive_ticks_and_a_direction_change_resets() -> None:
    cfg = Guardrails(min_replicas=1, max_replicas=8, up_ticks=3, down_ticks=3)
    # up, up, down (resets), up, up, up -> scales only at the last tick
    got = run([4, 4, 1, 4, 4, 4], cfg, start=2)
    assert [r for r, _ in got] == [2, 2, 2, 2, 2, 4]
    assert got[2][1] == "hysteresis"
    # a steady tick (desired == current) also resets the streak
    got = run([4, 4, 2, 4, 4], cfg, start=2)
    assert [r for r, _ in got] == [2, 2, 2, 2, 2]


def test_down_delay_counts_seconds_not_only_ticks() -> None:
    cfg = Guardrails(min_replicas=1, max_replicas=8, down_ticks=1, down_delay_s=10.0)
    got = run([1] * 12, cfg, start=3, dt=1.0)
    first_down = next(i for i, (r, _) in enumerate(got) if r < 3)
    assert first_down == 10  # streak began at t=0, acts at t=10


def test_cooldown_and_max_step_down() -> None:
    cfg = Guardrails(min_replicas=1, max_replicas=8, max_step_down=1, cooldown_down_s=3.0)
    got = run([1] * 8, cfg, start=4)
    assert [r for r, _ in got] == [3, 3, 3, 2, 2, 2, 1, 1]
    assert got[1][1] == "cooldown" and got[0][1] == "max-step"


def test_cold_start_blocks_scale_down_but_not_scale_up() -> None:
    cfg = Guardrails(min_replicas=1, max_replicas=8, cold_start_s=5.0)
    assert run([1, 1], cfg, start=3) == [(3, "cold-start"), (3, "cold-start")]
    assert run([6], cfg, start=3) == [(6, "pass")]


def test_time_scale_shortens_every_delay() -> None:
    slow = Guardrails(min_replicas=1, max_replicas=8, down_delay_s=10.0)
    fast = Guardrails(min_replicas=1, max_replicas=8, down_delay_s=10.0, time_scale=5.0)
    assert run([1] * 3, fast, start=3)[2][0] == 1
    assert run([1] * 3, slow, start=3)[2][0] == 3


@pytest.mark.parametrize("kw", [{"min_replicas": 5, "max_replicas": 2}, {"up_ticks": 0},
                                {"max_step_up": 0}, {"down_delay_s": -1}, {"time_scale": 0}])
def test_bad_guardrails_are_refused_with_the_field_named(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError) as exc:
        Guardrails(**kw)  # type: ignore[arg-type]
    assert any(k.split("_")[0] in str(exc.value) for k in kw)


def test_streak_counts_and_resets() -> None:
    s = Streak().update(1, 0.0).update(1, 1.0)
    assert (s.direction, s.count, s.age(3.0)) == (1, 2, 3.0)
    s = s.update(-1, 4.0)
    assert (s.direction, s.count, s.since) == (-1, 1, 4.0)
    assert Streak().update(0, 1.0) == Streak()
